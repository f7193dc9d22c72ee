package client

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/client/e2e"
	"github.com/geolog/geolog/keyspace"
)

// Producer appends records to one stream: batched per range, pipelined,
// idempotent and retried (see the package doc for the contract). It is safe
// for concurrent use.
type Producer struct {
	c      *Client
	stream string
	cfg    producerConfig
	log    hclog.Logger
	id     uint64
	sealer *e2e.Sealer // nil without SealWith

	// ctx ends when the producer is closed; every range driver and stream
	// hangs off it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// metaMu serializes the one DescribeStream that learns the range count.
	// drivers is written before rangeCount is stored, so a reader that loads
	// a non-zero rangeCount sees the slice.
	metaMu     sync.Mutex
	rangeCount atomic.Uint32
	drivers    []atomic.Pointer[rangeDriver]
	sticky     atomic.Uint32
	// stickyTaken is the bytes of keyless records routed to the sticky
	// range since it became sticky (tookSticky).
	stickyTaken atomic.Int64

	// routeMu is held for reading while a record is routed and enqueued,
	// and for writing while a split range hands its records to its
	// children (split.go); rmap is the stream's range map once a range
	// split (nil: routing by keyspace.RangeForKey over rangeCount). The
	// drivers slice grows, under routeMu and mu, when the map does.
	routeMu sync.RWMutex
	rmap    atomic.Pointer[keyspace.RangeMap]

	// recordsOnly is set once a node answered a batch-form append as an
	// older server does (it does not know AppendRequest.batch and saw no
	// records): the producer sends the records form from then on.
	recordsOnly atomic.Bool

	budget   *byteBudget
	flushing atomic.Int32

	mu          sync.Mutex // guards the fields below and driver creation
	closed      bool
	closing     chan struct{}
	outstanding int
	idle        chan struct{} // closed when outstanding drops to 0
}

