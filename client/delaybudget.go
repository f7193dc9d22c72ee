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
// bound on the bytes it holds (produced and not yet acknowledged or
// failed) that follows how fast the stream acknowledges them, so that at
// full speed a record waits about the target beyond the stream's own
// service time, not for as long as BufferedBytesMax takes to drain.
//
// By Little's law, the time a byte spends in the producer is the bytes
// held divided by the rate they leave (are acknowledged). So the bound is
// the acknowledged rate, measured over windows of the base plus the
// target, times the base plus the target. The base is the least time from
// a batch's send to its acknowledgement seen over the last 5 to 10 s (a
// remote home's round trip, one fsync round): time the producer cannot
// queue less than, as BBR's minimum RTT. When the producer is not at
// capacity the bound is above what it holds and changes nothing; past
// capacity, Produce waits for room (or fails, with FailWhenFull) and the
// wait is the queue it does not build. A bound that binds while records
// wait less than the target grows: held bytes over their time in the
// producer is a rate above bound over (base + target).
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

// acked counts n bytes acknowledged at now, service after their batch's
// send, and, once a window of the base plus the target has passed, sets
// the bound from the window's rate.
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
	span := l.base() + l.target
	if elapsed < span {
		return
	}
	want := int64(float64(l.windowBytes) * float64(span) / float64(elapsed))
	want = min(max(want, l.limitBytes/2), 2*l.limitBytes)
	l.limitBytes = min(max(want, l.floorBytes), l.ceilBytes)
	l.windowStart, l.windowBytes = now, 0
}
