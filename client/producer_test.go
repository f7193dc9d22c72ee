package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/client/clienttest"
	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// warmUp acknowledges one record on range 0 so that the producer's id is
// known there and it pipelines at once (a new id sends one batch at a time
// until its first ack).
func warmUp(t *testing.T, p *client.Producer) {
	t.Helper()
	if _, err := p.ProduceSync(testCtx(t), &client.Record{Key: []byte("k"), Value: []byte("warm")}); err != nil {
		t.Fatal(err)
	}
}

func TestProduceRoutesByKey(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("s", 4)
	c := newClient(t, fake.Addr())
	p := newProducer(t, c, "s")
	ctx := testCtx(t)

	var recs []*client.Record
	for i := range 200 {
		recs = append(recs, &client.Record{
			Key:     fmt.Appendf(nil, "k%d", i%20),
			Value:   fmt.Appendf(nil, "v%d", i),
			Headers: []client.Header{{Key: "h", Value: []byte("x")}},
		})
	}
	res, err := p.ProduceSync(ctx, recs...)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if want := keyspace.RangeForKey(recs[i].Key, 4); r.Range != want {
			t.Fatalf("record %d: range %d, want %d", i, r.Range, want)
		}
		stored := fake.Records("s", r.Range)[r.Offset]
		if !bytes.Equal(stored.GetValue(), recs[i].Value) || stored.GetHeaders()[0].GetKey() != "h" {
			t.Fatalf("record %d: offset %d holds %q", i, r.Offset, stored.GetValue())
		}
		if stored.GetProducerTimeUnixNanos() == 0 || r.AppendTime.IsZero() || r.Epoch != 1 {
			t.Fatalf("record %d: times or epoch not set: %+v", i, r)
		}
	}
	// Idempotent by default: every batch carries the producer id.
	for rng := range uint32(4) {
		for _, b := range fake.Batches("s", rng) {
			if b.ProducerID != p.ID() || p.ID() == 0 {
				t.Fatalf("batch with producer id %d, want %d", b.ProducerID, p.ID())
			}
		}
	}
}

// TestKeylessRecordsStickToARange: keyless records go to one sticky range
// and move on, to another range, once it took 16 KiB of them (Kafka's
// batch.size, as its uniform sticky partitioner, KIP-794): a producer
// below capacity does not send each record in an append of its own to
// the next idle range, and one at full speed still spreads over the
// ranges every 16 KiB.
func TestKeylessRecordsStickToARange(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("s", 4)
	c := newClient(t, fake.Addr())
	// A long linger: the records wait for Flush, so none is cut while
	// they are produced (and no queueing-delay bound: 100 KB unsent).
	p := newProducer(t, c, "s", client.Linger(time.Hour), client.QueueDelayTarget(0))
	ctx := testCtx(t)

	// ranges produces n records of size bytes and returns the range each
	// landed in, in the order they were produced.
	ranges := func(n, size int) []uint32 {
		t.Helper()
		rs := newResults()
		for i := range n {
			p.Produce(ctx, &client.Record{Value: bytes.Repeat([]byte{'a' + byte(i%26)}, size)}, rs.cb(i))
		}
		if err := p.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		rs.wait(t)
		if len(rs.errs) != 0 {
			t.Fatal(rs.errs)
		}
		got := make([]uint32, n)
		for i := range n {
			got[i] = rs.res[i].Range
		}
		return got
	}
	// 100 records of 100 B: 10 KB, below 16 KiB: all in one range.
	small := ranges(100, 100)
	for i, r := range small {
		if r != small[0] {
			t.Fatalf("small record %d went to range %d, the first to %d: moved before 16 KiB", i, r, small[0])
		}
	}
	// Records of 1000 B: runs of about 16 (16 KiB), each in another range
	// than the run before. The sticky range had taken 10 KB already, so
	// the first run is shorter.
	large := ranges(100, 1000)
	var runs []int
	for i := range large {
		if i == 0 || large[i] != large[i-1] {
			runs = append(runs, 0)
		}
		runs[len(runs)-1]++
	}
	if len(runs) < 5 {
		t.Fatalf("100 records of 1000 B in %d runs %v, want a new range about every 16 KiB", len(runs), runs)
	}
	for _, n := range runs[1 : len(runs)-1] {
		if n != runs[1] || n < 12 || n > 17 {
			t.Fatalf("runs of %v records, want runs of 16 KiB each (12-17 records)", runs)
		}
	}
	if runs[0] >= runs[1] {
		t.Fatalf("first run of %d records after 10 KB in the same range, want fewer than %d", runs[0], runs[1])
	}
}

