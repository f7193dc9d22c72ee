package regionsvc

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/atrest"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/internal/mailbox"
	"github.com/geolog/geolog/rangecore"
	"github.com/geolog/geolog/replica"
	"github.com/geolog/geolog/segment"
	"github.com/hashicorp/go-hclog"
	"go.etcd.io/raft/v3/raftpb"
)

// appendResult is the outcome of one append, handed to appendOp.reply.
type appendResult struct {
	baseOffset          uint64
	recordCount         uint32
	epoch               uint64
	appendTimeUnixNanos int64
	duplicate           bool
	err                 error
	// committedAt is when the append committed, durableAt when the
	// leader's log held it (zero: not known then); stages.go.
	committedAt, durableAt time.Time
}

// appendOp is one append request on its way through a range driver.
type appendOp struct {
	producerID   uint64
	baseSequence uint64
	recordCount  uint32
	// frame is the encoded batch; the driver patches its offset, epoch and
	// append time, and drops the reference once the frame is written.
	frame []byte
	// verbatim marks a mirrored frame (replicated from the home region):
	// proposed as it is, offsets, epoch and append time included.
	verbatim bool
	// epoch is the homing epoch the append was admitted at (the lease
	// checked when it arrived); 0: the range's static epoch.
	epoch uint64
	// term, if not 0, is the Raft term of leadership the append was
	// validated in (replica.Op.Term): refused, retriable, in another term.
	term uint64
	// reply is called exactly once, from the driver goroutine (or from submit
	// when the driver is gone). It must not block.
	reply func(appendResult)

	res        appendResult
	endOffset  uint64
	frameBytes int
	// held is what the append holds of the node's budget of appends in
	// flight, released as it is answered (server.go).
	held int64
	// trace follows the append in spans (tracing.go); nil when tracing is
	// off. proposedAt is when the driver took it (the commit histogram).
	trace      *appendTrace
	proposedAt time.Time
	// arrivedAt is when the append reached the range (submit): its
	// sojourn, for load shedding (shed.go), runs from here.
	arrivedAt time.Time
	// receivedAt is when the handler took the request, queuedAt when it
	// reached the range (the stages of stages.go; zero: not a client's).
	receivedAt, queuedAt time.Time
}

// rangeDriverConfig configures one range driver.
type rangeDriverConfig struct {
	stream  string
	rangeID uint32
	store   segment.Config
	epoch   uint64
	logger  hclog.Logger
	now     func() time.Time
	// inboxOpsMax bounds queued appends; producers block beyond it.
	inboxOpsMax int
	// appendQueueDelayTarget turns load shedding on for a stream range
	// when positive (shed.go).
	appendQueueDelayTarget time.Duration
	// producersMax bounds the replica's idempotence table.
	producersMax int
	// metrics are the node's instruments.
	metrics *nodeMetrics
	// repl makes the range a member of its Raft group (replicated.go);
	// required: a region of one node is a Raft group of one.
	repl *replicationConfig
	// homeRegion is the region the range is homed in as created; home says
	// it is this node's. With a lease store (homing.go) they are only the
	// starting point: rangeDriver.role is what counts.
	homeRegion string
	home       bool
	// leaseCheck, if set (homing on), is asked before every ack whether
	// the node may still ack at the batch's epoch.
	leaseCheck func(d *rangeDriver, epoch uint64, duplicate, committed bool) error
	// compactionFloor, if set, returns the lowest offset still to be kept
	// for other regions' mirrors (ok false: no bound). See multiregion.go.
	compactionFloor func() (offset uint64, ok bool)
	// fenced turns on timeline fences (timeline.go): homing on, a stream
	// of several regions. wantEpochs asks the node for the epoch starts a
	// fence lacks (history: the range's epoch history); it must not block.
	fenced     bool
	wantEpochs func(d *rangeDriver, history bool)
	// confirmStart, if set (homing on, several regions), confirms or
	// raises the recorded start of a new epoch to the log's end before
	// its first append (epochstart.go); it may block.
	confirmStart func(d *rangeDriver, epoch, end, logStart, firstEpoch, logEpoch uint64) error
	// compaction, if set, makes the range compacted by key (compaction.go).
	compaction *compactionConfig
}

