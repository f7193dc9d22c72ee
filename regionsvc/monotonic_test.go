package regionsvc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/wan"
)

// TestReadPastLaggingMirror (DESIGN.md invariant 8): a reader that read a
// range to its tail at the home moves to a mirror that lags (its WAN links
// are cut). Reads and subscriptions there past the mirror's tail are
// retriable (OFFSET_PAST_LOCAL_TAIL, the tail the mirror serves), never
// OFFSET_OUT_OF_RANGE, whether or not the home can be asked; once the
// mirror can reach the home, a read past the range's own tail is
// OFFSET_OUT_OF_RANGE (final) and one within it is served as soon as the
// mirror catches up.
func TestReadPastLaggingMirror(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := newWorld(t, []string{"us", "eu"}, 1, 5*time.Millisecond, time.Millisecond)
	createGeoStream(t, ctx, w, "lag", 1) // range 0 homed in us
	c, err := client.New(w.regionAddrs("us"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	produce := func(from, n int) {
		p, err := c.NewProducer("lag")
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		var recs []*client.Record
		for i := from; i < from+n; i++ {
			recs = append(recs, &client.Record{Value: []byte(fmt.Sprint(i))})
		}
		if _, err := p.ProduceSync(ctx, recs...); err != nil {
			t.Fatal(err)
		}
	}
	produce(0, 100)
	waitUntil(t, ctx, time.Minute, "eu's mirror at 100", func() bool { return w.tails(ctx, "lag")["eu"][0] >= 100 })
	if _, err := w.net.CutRegion("eu", wan.CutBlackhole); err != nil {
		t.Fatal(err)
	}
	produce(100, 50)
	home, eu := w.conns["us"][1], w.conns["eu"][1]
	// The reader reads the home to its tail (a local read right after
	// the acks may not see them yet: wait for them).
	r, err := home.Read(ctx, &geologv1.ReadRequest{Stream: "lag", Range: 0, MaxRecords: 1000,
		Consistency: geologv1.Consistency_CONSISTENCY_MIN_OFFSET, MinOffset: 150})
	if err != nil || len(r.GetRecords()) != 150 {
		t.Fatalf("the home holds %d records (%v), want 150", len(r.GetRecords()), err)
	}
	// The mirror lags at 100; the reader is at 150.
	for _, from := range []uint64{120, 150, 100_000} {
		_, err := readErr(ctx, eu, from)
		if e := apierr.As(err); e == nil || e.Code != apierr.PastLocalTail || !e.Retriable || e.TailOffset != 100 {
			t.Fatalf("read at %d on the cut-off mirror: %v, want a retriable OFFSET_PAST_LOCAL_TAIL at 100", from, err)
		}
	}
	sub, err := eu.Subscribe(ctx, &geologv1.SubscribeRequest{Stream: "lag", Start: &geologv1.SubscribeRequest_FromOffset{FromOffset: 150}})
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if _, err := sub.Recv(); rpcerr.CodeOf(rpcerr.FromError(err)) != apierr.PastLocalTail || !rpcerr.FromError(err).Retriable {
		t.Fatalf("subscription at 150 on the mirror at 100: %v, want a retriable OFFSET_PAST_LOCAL_TAIL", err)
	}
	t.Logf("the subscription past the mirror's tail ended after %v", time.Since(began).Round(time.Millisecond))
	if err := w.net.HealAll(); err != nil {
		t.Fatal(err)
	}
	// With the home reachable: past the range's tail is final...
	waitUntil(t, ctx, time.Minute, "a final answer past the range's tail", func() bool {
		_, err := readErr(ctx, eu, 100_000)
		e := apierr.As(err)
		return e != nil && e.Code == apierr.OffsetOutOfRange && !e.Retriable && e.TailOffset == 150
	})
	// ... and within it the mirror serves once it has caught up.
	waitUntil(t, ctx, time.Minute, "the mirror serving 149", func() bool {
		r, err := readErr(ctx, eu, 149)
		return err == nil && len(r.GetRecords()) == 1 && string(r.GetRecords()[0].GetValue()) == "149"
	})
}

func readErr(ctx context.Context, c geologv1.LogClient, from uint64) (*geologv1.ReadResponse, error) {
	return readN(ctx, c, from, 1)
}

func readN(ctx context.Context, c geologv1.LogClient, from uint64, n uint32) (*geologv1.ReadResponse, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := c.Read(cctx, &geologv1.ReadRequest{Stream: "lag", Range: 0, FromOffset: from, MaxRecords: n})
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, rpcerr.FromError(err)
	}
	return r, err
}
