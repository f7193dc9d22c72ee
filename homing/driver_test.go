package homing

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/geolog/geolog/apierr"
)

// TestDriverTimers runs the driver on its own timers with the in-memory
// store, in a synctest bubble (virtual time): heartbeats every interval,
// lease validity, an outage, recovery.
func TestDriverTimers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := NewMemStore()
		ctx := context.Background()
		key := RangeKey{Stream: "chat", Range: 3}
		if _, err := mem.CreateHomes(ctx, []HomeSpec{{Key: key, Region: "us", StartOffset: 5}}); err != nil {
			t.Fatal(err)
		}
		h, err := Start(Config{NodeID: 7, Region: "us", Store: mem, Logger: testLogger(t)}) // defaults: 1s, 5s TTL, 500ms offset
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		t0 := time.Now()
		synctest.Wait()
		// Registration and the first extension happen at once.
		if e, err := h.Check("chat", 3); err != nil || e != 1 {
			t.Fatalf("check at start: %d %v", e, err)
		}
		if l, _ := h.Lease("chat", 3); l.StartOffset != 5 || l.UntilNanos != t0.Add(4500*time.Millisecond).UnixNano() {
			t.Fatalf("lease at start: %+v", l)
		}
		select {
		case <-h.Changed():
		default:
			t.Fatal("Changed not signalled")
		}

		calls := mem.Calls()
		time.Sleep(10*time.Second + time.Millisecond)
		synctest.Wait()
		if n := mem.Calls() - calls; n != 10 {
			t.Fatalf("%d heartbeats in 10s at a 1s interval, want 10", n)
		}
		last := time.Now().Add(-time.Millisecond) // the last heartbeat's send time
		if got, want := h.MayServeUntil(), last.Add(4500*time.Millisecond); !got.Equal(want) {
			t.Fatalf("MayServeUntil %v, want %v", got, want)
		}

		// Outage: retried every 250ms, acks until the last expiration minus
		// the max offset, not a nanosecond longer.
		mem.SetDown(true)
		time.Sleep(last.Add(4500*time.Millisecond).Sub(time.Now()) - time.Nanosecond)
		synctest.Wait() // the driver has made every attempt due by now
		if _, err := h.Check("chat", 3); err != nil {
			t.Fatalf("check just before the lease's end: %v", err)
		}
		// Attempts at last+1s (due), then every 250ms up to last+4.25s.
		// (The next is due at last+4.5s, the instant the lease ends: read
		// the count before it, not racing it.)
		if v := h.View(); v.Failures != 14 {
			t.Fatalf("%d failed heartbeats, want 14 (every 250ms from 1s to 4.25s)", v.Failures)
		}
		time.Sleep(time.Nanosecond)
		_, err = h.Check("chat", 3)
		if !errors.Is(err, ErrLeaseExpired) || !errors.Is(err, ErrStoreUnavailable) || !IsRetriable(err) {
			t.Fatalf("check at the lease's end: %v", err)
		}
		mem.SetDown(false)
		time.Sleep(300 * time.Millisecond)
		synctest.Wait()
		if e, err := h.Check("chat", 3); err != nil || e != 1 {
			t.Fatalf("check after recovery: %d %v", e, err)
		}

		// A takeover elsewhere fences this node: it learns at its next
		// heartbeat and signals the change.
		select { // drain
		case <-h.Changed():
		default:
		}
		mem.SetDown(true)
		time.Sleep(10 * time.Second) // expire
		mem.SetDown(false)
		res, err := mem.Takeover(ctx, TakeoverRequest{From: "us", To: "eu", NowNanos: time.Now().UnixNano(), MaxOffsetNanos: int64(500 * time.Millisecond),
			Ranges: []TakeoverRange{{Key: key, Epoch: 1, StartOffset: 9}}})
		if err != nil || res.Granted() != 1 {
			t.Fatalf("takeover: %+v %v", res, err)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		select {
		case <-h.Changed():
		default:
			t.Fatal("Changed not signalled after the takeover")
		}
		if v := h.View(); v.LivenessEpoch != 2 || v.ServeUntilNanos == 0 {
			t.Fatalf("view after fencing: %+v", v)
		}
		if _, err := h.Check("chat", 3); !errors.Is(err, ErrNotHome) || apierr.As(err).Code != apierr.NotHome {
			t.Fatalf("check after takeover: %v, want ErrNotHome", err)
		}

		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
		if err := h.Refresh(ctx); !errors.Is(err, ErrClosed) {
			t.Fatalf("refresh after close: %v", err)
		}
	})
}