// rangeDriver owns one range: its segment store and its replica (the Raft
// group member, which keeps the idempotence state). One goroutine
// (runReplicated) owns all mutable state; see doc.go for the contract.
// Reads go straight to the store, bounded by the committed offset, which
// the driver publishes atomically.
type rangeDriver struct {
	cfg    rangeDriverConfig
	logger hclog.Logger
	store  *segment.Store // nil when the range failed to open

	// Published state, read by any goroutine.
	committed atomic.Uint64 // offsets below it are durable and readable
	// splitEnd is the range's end once its split marker is applied
	// (split_read.go); nil while it has none. Set before committed passes
	// the marker, never cleared.
	splitEnd atomic.Pointer[splitEnd]
	// highestEpoch is the highest homing epoch seen in the log, in mirrored
	// batches and in the home's heartbeats.
	highestEpoch atomic.Uint64
	// splitSeen is set once the replica's log held a split marker: a hint
	// (the marker may yet be truncated away) for the mirror's split
	// record (split_mirror.go), which reads the replica to be sure.
	splitSeen atomic.Bool
	// homeLeaderID is, on a mirror, the home leader's Raft id in its region
	// as its heartbeats say (0: not heard yet).
	homeLeaderID atomic.Uint64
	// homeFloor is, on a mirror, the home's compaction floor as its
	// heartbeats last said it, plus one (0: not heard): see compact.
	homeFloor atomic.Uint64
	// taskFloor is, on the home leader, the compaction floor of its
	// replicator tasks as compact last read it, plus one (0: unknown): what
	// the tasks' heartbeats carry (reading the manager from a task's
	// goroutine would deadlock against a reconcile that waits for it).
	taskFloor atomic.Uint64
	// hold is the stream's mirror hold bound (mirrorhold.go), set by the
	// node at open and at an alter (nil: no bound). An atomic, not the
	// node's spec: compact reads it on the driver goroutine, which must
	// not take the node's lock.
	hold atomic.Pointer[mirrorHold]
	// noReplica is set while this node's replica is neither a voter nor a
	// learner of the range's Raft group, as it last applied its
	// configuration (a node of a region larger than the replication
	// factor, or one whose replica moved away): its store is not the
	// range's log, so reads are refused (readable).
	noReplica atomic.Bool
	// strayFlagged is set while this node's replica is a stray suspect
	// or condemned (strays.go, strayhint.go): reads are refused as with
	// noReplica, until the replica hears a leader.
	strayFlagged atomic.Bool
	// strayHintAt is when a hint last started a check of the range
	// (unix nanoseconds; strayhint.go).
	strayHintAt atomic.Int64
	// roleP is the range's current home (see homing.go); never nil after
	// open.
	roleP atomic.Pointer[rangeRole]
	// tl is the timeline fence: local reads stop below it (timeline.go).
	tl      timeline
	failure atomic.Pointer[apierr.Error] // set once the range stops serving
	// keyErr is set, before the driver is published, when its log could
	// not open for want of a data key (atrest): New refuses to start.
	keyErr   error
	notifyMu sync.Mutex
	notifyCh chan struct{} // closed and replaced when committed or failure changes

	// rewriteMu is held by each rewrite of the range's segments, the
	// compaction cleaner's and the resealer's (reseal.go): one at a time.
	rewriteMu sync.Mutex
	// orphans is a replicated range's orphan log (nil otherwise), set
	// before the driver runs.
	orphans *replica.OrphanStore

	inbox    *mailbox.Box[*appendOp] // memory follows what is queued (idle ranges hold none)
	stopCh   chan struct{}
	doneCh   chan struct{}
	stopOnce sync.Once

	// The Raft member and its inputs.
	rep         *replica.Replica
	raftIn      *mailbox.Box[[]*raftpb.Message]
	unreachable chan uint64
	execCh      chan func()
	// maintainCh carries the node's maintenance requests (maintenance.go),
	// at most one pending.
	maintainCh chan struct{}
	// core is the driver loop's body (rangecore.Driver): Ready cycles
	// and their acks, quiescence, campaigns. Driver goroutine.
	core *rangecore.Driver
	// onCommitFrom is the committed offset cfg.repl.onCommit was last
	// called up to (driver goroutine).
	onCommitFrom uint64
	// quiesced is published by the driver goroutine: its replica is
	// quiesced and it ignores the node's tick (quiesce.go).
	quiesced atomic.Bool
	// dormant, while not nil, is the channel closed when the node's pace
	// admits this new group (openpace.go; driver goroutine).
	dormant <-chan struct{}
	// balance is the preferred-leader state (leaderbalance.go).
	balance leaderBalance
	// durable is when the log became durable up to which offset
	// (stages.go): the log writer adds, the driver reads.
	durable durableLog
	// shedder sheds appends by queueing delay (shed.go); nil: off.
	shedder *appendShedder
	// peerRefusedLogged is when a refused peer message was last logged.
	peerRefusedLogged time.Time
	// gate holds a new epoch's appends until its start is confirmed
	// (epochstart.go). Driver goroutine.
	gate startGate

	// condemned is set on a stray replica about to be removed (strays.go):
	// it steps no Raft message from then on. Driver goroutine.
	condemned bool

	// Owned by the driver goroutine.
	keyc *keyCompactor // nil unless the stream compacts by key
}

