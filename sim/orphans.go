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
// range's log held there in the epoch of the frame carrying it, as it
// was when that epoch ended (where the checks had seen it committed: the
// old home's group may commit, after the grant, unacked records its
// leader appended before it). After healing, every acked record counted as
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
	beforeCut [][]timeline
	epoch     []uint64 // the home epoch lastCanon belongs to
	// held is every record read from an orphan log: value → offset.
	held []map[string]uint64
	// retained is, per range, the forks whose copies had deleted part of
	// the divergent tail by retention: [At, FirstOffset).
	retained [][]replica.ForkRecord
}

func newOrphanWorld(ranges int) *orphanWorld {
	o := &orphanWorld{lastCanon: make([][]string, ranges), beforeCut: make([][]timeline, ranges), epoch: make([]uint64, ranges),
		held: make([]map[string]uint64, ranges), retained: make([][]replica.ForkRecord, ranges)}
	for r := range o.held {
		o.held[r] = map[string]uint64{}
	}
	return o
}

// timeline is the range's log as the checks had seen it when its home
// epoch ended: the log of that epoch, below its start the earlier epochs'
// records it continued.
type timeline struct {
	epoch uint64
	log   []string
}

// noteEpochs keeps, for a range whose home epoch changed since the last
// check, the canonical log as it was before the takeover cut it: the
// timeline of the epoch that ended.
func (w *world) noteEpochs() {
	o := w.orphanLogs
	for r := range w.canonical {
		if e := w.homing.homes[r].Epoch; e != o.epoch[r] {
			o.beforeCut[r] = append(o.beforeCut[r], timeline{epoch: o.epoch[r], log: o.lastCanon[r]})
			o.epoch[r] = e
		}
	}
}

// keepCanon remembers the canonical logs the check leaves.
func (w *world) keepCanon() {
	copy(w.orphanLogs.lastCanon, w.canonical)
}

// checkForks checks the orphan logs of the forks node n's replica of range
// r applied since its last fork epoch was before, in the order it applied
// them (their Raft indexes); served is the committed end the node had
// published before (noteForks lowers it to the fork point). Of two forks
// applied between two checks, the second found the log cut at the first's
// point: what the copy had committed past it is in the first's orphan log
// (seed 3001136 of the three-region minute runs: a copy away through two
// takeovers forked at 126, then at 58, and its orphan log of the fork at
// 58 rightly ended at 126). So each fork is held to the least of served
// and the points of the forks applied before it.
func (w *world) checkForks(n *node, r int, before, served uint64) error {
	for _, f := range n.replicas[r].Orphans() {
		if f.Epoch <= before || f.Epoch > n.forkEpoch[r] {
			continue
		}
		bound := served
		served = min(served, f.At)
		if w.opt.mutateOrphanDrop && f.Records > 0 {
			// A fork that orphaned one record less than it cut, its
			// record consistent with what it holds.
			f.FirstOffset++
			f.Records--
		}
		if err := w.checkFork(n, r, f, bound); err != nil {
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
	for i, rec := range recs {
		off, v := f.FirstOffset+uint64(i), rec.value
		held := rec
		if w.opt.mut.orphanAnyEpoch {
			held.epoch = ^uint64(0) // no timeline's: held against every one
		}
		if was, ok := o.wasInLog(r, off, held); !ok {
			return fmt.Errorf("it holds %q at %d (epoch %d), where the range's log held %q before the takeover", v, off, rec.epoch, was)
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

// wasInLog reports whether the range's log held rec at off in the
// timeline of rec's epoch (the epoch of the frame that carries it), or
// never reached off there as far as the checks saw it: nothing to hold it
// against. The old home's group may commit, after the takeover, what its
// leader appended under its lease before it (Raft needs no lease to
// commit; such records are never acked, the ack needing the lease at
// their epoch): the checks never canonized them (the old home was no
// longer the home), and an earlier epoch's timeline holds other records
// at their offsets, which the epoch the copy was in had replaced (seeds
// 253 and 274 of 91ef6d3's minute runs: an epoch-2 record committed after
// the grant of epoch 3, held against epoch 1's record at its offset).
// A record of an epoch no timeline was noted for (two epoch changes
// between two checks) is held against every timeline: it passes if one
// held it there. If not ok, was is what the timeline held at off.
func (o *orphanWorld) wasInLog(r int, off uint64, rec orphanRec) (was string, ok bool) {
	for _, t := range o.beforeCut[r] {
		if t.epoch != rec.epoch {
			continue
		}
		if off >= uint64(len(t.log)) || t.log[off] == rec.value {
			return "", true
		}
		return t.log[off], false
	}
	ok = true
	for _, t := range o.beforeCut[r] {
		if off >= uint64(len(t.log)) {
			continue
		}
		if t.log[off] == rec.value {
			return "", true
		}
		was, ok = t.log[off], false
	}
	return was, ok
}

// orphanRec is a record read from an orphan log: its value and the
// homing epoch of the frame that carried it.
type orphanRec struct {
	value string
	epoch uint64
}

// readOrphans returns a fork's orphaned records from f.FirstOffset, in
// offset order (dense: OrphanStore.ReadFrames verifies it).
func (w *world) readOrphans(n *node, r int, f replica.ForkRecord) ([]orphanRec, error) {
	var out []orphanRec
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
					out = append(out, orphanRec{value: string(recs[i].Value), epoch: h.Epoch})
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
