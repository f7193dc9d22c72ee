package regionsvc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/internal/mailbox"
	"github.com/geolog/geolog/raftnet"
	"github.com/geolog/geolog/rangecore"
	"github.com/geolog/geolog/replica"
	"github.com/geolog/geolog/segment"
	"github.com/geolog/geolog/vfs"
	"go.etcd.io/raft/v3/raftpb"
)

// replicationConfig makes a range driver a member of the range's Raft group
// over the region's nodes.
type replicationConfig struct {
	nodeID  uint64
	groupID raftnet.GroupID
	peers   []uint64
	// firstCampaigner is the voter that campaigns at once when the group
	// is new (0: the first of peers).
	firstCampaigner uint64
	addrOf          func(id uint64) string // Raft id → advertised address ("" unknown), for leader hints
	transport       raftnet.Transport
	tick            func() <-chan struct{} // the node's shared ticker
	// liveness returns the channel closed at the next change of a peer's
	// liveness (quiesce.go).
	liveness func() <-chan struct{}
	// onCommit, if set, is called on the driver goroutine after the
	// committed offset advanced (the catalogue applies new streams).
	onCommit  func(d *rangeDriver, from, to uint64)
	raftInMax int
	// heartbeatTicks and electionTicks configure Raft's timing.
	heartbeatTicks, electionTicks int
	// leaderBalanceTicks is how often a leader checks that it is the
	// range's preferred leader, in ticks (leaderbalance.go); 0: never.
	leaderBalanceTicks int
	// snapshotBody, if set, wraps the body of each snapshot sent (the
	// transfer bandwidth bound, rebalance_throttle.go).
	snapshotBody func(io.ReadCloser) io.ReadCloser
	// pace counts the node's awake groups (openpace.go); nil for the
	// catalogue. paced: a new group waits for pace to admit it.
	pace  *openPace
	paced bool
	// onRemoved, if set, is called on the driver goroutine of a leader
	// that applied a configuration no longer naming node id (strayhint.go).
	onRemoved func(d *rangeDriver, id uint64)
	// peerGone, if set, reports a node that is no longer one of the
	// region's (decommissioned or unknown): down for good (peerDown).
	peerGone func(id uint64) bool
}

// raftInMax bounds the message batches queued for one replica; past it,
// messages are dropped (Raft retransmits).
const raftInMaxDefault = 256

func (d *rangeDriver) openReplica(headers []batch.Header) error {
	rc := d.cfg.repl
	if rc.raftInMax == 0 {
		rc.raftInMax = raftInMaxDefault
	}
	d.raftIn = mailbox.New[[]*raftpb.Message](rc.raftInMax)
	d.unreachable = make(chan uint64, 64)
	d.execCh = make(chan func(), 16)
	d.maintainCh = make(chan struct{}, 1)
	fsys := d.cfg.store.FS
	if fsys == nil {
		fsys = vfs.OS()
	}
	// The orphan log: where a fork moves a divergent tail (multiregion.go),
	// sealed under the node's keyring as the segment store's log is.
	orphans, err := replica.OpenOrphans(fsys, filepath.Join(d.cfg.store.Dir, replica.OrphanDirName), d.cfg.logger,
		replica.WithKeyring(d.cfg.store.Keyring))
	if err != nil {
		return err
	}
	d.orphans = orphans
	rep, err := replica.New(replica.Config{
		Orphans: orphans,
		NodeID:  rc.nodeID, Stream: d.cfg.stream, Range: d.cfg.rangeID, Peers: rc.peers,
		Log: d.store, State: replica.FileState{FS: fsys, Dir: d.cfg.store.Dir, CommitNoSync: d.cfg.store.Fsync == segment.FsyncNever},
		Send:          d.sendRaft,
		SendSnapshot:  d.sendSnapshot,
		Epoch:         d.cfg.epoch,
		ProducersMax:  d.cfg.producersMax,
		Now:           d.cfg.now,
		Logger:        d.cfg.logger,
		HeartbeatTick: rc.heartbeatTicks, ElectionTick: rc.electionTicks,
		HoldCommits:  true, // runReplicated sends them when due
		MergeAppends: true,
		OnConfChange: d.confApplied, // strayhint.go
	}, headers)
	if err != nil {
		return err
	}
	d.rep = rep
	d.core = rangecore.NewDriver(rep, rangecore.DriverConfig{
		NodeID: rc.nodeID, PeerDown: d.peerDownFunc(), Publish: d.publishCommitted, AfterReady: d.afterReady,
		OnRefused: d.peerRefused, Rand: rand.IntN, Logger: d.logger,
		LeaderBalanceTicks: rc.leaderBalanceTicks, GroupID: uint64(rc.groupID), PreferredLeader: d.balance.pref.Load,
	})
	d.noteMembership(rep.Conf()) // then at each change applied (confApplied)
	if d.cfg.appendQueueDelayTarget > 0 && rc.groupID != metaGroupID {
		d.shedder = newAppendShedder(d.cfg.appendQueueDelayTarget)
	}
	return nil
}

