package regionsvc

import (
	"context"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
)

// Reads past what a node serves (DESIGN.md invariant 8). A reader may ask
// a node for an offset past the node's servable end: it read further at
// another node (a follower or mirror that lags), or here before a restart
// (a node publishes at once what it published before, but its peers may
// have committed more since), or inside a divergent tail this node now
// fences (timeline.go). None of these is a final error:
//
//   - a read inside a fenced divergent tail gets OFFSET_PAST_LOCAL_TAIL at
//     once: the reader read records that the range's log replaced, and
//     must find out (the record at its last offset has another epoch now);
//   - otherwise the read waits up to readPastTailWait for the node to
//     catch up; if it does not, the node asks the home for the range's
//     confirmed tail (homeTail): past it, the offset is past the range's
//     tail (OFFSET_OUT_OF_RANGE, final); below it, or if the home cannot
//     be asked, OFFSET_PAST_LOCAL_TAIL, retriable;
//   - a subscription waits up to subscribePastTailWait, then ends with
//     OFFSET_PAST_LOCAL_TAIL (the client moves to another node); one
//     positioned inside a fenced divergent tail ends at once; one behind a
//     provisional fence (the node does not know the new epoch's start yet)
//     waits for it.

const (
	// readPastTailWait bounds how long a read past the node's servable
	// end waits for it to catch up before the home is asked.
	readPastTailWait = 500 * time.Millisecond
	// homeTailWaitMax bounds the home's tail confirmation for such a read.
	homeTailWaitMax = 2 * time.Second
	// subscribePastTailWait bounds how long a subscription positioned
	// past the node's servable end waits before it ends, retriable.
	subscribePastTailWait = 2 * time.Second
)

// waitServable blocks until the servable end reaches target.
func (d *rangeDriver) waitServable(ctx context.Context, target uint64) error {
	for {
		ch := d.changed()
		if d.servableEnd() >= target {
			return nil
		}
		if f := d.failure.Load(); f != nil {
			return f
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return apierr.New(apierr.Timeout, "waiting for offset %d (served %d): %v", target, d.servableEnd(), ctx.Err())
		}
	}
}

// settlePastTail decides a read at from that readRecords found past the
// node's servable end (see the top of this file): nil once the node
// serves from, else the error to answer.
func (n *Node) settlePastTail(ctx context.Context, d *rangeDriver, from uint64) error {
	if f := d.fenceNow(); f.known() && from > f.offset {
		return d.pastTail(from, d.servableEnd())
	}
	wctx, cancel := context.WithTimeout(ctx, readPastTailWait)
	err := d.waitServable(wctx, from)
	cancel()
	if err == nil || ctx.Err() != nil {
		return err
	}
	hctx, cancel := context.WithTimeout(ctx, homeTailWaitMax)
	tail, herr := n.homeTail(hctx, d, false)
	cancel()
	if herr == nil && from > tail {
		return outOfRange(from, d.store.StartOffset(), tail)
	}
	return d.pastTail(from, d.servableEnd())
}

// readLocal is a read at from without a home confirmation (consistency
// local or min_offset), filtered by key if not nil (d.read), settling a
// read past the servable end.
func (n *Node) readLocal(ctx context.Context, d *rangeDriver, key []byte, from uint64, lim readLimits) (readOut, uint64, error) {
	out, next, err := d.read(key, from, lim)
	if rpcerr.CodeOf(err) != apierr.PastLocalTail {
		return out, next, err
	}
	if err := n.settlePastTail(ctx, d, from); err != nil {
		return readOut{}, from, err
	}
	return d.read(key, from, lim)
}

// readAtHomeTail is a home read at from once the local copy committed the
// home's confirmed tail: refused (retriable) while a fence keeps the copy
// below it (a divergent tail not yet forked off), and past the tail an
// OFFSET_OUT_OF_RANGE. key filters as in d.read.
func (d *rangeDriver) readAtHomeTail(key []byte, from, tail uint64, lim readLimits) (readOut, uint64, error) {
	if end := d.servableEnd(); end < tail {
		return readOut{}, from, d.pastTail(tail, end)
	}
	out, next, err := d.read(key, from, lim)
	if e := apierr.As(err); e != nil && e.Code == apierr.PastLocalTail {
		return readOut{}, from, outOfRange(from, e.StartOffset, e.TailOffset)
	}
	return out, next, err
}

// subscribeWait is what a subscription at next does when readRecords found
// it past the servable end (see the top of this file): behind is when it
// first found that (zero: now). It returns how long to wait at most (0:
// until something changes), or the error that ends the subscription.
func (d *rangeDriver) subscribeWait(next uint64, behind *time.Time) (time.Duration, error) {
	f := d.fenceNow()
	switch {
	case f.known() && next > f.offset:
		return 0, d.pastTail(next, d.servableEnd())
	case f != nil && next > f.offset:
		*behind = time.Time{} // a provisional fence: wait for the start
		return 0, nil
	}
	if behind.IsZero() {
		*behind = time.Now()
	}
	left := subscribePastTailWait - time.Since(*behind)
	if left <= 0 {
		return 0, d.pastTail(next, d.servableEnd())
	}
	return left, nil
}
