package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/geolog/geolog/apierr"
	logbatch "github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// promisedRecord is a produced record until its callback runs.
type promisedRecord struct {
	rec       *Record
	wire      *Record // what is sent: rec, or its sealed form (SealWith)
	cb        func(ProduceResult, error)
	ctx       context.Context
	stopCtx   func() bool // stops the ctx watcher; nil if ctx cannot end
	deadline  time.Time   // zero: none
	enqueued  time.Time
	sizeBytes int
}

// batch is a run of a range's records with its sequence numbers.
type batch struct {
	recs      []*promisedRecord
	req       *geologv1.AppendRequest
	sizeBytes int
	pid       uint64
	baseSeq   uint64
	// framePID and frameSeq are the numbers in req.Batch's header (the
	// batch form), which send patches when a renumber changed pid and
	// baseSeq.
	framePID, frameSeq uint64
	// requestID is the id of its send on the current stream; 0 means it is
	// not on the current stream and must be (re)sent.
	requestID uint64
	attempts  int
	sentAt    time.Time // its last send (attempt.go)
	deadline  time.Time // the earliest of its records' deadlines; zero: none
	// resp is set once acknowledged; a batch completes only when every
	// batch before it has, so that callbacks run in offset order.
	resp *geologv1.AppendResponse
	// repliedAt is when resp arrived (Timing's round trip).
	repliedAt time.Time
}

func (b *batch) recordCount() uint64 { return uint64(len(b.recs)) }

// connEvent is the outcome of opening one stream (open set), or a reply or
// the terminal error of one stream.
type connEvent struct {
	gen    uint64
	open   bool
	stream geologv1.Log_AppendStreamClient // with open: the opened stream
	resp   *geologv1.AppendResponse
	err    error
}

// appendConn is one AppendStream of a range, to one address.
type appendConn struct {
	gen    uint64
	addr   string
	ctx    context.Context
	cancel context.CancelFunc
	// stream is nil while the stream is being opened.
	stream geologv1.Log_AppendStreamClient
	// broken is set when a Send failed: nothing more is sent on it, and the
	// driver waits for the receiver to report why the stream ended.
	broken bool
	// replied is set by the first reply, acked by the first acknowledgement.
	replied, acked bool
	// lastReply is when the last reply arrived (attempt.go).
	lastReply time.Time
}

// rangeDriver owns one range of a producer. Produce calls append to pending
// under mu; everything else is owned by the run goroutine.
type rangeDriver struct {
	p   *Producer
	rng uint32
	log hclog.Logger

	wake        chan struct{} // cap 1: poke never blocks
	sweepNeeded atomic.Bool

	mu                 sync.Mutex
	pending            []*promisedRecord // FIFO from pendingHead; guarded by mu
	pendingHead        int
	pendingBytes       int
	pendingDeadlineMin time.Time // a lower bound of pending deadlines
	closed             bool

	// Owned by run.
	// addr is where the range's streams go: the range leader as far as the
	// driver knows (see the package doc, "Routing" and step 5).
	addr string
	// hintHops counts the leader hints followed since the last
	// acknowledgement; the first hintHopsImmediateMax go without backoff.
	hintHops int
	pid      uint64
	nextSeq  uint64
	// pidAcked is set once a batch was acknowledged under pid. Until then
	// the range sends one batch at a time (see pump).
	pidAcked       bool
	batches        []*batch // unacknowledged, in sequence order
	conn           *appendConn
	connGen        uint64
	requestSeq     uint64
	events         chan connEvent
	backoffAttempt int
	backoffUntil   time.Time
	lastErr        error
	timer          *time.Timer
	timerDue       time.Time
	// givenUp holds the addresses the range gave up on lately (for want of
	// a reply, a leader cut off from its followers, a home whose lease
	// expired), each until when (attempt.go); at most givenUpMax.
	givenUp map[string]time.Time
	// splitEnded is set once the range split and the driver handed its
	// records to the children (split.go): run returns.
	splitEnded bool
}

func newRangeDriver(p *Producer, rng uint32) *rangeDriver {
	pid := p.id
	if !p.cfg.idempotent {
		pid = 0
	}
	addr := p.c.pool.leader(p.stream, rng)
	if addr == "" {
		addr = p.c.pool.pick()
	}
	return &rangeDriver{
		p:    p,
		rng:  rng,
		log:  p.log.With("range", rng),
		wake: make(chan struct{}, 1),
		pid:  pid,
		addr: addr,
		// A stream's receiver never has more unread replies than batches
		// sent on it: at most the window, plus the window again of stale
		// sends after a renumbering, plus its terminal error; its opener
		// sends one event. Receivers and openers of abandoned streams exit
		// on their context, so this never blocks for long.
		events: make(chan connEvent, 2*InflightBatchesMaxLimit+3),
	}
}

