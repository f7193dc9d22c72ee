package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/internal/replicamove"
	"github.com/geolog/geolog/placement"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/replica"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Replica moves, joins and drains (Regions 1, one run in two; see
// notes/simmoves.md). The region gets one or two spare nodes: new Raft
// ids (Nodes+1, ...), in no range's initial configuration, whose process
// starts at a random virtual time (the join) and which then count as live
// nodes of the region. One node of the first Nodes is marked draining at
// a random time.
//
// Who decides is the product: every movePlanMs the real planner
// (placement.Plan, MovesMax 2, under placement.Loop, on the rebalancer
// node with the nodes its failure detector finds down: observeDown) is
// given the region as its leaders describe it (nodes live or draining, each in a zone of its own; every
// range's voters and learners at its highest applied configuration, its
// leader, a move under way as Moving) and its moves run. Besides, now and
// then an operator move (`geolog replicas replace`: a random voter to a
// random live node not in the range, no Planned check) starts on a range
// with no move. Who carries a move out is the product too: each move runs
// the real internal/replicamove.Replace (or Remove, for a planner's Excess
// move or a learner left behind) on a goroutine of its own, with the
// rebalancer's Config (LagEntriesMax 64, Planned: the voters planned
// from). Its Admin calls (Describe, Change) hand over to the simulator,
// which answers them at the range leader of the virtual moment, as
// regionsvc's adminServer (refusals, a leader handing off its lead before
// its own removal, replica.ProposeConfChange answered once applied, the
// leader's match indexes) and rangeRouter (calls retried at the leader of
// now, bounded) do, and waits for the goroutine's next call before it
// steps on: the goroutine runs only while the simulator waits, so a seed
// replays exactly. Replace's poll between two Describes is virtual
// (movePollMs; its real PollInterval is 1 ns).
//
// Faults aimed at moves: one move in two draws a crash or a partition of
// its source, its target or the range leader, 0-400 ms after it starts
// (a source cut off while it is removed never hears its removal).
//
// Checks, every tick: every configuration any replica holds is a single
// one (no joint state), with at most one learner and between RF and RF+1
// voters; at most one membership change per range is asked at a time; no
// replica acks an append of a range whose latest configuration (the one
// at the highest applied index of any of its replicas) it is not a member
// of. At the end: every range has exactly RF voters and no learner, none
// on the drained node, and every member of it committed the whole log
// (the others are not checked: a removed replica keeps what it had).

const (
	movePlanMs     = 100   // the planner's period
	movePollMs     = 20    // a Describe's round trip and Replace's poll
	moveRetryMs    = 20    // a Change retried at the leader of now
	moveAttemptMs  = 1000  // a proposed change unanswered: asked again
	moveCallMs     = 6000  // an Admin call gives up (rangeRouter's rounds)
	moveOperatorP  = 0.001 // per ms of faults: an operator move starts
	moveCatchUpLag = 64    // regionsvc's moveCatchUpLagEntriesMax
	// moveTimeoutMs bounds a move (regionsvc's MoveTimeout, 10 min by
	// default, scaled as the dead-node time is: a move whose learner's
	// node died for good waits for its catch-up until then). Its Admin
	// calls then fail with the context's error, as rangeRouter's do.
	moveTimeoutMs = 30000
)

// MoveResult counts what the moves did (Regions 1).
type MoveResult struct {
	Runs                         int // runs with moves (in a sum)
	Spares, Joined, Drained      int
	Planned, Operator, Cleanups  int
	Done, Failed                 int
	Changes, HandOffs, Refused   int
	AimedCrashes, AimedPartition int
	// dead.go: nodes dead (for good), dead nodes back, repair moves
	// planned, nodes decommissioned.
	DeadNodes, DeadForever, Returned int
	Repairs, Decommissioned          int
	TimedOut                         int // moves that ran out of time
}

func (r MoveResult) add(o MoveResult) MoveResult {
	r.Runs += o.Runs
	r.Spares += o.Spares
	r.Joined += o.Joined
	r.Drained += o.Drained
	r.Planned += o.Planned
	r.Operator += o.Operator
	r.Cleanups += o.Cleanups
	r.Done += o.Done
	r.Failed += o.Failed
	r.Changes += o.Changes
	r.HandOffs += o.HandOffs
	r.Refused += o.Refused
	r.AimedCrashes += o.AimedCrashes
	r.AimedPartition += o.AimedPartition
	r.DeadNodes += o.DeadNodes
	r.DeadForever += o.DeadForever
	r.Returned += o.Returned
	r.Repairs += o.Repairs
	r.Decommissioned += o.Decommissioned
	r.TimedOut += o.TimedOut
	return r
}

func (r MoveResult) String() string {
	if r.Spares == 0 {
		return ""
	}
	return fmt.Sprintf("; moves: %d spares (%d joined), %d drained, %d planned moves, %d operator moves, %d cleanups, %d done, %d failed, %d changes applied, %d leader hand-offs, %d changes refused, %d crashes and %d partitions aimed at moves",
		r.Spares, r.Joined, r.Drained, r.Planned, r.Operator, r.Cleanups, r.Done, r.Failed, r.Changes, r.HandOffs, r.Refused, r.AimedCrashes, r.AimedPartition) + r.deadString()
}

