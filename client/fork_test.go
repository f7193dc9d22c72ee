package client_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/client/clienttest"
)

// subscribeUntilError consumes a subscription from offset 0, checking that
// offsets only go up by one, until cb says stop (cancelling) or it ends
// with an error, which it returns with the next offset expected.
func subscribeUntilError(t *testing.T, c *client.Client, cb func(rec client.StoredRecord)) (uint64, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	var next uint64
	for rec, err := range c.Subscribe(ctx, "s", 0, client.StartAt{}) {
		if err != nil {
			return next, err
		}
		if rec.Offset != next {
			t.Fatalf("delivered offset %d, want %d: a subscription never goes back nor skips", rec.Offset, next)
		}
		next++
		cb(rec)
	}
	return next, nil
}

// TestSubscribeDetectsForkOnResume: a subscription delivered records 0-99
// of epoch 1; the range's log then forks at 60 (a failover: epoch 2
// continues there) and holds other records at 60-109. When its stream
// breaks and it resumes, it finds the record at 99 of another epoch and
// ends with a ForkError at 60, the first offset the log no longer holds as
// delivered; it never delivers an offset below 100 again.
func TestSubscribeDetectsForkOnResume(t *testing.T) {
	fake := startFake(t, clienttest.Config{SubscribeRecordsMax: 10})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr(), client.RetryBackoff(time.Millisecond, 10*time.Millisecond))
	p := newProducer(t, c, "s")
	produceN(t, p, 0, 100)
	next, err := subscribeUntilError(t, c, func(rec client.StoredRecord) {
		if rec.Epoch != 1 && rec.Offset < 100 {
			t.Errorf("offset %d delivered under epoch %d before the fork", rec.Offset, rec.Epoch)
		}
		if rec.Offset == 99 {
			fake.SetSubscribeFault(func(n int64) clienttest.Fault {
				if n == 1 {
					return clienttest.Fault{DropStream: true}
				}
				return clienttest.Fault{}
			})
			var values [][]byte
			for i := range 50 {
				values = append(values, []byte(strconv.Itoa(1000+i)))
			}
			if err := fake.Fork("s", 0, 60, 2, values...); err != nil { // epoch 2, offsets 60-109
				t.Error(err)
			}
		}
	})
	var fe *client.ForkError
	if !errors.As(err, &fe) || !errors.Is(err, client.ErrForked) {
		t.Fatalf("ended at %d with %v, want a ForkError", next, err)
	}
	if fe.Offset != 60 || fe.DeliveredEnd != 100 || fe.DeliveredEpoch != 1 || fe.LogEpoch != 2 || next != 100 {
		t.Fatalf("fork error %+v (next %d), want offset 60, delivered end 100, epochs 1 then 2", fe, next)
	}
	if client.IsRetriable(err) {
		t.Fatal("a ForkError is final for the subscription")
	}
}

// TestSubscribeDetectsForkWhenLogIsShorter: after the fork the log is
// shorter than what was delivered: the node serving the subscription ends
// it (it serves less than its position, CodeOffsetPastLocalTail), and the
// home read of the last delivered offset finds it past the range's tail:
// a ForkError at the fork offset.
func TestSubscribeDetectsForkWhenLogIsShorter(t *testing.T) {
	fake := startFake(t, clienttest.Config{SubscribeRecordsMax: 7})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr(), client.RetryBackoff(time.Millisecond, 10*time.Millisecond))
	produceN(t, newProducer(t, c, "s"), 0, 100)
	_, err := subscribeUntilError(t, c, func(rec client.StoredRecord) {
		if rec.Offset == 99 {
			// Epoch 3 continues at 42 with 5 records.
			if err := fake.Fork("s", 0, 42, 3, []byte("x"), []byte("y"), []byte("z"), []byte("v"), []byte("w")); err != nil {
				t.Error(err)
			}
		}
	})
	var fe *client.ForkError
	if !errors.As(err, &fe) || fe.Offset != 42 || fe.DeliveredEnd != 100 || fe.LogEpoch != 0 {
		t.Fatalf("ended with %v (%+v), want a ForkError at 42 with the log short of 99", err, fe)
	}
}