// sendRaft hands Raft's messages to the transport; a refused message is
// reported to Raft as an unreachable peer (after the Ready cycle).
func (d *rangeDriver) sendRaft(msgs []*raftpb.Message) {
	for _, m := range msgs {
		d.core.NoteSent(m) // the start-up hold (rangecore/elect.go)
		if err := d.cfg.repl.transport.Send(d.cfg.repl.groupID, m); err != nil {
			select {
			case d.unreachable <- m.GetTo():
			default:
			}
		}
	}
}

// deliverRaft queues messages from the transport for the driver; it never
// blocks (a full queue drops: Raft retransmits).
func (d *rangeDriver) deliverRaft(msgs []*raftpb.Message) bool {
	return d.raftIn.TryPut(msgs)
}

// runReplicated is the driver loop of a replicated range: one goroutine owns
// the replica and follows replica's driver contract (doc.go there).
func (d *rangeDriver) runReplicated() {
	defer close(d.doneCh)
	defer d.uncountAwake(d.admission()) // openpace.go
	defer func() {
		if err := d.store.Close(); err != nil {
			d.logger.Error("close store", "error", err)
		}
	}()
	// The replica's log writes (append, fsync, then the acks that waited
	// for them) run on their own goroutine, so that this one keeps
	// stepping messages and proposals while an fsync is in flight.
	writerStop, writerDone := make(chan struct{}), make(chan struct{})
	go d.runLogWriter(writerStop, writerDone)
	stopWriter := func() {
		close(writerStop)
		<-writerDone
	}
	d.startGroup() // openpace.go, startup.go
	// Taken before any check of a peer's liveness, so that no change
	// after the check goes unseen (quiesce.go).
	liveness := d.cfg.repl.liveness()
	held := time.NewTimer(time.Hour) // the held commits' (rangecore.HeldCommitTimer)
	held.Stop()
	defer held.Stop()
	for {
		tick := d.tickIfAwake() // nil while quiesced or dormant
		select {
		case <-d.dormant:
			d.admitted() // openpace.go
		case <-d.inbox.Ready():
			d.takeOne()
		case <-d.raftIn.Ready():
			d.takeRaft()
		case <-d.rep.LogWritten():
			d.core.Handle(rangecore.Event{Kind: rangecore.EventLogWritten})
		case <-tick:
			d.core.Handle(rangecore.Event{Kind: rangecore.EventTick}) // leader balance and a full disk's hand-off are the core's
		case <-liveness:
			liveness = d.cfg.repl.liveness()
			d.core.Handle(rangecore.Event{Kind: rangecore.EventLiveness})
		case to := <-d.unreachable:
			d.core.Handle(rangecore.Event{Kind: rangecore.EventUnreachable, To: to})
		case fn := <-d.execCh:
			fn()
		case <-held.C:
			d.core.Handle(rangecore.Event{Kind: rangecore.EventHeldCommits})
		case <-d.maintainCh:
			// The node's sweep (maintenance.go): retention runs as
			// Raft log compaction (see snapshot.go).
			d.compact()
		case <-d.stopCh:
			d.stopReplicated(stopWriter)
			return
		}
		// Take everything else already queued before the Ready cycle, so
		// that one cycle (one fsync) covers as many proposals and messages
		// as possible: with one event per cycle, messages would wait behind
		// an fsync each.
		d.drainReplicated()
		switch e := d.core.Cycle(); e.Timer {
		case rangecore.TimerReset:
			held.Reset(e.Wait)
		case rangecore.TimerStop:
			held.Stop()
		}
	}
}

// firstCampaigner is the voter that campaigns at once when the group is
// new.
func (d *rangeDriver) firstCampaigner() uint64 {
	if first := d.cfg.repl.firstCampaigner; first != 0 || len(d.cfg.repl.peers) == 0 {
		return first
	}
	return d.cfg.repl.peers[0]
}