func (r MoveResult) deadString() string {
	if r.DeadNodes == 0 && r.Decommissioned == 0 {
		return ""
	}
	return fmt.Sprintf("; %d dead nodes (%d for good, %d back), %d repair moves, %d decommissioned, %d moves timed out", r.DeadNodes, r.DeadForever, r.Returned, r.Repairs, r.Decommissioned, r.TimedOut)
}

type moveWorld struct {
	w       *world
	rng     *rand.Rand
	on      bool
	rf      int
	joinAt  []int64
	drainAt int64
	drained int // the draining node's id (0: none yet)
	moves   []*move
	// conf is, per range, the configuration at the highest applied index
	// any replica showed (applied), and members every node that was ever
	// a member: the removed are those not in conf.
	conf    []*raftpb.ConfState
	applied []uint64
	members []map[uint64]bool
	// asking is, per range, the Change calls the simulator is carrying
	// out (at most one).
	asking []int
	loop   *placement.Loop
	// strays are the (node, range) replicas a test's mutation restarted
	// as groups of their own (moveStray): not the range's group.
	strays map[[2]int]bool
	dead   deadWorld // dead.go
	// downSince is, per node found down (observeDown), since when;
	// deadAfterMs the loop's dead-node time.
	downSince   map[uint64]int64
	deadAfterMs int64
	// operatorP is the chance, per virtual ms of faults, that an
	// operator move starts (moveOperatorP; drawn the same whatever its
	// value). A directed test sets 0 and starts its own (start).
	operatorP float64
	// pastFactor counts the learners asked of a leader whose range held
	// more voters than its replication factor (a move cut short after
	// its promotion): refused, as regionsvc's ChangeReplicas does (also
	// counted in res.Refused), or proposed under addPastFactor. Kept
	// out of MoveResult so that the pinned schedule digests stay.
	pastFactor int
	done       chan struct{}
	res        MoveResult
}

// move is one replica move running replicamove on its goroutine.
type move struct {
	r        int
	from, to uint64
	kind     string // planner's reason, "operator", "cleanup"
	loop     bool   // the rebalancer's Loop started it (Done at its end)
	calls    chan *adminCall
	answers  chan adminAnswer
	cur      *adminCall
	since    int64 // when cur came
	started  int64 // when the move started
	timedOut bool  // past moveTimeoutMs: every call fails
	proposed int64 // when cur's change was proposed (-1: not now)
	seq      int   // answers of older proposals are ignored
	outcome  *adminAnswer
	// caughtUp is the leader whose ReadIndex for cur's change answered
	// (regionsvc's caughtUpLeader), and caughtGen its generation; the
	// change is proposed at it next (nil: none).
	caughtUp  *node
	caughtGen int
	faultAt   int64 // a fault aimed at the move (-1: none)
	fault     int
}

type adminCall struct {
	change bool
	typ    geologv1.ReplicaChange
	node   uint64
	expect []uint64 // ChangeReplicasRequest.expected_voters
	end    bool     // the goroutine returned err
	err    error
}

type adminAnswer struct {
	desc *geologv1.DescribeReplicasResponse
	resp *geologv1.ChangeReplicasResponse
	err  error
}

var errRunOver = errors.New("sim: the run is over")

func newMoveWorld(w *world) *moveWorld {
	m := &moveWorld{w: w, rng: rand.New(rand.NewPCG(uint64(w.opt.Seed), 0x6d6f766573)), rf: w.opt.Nodes, done: make(chan struct{}), strays: map[[2]int]bool{},
		operatorP: moveOperatorP}
	w.perRegion = w.opt.Nodes
	m.on = w.opt.Regions == 1 && (m.rng.IntN(2) == 0 || w.opt.mut.movesAlways)
	if !m.on {
		return m
	}
	spares := 1 + m.rng.IntN(2)
	w.perRegion += spares
	m.res.Spares, m.res.Runs = spares, 1
	steps := int64(w.opt.Steps)
	for i := 0; i < spares; i++ {
		m.joinAt = append(m.joinAt, 100+m.rng.Int64N(max(steps/2, 1)))
	}
	m.drainAt = 300 + m.rng.Int64N(max(steps*2/3, 1))
	m.conf = make([]*raftpb.ConfState, w.opt.Ranges)
	m.applied = make([]uint64, w.opt.Ranges)
	m.members = make([]map[uint64]bool, w.opt.Ranges)
	m.asking = make([]int, w.opt.Ranges)
	m.downSince = map[uint64]int64{}
	m.loop = m.newPlacementLoop(5 * time.Minute)
	for r := range m.conf {
		m.conf[r] = &raftpb.ConfState{}
		m.members[r] = map[uint64]bool{}
		for id := 1; id <= w.opt.Nodes; id++ {
			m.conf[r].Voters = append(m.conf[r].Voters, uint64(id))
			m.members[r][uint64(id)] = true
		}
	}
	m.drawDead()
	return m
}

// newPlacementLoop is the rebalancer's core with regionsvc's defaults
// (MovesMax 2, DeadNodeAfter 5 minutes) but for the dead-node time.
func (m *moveWorld) newPlacementLoop(deadAfter time.Duration) *placement.Loop {
	m.deadAfterMs = deadAfter.Milliseconds()
	if m.w.opt.mut.targetUnreachable {
		deadAfter = 0 // observeDown reports the dead only
	}
	return placement.NewLoop(placement.LoopConfig{MovesMax: 2, DeadAfter: deadAfter})
}

