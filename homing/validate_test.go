package homing

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/geolog/geolog/apierr"
)

// TestBadInput: every malformed request gets a final ErrInvalidArgument
// (API code INVALID_ARGUMENT) from both stores, and changes nothing.
func TestBadInput(t *testing.T) {
	good := RangeKey{Stream: "chat", Range: 0}
	tooMany := make([]RangeKey, RangesPerRequestMax+1)
	for i := range tooMany {
		tooMany[i] = RangeKey{Stream: "s", Range: uint32(i)}
	}
	hb := func(mut func(*HeartbeatRequest)) func(context.Context, Store) error {
		return func(ctx context.Context, s Store) error {
			req := HeartbeatRequest{NodeID: 1, Region: "us", Epoch: 1, ExpirationNanos: 5, NowNanos: 1}
			mut(&req)
			_, err := s.Heartbeat(ctx, req)
			return err
		}
	}
	takeover := func(mut func(*TakeoverRequest)) func(context.Context, Store) error {
		return func(ctx context.Context, s Store) error {
			req := TakeoverRequest{From: "us", To: "eu", NowNanos: 1, Ranges: []TakeoverRange{{Key: good, Epoch: 1}}}
			mut(&req)
			_, err := s.Takeover(ctx, req)
			return err
		}
	}
	rehome := func(mut func(*RehomeRequest)) func(context.Context, Store) error {
		return func(ctx context.Context, s Store) error {
			req := RehomeRequest{Key: good, Epoch: 1, To: "eu"}
			mut(&req)
			_, err := s.PrepareRehome(ctx, req)
			if !errors.Is(err, ErrInvalidArgument) {
				return err
			}
			_, err = s.CompleteRehome(ctx, req)
			return err
		}
	}
	cases := map[string]func(context.Context, Store) error{
		"heartbeat node 0":          hb(func(r *HeartbeatRequest) { r.NodeID = 0 }),
		"heartbeat node 2^63":       hb(func(r *HeartbeatRequest) { r.NodeID = 1 << 63 }),
		"heartbeat empty region":    hb(func(r *HeartbeatRequest) { r.Region = "" }),
		"heartbeat long region":     hb(func(r *HeartbeatRequest) { r.Region = strings.Repeat("r", RegionNameBytesMax+1) }),
		"heartbeat region with nul": hb(func(r *HeartbeatRequest) { r.Region = "us\x00" }),
		"heartbeat negative exp":    hb(func(r *HeartbeatRequest) { r.ExpirationNanos = -1 }),
		"heartbeat huge epoch":      hb(func(r *HeartbeatRequest) { r.Epoch = math.MaxUint64 }),
		"heartbeat huge version":    hb(func(r *HeartbeatRequest) { r.HomesKnown = math.MaxUint64 }),
		"create none": func(ctx context.Context, s Store) error {
			_, err := s.CreateHomes(ctx, nil)
			return err
		},
		"create empty stream": func(ctx context.Context, s Store) error {
			_, err := s.CreateHomes(ctx, []HomeSpec{{Key: RangeKey{}, Region: "us"}})
			return err
		},
		"create long stream": func(ctx context.Context, s Store) error {
			_, err := s.CreateHomes(ctx, []HomeSpec{{Key: RangeKey{Stream: strings.Repeat("s", StreamNameBytesMax+1)}, Region: "us"}})
			return err
		},
		"create bad utf8": func(ctx context.Context, s Store) error {
			_, err := s.CreateHomes(ctx, []HomeSpec{{Key: RangeKey{Stream: "a\xff"}, Region: "us"}})
			return err
		},
		"create huge offset": func(ctx context.Context, s Store) error {
			_, err := s.CreateHomes(ctx, []HomeSpec{{Key: good, Region: "us", StartOffset: math.MaxUint64}})
			return err
		},
		"create duplicate": func(ctx context.Context, s Store) error {
			_, err := s.CreateHomes(ctx, []HomeSpec{{Key: good, Region: "us"}, {Key: good, Region: "eu"}})
			return err
		},
		"homes too many": func(ctx context.Context, s Store) error {
			_, err := s.Homes(ctx, tooMany)
			return err
		},
		"region homes bad region": func(ctx context.Context, s Store) error {
			_, _, err := s.RegionHomes(ctx, "-x")
			return err
		},
		"liveness bad region": func(ctx context.Context, s Store) error {
			_, err := s.Liveness(ctx, "a b")
			return err
		},
		"history bad stream": func(ctx context.Context, s Store) error {
			_, err := s.History(ctx, RangeKey{Stream: "../x"})
			return err
		},
		"stream history bad stream": func(ctx context.Context, s Store) error {
			_, err := s.StreamHistory(ctx, "../x")
			return err
		},
		"takeover to itself":     takeover(func(r *TakeoverRequest) { r.To = "us" }),
		"takeover epoch 0":       takeover(func(r *TakeoverRequest) { r.Ranges[0].Epoch = 0 }),
		"takeover epoch max":     takeover(func(r *TakeoverRequest) { r.Ranges[0].Epoch = math.MaxInt64 }),
		"takeover no ranges":     takeover(func(r *TakeoverRequest) { r.Ranges = nil }),
		"takeover negative now":  takeover(func(r *TakeoverRequest) { r.NowNanos = -1 }),
		"takeover negative skew": takeover(func(r *TakeoverRequest) { r.MaxOffsetNanos = -1 }),
		"takeover duplicate": takeover(func(r *TakeoverRequest) {
			r.Ranges = append(r.Ranges, r.Ranges[0])
		}),
		"rehome no target":   rehome(func(r *RehomeRequest) { r.To = "" }),
		"rehome epoch 0":     rehome(func(r *RehomeRequest) { r.Epoch = 0 }),
		"rehome huge offset": rehome(func(r *RehomeRequest) { r.StartOffset = 1 << 63 }),
		"cancel bad stream": func(ctx context.Context, s Store) error {
			_, err := s.CancelRehome(ctx, RehomeRequest{Key: RangeKey{Stream: ""}, Epoch: 1})
			return err
		},
	}
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStore(t, kind)
			ctx := ctxT(t)
			for name, call := range cases {
				err := call(ctx, s)
				if !errors.Is(err, ErrInvalidArgument) || IsRetriable(err) || apierr.As(err).Code != apierr.InvalidArgument {
					t.Errorf("%s: %v, want final ErrInvalidArgument", name, err)
				}
			}
			// Nothing was written.
			if ls, err := s.Liveness(ctx, ""); err != nil || len(ls) != 0 {
				t.Errorf("liveness after bad input: %v %v", ls, err)
			}
			if homes, err := s.Homes(ctx, []RangeKey{good}); err != nil || homes[0].Epoch != 0 {
				t.Errorf("homes after bad input: %v %v", homes, err)
			}
		})
	}
}

