package client

import (
	"context"
	"errors"
	"testing"
	"time"
)

// ackAt feeds l acknowledgements of n bytes, each served in service,
// every step for count steps from *now, advancing *now.
func ackAt(l *delayLimit, now *time.Time, n int64, service, step time.Duration, count int) {
	for range count {
		*now = now.Add(step)
		l.acked(n, service, *now)
	}
}

// TestDelayLimitFollowsTheRate: the bound starts at one batch, moves at
// most a factor of two per window towards rate × (base + target), and
// stays within [floor, ceiling].
func TestDelayLimitFollowsTheRate(t *testing.T) {
	const target = 100 * time.Millisecond
	l := newDelayLimit(target, 1<<20, 64<<20)
	if got := l.limit(); got != 1<<20 {
		t.Fatalf("starts at %d, want one batch, %d", got, 1<<20)
	}
	now := time.Unix(1000, 0)
	l.acked(1<<20, 0, now) // opens the first window only
	if got := l.limit(); got != 1<<20 {
		t.Fatalf("first ack moved the bound to %d", got)
	}
	// 50 MB/s (5 MiB per 100 ms), no base: rate × target is 5 MiB. One
	// window doubles the bound; the next reaches 4 MiB; the third 5 MiB.
	ackAt(l, &now, 512<<10, 0, 10*time.Millisecond, 10)
	if got := l.limit(); got != 2<<20 {
		t.Fatalf("after one window %d, want 2 MiB (at most doubled)", got)
	}
	ackAt(l, &now, 512<<10, 0, 10*time.Millisecond, 20)
	if got := l.limit(); got != 5<<20 {
		t.Fatalf("after three windows %d, want 5 MiB (rate × target)", got)
	}
	// The rate drops to 5 MB/s: halving per window, down to 512 KiB.
	ackAt(l, &now, 512<<10, 0, 100*time.Millisecond, 1)
	if got := l.limit(); got != 5<<19 {
		t.Fatalf("after a slow window %d, want 2.5 MiB (at most halved)", got)
	}
	ackAt(l, &now, 512<<10, 0, 100*time.Millisecond, 5)
	if got := l.limit(); got != 512<<10 {
		t.Fatalf("at 5 MB/s %d, want 512 KiB", got)
	}
	// Nearly nothing acknowledged: down to the floor, 64 KiB.
	ackAt(l, &now, 1, 0, 100*time.Millisecond, 10)
	if got := l.limit(); got != 64<<10 {
		t.Fatalf("at 10 B/s %d, want the floor", got)
	}
	// 10 GB/s: capped at the ceiling.
	ackAt(l, &now, 64<<20, 0, 10*time.Millisecond, 200)
	if got := l.limit(); got != 64<<20 {
		t.Fatalf("at 10 GB/s %d, want the ceiling", got)
	}
	// A window shorter than the target does not move the bound.
	before := l.limit()
	ackAt(l, &now, 0, 0, 10*time.Millisecond, 9)
	if got := l.limit(); got != before {
		t.Fatalf("moved within a window: %d, was %d", got, before)
	}
}

// TestDelayLimitBase: a stream whose service time alone exceeds the target
// (a remote leader) gets rate × base, not rate × target (records cannot
// wait less than the batch ahead of them takes), and the base is the least
// service time of the last 5-10 s.
func TestDelayLimitBase(t *testing.T) {
	const target = 100 * time.Millisecond
	l := newDelayLimit(target, 1<<20, 64<<20)
	now := time.Unix(1000, 0)
	// 10 MB/s (1 MiB per 100 ms), each batch served in 150 ms at least:
	// rate × 150 ms is 1.5 MiB.
	ackAt(l, &now, 256<<10, 150*time.Millisecond, 25*time.Millisecond, 100)
	if got := l.limit(); got != 3<<19 {
		t.Fatalf("bound %d, want 1.5 MiB", got)
	}
	// A fast batch lowers the base; it is forgotten 5-10 s later.
	ackAt(l, &now, 256<<10, 0, 25*time.Millisecond, 1)
	ackAt(l, &now, 256<<10, 150*time.Millisecond, 25*time.Millisecond, 100)
	if got := l.limit(); got != 1<<20 {
		t.Fatalf("bound %d with a base of 0, want 1 MiB (rate × target)", got)
	}
	ackAt(l, &now, 256<<10, 150*time.Millisecond, 25*time.Millisecond, 400)
	if got := l.limit(); got != 3<<19 {
		t.Fatalf("bound %d 10 s after the fast batch, want 1.5 MiB", got)
	}
}