// NewProducer returns a producer for stream. The stream's range count is
// learned (once, with DescribeStream) by the first Produce.
func (c *Client) NewProducer(stream string, opts ...ProducerOpt) (*Producer, error) {
	if stream == "" {
		return nil, fmt.Errorf("client: empty stream name")
	}
	cfg := defaultProducerConfig(&c.cfg)
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// A batch travels in one gRPC message together with its framing; keep
	// a generous margin below the message bound.
	if cfg.batchBytesMax > c.cfg.messageBytesMax-(64<<10) {
		return nil, fmt.Errorf("client: BatchBytesMax %d does not fit MessageBytesMax %d with 64 KiB to spare",
			cfg.batchBytesMax, c.cfg.messageBytesMax)
	}
	var sealer *e2e.Sealer
	if cfg.seal {
		var err error
		if sealer, err = e2e.NewSealer(cfg.sealKeys, cfg.sealHeaders...); err != nil {
			return nil, fmt.Errorf("client: SealWith: %w", err)
		}
	}
	id := cfg.producerID
	if id == 0 {
		id = randomProducerID()
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Producer{
		c:       c,
		stream:  stream,
		cfg:     cfg,
		log:     c.log.Named("producer").With("stream", stream, "producer_id", id),
		id:      id,
		sealer:  sealer,
		ctx:     ctx,
		cancel:  cancel,
		budget:  newByteBudget(&cfg),
		closing: make(chan struct{}),
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		cancel()
		return nil, ErrClosed
	}
	c.producers[p] = struct{}{}
	return p, nil
}

// ID returns the producer's initial producer id. A range that had to drop
// batches continues under a fresh id (see the package doc).
func (p *Producer) ID() uint64 { return p.id }

// Stream returns the stream the producer appends to.
func (p *Producer) Stream() string { return p.stream }

// Produce appends rec asynchronously and calls cb exactly once with where it
// landed or why it failed. cb runs on the range's goroutine, in offset order
// for the range, and must not block; it may run before Produce returns (for
// records failed up front). Produce blocks while the producer's bound is
// reached (QueueDelayTarget, BufferedBytesMax; with FailWhenFull the record
// fails at once with ErrBufferFull instead) and, for the first record,
// while the stream is described.
//
// ctx bounds the record until it is sent: cancelling it fails a record still
// buffered. Its deadline, and the delivery timeout, bound the record always,
// even while in flight (see ErrDeliveryTimeout).
func (p *Producer) Produce(ctx context.Context, rec *Record, cb func(ProduceResult, error)) {
	if cb == nil {
		cb = func(ProduceResult, error) {}
	}
	if rec == nil {
		cb(ProduceResult{}, apierr.New(apierr.InvalidArgument, "nil record"))
		return
	}
	now := time.Now()
	wire, size, err := p.prepare(rec, now)
	if err != nil {
		cb(ProduceResult{Record: rec}, err)
		return
	}
	var deadline time.Time
	if p.cfg.deliveryTimeout > 0 {
		deadline = now.Add(p.cfg.deliveryTimeout)
	}
	if d, ok := ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d
	}
	rangeCount, err := p.describe(ctx, deadline)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			// The delivery timeout ran out while the stream was being
			// described (its first record, on a slow server): the same
			// outcome as running out later.
			err = fmt.Errorf("%w while describing the stream: %v", ErrDeliveryTimeout, err)
		}
		cb(ProduceResult{Record: rec}, err)
		return
	}
	if err := p.budget.acquire(ctx, int64(size), p.closing, deadline); err != nil {
		cb(ProduceResult{Record: rec}, err)
		return
	}
	pr := &promisedRecord{rec: rec, wire: wire, cb: cb, ctx: ctx, deadline: deadline, enqueued: now, sizeBytes: size}
	p.routeMu.RLock()
	rng := p.route(rec.Key, rangeCount) // split.go
	if len(rec.Key) == 0 {
		p.tookSticky(rng, size)
	}
	d := p.driver(rng)
	if d == nil || !p.addOutstanding() {
		p.routeMu.RUnlock()
		p.budget.drop(int64(size))
		cb(ProduceResult{Record: rec}, ErrClosed)
		return
	}
	if ctx.Done() != nil {
		// Wake the driver to drop the record if ctx ends while it is
		// still buffered; stopped when the record completes.
		pr.stopCtx = context.AfterFunc(ctx, d.requestSweep)
	}
	enqueued := d.enqueue(pr)
	p.routeMu.RUnlock()
	if !enqueued {
		if pr.stopCtx != nil {
			pr.stopCtx()
		}
		p.budget.drop(int64(size))
		cb(ProduceResult{Record: rec}, ErrClosed)
		p.doneRecords(1)
	}
}

// prepare stamps rec's producer time if it has none and returns the record
// to send (rec, or its sealed form with SealWith) and its size, or why it
// cannot be sent.
func (p *Producer) prepare(rec *Record, now time.Time) (wire *Record, size int, err error) {
	if rec.ProducerTime.IsZero() {
		rec.ProducerTime = now
	}
	wire = rec
	// A tombstone has no value to seal and must stay a tombstone: it goes
	// as it is, its key in clear like every record's.
	if p.sealer != nil && !rec.Tombstone {
		// Sealed here, once, on the caller's goroutine: a resent batch
		// must carry the same bytes under its sequence numbers.
		if wire, err = p.seal(rec); err != nil {
			return nil, 0, err
		}
	}
	size = wire.sizeBytes()
	if size > p.cfg.batchBytesMax {
		return nil, 0, apierr.New(apierr.RecordTooLarge,
			"record of %d bytes exceeds the producer's batch bound of %d bytes", size, p.cfg.batchBytesMax)
	}
	return wire, size, nil
}