func TestLingerFormsOneBatch(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr())
	p := newProducer(t, c, "s", client.Linger(200*time.Millisecond))
	ctx := testCtx(t)

	rs := newResults()
	start := time.Now()
	for i := range 100 {
		p.Produce(ctx, &client.Record{Key: []byte("k"), Value: []byte(strconv.Itoa(i))}, rs.cb(i))
	}
	rs.wait(t)
	if elapsed := time.Since(start); elapsed < 200*time.Millisecond {
		t.Fatalf("records acked after %v, before the 200ms linger", elapsed)
	}
	if bs := fake.Batches("s", 0); len(bs) != 1 || bs[0].RecordCount != 100 {
		t.Fatalf("batches %+v, want one of 100 records", bs)
	}
}

func TestFlushEndsLinger(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr())
	p := newProducer(t, c, "s", client.Linger(time.Hour))
	ctx := testCtx(t)
	rs := newResults()
	for i := range 10 {
		p.Produce(ctx, &client.Record{Value: []byte(strconv.Itoa(i))}, rs.cb(i))
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	rs.wait(t)
	if len(rs.errs) != 0 || len(rs.res) != 10 {
		t.Fatalf("errors %v", rs.errs)
	}
}

// With linger 0 a lone record is sent at once, and records that arrive
// while the window is full form one batch behind it.
func TestLingerZeroBatchesBehindFullWindow(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr())
	p := newProducer(t, c, "s", client.InflightBatchesMax(1), client.AppendAttemptTimeout(0)) // the held batch is not resent
	ctx := testCtx(t)

	start := time.Now()
	if _, err := p.ProduceSync(ctx, &client.Record{Value: []byte("first")}); err != nil {
		t.Fatal(err)
	}
	t.Logf("one record acked in %v", time.Since(start))

	hold := make(chan struct{})
	fake.SetAppendFault(func(n int64, _ *geologv1.AppendRequest) clienttest.Fault {
		if n == 1 {
			return clienttest.Fault{Hold: hold}
		}
		return clienttest.Fault{}
	})
	rs := newResults()
	p.Produce(ctx, &client.Record{Value: []byte("held")}, rs.cb(0))
	waitFor(t, "first batch in flight", func() bool { return fake.Outstanding("s", 0) == 1 })
	for i := 1; i <= 50; i++ {
		p.Produce(ctx, &client.Record{Value: []byte(strconv.Itoa(i))}, rs.cb(i))
	}
	close(hold)
	rs.wait(t)
	var counts []int
	for _, b := range fake.Batches("s", 0) {
		counts = append(counts, b.RecordCount)
	}
	if fmt.Sprint(counts) != "[1 1 50]" {
		t.Fatalf("batch sizes %v, want [1 1 50]", counts)
	}
}

func TestBatchBytesMax(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr())
	const batchBytesMax = 10 << 10
	p := newProducer(t, c, "s", client.BatchBytesMax(batchBytesMax), client.Linger(20*time.Millisecond))
	ctx := testCtx(t)
	value := bytes.Repeat([]byte("x"), 1000)
	rs := newResults()
	for i := range 100 {
		p.Produce(ctx, &client.Record{Key: []byte("k"), Value: value}, rs.cb(i))
	}
	rs.wait(t)
	perRecord := 1000 + 1 + 24 // value, key, the producer's framing estimate
	total := 0
	for _, b := range fake.Batches("s", 0) {
		if b.RecordCount*perRecord > batchBytesMax {
			t.Fatalf("batch of %d records exceeds %d bytes", b.RecordCount, batchBytesMax)
		}
		total += b.RecordCount
	}
	if total != 100 || len(fake.Batches("s", 0)) < 10 {
		t.Fatalf("%d records in %d batches", total, len(fake.Batches("s", 0)))
	}

	// A record larger than a batch fails up front and is final.
	big := &client.Record{Value: bytes.Repeat([]byte("x"), batchBytesMax)}
	_, err := p.ProduceSync(ctx, big)
	if client.CodeOf(err) != client.CodeRecordTooLarge || client.IsRetriable(err) {
		t.Fatalf("oversized record: %v", err)
	}
}

