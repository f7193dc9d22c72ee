package regionsvc

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/geolog/geolog/membership"
	"github.com/geolog/geolog/placement"
	"github.com/hashicorp/go-hclog"
)

// The rebalancer: placement.Plan carried out (issue 12, item 3).
//
// Every node runs one rebalancer goroutine; only the one on the catalogue
// leader acts. Each round (RebalanceConfig.Interval):
//
//  1. Every node notes which region members the Raft transport finds down
//     (placement.Loop.Observe). A node down for DeadNodeAfter is dead: this
//     node's placement of new ranges avoids it (placementRegion reads
//     n.deadNodes), and the leader's planner repairs its ranges. The
//     transport has a verdict only on a node it has dialled or heard from,
//     so each round probes every member it has none on
//     (raftnet.GRPCTransport.Probe): every node then keeps a stream to
//     every member, and a node that died while this one followed is known
//     down here, with its time, when leadership arrives. A member still
//     without a verdict (just joined, or this node just started) is no
//     target of a move until the dial answers.
//  2. On the catalogue leader: a snapshot of every range's current voters
//     and learners and its leader, asked of the range leaders
//     (DescribeReplicas: the Raft configuration is the truth, the
//     catalogue's Replicas only the first voters), with the sizes this
//     node knows; then placement.Loop.Next plans at most MovesMax moves
//     (repairs first, then drains, zone spread, balance) counting those
//     under way.
//  3. Each move runs in its own task: internal/replicamove.Replace, the
//     steps of `geolog replicas replace` (learner, catch-up, promote,
//     remove), through rangeRouter (rebalance_admin.go) to the range
//     leader. A move whose old replica leads the range hands leadership
//     off first (adminServer.ChangeReplicas).
//  4. When the node stops leading the catalogue, the moves under way are
//     cancelled and forgotten; the next leader resumes from the ranges'
//     Raft configurations (a learner nothing owns is removed).
//
// At most one move per range at a time (issue 12: two moves of node 6's
// replica of one range, 6->4 and 6->5, once left it with four voters):
//
//   - on this node, across its leaderships: a cancelled move's range
//     takes no new move until the move's task has ended (each end is
//     reported to the loop whichever leadership started it;
//     placement.Loop.Reset);
//   - across nodes (an old catalogue leader's move still running while
//     the new one plans): each move carries the voters it was planned
//     from (replicamove.Config.Planned) and adds or promotes its learner
//     only while the range is as planned, so of two overlapping moves
//     at most one promotes;
//   - and a range that still ends with more voters than its factor (a
//     change made by hand) loses the excess one (placement's Excess).
//
// Nothing new is recorded in the catalogue for a move. Decommission of a
// node that still holds replicas drains it and is refused until it is
// empty (rebalance_admin.go). Snapshots to a catching-up learner go
// through a token bucket (TransferBytesPerSecond, rebalance_throttle.go).

// ErrNodeNotEmpty is the cause of a refused decommission: the node still
// holds replicas.
var ErrNodeNotEmpty = errors.New("regionsvc: node still holds replicas")

// RebalanceConfig configures the rebalancer.
type RebalanceConfig struct {
	// Interval is the pause between rounds (and a round runs too when a
	// move ends); 0 turns the rebalancer off (geologd's default is 30 s).
	// Each round asks every range's leader for its voters: one
	// DescribeReplicas per range, local or remote. With it off, drain and decommission
	// move nothing (the operator runs `geolog replicas replace`).
	Interval time.Duration
	// DeadNodeAfter is how long a node must be unreachable before its
	// replicas are repaired elsewhere; default 5 min.
	DeadNodeAfter time.Duration
	// MovesMax bounds the moves under way at once in the region; default 2.
	MovesMax int
	// TransferBytesPerSecond bounds the bytes per second of snapshots
	// (segment transfers) this node sends; 0: no bound.
	TransferBytesPerSecond int64
	// MoveTimeout bounds one move; default 10 min.
	MoveTimeout time.Duration
	// LeaderTransfersMax bounds the leader transfers under way at once
	// (leaders.go); default 4, negative: no leader balancing.
	LeaderTransfersMax int
	// StrayCheckInterval is how often every node sweeps its ranges for
	// stray replicas (strays.go), whether or not the rebalancer runs;
	// default 30 s, negative: never.
	StrayCheckInterval time.Duration
}

func (c *RebalanceConfig) setDefaults() {
	if c.DeadNodeAfter <= 0 {
		c.DeadNodeAfter = 5 * time.Minute
	}
	if c.MovesMax <= 0 {
		c.MovesMax = 2
	}
	if c.MoveTimeout <= 0 {
		c.MoveTimeout = 10 * time.Minute
	}
	if c.LeaderTransfersMax == 0 {
		c.LeaderTransfersMax = 4
	}
}

// moveCatchUpLagEntriesMax: a learner this close to the leader's last
// index is promoted (replicamove.Config.LagEntriesMax); under a steady
// stream of appends an exact match is rarely seen by a poll.
const moveCatchUpLagEntriesMax = 64