// runLogWriter is the replica's log-writer goroutine: it runs WriteLog
// whenever the driver's Ready cycles queued writes, until stop. Each
// WriteLog takes everything queued so far (one fsync for all of it) and
// sends the acks that waited for it straight to the transport; what is
// for the replica itself wakes the driver (LogWritten). A failure is
// reported by the driver's next ProcessReady, which stops the replica.
//
// A write the log refuses for want of space (segment.ErrNoSpace) is not a
// failure: the replica keeps it queued and refuses proposals, and this
// goroutine tries it again after a backoff (diskFullRetryMin doubling to
// diskFullRetryMax), which is the probe: the first write that fits
// resumes the range, with no restart.
func (d *rangeDriver) runLogWriter(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	backoff, waiting := diskFullRetryMin, false
	for {
		select {
		case <-d.rep.LogWrites():
			if waiting {
				continue // the probe's timer will write this too
			}
		case <-retry.C:
			waiting = false
		case <-stop:
			return
		}
		before, began := d.store.DurableOffset(), time.Now()
		err := d.rep.WriteLog()
		switch {
		case errors.Is(err, segment.ErrNoSpace):
			retry.Reset(backoff)
			backoff, waiting = min(2*backoff, diskFullRetryMax), true
		case err != nil:
			d.logger.Error("log write failed", "error", err)
		default:
			backoff = diskFullRetryMin
			// A write that made records durable is one group-commit
			// round (geolog.segment.fsync_duration): its writes and fsync.
			if after := d.store.DurableOffset(); after > before {
				now := time.Now()
				d.durable.add(after, now)
				d.cfg.metrics.fsyncRound(context.Background(), now.Sub(began), after-before, d.rep.LeaderTerm() != 0)
			}
		}
	}
}

// The log writer's backoff while the disk is full.
const (
	diskFullRetryMin = 20 * time.Millisecond
	diskFullRetryMax = 2 * time.Second
)

// drainReplicated takes the events already queued, up to
// rangecore.DrainEventsMax, into the Ready cycle to come.
// Appends and peers' messages are taken in turn, so that neither waits
// behind the other's backlog.
func (d *rangeDriver) drainReplicated() {
	for n := 0; n < rangecore.DrainEventsMax; {
		took := d.takeOne()
		if took {
			n++
		}
		if d.takeRaft() {
			n++
			took = true
		}
		select {
		case to := <-d.unreachable:
			d.core.Handle(rangecore.Event{Kind: rangecore.EventUnreachable, To: to})
			n++
		default:
			if !took {
				return
			}
		}
	}
}

// takeOne proposes the oldest queued append, if any.
func (d *rangeDriver) takeOne() bool {
	op, ok := d.inbox.Take()
	if ok {
		d.propose(op)
	}
	return ok
}

// takeRaft steps the oldest queued batch of peers' messages, if any.
func (d *rangeDriver) takeRaft() bool {
	msgs, ok := d.raftIn.Take()
	if ok {
		d.step(msgs)
	}
	return ok
}

// step steps messages from peers, then answers at once the appends their
// acks committed (replica.AnswerCommitted): the follower's ack that
// completes a quorum is answered without waiting for a Ready cycle.
func (d *rangeDriver) step(msgs []*raftpb.Message) {
	if d.condemned {
		return // a stray being removed (strays.go): nothing it acks may count
	}
	d.core.Handle(rangecore.Event{Kind: rangecore.EventMessages, Msgs: msgs})
}

// peerRefusedLogInterval bounds how often a range logs the peer messages
// it refuses (each is counted).
const peerRefusedLogInterval = 10 * time.Second

// inboundEnder is the transport's way to end a peer's stream
// (raftnet.GRPCTransport.EndInbound); the simulator's transport has none.
type inboundEnder interface {
	EndInbound(from raftnet.NodeID)
}

// peerRefused counts, and logs now and then, a Raft message the replica
// refused: a peer sent what no correct member sends. The stream that
// carried it ends.
func (d *rangeDriver) peerRefused(from uint64, err error) {
	d.cfg.metrics.peerRefused.Add(context.Background(), 1, peerRaft)
	if e, ok := d.cfg.repl.transport.(inboundEnder); ok {
		e.EndInbound(raftnet.NodeID(from))
	}
	if now := d.cfg.now(); now.Sub(d.peerRefusedLogged) >= peerRefusedLogInterval {
		d.peerRefusedLogged = now
		d.logger.Warn("refused a raft message from a peer", "from", from, "error", err)
	}
}

// ready runs Ready cycles until Raft has nothing more (rangecore.Driver:
// each cycle's acks wait until its end, when the committed offset it
// reached is published, and leave then, not behind the cycles after it),
// then afterReady.
func (d *rangeDriver) ready() { d.core.Ready() }