// rebalancerNode is the node whose rebalancer plans this round, nil if
// none. In the product it is the catalogue's leader (regionsvc's
// leadsCatalogue: the node that believes it leads the catalogue group),
// which the simulator has not: its stand-in is the leader of range 0, a
// Raft group of the region like the catalogue, as leaderOf finds it (the
// lowest-id live node that believes it leads). So, as in the product,
// the rebalancer moves with elections, none plans while the group has no
// leader, and a leader cut off plans on until it steps down. The
// lowest-id live node would stand in for a catalogue that never changes
// leader but when its leader crashes.
//
// The product's loops are one per node, each observing its own
// transport every round; the simulator's is one (its moves under way
// outlive a change of rebalancer node, where the product cancels them),
// fed by the rebalancer node of the round: when that node changes, a
// node down in both views keeps its unreachable time, and one the new
// node finds down starts from then (the product's new leader may have
// found it down earlier).
func (m *moveWorld) rebalancerNode() *node { return m.w.leaderOf(0, 0) }

// observeDown is what rebalancer node rb's Raft transport finds down
// (regionsvc's rebalancer.observe asks transport.PeerDown of each
// member): its failure detector (detector.go, world.peerDown), so a
// crash is found a reconnect backoff later, a cut-off node a keepalive
// and a handshake timeout later, and a node back once a stream to it
// opens; rb itself is never down, nor is a spare that has not joined
// (no member yet). downSince keeps since when, as the loop does.
func (m *moveWorld) observeDown(rb *node) map[uint64]bool {
	w := m.w
	down := map[uint64]bool{}
	for _, n := range w.regionNodes(0) {
		id := uint64(n.id)
		down[id] = n.gen > 0 && w.peerDown(rb, id)
		if _, ok := m.downSince[id]; down[id] && !ok {
			m.downSince[id] = w.now
		} else if !down[id] {
			delete(m.downSince, id)
		}
		switch {
		case w.opt.mut.deadIgnored:
			down[id] = false
		case w.opt.mut.targetUnreachable:
			// The loop as before Node.Unreachable: a node down for less
			// than the dead-node time is not told apart from a live one.
			down[id] = down[id] && w.now-m.downSince[id] >= m.deadAfterMs
		}
	}
	return down
}

// catalogueLinks starts the rebalancer node's senders towards every
// joined node (step, every virtual ms). A transport finds down only a
// peer it has a sender for, started by a first send, and the catalogue's
// leader has one towards every member: every joined node is a voter or a
// learner of the catalogue group (regionsvc/members_voters.go), which
// its leader replicates to from its election on (at least one quiesce
// heartbeat before it goes idle). The simulator carries no catalogue
// traffic, so the senders its ranges' traffic has not started start
// here (linkStart): without them, a rebalancer node restarted after a
// node died for good never sent to it, never found it down, and its loop
// forgot the node was dead (seed 720081 of one region planned drains
// onto such a node until the run ended).
func (m *moveWorld) catalogueLinks() {
	rb := m.rebalancerNode()
	if rb == nil {
		return
	}
	for _, n := range m.w.regionNodes(0) {
		if n.gen > 0 {
			m.w.linkStart(rb, n.id)
		}
	}
}

// probeMembers is each node's rebalancer round probing the members its
// transport has no sender towards (regionsvc's rebalancer.observe calls
// raftnet.GRPCTransport.Probe): every live node starts a sender towards
// every joined node, so each has a verdict on each.
func (m *moveWorld) probeMembers() {
	for _, n := range m.w.regionNodes(0) {
		if !n.up {
			continue
		}
		for _, p := range m.w.regionNodes(0) {
			if p.gen > 0 && p.id != m.dead.decommissioned {
				m.w.linkStart(n, p.id)
			}
		}
	}
}

// stop ends the moves' goroutines (they return errRunOver).
func (m *moveWorld) stop() { close(m.done) }

// step runs once a virtual millisecond, after the Ready cycles.
func (m *moveWorld) step() {
	if !m.on {
		return
	}
	w := m.w
	faults := w.now < int64(w.opt.Steps)
	m.catalogueLinks()
	if w.now%tickMs == 0 {
		if w.err = m.observe(); w.err != nil {
			return
		}
	}
	if m.drained == 0 && w.now >= m.drainAt {
		m.drained = m.drainNode()
		m.res.Drained++
		w.tracef("node %d: draining", m.drained)
	}
	m.stepDead()
	for _, mv := range m.moves {
		if faults && mv.faultAt >= 0 && w.now >= mv.faultAt {
			m.aim(mv)
		}
		m.serve(mv)
		if w.err != nil {
			return
		}
	}
	m.moves = slices.DeleteFunc(m.moves, func(mv *move) bool { return mv.cur == nil })
	if w.now%movePlanMs == 0 {
		m.plan()
	}
	if faults && m.rng.Float64() < m.operatorP {
		m.operator()
	}
}

// joined counts a spare's first start.
func (m *moveWorld) started(n *node) {
	if m.on && n.gen == 1 && n.id > m.w.opt.Nodes {
		m.res.Joined++
		m.w.tracef("%s: joins the region", traceName(n))
	}
	if m.on && n.region == 0 && n.id == m.dead.id && !m.dead.returned {
		m.dead.returned = true
		m.res.Returned++
		m.w.tracef("%s: back after its death", traceName(n))
	}
}