// ProduceSync produces recs and waits for all of them. results[i] belongs to
// recs[i]; err is the first failure in recs order (nil if all succeeded), and
// a failed record's result holds only its Record.
func (p *Producer) ProduceSync(ctx context.Context, recs ...*Record) (results []ProduceResult, err error) {
	results = make([]ProduceResult, len(recs))
	errs := make([]error, len(recs))
	var wg sync.WaitGroup
	wg.Add(len(recs))
	for i, rec := range recs {
		p.Produce(ctx, rec, func(res ProduceResult, err error) {
			results[i], errs[i] = res, err
			wg.Done()
		})
	}
	wg.Wait()
	for _, e := range errs {
		if e != nil {
			return results, e
		}
	}
	return results, nil
}

// Flush sends buffered records without waiting for a linger and waits until
// every record produced before or during the call has completed (its callback
// has returned), or ctx ends.
func (p *Producer) Flush(ctx context.Context) error {
	p.flushing.Add(1)
	defer p.flushing.Add(-1)
	p.wakeAll()
	p.mu.Lock()
	if p.outstanding == 0 {
		p.mu.Unlock()
		return nil
	}
	idle := p.idle
	p.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops the producer: later Produce calls fail with ErrClosed, and so
// does every record not yet acknowledged (one that was sent may still have
// been appended). Call Flush first to deliver what is buffered. Close waits
// for the range goroutines (and so for callbacks) to finish.
func (p *Producer) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.closing)
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
	p.c.mu.Lock()
	delete(p.c.producers, p)
	p.c.mu.Unlock()
}

// RangeCount returns the stream's range count, describing the stream on
// first use (Produce does the same for the first record).
func (p *Producer) RangeCount(ctx context.Context) (uint32, error) {
	return p.describe(ctx, time.Time{})
}