func TestInflightWindowBound(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr())
	p := newProducer(t, c, "s", client.InflightBatchesMax(3), client.AppendAttemptTimeout(0)) // the held batches are not resent
	ctx := testCtx(t)
	warmUp(t, p)

	hold := make(chan struct{})
	fake.SetAppendFault(func(int64, *geologv1.AppendRequest) clienttest.Fault {
		return clienttest.Fault{Hold: hold}
	})
	rs := newResults()
	for i := range 200 {
		p.Produce(ctx, &client.Record{Key: []byte("k"), Value: []byte(strconv.Itoa(i))}, rs.cb(i))
		if i < 3 {
			waitFor(t, "the batch in flight", func() bool { return fake.Outstanding("s", 0) == i+1 })
		}
	}
	close(hold)
	rs.wait(t)
	if got := fake.OutstandingMax("s", 0); got != 3 {
		t.Fatalf("at most %d batches were in flight, want exactly 3", got)
	}
	if len(rs.errs) != 0 {
		t.Fatalf("errors: %v", rs.errs)
	}

	for _, n := range []int{0, 17} {
		if _, err := c.NewProducer("s", client.InflightBatchesMax(n)); err == nil {
			t.Fatalf("InflightBatchesMax(%d) accepted", n)
		}
	}
}

