package client_test

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/client"
)

// TestSplitPauseFigure measures what a split costs the producers of the
// range that splits (issue 12's "split pause"): a keyed producer appends
// at a fixed rate to a real node, range 1 splits halfway through, and the
// test prints the produce latency (from each record's scheduled send to
// its ack) of the records sent in the second around the split beside the
// records sent before it, and the longest. It asserts only that every
// record is acknowledged; the figures are printed, not judged (timing on
// a shared machine is a measurement). GEOLOG_SPLIT_FIGURE=1 runs it:
//
//	GEOLOG_SPLIT_FIGURE=1 go test ./client -run TestSplitPauseFigure -count=1 -v
func TestSplitPauseFigure(t *testing.T) {
	if os.Getenv("GEOLOG_SPLIT_FIGURE") == "" {
		t.Skip("GEOLOG_SPLIT_FIGURE not set")
	}
	const rate, seconds, keys = 2000, 6, 64
	n := startNode(t, t.TempDir(), "127.0.0.1:0")
	c := newClient(t, n.Addr())
	ctx := testCtx(t)
	if _, err := c.CreateStream(ctx, client.StreamConfig{Name: "pause", RangeCount: 2}); err != nil {
		t.Fatal(err)
	}
	p := newProducer(t, c, "pause", client.Linger(time.Millisecond))
	type sample struct {
		sent    time.Time
		latency time.Duration
		rng     uint32
	}
	var mu sync.Mutex
	var samples []sample
	var errs []error
	var wg sync.WaitGroup
	var splitAt time.Time
	start := time.Now()
	interval := time.Second / rate
	for i := 0; i < rate*seconds; i++ {
		sched := start.Add(time.Duration(i) * interval)
		if d := time.Until(sched); d > 0 {
			time.Sleep(d)
		}
		if i == rate*seconds/2 {
			splitAt = time.Now()
			go splitRange(t, ctx, n.Addr(), "pause", 1)
		}
		wg.Add(1)
		p.Produce(ctx, &client.Record{Key: fmt.Appendf(nil, "k%d", i%keys), Value: []byte("v")}, func(res client.ProduceResult, err error) {
			defer wg.Done()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			samples = append(samples, sample{sent: sched, latency: time.Since(sched), rng: res.Range})
		})
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d records failed, first: %v", len(errs), errs[0])
	}
	var before, around []time.Duration
	children := 0
	for _, s := range samples {
		switch {
		case s.sent.Before(splitAt.Add(-time.Second)):
			before = append(before, s.latency)
		case s.sent.Before(splitAt.Add(time.Second)):
			around = append(around, s.latency)
		}
		if s.rng > 1 {
			children++
		}
	}
	if children == 0 {
		t.Fatal("no record reached a child: the range did not split")
	}
	q := func(d []time.Duration, p float64) time.Duration {
		slices.Sort(d)
		return d[min(len(d)-1, int(float64(len(d))*p))]
	}
	t.Logf("split pause, %d records/s over %d keys, one node: before the split p50 %v p99 %v (%d records); within 1 s of it p50 %v p99 %v max %v (%d records); %d records went to the children",
		rate, keys, q(before, 0.5), q(before, 0.99), len(before), q(around, 0.5), q(around, 0.99), q(around, 1), len(around), children)
}
