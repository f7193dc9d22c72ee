package client

import "time"

// QueueDelayTargetDefault is QueueDelayTarget's default.
const QueueDelayTargetDefault = 100 * time.Millisecond

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
// stream acknowledges. So the bound is the acknowledged rate, measured over
// windows of at least the target, times the target.
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
// so a bound of B gives batches of about B and a round trip R(B); the rate
// is B/R(B) and the next bound B × target/R(B): it shrinks while a round
// trip takes longer than the target and grows while shorter, settling
// where a batch's round trip is about the target (a record waits about one
// round trip to be sent and one in flight). No measured base enters it: a
// least round trip measured on the producer's own batches rises with the
// bound at full speed (they queue behind each other), and a bound of rate
// × (base + target) then grows without end, rate × max(base, target)
// stays wherever it started (notes/sdkqueue.md). The price: a stream whose
// round trip alone exceeds the target (a remote leader) is held to the
// floor with one batch in flight per range, as with the bound this
// replaced; raise the target or InflightBatchesMax for it.
//
// The bound moves by at most a factor of two per window, up or down, so
// that one noisy window (a pause, a burst of acknowledgements) does not
// swing it; it starts at 64 KiB (a producer's first second is not queued
// behind a bound far above its rate: the bound doubles per window until it
// covers the rate) and stays within [64 KiB, BufferedBytesMax].
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
}

func newDelayLimit(target time.Duration, ceilBytes int64) *delayLimit {
	floorBytes := min(delayLimitFloorBytes, ceilBytes)
	return &delayLimit{
		target:     target,
		floorBytes: floorBytes,
		ceilBytes:  ceilBytes,
		limitBytes: floorBytes,
	}
}

// limit returns the current bound on unsent bytes.
func (l *delayLimit) limit() int64 { return l.limitBytes }

// heldLimit returns the current bound on all bytes held, unsent and in
// flight: twice the unsent bound (see delayLimit).
func (l *delayLimit) heldLimit() int64 { return 2 * l.limitBytes }

// acked counts n bytes acknowledged at now and, once a window of the
// target has passed, sets the bound from the window's rate.
func (l *delayLimit) acked(n int64, now time.Time) {
	if l.windowStart.IsZero() {
		// The first acknowledgement opens the first window: before it,
		// the time since the producer started says nothing of the rate.
		l.windowStart = now
		return
	}
	l.windowBytes += n
	elapsed := now.Sub(l.windowStart)
	if elapsed < l.target {
		return
	}
	want := int64(float64(l.windowBytes) * float64(l.target) / float64(elapsed))
	want = min(max(want, l.limitBytes/2), 2*l.limitBytes)
	l.limitBytes = min(max(want, l.floorBytes), l.ceilBytes)
	l.windowStart, l.windowBytes = now, 0
}