// describe returns the stream's range count, asking the server the first
// time. Concurrent first callers wait for one DescribeStream.
func (p *Producer) describe(ctx context.Context, deadline time.Time) (uint32, error) {
	if n := p.rangeCount.Load(); n != 0 {
		return n, nil
	}
	p.metaMu.Lock()
	defer p.metaMu.Unlock()
	if n := p.rangeCount.Load(); n != 0 {
		return n, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(p.ctx, cancel)
	defer stop()
	if !deadline.IsZero() {
		var cancelDeadline context.CancelFunc
		ctx, cancelDeadline = context.WithDeadline(ctx, deadline)
		defer cancelDeadline()
	}
	desc, err := p.c.DescribeStream(ctx, p.stream)
	if err != nil {
		if p.ctx.Err() != nil {
			return 0, ErrClosed
		}
		return 0, err
	}
	n := desc.Stream.RangeCount
	p.drivers = make([]atomic.Pointer[rangeDriver], n)
	if desc.RangeMapVersion > 0 {
		// The stream has split: route by its map from the first record.
		m, err := desc.RangeMap()
		if err != nil {
			return 0, err
		}
		p.routeMu.Lock()
		p.setMapLocked(m)
		p.routeMu.Unlock()
	}
	p.sticky.Store(rand.Uint32N(n))
	p.rangeCount.Store(n)
	return n, nil
}

// driver returns the driver of range rng, starting it on first use; nil once
// the producer is closed.
func (p *Producer) driver(rng uint32) *rangeDriver {
	if d := p.drivers[rng].Load(); d != nil {
		return d
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	if d := p.drivers[rng].Load(); d != nil {
		return d
	}
	d := newRangeDriver(p, rng)
	p.drivers[rng].Store(d)
	p.wg.Add(1)
	go d.run()
	return d
}

func (p *Producer) wakeAll() {
	if p.rangeCount.Load() == 0 {
		return
	}
	p.routeMu.RLock()
	defer p.routeMu.RUnlock()
	for i := range p.drivers {
		if d := p.drivers[i].Load(); d != nil {
			d.poke()
		}
	}
}

// stickyBytesMax is how many bytes of keyless records the sticky range
// takes before they move on (or BatchBytesMax, if smaller): Kafka's
// batch.size default, as its uniform sticky partitioner (KIP-794)
// switches after producing batch.size bytes to a partition.
const stickyBytesMax = 16 << 10

// tookSticky counts n bytes of a keyless record routed to range rng and,
// once the sticky range took stickyBytesMax since it became sticky, moves
// keyless records on to another range at random. Below capacity, records
// that gather behind the sticky range's batch in flight go out together;
// moving on after every batch a range cut (the rule before) sent each
// keyless record of a producer below capacity in an append of its own to
// whichever range was idle (with linger 0 the batch an idle range cuts is
// its first record): some 400 appends/s for a producer of 500 records/s
// over 8 ranges, each costing the region a Raft round and three
// fdatasyncs. At full speed it still spreads a producer over the ranges
// every 16 KiB, so every range's pipeline stays full.
func (p *Producer) tookSticky(rng uint32, n int) {
	count := p.rangeCount.Load()
	if count <= 1 || p.sticky.Load() != rng {
		return
	}
	if p.stickyTaken.Add(int64(n)) < int64(min(stickyBytesMax, p.cfg.batchBytesMax)) {
		return
	}
	next := (rng + 1 + rand.Uint32N(count-1)) % count
	if p.sticky.CompareAndSwap(rng, next) {
		p.stickyTaken.Store(0)
	}
}

// addOutstanding counts one more record in the producer; false once closed.
func (p *Producer) addOutstanding() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	if p.outstanding == 0 {
		p.idle = make(chan struct{})
	}
	p.outstanding++
	return true
}

// doneRecords uncounts count completed records. It is called after their
// callbacks returned, so that Flush returning implies the callbacks did.
func (p *Producer) doneRecords(count int) {
	p.mu.Lock()
	p.outstanding -= count
	if p.outstanding < 0 {
		panic("client: producer outstanding record count went negative")
	}
	if p.outstanding == 0 {
		close(p.idle)
	}
	p.mu.Unlock()
}

func randomProducerID() uint64 {
	var b [8]byte
	for {
		if _, err := crand.Read(b[:]); err != nil {
			panic(fmt.Sprintf("client: crypto/rand: %v", err))
		}
		if id := binary.LittleEndian.Uint64(b[:]); id != 0 {
			return id
		}
	}
}

// byteBudget bounds the bytes of buffered records: all of them (produced
// and not yet acknowledged or failed) by BufferedBytesMax, and, with the
// queueing-delay bound (delay, QueueDelayTarget; nil: off), the unsent
// ones (not yet cut into a batch) by its bound and all by twice that.
type byteBudget struct {
	mu        sync.Mutex
	usedBytes int64 // held: unsent and in flight
	// unsentBytes are the records produced and not yet cut into a batch
	// (nor dropped).
	unsentBytes int64
	max         int64
	delay       *delayLimit
	failFast    bool // FailWhenFull: refuse instead of waiting
	waiting     bool
	freed       chan struct{} // closed and replaced on a release while waiting
}

func newByteBudget(cfg *producerConfig) *byteBudget {
	b := &byteBudget{max: cfg.bufferedBytesMax, failFast: cfg.failWhenFull, freed: make(chan struct{})}
	if cfg.queueDelayTarget > 0 {
		b.delay = newDelayLimit(cfg.queueDelayTarget, cfg.bufferedBytesMax)
	}
	return b
}

// fitsLocked reports whether n more bytes fit both bounds, and if not the
// bytes counted against the one that binds and its limit. A record larger
// than a bound is let through when nothing counts against that bound.
func (b *byteBudget) fitsLocked(n int64) (ok bool, used, limit int64) {
	if b.usedBytes > 0 && b.usedBytes+n > b.max {
		return false, b.usedBytes, b.max
	}
	if b.delay != nil && b.unsentBytes > 0 && b.unsentBytes+n > b.delay.limit() {
		return false, b.unsentBytes, b.delay.limit()
	}
	if b.delay != nil && b.usedBytes > 0 && b.usedBytes+n > b.delay.heldLimit() {
		return false, b.usedBytes, b.delay.heldLimit()
	}
	return true, 0, 0
}

// acquire takes n unsent bytes, blocking while they do not fit (or failing
// at once with ErrBufferFull, with FailWhenFull).
func (b *byteBudget) acquire(ctx context.Context, n int64, closing <-chan struct{}, deadline time.Time) error {
	var timeout <-chan time.Time
	for {
		b.mu.Lock()
		ok, used, limit := b.fitsLocked(n)
		if ok {
			b.usedBytes += n
			b.unsentBytes += n
			b.mu.Unlock()
			return nil
		}
		if b.failFast {
			b.mu.Unlock()
			return bufferFull(used, limit, b.delay)
		}
		b.waiting = true
		freed := b.freed
		b.mu.Unlock()
		if timeout == nil && !deadline.IsZero() {
			t := time.NewTimer(time.Until(deadline))
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-freed:
		case <-ctx.Done():
			return ctx.Err()
		case <-closing:
			return ErrClosed
		case <-timeout:
			// deadline is the earlier of ctx's and the delivery timeout's;
			// say which one passed.
			if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
				return context.DeadlineExceeded
			}
			return fmt.Errorf("%w: waiting for buffer space", ErrDeliveryTimeout)
		}
	}
}