// TestExactlyOnceUnderFaults is the producer's central property: with
// retriable errors, dropped streams, lost acks and delays injected at
// random, every record is acknowledged once, and each range's log holds
// every key's records exactly once, in produce order.
func TestExactlyOnceUnderFaults(t *testing.T) {
	// A fixed seed by default (goroutine interleavings still vary);
	// GEOLOG_TEST_SEED explores others.
	seed := uint64(1)
	if v, err := strconv.ParseUint(os.Getenv("GEOLOG_TEST_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d", seed)
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("s", 3)
	c := newClient(t, fake.Addr())
	p := newProducer(t, c, "s", client.InflightBatchesMax(5), client.BatchBytesMax(2<<10),
		client.ProducerRetryBackoff(time.Millisecond, 10*time.Millisecond))
	ctx := testCtx(t)

	rnd := rand.New(rand.NewPCG(seed, 1))
	var faults [5]atomic.Int64
	fake.SetAppendFault(func(n int64, _ *geologv1.AppendRequest) clienttest.Fault {
		switch x := rnd.IntN(100); {
		case x < 8:
			faults[0].Add(1)
			return clienttest.Fault{Err: apierr.New(apierr.Unavailable, "injected")}
		case x < 12:
			faults[1].Add(1)
			return clienttest.Fault{Err: apierr.New(apierr.NotLeader, "injected")}
		case x < 16:
			faults[2].Add(1)
			return clienttest.Fault{DropStream: true}
		case x < 22:
			faults[3].Add(1)
			return clienttest.Fault{DropAfterApply: true}
		case x < 26:
			faults[4].Add(1)
			return clienttest.Fault{Delay: time.Duration(rnd.IntN(3)) * time.Millisecond}
		}
		return clienttest.Fault{}
	})

	const keys, perKey = 12, 150
	rs := newResults()
	i := 0
	for seq := range perKey {
		for k := range keys {
			p.Produce(ctx, &client.Record{
				Key:   fmt.Appendf(nil, "key-%d", k),
				Value: fmt.Appendf(nil, "key-%d|%d|%s", k, seq, strings.Repeat("p", (seq*7+k*13)%200)),
			}, rs.cb(i))
			i++
		}
	}
	rs.wait(t)
	if len(rs.errs) != 0 {
		for i, err := range rs.errs {
			t.Errorf("record %d: %v", i, err)
		}
		t.FailNow()
	}
	stats := fake.Stats()
	t.Logf("faults (unavailable, not leader, drop, lost ack, delay) = %d %d %d %d %d; stats %+v",
		faults[0].Load(), faults[1].Load(), faults[2].Load(), faults[3].Load(), faults[4].Load(), stats)
	if stats.Duplicates == 0 || stats.AppendStreams < 2 {
		t.Fatalf("faults did not exercise dedup and reconnects: %+v", stats)
	}

	// Each key's records appear exactly once, in order.
	next := make(map[string]int)
	total := 0
	for rng := range uint32(3) {
		for _, rec := range fake.Records("s", rng) {
			parts := strings.SplitN(string(rec.GetValue()), "|", 3)
			seq, _ := strconv.Atoi(parts[1])
			if parts[0] != string(rec.GetKey()) || next[parts[0]] != seq {
				t.Fatalf("range %d offset %d: %s #%d, want #%d", rng, rec.GetOffset(), parts[0], seq, next[parts[0]])
			}
			next[parts[0]]++
			total++
		}
	}
	if total != keys*perKey {
		t.Fatalf("log holds %d records, want %d", total, keys*perKey)
	}
	// Every ack points at its record.
	for i, res := range rs.res {
		stored := fake.Records("s", res.Range)[res.Offset]
		if !bytes.Equal(stored.GetValue(), res.Record.Value) {
			t.Fatalf("record %d acked at %d/%d, which holds %q", i, res.Range, res.Offset, stored.GetValue())
		}
	}
}

// A gap reply for batches queued behind a failed one is part of the rewind:
// the whole window is resent in order and nothing fails.
func TestSequenceGapBehindFailedBatchIsRewound(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr())
	// The batch held below answers nothing until the window is full; on a
	// busy machine that outlasts the 1 s attempt timeout, whose resend of
	// the window would make the in-flight count below never match.
	p := newProducer(t, c, "s", client.InflightBatchesMax(5), client.AppendAttemptTimeout(0))
	ctx := testCtx(t)
	warmUp(t, p)

	hold := make(chan struct{})
	fake.SetAppendFault(func(n int64, _ *geologv1.AppendRequest) clienttest.Fault {
		if n == 1 {
			return clienttest.Fault{Hold: hold, Err: apierr.New(apierr.Overloaded, "injected")}
		}
		return clienttest.Fault{}
	})
	rs := newResults()
	for i := range 100 {
		p.Produce(ctx, &client.Record{Key: []byte("k"), Value: []byte(strconv.Itoa(i))}, rs.cb(i))
		if i < 5 {
			// One batch per record until the window is full.
			waitFor(t, "the batch in flight", func() bool { return fake.Outstanding("s", 0) == i+1 })
		}
	}
	close(hold)
	rs.wait(t)
	if len(rs.errs) != 0 {
		t.Fatalf("errors: %v", rs.errs)
	}
	recs := fake.Records("s", 0)[1:] // after the warm-up record
	for i, rec := range recs {
		if string(rec.GetValue()) != strconv.Itoa(i) {
			t.Fatalf("offset %d holds %q", i+1, rec.GetValue())
		}
	}
	if len(recs) != 100 {
		t.Fatalf("log holds %d records after the warm-up", len(recs))
	}
	t.Logf("stats %+v", fake.Stats())
}