// afterReady runs after the Ready cycles (rangecore.DriverConfig): it
// notes a failure, publishes the committed offset to readers and hands
// what committed to onCommit.
func (d *rangeDriver) afterReady(error) {
	if f := d.rep.Failure(); f != nil && d.failure.Load() == nil {
		d.failure.Store(f)
		d.notify()
	}
	if d.strayFlagged.Load() && !d.condemned && d.rep.LeaderID() != 0 {
		d.strayFlagged.Store(false) // a leader speaks to it: no stray (strayhint.go)
	}
	c := d.rep.Committed()
	d.publishCommitted()
	if c < d.onCommitFrom {
		d.onCommitFrom = c // a fork cut the log back
	} else if c > d.onCommitFrom && d.cfg.repl.onCommit != nil {
		d.cfg.repl.onCommit(d, d.onCommitFrom, c)
		d.onCommitFrom = c
	}
	d.noteLogEpoch() // a fork, or a newer epoch's frames, may lift a fence
}

// publishCommitted publishes the replica's committed offset to readers. It
// runs after every Ready cycle, and before an ack is sent (propose), so
// that a reader who was told of a record finds it.
func (d *rangeDriver) publishCommitted() {
	d.publishSplitEnd() // before readers see the marker's offset committed
	if !d.splitSeen.Load() && d.rep.SplitPending() {
		d.splitSeen.Store(true)
	}
	if c := d.rep.Committed(); c > d.committed.Load() {
		d.committed.Store(c)
		d.notify()
	} else if c < d.committed.Load() {
		// A fork cut the log back to c (its divergent tail is in the
		// orphan log now): readers see the log the new home continues.
		d.logger.Warn("log forked: records past the fork moved to the orphan log", "fork_offset", c, "was", d.committed.Load())
		d.committed.Store(c)
		d.notify()
	}
}

// propose hands an append to the replica, translating its answer.
func (d *rangeDriver) propose(op *appendOp) {
	if !op.verbatim && d.cfg.leaseCheck != nil {
		// Admitted when it arrived; checked again now that it is proposed:
		// a home told to stop (a planned rehome) proposes nothing more, so
		// its tail is final once its proposals in flight are answered.
		if err := d.cfg.leaseCheck(d, op.epoch, false, false); err != nil {
			op.reply(appendResult{err: err})
			return
		}
	}
	if d.gateAppend(op) {
		return // held until the epoch's start is confirmed, or refused
	}
	refused, shedEntry := d.shed(op)
	if refused {
		return
	}
	frameBytes := len(op.frame)
	op.trace.proposed()
	proposedAt := time.Now()
	op.proposedAt = proposedAt
	propose := d.rep.Propose
	if op.verbatim {
		propose = d.rep.ProposeVerbatim
	}
	propose(&replica.Op{
		ProducerID: op.producerID, BaseSequence: op.baseSequence, RecordCount: op.recordCount,
		Frame: op.frame, Epoch: op.epoch, Term: op.term,
		Reply: func(r replica.Result) {
			if shedEntry != nil {
				d.shedder.answered(shedEntry, d.cfg.now(), r.Err == nil)
			}
			if r.Err != nil {
				err := d.hintAddress(r.Err)
				op.trace.committed(0, 0, err)
				op.reply(appendResult{err: err})
				return
			}
			op.trace.committed(r.BaseOffset, r.Epoch, nil)
			if !r.Duplicate {
				d.cfg.metrics.commitDone(proposedAt)
			}
			if !op.verbatim && d.cfg.leaseCheck != nil {
				// DESIGN.md "Fencing": no ack once the lease may have
				// expired, or under an epoch that is no longer current.
				// The batch is committed here, but unacknowledged it may
				// end in the orphan log; an idempotent retry resolves it.
				if err := d.cfg.leaseCheck(d, r.Epoch, r.Duplicate, true); err != nil {
					op.reply(appendResult{err: err})
					return
				}
			}
			if !r.Duplicate && d.cfg.stream != metaStreamName { // client records only
				d.cfg.metrics.ackedRecords.Add(context.Background(), int64(r.RecordCount))
				d.cfg.metrics.ackedBytes.Add(context.Background(), int64(frameBytes))
			}
			res := appendResult{baseOffset: r.BaseOffset, recordCount: r.RecordCount, epoch: r.Epoch,
				appendTimeUnixNanos: r.AppendTimeUnixNanos, duplicate: r.Duplicate}
			if !op.receivedAt.IsZero() && !r.Duplicate {
				// A client's append: its stages (stages.go). Cursor
				// commits and mirrored batches read no clock here.
				res.committedAt = time.Now()
				res.durableAt = d.durable.durableAt(r.BaseOffset + uint64(r.RecordCount))
			}
			if d.core.Holding() { // to the Ready cycle's end (rangecore.Driver)
				d.core.Hold(func() { op.reply(res) })
				return
			}
			op.reply(res)
		},
	})
}

