package client

import (
	"context"
	"errors"
	"testing"
	"time"
)

// ackAt feeds l acknowledgements of n bytes every step for count steps
// from *now, advancing *now.
func ackAt(l *delayLimit, now *time.Time, n int64, step time.Duration, count int) {
	for range count {
		*now = now.Add(step)
		l.acked(n, *now)
	}
}

// TestDelayLimitFollowsTheRate: the bound starts at the floor, moves at
// most a factor of two per window towards rate × target, and stays within
// [floor, ceiling]; the bound on bytes held is twice it.
func TestDelayLimitFollowsTheRate(t *testing.T) {
	const target = 100 * time.Millisecond
	l := newDelayLimit(target, 64<<20)
	if got := l.limit(); got != 64<<10 || l.heldLimit() != 128<<10 {
		t.Fatalf("starts at %d (held %d), want 64 KiB (128 KiB)", got, l.heldLimit())
	}
	now := time.Unix(1000, 0)
	l.acked(1<<20, now) // opens the first window only
	if got := l.limit(); got != 64<<10 {
		t.Fatalf("first ack moved the bound to %d", got)
	}
	// 50 MB/s (5 MiB per 100 ms): rate × target is 5 MiB. One window
	// doubles the bound; six more reach 5 MiB.
	ackAt(l, &now, 512<<10, 10*time.Millisecond, 10)
	if got := l.limit(); got != 128<<10 {
		t.Fatalf("after one window %d, want 128 KiB (at most doubled)", got)
	}
	ackAt(l, &now, 512<<10, 10*time.Millisecond, 60)
	if got := l.limit(); got != 5<<20 || l.heldLimit() != 10<<20 {
		t.Fatalf("after seven windows %d (held %d), want 5 MiB (rate × target) and 10 MiB", got, l.heldLimit())
	}
	// The rate drops to 5 MB/s: halving per window, down to 512 KiB.
	ackAt(l, &now, 512<<10, 100*time.Millisecond, 1)
	if got := l.limit(); got != 5<<19 {
		t.Fatalf("after a slow window %d, want 2.5 MiB (at most halved)", got)
	}
	ackAt(l, &now, 512<<10, 100*time.Millisecond, 5)
	if got := l.limit(); got != 512<<10 {
		t.Fatalf("at 5 MB/s %d, want 512 KiB", got)
	}
	// Nearly nothing acknowledged: down to the floor, 64 KiB.
	ackAt(l, &now, 1, 100*time.Millisecond, 10)
	if got := l.limit(); got != 64<<10 {
		t.Fatalf("at 10 B/s %d, want the floor", got)
	}
	// 10 GB/s: capped at the ceiling.
	ackAt(l, &now, 64<<20, 10*time.Millisecond, 200)
	if got := l.limit(); got != 64<<20 {
		t.Fatalf("at 10 GB/s %d, want the ceiling", got)
	}
	// A window shorter than the target does not move the bound.
	before := l.limit()
	ackAt(l, &now, 0, 10*time.Millisecond, 9)
	if got := l.limit(); got != before {
		t.Fatalf("moved within a window: %d, was %d", got, before)
	}
}

// atCapacity runs a model of a range at capacity for rounds round trips:
// each round the range sends what the bound let gather (one batch of
// limit bytes); its round trip is the network's part, net(limit), plus
// the server's, fixed + limit/rate (the batch queues behind the producer's
// own bytes), which the server reports. It returns the last round trip.
func atCapacity(l *delayLimit, net func(int64) time.Duration, fixed time.Duration, bytesPerSecond float64, rounds int) time.Duration {
	now := time.Unix(1000, 0)
	var rtt time.Duration
	for range rounds {
		b := l.limit()
		n := net(b)
		rtt = n + fixed + time.Duration(float64(b)/bytesPerSecond*float64(time.Second))
		now = now.Add(rtt)
		l.netRoundTrip(n, now)
		l.acked(b, now)
	}
	return rtt
}