// A final error fails only its batch; the batches behind it land, in order.
func TestFinalErrorFailsOnlyItsBatch(t *testing.T) {
	fake := startFake(t, clienttest.Config{RecordBytesMax: 100})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr())
	// 250 bytes: no two of these records share a batch. No attempt
	// timeout: the held batch must not be resent (see above).
	p := newProducer(t, c, "s", client.BatchBytesMax(250), client.AppendAttemptTimeout(0))
	ctx := testCtx(t)
	warmUp(t, p)

	hold := make(chan struct{})
	fake.SetAppendFault(func(n int64, _ *geologv1.AppendRequest) clienttest.Fault {
		if n == 1 {
			return clienttest.Fault{Hold: hold}
		}
		return clienttest.Fault{}
	})
	rs := newResults()
	p.Produce(ctx, &client.Record{Key: []byte("k"), Value: []byte("a")}, rs.cb(0))
	p.Produce(ctx, &client.Record{Key: []byte("k"), Value: bytes.Repeat([]byte("b"), 200)}, rs.cb(1))
	p.Produce(ctx, &client.Record{Key: []byte("k"), Value: []byte("c")}, rs.cb(2))
	waitFor(t, "three batches in flight", func() bool { return fake.Outstanding("s", 0) == 3 })
	close(hold)
	rs.wait(t)

	err := rs.errs[1]
	var e *client.Error
	if !errors.As(err, &e) || e.Code != client.CodeRecordTooLarge || client.IsRetriable(err) {
		t.Fatalf("record b: %v, want a final RECORD_TOO_LARGE", err)
	}
	if len(rs.errs) != 1 || rs.res[0].Offset != 1 || rs.res[2].Offset != 2 {
		t.Fatalf("results %+v errors %v", rs.res, rs.errs)
	}
	var got []string
	for _, r := range fake.Records("s", 0) {
		got = append(got, string(r.GetValue()))
	}
	if fmt.Sprint(got) != "[warm a c]" {
		t.Fatalf("log %v, want [warm a c]", got)
	}
	// The batch behind the failed one moved to a fresh producer id.
	bs := fake.Batches("s", 0)
	if bs[2].ProducerID == bs[1].ProducerID || bs[2].BaseSequence != 0 {
		t.Fatalf("batches %+v", bs)
	}
}

func TestUnknownStreamFails(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	c := newClient(t, fake.Addr())
	p := newProducer(t, c, "nope")
	_, err := p.ProduceSync(testCtx(t), &client.Record{Value: []byte("x")})
	if client.CodeOf(err) != client.CodeStreamNotFound || client.IsRetriable(err) {
		t.Fatalf("got %v, want a final STREAM_NOT_FOUND", err)
	}
}

func TestDeliveryTimeoutAndDeadline(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr())
	p := newProducer(t, c, "s", client.DeliveryTimeout(150*time.Millisecond))
	ctx := testCtx(t)
	// Describe the stream first: on a busy machine the first record's
	// DescribeStream could use up the 150 ms, and the timeout tested here
	// is the one of a batch in flight.
	if _, err := p.RangeCount(ctx); err != nil {
		t.Fatal(err)
	}

	hold := make(chan struct{})
	fake.SetAppendFault(func(int64, *geologv1.AppendRequest) clienttest.Fault {
		return clienttest.Fault{Hold: hold}
	})
	start := time.Now()
	_, err := p.ProduceSync(ctx, &client.Record{Value: []byte("late")})
	if !errors.Is(err, client.ErrDeliveryTimeout) || client.IsRetriable(err) || client.CodeOf(err) != client.CodeTimeout {
		t.Fatalf("got %v, want ErrDeliveryTimeout", err)
	}
	// Not before the timeout; the upper bound only catches a timer that
	// never fires (a loaded machine may run it late).
	if el := time.Since(start); el < 150*time.Millisecond || el > time.Minute {
		t.Fatalf("timed out after %v", el)
	}

	dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = p.ProduceSync(dctx, &client.Record{Value: []byte("deadline")})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want context.DeadlineExceeded", err)
	}

	// The range recovers once the server does.
	close(hold)
	fake.SetAppendFault(nil)
	res, err := p.ProduceSync(ctx, &client.Record{Value: []byte("ok")})
	if err != nil {
		t.Fatal(err)
	}
	stored := fake.Records("s", 0)
	if string(stored[res[0].Offset].GetValue()) != "ok" {
		t.Fatalf("log %v", stored)
	}
}

