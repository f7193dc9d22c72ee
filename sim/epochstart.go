package sim

import (
	"context"
	"fmt"
	"slices"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/homing"
)

// Where an epoch starts (regionsvc/epochstart.go, docs/design.md "Where an
// epoch starts"). A takeover records the taker's committed end as the new
// epoch's start, but the taker's log may still commit frames of the old
// epoch past it: a verbatim apply in flight, or a new leader's
// predecessor's entries (product bug 3 of notes/simfaults.md; seeds 114,
// 346, 227). The new home's range leader therefore admits no frame of its
// epoch until its log is committed to its end with nothing in flight, and
// raises the recorded start to that end (MemStore.RaiseStart) when it is
// above it. The simulator's leader does it synchronously at the append
// (regionsvc's does a ReadIndex first and holds the appends meanwhile).
//
// What the checks follow (raised): the range's home record and its epoch
// history move up, so sources resend, fences and fork explanations use
// the raised start; the old home's acked records that the new home's log
// holds between the two starts are no longer orphaned (granted counted
// them at the grant); and old-epoch frames past the start are reported
// (epochOrder, home reads) only once the epoch's start is confirmed.
// Options.mut.noStartGate turns the gate off (the product before it): the
// takeover's start is final at the grant, as the checks took it before.

// startGates is, per range, the epoch whose start a home leader
// confirmed (gate.go).
type startGates struct {
	confirmed []uint64
	// had holds the (range, epoch)s whose start a home confirmed: the
	// epochs that may have frames.
	had map[[2]uint64]bool
}

func (h *homeWorld) gates() *startGates {
	if h.starts == nil {
		h.starts = &startGates{confirmed: make([]uint64, h.w.opt.Ranges), had: map[[2]uint64]bool{}}
	}
	return h.starts
}

// resendFrom is where a source (src, the home leader driving the link)
// resends range r from to a mirror whose log ends in epoch after: where
// the source's log leaves that epoch, as Task.epochStart finds it in the
// log. Only epochs whose start a home confirmed have frames (an epoch
// granted but not confirmed yet, or replaced before its first frame, has
// none, and its recorded start may lie below the change); without one
// the change is at the source's committed end.
func (h *homeWorld) resendFrom(r int, after uint64, src *node) uint64 {
	if h.w.opt.mut.noStartGate {
		return h.epochStart(r, after)
	}
	at := ^uint64(0)
	for _, g := range h.history[r] {
		if g.home.Epoch > after && h.gates().had[[2]uint64{uint64(r), g.home.Epoch}] {
			at = min(at, g.home.StartOffset)
		}
	}
	if src != nil && src.up {
		at = min(at, src.replicas[r].Committed())
	}
	return at
}

// raiseStart raises the store's record of range r's epoch from from to
// end for node n (its view may be behind a raise another leader made:
// the store then finds it at end already) and has the checks follow it.
func (h *homeWorld) raiseStart(n *node, r int, epoch, from, end uint64) error {
	ctx := context.Background()
	if h.unreachable(n) {
		c, cancel := context.WithCancel(ctx)
		cancel()
		ctx = c
	}
	home, err := h.store.RaiseStart(ctx, homing.RaiseStartRequest{Key: rangeKey(r), Epoch: epoch, Region: regionName(n.region), From: from, To: end})
	if err != nil {
		h.res.StartWaits++
		return apierr.New(apierr.Unavailable, "%v range %d: raise epoch %d's start from %d to %d: %v", n, r, epoch, from, end, err)
	}
	h.raised(n, r, home)
	return nil
}

// raised follows a raise of range r's current epoch's start to home's
// (node n's log holds the frames below it): the home record and the
// epoch's grant move up, and the acked records the grant counted as
// orphaned that n's log holds between the two starts are acked again.
func (h *homeWorld) raised(n *node, r int, home homing.Home) {
	cur := h.homes[r]
	if home.Epoch != cur.Epoch || home.StartOffset <= cur.StartOffset {
		return
	}
	from := cur.StartOffset
	h.w.tracef("range %d: %v raised epoch %d's start from %d to %d", r, traceName(n), home.Epoch, from, home.StartOffset)
	h.homes[r].StartOffset = home.StartOffset
	// n's group committed its log to the raised start (the gate raises to
	// a ReadIndex's end), so a home replica published it. Until the raise
	// n's copy, its old-epoch frames past the grant's start, was a
	// divergent tail the checks skipped, and the old home's copies too:
	// the raise makes both current at once, and the old home's region is
	// checked first in a step (seed 320367 of the three-region minute
	// runs: region 0's copy, committed to 107 under epoch 1, was held
	// against the grant's 101 before region 2's leader, which raised the
	// start to 107, was checked in the same step). Their frames past the
	// canonical log wait for the home's check, as checkMirror says.
	h.w.homeCommitted[r] = max(h.w.homeCommitted[r], home.StartOffset)
	if hist := h.history[r]; len(hist) > 0 && hist[len(hist)-1].home.Epoch == home.Epoch {
		hist[len(hist)-1].home.StartOffset = home.StartOffset
	}
	h.res.StartsRaised++
	held, err := h.recordsAt(n, r, from, home.StartOffset)
	if err != nil {
		h.w.err = err
		return
	}
	h.fillFromCuts(r, from, home.StartOffset, held)
	h.restoreCanon(r, from, home.StartOffset, held)
	for v, o := range h.orphans[r] {
		if held[o.off] == v {
			delete(h.orphans[r], v)
			h.w.noteAcked(r, o.off, v)
			h.res.Orphaned--
		}
	}
}