// flat is a network round trip that does not depend on the batch.
func flat(d time.Duration) func(int64) time.Duration { return func(int64) time.Duration { return d } }

// TestDelayLimitAtCapacity: at full speed the batch a range sends is what
// the bound let gather, so the bound settles where a batch spends about
// the target on the server (a record waits about one round trip to be sent
// and one in flight), from above (a bound of 1 MiB, a 0.5 s round trip
// here) as from below (64 KiB, 21 ms), and when the network's part grows
// with the batch (its transfer). A bound of rate × (base + target), with
// the base the least round trip of the producer's own batches, would grow
// without end here (to BufferedBytesMax: seconds of queue), and one of
// rate × max(base, target) would stay at 1 MiB: the base is the network's
// part alone. A leader whose network round trip alone exceeds the target
// (a remote one) is not held at the floor: the bound covers that round
// trip and the target.
func TestDelayLimitAtCapacity(t *testing.T) {
	const target = 100 * time.Millisecond
	lan := flat(200 * time.Microsecond)
	transfer := func(b int64) time.Duration {
		return 200*time.Microsecond + time.Duration(float64(b)/100e6*float64(time.Second))
	}
	for _, c := range []struct {
		name  string
		net   func(int64) time.Duration
		fixed time.Duration
		rate  float64 // what the server takes, bytes/s
		start int64
	}{
		{"bound starts below", lan, 20 * time.Millisecond, 50e6, 64 << 10},
		{"bound starts above", lan, 20 * time.Millisecond, 2e6, 1 << 20},
		{"transfer time", transfer, 20 * time.Millisecond, 50e6, 1 << 20},
	} {
		l := newDelayLimit(target, 64<<20)
		l.limitBytes = c.start
		rtt := atCapacity(l, c.net, c.fixed, c.rate, 500)
		if rtt < target*3/4 || rtt > target*5/4+c.net(l.limit()) {
			t.Errorf("%s: round trip settled at %v (bound %d B), want about the target %v", c.name, rtt, l.limit(), target)
		}
	}
	// 150 ms of network, 5 ms on the server: the server's part settles
	// at about the target (95 ms: a batch of about 4.75 MB at 50 MB/s).
	l := newDelayLimit(target, 64<<20)
	const wan = 150 * time.Millisecond
	rtt := atCapacity(l, flat(wan), 5*time.Millisecond, 50e6, 500)
	if l.base() != wan || l.limit() < 4<<20 || rtt < wan+target*3/4 || rtt > wan+target*5/4 {
		t.Errorf("remote leader: base %v, bound %d B, round trip %v; want a base of %v, a bound of MBs and a round trip of about %v",
			l.base(), l.limit(), rtt, wan, wan+target)
	}
}

// TestDelayLimitNetBase: the base is the least network round trip of the
// current span and the one before, forgets what is older, is 0 before any
// sample, and is capped.
func TestDelayLimitNetBase(t *testing.T) {
	l := newDelayLimit(50*time.Millisecond, 64<<20)
	if b := l.base(); b != 0 {
		t.Fatalf("base %v before any round trip", b)
	}
	now := time.Unix(1000, 0)
	l.netRoundTrip(80*time.Millisecond, now)
	l.netRoundTrip(60*time.Millisecond, now.Add(time.Second))
	l.netRoundTrip(90*time.Millisecond, now.Add(2*time.Second))
	if b := l.base(); b != 60*time.Millisecond {
		t.Fatalf("base %v, want the least, 60ms", b)
	}
	// A new span: the last one's least still counts.
	l.netRoundTrip(100*time.Millisecond, now.Add(netBaseSpan))
	if b := l.base(); b != 60*time.Millisecond {
		t.Fatalf("base %v one span on, want 60ms still", b)
	}
	// Two spans on: 60 ms is forgotten (the path changed).
	l.netRoundTrip(120*time.Millisecond, now.Add(2*netBaseSpan))
	if b := l.base(); b != 100*time.Millisecond {
		t.Fatalf("base %v two spans on, want 100ms", b)
	}
	l.netRoundTrip(-time.Second, now.Add(2*netBaseSpan+time.Second))
	if b := l.base(); b != 0 {
		t.Fatalf("base %v after a negative round trip, want 0", b)
	}
	m := newDelayLimit(50*time.Millisecond, 64<<20)
	m.netRoundTrip(time.Hour, now)
	if b := m.base(); b != netBaseMax {
		t.Fatalf("base %v, want the cap %v", b, netBaseMax)
	}
}

