package regionsvc

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/tap"
)

// TestQuotaBuckets walks the token buckets on a fake clock.
func TestQuotaBuckets(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	q := newQuotas(10, 1000, func() time.Time { return now })
	if newQuotas(0, 0, time.Now) != nil {
		t.Fatal("no rates should mean no quotas")
	}
	// A second's worth of requests goes at once.
	for i := range 10 {
		if w := q.take("a", 1, 0); w != 0 {
			t.Fatalf("request %d waits %v", i, w)
		}
	}
	w := q.take("a", 1, 0)
	if w <= 0 || w > 200*time.Millisecond {
		t.Fatalf("the 11th request waits %v", w)
	}
	if q.take("b", 1, 0) != 0 {
		t.Fatal("another principal shares the first's quota")
	}
	now = now.Add(w)
	if q.take("a", 1, 0) != 0 {
		t.Fatal("refused after the wait it was told")
	}
	// A batch larger than a second's worth of bytes passes on a positive
	// balance and leaves a debt that the next request waits out.
	if q.take("c", 1, 5000) != 0 {
		t.Fatal("a large batch refused on a full bucket")
	}
	w = q.take("c", 1, 1)
	if w < 3900*time.Millisecond || w > 4100*time.Millisecond {
		t.Fatalf("after a 5 s batch the next waits %v, want about 4 s", w)
	}
}

// TestKeyMustBelongToRange: a record whose key hashes to another range is
// refused with INVALID_ARGUMENT, and nothing is appended.
func TestKeyMustBelongToRange(t *testing.T) {
	t.Parallel()
	_, c := testNode(t, t.TempDir(), nil)
	createStream(t, c, "k", 4)
	ctx := ctxT(t)
	key := []byte("room-7")
	home := keyspace.RangeForKey(key, 4)
	other := (home + 1) % 4
	_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "k", Range: other, Records: []*geologv1.Record{{Key: key, Value: []byte("v")}}})
	wantCode(t, err, apierr.InvalidArgument)
	if _, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "k", Range: home, Records: []*geologv1.Record{{Key: key, Value: []byte("v")}, {Value: []byte("keyless")}}}); err != nil {
		t.Fatalf("append to the key's range: %v", err)
	}
	rr, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "k", Range: other})
	if err != nil || rr.GetTailOffset() != 0 {
		t.Fatalf("range %d holds %d records after the refusal (%v)", other, rr.GetTailOffset(), err)
	}
}

// TestRetentionOverflowRefused: a retention age past what a duration
// holds (it wrapped negative, the ranges never opened and the name was
// stuck) is refused; the name stays free.
func TestRetentionOverflowRefused(t *testing.T) {
	t.Parallel()
	_, c := testNode(t, t.TempDir(), nil)
	ctx := ctxT(t)
	for _, ret := range []*geologv1.RetentionPolicy{{MaxAgeMs: 9_300_000_000_000}, {MaxAgeMs: 1 << 62}, {MaxBytes: 1<<62 + 1}} {
		_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "o", RangeCount: 1, Retention: ret})
		wantCode(t, err, apierr.InvalidArgument)
	}
	if _, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "o", RangeCount: 1,
		Retention: &geologv1.RetentionPolicy{MaxAgeMs: retentionAgeMillisMax}}); err != nil {
		t.Fatalf("the longest retention: %v", err)
	}
	if _, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "o", Records: recs("a", 1)}); err != nil {
		t.Fatalf("append: %v", err)
	}
}

// TestRangesMaxRefusesUpFront: a create that would take the node past its
// range bound is refused before anything is created; the ranges it has
// all serve, and a deletion makes room.
func TestRangesMaxRefusesUpFront(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, c := testNode(t, dir, func(cfg *Config) { cfg.Limits.RangesMax = 100 })
	ctx := ctxT(t)
	createStream(t, c, "a", 64)
	_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "b", RangeCount: 64})
	wantCode(t, err, apierr.LimitExceeded)
	if rpcerr.IsRetriable(err) {
		t.Fatal("LIMIT_EXCEEDED is retriable")
	}
	if _, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "b"}); rpcerr.CodeOf(err) != apierr.StreamNotFound {
		t.Fatalf("the refused stream exists: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "streams", "b")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused stream left files: %v", err)
	}
	d, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range d.GetRanges() {
		if r.GetStatus() != "ok" {
			t.Fatalf("range %d: %s", r.GetRange(), r.GetStatus())
		}
	}
	if _, err := c.DeleteStream(ctx, &geologv1.DeleteStreamRequest{Name: "a"}); err != nil {
		t.Fatal(err)
	}
	createStream(t, c, "b", 64)
}

