package regionsvc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/atrest"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/dedup"
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
	// producersMax bounds the dedup table per range.
	producersMax int
	// producerStateTTL forgets producers idle for longer.
	producerStateTTL time.Duration
	// metrics are the node's instruments.
	metrics *nodeMetrics
	// syncSlots bounds the fsyncs in progress across the node's ranges.
	syncSlots chan struct{}
	// repl, when set, makes the range a Raft group member (see replicated.go).
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
	// maintenanceInterval is how often retention and expiry run.
	maintenanceInterval time.Duration
	// fenced turns on timeline fences (timeline.go): homing on, a stream
	// of several regions. wantEpochs asks the node for the epoch starts a
	// fence lacks (history: the range's epoch history); it must not block.
	fenced     bool
	wantEpochs func(d *rangeDriver, history bool)
	// compaction, if set, makes the range compacted by key (compaction.go).
	compaction *compactionConfig
}

type syncResult struct {
	durableOffset uint64
	err           error
}

// rangeDriver owns one range: its segment store and idempotence state. One
// goroutine (run) owns all mutable state; see doc.go for the contract. Reads
// go straight to the store, bounded by the committed offset, which the driver
// publishes atomically.
type rangeDriver struct {
	cfg    rangeDriverConfig
	logger hclog.Logger
	store  *segment.Store // nil when the range failed to open

	// Published state, read by any goroutine.
	committed atomic.Uint64 // offsets below it are durable and readable
	// highestEpoch is the highest homing epoch seen in the log, in mirrored
	// batches and in the home's heartbeats.
	highestEpoch atomic.Uint64
	// homeLeaderID is, on a mirror, the home leader's Raft id in its region
	// as its heartbeats say (0: not heard yet).
	homeLeaderID atomic.Uint64
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

	inbox    chan *appendOp
	syncKick chan struct{}
	syncDone chan syncResult
	stopCh   chan struct{}
	doneCh   chan struct{}
	stopOnce sync.Once

	// Replicated mode (cfg.repl set): the Raft member and its inputs.
	rep         *replica.Replica
	raftIn      chan []*raftpb.Message
	unreachable chan uint64
	execCh      chan func()
	// holdAcks is set during a Ready cycle: acks are held in heldAcks
	// until the cycle's end (ready). Driver goroutine.
	holdAcks bool
	heldAcks []func()
	// onCommitFrom is the committed offset cfg.repl.onCommit was last
	// called up to (driver goroutine).
	onCommitFrom uint64
	// campaignInTicks counts down to a campaign after the leader's node was
	// found down (see watchLeader); 0 when none is planned.
	campaignInTicks int
	// peerRefusedLogged is when a refused peer message was last logged.
	peerRefusedLogged time.Time

	// Owned by the run goroutine.
	keyc               *keyCompactor // nil unless the stream compacts by key
	dedup              *dedup.Table
	pending            []*appendOp
	lastAppendUnixNano int64
	written            bool // appended since the last sync kick
}