// TestDriverRefreshBounded: refreshes queue behind a slow heartbeat, up to
// RefreshWaitersMax; the rest fail at once.
func TestDriverRefreshBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		slow := &slowStore{MemStore: NewMemStore(), release: make(chan struct{})}
		h, err := Start(Config{NodeID: 1, Region: "us", Store: slow, RefreshWaitersMax: 2, HeartbeatTimeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		synctest.Wait() // the registration heartbeat is blocked in the store
		errs := make(chan error, 3)
		for range 3 {
			go func() { errs <- h.Refresh(context.Background()) }()
		}
		synctest.Wait()
		select {
		case err := <-errs:
			if !errors.Is(err, ErrStoreUnavailable) {
				t.Fatalf("third refresh: %v", err)
			}
		default:
			t.Fatal("no refresh refused")
		}
		close(slow.release)
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatalf("queued refresh: %v", err)
			}
		}
	})
}

type slowStore struct {
	*MemStore
	release chan struct{}
}

func (s *slowStore) Heartbeat(ctx context.Context, req HeartbeatRequest) (HeartbeatResult, error) {
	select {
	case <-s.release:
	case <-ctx.Done():
		return HeartbeatResult{}, newErrorAlso(ErrStoreUnavailable, ctx.Err(), "%v", ctx.Err())
	}
	return s.MemStore.Heartbeat(ctx, req)
}

// delayStore answers every heartbeat after delay (unless the call's context
// ends first); it counts the heartbeats abandoned that way.
type delayStore struct {
	*MemStore
	delay     time.Duration
	abandoned atomic.Int64
}

func (s *delayStore) Heartbeat(ctx context.Context, req HeartbeatRequest) (HeartbeatResult, error) {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		s.abandoned.Add(1)
		return HeartbeatResult{}, newErrorAlso(ErrStoreUnavailable, ctx.Err(), "%v", ctx.Err())
	}
	return s.MemStore.Heartbeat(ctx, req)
}

// TestDriverSlowStoreKeepsLease: a store (or a node on a busy machine) that
// takes longer than the heartbeat interval to answer, but far less than the
// lease, does not cost the node its lease: by default a heartbeat may take
// half of the servable lease. With the heartbeat cut off at the interval
// (the first version's default) the same node never holds a lease at all.
func TestDriverSlowStoreKeepsLease(t *testing.T) {
	if got, want := DefaultHeartbeatTimeout(time.Second, 5*time.Second, 500*time.Millisecond), 2250*time.Millisecond; got != want {
		t.Fatalf("default heartbeat timeout %v, want %v", got, want)
	}
	if got := DefaultHeartbeatTimeout(time.Second, 2*time.Second, 500*time.Millisecond); got != time.Second {
		t.Fatalf("default heartbeat timeout %v, want at least the interval", got)
	}
	run := func(t *testing.T, timeout time.Duration) (served, sampled int, abandoned int64) {
		synctest.Test(t, func(t *testing.T) {
			store := &delayStore{MemStore: NewMemStore(), delay: 1500 * time.Millisecond}
			key := RangeKey{Stream: "chat", Range: 0}
			if _, err := store.CreateHomes(context.Background(), []HomeSpec{{Key: key, Region: "us"}}); err != nil {
				t.Fatal(err)
			}
			// Defaults: interval 1 s, TTL 5 s, max offset 500 ms.
			h, err := Start(Config{NodeID: 1, Region: "us", Store: store, HeartbeatTimeout: timeout, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			// Registration and first extension: two answers, 3 s.
			time.Sleep(3100 * time.Millisecond)
			for range 300 { // 30 s, sampled every 100 ms
				sampled++
				if _, err := h.Check("chat", 0); err == nil {
					served++
				}
				time.Sleep(100 * time.Millisecond)
			}
			abandoned = store.abandoned.Load()
		})
		return served, sampled, abandoned
	}
	served, sampled, abandoned := run(t, 0)
	if served != sampled || abandoned != 0 {
		t.Fatalf("default timeout, 1.5 s answers: lease held at %d of %d samples, %d heartbeats abandoned; want every sample, none abandoned", served, sampled, abandoned)
	}
	served, sampled, abandoned = run(t, time.Second)
	if served != 0 || abandoned == 0 {
		t.Fatalf("timeout at the interval, 1.5 s answers: lease held at %d of %d samples, %d abandoned; want none held (the failure the default avoids)", served, sampled, abandoned)
	}
}