// observe takes every range's configuration at the highest applied index
// and checks every configuration a replica holds.
func (m *moveWorld) observe() error {
	w := m.w
	for _, n := range w.regionNodes(0) {
		if !n.up {
			continue
		}
		for r, rep := range n.replicas {
			if m.strays[[2]int{n.id, r}] {
				continue
			}
			conf := n.conf(r, rep)
			if err := m.checkConf(conf); err != nil {
				return fmt.Errorf("%v range %d: %w", n, r, err)
			}
			if a := rep.AppliedIndex(); a > m.applied[r] {
				m.applied[r], m.conf[r] = a, conf
				for _, id := range slices.Concat(conf.GetVoters(), conf.GetLearners()) {
					m.members[r][id] = true
				}
			}
		}
	}
	return nil
}

// confSeen is a replica's configuration as last read (node.conf).
type confSeen struct {
	rep   *replica.Replica
	index uint64
	conf  *raftpb.ConfState
}

// conf returns rep's configuration (Replica.Conf, node n's replica of
// range r), read again only when its index changed: observe asks it of
// every replica every tick, and Conf copies it by reflection. The copy
// kept is only read.
func (n *node) conf(r int, rep *replica.Replica) *raftpb.ConfState {
	if len(n.confs) <= r {
		n.confs = append(n.confs, make([]confSeen, r+1-len(n.confs))...)
	}
	c := &n.confs[r]
	if idx := rep.ConfIndex(); c.rep != rep || c.index != idx || c.conf == nil {
		*c = confSeen{rep: rep, index: idx, conf: rep.Conf()}
	}
	return c.conf
}

func (m *moveWorld) checkConf(conf *raftpb.ConfState) error {
	switch {
	case len(conf.GetVotersOutgoing()) > 0 || len(conf.GetLearnersNext()) > 0:
		return fmt.Errorf("holds a joint configuration %v (one change at a time)", conf)
	case len(conf.GetLearners()) > 1:
		return fmt.Errorf("holds learners %v: two moves of the range at once", conf.GetLearners())
	case len(conf.GetVoters()) < m.rf:
		return fmt.Errorf("holds %d voters %v, fewer than its replication factor %d", len(conf.GetVoters()), conf.GetVoters(), m.rf)
	case len(conf.GetVoters()) > m.rf+1:
		return fmt.Errorf("holds %d voters %v, more than its replication factor %d + 1 (two moves of the range at once)", len(conf.GetVoters()), conf.GetVoters(), m.rf)
	}
	return nil
}

// stray, under the moveStray mutation, makes a replica removed from its
// range restart as the only voter of its group, log and all (a stray
// that forces a group of its own: what it acks must not count).
func (m *moveWorld) stray(n *node, r int, fs replica.FileState) error {
	if !m.w.opt.mut.moveStray || !m.removed(r, uint64(n.id)) {
		return nil
	}
	st, ok, err := fs.Load()
	if err != nil || !ok {
		return err
	}
	st.Conf = &raftpb.ConfState{Voters: []uint64{uint64(n.id)}}
	m.strays[[2]int{n.id, r}] = true
	return fs.Save(st)
}

// removed reports whether node id was a member of range r and is not in
// its latest configuration.
func (m *moveWorld) removed(r int, id uint64) bool {
	if !m.on || !m.members[r][id] {
		return false
	}
	conf := m.conf[r]
	return !slices.Contains(conf.GetVoters(), id) && !slices.Contains(conf.GetLearners(), id)
}

// ackable: a replica removed from the range acks nothing for it that
// the latest configuration does not hold. A removed node may still ack
// legitimately: one that has its removal in its log but not applied can
// be elected under the configuration before it (etcd raft takes a
// configuration as applied, and votes for any candidate whose log is up
// to date), and what it commits then is on a quorum of the old voters,
// which holds a quorum of the new (seed 1043 of a minute, once: elected
// at term 42 with its removal at index 278 in its log). So the ack
// counts only if the frame acked, same Raft index and term, is on a
// majority of the latest configuration's voters. A duplicate (an
// answer from the idempotence table) names a batch committed before,
// which the latest voters' logs, or the node's own, may no longer show
// (one caught up by a snapshot past it, one restarted behind it: seeds
// 723668 and 724647 of a minute, a node elected under the configuration
// before its removal answering a retry); once the range committed past
// it, the workload holds its records against those committed at its
// offsets (reply: "acked as ... but committed as"), so it passes here.
func (m *moveWorld) ackable(n *node, r int, res replica.Result) error {
	if res.Err != nil || !m.removed(r, uint64(n.id)) {
		return nil
	}
	if res.Duplicate && res.BaseOffset+uint64(max(res.RecordCount, 1)) <= uint64(len(m.w.canonical[r])) {
		return nil
	}
	if h, ok := frameHeaderAt(n, r, res.BaseOffset); ok {
		voters, held := m.conf[r].GetVoters(), 0
		for _, id := range voters {
			if o, ok := frameHeaderAt(m.w.node(0, int(id)), r, res.BaseOffset); ok && o.Index == h.Index && o.Term == h.Term {
				held++
			}
		}
		if held > len(voters)/2 {
			return nil
		}
	}
	return fmt.Errorf("%v range %d: acks an append at %d (duplicate %v) after its removal from the range (latest configuration %v at applied index %d)",
		n, r, res.BaseOffset, res.Duplicate, m.conf[r], m.applied[r])
}

