package sim

import (
	"fmt"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/replica"
)

// Orphan logs. A fork moves a copy's divergent tail, the records past
// the fork point that the range's log replaced, into the copy's orphan
// log (replica.OpenOrphans). Checks: when a fork is seen applied, its
// orphan log must hold exactly the records the copy had past the fork
// point: dense offsets from the fork point (or from where retention had
// already deleted them: the copy's log started past the fork point) to
// at least the end the copy had committed, each of them the record the
// range's log held there before the takeover cut it (where the checks
// had seen it committed). After healing, every acked record counted as
// orphaned is in one of the orphan logs, or still in the divergent tail
// of a copy that has not forked yet, or was deleted by retention before
// its copies forked (counted, not a failure: the orphan log keeps what
// the copy still held, replica/fork.go).

// OrphanResult counts what the orphan-log checks read.
type OrphanResult struct {
	// Forks counts the forks whose orphan logs were read, Records the
	// records they held.
	Forks, Records int
	// AcksHeld counts acked records counted as orphaned found in an
	// orphan log (or in a divergent tail not forked yet), ByRetention
	// those that retention deleted before every copy holding them forked.
	AcksHeld, ByRetention int
}

func (o OrphanResult) String() string {
	if o == (OrphanResult{}) {
		return ""
	}
	return fmt.Sprintf("; orphan logs: %d forks read (%d records), %d orphaned acks held, %d deleted by retention before the fork", o.Forks, o.Records, o.AcksHeld, o.ByRetention)
}

func (o OrphanResult) add(p OrphanResult) OrphanResult {
	o.Forks += p.Forks
	o.Records += p.Records
	o.AcksHeld += p.AcksHeld
	o.ByRetention += p.ByRetention
	return o
}

// orphanWorld is what the orphan-log checks keep, per range.
type orphanWorld struct {
	// lastCanon is the canonical log as the previous check left it (a
	// slice header: a takeover cuts w.canonical to a new capacity, so the
	// records past the fork point stay readable here); beforeCut holds it
	// as it was when each of the range's epochs began (a copy away for two
	// takeovers forks off records of an earlier timeline than the last).
	lastCanon [][]string
	beforeCut [][][]string
	epoch     []uint64 // the home epoch lastCanon belongs to
	// held is every record read from an orphan log: value → offset.
	held []map[string]uint64
	// retained is, per range, the forks whose copies had deleted part of
	// the divergent tail by retention: [At, FirstOffset).
	retained [][]replica.ForkRecord
}

func newOrphanWorld(ranges int) *orphanWorld {
	o := &orphanWorld{lastCanon: make([][]string, ranges), beforeCut: make([][][]string, ranges), epoch: make([]uint64, ranges),
		held: make([]map[string]uint64, ranges), retained: make([][]replica.ForkRecord, ranges)}
	for r := range o.held {
		o.held[r] = map[string]uint64{}
	}
	return o
}

// noteEpochs keeps, for a range whose home epoch changed since the last
// check, the canonical log as it was before the takeover cut it.
func (w *world) noteEpochs() {
	o := w.orphanLogs
	for r := range w.canonical {
		if e := w.homing.homes[r].Epoch; e != o.epoch[r] {
			o.beforeCut[r], o.epoch[r] = append(o.beforeCut[r], o.lastCanon[r]), e
		}
	}
}

// keepCanon remembers the canonical logs the check leaves.
func (w *world) keepCanon() {
	copy(w.orphanLogs.lastCanon, w.canonical)
}

// checkForks checks the orphan logs of the forks node n's replica of range
// r applied since its last fork epoch was before; served is the committed
// end the node had published before (noteForks lowers it to the fork
// point).
func (w *world) checkForks(n *node, r int, before, served uint64) error {
	for _, f := range n.replicas[r].Orphans() {
		if f.Epoch <= before || f.Epoch > n.forkEpoch[r] {
			continue
		}
		if w.opt.mutateOrphanDrop && f.Records > 0 {
			// A fork that orphaned one record less than it cut, its
			// record consistent with what it holds.
			f.FirstOffset++
			f.Records--
		}
		if err := w.checkFork(n, r, f, served); err != nil {
			return fmt.Errorf("%v range %d: the orphan log of the fork at %d (epoch %d, orphaned [%d, %d)): %w", n, r, f.At, f.Epoch, f.FirstOffset, f.NextOffset, err)
		}
	}
	return nil
}

// checkFork reads one fork's orphan log and holds it against what the
// copy had past the fork point.
func (w *world) checkFork(n *node, r int, f replica.ForkRecord, served uint64) error {
	o := w.orphanLogs
	switch {
	case f.FirstOffset < f.At || f.NextOffset < f.FirstOffset:
		return fmt.Errorf("its bounds do not hold together")
	case f.FirstOffset > f.At && f.FirstOffset > max(n.logStart[r], n.stores[r].StartOffset()) && !w.forkOfPeer(n, r, f):
		return fmt.Errorf("it starts at %d, past the fork point, but the copy's log started at %d: records the copy held are missing", f.FirstOffset, n.logStart[r])
	case served > f.At && f.NextOffset < served:
		return fmt.Errorf("it ends at %d, but the copy had committed up to %d", f.NextOffset, served)
	case f.FirstOffset > f.At:
		o.retained[r] = append(o.retained[r], f)
	}
	recs, err := w.readOrphans(n, r, f)
	if err != nil {
		return err
	}
	if uint64(len(recs)) != f.NextOffset-f.FirstOffset || f.Records != uint64(len(recs)) {
		return fmt.Errorf("it holds %d records, its record says %d of [%d, %d)", len(recs), f.Records, f.FirstOffset, f.NextOffset)
	}
	for i, v := range recs {
		off := f.FirstOffset + uint64(i)
		if was, ok := o.wasInLog(r, off, v); !ok {
			return fmt.Errorf("it holds %q at %d, where the range's log held %q before the takeover", v, off, was)
		}
		if prev, ok := o.held[r][v]; ok && prev != off {
			return fmt.Errorf("it holds %q at %d, another orphan log at %d", v, off, prev)
		}
		o.held[r][v] = off
	}
	w.res.Orphans.Forks++
	w.res.Orphans.Records += len(recs)
	return nil
}

