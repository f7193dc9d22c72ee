package sim

import (
	"context"

	"github.com/geolog/geolog/homing"
	"github.com/geolog/geolog/rangecore"
)

// The timeline fence of a home read (on another region's copy, or on the
// home's own while it holds a tail from an earlier time as home), run
// by the product's own core (rangecore.Timeline, which regionsvc's range
// driver drives in regionsvc/timeline.go): the copy's node knows the
// range's home record (its role: the store's current record, as a fresh
// directory read gives it) and the epoch starts it learned, and reads the
// range's epoch history from the store when the core asks for it
// (WantHistory), at once here (regionsvc's homing loop serves it within
// epochWantsInterval, fencing everything meanwhile). A store the node
// cannot reach leaves the history unread: everything stays fenced. Epochs
// heard only from heartbeats are not modelled (heard 0).

// fence is the offset below which n's copy of range r serves local reads
// (rangecore.NoFence: all of it).
func (h *homeWorld) fence(n *node, r int) uint64 {
	rep, tl := n.replicas[r], &n.timelines[r]
	cur, home := n.core.View().Home(rangeKey(r))
	role := rangecore.Role{Home: true, Region: regionName(n.region), Epoch: cur.Epoch}
	if h.w.opt.mut.homeNoFence {
		role = rangecore.Role{Home: true}
	}
	if !home {
		// regionsvc's roleOf: the directory's record of a home elsewhere;
		// of its own region without the view's lease, nothing known.
		role = rangecore.Role{}
		if cur := h.homes[r]; cur.Region != regionName(n.region) {
			role = rangecore.Role{Region: cur.Region, Epoch: cur.Epoch, Start: cur.StartOffset}
		}
	}
	f, want := tl.Fence(role, rep.HighestEpoch(), 0)
	if want == rangecore.WantHistory && !h.unreachable(n) {
		if recs, err := h.store.History(context.Background(), rangeKey(r)); err == nil {
			tl.LearnHistory(homing.EpochStarts(recs))
			f, _ = tl.Fence(role, rep.HighestEpoch(), 0)
		}
	}
	if f == nil {
		return rangecore.NoFence
	}
	return f.Offset
}