// frameHeaderAt is the header of the frame at offset off in node n's log
// of range r, if it holds one.
func frameHeaderAt(n *node, r int, off uint64) (batch.Header, bool) {
	if n == nil || r >= len(n.stores) || n.stores[r] == nil {
		return batch.Header{}, false
	}
	st := n.stores[r]
	if off < st.StartOffset() || off >= st.NextOffset() {
		return batch.Header{}, false
	}
	f, err := st.ReadFrames(off, 1, st.NextOffset())
	if err != nil {
		return batch.Header{}, false
	}
	h, err := batch.DecodeHeader(f)
	return h, err == nil && h.BaseOffset == off
}

// region is the planner's snapshot of the region.
func (m *moveWorld) region() placement.Region {
	w := m.w
	var reg placement.Region
	for _, n := range w.regionNodes(0) {
		if n.gen == 0 {
			continue // a spare not joined yet
		}
		st := placement.Live
		switch {
		case n.id == m.dead.decommissioned && w.opt.mut.decommLive:
			// st stays Live: the catalogue's state ignored
		case n.id == m.dead.decommissioned:
			st = placement.Decommissioned // the catalogue's node state
		case n.id == m.drained:
			st = placement.Draining
		}
		reg.Nodes = append(reg.Nodes, placement.Node{ID: uint64(n.id), Zone: fmt.Sprintf("z%d", n.id), State: st})
	}
	for r := range m.conf {
		rg := placement.Range{ID: placement.RangeID{Stream: "sim", Range: uint32(r)}, Replicas: slices.Clone(m.conf[r].GetVoters()),
			Learners: slices.Clone(m.conf[r].GetLearners()), SizeBytes: int64(len(w.canonical[r])), ReplicationFactor: m.rf}
		if l := w.leaderOf(0, r); l != nil {
			rg.Leader = uint64(l.id)
		}
		rg.Moving = m.moving(r) && !w.opt.mut.moveConcurrent
		reg.Ranges = append(reg.Ranges, rg)
	}
	return reg
}

func (m *moveWorld) moving(r int) bool {
	return slices.ContainsFunc(m.moves, func(mv *move) bool { return mv.r == r })
}

// plan runs the rebalancer's core (placement.Loop, as
// regionsvc/rebalance.go drives it) and starts its moves and learner
// removals, each with Planned: the voters the snapshot gave.
func (m *moveWorld) plan() {
	w := m.w
	if w.opt.mut.moveConcurrent {
		// The Loop's bookkeeping and Planned undone: the planner alone.
		for _, mv := range placement.Plan(m.region(), placement.Config{MovesMax: 2}) {
			m.res.Planned++
			m.start(int(mv.Range.Range), mv.From, mv.To, mv.Reason.String(), nil).loop = false
		}
		return
	}
	rb := m.rebalancerNode()
	if rb == nil {
		// No node leads the catalogue: none plans (each node's loop
		// observes on in the product; the one loop here waits, and its
		// unreachable times are those of the last rebalancer node).
		return
	}
	now := w.clock()
	m.probeMembers()
	m.loop.Observe(now, m.observeDown(rb))
	reg := m.region()
	if !w.opt.mut.unknownAsUp {
		// regionsvc's rebalancer.markUnknown: a member rb's transport
		// has no verdict on is no target.
		for i, nd := range reg.Nodes {
			if !w.peerKnown(rb, nd.ID) {
				reg.Nodes[i].Unreachable = true
			}
		}
	}
	moves, cleanups := m.loop.Next(now, reg)
	for _, c := range cleanups {
		m.res.Cleanups++
		m.start(int(c.Range.Range), c.Learner, 0, "cleanup", nil)
	}
	for _, mv := range moves {
		r := int(mv.Range.Range)
		m.res.Planned++
		if mv.Reason == placement.Repair {
			m.res.Repairs++
		}
		m.start(r, mv.From, mv.To, mv.Reason.String(), slices.Clone(reg.Ranges[r].Replicas))
	}
}

// operator starts `geolog replicas replace` of a random voter of a
// random range with no move onto a random live node not in it.
func (m *moveWorld) operator() {
	w := m.w
	r := m.rng.IntN(w.opt.Ranges)
	if m.moving(r) || len(m.conf[r].GetLearners()) > 0 {
		return
	}
	voters := m.conf[r].GetVoters()
	var to []uint64
	for _, n := range w.regionNodes(0) {
		// The operator sees the node list: no node dead or gone.
		since, down := m.downSince[uint64(n.id)]
		dead := down && w.now-since >= m.deadAfterMs
		if id := uint64(n.id); n.gen > 0 && n.id != m.drained && !slices.Contains(voters, id) && !dead && !m.gone(n) {
			to = append(to, id)
		}
	}
	if len(to) == 0 || len(voters) == 0 {
		return
	}
	m.res.Operator++
	m.start(r, voters[m.rng.IntN(len(voters))], to[m.rng.IntN(len(to))], "operator", nil)
}