// forkOfPeer reports whether fork f is another replica's of n's group,
// which a snapshot brought n (the leader's orphan log comes with it, and
// n stores the forks it lacks, replica/snapshot.go): a peer holds the
// same record, and its own log had started at or past f's first offset
// (its retention had deleted the rest of the divergent tail before the
// fork). n never applied the fork itself: what n held of the divergent
// tail went with the log the snapshot replaced (seed 7 of the minute
// runs; the acks among it are held against every orphan log, and against
// f's retention, in finalOrphans).
func (w *world) forkOfPeer(n *node, r int, f replica.ForkRecord) bool {
	for _, p := range w.regionNodes(n.region) {
		if p == n || !p.up || p.logStart[r] < f.FirstOffset {
			continue
		}
		for _, pf := range p.replicas[r].Orphans() {
			if pf.Index == f.Index && pf.FirstOffset == f.FirstOffset && pf.NextOffset == f.NextOffset {
				return true
			}
		}
	}
	return false
}

// wasInLog reports whether the range's log held v at off before one of
// its epochs began (or never reached off then: nothing to hold it
// against); if not, was is what the log held there before the latest.
func (o *orphanWorld) wasInLog(r int, off uint64, v string) (was string, ok bool) {
	ok = true
	for _, old := range o.beforeCut[r] {
		if off >= uint64(len(old)) {
			continue
		}
		if old[off] == v {
			return "", true
		}
		was, ok = old[off], false
	}
	return was, ok
}

// readOrphans returns the values of a fork's orphaned records from
// f.FirstOffset, in offset order (dense: OrphanStore.ReadFrames verifies
// it).
func (w *world) readOrphans(n *node, r int, f replica.ForkRecord) ([]string, error) {
	var out []string
	for from := f.FirstOffset; from < f.NextOffset; {
		frames, err := n.replicas[r].ReadOrphans(f.Index, from, 1<<20)
		if err != nil {
			return nil, err
		}
		if len(frames) == 0 {
			return nil, fmt.Errorf("nothing readable at %d", from)
		}
		for len(frames) > 0 {
			size, err := batch.FrameSize(frames)
			if err != nil {
				return nil, err
			}
			h, recs, err := batch.Decode(frames[:size])
			frames = frames[size:]
			if err != nil {
				return nil, err
			}
			for i := range recs {
				if off := h.Offset(&recs[i]); off >= from {
					out = append(out, string(recs[i].Value))
				}
			}
			from = max(from, h.NextOffset())
		}
	}
	return out, nil
}

// finalOrphans requires every acked record counted as orphaned to be in
// an orphan log, or still in the divergent tail of a copy that has not
// forked, or deleted by retention before its copies forked (counted).
func (w *world) finalOrphans() error {
	o := w.orphanLogs
	for r := range w.canonical {
		for v, or := range w.homing.orphans[r] {
			off := or.off
			if at, ok := o.held[r][v]; ok && at == off {
				w.res.Orphans.AcksHeld++
				continue
			}
			if w.heldUnforked(r, off, v) {
				w.res.Orphans.AcksHeld++
				continue
			}
			if w.deletedByRetention(r, or) {
				w.res.Orphans.ByRetention++
				continue
			}
			return fmt.Errorf("range %d: %q, acked at %d and counted as orphaned, is in no orphan log", r, v, off)
		}
	}
	return nil
}

// heldUnforked reports whether a copy that has not forked yet holds v at
// off in its divergent tail.
func (w *world) heldUnforked(r int, off uint64, v string) bool {
	for _, n := range w.nodes {
		if !n.up || !w.stale(n, r) || off >= n.replicas[r].Committed() || off < n.stores[r].StartOffset() {
			continue
		}
		frames, err := n.stores[r].ReadFrames(off, 1, n.replicas[r].Committed())
		if err != nil || len(frames) == 0 {
			continue
		}
		h, recs, err := batch.Decode(frames)
		if err != nil {
			continue
		}
		for i := range recs {
			if h.Offset(&recs[i]) == off && string(recs[i].Value) == v {
				return true
			}
		}
	}
	return false
}

// deletedByRetention reports whether retention deleted an orphaned ack
// before the copies that held it forked: a fork found it deleted, or no
// copy of the region that acked it retains its offset (its log starts
// past it, or retention deleted the whole log, which then starts at its
// end). That region is the home of the epoch the record was acked at,
// not the latest grant's PrevRegion: after a second takeover (seeds 10,
// 15, 62 and 104 of the minute runs) the first home's acks sit in the
// first home's copies.
func (w *world) deletedByRetention(r int, o orphaned) bool {
	for _, f := range w.orphanLogs.retained[r] {
		if o.off >= f.At && o.off < f.FirstOffset {
			return true
		}
	}
	for _, n := range w.regionNodes(o.region) {
		if !n.up || (n.stores[r].StartOffset() <= o.off && o.off < n.stores[r].NextOffset()) {
			return false
		}
	}
	return true
}