// TestDeliveryTimeoutWhileDescribing: a delivery timeout that runs out
// while the producer describes the stream (its first record) fails the
// record with ErrDeliveryTimeout, as it does later on; the caller's own
// deadline gives the context's error.
func TestDeliveryTimeoutWhileDescribing(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr())
	p := newProducer(t, c, "s", client.DeliveryTimeout(time.Nanosecond))
	_, err := p.ProduceSync(testCtx(t), &client.Record{Value: []byte("x")})
	if !errors.Is(err, client.ErrDeliveryTimeout) || client.IsRetriable(err) || client.CodeOf(err) != client.CodeTimeout {
		t.Fatalf("got %v, want ErrDeliveryTimeout", err)
	}
	q := newProducer(t, c, "s")
	dctx, cancel := context.WithTimeout(testCtx(t), time.Nanosecond)
	defer cancel()
	_, err = q.ProduceSync(dctx, &client.Record{Value: []byte("y")})
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, client.ErrDeliveryTimeout) {
		t.Fatalf("got %v, want context.DeadlineExceeded", err)
	}
}

func TestCancelBufferedRecord(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr())
	p := newProducer(t, c, "s", client.InflightBatchesMax(1), client.AppendAttemptTimeout(0)) // the held batch is not resent
	ctx := testCtx(t)

	hold := make(chan struct{})
	fake.SetAppendFault(func(int64, *geologv1.AppendRequest) clienttest.Fault { return clienttest.Fault{Hold: hold} })
	rs := newResults()
	p.Produce(ctx, &client.Record{Value: []byte("sent")}, rs.cb(0))
	waitFor(t, "first batch in flight", func() bool { return fake.Outstanding("s", 0) == 1 })
	cctx, cancel := context.WithCancel(ctx)
	canceled := make(chan error, 1)
	p.Produce(cctx, &client.Record{Value: []byte("buffered")}, func(_ client.ProduceResult, err error) { canceled <- err })
	cancel()
	select {
	case err := <-canceled:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancelled buffered record did not fail")
	}
	close(hold)
	rs.wait(t)
	if len(rs.errs) != 0 || len(fake.Records("s", 0)) != 1 {
		t.Fatalf("errors %v, log %v", rs.errs, fake.Records("s", 0))
	}
}

func TestBackpressureBlocksProduce(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr())
	// The bound on bytes alone (QueueDelayTarget's would bind first: it
	// starts at 64 KiB; see TestQueueDelayBoundBindsFirst).
	p := newProducer(t, c, "s", client.BatchBytesMax(2<<10), client.BufferedBytesMax(4<<10), client.QueueDelayTarget(0))
	ctx := testCtx(t)

	hold := make(chan struct{})
	fake.SetAppendFault(func(int64, *geologv1.AppendRequest) clienttest.Fault { return clienttest.Fault{Hold: hold} })
	rs := newResults()
	value := bytes.Repeat([]byte("v"), 1000)
	for i := range 4 { // 4 x 1024 bytes fill the buffer
		p.Produce(ctx, &client.Record{Value: value}, rs.cb(i))
	}
	bctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := p.ProduceSync(bctx, &client.Record{Value: value})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want Produce to block until its deadline", err)
	}
	close(hold)
	rs.wait(t)
	if len(rs.errs) != 0 {
		t.Fatal(rs.errs)
	}
	if _, err := p.ProduceSync(ctx, &client.Record{Value: value}); err != nil {
		t.Fatal(err)
	}
}