// atCapacity runs a model of a range at capacity for rounds round trips:
// each round the range sends what the bound let gather (one batch of
// limit bytes), served in fixed + limit/rate, every batch alike so that
// the base is the round trip itself (queueing behind the producer's own
// bytes). It returns the last round trip.
func atCapacity(l *delayLimit, fixed time.Duration, bytesPerSecond float64, rounds int) time.Duration {
	now := time.Unix(1000, 0)
	var rtt time.Duration
	for range rounds {
		b := l.limit()
		rtt = fixed + time.Duration(float64(b)/bytesPerSecond*float64(time.Second))
		now = now.Add(rtt)
		l.acked(b, rtt, now)
	}
	return rtt
}

// TestDelayLimitAtCapacity: at full speed the batch a range sends is what
// the bound let gather, so the bound settles where a batch's round trip is
// about the target (a record waits about one round trip to be sent and one
// in flight), and does not ratchet up with a base that is the round trip
// itself (rate × (base + target) would grow by 1 + target/base per window
// to BufferedBytesMax: seconds of queue). Nor does it collapse to the
// floor when the fixed part of the round trip exceeds the target (a remote
// leader): there the bound stays where it was.
func TestDelayLimitAtCapacity(t *testing.T) {
	const target = 100 * time.Millisecond
	const rate = 50e6 // what the server takes, bytes/s
	l := newDelayLimit(target, 1<<20, 64<<20)
	rtt := atCapacity(l, 20*time.Millisecond, rate, 500)
	if rtt < target*3/4 || rtt > target*5/4 {
		t.Fatalf("round trip settled at %v (bound %d B), want about the target %v", rtt, l.limit(), target)
	}
	l = newDelayLimit(target, 1<<20, 64<<20)
	rtt = atCapacity(l, 150*time.Millisecond, rate, 500)
	if l.limit() < 1<<19 || rtt > 250*time.Millisecond {
		t.Fatalf("remote leader: bound %d B, round trip %v; want about one batch, 1 MiB, and under 250 ms", l.limit(), rtt)
	}
}

// TestDelayLimitSmallBatches: with a batch bound below 64 KiB, the floor
// and the start are 64 KiB (several small batches pipeline); a ceiling
// below them wins.
func TestDelayLimitSmallBatches(t *testing.T) {
	if l := newDelayLimit(time.Second, 16<<10, 1<<20); l.limit() != 64<<10 || l.floorBytes != 64<<10 {
		t.Fatalf("limit %d floor %d, want 64 KiB", l.limit(), l.floorBytes)
	}
	if l := newDelayLimit(time.Second, 16<<10, 32<<10); l.limit() != 32<<10 || l.floorBytes != 32<<10 {
		t.Fatalf("limit %d floor %d, want the ceiling", l.limit(), l.floorBytes)
	}
	if l := newDelayLimit(time.Second, 4<<20, 1<<20); l.limit() != 1<<20 {
		t.Fatalf("limit %d, want the ceiling", l.limit())
	}
}

