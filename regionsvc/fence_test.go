package regionsvc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/homing"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/wan"
)

// rawRecord is a record a raw subscription received, and when.
type rawRecord struct {
	offset, epoch uint64
	value         string
	at            time.Time
}

// rawSub is a Subscribe stream on one node, recording what it receives.
type rawSub struct {
	mu   sync.Mutex
	recs []rawRecord
	err  error
	done chan struct{}
}

func startRawSub(ctx context.Context, c geologv1.LogClient, stream string, from uint64) *rawSub {
	s := &rawSub{done: make(chan struct{})}
	go func() {
		defer close(s.done)
		sub, err := c.Subscribe(ctx, &geologv1.SubscribeRequest{Stream: stream, Start: &geologv1.SubscribeRequest_FromOffset{FromOffset: from}})
		for err == nil {
			var resp *geologv1.SubscribeResponse
			if resp, err = sub.Recv(); err == nil {
				s.mu.Lock()
				for _, r := range resp.GetRecords() {
					s.recs = append(s.recs, rawRecord{r.GetOffset(), r.GetEpoch(), string(r.GetValue()), time.Now()})
				}
				s.mu.Unlock()
			}
		}
		s.mu.Lock()
		s.err = rpcerr.FromError(err)
		s.mu.Unlock()
	}()
	return s
}

func (s *rawSub) records() []rawRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]rawRecord(nil), s.recs...)
}

