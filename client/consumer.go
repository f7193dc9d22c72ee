package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"time"

	"github.com/geolog/geolog/apierr"
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

// Read returns committed records of one range from fromOffset on. Retriable
// errors are retried (RetriesMax). Reading below the range's start or past
// its tail fails with CodeOffsetOutOfRange; the *Error carries the valid
// StartOffset and TailOffset.
func (c *Client) Read(ctx context.Context, stream string, rng uint32, fromOffset uint64, opts ReadOptions) (*ReadResult, error) {
	req := &geologv1.ReadRequest{
		Stream:      stream,
		Range:       rng,
		FromOffset:  fromOffset,
		MaxRecords:  opts.MaxRecords,
		MaxBytes:    opts.MaxBytes,
		Consistency: opts.Consistency,
		MinOffset:   opts.MinOffset,
	}
	var resp *geologv1.ReadResponse
	err := c.call(ctx, true, func(ctx context.Context) (err error) {
		resp, err = c.api.Read(ctx, req)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read %s/%d at %d: %w", stream, rng, fromOffset, err)
	}
	out := &ReadResult{
		Records:     make([]StoredRecord, len(resp.GetRecords())),
		NextOffset:  resp.GetNextOffset(),
		StartOffset: resp.GetStartOffset(),
		TailOffset:  resp.GetTailOffset(),
	}
	for i, r := range resp.GetRecords() {
		out.Records[i] = storedFromProto(rng, r)
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
}

// Subscribe follows one range from start: it yields every committed record
// in offset order, then waits for new ones until ctx ends. On a retriable
// error or a broken stream it resubscribes from the last delivered offset+1
// (never yielding a record twice), with backoff; RetriesMax bounds the
// consecutive attempts that deliver nothing. The sequence ends after
// yielding one error: the final error, or ctx's error, or ErrClosed.
//
//	for rec, err := range c.Subscribe(ctx, "chat", 0, client.StartAt{}) {
//		if err != nil { ... break }
//		...
//	}
func (c *Client) Subscribe(ctx context.Context, stream string, rng uint32, start StartAt) iter.Seq2[StoredRecord, error] {
	return func(yield func(StoredRecord, error) bool) {
		next := start.Offset // records below next are skipped
		delivered := false
		failures := 0
		for {
			err := c.subscribeOnce(ctx, stream, rng, start, &next, &delivered, &failures, yield)
			if err == nil {
				return // the consumer stopped iterating
			}
			switch {
			case c.isClosed():
				yield(StoredRecord{}, ErrClosed)
				return
			case ctx.Err() != nil:
				yield(StoredRecord{}, ctx.Err())
				return
			case !IsRetriable(err) || failures >= c.cfg.retriesMax:
				yield(StoredRecord{}, fmt.Errorf("subscribe %s/%d at %d: %w", stream, rng, next, err))
				return
			}
			failures++
			c.log.Debug("resubscribing", "stream", stream, "range", rng, "offset", next, "attempt", failures, "error", err)
			if sleepCtx(ctx, backoffDelay(failures, c.cfg.backoffMin, c.cfg.backoffMax)) != nil {
				yield(StoredRecord{}, ctx.Err())
				return
			}
		}
	}
}

// subscribeOnce runs one Subscribe stream until it fails (returning the
// classified error) or the consumer stops iterating (returning nil).
func (c *Client) subscribeOnce(ctx context.Context, stream string, rng uint32, start StartAt,
	next *uint64, delivered *bool, failures *int, yield func(StoredRecord, error) bool) error {
	if c.isClosed() {
		return ErrClosed
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req := &geologv1.SubscribeRequest{Stream: stream, Range: rng}
	if !start.Time.IsZero() && !*delivered {
		req.Start = &geologv1.SubscribeRequest_FromTimeUnixNanos{FromTimeUnixNanos: start.Time.UnixNano()}
	} else {
		req.Start = &geologv1.SubscribeRequest_FromOffset{FromOffset: *next}
	}
	sub, err := c.api.Subscribe(sctx, req)
	if err != nil {
		return rpcError(ctx, err)
	}
	for {
		resp, err := sub.Recv()
		if errors.Is(err, io.EOF) {
			return apierr.New(apierr.Unavailable, "subscription ended by the server")
		}
		if err != nil {
			return rpcError(ctx, err)
		}
		for _, r := range resp.GetRecords() {
			if r.GetOffset() < *next {
				continue // already delivered before a resubscribe
			}
			*next = r.GetOffset() + 1
			*delivered = true
			*failures = 0
			if !yield(storedFromProto(rng, r), nil) {
				return nil
			}
		}
	}
}
