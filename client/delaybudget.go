package client

import "time"

// QueueDelayTargetDefault is QueueDelayTarget's default.
const QueueDelayTargetDefault = 100 * time.Millisecond

// delayLimitFloorBytes is the least the queueing-delay bound goes down to
// (or BufferedBytesMax, if smaller), whatever the batch bound: a producer
// of small batches still pipelines several.
const delayLimitFloorBytes = 64 << 10

// delayLimitBaseSpan is how long a least service time stays the base: the
// base is the least over the last one to two spans.
const delayLimitBaseSpan = 5 * time.Second

// delayLimit is the producer's queueing-delay bound (QueueDelayTarget): a
// bound on its unsent bytes (produced and not yet cut into a batch and
// sent) that follows how fast the stream acknowledges them, so that at
// full speed a record waits about the target before it is sent, not for as
// long as BufferedBytesMax takes to drain. Bytes in flight are not counted:
// the in-flight window (InflightBatchesMax per range) and BufferedBytesMax
// bound them.
//
// By Little's law, the time a byte waits to be sent is the unsent bytes
// divided by the rate they leave, which in a steady state is the rate the
// stream acknowledges. So the bound is the acknowledged rate, measured over
// windows of sendWait, times sendWait: the larger of the target and the
// base. The base is the least time from a batch's send to its
// acknowledgement seen over the last 5 to 10 s (a remote home's round
// trip): with one batch in flight per range, records wait at least that
// long for the batch ahead of them, and a bound below it would shrink the
// next batch, the rate with it, and so the bound again.
//
// Why unsent bytes, not all bytes held (notes/sdkqueue.md): below capacity
// a range holds the batch in flight plus the records that gather behind
// it, about two round trips of records. A bound on both binds as soon as
// one round trip exceeds about half the target, on a loaded machine well
// below capacity; the blocked Produce then holds records back from the
// batch being cut and costs them a round trip more. Unsent bytes exceed
// rate × sendWait only when the round trip itself exceeds sendWait. At
// full speed the bound still holds the wait before sending to sendWait:
// the batch a range cuts is what gathered within the bound, so the round
// trip settles near sendWait.
//
// Why max(base, target), not base + target: the base is measured on the
// producer's own batches, and at full speed their round trip is mostly
// queueing behind everyone's batches, so the base rises with the bound. A
// bound of rate × (base + target) would then grow by a factor of
// (1 + target/base) per window without end; rate × max(base, target) does
// not grow once the base reaches the round trip.
//
// The bound moves by at most a factor of two per window, up or down, so
// that one noisy window (a pause, a burst of acknowledgements) does not
// swing it; it starts at one batch (BatchBytesMax) or 64 KiB, whichever
// is larger, and stays within [64 KiB, BufferedBytesMax].
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
	// The base: the least service time of the current span (since
	// spanStart) and of the one before; -1: none seen.
	spanStart         time.Time
	spanMin, priorMin time.Duration
}

func newDelayLimit(target time.Duration, batchBytesMax, ceilBytes int64) *delayLimit {
	floorBytes := min(delayLimitFloorBytes, ceilBytes)
	return &delayLimit{
		target:     target,
		floorBytes: floorBytes,
		ceilBytes:  ceilBytes,
		limitBytes: min(max(batchBytesMax, floorBytes), ceilBytes),
		spanMin:    -1, priorMin: -1,
	}
}

// limit returns the current bound, in bytes.
func (l *delayLimit) limit() int64 { return l.limitBytes }

// base returns the least service time seen over the last one to two spans.
func (l *delayLimit) base() time.Duration {
	switch {
	case l.spanMin < 0:
		return max(l.priorMin, 0)
	case l.priorMin < 0:
		return l.spanMin
	}
	return min(l.spanMin, l.priorMin)
}

// sendWait is the wait before sending that the bound holds unsent bytes to
// at the acknowledged rate: the larger of the target and the base.
func (l *delayLimit) sendWait() time.Duration { return max(l.base(), l.target) }

// acked counts n bytes acknowledged at now, service after their batch's
// send, and, once a window of sendWait has passed, sets the bound from the
// window's rate.
func (l *delayLimit) acked(n int64, service time.Duration, now time.Time) {
	if now.Sub(l.spanStart) >= delayLimitBaseSpan {
		l.spanStart, l.priorMin, l.spanMin = now, l.spanMin, -1
	}
	if service >= 0 && (l.spanMin < 0 || service < l.spanMin) {
		l.spanMin = service
	}
	if l.windowStart.IsZero() {
		// The first acknowledgement opens the first window: before it,
		// the time since the producer started says nothing of the rate.
		l.windowStart = now
		return
	}
	l.windowBytes += n
	elapsed := now.Sub(l.windowStart)
	wait := l.sendWait()
	if elapsed < wait {
		return
	}
	want := int64(float64(l.windowBytes) * float64(wait) / float64(elapsed))
	want = min(max(want, l.limitBytes/2), 2*l.limitBytes)
	l.limitBytes = min(max(want, l.floorBytes), l.ceilBytes)
	l.windowStart, l.windowBytes = now, 0
}