// openRangeDriver opens the range's store and its replica, which rebuilds
// its idempotence state from the log. A store that fails to open
// (corruption, I/O) gives a driver that refuses every request with a typed
// error, so the rest of the node serves on; nothing on disk is touched.
func openRangeDriver(cfg rangeDriverConfig) *rangeDriver {
	if cfg.repl == nil {
		panic("regionsvc: a range driver needs its Raft group (rangeDriverConfig.repl)")
	}
	d := &rangeDriver{
		cfg:      cfg,
		logger:   cfg.logger.Named("range").With("stream", cfg.stream, "range", cfg.rangeID),
		notifyCh: make(chan struct{}),
		inbox:    mailbox.New[*appendOp](cfg.inboxOpsMax),
		stopCh:   make(chan struct{}),
		doneCh:   make(chan struct{}),
	}
	if cfg.compaction != nil {
		d.keyc = newKeyCompactor(*cfg.compaction)
	}
	scfg := cfg.store
	scfg.Logger = d.logger
	var headers []batch.Header
	scfg.OnRecover = func(h batch.Header) error {
		headers = append(headers, h) // the replica rebuilds its own state
		d.raiseEpoch(h.Epoch)
		return nil
	}
	st, err := segment.Open(scfg)
	if err == nil {
		// What recovery found may sit only in the page cache (the process
		// died, the machine did not): make it durable before serving it.
		err = st.Sync()
		if err != nil {
			st.Close()
		}
	}
	if err != nil {
		d.notServed(err, errors.Is(err, segment.ErrCorrupt))
		return d
	}
	d.store = st
	if err := d.openReplica(headers); err != nil {
		st.Close()
		d.notServed(err, errors.Is(err, replica.ErrOrphansCorrupt))
		return d
	}
	// Readers see at once what the replica published before it stopped
	// (its commit mark): a restart never shows them a shorter log.
	d.publishCommitted()
	go d.runReplicated()
	return d
}

// notServed makes d, whose range failed to open with err, a driver that
// refuses every request: CORRUPTION when corrupt, else UNAVAILABLE, final
// either way (the node serves on; nothing on disk is touched). A missing
// data key (of the log or of its orphan log) is kept apart, as keyErr.
func (d *rangeDriver) notServed(err error, corrupt bool) {
	code := apierr.Unavailable
	if corrupt {
		code = apierr.Corruption
	}
	e := apierr.Wrap(code, err, "stream %s range %d is not served", d.cfg.stream, d.cfg.rangeID)
	e.Retriable = false
	if errors.Is(err, atrest.ErrKeyUnavailable) {
		d.keyErr = err
	}
	d.failure.Store(e)
	d.logger.Error("range not served", "error", err)
	close(d.doneCh)
}

// submit hands op to the driver. It blocks while the inbox is full
// (backpressure) until ctx ends. On any failure op.reply gets the error.
func (d *rangeDriver) submit(ctx context.Context, op *appendOp) {
	if f := d.failure.Load(); f != nil {
		op.reply(appendResult{err: d.appendRefusal(f)})
		return
	}
	op.arrivedAt = d.cfg.now()
	if !op.receivedAt.IsZero() {
		op.queuedAt = time.Now()
	}
	switch err := d.inbox.Put(ctx, d.stopCh, op); {
	case err == nil:
	case errors.Is(err, mailbox.ErrStopped):
		op.reply(appendResult{err: apierr.New(apierr.ShuttingDown, "node is shutting down")})
	default:
		op.reply(appendResult{err: apierr.Wrap(apierr.Timeout, err, "range %d inbox full", d.cfg.rangeID)})
	}
}

// diskFull reports whether the range's log refuses writes for want of
// space (not a failure: see segment.ErrNoSpace). Safe from any goroutine.
func (d *rangeDriver) diskFull() bool {
	return d.rep != nil && d.rep.DiskFull() != nil
}

// refuseQueued answers every queued append with a retriable SHUTTING_DOWN
// and marks the range as closing, at the end of a driver's life.
func (d *rangeDriver) refuseQueued() {
	e := apierr.New(apierr.ShuttingDown, "node is shutting down")
	for {
		op, ok := d.inbox.Take()
		if !ok {
			d.failure.CompareAndSwap(nil, e)
			d.notify()
			return
		}
		op.reply(appendResult{err: e})
	}
}

// stop ends the driver and waits for it.
func (d *rangeDriver) stop() {
	d.stopOnce.Do(func() { close(d.stopCh) })
	<-d.doneCh
}

func (d *rangeDriver) notify() {
	d.notifyMu.Lock()
	close(d.notifyCh)
	d.notifyCh = make(chan struct{})
	d.notifyMu.Unlock()
}

func (d *rangeDriver) changed() <-chan struct{} {
	d.notifyMu.Lock()
	defer d.notifyMu.Unlock()
	return d.notifyCh
}

// waitCommitted blocks until the committed offset reaches target.
func (d *rangeDriver) waitCommitted(ctx context.Context, target uint64) error {
	for {
		ch := d.changed()
		if d.committed.Load() >= target {
			return nil
		}
		if f := d.failure.Load(); f != nil {
			return f
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return apierr.Wrap(apierr.Timeout, ctx.Err(), "waiting for offset %d (committed %d)", target, d.committed.Load())
		}
	}
}
