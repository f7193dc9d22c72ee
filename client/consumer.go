package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/backoff"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// Consistency selects what a read may return (see DESIGN.md, read path).
type Consistency = geologv1.Consistency

// The read consistencies.
const (
	// ConsistencyLocal reads the local committed prefix; it may lag.
	ConsistencyLocal = geologv1.Consistency_CONSISTENCY_LOCAL
	// ConsistencyMinOffset waits until the local copy has MinOffset.
	ConsistencyMinOffset = geologv1.Consistency_CONSISTENCY_MIN_OFFSET
	// ConsistencyHome is linearizable: the home leader confirms its tail.
	ConsistencyHome = geologv1.Consistency_CONSISTENCY_HOME
)

// ReadOptions tune one Read. The zero value reads locally with the server's
// default bounds.
type ReadOptions struct {
	// MaxRecords bounds the reply; 0 means the server default (1000).
	MaxRecords uint32
	// MaxBytes bounds the reply's record bytes; 0 means the server default
	// (1 MiB). At least one record is returned when one is available.
	MaxBytes    uint32
	Consistency Consistency
	// MinOffset: with ConsistencyMinOffset, wait until the local tail is at
	// least MinOffset, bounded by ctx.
	MinOffset uint64
	// ByKey reads only the records whose key equals Key (one
	// conversation; an empty Key selects the keyless records), through
	// the range's key index: the cost is about that key's records, not
	// the range's. NextOffset may then skip other keys' records; it is
	// TailOffset when the key has no more. A non-empty Key must belong to
	// the range (RangeOfKey), else CodeInvalidArgument. Default false: every
	// record. A non-empty Key without ByKey is refused.
	ByKey bool
	Key   []byte
}

// ReadResult is one Read's records and the range's bounds.
type ReadResult struct {
	Records []StoredRecord
	// NextOffset is the offset to read next.
	NextOffset uint64
	// StartOffset is the first retained offset; TailOffset the offset the
	// next append gets.
	StartOffset, TailOffset uint64
}

