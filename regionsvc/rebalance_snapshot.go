package regionsvc

import (
	"context"
	"slices"
	"time"

	"github.com/geolog/geolog/placement"
)

// The rebalancer's snapshot, incremental.
//
// A round needs every range's voters, learners and leader. Asking every
// range leader each round (DescribeReplicas) costs one call per range per
// round: 330 calls a second at 10,000 ranges and the 30 s default, two
// thirds of them remote on a 3-node region. But a range's voters change
// only by a membership change, which is nearly always the rebalancer's own
// move. So the catalogue leader keeps each range's last answer and, each
// round, asks again only:
//
//   - ranges it has no answer for (new streams, a new leadership: the
//     cache starts empty each time this node starts leading the
//     catalogue);
//   - ranges with a move or learner removal under way, or whose move ended
//     since the last round;
//   - ranges this node leads (an in-process call, no network);
//   - the snapshotRefreshRounds-th part of the others, the oldest answers
//     first, so that every answer is at most snapshotRefreshRounds rounds
//     old (a change made by hand, `geolog replicas replace`, is seen
//     within that many rounds; a move planned from an older view resumes
//     or ends at the range's Raft configuration, internal/replicamove).
//
// The leader of a range this node holds a replica of is read from that
// replica (an atomic), fresher than any cached answer. So at 10,000 ranges
// a round makes about 1,000 remote calls instead of 6,700 (33 a second at
// the default interval, from 330). A range that cannot be asked keeps its
// last answer unless it has none, or a move of it is under way: then the
// round plans nothing, as before.

// snapshotRefreshRounds is how many rounds a cached answer may serve.
const snapshotRefreshRounds = 10

// rangeConf is a range's voters, learners and leader as its leader said;
// local if this node answered, at when.
type rangeConf struct {
	voters, learners []uint64
	leader           uint64
	local            bool
	at               time.Time
}

// snapshot is currentRegion from the cache (loop goroutine).
func (rb *rebalancer) snapshot(ctx context.Context, now time.Time) (placement.Region, error) {
	n := rb.n
	reg := n.placementRegion()
	if rb.cache == nil {
		rb.cache = map[placement.RangeID]rangeConf{}
	}
	busy := map[placement.RangeID]bool{}
	for _, m := range rb.loop.InFlight() {
		busy[m.Range] = true
	}
	var aged []placement.RangeID
	need := map[placement.RangeID]bool{}
	for _, r := range reg.Ranges {
		c, ok := rb.cache[r.ID]
		switch {
		case !ok || busy[r.ID] || rb.changed[r.ID] || c.local || len(c.learners) > 0:
			need[r.ID] = true
		default:
			aged = append(aged, r.ID)
		}
	}
	slices.SortFunc(aged, func(a, b placement.RangeID) int { return rb.cache[a].at.Compare(rb.cache[b].at) })
	for _, id := range aged[:min(len(aged), len(reg.Ranges)/snapshotRefreshRounds+1)] {
		need[id] = true
	}
	for i := range reg.Ranges {
		r := &reg.Ranges[i]
		if need[r.ID] {
			c, err := n.describeRange(ctx, r.ID)
			if err != nil || !c.local {
				rb.remoteDescribes.Add(1)
			}
			if err != nil {
				if _, ok := rb.cache[r.ID]; !ok || busy[r.ID] || rb.changed[r.ID] {
					return placement.Region{}, err
				}
				rb.logger.Debug("range not described: its last answer serves", "range", r.ID.String(), "error", err)
			} else {
				c.at = now
				rb.cache[r.ID] = c
				delete(rb.changed, r.ID)
			}
		}
		c := rb.cache[r.ID]
		r.Replicas, r.Learners, r.Leader = slices.Clone(c.voters), slices.Clone(c.learners), c.leader
		if d := n.localRange(r.ID.Stream, r.ID.Range); d != nil && d.rep != nil && d.rep.LeaderID() != 0 &&
			(slices.Contains(c.voters, n.cfg.NodeID) || slices.Contains(c.learners, n.cfg.NodeID)) {
			r.Leader = d.rep.LeaderID() // a member's view, not a passive replica's
		}
		r.SizeBytes = n.localRangeBytes(r.ID, r.Replicas)
	}
	rb.pruneCache(reg)
	rb.snapshots.Add(1)
	return reg, nil
}

// pruneCache forgets the answers of ranges no longer in reg.
func (rb *rebalancer) pruneCache(reg placement.Region) {
	if len(rb.cache) <= len(reg.Ranges) {
		return
	}
	keep := make(map[placement.RangeID]bool, len(reg.Ranges))
	for _, r := range reg.Ranges {
		keep[r.ID] = true
	}
	for id := range rb.cache {
		if !keep[id] {
			delete(rb.cache, id)
		}
	}
}