// openRangeDriver opens the range's store, rebuilding idempotence state from
// the log. A store that fails to open (corruption, I/O) gives a driver that
// refuses every request with a typed error, so the rest of the node serves
// on; nothing on disk is touched.
func openRangeDriver(cfg rangeDriverConfig) *rangeDriver {
	d := &rangeDriver{
		cfg:      cfg,
		logger:   cfg.logger.Named("range").With("stream", cfg.stream, "range", cfg.rangeID),
		notifyCh: make(chan struct{}),
		inbox:    make(chan *appendOp, cfg.inboxOpsMax),
		syncKick: make(chan struct{}, 1),
		syncDone: make(chan syncResult),
		stopCh:   make(chan struct{}),
		doneCh:   make(chan struct{}),
		dedup:    dedup.NewTable(cfg.producersMax),
	}
	if cfg.compaction != nil {
		d.keyc = newKeyCompactor(*cfg.compaction)
	}
	scfg := cfg.store
	scfg.Logger = d.logger
	var headers []batch.Header
	var markerAt uint64
	var markerFound bool
	scfg.OnRecover = func(h batch.Header) error {
		if h.Type == batch.TypeCompact {
			markerAt, markerFound = h.BaseOffset, true
		}
		if cfg.repl != nil {
			headers = append(headers, h) // the replica rebuilds its own state
			d.raiseEpoch(h.Epoch)
			return nil
		}
		d.dedup.RecordFrame(h)
		if h.AppendTimeUnixNanos > d.lastAppendUnixNano {
			d.lastAppendUnixNano = h.AppendTimeUnixNanos
		}
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
	if cfg.repl != nil {
		if err := d.openReplica(headers); err != nil {
			st.Close()
			d.notServed(err, errors.Is(err, replica.ErrOrphansCorrupt))
			return d
		}
		d.campaignIfSole()
		go d.runReplicated()
		return d
	}
	d.committed.Store(st.NextOffset())
	d.recoverKeyDecision(markerAt, markerFound)
	go d.run()
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
	select {
	case d.inbox <- op:
	case <-d.stopCh:
		op.reply(appendResult{err: apierr.New(apierr.ShuttingDown, "node is shutting down")})
	case <-ctx.Done():
		op.reply(appendResult{err: apierr.Wrap(apierr.Timeout, ctx.Err(), "range %d inbox full", d.cfg.rangeID)})
	}
}

// run is the driver loop; it owns the store's write side and all state.
func (d *rangeDriver) run() {
	defer close(d.doneCh)
	syncStop := make(chan struct{})
	syncExited := make(chan struct{})
	go d.syncLoop(syncStop, syncExited)
	defer func() {
		close(syncStop)
		<-syncExited
		if err := d.store.Close(); err != nil {
			d.logger.Error("close store", "error", err)
		}
	}()
	ticker := time.NewTicker(d.cfg.maintenanceInterval)
	defer ticker.Stop()
	for {
		select {
		case op := <-d.inbox:
			d.handleAppend(op)
			// Take what else is queued before kicking the syncer, so one
			// fsync covers as many batches as possible (group commit).
		drain:
			for drained := 0; drained < cap(d.inbox); drained++ {
				select {
				case op := <-d.inbox:
					d.handleAppend(op)
				default:
					break drain
				}
			}
			d.kickSync()
		case r := <-d.syncDone:
			if r.err != nil {
				d.fail(fmt.Errorf("fsync: %w", r.err))
				continue
			}
			d.advance(r.durableOffset)
		case <-ticker.C:
			d.maintain()
		case <-d.stopCh:
			d.shutdown()
			return
		}
	}
}

// kickSync asks the syncer for a round if anything was written.
func (d *rangeDriver) kickSync() {
	if !d.written {
		return
	}
	d.written = false
	select {
	case d.syncKick <- struct{}{}:
	default: // a round is already requested; it will cover this write too
	}
}

// syncLoop runs fsync rounds off the driver goroutine, so the driver keeps
// writing new batches while a round is in progress; the next round then
// covers all of them.
func (d *rangeDriver) syncLoop(stop <-chan struct{}, exited chan<- struct{}) {
	defer close(exited)
	for {
		select {
		case <-d.syncKick:
		case <-stop:
			return
		}
		select {
		case d.cfg.syncSlots <- struct{}{}:
		case <-stop:
			return
		}
		before := d.store.DurableOffset()
		began := time.Now()
		err := d.store.Sync()
		<-d.cfg.syncSlots
		if err == nil {
			d.cfg.metrics.fsyncRound(context.Background(), time.Since(began), d.store.DurableOffset()-before)
		}
		r := syncResult{durableOffset: d.store.DurableOffset(), err: err}
		select {
		case d.syncDone <- r:
		case <-stop:
			return
		}
		if err != nil {
			return
		}
	}
}

func (d *rangeDriver) handleAppend(op *appendOp) {
	if f := d.failure.Load(); f != nil {
		op.reply(appendResult{err: f})
		return
	}
	if op.producerID != 0 {
		verdict, orig, err := d.dedup.Check(op.producerID, op.baseSequence, op.recordCount, d.cfg.epoch)
		switch verdict {
		case dedup.Reject:
			op.reply(appendResult{err: err})
			return
		case dedup.Duplicate:
			op.frame = nil
			op.res = appendResult{
				baseOffset:          orig.BaseOffset,
				recordCount:         orig.RecordCount,
				epoch:               orig.Epoch,
				appendTimeUnixNanos: orig.AppendTimeUnixNanos,
				duplicate:           true,
			}
			op.endOffset = orig.BaseOffset + uint64(orig.RecordCount)
			if op.endOffset <= d.committed.Load() {
				op.reply(op.res)
			} else {
				// The original is written but not yet durable: answer
				// when it is, never before.
				d.pending = append(d.pending, op)
			}
			return
		}
	}
	op.trace.proposed()
	op.proposedAt = time.Now()
	base := d.store.NextOffset()
	now := d.cfg.now().UnixNano()
	if now < d.lastAppendUnixNano {
		now = d.lastAppendUnixNano // append time never goes back within a range
	}
	batch.Patch(op.frame, base, d.cfg.epoch, now)
	if err := d.store.Append(op.frame); errors.Is(err, segment.ErrNoSpace) {
		// Not a failure: the store cut the torn frame off and takes the
		// next append that fits (each one is the probe). Reads go on.
		op.reply(appendResult{err: apierr.New(apierr.Unavailable,
			"stream %s range %d: out of disk space; appends resume once space is freed: %v", d.cfg.stream, d.cfg.rangeID, err)})
		return
	} else if err != nil {
		d.fail(fmt.Errorf("append: %w", err))
		op.reply(appendResult{err: d.failure.Load()})
		return
	}
	op.frameBytes = len(op.frame)
	op.frame = nil
	d.written = true
	d.lastAppendUnixNano = now
	if op.producerID != 0 {
		d.dedup.Record(op.producerID, dedup.Batch{
			BaseSequence:        op.baseSequence,
			RecordCount:         op.recordCount,
			BaseOffset:          base,
			Epoch:               d.cfg.epoch,
			AppendTimeUnixNanos: now,
		})
	}
	op.res = appendResult{baseOffset: base, recordCount: op.recordCount, epoch: d.cfg.epoch, appendTimeUnixNanos: now}
	op.endOffset = base + uint64(op.recordCount)
	d.pending = append(d.pending, op)
}

// advance publishes a new durable offset and acks what it covers.
func (d *rangeDriver) advance(durable uint64) {
	if durable > d.committed.Load() {
		d.committed.Store(durable)
		d.notify()
	}
	i := 0
	var records, bytes int64
	for ; i < len(d.pending); i++ {
		op := d.pending[i]
		if op.endOffset > durable {
			break
		}
		if !op.res.duplicate {
			records += int64(op.recordCount)
			bytes += int64(op.frameBytes)
			d.cfg.metrics.commitDone(op.proposedAt)
		}
		op.trace.committed(op.res.baseOffset, op.res.epoch, nil)
		op.reply(op.res)
		d.pending[i] = nil
	}
	if records > 0 {
		d.cfg.metrics.ackedRecords.Add(context.Background(), records)
		d.cfg.metrics.ackedBytes.Add(context.Background(), bytes)
	}
	d.pending = d.pending[i:]
	// Duplicates may sit behind a later, uncommitted batch; they are
	// answered once that one is, which keeps the pending list a simple FIFO.
}

// fail stops the range: nothing more is acked, every waiter is answered.
// Writes that were not yet durable get a retriable error: their outcome is
// unknown, and an idempotent retry after restart resolves it.
func (d *rangeDriver) fail(err error) {
	e := apierr.Wrap(apierr.Unavailable, err, "stream %s range %d failed", d.cfg.stream, d.cfg.rangeID)
	if d.failure.CompareAndSwap(nil, e) {
		d.logger.Error("range failed; refusing appends until restart", "error", err)
	} else {
		e = d.failure.Load()
	}
	for _, op := range d.pending {
		op.reply(appendResult{err: e})
	}
	d.pending = nil
	d.notify()
}

// diskFull reports whether the range's log refuses writes for want of
// space (not a failure: see segment.ErrNoSpace). Safe from any goroutine.
func (d *rangeDriver) diskFull() bool {
	if d.rep != nil {
		return d.rep.DiskFull() != nil
	}
	return d.store != nil && d.store.NoSpace() != nil
}

// maintain applies retention and forgets idle producers.
func (d *rangeDriver) maintain() {
	if d.failure.Load() != nil {
		return
	}
	if n, err := d.store.ApplyRetention(); err != nil {
		d.logger.Warn("retention failed", "error", err)
	} else if n > 0 {
		d.logger.Debug("retention deleted segments", "segments", n, "start_offset", d.store.StartOffset())
	}
	if d.cfg.producerStateTTL > 0 {
		d.dedup.Expire(d.cfg.now().Add(-d.cfg.producerStateTTL).UnixNano())
	}
	d.compactByKey()
}

// shutdown makes what was written durable, acks it, and refuses the rest.
func (d *rangeDriver) shutdown() {
	if d.failure.Load() == nil && len(d.pending) > 0 {
		// Wait for the syncer's round in flight (if any) before our own.
		if err := d.store.Sync(); err != nil {
			d.fail(fmt.Errorf("fsync at shutdown: %w", err))
		} else {
			d.advance(d.store.DurableOffset())
		}
	}
	e := apierr.New(apierr.ShuttingDown, "node is shutting down")
	for _, op := range d.pending {
		op.reply(appendResult{err: e})
	}
	d.pending = nil
	d.refuseQueued()
}

// refuseQueued answers every queued append with a retriable SHUTTING_DOWN
// and marks the range as closing, at the end of a driver's life.
func (d *rangeDriver) refuseQueued() {
	e := apierr.New(apierr.ShuttingDown, "node is shutting down")
	for {
		select {
		case op := <-d.inbox:
			op.reply(appendResult{err: e})
		default:
			d.failure.CompareAndSwap(nil, e)
			d.notify()
			return
		}
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
