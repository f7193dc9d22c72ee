package sim

import (
	"fmt"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/homing"
	"github.com/geolog/geolog/replicator"
)

// checkMirror holds what a mirror replica committed past what was verified
// against the home's log. It never commits past what a home replica
// published (a source ships committed frames only). Every frame at its
// offset is the home's frame there (replicator.SameData: equal but for
// the Raft term and index its own group stamps), its records the home's
// records at the same offsets. Frames past what the home's replicas were
// seen to commit in the checks wait for the next check (a home leader may
// ship what it alone has published, then crash).
func (w *world) checkMirror(n *node, r int, committed uint64) error {
	if committed > w.homeCommitted[r] {
		return fmt.Errorf("%v range %d: the mirror committed %d, past the highest end %d any home replica published: it holds what the home did not commit", n, r, committed, w.homeCommitted[r])
	}
	canon := w.canonical[r]
	for n.verified[r] < committed && n.verified[r] < uint64(len(canon)) {
		from := n.verified[r]
		// Frames from the home's canonical end on are not looked at (the
		// loop stops at the first past it): they are not read either, as
		// a mirror ahead of the checks would otherwise be read to its
		// committed end after every step.
		frames, err := n.stores[r].ReadFrames(from, 1<<20, min(committed, uint64(len(canon))))
		if err != nil {
			return fmt.Errorf("%v range %d: read committed [%d, %d): %w", n, r, from, committed, err)
		}
		if len(frames) == 0 {
			return fmt.Errorf("%v range %d: committed %d but nothing readable at %d", n, r, committed, from)
		}
		for len(frames) > 0 && n.verified[r] < uint64(len(canon)) {
			size, err := batch.FrameSize(frames)
			if err != nil {
				return err
			}
			frame := frames[:size]
			frames = frames[size:]
			h, err := batch.DecodeHeader(frame)
			if err != nil {
				return fmt.Errorf("%v range %d: committed frame at %d: %w", n, r, n.verified[r], err)
			}
			if h.Type != batch.TypeData {
				return fmt.Errorf("%v range %d: a %v frame at %d in a mirror's log", n, r, h.Type, h.BaseOffset)
			}
			if h.NextOffset() > uint64(len(canon)) {
				break // the home's replicas have not been seen to commit it yet
			}
			if err := w.mirrorFrame(n, r, h, frame); err != nil {
				return err
			}
			n.verified[r] = max(n.verified[r], h.NextOffset())
		}
		if n.verified[r] == from {
			break
		}
	}
	return nil
}

// mirrorFrame holds one frame of a mirror's log against the home's: the
// same data as the home's frame at its offset (whose records the home's
// check canonized), or, where none is kept, the same records.
func (w *world) mirrorFrame(n *node, r int, h batch.Header, frame []byte) error {
	if home, ok := w.canonFrames[r][h.BaseOffset]; ok {
		if replicator.SameData(home, frame) {
			return nil
		}
		hh, _ := batch.DecodeHeader(home)
		return fmt.Errorf("%v range %d: mirror's frame at %d (%d records, epoch %d) is not the home's there (%d records, epoch %d)",
			n, r, h.BaseOffset, h.RecordCount, h.Epoch, hh.RecordCount, hh.Epoch)
	}
	_, recs, err := batch.Decode(frame)
	if err != nil {
		return fmt.Errorf("%v range %d: committed frame at %d: %w", n, r, h.BaseOffset, err)
	}
	for i, rec := range recs {
		off := h.Offset(&recs[i])
		if want := w.canonical[r][off]; string(rec.Value) != want {
			return fmt.Errorf("%v range %d offset %d: mirror holds %q, the home %q", n, r, off, rec.Value, want)
		}
	}
	return nil
}

// finalMirrors requires, once everything healed, every replica of every
// mirror region to have committed the home's whole log and to hold it as
// the home does.
func (w *world) finalMirrors() error {
	for r := range w.canonical {
		end := uint64(len(w.canonical[r]))
		for _, n := range w.nodes {
			if n.region == w.homeRegion(r) || w.stale(n, r) {
				continue
			}
			if c := n.replicas[r].Committed(); c != end {
				return fmt.Errorf("range %d: %v committed %d of the home's %d after healing: the mirror did not catch up", r, n, c, end)
			}
			if n.verified[r] != end {
				return fmt.Errorf("range %d: %v verified to %d of %d", r, n, n.verified[r], end)
			}
		}
	}
	return nil
}

// mirrorsCaughtUp reports whether every mirror replica has committed the
// home's whole log.
func (w *world) mirrorsCaughtUp() bool {
	for r := range w.canonical {
		for _, n := range w.nodes {
			if n.region == w.homeRegion(r) || w.stale(n, r) {
				continue
			}
			if !n.up || n.replicas[r].Committed() != uint64(len(w.canonical[r])) {
				return false
			}
		}
	}
	return true
}

// divergence is divergent's answer for one replica, and the state of the
// replica and of the range's home it was computed on: the frames a
// replica committed change only with its committed end, its highest
// epoch (a fork raises it), its log's start (compaction, a snapshot) or
// its incarnation, and the question only with the home's epoch and fork
// point.
type divergence struct {
	gen                       int
	committed, highest, start uint64
	homeEpoch, homeStart      uint64
	valid, divergent          bool
}

// divergentCached is divergent, read again only when what it depends on
// changed: the checks ask it of every replica after every step.
func (w *world) divergentCached(n *node, r int, home homing.Home) bool {
	rep, st := n.replicas[r], n.stores[r]
	key := divergence{gen: n.gen, committed: rep.Committed(), highest: rep.HighestEpoch(), start: st.StartOffset(),
		homeEpoch: home.Epoch, homeStart: home.StartOffset, valid: true}
	if c := n.divergence[r]; c.valid {
		c.divergent = false
		if c == key {
			return n.divergence[r].divergent
		}
	}
	key.divergent = w.divergent(n, r, home)
	n.divergence[r] = key
	return key.divergent
}

// checkStaleTail: a copy not forked yet (stale: an older epoch at the
// fork point) must not have taken the new home's frames on top of its
// divergent tail. A mirror applies the new home's frames only after the
// fork that cuts that tail (the fork's Raft entry comes first), so a
// committed log that ends in the current epoch while an older one sits
// at the fork point kept the old home's records where the range's log
// holds others: what a source that skipped its resend leaves (a cursor
// that moved to the mirror's end on a heartbeat's answer, 34db20d).
func (w *world) checkStaleTail(n *node, r int, committed uint64) error {
	if committed == 0 || n.tailChecked[r] == committed || committed <= n.stores[r].StartOffset() {
		return nil
	}
	n.tailChecked[r] = committed
	f, err := n.stores[r].ReadFrames(committed-1, 1, committed)
	if err != nil || len(f) == 0 {
		return nil
	}
	h, err := batch.DecodeHeader(f)
	if home := w.homing.homes[r]; err == nil && h.Epoch >= home.Epoch {
		return fmt.Errorf("%v range %d: its log ends in epoch %d frames (at %d) on top of an older epoch's tail from the fork point %d, never forked off", n, r, h.Epoch, h.BaseOffset, home.StartOffset)
	}
	return nil
}