func TestBadConfig(t *testing.T) {
	mem := NewMemStore()
	for name, cfg := range map[string]Config{
		"no store":        {NodeID: 1, Region: "us"},
		"no node":         {Region: "us", Store: mem},
		"no region":       {NodeID: 1, Store: mem},
		"ttl too short":   {NodeID: 1, Region: "us", Store: mem, LivenessTTL: 1500e6},
		"negative offset": {NodeID: 1, Region: "us", Store: mem, MaxClockOffset: -1},
	} {
		if _, err := Start(cfg); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	ctx := ctxT(t)
	if _, err := OpenSQL(ctx, SQLConfig{}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("OpenSQL without URL: %v", err)
	}
	if _, err := OpenSQL(ctx, SQLConfig{URL: "postgres://%zz"}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("OpenSQL with a bad URL: %v", err)
	}
	// Nothing listens on port 1: unavailable, retriable.
	_, err := OpenSQL(ctx, SQLConfig{URL: "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=2"})
	if !errors.Is(err, ErrStoreUnavailable) || !IsRetriable(err) {
		t.Errorf("OpenSQL with nothing listening: %v, want retriable ErrStoreUnavailable", err)
	}
}

// TestViewCheck covers the lease arithmetic at its edges.
func TestViewCheck(t *testing.T) {
	c, err := NewCore(CoreConfig{NodeID: 1, Region: "us", HeartbeatIntervalNanos: 10, RetryIntervalNanos: 5, LivenessTTLNanos: 100, MaxOffsetNanos: 20})
	if err != nil {
		t.Fatal(err)
	}
	key := RangeKey{Stream: "s", Range: 1}
	req, ok := c.Next(1000)
	if !ok || req.Epoch != 0 || req.ExpirationNanos != 0 {
		t.Fatalf("first request %+v %v", req, ok)
	}
	if _, ok := c.Next(1000); ok {
		t.Fatal("a second heartbeat while one is in flight")
	}
	c.Done(req, HeartbeatResult{Liveness: Liveness{NodeID: 1, Region: "us", Epoch: 4}, HomesChanged: true, HomesVersion: 9,
		Homes: []Home{{Key: key, Region: "us", Epoch: 3}}}, nil)
	if _, err := c.View().Check(key, 1000); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("check before extension: %v", err)
	}
	req, ok = c.Next(1001)
	if !ok || req.Epoch != 4 || req.ExpirationNanos != 1101 || req.HomesSeen != 9 || req.HomesKnown != 9 {
		t.Fatalf("second request %+v %v", req, ok)
	}
	// An answer that arrives late still counts from the send time.
	c.Done(req, HeartbeatResult{Liveness: Liveness{NodeID: 1, Region: "us", Epoch: 4, ExpirationNanos: 1101}, Extended: true, HomesVersion: 9}, nil)
	v := c.View()
	for now, want := range map[int64]bool{1001: true, 1080: true, 1081: false, 5000: false} {
		e, err := v.Check(key, now)
		if ok := err == nil && e == 3; ok != want {
			t.Errorf("check at %d: %d %v, want ok=%v", now, e, err, want)
		}
	}
	if c.Wake() != 1011 {
		t.Fatalf("next heartbeat at %d, want 1011", c.Wake())
	}
	// A failure keeps the lease and retries sooner.
	req, _ = c.Next(1011)
	c.Done(req, HeartbeatResult{}, newError(ErrStoreUnavailable, "x"))
	if v := c.View(); v.ServeUntilNanos != 1081 || v.Failures != 1 || c.Wake() != 1016 {
		t.Fatalf("after a failure: until %d failures %d wake %d", v.ServeUntilNanos, v.Failures, c.Wake())
	}
}
