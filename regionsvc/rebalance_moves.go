package regionsvc

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/geolog/geolog/internal/replicamove"
	"github.com/geolog/geolog/placement"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/raftnet"
)

func raftnetID(id uint64) raftnet.NodeID { return raftnet.NodeID(id) }

// startMove runs move m, planned from range r as the round's snapshot
// saw it, in a task of the node's stopper, under the current leadership's
// context; its end goes to rb.ended.
func (rb *rebalancer) startMove(m placement.Move, r placement.Range) {
	if m.To == 0 {
		rb.logger.Info("removing an excess voter", "range", m.Range.String(), "from", m.From, "voters", r.Replicas, "reason", m.Reason.String())
	} else {
		rb.logger.Info("moving replica", "range", m.Range.String(), "from", m.From, "to", m.To, "reason", m.Reason.String())
	}
	lctx, gen := rb.leaderCtx, rb.gen
	ok := rb.n.tasks.Go(func(sctx context.Context) {
		ctx, cancel := context.WithTimeout(lctx, rb.cfg.MoveTimeout)
		defer cancel()
		start := time.Now()
		err := rb.runMove(ctx, m, r)
		if err != nil {
			rb.logger.Warn("replica move failed", "range", m.Range.String(), "from", m.From, "to", m.To, "error", err)
		} else {
			rb.logger.Info("replica moved", "range", m.Range.String(), "from", m.From, "to", m.To, "took", time.Since(start).Round(time.Millisecond))
		}
		rb.metrics.ended(m.Reason, err, time.Since(start))
		if err != nil {
			rb.movesFailed.Add(1)
		} else {
			rb.movesDone.Add(1)
		}
		rb.end(sctx, gen, m.Range)
	})
	if !ok {
		rb.loop.Done(m.Range)
	}
}

// runMove carries out m at the range leader: an excess voter's removal
// (never below r's replication factor), or a replacement that goes on
// only while the range has the voters r had when m was planned
// (replicamove.Config.Planned: another move of the range, by an earlier
// leadership or another node, stops it before it adds a voter too many).
func (rb *rebalancer) runMove(ctx context.Context, m placement.Move, r placement.Range) error {
	admin := &rangeRouter{n: rb.n, stream: m.Range.Stream, r: m.Range.Range}
	if m.To == 0 {
		return replicamove.Remove(ctx, admin, m.From, r.ReplicationFactor, replicamove.Config{})
	}
	return replicamove.Replace(ctx, admin, m.From, m.To, replicamove.Config{LagEntriesMax: moveCatchUpLagEntriesMax, Planned: slices.Clone(r.Replicas)})
}

// end reports to the loop goroutine that a move or cleanup of leadership
// gen ended (unless the node is stopping: the loop has gone).
func (rb *rebalancer) end(ctx context.Context, gen uint64, id placement.RangeID) {
	select {
	case rb.ended <- moveEnd{gen: gen, id: id}:
	case <-ctx.Done():
	}
}

// startCleanup removes a learner that no move under way owns.
func (rb *rebalancer) startCleanup(c placement.Cleanup) {
	rb.logger.Info("removing a learner left by an earlier move", "range", c.Range.String(), "learner", c.Learner)
	lctx, gen := rb.leaderCtx, rb.gen
	ok := rb.n.tasks.Go(func(sctx context.Context) {
		ctx, cancel := context.WithTimeout(lctx, time.Minute)
		defer cancel()
		admin := &rangeRouter{n: rb.n, stream: c.Range.Stream, r: c.Range.Range}
		if _, err := admin.Change(ctx, geologv1.ReplicaChange_REPLICA_CHANGE_REMOVE, c.Learner, nil); err != nil { // a learner: the voters stay
			rb.logger.Warn("learner removal failed", "range", c.Range.String(), "learner", c.Learner, "error", err)
		}
		rb.end(sctx, gen, c.Range)
	})
	if !ok {
		rb.loop.Done(c.Range)
	}
}

// currentRegion is the region as the planner needs it: the node list and
// every range's current voters, learners and leader, asked of its leader,
// with the size this node's replica holds where it is a voter. Any range
// that does not answer fails the snapshot (a plan from a partial view
// would take its replicas as missing). The rebalancer's rounds use the
// cheaper incremental snapshot (rebalance_snapshot.go); a decommission's
// check uses this one.
func (n *Node) currentRegion(ctx context.Context) (placement.Region, error) {
	reg := n.placementRegion()
	for i := range reg.Ranges {
		r := &reg.Ranges[i]
		c, err := n.describeRange(ctx, r.ID)
		if err != nil {
			return placement.Region{}, err
		}
		r.Replicas, r.Learners, r.Leader = c.voters, c.learners, c.leader
		r.SizeBytes = n.localRangeBytes(r.ID, r.Replicas)
	}
	return reg, nil
}

// describeRange asks range id's leader for its voters, learners and
// leader.
func (n *Node) describeRange(ctx context.Context, id placement.RangeID) (rangeConf, error) {
	rr := &rangeRouter{n: n, stream: id.Stream, r: id.Range}
	d, err := rr.Describe(ctx)
	if err != nil {
		return rangeConf{}, fmt.Errorf("range %s: %w", id, err)
	}
	c := rangeConf{leader: d.GetLeaderId(), local: rr.leader == n.cfg.NodeID}
	for _, rs := range d.GetReplicas() {
		if rs.GetRole() == "voter" {
			c.voters = append(c.voters, rs.GetNodeId())
		} else {
			c.learners = append(c.learners, rs.GetNodeId())
		}
	}
	return c, nil
}

// localRangeBytes is the size of this node's copy of range id if this node
// is one of its voters (cheap: an atomic), else 0.
func (n *Node) localRangeBytes(id placement.RangeID, voters []uint64) int64 {
	if !contains(voters, n.cfg.NodeID) {
		return 0
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	st, ok := n.streams[id.Stream]
	if !ok || int(id.Range) >= len(st.ranges) || st.ranges[id.Range].store == nil {
		return 0
	}
	return st.ranges[id.Range].store.Size()
}