// TestDeleteStream: a deleted stream answers STREAM_NOT_FOUND, its files
// are gone, the deletion survives a restart, and the name takes a new
// stream that starts empty.
func TestDeleteStream(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	n, c := testNode(t, dir, nil)
	ctx := ctxT(t)
	createStream(t, c, "d", 2)
	for r := uint32(0); r < 2; r++ {
		if _, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "d", Range: r, Records: recs("a", 3)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.DeleteStream(ctx, &geologv1.DeleteStreamRequest{Name: "d"}); err != nil {
		t.Fatal(err)
	}
	_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "d", Records: recs("b", 1)})
	wantCode(t, err, apierr.StreamNotFound)
	_, err = c.DeleteStream(ctx, &geologv1.DeleteStreamRequest{Name: "d"})
	wantCode(t, err, apierr.StreamNotFound)
	if _, err := os.Stat(filepath.Join(dir, "streams", "d")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the deleted stream's files: %v", err)
	}
	n.Close()
	_, c = testNode(t, dir, nil)
	if _, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "d"}); rpcerr.CodeOf(err) != apierr.StreamNotFound {
		t.Fatalf("after a restart: %v", err)
	}
	createStream(t, c, "d", 3)
	rr, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "d", Range: 0})
	if err != nil || rr.GetTailOffset() != 0 {
		t.Fatalf("the new stream holds %d records (%v)", rr.GetTailOffset(), err)
	}
}

// TestBudgetsRefuseWithRetryAfter: an append or a read that the node's
// budget cannot take now, and a request that waited receiveWaitMax while
// every receive slot is taken, get a retriable OVERLOADED with a
// retry-after; they succeed once the budget is back.
func TestBudgetsRefuseWithRetryAfter(t *testing.T) {
	t.Parallel()
	n, c := testNode(t, t.TempDir(), nil)
	createStream(t, c, "b", 1)
	ctx := ctxT(t)
	overloaded := func(what string, err error) {
		t.Helper()
		wantCode(t, err, apierr.Overloaded)
		if e := rpcerr.FromError(err); !e.Retriable || e.RetryAfter <= 0 {
			t.Fatalf("%s: %+v", what, e)
		}
	}
	l := n.limits
	whole := l.cfg.AppendBytesInflightMax
	if !l.appends.tryAcquire(whole) {
		t.Fatal("budget busy")
	}
	_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "b", Records: recs("a", 1)})
	overloaded("append", err)
	l.appends.release(whole)
	if _, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "b", Records: recs("a", 1)}); err != nil {
		t.Fatal(err)
	}

	if !l.reads.tryAcquire(l.cfg.ReadBytesInflightMax) {
		t.Fatal("budget busy")
	}
	_, err = c.Read(ctx, &geologv1.ReadRequest{Stream: "b"})
	overloaded("read", err)
	l.reads.release(l.cfg.ReadBytesInflightMax)
	if _, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "b"}); err != nil {
		t.Fatal(err)
	}

	for range l.cfg.RequestsReceivingMax {
		if !l.receiving.tryTake() {
			t.Fatal("slot busy")
		}
	}
	_, err = c.Append(ctx, &geologv1.AppendRequest{Stream: "b", Records: recs("a", 1)})
	overloaded("a request arriving with every slot taken", err)
	for range l.cfg.RequestsReceivingMax {
		l.receiving.give()
	}
	if _, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "b", Records: recs("a", 1)}); err != nil {
		t.Fatal(err)
	}
	if l.appends.inUse() != 0 || l.reads.inUse() != 0 {
		t.Fatalf("budgets not returned: appends %d, reads %d", l.appends.inUse(), l.reads.inUse())
	}
}