// Read returns committed records of one range from fromOffset on, from any
// node (a follower may lag: use ConsistencyMinOffset or ConsistencyHome to
// bound that). Retriable errors are retried at another node (RetriesMax),
// among them CodeOffsetPastLocalTail: fromOffset is past what the node
// serves, which the range may hold. Reading below the range's start or
// past its tail (as the home confirms it) fails with CodeOffsetOutOfRange;
// the *Error carries the valid StartOffset and TailOffset. A reader that
// moves between nodes should compare the epoch of the record at its last
// offset (see Subscribe, and docs/reads-never-go-backwards.md). With
// OpenWith, records are opened (see there); a record skipped by
// SkipUnopenable is left out of Records, and NextOffset still moves past
// it.
//
// A range that split ends at its split offset: Read returns records below
// it only, with NextOffset and TailOffset at most the split offset, and a
// read at or past it fails with CodeRangeSplit, not retriable;
// RangeEnded(err) gives the split offset and the two children, where the
// range's keys continue from offset 0 (Subscribe follows them itself).
func (c *Client) Read(ctx context.Context, stream string, rng uint32, fromOffset uint64, opts ReadOptions, copts ...ConsumerOpt) (*ReadResult, error) {
	op, err := newOpener(stream, copts)
	if err != nil {
		return nil, err
	}
	req := &geologv1.ReadRequest{
		Stream:      stream,
		Range:       rng,
		FromOffset:  fromOffset,
		MaxRecords:  opts.MaxRecords,
		MaxBytes:    opts.MaxBytes,
		Consistency: opts.Consistency,
		MinOffset:   opts.MinOffset,
		WantFrames:  !c.cfg.readRecordsForm,
	}
	if err := opts.setKey(req); err != nil {
		return nil, fmt.Errorf("read %s/%d at %d: %w", stream, rng, fromOffset, err)
	}
	var resp *geologv1.ReadResponse
	err = c.call(ctx, true, func(ctx context.Context, api geologv1.LogClient) (err error) {
		resp, err = api.Read(ctx, req)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read %s/%d at %d: %w", stream, rng, fromOffset, err)
	}
	recs, err := replyRecords(rng, resp.GetRecords(), resp.GetFrames(), fromOffset, resp.GetNextOffset())
	if err != nil {
		return nil, fmt.Errorf("read %s/%d at %d: %w", stream, rng, fromOffset, err)
	}
	out := &ReadResult{
		Records:     recs[:0],
		NextOffset:  resp.GetNextOffset(),
		StartOffset: resp.GetStartOffset(),
		TailOffset:  resp.GetTailOffset(),
	}
	for _, r := range recs {
		rec, ok, err := op.open(r)
		if err != nil {
			return nil, err
		}
		if ok {
			out.Records = append(out.Records, rec)
		}
	}
	return out, nil
}

// OffsetForTime returns the first offset of a range whose append time is at
// or after t, or the tail if there is none. Append times do not decrease in
// offset order, so it binary-searches with one-record reads: O(log n) calls.
func (c *Client) OffsetForTime(ctx context.Context, stream string, rng uint32, t time.Time) (uint64, error) {
	first, err := c.Read(ctx, stream, rng, 0, ReadOptions{MaxRecords: 1})
	var e *Error
	if errors.As(err, &e) && e.Code == apierr.OffsetOutOfRange {
		// Offset 0 is no longer retained; start at the first that is.
		first, err = c.Read(ctx, stream, rng, e.StartOffset, ReadOptions{MaxRecords: 1})
	}
	if err != nil {
		return 0, err
	}
	if len(first.Records) == 0 {
		return first.TailOffset, nil
	}
	// Invariant: every offset < lo has an append time before t, every
	// offset >= hi one at or after t (hi = tail counts as "after").
	lo, hi := first.Records[0].Offset, first.TailOffset
	if !first.Records[0].AppendTime.Before(t) {
		return lo, nil
	}
	lo++
	for lo < hi {
		mid := lo + (hi-lo)/2
		r, err := c.Read(ctx, stream, rng, mid, ReadOptions{MaxRecords: 1})
		if err != nil {
			return 0, err
		}
		if len(r.Records) == 0 || !r.Records[0].AppendTime.Before(t) {
			hi = mid
		} else {
			lo = r.Records[0].Offset + 1
		}
	}
	return lo, nil
}

// StartAt says where a subscription starts: at Time if it is not zero (the
// first record appended at or after it), else at Offset.
type StartAt struct {
	Offset uint64
	Time   time.Time
	// Epoch, if not 0 (with Offset > 0), is the epoch of the record at
	// Offset-1, the last one the caller processed: the subscription first
	// checks that the range's log still holds it, and ends with a
	// *ForkError if a failover replaced it (the offset and epoch of a
	// record are what a consumer should keep as its position).
	Epoch uint64
}

// Subscribe follows one range from start: it yields every committed record
// in offset order, then waits for new ones until ctx ends. Any node serves
// it (offsets are the same on every replica). On a retriable error or a
// broken stream it resubscribes, with backoff, at the next address (or at
// the error's leader hint) from the last delivered offset, never yielding
// a record twice nor an offset below one it yielded; a node found behind
// that offset (CodeOffsetPastLocalTail) counts as a retriable failure.
// RetriesMax bounds the consecutive attempts that deliver nothing. With
// OpenWith, records are opened (see there): a record that does not open
// ends the sequence with an *OpenError, or is skipped and reported with
// SkipUnopenable.
//
// After an unplanned failover the records it delivered may not all be in
// the range's log: the old home served records it could not replicate
// (the RPO; see fork.go). Resubscribing, it checks that the log still
// holds the last record it delivered (same offset, same epoch); when not,
// the sequence ends with a *ForkError (errors.Is(err, ErrForked)) whose
// Offset is where to read again.
//
// A range that split (docs/split.md) is followed to its children: once
// every record of the range up to its split offset was yielded, the
// subscription goes on with both children from offset 0 (each child's
// records in offset order, the two interleaved; StoredRecord.Range says
// which), and so on down any later split. Each key's records thus come in
// append order across the split.
//
// The sequence ends after yielding one error: the final error, a
// *ForkError, an *OpenError, ctx's error, or ErrClosed.
//
//	for rec, err := range c.Subscribe(ctx, "chat", 0, client.StartAt{}) {
//		if err != nil { ... break }
//		...
//	}
func (c *Client) Subscribe(ctx context.Context, stream string, rng uint32, start StartAt, copts ...ConsumerOpt) iter.Seq2[StoredRecord, error] {
	return c.subscribe(ctx, stream, rng, nil, start, copts)
}

// subscribe is Subscribe, filtered by key if key is not nil.
func (c *Client) subscribe(ctx context.Context, stream string, rng uint32, key []byte, start StartAt, copts []ConsumerOpt) iter.Seq2[StoredRecord, error] {
	return c.subscribeRange(ctx, stream, rng, key, start, copts, false)
}

// subscribeRange is subscribe; child says that the range is a split's
// child, which a node may not know of yet (splitread.go).
func (c *Client) subscribeRange(ctx context.Context, stream string, rng uint32, key []byte, start StartAt, copts []ConsumerOpt, child bool) iter.Seq2[StoredRecord, error] {
	return func(yield func(StoredRecord, error) bool) {
		op, err := newOpener(stream, copts)
		if err != nil {
			yield(StoredRecord{}, err)
			return
		}
		s := &subscription{c: c, stream: stream, rng: rng, start: start, next: start.Offset, addr: c.pool.pick(), op: op, key: key, child: child}
		if start.Time.IsZero() && start.Epoch != 0 && start.Offset > 0 {
			// As if it had delivered the caller's last record: checked
			// first (fork.go).
			s.delivered, s.last, s.lastEpoch = true, start.Offset-1, start.Epoch
		}
		for {
			received, err := s.once(ctx, yield)
			if err == nil {
				return // the consumer stopped iterating
			}
			if end, ok := RangeEnded(err); ok {
				c.followSplit(ctx, s, end, copts, yield) // splitread.go
				return
			}
			if s.checkFailed(err) {
				continue // the first record cannot be checked: resume after it
			}
			err = s.lagging(ctx, err)
			unknownChild := s.childUnknown(err)
			if unknownChild {
				s.failures = min(s.failures, c.cfg.retriesMax-1) // bounded by time instead
			}
			var fe *ForkError
			switch {
			case errors.As(err, &fe):
				yield(StoredRecord{}, fe)
				return
			case c.isClosed():
				yield(StoredRecord{}, ErrClosed)
				return
			case ctx.Err() != nil:
				yield(StoredRecord{}, ctx.Err())
				return
			case !IsRetriable(err) && !unknownChild, s.failures >= c.cfg.retriesMax:
				yield(StoredRecord{}, fmt.Errorf("subscribe %s/%d at %d: %w", stream, rng, s.next, err))
				return
			}
			s.failures++
			from := s.addr
			if hint := leaderHint(err, from); hint != "" {
				s.addr = hint
			} else {
				if !received {
					// Nothing came from it: it is down or cannot serve.
					c.pool.failed(from)
				}
				s.addr = c.pool.next(from)
			}
			c.log.Debug("resubscribing", "stream", stream, "range", rng, "offset", s.next,
				"attempt", s.failures, "addr", from, "next_addr", s.addr, "error", err)
			if backoff.Sleep(ctx, retryDelay(err, s.failures, c.cfg.backoffMin, c.cfg.backoffMax)) != nil {
				yield(StoredRecord{}, ctx.Err())
				return
			}
		}
	}
}

// subscription is the state of one Subscribe across its streams.
type subscription struct {
	c      *Client
	stream string
	rng    uint32
	start  StartAt
	// child: rng is a split's child (followSplit), which a node learns of
	// shortly after its parent ends.
	child bool
	// childWaitFrom is when a node first did not know the child.
	childWaitFrom time.Time
	key           []byte  // non-nil: only this key's records (SubscribeKey)
	op            *opener // nil without OpenWith
	addr          string  // where the next stream goes
	// next is the offset to deliver next; records below it are skipped.
	next      uint64
	delivered bool // a record was yielded
	failures  int  // consecutive attempts that delivered nothing
	// last and lastEpoch are the offset and epoch of the last record
	// delivered (or vouched for by StartAt.Epoch; fork.go); next may be
	// past last+1 (holes of a compacted log, other keys' records).
	last, lastEpoch uint64
	// checking: the stream was asked from last, whose record must have
	// the epoch delivered there; uncheckable: retention removed it.
	checking, uncheckable bool
}

// checkFailed reports whether err refused a subscription resumed one
// record early because that record is no longer retained: it then
// resumes at next, unchecked (a failover long ago).
func (s *subscription) checkFailed(err error) bool {
	var e *Error
	if !s.checking || !errors.As(err, &e) || e.Code != apierr.OffsetOutOfRange || e.StartOffset <= s.last {
		return false
	}
	s.checking, s.uncheckable = false, true
	return true
}

// lagging looks into a node's answer that it serves less than offsets
// already delivered: OFFSET_PAST_LOCAL_TAIL, or an older server's
// OFFSET_OUT_OF_RANGE, with a tail below next. Either the node lags (the
// offset exists, elsewhere: a retriable error), or what was delivered
// there was a divergent tail that the log no longer holds: a *ForkError.
// The home tells which (checkLast); if it cannot be asked, the error
// stays retriable.
func (s *subscription) lagging(ctx context.Context, err error) error {
	var e *Error
	if !s.delivered || !errors.As(err, &e) || e.TailOffset >= s.next ||
		(e.Code != apierr.OffsetOutOfRange && e.Code != apierr.PastLocalTail) {
		return err
	}
	var fe *ForkError
	if cerr := s.checkLast(ctx); errors.As(cerr, &fe) {
		return fe
	}
	return apierr.New(apierr.Unavailable, "node %s is behind: it serves up to %d, below offset %d (%s)", s.addr, e.TailOffset, s.next, e.Message)
}

// checkSkipped is a resume check whose stream went past the record at
// last without it: a key subscription's filter left it out (the log there
// may now hold another key's record, after a fork), or compaction by key
// removed it. The home tells (checkLast): a *ForkError ends the
// subscription; when the home cannot be asked it goes on unchecked, as
// after retention (the node serving it fences a divergent tail it knows
// of; docs/reads-never-go-backwards.md).
func (s *subscription) checkSkipped(ctx context.Context) error {
	if !s.checking {
		return nil
	}
	s.checking = false
	var fe *ForkError
	if err := s.checkLast(ctx); errors.As(err, &fe) {
		return fe
	} else if err != nil {
		s.c.log.Debug("resume check skipped: the home cannot be asked", "stream", s.stream, "range", s.rng, "offset", s.last, "error", err)
	}
	return nil
}

// once runs one Subscribe stream at s.addr until it fails (returning the
// classified error) or the consumer stops iterating (returning nil).
// received reports whether the stream delivered anything.
func (s *subscription) once(ctx context.Context, yield func(StoredRecord, error) bool) (received bool, err error) {
	c := s.c
	if c.isClosed() {
		return false, ErrClosed
	}
	api, _, err := c.pool.api(s.addr)
	if err != nil {
		return false, err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req := &geologv1.SubscribeRequest{Stream: s.stream, Range: s.rng, Key: s.key, WantFrames: !c.cfg.readRecordsForm}
	s.checking = false
	switch {
	case !s.start.Time.IsZero() && !s.delivered:
		req.Start = &geologv1.SubscribeRequest_FromTimeUnixNanos{FromTimeUnixNanos: s.start.Time.UnixNano()}
	case s.delivered && !s.uncheckable:
		// One record early: the log must still hold the last one
		// delivered (fork.go).
		req.Start = &geologv1.SubscribeRequest_FromOffset{FromOffset: s.last}
		s.checking = true
	default:
		req.Start = &geologv1.SubscribeRequest_FromOffset{FromOffset: s.next}
	}
	sub, err := api.Subscribe(sctx, req)
	if err != nil {
		return false, rpcError(ctx, err)
	}
	floor := req.GetFromOffset() // where the stream's next reply may start
	for {
		resp, err := sub.Recv()
		if errors.Is(err, io.EOF) {
			return received, apierr.New(apierr.Unavailable, "subscription ended by the server")
		}
		if err != nil {
			return received, rpcError(ctx, err)
		}
		if !received {
			received = true
			c.pool.succeeded(s.addr)
		}
		recs, err := replyRecords(s.rng, resp.GetRecords(), resp.GetFrames(), floor, resp.GetNextOffset())
		if err != nil {
			return received, fmt.Errorf("subscribe %s/%d: %w", s.stream, s.rng, err)
		}
		floor = max(floor, resp.GetNextOffset())
		if n := resp.GetNextOffset(); n > s.next && len(recs) == 0 {
			// Holes only (compaction by key), or other keys' records.
			if err := s.checkSkipped(ctx); err != nil {
				return received, err
			}
			s.next = n
		}
		if more, err := s.deliver(ctx, recs, yield); !more || err != nil {
			return received, err
		}
	}
}

// deliver yields the records of one reply that are new (a resubscribed
// stream starts one record early, or before what was delivered), checking
// the epoch of the record a resumed stream starts with (fork.go). It
// reports false when the consumer stopped iterating (err nil) or on an
// error.
func (s *subscription) deliver(ctx context.Context, recs []StoredRecord, yield func(StoredRecord, error) bool) (more bool, err error) {
	for _, r := range recs {
		if s.checking && r.Offset == s.last {
			s.checking = false
			if r.Epoch != s.lastEpoch {
				return false, s.forked(ctx, r.Epoch)
			}
		}
		if r.Offset > s.last {
			if err := s.checkSkipped(ctx); err != nil {
				return false, err
			}
		}
		if r.Offset < s.next {
			continue // already delivered before a resubscribe
		}
		rec, ok, err := s.op.open(r)
		if err != nil {
			return false, err // final: an *OpenError is not retriable
		}
		s.checking = false
		s.next = r.Offset + 1
		s.delivered = true
		s.failures = 0
		s.last, s.lastEpoch = r.Offset, r.Epoch
		if ok && !yield(rec, nil) {
			return false, nil
		}
	}
	return true, nil
}