// bufferFull is FailWhenFull's refusal: a retriable OVERLOADED whose cause
// is ErrBufferFull, asking for a wait of the delay target (about the time
// the producer takes to send what it holds).
func bufferFull(used, limit int64, delay *delayLimit) error {
	e := apierr.Wrap(apierr.Overloaded, ErrBufferFull, "producer holds %d bytes against a bound of %d", used, limit)
	if delay != nil {
		e.RetryAfter = delay.target
	}
	return e
}

// dequeue counts n bytes as no longer unsent: cut into a batch, or dropped
// before that (then release follows).
func (b *byteBudget) dequeue(n int64) {
	b.mu.Lock()
	b.unsentBytes -= n
	if b.unsentBytes < 0 {
		panic("client: unsent bytes went negative")
	}
	b.wakeLocked()
	b.mu.Unlock()
}

// requeue counts n bytes sent but not acknowledged as unsent again: they
// go back into a queue to be cut and sent once more (a split range's
// in-flight records handed to its children).
func (b *byteBudget) requeue(n int64) {
	b.mu.Lock()
	b.unsentBytes += n
	if b.unsentBytes > b.usedBytes {
		panic("client: unsent bytes went above the buffered bytes")
	}
	b.mu.Unlock()
}

// release returns n bytes no longer unsent; acked says they were
// acknowledged at now (the queueing-delay bound measures the rate of
// those).
func (b *byteBudget) release(n int64, acked bool, now time.Time) {
	b.mu.Lock()
	b.usedBytes -= n
	if b.usedBytes < b.unsentBytes {
		panic("client: buffered bytes went below the unsent bytes")
	}
	if acked && b.delay != nil {
		b.delay.acked(n, now)
	}
	b.wakeLocked()
	b.mu.Unlock()
}

// netRoundTrip records a batch's network round trip (its round trip less
// the server's reported time) for the queueing-delay bound.
func (b *byteBudget) netRoundTrip(d time.Duration, now time.Time) {
	if b.delay == nil {
		return
	}
	b.mu.Lock()
	b.delay.netRoundTrip(d, now)
	b.mu.Unlock()
}

// drop returns n bytes that were never sent: dequeue and release.
func (b *byteBudget) drop(n int64) {
	b.dequeue(n)
	b.release(n, false, time.Time{})
}

func (b *byteBudget) wakeLocked() {
	if b.waiting {
		b.waiting = false
		close(b.freed)
		b.freed = make(chan struct{})
	}
}