// TestSlowSubscriberCutOff: a subscriber that takes nothing is cut off
// with SLOW_CONSUMER once a message waited SubscriberSendTimeout, and what
// the node held for it is returned; the node serves on.
func TestSlowSubscriberCutOff(t *testing.T) {
	t.Parallel()
	n, c := testNode(t, t.TempDir(), func(cfg *Config) { cfg.Limits.SubscriberSendTimeout = time.Second })
	createStream(t, c, "s", 1)
	ctx := ctxT(t)
	value := make([]byte, 512<<10)
	for range 16 {
		if _, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Records: []*geologv1.Record{{Value: value}}}); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := c.Subscribe(ctx, &geologv1.SubscribeRequest{Stream: "s", Start: &geologv1.SubscribeRequest_FromOffset{FromOffset: 0}})
	if err != nil {
		t.Fatal(err)
	}
	// Take nothing until the node has had to wait for us.
	waitUntil(t, ctx, 30*time.Second, "the subscriber cut off", func() bool {
		return n.limits.reads.inUse() == 0 && n.limits.refusals("slow_consumer") > 0
	})
	var got error
	for got == nil {
		_, got = sub.Recv()
	}
	wantCode(t, got, apierr.SlowConsumer)
	if !rpcerr.IsRetriable(got) {
		t.Fatal("SLOW_CONSUMER is final")
	}
	if _, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "s", MaxRecords: 1}); err != nil {
		t.Fatalf("the node after the cut-off: %v", err)
	}
}