// TestDelayLimitCeiling: a BufferedBytesMax below 64 KiB is the floor and
// the start.
func TestDelayLimitCeiling(t *testing.T) {
	if l := newDelayLimit(time.Second, 32<<10); l.limit() != 32<<10 || l.floorBytes != 32<<10 {
		t.Fatalf("limit %d floor %d, want the ceiling", l.limit(), l.floorBytes)
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
// acknowledged) count against the delay bound's twice as large bound on
// bytes held, not against its bound on unsent bytes, so a producer below
// capacity, with a batch in flight and the next gathering behind it, is
// not refused; BufferedBytesMax still bounds all bytes held, and an
// acknowledgement or a dropped record frees them.
func TestByteBudgetCountsUnsentOnly(t *testing.T) {
	cfg := producerConfig{batchBytesMax: 1000, bufferedBytesMax: 96 << 10, queueDelayTarget: 50 * time.Millisecond, failWhenFull: true}
	b := newByteBudget(&cfg)
	ctx := context.Background()
	if err := b.acquire(ctx, 48<<10, nil, time.Time{}); err != nil {
		t.Fatal(err)
	}
	b.dequeue(48 << 10) // cut and sent: in flight
	if err := b.acquire(ctx, 48<<10, nil, time.Time{}); err != nil {
		t.Fatalf("48 KiB unsent behind 48 KiB in flight refused: %v", err)
	}
	// 96 KiB held: BufferedBytesMax binds.
	if err := b.acquire(ctx, 1, nil, time.Time{}); !errors.Is(err, ErrBufferFull) {
		t.Fatalf("got %v past BufferedBytesMax, want ErrBufferFull", err)
	}
	b.release(48<<10, true, time.Unix(1000, 0)) // 48 KiB unsent
	if err := b.acquire(ctx, 16<<10, nil, time.Time{}); err != nil {
		t.Fatalf("after an acknowledgement: %v", err)
	}
	if err := b.acquire(ctx, 1, nil, time.Time{}); !errors.Is(err, ErrBufferFull) {
		t.Fatalf("got %v past the unsent bound, want ErrBufferFull", err)
	}
	b.dequeue(64 << 10)
	b.drop(0)
	if err := b.acquire(ctx, 32<<10, nil, time.Time{}); err != nil {
		t.Fatalf("32 KiB unsent behind 64 KiB in flight: %v", err)
	}
	b.drop(32 << 10) // expired while unsent
	if b.unsentBytes != 0 || b.usedBytes != 64<<10 {
		t.Fatalf("unsent %d held %d, want 0 and 64 KiB", b.unsentBytes, b.usedBytes)
	}

	// Held bytes past twice the unsent bound are refused though nothing is
	// unsent: many ranges each with a batch in flight.
	cfg.bufferedBytesMax = 1 << 20
	b = newByteBudget(&cfg)
	for range 2 {
		if err := b.acquire(ctx, 64<<10, nil, time.Time{}); err != nil {
			t.Fatal(err)
		}
		b.dequeue(64 << 10)
	}
	if err := b.acquire(ctx, 1, nil, time.Time{}); !errors.Is(err, ErrBufferFull) {
		t.Fatalf("got %v with 128 KiB in flight, want ErrBufferFull (twice the unsent bound)", err)
	}
}