// TestByteBudgetBoundByDelay: the budget refuses unsent bytes past the
// delay bound though BufferedBytesMax has room: it blocks until bytes are
// sent (a batch is cut), or with FailWhenFull fails at once with a
// retriable OVERLOADED caused by ErrBufferFull.
func TestByteBudgetBoundByDelay(t *testing.T) {
	cfg := producerConfig{batchBytesMax: 1000, bufferedBytesMax: 1 << 20, queueDelayTarget: 50 * time.Millisecond}
	b := newByteBudget(&cfg)
	ctx := context.Background()
	if err := b.acquire(ctx, 64<<10, nil, time.Time{}); err != nil { // the bound starts at 64 KiB
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- b.acquire(ctx, 1, nil, time.Time{}) }()
	select {
	case err := <-got:
		t.Fatalf("acquire past the delay bound returned %v, want it to block", err)
	case <-time.After(20 * time.Millisecond):
	}
	b.dequeue(64 << 10)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("acquire still blocked after the unsent bytes were sent")
	}

	cfg.failWhenFull = true
	b = newByteBudget(&cfg)
	if err := b.acquire(ctx, 64<<10, nil, time.Time{}); err != nil {
		t.Fatal(err)
	}
	err := b.acquire(ctx, 1, nil, time.Time{})
	if !errors.Is(err, ErrBufferFull) || CodeOf(err) != CodeOverloaded || !IsRetriable(err) || RetryAfter(err) != cfg.queueDelayTarget {
		t.Fatalf("got %v (retry after %v), want a retriable OVERLOADED of ErrBufferFull", err, RetryAfter(err))
	}

	// Off: only BufferedBytesMax binds.
	cfg.queueDelayTarget, cfg.failWhenFull = 0, true
	b = newByteBudget(&cfg)
	if err := b.acquire(ctx, 1<<20, nil, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := b.acquire(ctx, 1, nil, time.Time{}); !errors.Is(err, ErrBufferFull) || RetryAfter(err) != 0 {
		t.Fatalf("got %v past BufferedBytesMax, want ErrBufferFull", err)
	}
}

// TestByteBudgetCountsUnsentOnly: bytes in flight (sent, not yet
// acknowledged) do not count against the delay bound, so a producer below
// capacity, with a batch in flight and the next gathering behind it, is
// not refused; BufferedBytesMax still bounds all bytes held, and an
// acknowledgement or a dropped record frees them.
func TestByteBudgetCountsUnsentOnly(t *testing.T) {
	cfg := producerConfig{batchBytesMax: 1000, bufferedBytesMax: 192 << 10, queueDelayTarget: 50 * time.Millisecond, failWhenFull: true}
	b := newByteBudget(&cfg)
	ctx := context.Background()
	if err := b.acquire(ctx, 64<<10, nil, time.Time{}); err != nil {
		t.Fatal(err)
	}
	b.dequeue(64 << 10) // cut and sent: in flight
	if err := b.acquire(ctx, 64<<10, nil, time.Time{}); err != nil {
		t.Fatalf("64 KiB unsent behind 64 KiB in flight refused: %v", err)
	}
	b.dequeue(64 << 10)
	if err := b.acquire(ctx, 64<<10, nil, time.Time{}); err != nil {
		t.Fatalf("64 KiB unsent behind 128 KiB in flight refused: %v", err)
	}
	b.dequeue(64 << 10)
	// 192 KiB in flight: BufferedBytesMax binds, though nothing is unsent.
	if err := b.acquire(ctx, 1, nil, time.Time{}); !errors.Is(err, ErrBufferFull) {
		t.Fatalf("got %v past BufferedBytesMax, want ErrBufferFull", err)
	}
	b.release(64<<10, true, time.Unix(1000, 0), time.Millisecond)
	b.release(64<<10, true, time.Unix(1000, 0), time.Millisecond)
	if err := b.acquire(ctx, 60<<10, nil, time.Time{}); err != nil {
		t.Fatalf("after an acknowledgement: %v", err)
	}
	if err := b.acquire(ctx, 5<<10, nil, time.Time{}); !errors.Is(err, ErrBufferFull) {
		t.Fatalf("got %v past the delay bound, want ErrBufferFull", err)
	}
	b.drop(60 << 10) // expired while unsent
	if err := b.acquire(ctx, 5<<10, nil, time.Time{}); err != nil {
		t.Fatalf("after a drop: %v", err)
	}
	if b.unsentBytes != 5<<10 || b.usedBytes != 64<<10+5<<10 {
		t.Fatalf("unsent %d held %d, want 5 KiB and 69 KiB", b.unsentBytes, b.usedBytes)
	}
}