// start runs one move's replicamove call on its goroutine and takes its
// first Admin call. to 0: remove from (Excess, cleanup).
func (m *moveWorld) start(r int, from, to uint64, kind string, planned []uint64) *move {
	w := m.w
	mv := &move{r: r, from: from, to: to, kind: kind, calls: make(chan *adminCall), answers: make(chan adminAnswer), proposed: -1, faultAt: -1,
		loop: kind != "operator", started: w.now}
	if w.now < int64(w.opt.Steps) && m.rng.IntN(2) == 0 {
		mv.faultAt, mv.fault = w.now+m.rng.Int64N(400), m.rng.IntN(6)
	}
	w.tracef("range %d: %s move %d -> %d starts (voters %v, learners %v)", r, kind, from, to, m.conf[r].GetVoters(), m.conf[r].GetLearners())
	if err := m.checkTarget(r, to, kind); err != nil && w.err == nil {
		w.err = err
	}
	adm := &simAdmin{mv: mv, done: m.done}
	go func() {
		ctx := context.Background()
		var err error
		if kind == "cleanup" {
			// rebalancer.startCleanup: the learner's removal, as is.
			_, err = adm.Change(ctx, geologv1.ReplicaChange_REPLICA_CHANGE_REMOVE, from, nil)
		} else if to == 0 {
			err = replicamove.Remove(ctx, adm, from, m.rf, replicamove.Config{})
		} else {
			err = replicamove.Replace(ctx, adm, from, to, replicamove.Config{PollInterval: 1, LagEntriesMax: moveCatchUpLag, Planned: planned})
		}
		select {
		case mv.calls <- &adminCall{end: true, err: err}:
		case <-m.done:
		}
	}()
	m.took(mv)
	m.moves = append(m.moves, mv)
	return mv
}

// expire ends move mv's context now, as moveTimeoutMs does (regionsvc's
// MoveTimeout; the rebalancer's moves cancelled when its node stops
// leading the catalogue, or an operator's replace interrupted, end the
// same way): its current call and every later one fail with the
// context's error, and replicamove returns. A directed test places it
// (TestAddPastFactor: a move cut short between its promotion and its
// removal, which leaves its range a voter past its factor).
func (m *moveWorld) expire(mv *move) {
	mv.started = min(mv.started, m.w.now-moveTimeoutMs)
	m.w.tracef("range %d: %s move %d -> %d cut short", mv.r, mv.kind, mv.from, mv.to)
}

// simAdmin is replicamove.Admin over the simulator: each call waits for
// the simulator's answer.
type simAdmin struct {
	mv   *move
	done chan struct{}
}

func (a *simAdmin) call(c *adminCall) adminAnswer {
	select {
	case a.mv.calls <- c:
	case <-a.done:
		return adminAnswer{err: errRunOver}
	}
	select {
	case ans := <-a.mv.answers:
		return ans
	case <-a.done:
		return adminAnswer{err: errRunOver}
	}
}

func (a *simAdmin) Change(_ context.Context, c geologv1.ReplicaChange, node uint64, expect []uint64) (*geologv1.ChangeReplicasResponse, error) {
	ans := a.call(&adminCall{change: true, typ: c, node: node, expect: expect})
	return ans.resp, ans.err
}

func (a *simAdmin) Describe(context.Context) (*geologv1.DescribeReplicasResponse, error) {
	ans := a.call(&adminCall{})
	return ans.desc, ans.err
}

// answer hands the goroutine its answer and takes its next call.
func (m *moveWorld) answer(mv *move, ans adminAnswer) {
	if mv.cur.change {
		m.asking[mv.r]--
	}
	mv.answers <- ans
	mv.proposed, mv.outcome = -1, nil
	mv.seq++
	m.took(mv)
}

// took takes a move's next call from its goroutine: at most one Change
// per range at a time.
func (m *moveWorld) took(mv *move) {
	w := m.w
	mv.cur, mv.since = <-mv.calls, w.now
	if !mv.cur.change {
		return
	}
	if m.asking[mv.r]++; m.asking[mv.r] > 1 && w.err == nil && !w.opt.mut.moveAskUnchecked {
		w.err = fmt.Errorf("range %d: %d membership changes asked at once (one change per range)", mv.r, m.asking[mv.r])
	}
}

// serve carries out a move's Admin call when it can.
func (m *moveWorld) serve(mv *move) {
	w, c := m.w, mv.cur
	if c.end {
		m.finish(mv)
		return
	}
	if w.now-mv.started >= moveTimeoutMs {
		if !mv.timedOut {
			mv.timedOut = true
			m.res.TimedOut++
			w.tracef("range %d: %s move %d -> %d times out", mv.r, mv.kind, mv.from, mv.to)
		}
		m.answer(mv, adminAnswer{err: context.DeadlineExceeded})
		return
	}
	if !c.change {
		if w.now-mv.since < movePollMs {
			return
		}
		if mv.outcome != nil {
			m.answer(mv, *mv.outcome)
		} else if l := w.leaderOf(0, mv.r); l != nil && w.opt.mut.describeStale {
			m.answer(mv, adminAnswer{desc: describe(l, mv.r)})
		} else if l != nil && (mv.proposed < 0 || w.now-mv.proposed >= moveAttemptMs) {
			m.describeFresh(mv, l)
		} else if w.now-mv.since >= moveCallMs {
			m.answer(mv, adminAnswer{err: apierr.New(apierr.Unavailable, "range %d: no leader", mv.r)})
		}
		return
	}
	switch {
	case mv.outcome != nil:
		m.answer(mv, *mv.outcome)
	case mv.caughtUp != nil:
		l := mv.caughtUp
		mv.caughtUp, mv.proposed = nil, -1
		if l.up && l.gen == mv.caughtGen && w.leaderOf(0, mv.r) == l {
			m.propose(mv)
		}
	case mv.proposed >= 0 && w.now-mv.proposed < moveAttemptMs:
	case w.now-mv.since >= moveCallMs:
		m.answer(mv, adminAnswer{err: apierr.New(apierr.Unavailable, "range %d: change %v of node %d not applied in %d ms", mv.r, c.typ, c.node, moveCallMs)})
	case (w.now-mv.since)%moveRetryMs == 0:
		mv.proposed = -1
		if w.opt.mut.describeStale {
			m.propose(mv)
		} else {
			m.catchUp(mv)
		}
	}
}