func TestCloseFailsUnacknowledged(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr())
	p, err := c.NewProducer("s")
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	if _, err := p.ProduceSync(ctx, &client.Record{Value: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	defer close(hold)
	fake.SetAppendFault(func(int64, *geologv1.AppendRequest) clienttest.Fault { return clienttest.Fault{Hold: hold} })
	rs := newResults()
	for i := range 20 {
		p.Produce(ctx, &client.Record{Value: []byte("y")}, rs.cb(i))
	}
	p.Close()
	rs.wait(t)
	for i := range 20 {
		if !errors.Is(rs.errs[i], client.ErrClosed) {
			t.Fatalf("record %d: %v, want ErrClosed", i, rs.errs[i])
		}
	}
	if _, err := p.ProduceSync(ctx, &client.Record{Value: []byte("z")}); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("produce after close: %v", err)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestDisableIdempotence(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr())
	p := newProducer(t, c, "s", client.DisableIdempotence())
	if _, err := p.ProduceSync(testCtx(t), &client.Record{Value: []byte("x")}, &client.Record{Value: []byte("y")}); err != nil {
		t.Fatal(err)
	}
	for _, b := range fake.Batches("s", 0) {
		if b.ProducerID != 0 {
			t.Fatalf("batch %+v carries a producer id", b)
		}
	}
}

// Many goroutines producing concurrently, for the race detector.
func TestConcurrentProducers(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("s", 4)
	c := newClient(t, fake.Addr())
	p := newProducer(t, c, "s", client.Linger(time.Millisecond))
	ctx := testCtx(t)
	var acked atomic.Int64
	done := make(chan error, 8)
	for g := range 8 {
		go func() {
			for i := range 200 {
				var key []byte
				if i%2 == 0 {
					key = fmt.Appendf(nil, "g%d", g)
				}
				p.Produce(ctx, &client.Record{Key: key, Value: []byte("v")}, func(_ client.ProduceResult, err error) {
					if err == nil {
						acked.Add(1)
					}
				})
			}
			done <- p.Flush(ctx)
		}()
	}
	for range 8 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if acked.Load() != 1600 {
		t.Fatalf("acked %d of 1600", acked.Load())
	}
}

// A server that lost the producer's sequence state answers
// PRODUCER_STATE_LOST: the range continues under a fresh producer id
// without failing anything.
func TestServerLostSequenceState(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr())
	p := newProducer(t, c, "s")
	ctx := testCtx(t)
	produceN(t, p, 0, 5)
	fake.ForgetProducers()
	produceN(t, p, 5, 5)
	for i, rec := range fake.Records("s", 0) {
		if string(rec.GetValue()) != strconv.Itoa(i) {
			t.Fatalf("offset %d holds %q", i, rec.GetValue())
		}
	}
	if n := len(fake.Records("s", 0)); n != 10 {
		t.Fatalf("log has %d records", n)
	}
	if fake.Stats().GapReplies == 0 {
		t.Fatal("no gap was answered")
	}
	_ = ctx
}

// The two answers a range gives when its sequences and the producer's
// disagree: PRODUCER_STATE_LOST (the documented condition after a failover
// or an expired state) moves the batch and those behind it to a fresh id,
// failing nothing; SEQUENCE_GAP (a disagreement within one epoch, which no
// conforming server causes) fails what is in flight. Either way the range
// goes on under a fresh id.
func TestProducerStateLostAndSequenceGap(t *testing.T) {
	for _, c := range []struct {
		code     apierr.Code
		wantFail bool
	}{
		{apierr.ProducerStateLost, false},
		{apierr.SequenceGap, true},
	} {
		t.Run(c.code.String(), func(t *testing.T) {
			fake := startFake(t, clienttest.Config{})
			fake.MustCreateStream("s", 1)
			cl := newClient(t, fake.Addr())
			p := newProducer(t, cl, "s")
			ctx := testCtx(t)
			warmUp(t, p)
			firstID := fake.Batches("s", 0)[0].ProducerID
			fake.SetAppendFault(func(n int64, _ *geologv1.AppendRequest) clienttest.Fault {
				if n == 1 {
					e := apierr.New(c.code, "injected")
					e.ExpectedSequence, e.ForkEpoch, e.ForkOffset = 0, 2, 1
					return clienttest.Fault{Err: e}
				}
				return clienttest.Fault{}
			})
			rs := newResults()
			p.Produce(ctx, &client.Record{Key: []byte("k"), Value: []byte("a")}, rs.cb(0))
			rs.wait(t)
			if c.wantFail {
				if client.CodeOf(rs.errs[0]) != c.code || client.IsRetriable(rs.errs[0]) {
					t.Fatalf("record: %+v %v, want a final %v", rs.res[0], rs.errs[0], c.code)
				}
			} else if len(rs.errs) != 0 {
				t.Fatalf("record failed: %v", rs.errs[0])
			}
			produceN(t, p, 1, 1)
			bs := fake.Batches("s", 0)
			last := bs[len(bs)-1]
			if last.ProducerID == firstID || last.BaseSequence != uint64(len(bs)-2) {
				t.Fatalf("batches %+v: the range must go on under a fresh producer id from sequence 0", bs)
			}
			if bs[1].ProducerID != last.ProducerID {
				t.Fatalf("batches %+v", bs)
			}
		})
	}
}