// TestFailbackFencesLocalReads (DESIGN.md invariant 8, "Divergent tails"):
// the home region us is cut off from everything while its producer and
// readers still reach it: it acks and serves a divergent tail until its
// lease expires, and another region takes the range over at epoch 2 and
// appends other records at the same offsets. Then us reaches the lease
// store again, but not the new home (no fork yet). Once it knows the new
// epoch: its live subscription inside the divergent tail ends, retriable;
// local reads and subscriptions at or past the new epoch's start get
// OFFSET_PAST_LOCAL_TAIL and below it serve nothing past it; no record of
// epoch 1 at or past that start reaches a reader of us. When the links
// heal, us forks; the SDK subscription that delivered the divergent tail
// ends with a ForkError at the fork offset, and every divergent record a
// reader saw is in the orphan log with its offset and epoch.
func TestFailbackFencesLocalReads(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster with a lease store")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	w := newHomingWorld(t, []string{"us", "eu", "ap"}, 1)
	createHomedStream(t, ctx, w.world, "fence", 1, "us")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var log ackLog
	produceLoop(t, ctx, w.world, "fence", "us", 200, stop, &log, &wg)
	defer func() { close(stop); wg.Wait() }()
	waitUntil(t, ctx, time.Minute, "replicated acks", func() bool {
		tl := w.tails(ctx, "fence")
		return tl["eu"] != nil && tl["eu"][0] >= 100
	})
	us := w.conns["us"][1]
	live := startRawSub(ctx, us, "fence", 0)
	sdk, err := client.New(w.regionAddrs("us"), client.RetriesMax(1000), client.RetryBackoff(20*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer sdk.Close()
	sdkEnd := make(chan error, 1)
	var sdkNext uint64
	go func() {
		for rec, err := range sdk.Subscribe(ctx, "fence", 0, client.StartAt{}) {
			if err != nil {
				sdkEnd <- err
				return
			}
			if rec.Offset != sdkNext {
				sdkEnd <- fmt.Errorf("the SDK delivered offset %d, want %d", rec.Offset, sdkNext)
				return
			}
			sdkNext++
		}
	}()

	// us alone, with its producer: a divergent tail until its lease ends.
	if _, err := w.net.CutRegion("us", wan.CutBlackhole); err != nil {
		t.Fatal(err)
	}
	var newHome string
	waitUntil(t, ctx, 2*time.Minute, "a new home", func() bool {
		h, e := rangeHome(ctx, w.world, "eu", "fence", 0)
		newHome = h
		return h != "us" && h != "" && e >= 2
	})
	appendAt(t, ctx, w, newHome, "fence", 20) // epoch 2 records where us holds epoch 1 ones

	// us reaches the lease store again, not the new home.
	for _, l := range w.net.Links() {
		if l.From() == "us" && l.To() == "pg" {
			if err := l.Heal(); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitUntil(t, ctx, 2*time.Minute, "us knows the new home", func() bool {
		h, e := rangeHome(ctx, w.world, "us", "fence", 0)
		return h == newHome && e >= 2
	})
	learned := time.Now()
	fence := fenceOf(ctx, t, us, "fence")
	t.Logf("us knows the new home %s at %v; its fence is at %d", newHome, learned.Format("15:04:05.000"), fence)
	select {
	case <-live.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the live subscription inside the divergent tail was not ended within 5 s of the node knowing the new epoch")
	}
	if e := apierr.As(live.err); e == nil || e.Code != apierr.PastLocalTail || !e.Retriable || e.TailOffset != fence {
		t.Fatalf("the live subscription ended with %v, want a retriable OFFSET_PAST_LOCAL_TAIL at %d", live.err, fence)
	}
	checkFencedReads(ctx, t, us, "fence", fence)
	checkNoTakeoverCandidate(ctx, t, w, us, fence)

	// Everything heals: us forks and follows the new home.
	if err := w.net.HealAll(); err != nil {
		t.Fatal(err)
	}
	var sdkErr error
	select {
	case sdkErr = <-sdkEnd:
	case <-time.After(2 * time.Minute):
		t.Fatal("the SDK subscription did not end after the fork")
	}
	var fe *client.ForkError
	if !errors.As(sdkErr, &fe) || fe.Offset != fence || fe.DeliveredEpoch != 1 {
		t.Fatalf("the SDK subscription ended with %v, want a ForkError at %d", sdkErr, fence)
	}
	t.Logf("the SDK subscription ended: %v", fe)
	checkDivergentReads(ctx, t, w, live.records(), fence, learned)
}

// checkNoTakeoverCandidate: us, holding a divergent tail from fence on,
// offers no tail to take range 0 over at, neither to its own region's
// failover agent (surveyTails' Local) nor to another region's (tailsOf reads
// every node's DescribeStream: candidatesOf), and a planned rehome's wait for its
// copy finds nothing there (notes/simfaults.md, product bug 2: it offered
// its committed end, past the fence).
func checkNoTakeoverCandidate(ctx context.Context, t *testing.T, w *homingWorld, us geologv1.LogClient, fence uint64) {
	t.Helper()
	key := homing.RangeKey{Stream: "fence", Range: 0}
	if tail, ok := (&failoverAgent{n: w.nodes["us"][1]}).surveyTails(ctx, nil, []homing.RangeKey{key}).Local[key]; ok {
		t.Errorf("us offers its divergent copy to take range 0 over at %d (fence %d)", tail, fence)
	}
	d, err := us.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "fence"})
	if err != nil {
		t.Fatal(err)
	}
	if c := candidatesOf(d, 1)[0]; c == nil || !c.barred {
		t.Errorf("us's copy for another region's agent: %+v, want barred (committed %d, fence %d)", c, d.GetRanges()[0].GetTailOffset(), fence)
	}
	// Read over every node of us (the others' DescribeStream answers), as
	// a rehome's coordinator there reads them (us is cut off the others).
	if tails := w.nodes["us"][1].tailsOf(ctx, "us", "fence"); len(tails) != 1 || tails[0] != 0 {
		t.Errorf("us's tails read over its nodes: %v, want [0] (no candidate)", tails)
	}
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := w.nodes["us"][1].waitRegionTail(wctx, "us", "fence", 0, fence+1); err == nil {
		t.Errorf("a planned rehome's wait for us's copy to reach %d passed on its divergent tail", fence+1)
	}
}

// appendAt appends n records to stream's range 0 through region.
func appendAt(t *testing.T, ctx context.Context, w *homingWorld, region, stream string, n int) {
	c, err := client.New(w.regionAddrs(region))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := c.NewProducer(stream, client.DeliveryTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var recs []*client.Record
	for i := 0; i < n; i++ {
		recs = append(recs, &client.Record{Key: []byte("after"), Value: []byte(fmt.Sprintf("after/%d", i))})
	}
	if _, err := p.ProduceSync(ctx, recs...); err != nil {
		t.Fatal(err)
	}
}

// fenceOf is the node's timeline fence of range 0 (DescribeStream).
func fenceOf(ctx context.Context, t *testing.T, c geologv1.LogClient, stream string) uint64 {
	d, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: stream})
	if err != nil {
		t.Fatal(err)
	}
	ri := d.GetRanges()[0]
	if ri.TimelineFenceOffset == nil || ri.GetTailOffset() <= ri.GetTimelineFenceOffset() {
		t.Fatalf("no fence below the divergent tail: tail %d, fence %v", ri.GetTailOffset(), ri.TimelineFenceOffset)
	}
	return ri.GetTimelineFenceOffset()
}

// checkFencedReads: on a node fenced at fence, reads and subscriptions
// past it are refused (retriable, at the fence), one at it finds the tail
// there, and below it they serve nothing past it.
func checkFencedReads(ctx context.Context, t *testing.T, c geologv1.LogClient, stream string, fence uint64) {
	t.Helper()
	for _, from := range []uint64{fence + 1, fence + 5} {
		_, err := c.Read(ctx, &geologv1.ReadRequest{Stream: stream, FromOffset: from})
		if e := rpcerr.FromError(err); e == nil || e.Code != apierr.PastLocalTail || !e.Retriable || e.TailOffset != fence {
			t.Fatalf("read at %d on the fenced node: %v", from, err)
		}
	}
	if r, err := c.Read(ctx, &geologv1.ReadRequest{Stream: stream, FromOffset: fence}); err != nil || len(r.GetRecords()) != 0 || r.GetTailOffset() != fence {
		t.Fatalf("read at the fence %d: %d records, tail %d, %v", fence, len(r.GetRecords()), r.GetTailOffset(), err)
	}
	below := fence - min(fence, 10)
	r, err := c.Read(ctx, &geologv1.ReadRequest{Stream: stream, FromOffset: below, MaxRecords: 1000})
	if err != nil || r.GetTailOffset() != fence || r.GetNextOffset() > fence {
		t.Fatalf("read at %d below the fence %d: next %d, tail %d, %v", below, fence, r.GetNextOffset(), r.GetTailOffset(), err)
	}
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	sub := startRawSub(sctx, c, stream, below)
	<-sub.done
	for _, rec := range sub.records() {
		if rec.offset >= fence {
			t.Fatalf("a subscription below the fence received offset %d (epoch %d)", rec.offset, rec.epoch)
		}
	}
	sub = startRawSub(ctx, c, stream, fence+1)
	<-sub.done
	if e := apierr.As(sub.err); e == nil || e.Code != apierr.PastLocalTail {
		t.Fatalf("a subscription past the fence: %v", sub.err)
	}
}

// checkDivergentReads: what the live subscription received at or past the
// fence is epoch 1, received before the node knew (learned; in flight on
// loopback, 200 ms of slack), and in us's orphan log at its offset; us's
// copy now holds the new home's records there.
func checkDivergentReads(ctx context.Context, t *testing.T, w *homingWorld, recs []rawRecord, fence uint64, learned time.Time) {
	t.Helper()
	admin := geologv1.NewAdminClient(mustConn(t, w.addrs["us"][1]))
	var orphans map[uint64]string
	waitUntil(t, ctx, time.Minute, "us forked", func() bool {
		forks, err := admin.ListOrphans(ctx, &geologv1.ListOrphansRequest{Stream: "fence"})
		if err != nil || len(forks.GetForks()) != 1 {
			return false
		}
		f := forks.GetForks()[0]
		if f.GetForkOffset() != fence {
			t.Fatalf("forked at %d, fenced at %d", f.GetForkOffset(), fence)
		}
		res, err := admin.ReadOrphans(ctx, &geologv1.ReadOrphansRequest{Stream: "fence", ForkIndex: f.GetForkIndex(), FromOffset: fence, MaxRecords: 100_000})
		if err != nil {
			return false
		}
		orphans = map[uint64]string{}
		for _, r := range res.GetRecords() {
			orphans[r.GetOffset()] = string(r.GetValue())
		}
		return true
	})
	divergent := 0
	for _, r := range recs {
		if r.offset < fence {
			continue
		}
		divergent++
		switch {
		case r.epoch != 1:
			t.Fatalf("the live subscription on us received offset %d of epoch %d", r.offset, r.epoch)
		case r.at.After(learned.Add(200 * time.Millisecond)):
			t.Fatalf("offset %d of the divergent tail reached a reader %v after us knew the new epoch", r.offset, r.at.Sub(learned))
		case orphans[r.offset] != r.value:
			t.Fatalf("offset %d (%q) read from the divergent tail is not in the orphan log (%q)", r.offset, r.value, orphans[r.offset])
		}
	}
	if divergent == 0 {
		t.Fatal("no reader saw the divergent tail: the cut did not leave one")
	}
	after, err := w.readLocal(ctx, "us", "fence", 0, fence, fence+1)
	if err != nil || len(after) != 1 || after[0].GetEpoch() < 2 || !strings.HasPrefix(string(after[0].GetValue()), "after/") {
		t.Fatalf("us's copy at %d after the fork: %v %v", fence, after, err)
	}
	t.Logf("%d divergent records read on us before it knew, all in its orphan log", divergent)
}