func (d *rangeDriver) poke() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

func (d *rangeDriver) requestSweep() {
	d.sweepNeeded.Store(true)
	d.poke()
}

// enqueue buffers pr; false if the driver has shut down.
func (d *rangeDriver) enqueue(pr *promisedRecord) bool {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return false
	}
	wasEmpty := len(d.pending) == d.pendingHead
	d.pending = append(d.pending, pr)
	d.pendingBytes += pr.sizeBytes
	full := d.pendingBytes >= d.p.cfg.batchBytesMax && d.pendingBytes-pr.sizeBytes < d.p.cfg.batchBytesMax
	earlier := false
	if !pr.deadline.IsZero() && (d.pendingDeadlineMin.IsZero() || pr.deadline.Before(d.pendingDeadlineMin)) {
		d.pendingDeadlineMin = pr.deadline
		earlier = true
	}
	d.mu.Unlock()
	// The driver looks at pending whenever it can send, so it needs a poke
	// only when there may be something new for it to do: the first record,
	// a batch that became full (ends a linger), or an earlier deadline.
	if wasEmpty || full || earlier {
		d.poke()
	}
	return true
}

func (d *rangeDriver) run() {
	defer d.p.wg.Done()
	d.timer = time.NewTimer(time.Hour)
	d.timer.Stop()
	defer d.timer.Stop()
	for {
		now := time.Now()
		d.expire(now)
		d.checkAttempt(now)
		d.pump(now)
		d.armTimer(now)
		select {
		case <-d.p.ctx.Done():
			d.shutdown()
			return
		case <-d.wake:
		case ev := <-d.events:
			d.handle(ev)
			if d.splitEnded {
				return
			}
		case <-d.timer.C:
			d.timerDue = time.Time{}
		}
	}
}

// pump sends what can be sent: first the batches to resend, then new batches
// while the window has room.
func (d *rangeDriver) pump(now time.Time) {
	if now.Before(d.backoffUntil) || (d.conn != nil && (d.conn.broken || d.conn.stream == nil)) {
		return
	}
	window := d.p.cfg.inflightBatchesMax
	if d.pid != 0 && !d.pidAcked {
		// A server may accept any first sequence from a producer id it
		// does not know. Were the first batch to fail retriably while the
		// second is in flight, the second would land first and the
		// first's resend would look like an old duplicate: lost and out
		// of order. So a new id pipelines only once the server knows it.
		window = 1
	}
	// Sent batches are a prefix of d.batches; after a rewind or a
	// renumbering the list may be longer than the window, and only its
	// first window batches may be on the wire.
	unsent := false
	for _, b := range d.batches[:min(window, len(d.batches))] {
		if b.requestID == 0 && b.resp == nil {
			unsent = true
			break
		}
	}
	if !unsent && (len(d.batches) >= window || !d.cuttable(now)) {
		return
	}
	if d.conn == nil {
		// Sending waits for the stream to open (an event).
		d.connect()
		return
	}
	for _, b := range d.batches[:min(window, len(d.batches))] {
		if b.requestID == 0 && b.resp == nil {
			if !d.send(b) {
				return
			}
		}
	}
	for len(d.batches) < window {
		b := d.cut(now)
		if b == nil {
			return
		}
		d.batches = append(d.batches, b)
		if !d.send(b) {
			return
		}
	}
}

// cuttable reports whether cut would return a batch now.
func (d *rangeDriver) cuttable(now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cuttableLocked(now)
}

func (d *rangeDriver) cuttableLocked(now time.Time) bool {
	if len(d.pending) == d.pendingHead {
		return false
	}
	linger := d.p.cfg.linger
	return linger == 0 || d.p.flushing.Load() > 0 || d.pendingBytes >= d.p.cfg.batchBytesMax ||
		now.Sub(d.pending[d.pendingHead].enqueued) >= linger
}