// catchUp is regionsvc's ChangeReplicas' first step (caughtUpLeader): a
// ReadIndex at the leader of now; once it answers, the change is
// proposed there (serve).
func (m *moveWorld) catchUp(mv *move) {
	w := m.w
	l := w.leaderOf(0, mv.r)
	if l == nil {
		return
	}
	mv.proposed = w.now
	seq, gen, c := mv.seq, l.gen, mv.cur
	l.replicas[mv.r].ReadIndex(func(_ uint64, err error) {
		if mv.seq != seq || mv.cur != c || !l.up || l.gen != gen {
			return
		}
		if err != nil {
			mv.proposed = -1 // retried at the leader of now
			return
		}
		mv.caughtUp, mv.caughtGen = l, gen
	})
}

// describe is regionsvc's DescribeReplicas at leader l.
func describe(l *node, r int) *geologv1.DescribeReplicasResponse {
	rep := l.replicas[r]
	st, conf := rep.Status(), rep.Conf()
	d := &geologv1.DescribeReplicasResponse{LeaderId: st.ID, LastIndex: st.Progress[st.ID].Match, CommittedOffset: rep.Committed()}
	add := func(ids []uint64, role string) {
		for _, id := range ids {
			d.Replicas = append(d.Replicas, &geologv1.ReplicaStatus{NodeId: id, Role: role, MatchIndex: st.Progress[id].Match})
		}
	}
	add(conf.GetVoters(), "voter")
	add(conf.GetLearners(), "learner")
	slices.SortFunc(d.Replicas, func(a, b *geologv1.ReplicaStatus) int { return int(a.GetNodeId()) - int(b.GetNodeId()) })
	return d
}

// describeFresh is regionsvc's DescribeReplicas (admin.go
// caughtUpLeader; the fix of notes/simmoves.md finding 1): the leader
// answers once a
// ReadIndex confirmed it and it applied everything committed before the
// call, so its configuration is the range's latest, not one its
// predecessors already changed.
func (m *moveWorld) describeFresh(mv *move, l *node) {
	mv.proposed = m.w.now
	seq, gen, c := mv.seq, l.gen, mv.cur
	l.replicas[mv.r].ReadIndex(func(_ uint64, err error) {
		if mv.seq != seq || mv.cur != c || !l.up || l.gen != gen {
			return
		}
		mv.proposed = -1
		if err == nil && l.replicas[mv.r].IsLeader() {
			mv.outcome = &adminAnswer{desc: describe(l, mv.r)}
		}
	})
}

// propose is regionsvc's ChangeReplicas at the leader of now.
func (m *moveWorld) propose(mv *move) {
	w, c := m.w, mv.cur
	l := w.leaderOf(0, mv.r)
	if l == nil {
		return
	}
	rep, node := l.replicas[mv.r], c.node
	conf := rep.Conf()
	isVoter, isLearner := slices.Contains(conf.GetVoters(), node), slices.Contains(conf.GetLearners(), node)
	var typ raftpb.ConfChangeType
	var refuse string
	if len(c.expect) > 0 && !w.opt.mut.changeUnexpected && !replicamove.SameVoters(conf.GetVoters(), c.expect) {
		// regionsvc's ChangeReplicas: the voters the change was decided
		// from are no longer the range's.
		m.res.Refused++
		m.answer(mv, adminAnswer{err: apierr.New(apierr.InvalidArgument, "the range's voters changed: %v, not the expected %v", conf.GetVoters(), c.expect)})
		return
	}
	switch c.typ {
	case geologv1.ReplicaChange_REPLICA_CHANGE_ADD_LEARNER:
		typ = raftpb.ConfChangeAddLearnerNode
		if isVoter || isLearner {
			refuse = "already a member"
		} else if len(conf.GetVoters()) > m.rf && w.opt.mut.addPastFactor {
			m.pastFactor++
			w.tracef("range %d: learner %d asked beside voters %v, past the factor %d (addPastFactor: proposed)", mv.r, node, conf.GetVoters(), m.rf)
		} else if len(conf.GetVoters()) > m.rf {
			// regionsvc's ChangeReplicas: a voter too many (a move cut
			// short after its promotion) goes before any learner comes.
			m.pastFactor++
			m.res.Refused++
			w.tracef("range %d: learner %d refused beside voters %v, past the factor %d", mv.r, node, conf.GetVoters(), m.rf)
			m.answer(mv, adminAnswer{err: apierr.New(apierr.InvalidArgument, "the range has %d voters %v, more than its replication factor %d: remove one before adding a learner", len(conf.GetVoters()), conf.GetVoters(), m.rf)})
			return
		}
	case geologv1.ReplicaChange_REPLICA_CHANGE_PROMOTE:
		typ = raftpb.ConfChangeAddNode
		if !isLearner {
			refuse = "not a learner"
		}
	default:
		typ = raftpb.ConfChangeRemoveNode
		if !isVoter && !isLearner {
			refuse = "not a member"
		} else if isVoter && len(conf.GetVoters()) <= 1 {
			refuse = "the last voter"
		}
	}
	if refuse != "" {
		m.res.Refused++
		m.answer(mv, adminAnswer{err: apierr.New(apierr.InvalidArgument, "node %d is %s", node, refuse)})
		return
	}
	if typ == raftpb.ConfChangeRemoveNode && node == uint64(l.id) && !w.opt.mut.moveNoHandOff {
		// handOffBeforeRemoval: the caller retries at the new leader.
		if to := m.handOffTarget(l, rep, conf.GetVoters()); to != 0 {
			rep.TransferLeadership(to)
			m.res.HandOffs++
		}
		return
	}
	mv.proposed = w.now
	seq := mv.seq
	cc := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: typ.Enum(), NodeId: proto.Uint64(node)}}}
	rep.ProposeConfChange(cc, func(cs *raftpb.ConfState, err error) {
		if mv.seq != seq || mv.cur != c {
			return
		}
		mv.proposed = -1
		if err != nil {
			if !apierr.IsRetriable(err) {
				mv.outcome = &adminAnswer{err: err}
			}
			return // retried at the leader of now
		}
		m.res.Changes++
		w.tracef("range %d: %v of node %d applied (voters %v, learners %v)", mv.r, c.typ, node, cs.GetVoters(), cs.GetLearners())
		mv.outcome = &adminAnswer{resp: &geologv1.ChangeReplicasResponse{Voters: cs.GetVoters(), Learners: cs.GetLearners()}}
	})
}