// rebalancer is a node's rebalancing driver. The loop goroutine owns loop
// and leading; status is what it publishes for ListNodes, the metrics and
// tests.
type rebalancer struct {
	n      *Node
	cfg    RebalanceConfig
	logger hclog.Logger
	loop   *placement.Loop
	// ended receives the range of each move or cleanup that ended, of
	// this leadership or an earlier one (the loop keeps a cancelled
	// move's range until its end: one move per range); gen counts the
	// leaderships.
	ended chan moveEnd
	gen   uint64
	// cancelMoves cancels the moves of the current leadership (nil: not
	// leading).
	leaderCtx   context.Context
	cancelMoves context.CancelFunc
	metrics     *rebalanceMetrics

	mu     sync.Mutex
	status rebalanceStatus
	// peakMoves is the most moves and cleanups ever under way at once
	// (cancelled ones still running included);
	// movesDone and movesFailed count the moves ended.
	peakMoves, movesDone, movesFailed atomic.Int64
	// pending is the leader transfers under way (loop goroutine,
	// leaders.go); leaderTransfers counts those recorded, peakTransfers
	// the most ever under way at once.
	pending                        map[placement.RangeID]pendingTransfer
	unmet                          unmetPreferences
	leaderTransfers, peakTransfers atomic.Int64
	// cache is each range's last described configuration, changed the
	// ranges whose move ended since (loop goroutine,
	// rebalance_snapshot.go); remoteDescribes counts the ranges asked of
	// another node, snapshots the snapshots taken.
	cache                      map[placement.RangeID]rangeConf
	changed                    map[placement.RangeID]bool
	remoteDescribes, snapshots atomic.Int64
}

// moveEnd is the end of a move or cleanup of range id, started in
// leadership gen.
type moveEnd struct {
	gen uint64
	id  placement.RangeID
}

// rebalanceStatus is the rebalancer's last published view.
type rebalanceStatus struct {
	leading bool
	// snapshot is the region as last planned from (current voters).
	snapshot placement.Region
	haveSnap bool
	moves    []placement.Move
	started  map[placement.RangeID]time.Time
	// unreachable is each down node's unreachable time; dead the nodes
	// past DeadNodeAfter.
	unreachable map[uint64]time.Duration
	dead        map[uint64]bool
	// transfers is the leader transfers under way (leaders.go).
	transfers int
}

// newRebalancer sets up the node's rebalancer (if Config.Rebalance has an
// interval) and transfer bucket; Start runs the rebalancer.
func (n *Node) newRebalancer() error {
	cfg := n.cfg.Rebalance
	n.transferLimiter = newTransferLimiter(cfg.TransferBytesPerSecond)
	if cfg.Interval <= 0 {
		return nil
	}
	cfg.setDefaults()
	rb := &rebalancer{n: n, cfg: cfg, logger: n.cfg.Logger.Named("rebalance"),
		loop:    placement.NewLoop(placement.LoopConfig{MovesMax: cfg.MovesMax, DeadAfter: cfg.DeadNodeAfter}),
		ended:   make(chan moveEnd, cfg.MovesMax),
		pending: map[placement.RangeID]pendingTransfer{}, unmet: unmetPreferences{}, changed: map[placement.RangeID]bool{}}
	if err := rb.registerMetrics(n.cfg.MeterProvider); err != nil {
		return err
	}
	n.rebalancer = rb
	return nil
}

// run is the loop goroutine (a task of the node's stopper).
func (rb *rebalancer) run(ctx context.Context) {
	t := time.NewTicker(rb.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			rb.stopLeading()
			return
		case e := <-rb.ended:
			// Every end goes to the loop, whichever leadership started
			// the move: until a cancelled move has ended, its range
			// takes no new one (placement.Loop.Reset), since it may
			// still have a membership change on its way.
			if e.gen != rb.gen {
				rb.logger.Debug("a move of an earlier leadership ended", "range", e.id.String())
			}
			rb.loop.Done(e.id)
			rb.changed[e.id] = true
			// A slot is free: plan at once rather than wait up to an
			// interval (a drain of many ranges goes at the pace of its
			// moves, not of the rounds).
			rb.round(ctx)
		case <-t.C:
			rb.round(ctx)
		}
	}
}