// cut takes the next batch off pending and numbers it, or returns nil.
func (d *rangeDriver) cut(now time.Time) *batch {
	d.mu.Lock()
	if !d.cuttableLocked(now) {
		d.mu.Unlock()
		return nil
	}
	b := &batch{}
	i := d.pendingHead
	for i < len(d.pending) {
		pr := d.pending[i]
		if len(b.recs) > 0 && b.sizeBytes+pr.sizeBytes > d.p.cfg.batchBytesMax {
			break
		}
		b.recs = append(b.recs, pr)
		b.sizeBytes += pr.sizeBytes
		d.pending[i] = nil
		i++
	}
	d.pendingHead = i
	d.pendingBytes -= b.sizeBytes
	if d.pendingHead == len(d.pending) {
		d.pending = d.pending[:0]
		d.pendingHead = 0
		d.pendingDeadlineMin = time.Time{}
	} else if d.pendingHead > len(d.pending)/2 && d.pendingHead > 64 {
		n := copy(d.pending, d.pending[d.pendingHead:])
		clear(d.pending[n:])
		d.pending = d.pending[:n]
		d.pendingHead = 0
	}
	d.mu.Unlock()
	// The records are no longer unsent: room for Produce under the
	// queueing-delay bound (delaybudget.go), which counts unsent bytes.
	d.p.budget.dequeue(int64(b.sizeBytes))

	for _, pr := range b.recs {
		if !pr.deadline.IsZero() && (b.deadline.IsZero() || pr.deadline.Before(b.deadline)) {
			b.deadline = pr.deadline
		}
	}
	// The queueing-delay bound needs the server's time for each batch
	// (netRoundTrip), as WithTiming does.
	wantTiming := d.p.cfg.timing || d.p.budget.delay != nil
	b.req = &geologv1.AppendRequest{Stream: d.p.stream, Range: d.rng, WantTiming: wantTiming}
	d.number(b)
	if d.p.cfg.recordsForm || d.p.recordsOnly.Load() || !b.frame() {
		b.toRecordsForm()
	}
	return b
}

// toRecordsForm sets b.req to carry b's records as messages (the records
// form) and no batch.
func (b *batch) toRecordsForm() {
	b.req.Batch = nil
	b.req.Records = make([]*geologv1.Record, len(b.recs))
	for i, pr := range b.recs {
		b.req.Records[i] = pr.wire.toProto()
	}
}

// frame sets b.req.Batch to b's records as one produced frame under b's
// numbers (the batch form), or returns false for records the frame cannot
// hold (a tombstone with a value, a frame over logbatch.FrameBytesMax): those
// go as messages, for the leader to refuse with its own error.
func (b *batch) frame() bool {
	recs := make([]logbatch.Record, len(b.recs))
	for i, pr := range b.recs {
		recs[i] = pr.wire.toBatch()
	}
	size, ok := logbatch.ProducedBytes(recs)
	if !ok {
		return false
	}
	b.req.Batch = logbatch.EncodeProduced(make([]byte, 0, size), b.pid, b.baseSeq, recs)
	b.framePID, b.frameSeq = b.pid, b.baseSeq
	return true
}

// number gives b the range's current producer id and its next sequences.
func (d *rangeDriver) number(b *batch) {
	b.pid = d.pid
	if d.pid == 0 {
		b.baseSeq = 0
		return
	}
	b.baseSeq = d.nextSeq
	d.nextSeq += b.recordCount()
}

// renumber moves every unacknowledged batch to a fresh producer id, in
// order. Only call it when none of them can ever be appended under its
// current id (see the callers).
func (d *rangeDriver) renumber() {
	if d.pid == 0 {
		return
	}
	d.pid = randomProducerID()
	d.nextSeq = 0
	d.pidAcked = false
	for _, b := range d.batches {
		if b.resp != nil {
			panic("client: renumbering an acknowledged batch")
		}
		d.number(b)
		b.requestID = 0
	}
	d.log.Debug("continuing under a fresh producer id", "new_producer_id", d.pid)
}

// connect starts opening a stream to d.addr. Opening runs on its own
// goroutine and reports as an event, because it may wait for a connection
// (up to the connect timeout for an address that does not answer), and the
// driver must meanwhile keep failing records whose deadlines pass.
func (d *rangeDriver) connect() {
	api, _, err := d.p.c.pool.api(d.addr)
	if err != nil {
		d.streamEnded(err)
		return
	}
	// The stream's context is not the producer's: on Close the driver ends
	// an idle stream with a half-close (closeIdle), so the server records
	// it as a success; closeConn cancels it on every other path.
	ctx, cancel := context.WithCancel(context.WithoutCancel(d.p.ctx))
	d.connGen++
	conn := &appendConn{gen: d.connGen, addr: d.addr, ctx: ctx, cancel: cancel}
	d.conn = conn
	go func() {
		stream, err := api.AppendStream(ctx)
		select {
		case d.events <- connEvent{gen: conn.gen, open: true, stream: stream, err: err}:
		case <-ctx.Done():
		}
	}()
}

