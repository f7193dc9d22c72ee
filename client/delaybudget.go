package client

import "time"

// QueueDelayTargetDefault is QueueDelayTarget's default. 50 ms, not
// 100: at full speed a record waits about the target to be sent and as
// long again in flight, and in alternated bench_region runs 100 ms gave
// a p99 of 600-705 ms at full speed where 50 ms gave 254-324 ms, at the
// same records/s (notes/netbase.md).
const QueueDelayTargetDefault = 50 * time.Millisecond

// The network round trip's least value (netBase) is kept over two spans
// of netBaseSpan, the current one and the one before (so over the last
// 5-10 s), and counts for at most netBaseMax: a path no round trip of
// which came under that in 10 s is not a network's.
const (
	netBaseSpan = 5 * time.Second
	netBaseMax  = 2 * time.Second
)

// delayLimitFloorBytes is the least the queueing-delay bound goes down to
// (or BufferedBytesMax, if smaller), whatever the batch bound: a producer
// of small batches still pipelines several.
const delayLimitFloorBytes = 64 << 10

// delayLimit is the producer's queueing-delay bound (QueueDelayTarget): a
// bound on its unsent bytes (produced and not yet cut into a batch and
// sent) that follows how fast the stream acknowledges them, so that at
// full speed a record waits about the target before it is sent, not for as
// long as BufferedBytesMax takes to drain; and twice that bound on all the
// bytes it holds, unsent and in flight.
//
// By Little's law, the time a byte waits to be sent is the unsent bytes
// divided by the rate they leave, which in a steady state is the rate the
// stream acknowledges. So the bound is the acknowledged rate times the
// target, plus what the network's round trip adds (below).
//
// Why unsent bytes, not all bytes held (notes/sdkqueue.md): below capacity
// a range holds the batch in flight plus the records that gather behind
// it, about two round trips of records. A bound on both binds as soon as
// one round trip exceeds about half the target, on a loaded machine well
// below capacity; the blocked Produce then holds records back from the
// batch being cut and costs them a round trip more. Unsent bytes exceed
// rate × target only when a round trip itself exceeds the target, and so
// do the bytes held exceed twice that. The bound on the bytes held is
// still needed: a producer over many ranges has a batch in flight on each,
// and each cut frees unsent room, so unsent bytes alone let it put
// several bounds' worth in flight (bench_region at 01:50, full speed: p99
// 4.6 s).
//
// At full speed the batch a range cuts is what gathered within the bound,
// so a bound of B gives batches of about B and a round trip R(B) = N +
// S(B): the network's part N, and the server's S, which grows with B (the
// batch queues behind the producer's own bytes). The bound is the rate
// times (target + base), with the base the least network round trip seen
// lately: a batch's round trip less the server's own time for it, which
// the server reports with each acknowledgement (AppendResponse.timing).
// The rate is B/R(B) and the next bound B × (target + N)/(N + S(B)): it
// shrinks while the server's part exceeds the target and grows while it
// is less, settling where a batch spends about the target on the server
// (a record waits about one round trip to be sent and one in flight).
//
// The base must not be the least round trip of the producer's own batches
// (the bound this replaced): at full speed those queue behind each other
// on the server, the least round trip rises with the bound, and a bound of
// rate × (base + target) grows without end, rate × max(base, target)
// stays wherever it started (notes/sdkqueue.md). The network's part does
// not grow with the queue on the server, so it can enter the bound: a
// stream whose network round trip alone exceeds the target (a remote
// leader) keeps a round trip's worth of records gathering behind its
// batch in flight, instead of being held at the floor. A server that
// reports no times (an older one) leaves the base at zero: the bound is
// then rate × target, and a remote leader is held near the floor.
//
// The bound moves by at most a factor of two per window, up or down, so
// that one noisy window (a pause, a burst of acknowledgements) does not
// swing it; a window lasts at least target + base. It starts at 64 KiB (a
// producer's first second is not queued behind a bound far above its
// rate: the bound doubles per window until it covers the rate) and stays
// within [64 KiB, BufferedBytesMax].
//
// delayLimit is a deterministic core: the caller passes the time in and
// serializes calls (byteBudget's mutex).
type delayLimit struct {
	target      time.Duration
	floorBytes  int64
	ceilBytes   int64
	limitBytes  int64
	windowStart time.Time // zero until the first acknowledgement
	windowBytes int64     // acknowledged since windowStart

	// The least network round trip in the current span (from netStart)
	// and in the span before it; negative: none seen.
	netStart        time.Time
	netCur, netPrev time.Duration
}

func newDelayLimit(target time.Duration, ceilBytes int64) *delayLimit {
	floorBytes := min(delayLimitFloorBytes, ceilBytes)
	return &delayLimit{
		target:     target,
		floorBytes: floorBytes,
		ceilBytes:  ceilBytes,
		limitBytes: floorBytes,
		netCur:     -1,
		netPrev:    -1,
	}
}

// limit returns the current bound on unsent bytes.
func (l *delayLimit) limit() int64 { return l.limitBytes }

// heldLimit returns the current bound on all bytes held, unsent and in
// flight: twice the unsent bound (see delayLimit).
func (l *delayLimit) heldLimit() int64 { return 2 * l.limitBytes }

// netRoundTrip records a batch's network round trip at now: its round
// trip less the time the server reported spending on it.
func (l *delayLimit) netRoundTrip(d time.Duration, now time.Time) {
	d = min(max(d, 0), netBaseMax)
	if l.netStart.IsZero() || now.Sub(l.netStart) >= netBaseSpan {
		l.netStart, l.netPrev, l.netCur = now, l.netCur, d
		return
	}
	if l.netCur < 0 || d < l.netCur {
		l.netCur = d
	}
}

// base is the least network round trip of the last one to two spans (0
// when none was seen).
func (l *delayLimit) base() time.Duration {
	b := l.netCur
	if l.netPrev >= 0 && (b < 0 || l.netPrev < b) {
		b = l.netPrev
	}
	return max(b, 0)
}

// acked counts n bytes acknowledged at now and, once a window of the
// target and the base has passed, sets the bound from the window's rate.
func (l *delayLimit) acked(n int64, now time.Time) {
	if l.windowStart.IsZero() {
		// The first acknowledgement opens the first window: before it,
		// the time since the producer started says nothing of the rate.
		l.windowStart = now
		return
	}
	l.windowBytes += n
	span := l.target + l.base()
	elapsed := now.Sub(l.windowStart)
	if elapsed < span {
		return
	}
	want := int64(float64(l.windowBytes) * float64(span) / float64(elapsed))
	want = min(max(want, l.limitBytes/2), 2*l.limitBytes)
	l.limitBytes = min(max(want, l.floorBytes), l.ceilBytes)
	l.windowStart, l.windowBytes = now, 0
}