// round is one pass: liveness, then (on the catalogue leader) plan and
// start moves.
func (rb *rebalancer) round(ctx context.Context) {
	now := time.Now()
	rb.observe(now)
	if !rb.n.leadsCatalogue() { // homing.go
		rb.stopLeading()
		return
	}
	if rb.cancelMoves == nil {
		lctx, cancel := context.WithCancel(ctx)
		rb.cancelMoves, rb.leaderCtx = cancel, lctx
		rb.gen++
		rb.logger.Info("leading the catalogue: rebalancing the region")
	}
	snapCtx, cancel := context.WithTimeout(ctx, rb.cfg.Interval+5*time.Second)
	reg, err := rb.snapshot(snapCtx, now) // rebalance_snapshot.go
	cancel()
	if err != nil {
		rb.logger.Debug("snapshot incomplete: no moves this round", "error", err)
		return
	}
	rb.markUnknown(&reg)
	moves, cleanups := rb.loop.Next(now, reg)
	if len(moves) > 0 {
		planned := make(map[placement.RangeID]placement.Range, len(reg.Ranges))
		for _, r := range reg.Ranges {
			planned[r.ID] = r
		}
		for _, m := range moves {
			rb.startMove(m, planned[m.Range])
		}
	}
	for _, c := range cleanups {
		rb.startCleanup(c)
	}
	rb.balanceLeaders(ctx, now, reg) // leaders.go
	rb.peakMoves.Store(max(rb.peakMoves.Load(), int64(rb.loop.Busy()+rb.loop.Cancelled())))
	rb.mu.Lock()
	rb.status.snapshot, rb.status.haveSnap = rb.loop.Overlay(now, reg), true
	rb.mu.Unlock()
	rb.publishMoves()
}

// observe feeds the transport's view of the members to the loop and
// publishes the dead nodes (every node, leader or not). A member the
// transport has no verdict on is probed; it is not down (a follower would
// otherwise count a live node's time towards dead), and markUnknown keeps
// it from being a move's target.
func (rb *rebalancer) observe(now time.Time) {
	down := map[uint64]bool{}
	tr := rb.n.region.transport
	for _, m := range rb.n.memberNodes() {
		if m.ID == rb.n.cfg.NodeID || m.State == membership.Decommissioned {
			continue
		}
		if !tr.PeerKnown(raftnetID(m.ID)) {
			tr.Probe(raftnetID(m.ID))
		}
		if tr.PeerDown(raftnetID(m.ID)) {
			down[m.ID] = true
		}
	}
	rb.loop.Observe(now, down)
	dead := map[uint64]bool{}
	for _, id := range rb.loop.Dead(now) {
		dead[id] = true
	}
	unreachable := map[uint64]time.Duration{}
	for id := range down {
		unreachable[id] = rb.loop.Unreachable(now, id)
	}
	rb.mu.Lock()
	rb.status.unreachable, rb.status.dead = unreachable, dead
	rb.mu.Unlock()
}

// markUnknown marks Unreachable (no target of a move) the members the
// transport has no verdict on yet: PeerDown answers "up" for them only
// because nothing was tried. Without it, a node that came to lead the
// catalogue planned moves onto a member that had died while it followed,
// each holding its range and a MovesMax slot until MoveTimeout.
func (rb *rebalancer) markUnknown(reg *placement.Region) {
	for i, nd := range reg.Nodes {
		if nd.ID != rb.n.cfg.NodeID && !rb.n.region.transport.PeerKnown(raftnetID(nd.ID)) {
			reg.Nodes[i].Unreachable = true
		}
	}
}

// stopLeading cancels the moves under way and forgets them.
func (rb *rebalancer) stopLeading() {
	if rb.cancelMoves == nil {
		return
	}
	rb.logger.Info("no longer leading the catalogue: moves under way cancelled", "moves", rb.loop.Busy())
	rb.cancelMoves()
	rb.cancelMoves, rb.leaderCtx = nil, nil
	rb.loop.Reset()
	clear(rb.pending)
	clear(rb.unmet)
	rb.cache = nil
	clear(rb.changed)
	rb.mu.Lock()
	rb.status.leading, rb.status.moves, rb.status.haveSnap, rb.status.transfers = false, nil, false, 0
	rb.mu.Unlock()
}

// publishMoves publishes the moves under way.
func (rb *rebalancer) publishMoves() {
	moves := rb.loop.InFlight()
	rb.mu.Lock()
	defer rb.mu.Unlock()
	rb.status.leading = rb.cancelMoves != nil
	rb.status.moves = moves
	if rb.status.started == nil {
		rb.status.started = map[placement.RangeID]time.Time{}
	}
	for id := range rb.status.started {
		if !containsMove(moves, id) {
			delete(rb.status.started, id)
		}
	}
	for _, m := range moves {
		if _, ok := rb.status.started[m.Range]; !ok {
			rb.status.started[m.Range] = time.Now()
		}
	}
}

func containsMove(moves []placement.Move, id placement.RangeID) bool {
	for _, m := range moves {
		if m.Range == id {
			return true
		}
	}
	return false
}

// snapshotStatus returns a copy of what the rebalancer last published.
func (rb *rebalancer) snapshotStatus() rebalanceStatus {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	st := rb.status
	st.moves = append([]placement.Move(nil), st.moves...)
	return st
}

// deadNodes returns the nodes this node takes as dead (nil: none, or no
// rebalancer).
func (n *Node) deadNodes() map[uint64]bool {
	rb := n.rebalancer
	if rb == nil {
		return nil
	}
	rb.mu.Lock()
	defer rb.mu.Unlock()
	return rb.status.dead
}
