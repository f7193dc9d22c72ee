package client

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/backoff"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// fetch feeds one owned range into Records until ctx ends (the range is
// released or the consumer closes). Like Subscribe, it resumes after a
// retriable error at the next address, from the next offset not yet
// delivered; it starts at a retained range's start when its position was
// deleted by retention. A fencing error stops it and asks for a
// heartbeat: the membership goroutine then releases or loses the range.
func (g *GroupConsumer) fetch(ctx context.Context, gr *groupRange, from uint64, known bool) {
	defer close(gr.fetched)
	from, known, err := g.externalStart(ctx, gr, from, known)
	if err != nil {
		return
	}
	if !known && g.cfg.start == StartLatest {
		tail, err := g.tail(ctx, gr.rng)
		if err != nil {
			return
		}
		from = tail
		g.mu.Lock()
		gr.committed, gr.marked = max(gr.committed, from), max(gr.marked, from)
		g.mu.Unlock()
	}
	addr := g.c.pool.pick()
	next := from
	for failures := 0; ctx.Err() == nil; {
		received, err := g.fetchOnce(ctx, addr, gr, &next)
		if ctx.Err() != nil {
			return
		}
		if received {
			failures = 0
		}
		if end, ok := RangeEnded(err); ok {
			// The range split and every record of it was delivered: its
			// end goes after them (splitread.go), and the fetcher waits
			// to be released.
			select {
			case g.deliveries <- delivery{rng: gr.rng, token: gr.token, ended: true, splitOffset: end.SplitOffset}:
			case <-ctx.Done():
			}
			<-ctx.Done()
			return
		}
		var e *Error
		switch {
		case CodeOf(err) == CodeRangeNotAssigned || fencedErr(err):
			g.kick()
			<-ctx.Done()
			return
		case errors.As(err, &e) && e.Code == apierr.OffsetOutOfRange && next < e.StartOffset:
			g.log.Warn("position no longer retained: starting at the range's first retained offset", "range", gr.rng, "position", next, "start", e.StartOffset)
			next = e.StartOffset
			continue
		case errors.As(err, &e) && e.Code == apierr.OffsetOutOfRange && e.TailOffset < next:
			// This node's copy is behind the position: try another.
		case CodeOf(err) == CodeRangeNotFound:
			// A split's child the coordinator assigned that this node's
			// catalogue does not hold yet (it applies the split shortly
			// after): retry, here or elsewhere.
		case !IsRetriable(err):
			g.fail(err)
			return
		}
		failures++
		g.c.pool.failed(addr)
		addr = g.c.pool.next(addr)
		if backoff.Sleep(ctx, backoff.Delay(failures-1, g.c.cfg.backoffMin, g.c.cfg.backoffMax, nil)) != nil {
			return
		}
	}
}

// fetchOnce runs one Fetch stream at addr, delivering records from *next
// on, until it fails or ctx ends.
func (g *GroupConsumer) fetchOnce(ctx context.Context, addr string, gr *groupRange, next *uint64) (received bool, err error) {
	_, conn, err := g.c.pool.api(addr)
	if err != nil {
		return false, err
	}
	g.mu.Lock()
	epoch := g.epoch
	g.mu.Unlock()
	fs, err := geologv1.NewConsumerClient(conn).Fetch(ctx, &geologv1.FetchRequest{Group: g.group, MemberId: g.cfg.memberID, MemberEpoch: epoch,
		Stream: g.stream, Range: gr.rng, FromOffset: *next, MaxBytes: g.cfg.fetchBytesMax, WantFrames: !g.c.cfg.readRecordsForm})
	if err != nil {
		return false, rpcError(ctx, err)
	}
	floor := *next // where the stream's next reply may start
	for {
		resp, err := fs.Recv()
		if errors.Is(err, io.EOF) {
			return received, apierr.New(apierr.Unavailable, "fetch ended by the server")
		}
		if err != nil {
			return received, rpcError(ctx, err)
		}
		if !received {
			received = true
			g.c.pool.succeeded(addr)
		}
		recs, err := replyRecords(gr.rng, resp.GetRecords(), resp.GetFrames(), floor, resp.GetNextOffset())
		if err != nil {
			return received, fmt.Errorf("fetch %s/%d: %w", g.stream, gr.rng, err)
		}
		floor = max(floor, resp.GetNextOffset())
		for len(recs) > 0 && recs[0].Offset < *next {
			recs = recs[1:]
		}
		if len(recs) == 0 {
			continue
		}
		*next = recs[len(recs)-1].Offset + 1
		select {
		case g.deliveries <- delivery{rng: gr.rng, token: gr.token, recs: recs}:
		case <-ctx.Done():
			return received, ctx.Err()
		}
	}
}

// tail is a range's committed tail, for StartLatest.
func (g *GroupConsumer) tail(ctx context.Context, rng uint32) (uint64, error) {
	res, err := g.c.Read(ctx, g.stream, rng, 0, ReadOptions{MaxRecords: 1})
	var e *Error
	if errors.As(err, &e) && e.Code == apierr.OffsetOutOfRange {
		return e.TailOffset, nil
	}
	if end, ok := RangeEnded(err); ok {
		return end.SplitOffset, nil // a split range's log ends there
	}
	if err != nil {
		return 0, err
	}
	return res.TailOffset, nil
}