// exec runs fn on the driver goroutine (which owns the replica) and waits.
func (d *rangeDriver) exec(ctx context.Context, fn func()) error {
	done := make(chan struct{})
	select {
	case d.execCh <- func() { fn(); close(done) }:
	case <-d.doneCh:
		return apierr.New(apierr.ShuttingDown, "range is closing")
	case <-ctx.Done():
		return apierr.Wrap(apierr.Timeout, ctx.Err(), "range busy")
	}
	select {
	case <-done:
		return nil
	case <-d.doneCh:
		return apierr.New(apierr.ShuttingDown, "range is closing")
	case <-ctx.Done():
		return apierr.Wrap(apierr.Timeout, ctx.Err(), "range busy")
	}
}

// hintAddress turns a replica's "node:<id>" leader hint into the leader's
// client address. A leader whose node the transport finds down is no hint:
// sending the client there would cost it a failed dial and a backoff.
func (d *rangeDriver) hintAddress(err error) error {
	e := apierr.As(err)
	if e.Code == apierr.NotLeader && strings.HasPrefix(e.LeaderHint, "node:") {
		id, _ := strconv.ParseUint(strings.TrimPrefix(e.LeaderHint, "node:"), 10, 64)
		hinted := *e
		hinted.LeaderHint = d.cfg.repl.addrOf(id)
		if d.peerDown(id) {
			hinted.LeaderHint = ""
		}
		return &hinted
	}
	return err
}

// peerDownReporter is the transport's failure detector
// (raftnet.GRPCTransport.PeerDown); the simulator's transport has none.
type peerDownReporter interface {
	PeerDown(node raftnet.NodeID) bool
}

// peerDownFunc is the failure detector the range's core asks (nil: the
// transport has none).
func (d *rangeDriver) peerDownFunc() func(uint64) bool {
	if _, ok := d.cfg.repl.transport.(peerDownReporter); !ok {
		return nil
	}
	return d.peerDown
}

func (d *rangeDriver) peerDown(id uint64) bool {
	pd, ok := d.cfg.repl.transport.(peerDownReporter)
	if !ok || id == 0 || id == d.cfg.repl.nodeID {
		return false
	}
	// A decommissioned node's peer is removed from the transport, which
	// then reports it up: it is down for good (quiesce.go).
	return pd.PeerDown(raftnet.NodeID(id)) || (d.cfg.repl.peerGone != nil && d.cfg.repl.peerGone(id))
}

// stopReplicated hands leadership away if it can (so the group does not
// wait an election timeout), stops the log writer (stopWriter) and writes
// what it left queued, answers what is pending and refuses the rest.
func (d *rangeDriver) stopReplicated(stopWriter func()) {
	if d.rep.IsLeader() {
		if to := d.transferee(); to != 0 {
			d.rep.TransferLeadership(to)
			d.ready()
		}
	}
	stopWriter()
	if err := d.rep.WriteLog(); err != nil {
		d.logger.Warn("log write on shutdown", "error", err)
	}
	// A clean mark: a restart in a later boot (a planned reboot) trusts
	// it and serves readers at once (replica's relearn.go).
	if err := d.rep.SaveCleanMark(); err != nil {
		d.logger.Warn("commit mark on shutdown", "error", err)
	}
	d.rep.Close()
	d.refuseHeld()
	d.refuseQueued()
}

// transferee picks the most caught-up follower (rangecore.MostCaughtUp).
func (d *rangeDriver) transferee() uint64 {
	return rangecore.MostCaughtUp(d.cfg.repl.nodeID, d.rep.Status().Progress)
}

// metaGroupID is the catalogue's Raft group; ranges get groups derived from
// the catalogue offset of their stream's creation (see groupFor).
const metaGroupID raftnet.GroupID = 1

// groupFor is the Raft group of range r of the stream created at catalogue
// offset metaOffset: unique and the same on every node.
func groupFor(metaOffset uint64, r uint32) raftnet.GroupID {
	return raftnet.GroupID((metaOffset+1)<<16 | uint64(r))
}

func metaDir(dataDir string) string { return filepath.Join(dataDir, "meta") }

func fmtPeers(peers map[uint64]string) string {
	var b strings.Builder
	for id, a := range peers {
		fmt.Fprintf(&b, "%d=%s ", id, a)
	}
	return b.String()
}
