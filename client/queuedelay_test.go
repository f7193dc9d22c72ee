package client_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/client/clienttest"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// TestQueueDelayBoundBindsFirst: while nothing is acknowledged the
// queueing-delay bound holds the producer to where it starts (64 KiB, or
// one batch if larger), far below
// BufferedBytesMax: the next Produce blocks (until its context ends), or
// with FailWhenFull fails at once with a retriable OVERLOADED caused by
// ErrBufferFull. Once the server answers, everything held is acknowledged
// and the refused record, produced again, lands once.
func TestQueueDelayBoundBindsFirst(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr())
	opts := []client.ProducerOpt{client.BatchBytesMax(32 << 10), client.BufferedBytesMax(1 << 20), client.QueueDelayTarget(time.Second)}
	blocking := newProducer(t, c, "s", opts...)
	failing := newProducer(t, c, "s", append(opts, client.FailWhenFull())...)
	ctx := testCtx(t)
	for _, p := range []*client.Producer{blocking, failing} {
		if _, err := p.RangeCount(ctx); err != nil {
			t.Fatal(err)
		}
	}

	hold := make(chan struct{})
	fake.SetAppendFault(func(int64, *geologv1.AppendRequest) clienttest.Fault { return clienttest.Fault{Hold: hold} })
	rs := newResults()
	value := bytes.Repeat([]byte("v"), 16000)
	again := bytes.Repeat([]byte("a"), 2000) // fits in 64 KiB alone, not beside 4 x 16 KB
	// 4 x 16 KB fit in 64 KiB; a fifth does not.
	for i := range 4 {
		blocking.Produce(ctx, &client.Record{Value: value}, rs.cb(i))
		failing.Produce(ctx, &client.Record{Value: value}, rs.cb(10+i))
	}
	// Produce blocks (a record that went through would return at once)
	// until its context ends.
	cctx, cancel := context.WithCancel(ctx)
	returned, got := make(chan struct{}), make(chan error, 1)
	go func() {
		defer close(returned)
		blocking.Produce(cctx, &client.Record{Value: value}, func(_ client.ProduceResult, err error) { got <- err })
	}()
	select {
	case <-returned:
		t.Fatal("Produce returned past the queueing-delay bound")
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	<-returned
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	// Fails at once: its context (20 s) is not what ends it.
	start := time.Now()
	_, err := failing.ProduceSync(ctx, &client.Record{Value: again})
	if !errors.Is(err, client.ErrBufferFull) || client.CodeOf(err) != client.CodeOverloaded ||
		!client.IsRetriable(err) || client.RetryAfter(err) != time.Second {
		t.Fatalf("got %v (retry after %v), want a retriable OVERLOADED of ErrBufferFull", err, client.RetryAfter(err))
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("FailWhenFull took %v", el)
	}

	close(hold)
	rs.wait(t)
	if len(rs.errs) != 0 {
		t.Fatal(rs.errs)
	}
	if _, err := failing.ProduceSync(ctx, &client.Record{Value: again}); err != nil {
		t.Fatal(err)
	}
	count := 0
	for _, r := range fake.Records("s", 0) {
		if bytes.Equal(r.GetValue(), again) {
			count++
		}
	}
	if count != 1 || len(fake.Records("s", 0)) != 9 {
		t.Fatalf("log holds %d records, \"again\" %d times; want 9 and once", len(fake.Records("s", 0)), count)
	}
}