// TestSubscribeLaggingNodeIsNotAFork: a node that serves less than the
// subscription's position only lags: the subscription moves on, delivers
// every offset once and in order, and reports no fork. A Read past the
// lagging node's tail is retried at another node.
func TestSubscribeLaggingNodeIsNotAFork(t *testing.T) {
	cl := startCluster(t, 2)
	cl.MustCreateStream("s", 1)
	c := newClient(t, cl.AddrList(), client.RetryBackoff(time.Millisecond, 10*time.Millisecond))
	p := newProducer(t, c, "s", client.ProducerRetryBackoff(time.Millisecond, 10*time.Millisecond))
	produceN(t, p, 0, 30)
	cl.Node(1).FreezeReads()
	produceN(t, p, 30, 70)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	var next uint64
	restarted := make(chan struct{})
	for rec, err := range c.Subscribe(ctx, "s", 0, client.StartAt{}) {
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			t.Fatalf("at %d: %v", next, err)
		}
		if rec.Offset != next || string(rec.Value) != strconv.FormatUint(next, 10) {
			t.Fatalf("got %d (%q), want %d", rec.Offset, rec.Value, next)
		}
		next++
		switch next {
		case 50:
			cl.Kill(0) // the subscription moves to node 1, which lags at 30
			go func() {
				defer close(restarted)
				time.Sleep(50 * time.Millisecond)
				if err := cl.Restart(0); err != nil {
					t.Error(err)
				}
			}()
		case 100:
			cancel()
		}
	}
	if next != 100 {
		t.Fatalf("stopped at %d", next)
	}
	// The subscription may have had every record before the kill took
	// effect: the read past node 1's tail needs node 0 back.
	<-restarted
	r, err := newClient(t, cl.Node(1).Addr()+","+cl.Node(0).Addr(), client.RetryBackoff(time.Millisecond, 10*time.Millisecond)).
		Read(testCtx(t), "s", 0, 90, client.ReadOptions{})
	if err != nil || len(r.Records) != 10 || r.Records[0].Offset != 90 {
		t.Fatalf("read past the lagging node's tail: %v", err)
	}
}

// TestSubscribeFromCheckedPosition: a subscription that starts after a
// record the caller processed (StartAt.Epoch, its epoch) checks that the
// log still holds it: it does, and the subscription goes on; after a
// fork that replaced it, it ends at once with a ForkError at the fork.
func TestSubscribeFromCheckedPosition(t *testing.T) {
	fake := startFake(t, clienttest.Config{})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr(), client.RetryBackoff(time.Millisecond, 10*time.Millisecond))
	produceN(t, newProducer(t, c, "s"), 0, 50)
	ctx, cancel := context.WithCancel(testCtx(t))
	for rec, err := range c.Subscribe(ctx, "s", 0, client.StartAt{Offset: 30, Epoch: 1}) {
		if err != nil || rec.Offset != 30 {
			t.Fatalf("first record %d, %v; want 30", rec.Offset, err)
		}
		break
	}
	cancel()
	if err := fake.Fork("s", 0, 20, 2, []byte("a"), []byte("b")); err != nil {
		t.Fatal(err)
	}
	produceN(t, newProducer(t, c, "s"), 100, 20) // epoch 2, offsets 22-41
	for rec, err := range c.Subscribe(testCtx(t), "s", 0, client.StartAt{Offset: 30, Epoch: 1}) {
		var fe *client.ForkError
		if !errors.As(err, &fe) || fe.Offset != 20 || fe.LogEpoch != 2 {
			t.Fatalf("got %d, %v; want a ForkError at 20", rec.Offset, err)
		}
		break
	}
}

// TestSubscribeKeyDetectsForkOnResume: a key subscription delivered the
// records of key "a" (the even offsets of 0-99, epoch 1); the log then
// forks at 60 (epoch 2, other keys) and a record of "a" follows at 110.
// Resumed at its last record (98) after a dropped stream, its filter
// leaves that offset out (the log holds another key there now): it asks
// the home, and ends with a ForkError at 60 instead of delivering 110 as
// if nothing had happened.
func TestSubscribeKeyDetectsForkOnResume(t *testing.T) {
	fake := startFake(t, clienttest.Config{SubscribeRecordsMax: 10})
	fake.MustCreateStream("s", 1)
	c := newClient(t, fake.Addr(), client.RetryBackoff(time.Millisecond, 10*time.Millisecond))
	p := newProducer(t, c, "s")
	var recs []*client.Record
	for i := range 100 {
		recs = append(recs, &client.Record{Key: []byte{"ab"[i%2]}, Value: []byte(strconv.Itoa(i))})
	}
	if _, err := p.ProduceSync(testCtx(t), recs...); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	var last uint64
	var err error
	for rec, rerr := range c.SubscribeKey(ctx, "s", 0, []byte("a"), client.StartAt{}) {
		if err = rerr; err != nil {
			break
		}
		if string(rec.Key) != "a" || rec.Offset < last || rec.Offset > 98 {
			t.Fatalf("delivered %q at %d after %d", rec.Key, rec.Offset, last)
		}
		last = rec.Offset
		if rec.Offset == 98 {
			fake.SetSubscribeFault(func(n int64) clienttest.Fault {
				return clienttest.Fault{DropStream: n == 1}
			})
			var values [][]byte
			for i := range 50 {
				values = append(values, []byte(strconv.Itoa(1000+i)))
			}
			if err := fake.Fork("s", 0, 60, 2, values...); err != nil { // epoch 2, offsets 60-109, key "fork"
				t.Fatal(err)
			}
			if _, err := p.ProduceSync(testCtx(t), &client.Record{Key: []byte("a"), Value: []byte("after")}); err != nil {
				t.Fatal(err)
			}
		}
	}
	var fe *client.ForkError
	if !errors.As(err, &fe) {
		t.Fatalf("ended after %d with %v, want a ForkError", last, err)
	}
	if fe.Offset != 60 || fe.DeliveredEpoch != 1 || fe.LogEpoch != 2 || last != 98 {
		t.Fatalf("fork error %+v after %d, want offset 60, epochs 1 then 2, after 98", fe, last)
	}
}