// receive forwards stream's replies and its terminal error to the driver.
// It reads no driver state.
func (d *rangeDriver) receive(ctx context.Context, gen uint64, stream geologv1.Log_AppendStreamClient) {
	for {
		resp, err := stream.Recv()
		select {
		case d.events <- connEvent{gen: gen, resp: resp, err: err}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

func (d *rangeDriver) closeConn() {
	if d.conn != nil {
		d.conn.cancel()
		d.conn = nil
	}
}

func (d *rangeDriver) send(b *batch) bool {
	d.requestSeq++
	b.requestID = d.requestSeq
	b.attempts++
	b.sentAt = time.Now()
	b.req.RequestId = b.requestID
	b.req.ProducerId = b.pid
	b.req.BaseSequence = b.baseSeq
	if len(b.req.Batch) > 0 && (b.framePID != b.pid || b.frameSeq != b.baseSeq) {
		// Renumbered since it was framed (renumber): the frame's header
		// carries the numbers too.
		logbatch.PatchProducer(b.req.Batch, b.pid, b.baseSeq)
		b.framePID, b.frameSeq = b.pid, b.baseSeq
	}
	// Send serializes the request before it returns, so b.req may be
	// changed for a later resend.
	if err := d.conn.stream.Send(b.req); err != nil {
		if errors.Is(err, io.EOF) {
			// The stream is gone; its receiver will report why.
			d.conn.broken = true
		} else {
			d.streamEnded(err)
		}
		return false
	}
	return true
}

func (d *rangeDriver) handle(ev connEvent) {
	if d.conn == nil || ev.gen != d.conn.gen {
		return // from an abandoned stream
	}
	if ev.err != nil {
		d.streamEnded(ev.err)
		return
	}
	if ev.open {
		d.conn.stream = ev.stream
		go d.receive(d.conn.ctx, d.conn.gen, ev.stream)
		return
	}
	d.conn.replied = true
	d.conn.lastReply = time.Now()
	d.onReply(ev.resp)
}

// streamEnded handles the end of the current stream (or a failure to open
// one).
func (d *rangeDriver) streamEnded(err error) {
	replied := d.conn != nil && d.conn.replied
	d.closeConn()
	if d.p.ctx.Err() != nil {
		return // closing; shutdown fails everything
	}
	var e *Error
	if errors.Is(err, io.EOF) {
		e = apierr.New(apierr.Unavailable, "append stream ended by the server")
	} else {
		e = rpcerr.FromError(err)
	}
	if e.Retriable {
		immediate := d.retarget(e, replied)
		d.rewind(e)
		if immediate {
			d.backoffUntil = time.Time{}
		}
		return
	}
	// A final stream error says nothing about which sends were appended,
	// so everything in flight fails (see the package doc, step 7).
	d.log.Warn("append stream failed", "error", e)
	d.failInflight(func(*promisedRecord) error { return e })
	d.rewind(e)
}

func (d *rangeDriver) onReply(resp *geologv1.AppendResponse) {
	i := -1
	for j, b := range d.batches {
		if b.requestID == resp.GetRequestId() && b.resp == nil {
			i = j
			break
		}
	}
	if i < 0 {
		return // a reply to a send made before a rewind or renumbering
	}
	b := d.batches[i]
	if ed := resp.GetError(); ed != nil {
		d.onErrorReply(i, rpcerr.FromDetail(ed))
		return
	}
	if resp.GetRecordCount() != uint32(len(b.recs)) {
		e := apierr.New(apierr.Internal, "server acknowledged %d records of a batch of %d", resp.GetRecordCount(), len(b.recs))
		d.log.Error("protocol violation", "error", e)
		d.failInflight(func(*promisedRecord) error { return e })
		return
	}
	b.resp, b.repliedAt = resp, time.Now()
	if lt := resp.GetTiming(); lt != nil {
		d.p.budget.netRoundTrip(b.repliedAt.Sub(b.sentAt)-serverTime(lt), b.repliedAt)
	}
	if b.pid == d.pid {
		d.pidAcked = true
	}
	if !d.conn.acked {
		// The node appends for the range: it is the leader, for other
		// producers of the client too.
		d.conn.acked = true
		d.p.c.pool.setLeader(d.p.stream, d.rng, d.conn.addr)
		d.p.c.pool.succeeded(d.conn.addr)
	}
	d.backoffAttempt = 0
	d.hintHops = 0
	d.lastErr = nil
	for len(d.batches) > 0 && d.batches[0].resp != nil {
		head := d.batches[0]
		d.batches[0] = nil
		d.batches = d.batches[1:]
		d.ack(head)
	}
}

// onErrorReply handles an error reply for batches[i].
func (d *rangeDriver) onErrorReply(i int, e *Error) {
	b := d.batches[i]
	if e.Code == apierr.EmptyBatch && len(b.req.GetBatch()) > 0 {
		d.fallBackToRecordsForm(e)
		return
	}
	switch {
	case e.Code == apierr.RangeSplit && i == 0:
		// Nothing in flight is in the range: its records go to the
		// range's children (split.go).
		d.splitEnded = d.splitAway(e)

	case e.Retriable, i > 0:
		// A batch behind an unacknowledged one failed (a SEQUENCE_GAP
		// because its predecessor has not landed is the usual case): it is
		// part of the rewind, which resends everything in order. A
		// retriable error may also say where to resend (NOT_LEADER).
		immediate := false
		if e.Retriable {
			immediate = d.retarget(e, true)
		}
		d.closeConn()
		d.rewind(e)
		if immediate {
			d.backoffUntil = time.Time{}
		}

	case e.Code == apierr.ProducerStateLost:
		// The range lost this producer's state (expired or evicted, or a
		// failover cut acknowledged batches off the log: with ForkEpoch
		// set, every one acknowledged at ForkOffset or later is in an old
		// home's orphan log). It does not have b, nor any batch behind it,
		// under this id, and never will: resend them all under a fresh id.
		d.log.Warn("the range lost the producer's state; continuing under a fresh producer id",
			"expected", e.ExpectedSequence, "base_sequence", b.baseSeq, "fork_epoch", e.ForkEpoch, "fork_offset", e.ForkOffset)
		// The node that answered holds the range: under an id that had
		// been acknowledged the resend goes at once (after a takeover this
		// is the new home's first answer); a fresh id lost again waits the
		// backoff.
		worked := d.pidAcked
		d.closeConn()
		d.renumber()
		d.rewind(e)
		if worked {
			d.backoffUntil = time.Time{}
		}

	case e.Code == apierr.DuplicateOutOfWindow:
		// b was appended long ago and its ack lost; the server can no
		// longer tell its offsets. Its records fail with this code (they
		// are stored); the batches behind it keep their sequences, which
		// follow b's on the server.
		d.batches[0] = nil
		d.batches = d.batches[1:]
		d.fail(b, func(*promisedRecord) error { return e })

	case e.Code == apierr.SequenceGap:
		// Within one epoch the range's sequences and ours disagree, which
		// a server that keeps the contract never causes for this client:
		// ahead of b, it may hold b and some batches behind it; behind
		// it, it lacks batches it acknowledged. Either way the outcome of
		// what is in flight is unknown: it fails, and the range continues
		// under a fresh id.
		d.log.Error("the range's producer sequence disagrees with ours", "expected", e.ExpectedSequence, "base_sequence", b.baseSeq)
		d.failInflight(func(*promisedRecord) error { return e })

	default:
		// The server rejected b, so under b's id it still expects b's base
		// sequence and accepts no later one: no batch behind b was or will
		// be appended under that id. b fails; the rest move to a fresh id
		// and are resent in order. Replies to their earlier sends carry
		// old request ids and are ignored.
		//
		// This trusts that an earlier send of b, still in the server's
		// pipeline from a stream we abandoned, fails the same way: the
		// final errors a server gives are properties of the request
		// (validation, unknown stream or range, permissions). A transient
		// final error (INTERNAL) raced by a stale send that succeeds is the
		// one case this cannot rule out.
		d.batches[0] = nil
		d.batches = d.batches[1:]
		d.fail(b, func(*promisedRecord) error { return e })
		d.renumber()
	}
}

// fallBackToRecordsForm handles EMPTY_BATCH for a batch-form append: the
// node predates the batch form (AppendRequest.batch is an unknown field to
// it, so it saw a request without records) and appended nothing. Every
// producer of the range's producer then sends the records form, and the
// unacknowledged batches are resent in it at once, under the same numbers.
func (d *rangeDriver) fallBackToRecordsForm(e *Error) {
	if !d.p.recordsOnly.Swap(true) {
		d.log.Warn("a node does not take the batch form (an older server): sending records instead", "node", d.addr, "error", e)
	}
	for _, b := range d.batches {
		if len(b.req.GetBatch()) > 0 {
			b.toRecordsForm()
		}
	}
	d.closeConn()
	d.rewind(e)
	d.backoffUntil = time.Time{}
}

// hintHopsImmediateMax bounds the leader hints a range follows at once,
// without backoff, between two acknowledgements; past it hints wait the
// usual backoff, so that nodes whose hints point at each other (a stale
// view during an election) cannot make a range spin.
const hintHopsImmediateMax = 3

// retarget chooses where the range's next stream goes after the retriable
// error e ended the current one (or its opening); replied says whether the
// node had answered on that stream. It returns whether the move may skip
// the backoff. The rules (the package doc, "Routing"):
//
//   - a leader hint naming another address: go there (learning it), and
//     cache it as the range's leader;
//   - NOT_LEADER without a usable hint, or NOT_HOME whose hint names the
//     address the range gave up on (a mirror region's view of the home,
//     stale until the home's next heartbeat): the range's leader in the
//     client's cache if another producer learned one, else the next
//     address in the ring;
//   - LEASE_EXPIRED: the next bootstrap address (the client's own nodes
//     know where the range went if another region took it over);
//   - a stream that failed before the node answered anything (it could not
//     be opened, or the node died at once), or SHUTTING_DOWN: the address is
//     marked failed and the range goes on as for NOT_LEADER;
//   - otherwise (a stream that worked broke, an overloaded or unavailable
//     leader): the same address again. If the node is gone, that attempt
//     fails before any answer and the rule above moves on.
func (d *rangeDriver) retarget(e *Error, replied bool) (immediate bool) {
	pool := d.p.c.pool
	from := d.addr
	switch hint := d.usableHint(e, from); {
	case hint != "":
		d.addr = hint
		pool.setLeader(d.p.stream, d.rng, hint)
		d.hintHops++
		immediate = d.hintHops <= hintHopsImmediateMax
	case e.Code == apierr.NotLeader || d.staleNotHome(e, from):
		if e.LeaderCutOff {
			// The leader is cut off from its followers, which may go on
			// naming it until they elect another: follow no hint back to
			// it for now, and try them at once.
			d.markUnresponsive(from, time.Now())
			immediate = true
		}
		pool.forgetLeader(d.p.stream, d.rng, from)
		d.addr = d.nextAddr(from)
	case e.Code == apierr.LeaseExpired:
		// The home could not renew its lease (cut off from the lease
		// store, or from the other regions): another region may have
		// taken the range over, and only the client's own nodes can say
		// (they redirect with NOT_HOME). If they are that home, they
		// answer LEASE_EXPIRED too until it recovers. The node is given
		// up on as an unresponsive one: a mirror region's NOT_HOME naming
		// it (its view predates the takeover) is not followed back to it,
		// and the mirror's nodes are asked at the shortest backoff
		// (electing) until the takeover, whose new home then redirects
		// at once (the hints followed so far are history). The first
		// lease expiry in a while moves on at once; more (every node of
		// the client's own region may answer it) wait the usual backoff.
		now := time.Now()
		immediate = !d.givingUp(now)
		d.markUnresponsive(from, now)
		d.hintHops = 0
		pool.forgetLeader(d.p.stream, d.rng, from)
		d.addr = pool.nextBootstrap(from)
	case !replied || e.Code == apierr.ShuttingDown:
		pool.failed(from)
		pool.forgetLeader(d.p.stream, d.rng, from)
		d.addr = d.nextAddr(from)
	}
	if d.addr != from {
		d.log.Debug("moving range", "from", from, "to", d.addr, "immediate", immediate, "error", e)
	}
	return immediate
}

// nextAddr returns where the range goes when it gives up on from without a
// hint: the leader another producer of the client learned meanwhile, if
// any, else the next address in the ring; never, while another is known,
// the address it last gave up on for want of a reply (attempt.go).
func (d *rangeDriver) nextAddr(from string) string {
	if l := d.p.c.pool.leader(d.p.stream, d.rng); l != "" && l != from && !d.isUnresponsive(l) {
		return l
	}
	return d.skipUnresponsive(d.p.c.pool.next(from))
}

// rewind abandons the current stream and schedules a resend, after backoff,
// of every unacknowledged batch with its sequence numbers.
func (d *rangeDriver) rewind(err error) {
	d.closeConn()
	d.lastErr = err
	for _, b := range d.batches {
		b.requestID = 0
	}
	d.backoffAttempt++
	// An OVERLOADED refusal says how long to wait, at least.
	delay := retryDelay(err, d.backoffAttempt, d.p.cfg.backoffMin, d.p.cfg.backoffMax)
	if d.electing(err) {
		delay = min(delay, d.p.cfg.backoffMin)
	}
	d.backoffUntil = time.Now().Add(delay)
	d.log.Debug("rewinding", "attempt", d.backoffAttempt, "backoff", delay, "inflight_batches", len(d.batches), "error", err)
}

// failInflight fails every unacknowledged batch and continues the range
// under a fresh producer id: after this nothing is resent under the old one.
func (d *rangeDriver) failInflight(errFor func(*promisedRecord) error) {
	bs := d.batches
	d.batches = nil
	for _, b := range bs {
		d.fail(b, errFor)
	}
	d.renumber()
}

// expire fails records whose deadline passed or whose context ended while
// buffered, and in-flight batches past their deadline.
func (d *rangeDriver) expire(now time.Time) {
	for _, b := range d.batches {
		if !b.deadline.IsZero() && !now.Before(b.deadline) {
			// Batches behind b share its fate: resending them under the
			// same id while b is abandoned would leave a gap, and under a
			// fresh id could duplicate them if an earlier send of b lands.
			lastErr := d.lastErr
			d.failInflight(func(pr *promisedRecord) error { return d.deadlineErr(pr, now, lastErr) })
			break
		}
	}
	d.mu.Lock()
	due := !d.pendingDeadlineMin.IsZero() && !now.Before(d.pendingDeadlineMin)
	d.mu.Unlock()
	if d.sweepNeeded.Swap(false) || due {
		d.sweep(now)
	}
}

// sweep drops buffered records that expired or whose context ended.
func (d *rangeDriver) sweep(now time.Time) {
	var dropped []*promisedRecord
	d.mu.Lock()
	kept := d.pending[:d.pendingHead]
	d.pendingDeadlineMin = time.Time{}
	for _, pr := range d.pending[d.pendingHead:] {
		if pr.ctx.Err() != nil || (!pr.deadline.IsZero() && !now.Before(pr.deadline)) {
			dropped = append(dropped, pr)
			d.pendingBytes -= pr.sizeBytes
			continue
		}
		if !pr.deadline.IsZero() && (d.pendingDeadlineMin.IsZero() || pr.deadline.Before(d.pendingDeadlineMin)) {
			d.pendingDeadlineMin = pr.deadline
		}
		kept = append(kept, pr)
	}
	clear(d.pending[len(kept):])
	d.pending = kept
	d.mu.Unlock()
	if len(dropped) == 0 {
		return
	}
	lastErr := d.lastErr
	dropBatch := &batch{recs: dropped, sizeBytes: sumSizes(dropped)}
	d.p.budget.dequeue(int64(dropBatch.sizeBytes))
	d.fail(dropBatch, func(pr *promisedRecord) error {
		return d.deadlineErr(pr, now, lastErr)
	})
}

func sumSizes(prs []*promisedRecord) int {
	n := 0
	for _, pr := range prs {
		n += pr.sizeBytes
	}
	return n
}

// deadlineErr says why pr is failed by expire or sweep.
func (d *rangeDriver) deadlineErr(pr *promisedRecord, now time.Time, lastErr error) error {
	if err := pr.ctx.Err(); err != nil {
		return err
	}
	if dl, ok := pr.ctx.Deadline(); ok && !now.Before(dl) {
		return context.DeadlineExceeded
	}
	if pr.deadline.IsZero() || now.Before(pr.deadline) {
		return fmt.Errorf("%w: a batch in flight with the record timed out, outcome unknown", ErrDeliveryTimeout)
	}
	if lastErr != nil {
		return fmt.Errorf("%w after %v (last error: %w)", ErrDeliveryTimeout, d.p.cfg.deliveryTimeout, lastErr)
	}
	return fmt.Errorf("%w after %v", ErrDeliveryTimeout, d.p.cfg.deliveryTimeout)
}

// armTimer sets the driver's one timer to the earliest thing it waits for:
// the end of a backoff, of a linger, or a deadline.
func (d *rangeDriver) armTimer(now time.Time) {
	var due time.Time
	earliest := func(t time.Time) {
		if !t.IsZero() && (due.IsZero() || t.Before(due)) {
			due = t
		}
	}
	if now.Before(d.backoffUntil) {
		earliest(d.backoffUntil)
	}
	for _, b := range d.batches {
		earliest(b.deadline)
	}
	earliest(d.attemptDue())
	d.mu.Lock()
	earliest(d.pendingDeadlineMin)
	if d.p.cfg.linger > 0 && len(d.pending) > d.pendingHead && len(d.batches) < d.p.cfg.inflightBatchesMax {
		earliest(d.pending[d.pendingHead].enqueued.Add(d.p.cfg.linger))
	}
	d.mu.Unlock()
	if due.Equal(d.timerDue) {
		return
	}
	d.timerDue = due
	if due.IsZero() {
		d.timer.Stop()
		return
	}
	d.timer.Reset(max(due.Sub(now), time.Millisecond))
}

// ack completes an acknowledged batch.
func (d *rangeDriver) ack(b *batch) {
	now := time.Now()
	d.p.budget.release(int64(b.sizeBytes), true, now)
	resp := b.resp
	var appendTime time.Time
	if ns := resp.GetAppendTimeUnixNanos(); ns != 0 {
		appendTime = time.Unix(0, ns)
	}
	for i, pr := range b.recs {
		if pr.stopCtx != nil {
			pr.stopCtx()
		}
		pr.cb(ProduceResult{
			Record:     pr.rec,
			Range:      d.rng,
			Offset:     resp.GetBaseOffset() + uint64(i),
			Epoch:      resp.GetEpoch(),
			AppendTime: appendTime,
			Duplicate:  resp.GetDuplicate(),
			Timing:     b.timing(pr, d.p.cfg.timing),
		}, nil)
	}
	d.p.doneRecords(len(b.recs))
}

// fail completes b's records with errFor's errors.
func (d *rangeDriver) fail(b *batch, errFor func(*promisedRecord) error) {
	d.p.budget.release(int64(b.sizeBytes), false, time.Time{})
	for _, pr := range b.recs {
		if pr.stopCtx != nil {
			pr.stopCtx()
		}
		pr.cb(ProduceResult{Record: pr.rec, Range: d.rng}, errFor(pr))
	}
	d.p.doneRecords(len(b.recs))
}

// streamCloseWait bounds how long Close waits for the server to end an idle
// stream after the producer's half-close.
const streamCloseWait = 500 * time.Millisecond

// closeIdle ends the current stream with a half-close when nothing is in
// flight on it, and waits (up to streamCloseWait) for the server to end it:
// a producer that closes cleanly ends its streams as a success, not as a
// cancellation (which the server's metrics count as a failed call).
func (d *rangeDriver) closeIdle() {
	c := d.conn
	if c == nil || c.stream == nil || c.broken || len(d.batches) > 0 {
		return
	}
	if err := c.stream.CloseSend(); err != nil {
		return
	}
	wait := time.NewTimer(streamCloseWait)
	defer wait.Stop()
	for {
		select {
		case ev := <-d.events:
			if ev.gen == c.gen && ev.err != nil {
				return // the server ended the stream (io.EOF when it succeeded)
			}
		case <-wait.C:
			return
		}
	}
}

// shutdown fails everything left when the producer closes.
func (d *rangeDriver) shutdown() {
	d.closeIdle()
	d.closeConn()
	d.mu.Lock()
	d.closed = true
	pending := d.pending[d.pendingHead:]
	d.pending = nil
	d.mu.Unlock()
	closed := func(*promisedRecord) error { return ErrClosed }
	for _, b := range d.batches {
		d.fail(b, closed)
	}
	d.batches = nil
	if len(pending) > 0 {
		left := &batch{recs: pending, sizeBytes: sumSizes(pending)}
		d.p.budget.dequeue(int64(left.sizeBytes))
		d.fail(left, closed)
	}
}

// serverTime is the time a leader reports having spent on an append, from
// receiving it to answering it. A forged or wrapped-around figure only
// shortens the network round trip netRoundTrip takes (to no less than 0).
func serverTime(lt *geologv1.AppendTiming) time.Duration {
	stage := func(ns uint64) time.Duration { return time.Duration(min(ns, uint64(time.Hour))) }
	return stage(lt.GetAdmissionNanos()) + stage(lt.GetQueueNanos()) + stage(lt.GetLeaderWriteNanos()) +
		stage(lt.GetQuorumNanos()) + stage(lt.GetAckNanos())
}

// timing is pr's Timing in b, acknowledged (nil unless on).
func (b *batch) timing(pr *promisedRecord, on bool) *Timing {
	if !on {
		return nil
	}
	t := &Timing{Waited: max(b.sentAt.Sub(pr.enqueued), 0), RoundTrip: max(b.repliedAt.Sub(b.sentAt), 0), Attempts: b.attempts}
	if lt := b.resp.GetTiming(); lt != nil {
		t.Admission, t.Queue = time.Duration(lt.GetAdmissionNanos()), time.Duration(lt.GetQueueNanos())
		t.LeaderWrite, t.Quorum = time.Duration(lt.GetLeaderWriteNanos()), time.Duration(lt.GetQuorumNanos())
		t.Ack = time.Duration(lt.GetAckNanos())
	}
	return t
}
