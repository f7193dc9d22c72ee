package regionsvc

import (
	"context"
	"math"
	"time"

	"github.com/geolog/geolog/apierr"
)

// Load shedding at a range leader (Config.AppendQueueDelayTarget): a range
// refuses new appends with a retriable OVERLOADED, before proposing them,
// while its appends have been queueing for longer than the target, so that
// past capacity its latency stays near the target instead of growing with
// the queue, and the queue waits at the producers (which bound theirs:
// the SDK's QueueDelayTarget) instead.
//
// The measure is CoDel's (Nichols and Jacobson, "Controlling Queue
// Delay"), adapted from dropping packets to admitting requests as in
// Facebook's CoDel request queues: an append's sojourn is the time from
// its arrival at the range (submit) to its commit; a burst is a queue that
// drains, a standing queue one whose every member waited long. So the
// range is overloaded for an interval (twice the target) when the least
// sojourn of the appends committed in the interval before exceeded the
// target. While overloaded, and while the oldest append it has proposed
// and not yet answered arrived more than the target ago (a queue stands
// now), it refuses arriving appends at CoDel's pace: the first at once,
// the n-th an interval/sqrt(n) after the one before (n capped at
// appendShedRefusalsPerRunMax), so that refusals grow until the queue
// stops standing, and each costs one producer's range a retry-after, not
// the range its throughput; every other append is admitted, so the disk
// always has work. The count starts again after 8
// intervals without a refusal. An interval without commits ends an
// overload: a stalled disk or a lost answer never leaves the range
// refusing for good.
//
// A refused append was never proposed, so its retry (after the
// retry-after, about the target) appends it once; refusals are counted in
// geolog.limits.refused_requests with limit "queue_delay". Mirrored
// appends (from a home region) and followers are not shed.

// AppendQueueDelayTargetDefault is Config.AppendQueueDelayTarget's
// default.
const AppendQueueDelayTargetDefault = 100 * time.Millisecond

// appendShedIntervalPerTarget is CoDel's interval, in targets.
const appendShedIntervalPerTarget = 2

// appendShedRunGapIntervals is the gap, in intervals, after which
// refusals start a new run (CoDel's count back to 1).
const appendShedRunGapIntervals = 8

// appendShedRefusalsPerRunMax caps CoDel's count, and so the pace of
// refusals at one per interval/sqrt(4), the target. CoDel's count grows
// while the queue stands, which assumes senders that slow down when
// refused; a producer with a deep queue of its own (an SDK bounding bytes
// only) sends the same bytes after its retry-after, in a bigger batch, so
// an unbounded pace ends up refusing nearly every arrival and idling the
// range: measured with 8 such producers at full speed, throughput fell to
// a third. At one refusal per target, at most a few producers of a range
// wait out a retry-after at any time.
const appendShedRefusalsPerRunMax = 4

// appendShedPendingMax bounds the appends the shedder tracks; past it new
// appends are admitted untracked (the inbox and the node's in-flight bytes
// bound them anyway).
const appendShedPendingMax = 1 << 16

// appendShedder is a range leader's admission by queueing delay. It is a
// deterministic core: the driver goroutine owns it and passes the time in.
type appendShedder struct {
	target, interval time.Duration

	// pending are the proposed appends in proposal order, from head;
	// answered ones leave from the head.
	pending []*shedEntry
	head    int

	windowEnd  time.Time     // end of the current interval; zero: none yet
	windowMin  time.Duration // least sojourn committed in it; -1: none
	overloaded bool          // decided at the last interval's end

	// refusals counts the refusals of the current run (CoDel's count);
	// refuseNext is when the next may come.
	refusals   int
	refuseNext time.Time
}

// shedEntry is one proposed append.
type shedEntry struct {
	arrived  time.Time
	answered bool
}

func newAppendShedder(target time.Duration) *appendShedder {
	return &appendShedder{target: target, interval: appendShedIntervalPerTarget * target, windowMin: -1}
}