// TestQuotaSDKBacksOff: with a byte quota, a producer through the SDK gets
// every record appended, at the quota's pace; the server refused some of
// its requests with a retry-after, which the SDK waited out instead of
// retrying at its own (here 1 ms) backoff.
func TestQuotaSDKBacksOff(t *testing.T) {
	t.Parallel()
	const rate = 64 << 10
	n, _ := testNode(t, t.TempDir(), func(cfg *Config) { cfg.Limits.QuotaBytesPerSecond = rate })
	ctx := ctxT(t)
	c, err := client.New(n.Addr(), client.RetryBackoff(time.Millisecond, 2*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.CreateStream(ctx, client.StreamConfig{Name: "q", RangeCount: 1}); err != nil {
		t.Fatal(err)
	}
	p, err := c.NewProducer("q", client.ProducerRetryBackoff(time.Millisecond, 2*time.Millisecond), client.DeliveryTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const records, size = 64, 4 << 10 // 256 KiB: at least 3 s past the first second's worth
	start := time.Now()
	for i := range records {
		if _, err := p.ProduceSync(ctx, &client.Record{Value: make([]byte, size)}); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	took := time.Since(start)
	refused := n.limits.refusals("quota")
	t.Logf("%d records of %d bytes in %v at %d bytes/s: %d requests refused", records, size, took, rate, refused)
	if took < 2*time.Second {
		t.Fatalf("%v: faster than the quota allows", took)
	}
	if refused == 0 || refused > 2*records {
		t.Fatalf("%d refusals: the SDK did not wait as told", refused)
	}
	// A raw client sees the refusal and its retry-after: a batch of two
	// seconds' worth passes on a positive balance, the next waits.
	conn, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw := geologv1.NewLogClient(conn)
	waitUntil(t, ctx, 10*time.Second, "the quota refilled", func() bool {
		_, err = raw.Append(ctx, &geologv1.AppendRequest{Stream: "q", Records: []*geologv1.Record{{Value: make([]byte, 2*rate)}}})
		return err == nil
	})
	_, err = raw.Append(ctx, &geologv1.AppendRequest{Stream: "q", Records: recs("x", 1)})
	if e := rpcerr.FromError(err); e.Code != apierr.Overloaded || e.RetryAfter < time.Second {
		t.Fatalf("over the quota: %v (retry after %v)", err, e.RetryAfter)
	}
}

// TestSmallRequestsWaitForReceiveSlots: with every receive slot taken,
// 256 concurrent cursor commits are all admitted to wait (none refused,
// none read), and all are committed once the slots come free; a request
// past RequestsWaitingMax is refused at once with OVERLOADED, so what
// waits stays bounded.
func TestSmallRequestsWaitForReceiveSlots(t *testing.T) {
	t.Parallel()
	const commits = 256
	n, lc := testNode(t, t.TempDir(), func(cfg *Config) {
		cfg.Limits.RequestsReceivingMax = 2
		cfg.Limits.RequestsWaitingMax = commits
		cfg.Limits.receiveWait = 5 * time.Minute
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	createStream(t, lc, "chat", 4)
	appendN(t, ctx, lc, "chat", 1, 10)
	cc := consumerClient(t, n.Addr())
	if _, err := cc.CommitCursors(ctx, &geologv1.CommitCursorsRequest{Cursor: "warm",
		Positions: []*geologv1.CursorPosition{{Stream: "chat", Range: 1, Offset: 1}}}); err != nil {
		t.Fatal(err) // the cursor stream exists before the slots are taken
	}
	l := n.limits
	for range l.cfg.RequestsReceivingMax {
		if !l.receiving.tryTake() {
			t.Fatal("slot busy")
		}
	}
	var done atomic.Int64
	errs := make([]error, commits)
	var wg sync.WaitGroup
	for i := range commits {
		wg.Go(func() {
			_, errs[i] = cc.CommitCursors(ctx, &geologv1.CommitCursorsRequest{Cursor: fmt.Sprintf("dev-%d", i),
				Positions: []*geologv1.CursorPosition{{Stream: "chat", Range: 1, Offset: uint64(i % 11)}}})
			done.Add(1)
		})
	}
	waitUntil(t, ctx, 4*time.Minute, "every commit waiting", func() bool { return l.waiting.inUse() == commits })
	if d, r := done.Load(), l.refusals("receiving"); d != 0 || r != 0 {
		t.Fatalf("with every receive slot taken: %d commits answered, %d refused", d, r)
	}
	_, err := lc.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "chat"})
	wantCode(t, err, apierr.Overloaded)
	for range l.cfg.RequestsReceivingMax {
		l.receiving.give()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("commit %d: %v", i, err)
		}
	}
	if r := l.refusals("receiving"); r != 1 {
		t.Fatalf("%d refusals, want the one past the waiting bound", r)
	}
	waitUntil(t, ctx, time.Minute, "the slots returned", func() bool {
		return l.waiting.inUse() == 0 && l.receiving.inUse() == 0
	})
}

// TestTapGatesOnlyGatedMethods: the tap gives a method whose handler takes
// a receive slot before it reads (receiveGated) a waiting slot, and any
// other method of the client API the receive slot itself, refusing it at
// once with OVERLOADED when none is free, so that no request of the API
// is read outside the bound.
func TestTapGatesOnlyGatedMethods(t *testing.T) {
	t.Parallel()
	cfg := LimitsConfig{RequestsReceivingMax: 1, RequestsWaitingMax: 1}
	cfg.setDefaults(1024)
	l := newLimits(cfg, time.Now, nil, hclog.NewNullLogger())
	l.receiveGated(&grpc.ServiceDesc{ServiceName: "geolog.v1.Gated", HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Small"}}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tapped := func(method string) error {
		_, err := l.tap(ctx, &tap.Info{FullMethodName: method})
		return err
	}
	if err := tapped("/geolog.v1.Gated/Small"); err != nil || l.waiting.inUse() != 1 || l.receiving.inUse() != 0 {
		t.Fatalf("gated: %v, waiting %d, receiving %d", err, l.waiting.inUse(), l.receiving.inUse())
	}
	if err := tapped("/geolog.v1.Other/Call"); err != nil || l.receiving.inUse() != 1 {
		t.Fatalf("ungated: %v, receiving %d", err, l.receiving.inUse())
	}
	for _, m := range []string{"/geolog.v1.Gated/Small", "/geolog.v1.Other/Call"} {
		if e := rpcerr.FromError(tapped(m)); e == nil || e.Code != apierr.Overloaded {
			t.Fatalf("%s past its bound: %v", m, e)
		}
	}
	cancel() // the RPCs end: everything comes back
	waitUntil(t, context.Background(), 10*time.Second, "the slots returned", func() bool {
		return l.waiting.inUse() == 0 && l.receiving.inUse() == 0
	})
}

// TestWaitingMaxFollowsMemoryLimit: without a memory limit 256 requests
// may wait to be read; under one, the waiting requests' stream windows
// hold at most a quarter of it, never fewer than 16 requests.
func TestWaitingMaxFollowsMemoryLimit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		limit int64
		want  int
	}{
		{math.MaxInt64, 256}, // none set
		{0, 256},
		{700 << 20, 43},
		{8 << 30, 256},
		{64 << 20, 16},
	} {
		if got := waitingMaxDefault(c.limit); got != c.want {
			t.Errorf("memory limit %d: %d may wait, want %d", c.limit, got, c.want)
		}
	}
}