// handOffTarget is regionsvc's handOffBeforeRemoval's choice: the
// voter other than leader l with the highest match index (then the
// lowest id) that l's transport does not find down (its failure
// detector, world.peerDown; the simulator handed off to the first other
// voter before: notes/simdead.md).
func (m *moveWorld) handOffTarget(l *node, rep *replica.Replica, voters []uint64) uint64 {
	st := rep.Status()
	var to, match uint64
	for _, id := range voters {
		pr, ok := st.Progress[id]
		if id == uint64(l.id) || !ok || pr.IsLearner || m.w.peerDown(l, id) {
			continue
		}
		if to == 0 || pr.Match > match || (pr.Match == match && id < to) {
			to, match = id, pr.Match
		}
	}
	return to
}

// finish ends a move whose goroutine returned.
func (m *moveWorld) finish(mv *move) {
	w := m.w
	if err := mv.cur.err; err != nil {
		m.res.Failed++
		w.tracef("range %d: %s move %d -> %d failed: %v", mv.r, mv.kind, mv.from, mv.to, err)
	} else {
		m.res.Done++
		w.tracef("range %d: %s move %d -> %d done", mv.r, mv.kind, mv.from, mv.to)
	}
	if mv.loop {
		m.loop.Done(placement.RangeID{Stream: "sim", Range: uint32(mv.r)})
	}
	mv.cur = nil
}

// aim injects the fault a move drew: a crash or a partition of its
// source, its target or the range leader.
func (m *moveWorld) aim(mv *move) {
	w := m.w
	mv.faultAt = -1
	var n *node
	switch mv.fault % 3 {
	case 0:
		n = w.node(0, int(mv.from))
	case 1:
		if mv.to != 0 {
			n = w.node(0, int(mv.to))
		}
	default:
		n = w.leaderOf(0, mv.r)
	}
	if n == nil || !n.up {
		return
	}
	if mv.fault < 3 {
		w.crash(n)
		m.res.AimedCrashes++
		w.tracef("%s: crashed during range %d's move %d -> %d", traceName(n), mv.r, mv.from, mv.to)
		return
	}
	n.cutTill = w.now + 100 + m.rng.Int64N(1500)
	w.res.Partitions++
	m.res.AimedPartition++
	w.tracef("%s: cut off during range %d's move %d -> %d", traceName(n), mv.r, mv.from, mv.to)
}

// busy: moves under way, or a range not yet at RF voters with no learner
// and none on the drained node.
func (m *moveWorld) busy() bool {
	if !m.on {
		return false
	}
	return len(m.moves) > 0 || m.final() != nil || m.deadBusy() || len(placement.Plan(m.loop.Overlay(m.w.clock(), m.region()), placement.Config{MovesMax: 2})) > 0
}

// final is the end state every range must reach.
func (m *moveWorld) final() error {
	for r, conf := range m.conf {
		switch {
		case len(conf.GetVoters()) != m.rf || len(conf.GetLearners()) > 0:
			return fmt.Errorf("range %d: ends with voters %v and learners %v, want %d voters", r, conf.GetVoters(), conf.GetLearners(), m.rf)
		case m.drained != 0 && slices.Contains(conf.GetVoters(), uint64(m.drained)):
			return fmt.Errorf("range %d: ends with voters %v, the drained node %d among them", r, conf.GetVoters(), m.drained)
		}
	}
	return m.finalDead()
}

// member reports whether node id is in range r's latest configuration
// (every node when there are no moves).
func (m *moveWorld) member(r int, id uint64) bool {
	if m.on && m.dead.gone[int(id)] {
		return false // stopped for good: its disk is not read (final)
	}
	return !m.on || slices.Contains(m.conf[r].GetVoters(), id) || slices.Contains(m.conf[r].GetLearners(), id)
}