// roll ends the intervals that passed by now, deciding the overload.
func (s *appendShedder) roll(now time.Time) {
	if s.windowEnd.IsZero() {
		s.windowEnd = now.Add(s.interval)
		return
	}
	if now.Before(s.windowEnd) {
		return
	}
	s.overloaded = s.windowMin > s.target
	s.windowMin = -1
	s.windowEnd = s.windowEnd.Add(s.interval)
	if !now.Before(s.windowEnd) {
		// A whole interval without commits passed too.
		s.overloaded = false
		s.windowEnd = now.Add(s.interval)
	}
}

// admit says whether an append arriving now may be proposed.
func (s *appendShedder) admit(now time.Time) bool {
	s.roll(now)
	if !s.overloaded {
		return true
	}
	s.popAnswered()
	if s.head == len(s.pending) || now.Sub(s.pending[s.head].arrived) <= s.target || now.Before(s.refuseNext) {
		return true
	}
	if now.Sub(s.refuseNext) > appendShedRunGapIntervals*s.interval {
		s.refusals = 0 // a new run of refusals
	}
	s.refusals = min(s.refusals+1, appendShedRefusalsPerRunMax)
	s.refuseNext = now.Add(time.Duration(float64(s.interval) / math.Sqrt(float64(s.refusals))))
	return false
}

// proposed tracks an admitted append that arrived at arrived; the caller
// answers the returned entry (nil: untracked) once.
func (s *appendShedder) proposed(arrived time.Time) *shedEntry {
	s.popAnswered()
	if len(s.pending)-s.head >= appendShedPendingMax {
		return nil
	}
	e := &shedEntry{arrived: arrived}
	s.pending = append(s.pending, e)
	return e
}

// answered ends e (nil: nothing); committed says the append committed now,
// which makes its sojourn a sample.
func (s *appendShedder) answered(e *shedEntry, now time.Time, committed bool) {
	if e == nil {
		return
	}
	e.answered = true
	s.roll(now)
	if committed {
		if sojourn := now.Sub(e.arrived); s.windowMin < 0 || sojourn < s.windowMin {
			s.windowMin = sojourn
		}
	}
	s.popAnswered()
}

// reset forgets the proposed appends (the node no longer leads: the
// replica answers them, and the next term starts afresh).
func (s *appendShedder) reset() {
	clear(s.pending)
	s.pending, s.head = s.pending[:0], 0
	s.overloaded, s.windowMin = false, -1
	s.refusals, s.refuseNext = 0, time.Time{}
}

func (s *appendShedder) popAnswered() {
	for s.head < len(s.pending) && s.pending[s.head].answered {
		s.pending[s.head] = nil
		s.head++
	}
	switch {
	case s.head == len(s.pending):
		s.pending, s.head = s.pending[:0], 0
	case s.head > 64 && s.head > len(s.pending)/2:
		n := copy(s.pending, s.pending[s.head:])
		clear(s.pending[n:])
		s.pending, s.head = s.pending[:n], 0
	}
}

// shed refuses op if the range is shedding load (see the top of the
// file), answering it with OVERLOADED; it says whether it did. Otherwise
// it returns the op's tracking entry for shedAnswered.
func (d *rangeDriver) shed(op *appendOp) (refused bool, e *shedEntry) {
	s := d.shedder
	if s == nil || op.verbatim {
		return false, nil
	}
	if !d.rep.IsLeader() {
		s.reset()
		return false, nil
	}
	now := d.cfg.now()
	if s.admit(now) {
		arrived := op.arrivedAt
		if arrived.IsZero() {
			arrived = now
		}
		return false, s.proposed(arrived)
	}
	d.cfg.metrics.overloads.Add(context.Background(), 1, limitAttr("queue_delay"))
	op.reply(appendResult{err: apierr.NewOverloaded(jittered(s.target),
		"range %d: appends have been queueing for over %v", d.cfg.rangeID, s.target)})
	return true, nil
}
