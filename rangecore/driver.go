package rangecore

import (
	"errors"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/geolog/geolog/replica"
	"github.com/hashicorp/go-hclog"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// Driver is the body of a replicated range's driver loop: what it does
// with each event, in which order, on the goroutine that owns the replica
// (replica's driver contract, replica/doc.go). It has no goroutine,
// channel, timer or clock of its own: the host (regionsvc's range driver
// loop, or the simulator's event heap) hands it events one at a time
// (Handle), runs the Ready cycles after each batch of events it drained
// (Cycle), and does what the returned Effects ask (run the node's per-tick
// checks, set or stop the held-commit timer). The replica's log writer
// stays the host's (a goroutine woken by the replica's LogWrites, or the
// simulator's write events); the driver
// sees their outcome as EventLogWritten.
//
// What it decides:
//
//   - Ack ordering. A proposal answered during a Ready cycle (applied) is
//     held until the cycle's end, when the committed offset it reached is
//     published (DriverConfig.Publish) and then the held acks leave: a
//     reader told of a record finds it, and each cycle's acks leave at its
//     end, not behind the cycles after it (Holding, Hold, Propose).
//   - A full disk's hand-off: a leader whose log refuses writes for want
//     of space hands leadership, on each tick, to its most caught-up
//     follower whose node is not found down (MostCaughtUp: the lowest id
//     of those level), which can append where it cannot.
//   - Leader balance (balance.go): a leader that is not its range's
//     preferred leader hands leadership to it, on a tick, once that one is
//     up and caught up.
//   - Quiescence (replica/quiesce.go): a leader whose group is idle
//     quiesces on a tick instead of ticking, unless a campaign is planned,
//     its disk is full, its preferred leader could take over now, its host
//     vetoes or there is no failure detector; a quiesced follower wakes when
//     its leader's node is found down (after a quiesce heartbeat and on a
//     liveness change), a quiesced leader on any liveness change.
//   - Campaign after a leader found down (the tick's watchLeader): the
//     follower forgets the leader and campaigns after 1 to
//     CampaignDelayTicksMax ticks.
//   - The start-up election (Start): the preferred leader campaigns at once
//     (and again on each liveness change until a leader is known), the
//     other voters of an existing group hold their Raft clock for a bound
//     number of ticks (StartHoldElections, StartHoldDownElections election
//     timeouts) unless a leader is known or they refused it a vote.
type Driver struct {
	cfg DriverConfig
	rep *replica.Replica

	holding bool
	acks    []func()
	timer   HeldCommitTimer
	// campaignInTicks counts down to a campaign after the leader's node
	// was found down (watchLeader); 0 when none is planned.
	campaignInTicks int
	hold            startHold
	// holdFor is the preferred leader the start-up hold waits for, 0 once
	// it was refused a vote or the hold ended (NoteSent: any goroutine).
	holdFor atomic.Uint64
	// preferredAtStart is set while this replica is its group's preferred
	// leader at start and knows no leader yet.
	preferredAtStart bool
	balance          balance // balance.go
}

// DriverConfig is what a Driver asks of its host: answers and hooks it
// calls synchronously, on the goroutine that calls the Driver.
type DriverConfig struct {
	NodeID uint64
	// PeerDown is the node's failure detector: whether peer id's node is
	// found down. Nil: there is none (a replica then quiesces only as the
	// sole voter of its group: its followers could never learn that it
	// died).
	PeerDown func(id uint64) bool
	// Publish, if set, publishes the replica's committed offset to
	// readers: at each Ready cycle's end, before the acks it held leave.
	Publish func()
	// AfterReady, if set, runs after the Ready cycles of each Ready (err:
	// the cycle that failed, already logged).
	AfterReady func(err error)
	// MayQuiesce, if set, may veto a leader's quiescence.
	MayQuiesce func() bool
	// LeaderBalanceTicks is how many ticks a leader leads between checks
	// that it is its range's preferred leader (balance.go); 0: off.
	LeaderBalanceTicks int
	// GroupID picks the range's preferred leader among its voters where
	// the host names none (PreferredLeader).
	GroupID uint64
	// PreferredLeader, if set, is the node the host names to lead the
	// range (0: none); any goroutine may change what it returns.
	PreferredLeader func() uint64
	// OnBalanceTransfer, if set, is told of each hand-off to the
	// preferred leader (the simulator counts them).
	OnBalanceTransfer func(to uint64)
	// OnRefused, if set, is told of a message the replica refused as one
	// no correct peer sends (replica.ErrInvalidMessage).
	OnRefused func(from uint64, err error)
	// Rand returns a number in [0, n): the campaign delay's draw.
	Rand   func(n int) int
	Logger hclog.Logger
}

// NewDriver returns the driver of rep.
func NewDriver(rep *replica.Replica, cfg DriverConfig) *Driver {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	return &Driver{cfg: cfg, rep: rep}
}

// EventKind is what happened.
type EventKind int

const (
	// EventPropose: an append (Event.Op; Event.Verbatim: a mirrored
	// batch, replica.ProposeVerbatim) to propose, its reply held by the
	// Ready cycle that answers it.
	EventPropose EventKind = iota
	// EventMessages: Raft messages from peers (Event.Msgs).
	EventMessages
	// EventLogWritten: the log writer made entries durable; what they
	// acknowledge is stepped and answered in a Ready cycle at once.
	EventLogWritten
	// EventTick: the node's tick, for a replica that is not quiesced.
	EventTick
	// EventLiveness: a peer's liveness changed.
	EventLiveness
	// EventHeldCommits: the held-commit timer fired.
	EventHeldCommits
	// EventUnreachable: a message to peer Event.To could not be sent.
	EventUnreachable
)

// Event is one input of the driver.
type Event struct {
	Kind     EventKind
	Op       *replica.Op
	Verbatim bool
	Msgs     []*raftpb.Message
	To       uint64
}

// Effects is what the host must do after an event or a Cycle.
type Effects struct {
	// Ticked: the tick reached the replica (no start-up hold, no
	// quiescence took it): the host's own per-tick checks may run.
	Ticked bool
	// Timer and Wait: the held-commit timer's action (Cycle).
	Timer TimerAction
	Wait  time.Duration
}

// DrainEventsMax bounds the events a host takes into one Ready cycle
// (Cycle): with one event per cycle, messages would wait behind an fsync
// each; with no bound, a flood would starve the cycle.
const DrainEventsMax = 4096

// readyCyclesMax bounds the Ready cycles one Ready runs.
const readyCyclesMax = 16

// Handle takes one event. It runs a Ready cycle itself only where the
// event's answers must not wait for the host's drain (EventLogWritten, a
// campaign at start); the host calls Cycle after each batch of events.
func (d *Driver) Handle(ev Event) Effects {
	switch ev.Kind {
	case EventPropose:
		d.Propose(ev.Op, ev.Verbatim)
	case EventMessages:
		d.step(ev.Msgs)
	case EventLogWritten:
		// Acks of durable entries (MsgStorageAppendResp, the leader's own
		// MsgAppResp): stepped, and what they commit answered, before
		// the drain takes more proposals into the cycle.
		d.Ready()
	case EventTick:
		return Effects{Ticked: d.tick()}
	case EventLiveness:
		d.wakeIfLeaderDown(true)
		if d.preferredAtStart {
			d.campaignAtStart()
		}
	case EventHeldCommits:
		d.timer.Fired()
		d.rep.SendHeldCommits()
	case EventUnreachable:
		d.rep.ReportUnreachable(ev.To)
	}
	return Effects{}
}

// Cycle runs the Ready cycles after a batch of events, then says what the
// held-commit timer must do.
func (d *Driver) Cycle() Effects {
	d.Ready()
	var e Effects
	e.Timer, e.Wait = d.timer.Arm(d.rep.HeldCommitsWait())
	return e
}

// Ready runs Ready cycles until Raft has nothing more (at most
// readyCyclesMax), holding each cycle's acks to its end (see Driver), then
// calls AfterReady.
func (d *Driver) Ready() {
	var err error
	for i := 0; i < readyCyclesMax && d.rep.HasReady(); i++ {
		d.holding = true
		err = d.rep.ProcessReady()
		d.release()
		if err != nil {
			d.cfg.Logger.Error("replica failed", "error", err)
			break
		}
	}
	if d.cfg.AfterReady != nil {
		d.cfg.AfterReady(err)
	}
}

// release ends a cycle: it publishes the committed offset and sends the
// acks held during the cycle.
func (d *Driver) release() {
	d.holding = false
	if d.cfg.Publish != nil {
		d.cfg.Publish()
	}
	acks := d.acks
	d.acks = nil
	for _, ack := range acks {
		ack()
	}
}

// Holding reports whether a Ready cycle is under way: an ack given now
// must be held (Hold) until its end.
func (d *Driver) Holding() bool { return d.holding }

// Hold holds ack until the end of the Ready cycle under way.
func (d *Driver) Hold(ack func()) { d.acks = append(d.acks, ack) }

// Propose proposes op (Verbatim: replica.ProposeVerbatim), its reply held
// to the end of the Ready cycle that gives it. A host with its own checks
// around the reply (regionsvc's propose) calls the replica itself and
// uses Holding and Hold.
func (d *Driver) Propose(op *replica.Op, verbatim bool) {
	reply := op.Reply
	op.Reply = func(r replica.Result) {
		if d.holding {
			d.Hold(func() { reply(r) })
			return
		}
		reply(r)
	}
	if verbatim {
		d.rep.ProposeVerbatim(op)
		return
	}
	d.rep.Propose(op)
}

// step steps messages from peers, then answers at once the appends their
// acks committed (replica.AnswerCommitted): the follower's ack that
// completes a quorum is answered without waiting for a Ready cycle.
func (d *Driver) step(msgs []*raftpb.Message) {
	for _, m := range msgs {
		if err := d.rep.Step(m); errors.Is(err, replica.ErrInvalidMessage) && d.cfg.OnRefused != nil {
			d.cfg.OnRefused(m.GetFrom(), err)
		}
	}
	d.rep.AnswerCommitted()
	d.wakeIfLeaderDown(false) // a quiesce heartbeat from a leader found down since
}

// tick runs the node's tick: the start-up hold may skip it, an idle
// leader quiesces instead; otherwise the replica ticks and a follower
// watches its leader. It reports whether the replica ticked.
func (d *Driver) tick() bool {
	if d.holdStart() {
		return false // waiting for the preferred leader's campaign
	}
	if d.maybeQuiesce() {
		return false // an idle leader quiesces instead of ticking
	}
	// Leader balance reads the followers' recent activity before the
	// tick: a tick that ends an election timeout runs CheckQuorum, which
	// marks every follower not recently active, and a check after it, on
	// a wait that is a multiple of the election timeout, would never see
	// the preferred leader active (balance.go).
	d.balanceLeader()
	d.rep.Tick()
	d.watchLeader()
	d.handOffIfDiskFull()
	return true
}

// handOffIfDiskFull makes a leader whose log refuses writes for want of
// space hand leadership to its most caught-up follower whose node is not
// found down (on each tick it is full): it can neither append nor count
// itself towards a quorum, and a follower with space can. A group of one
// keeps its leader, which refuses appends until space returns.
func (d *Driver) handOffIfDiskFull() {
	if d.rep.DiskFull() == nil || !d.rep.IsLeader() {
		return
	}
	if to := MostCaughtUp(d.cfg.NodeID, d.rep.Status().Progress); to != 0 && !d.peerDown(to) {
		d.rep.TransferLeadership(to)
	}
}

// MostCaughtUp is the voter other than self with the highest match index
// in a leader's progress, the lowest id among equals (not whichever the
// map's order meets last); 0 if there is none.
func MostCaughtUp(self uint64, progress map[uint64]tracker.Progress) uint64 {
	var best, bestMatch uint64
	for _, id := range slices.Sorted(maps.Keys(progress)) {
		pr := progress[id]
		if id == self || pr.IsLearner {
			continue
		}
		if best == 0 || pr.Match > bestMatch {
			best, bestMatch = id, pr.Match
		}
	}
	return best
}

func (d *Driver) peerDown(id uint64) bool {
	return d.cfg.PeerDown != nil && id != 0 && id != d.cfg.NodeID && d.cfg.PeerDown(id)
}
