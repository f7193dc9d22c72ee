package regionsvc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// TestSplitReadEnds: once a range split, every read of it ends at its
// split offset (docs/split.md "Readers"), on every node: a read below it
// returns the records below it with a next offset and a tail no further
// than the split offset (never the marker's offset past it); a read at
// or past it, in either form and by key, answers RANGE_SPLIT, not
// retriable, naming the split offset and both children; a subscription
// delivers the records and then ends with the same answer.
func TestSplitReadEnds(t *testing.T) {
	t.Parallel()
	tr := newTestRegion(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	tr.createStream(ctx, "sr", 2)
	keys := keysOf(1, 2, 3)
	const written = 12
	for i := range written {
		if _, err := tr.leaderAppend(ctx, &geologv1.AppendRequest{Stream: "sr", Range: 1, ProducerId: 77, BaseSequence: uint64(i),
			Records: []*geologv1.Record{{Key: keys[i%len(keys)], Value: []byte(fmt.Sprint(i))}}}); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	res, err := tr.split(ctx, "sr", 1, 0)
	if err != nil {
		t.Fatalf("split: %v", err)
	}
	if res.offset != written {
		t.Fatalf("split offset %d, want %d", res.offset, written)
	}
	children := []uint32{res.decision.Left, res.decision.Right}
	for id := range tr.nodes {
		c := tr.clients[id]
		if recs := tr.readAll(ctx, id, "sr", 1, res.offset+1); len(recs) != written {
			t.Fatalf("node %d: %d records, want %d", id, len(recs), written)
		}
		rr, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "sr", Range: 1, FromOffset: written - 2, WantFrames: id == 2})
		if err != nil || rr.NextOffset != res.offset || rr.TailOffset != res.offset {
			t.Fatalf("node %d: read below the split: %v next %d tail %d, want both %d", id, err, rr.GetNextOffset(), rr.GetTailOffset(), res.offset)
		}
		for _, req := range []*geologv1.ReadRequest{
			{Stream: "sr", Range: 1, FromOffset: res.offset},
			{Stream: "sr", Range: 1, FromOffset: res.offset, WantFrames: true},
			{Stream: "sr", Range: 1, FromOffset: res.offset + 1},
			{Stream: "sr", Range: 1, FromOffset: 0, Key: keys[0]},
		} {
			if req.Key != nil {
				// A read by key from 0 ends at the split offset; from there
				// it ends.
				rr, err := c.Read(ctx, req)
				if err != nil || rr.NextOffset != res.offset {
					t.Fatalf("node %d: key read: %v next %d, want %d", id, err, rr.GetNextOffset(), res.offset)
				}
				req.FromOffset = rr.NextOffset
			}
			_, err := c.Read(ctx, req)
			checkRangeEnded(t, fmt.Sprintf("node %d read %v", id, req), err, res.offset, children)
		}
		checkSubscriptionEnds(t, ctx, c, written, res.offset, children)
	}
}

// checkRangeEnded checks that err is a split range's end.
func checkRangeEnded(t *testing.T, what string, err error, split uint64, children []uint32) {
	t.Helper()
	e := rpcerr.FromError(err)
	if e == nil || e.Code != apierr.RangeSplit || e.Retriable || e.SplitOffset != split || !slices.Equal(e.SplitChildren[:], children) {
		t.Fatalf("%s: %v (%+v), want RANGE_SPLIT at %d naming %v, not retriable", what, err, e, split, children)
	}
}

// checkSubscriptionEnds subscribes to range 1 of "sr" from 0: written
// records, then the end.
func checkSubscriptionEnds(t *testing.T, ctx context.Context, c geologv1.LogClient, written int, split uint64, children []uint32) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	sub, err := c.Subscribe(sctx, &geologv1.SubscribeRequest{Stream: "sr", Range: 1, Start: &geologv1.SubscribeRequest_FromOffset{FromOffset: 0}})
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for {
		resp, err := sub.Recv()
		if errors.Is(err, io.EOF) {
			t.Fatalf("subscription ended without an answer after %d records", got)
		}
		if err != nil {
			if got != written {
				t.Fatalf("subscription got %d records, want %d, then %v", got, written, err)
			}
			checkRangeEnded(t, "subscription", err, split, children)
			return
		}
		got += len(resp.Records)
		if resp.NextOffset > split || resp.TailOffset > split {
			t.Fatalf("subscription told next %d tail %d past the split offset %d", resp.NextOffset, resp.TailOffset, split)
		}
	}
}

// TestSplitEndFromMap: a range whose copy has no marker in its log
// (retention deleted it, or the copy lags) takes its end from the range
// map: reads below the split offset are bounded by it, reads at or past
// it answer the end, and a subscription waiting learns of it.
func TestSplitEndFromMap(t *testing.T) {
	t.Parallel()
	m := keyspace.NewRangeMap(2)
	split, err := m.Split(1, m.Ranges[1].HashStart+1000, 40)
	if err != nil {
		t.Fatal(err)
	}
	d := &rangeDriver{cfg: rangeDriverConfig{stream: "s", rangeID: 1}, notifyCh: make(chan struct{})}
	d.learnSplitEnd(&m) // not split yet
	if d.splitEnd.Load() != nil {
		t.Fatal("an unsplit range has an end")
	}
	waiting := d.changed()
	d.learnSplitEnd(&split)
	select {
	case <-waiting:
	default:
		t.Fatal("readers waiting were not told of the end")
	}
	if end, err := d.boundBySplit(10, 90); err != nil || end != 40 {
		t.Fatalf("read from 10 with 90 committed: end %d, %v; want 40", end, err)
	}
	for _, from := range []uint64{40, 41} {
		_, err := d.boundBySplit(from, 90)
		e := apierr.As(err)
		if e == nil || e.Code != apierr.RangeSplit || e.Retriable || e.SplitOffset != 40 || e.SplitChildren != [2]uint32{2, 3} ||
			e.SplitAt != m.Ranges[1].HashStart+1000 {
			t.Fatalf("read from %d: %v (%+v)", from, err, e)
		}
	}
}