// recordsAt reads the record values n's log of range r holds in
// [from, end), by offset (what retention deleted is left out).
func (h *homeWorld) recordsAt(n *node, r int, from, end uint64) (map[uint64]string, error) {
	out := map[uint64]string{}
	st := n.stores[r]
	for at := max(from, st.StartOffset()); at < end; {
		frames, err := st.ReadFrames(at, 1<<20, end)
		if err != nil || len(frames) == 0 {
			return nil, fmt.Errorf("%v range %d: read [%d, %d) after raising its start: %v", n, r, at, end, err)
		}
		was := at
		for len(frames) > 0 {
			size, err := batch.FrameSize(frames)
			if err != nil {
				return nil, err
			}
			hd, recs, err := batch.Decode(frames[:size])
			frames = frames[size:]
			if err != nil {
				return nil, err
			}
			for i := range recs {
				out[hd.Offset(&recs[i])] = string(recs[i].Value)
			}
			at = max(at, hd.BaseOffset+uint64(hd.Span()))
		}
		if at == was {
			return nil, fmt.Errorf("%v range %d: reading [%d, %d) after raising its start made no progress", n, r, at, end)
		}
	}
	return out, nil
}

// startConfirmed reports whether epoch's start in range r is final for
// the checks: confirmed by its home (raised or found equal), or the gate
// is off (the grant's start is final, as before the gate).
func (h *homeWorld) startConfirmed(r int, epoch uint64) bool {
	return h.w.opt.mut.noStartGate || h.gates().confirmed[r] >= epoch
}

// startOf is where home's epoch starts in range r now: its grant's start,
// as raised since.
func (h *homeWorld) startOf(r int, home homing.Home) uint64 {
	for _, g := range h.history[r] {
		if g.home.Epoch == home.Epoch {
			return g.home.StartOffset
		}
	}
	return home.StartOffset
}

// canonCut is what a grant cut off range r's canonical log: the records
// from offset at on.
type canonCut struct {
	at     uint64
	values []string
}

// canonCutsMax bounds the cuts kept per range.
const canonCutsMax = 8

// saveCut keeps the canonical records a grant cuts off range r at at.
func (h *homeWorld) saveCut(r int, at uint64, values []string) {
	cuts := append(h.canonCuts[r], canonCut{at: at, values: slices.Clone(values)})
	if len(cuts) > canonCutsMax {
		cuts = cuts[len(cuts)-canonCutsMax:]
	}
	h.canonCuts[r] = cuts
}

// cutValue is the canonical record a grant cut off range r at offset off,
// the latest cut's that holds it.
func (h *homeWorld) cutValue(r int, off uint64) (string, bool) {
	cuts := h.canonCuts[r]
	for i := len(cuts) - 1; i >= 0; i-- {
		if c := cuts[i]; off >= c.at && off < c.at+uint64(len(c.values)) {
			return c.values[off-c.at], true
		}
	}
	return "", false
}

// fillFromCuts adds to held (range r's records by offset in [from, to),
// as the raising node's log retains them) the records below what it
// retains, from the canonical records the grant's cut took: the raise
// keeps them in the range's log as it keeps the retained ones, so their
// acks stand too (seed 6681378: a record acked at 16, below the raiser's
// retained 18, was left counted as orphaned).
func (h *homeWorld) fillFromCuts(r int, from, to uint64, held map[uint64]string) {
	for off := from; off < to; off++ {
		if _, ok := held[off]; ok {
			continue
		}
		if v, ok := h.cutValue(r, off); ok {
			held[off] = v
		}
	}
}

// restoreCanon puts back range r's canonical records in [from, to) after
// its epoch's start was raised from from to to: the range's log holds the
// old epoch's records there again (the raise keeps them), which the
// grant's cut had taken (newTimeline). held has them: what the raising
// node's log retains, and below that (retention deleted them: seed
// 6681378, a takeover from 0 by a region whose copies had compacted
// [0, 18), raised to 92) the records the cut took, which the checks
// verified when they were canonical (fillFromCuts). It restores only a canonical
// log that stands at from (the gate holds the epoch's appends until the
// raise) and stops at the first offset it has no record for; the
// producers' last sequences are read again from the log, as at a cut.
func (h *homeWorld) restoreCanon(r int, from, to uint64, held map[uint64]string) {
	w := h.w
	if uint64(len(w.canonical[r])) != from {
		return
	}
	for off := from; off < to; off++ {
		v, ok := held[off]
		if !ok {
			break
		}
		if _, dup := w.seen[r][v]; dup {
			break
		}
		w.seen[r][v] = off
		w.canonical[r] = append(w.canonical[r], v)
	}
	w.rereadLastSeqs(r)
}