// Batches whose acks were lost and that fell out of the server's dedup
// window fail with DUPLICATE_OUT_OF_WINDOW (they are stored); the batch
// behind them is deduplicated and the range goes on.
func TestDuplicateOutOfWindow(t *testing.T) {
	fake := startFake(t, clienttest.Config{DedupWindowBatches: 1})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr())
	p := newProducer(t, c, "s")
	ctx := testCtx(t)
	warmUp(t, p)

	hold := make(chan struct{})
	fake.SetAppendFault(func(n int64, _ *geologv1.AppendRequest) clienttest.Fault {
		switch n {
		case 1:
			return clienttest.Fault{Hold: hold, SkipReply: true}
		case 2:
			return clienttest.Fault{SkipReply: true}
		case 3:
			return clienttest.Fault{DropAfterApply: true}
		}
		return clienttest.Fault{}
	})
	rs := newResults()
	for i := range 3 {
		p.Produce(ctx, &client.Record{Value: []byte(strconv.Itoa(i))}, rs.cb(i))
		waitFor(t, "the batch in flight", func() bool { return fake.Outstanding("s", 0) == i+1 })
	}
	close(hold)
	rs.wait(t)
	for i := range 2 {
		if client.CodeOf(rs.errs[i]) != client.CodeDuplicateOutOfWindow {
			t.Fatalf("record %d: %v, want DUPLICATE_OUT_OF_WINDOW", i, rs.errs[i])
		}
	}
	if r, ok := rs.res[2]; !ok || !r.Duplicate || r.Offset != 3 {
		t.Fatalf("record 2: %+v %v, want a duplicate at offset 3", r, rs.errs[2])
	}
	produceN(t, p, 3, 2)
	for i, rec := range fake.Records("s", 0)[1:] {
		if string(rec.GetValue()) != strconv.Itoa(i) {
			t.Fatalf("offset %d holds %q", i+1, rec.GetValue())
		}
	}
}

// Against a server that accepts any first sequence from an unknown
// producer id, a retriable failure of the very first batch must not let
// the batches behind it land first.
func TestFirstBatchFailureWithLenientServer(t *testing.T) {
	fake := startFake(t, clienttest.Config{AcceptAnyFirstSequence: true})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr())
	p := newProducer(t, c, "s")
	ctx := testCtx(t)
	fake.SetAppendFault(func(n int64, _ *geologv1.AppendRequest) clienttest.Fault {
		if n == 1 {
			return clienttest.Fault{Delay: 50 * time.Millisecond, Err: apierr.New(apierr.Overloaded, "injected")}
		}
		return clienttest.Fault{}
	})
	rs := newResults()
	for i := range 50 {
		p.Produce(ctx, &client.Record{Key: []byte("k"), Value: []byte(strconv.Itoa(i))}, rs.cb(i))
		if i == 0 {
			// The rest are produced while the first batch is in flight.
			waitFor(t, "the first batch in flight", func() bool { return fake.Outstanding("s", 0) == 1 })
		}
	}
	rs.wait(t)
	if len(rs.errs) != 0 {
		t.Fatalf("errors: %v", rs.errs)
	}
	recs := fake.Records("s", 0)
	for i, rec := range recs {
		if string(rec.GetValue()) != strconv.Itoa(i) {
			t.Fatalf("offset %d holds %q", i, rec.GetValue())
		}
	}
	if len(recs) != 50 {
		t.Fatalf("log holds %d records", len(recs))
	}
}
