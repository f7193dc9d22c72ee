package homing

import (
	"errors"
	"sync"
	"testing"
	"time"
)

// TestRaiseStart: the recorded start of the current epoch moves up by
// compare-and-set, in the home record and its history, and bumps the home
// region's homes version; a repeat is a no-op; a lost race, a downward
// move, a stale epoch, another region and a moving range are refused with
// their typed errors and change nothing.
func TestRaiseStart(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s, ctx := newStore(t, kind), ctxT(t)
			key := RangeKey{Stream: "raise", Range: 3}
			if _, err := s.CreateHomes(ctx, []HomeSpec{{Key: key, Region: "us", StartOffset: 5}}); err != nil {
				t.Fatal(err)
			}
			_, v0, err := s.RegionHomes(ctx, "us")
			if err != nil {
				t.Fatal(err)
			}
			req := RaiseStartRequest{Key: key, Epoch: 1, Region: "us", From: 5, To: 9}
			h, err := s.RaiseStart(ctx, req)
			if err != nil || h.StartOffset != 9 || h.Epoch != 1 {
				t.Fatalf("raise 5 -> 9: %+v, %v", h, err)
			}
			if _, err := s.RaiseStart(ctx, req); err != nil {
				t.Fatalf("repeated raise: %v, want success (already there)", err)
			}
			expectStart(t, s, key, 9, 1)
			if _, v1, _ := s.RegionHomes(ctx, "us"); v1 <= v0 {
				t.Fatalf("homes version %d after the raise, was %d: the home's nodes would not learn it", v1, v0)
			}
			refused := []struct {
				req  RaiseStartRequest
				want error
			}{
				{RaiseStartRequest{Key: key, Epoch: 1, Region: "us", From: 5, To: 12}, ErrStartMoved},
				{RaiseStartRequest{Key: key, Epoch: 1, Region: "us", From: 9, To: 7}, ErrInvalidArgument},
				{RaiseStartRequest{Key: key, Epoch: 1, Region: "us", From: 2, To: 7}, ErrStartMoved},
				{RaiseStartRequest{Key: key, Epoch: 2, Region: "us", From: 9, To: 12}, ErrEpochMismatch},
				{RaiseStartRequest{Key: key, Epoch: 1, Region: "eu", From: 9, To: 12}, ErrNotHome},
				{RaiseStartRequest{Key: RangeKey{Stream: "raise", Range: 4}, Epoch: 1, Region: "us", To: 1}, ErrRangeNotFound},
			}
			for _, c := range refused {
				if _, err := s.RaiseStart(ctx, c.req); !errors.Is(err, c.want) {
					t.Fatalf("%+v: %v, want %v", c.req, err, c.want)
				}
			}
			expectStart(t, s, key, 9, 1)
			if _, err := s.PrepareRehome(ctx, RehomeRequest{Key: key, Epoch: 1, To: "eu"}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.RaiseStart(ctx, RaiseStartRequest{Key: key, Epoch: 1, Region: "us", From: 9, To: 12}); !errors.Is(err, ErrNotHome) {
				t.Fatalf("raise while moving: %v, want ErrNotHome", err)
			}
			if _, err := s.CompleteRehome(ctx, RehomeRequest{Key: key, Epoch: 1, To: "eu", StartOffset: 20, NowNanos: int64(time.Hour)}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.RaiseStart(ctx, RaiseStartRequest{Key: key, Epoch: 1, Region: "us", From: 9, To: 30}); !errors.Is(err, ErrEpochMismatch) {
				t.Fatalf("raise of a replaced epoch: %v, want ErrEpochMismatch", err)
			}
			expectStart(t, s, key, 20, 2)
			hist, err := s.History(ctx, key)
			if err != nil || len(hist) != 2 || hist[0].StartOffset != 9 || hist[1].StartOffset != 20 {
				t.Fatalf("history %+v, %v: want epoch 1 from 9, epoch 2 from 20", hist, err)
			}
		})
	}
}

// expectStart requires key's home record and its epoch's history record
// to start at start, at epoch.
func expectStart(t *testing.T, s Store, key RangeKey, start, epoch uint64) {
	t.Helper()
	ctx := ctxT(t)
	hs, err := s.Homes(ctx, []RangeKey{key})
	if err != nil || hs[0].StartOffset != start || hs[0].Epoch != epoch {
		t.Fatalf("home %+v, %v: want epoch %d from %d", hs, err, epoch, start)
	}
	hist, err := s.StreamHistory(ctx, key.Stream)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range hist {
		if r.Key == key && r.Epoch == epoch && r.StartOffset != start {
			t.Fatalf("history of epoch %d starts at %d, the home record at %d", epoch, r.StartOffset, start)
		}
	}
}

// TestRaiseStartRace: leaders racing to raise the same start from the
// same reading: exactly one wins; the others lose with ErrStartMoved
// (or find it already where they wanted it), and the record holds the
// winner's start. Then everyone retries from what they read again, and
// the start ends at the highest, never below a start once recorded.
func TestRaiseStartRace(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s, ctx := newStore(t, kind), ctxT(t)
			stores := []Store{s, s, s, s}
			if kind == "pg" {
				sq := s.(*SQLStore)
				for i := 1; i < len(stores); i++ {
					stores[i] = openSQLAt(t, sq.cfg.URL)
				}
			}
			key := RangeKey{Stream: "race", Range: 0}
			if _, err := s.CreateHomes(ctx, []HomeSpec{{Key: key, Region: "us", StartOffset: 10}}); err != nil {
				t.Fatal(err)
			}
			won := raceRaise(t, stores, key, func(i int) (uint64, uint64) { return 10, uint64(11 + i) })
			if len(won) != 1 {
				t.Fatalf("raises from 10 won by %v, want exactly one", won)
			}
			expectStart(t, s, key, uint64(11+won[0]), 1)
			raceRaise(t, stores, key, func(i int) (uint64, uint64) {
				hs, err := s.Homes(ctx, []RangeKey{key})
				if err != nil {
					t.Error(err)
				}
				return hs[0].StartOffset, max(hs[0].StartOffset, uint64(11+i))
			})
			hs, err := s.Homes(ctx, []RangeKey{key})
			if err != nil || hs[0].StartOffset < uint64(11+won[0]) {
				t.Fatalf("start %+v, %v after the second round: below the %d recorded before", hs, err, 11+won[0])
			}
		})
	}
}

// raceRaise runs one raise per store at once (from, to = fromTo(i)) and
// returns who changed the record; any error but ErrStartMoved fails.
func raceRaise(t *testing.T, stores []Store, key RangeKey, fromTo func(i int) (uint64, uint64)) []int {
	t.Helper()
	ctx := ctxT(t)
	changed := make([]bool, len(stores))
	errs := make([]error, len(stores))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range stores {
		from, to := fromTo(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var h Home
			h, errs[i] = stores[i].RaiseStart(ctx, RaiseStartRequest{Key: key, Epoch: 1, Region: "us", From: from, To: to})
			changed[i] = errs[i] == nil && from != to && h.StartOffset == to
		}()
	}
	close(start)
	wg.Wait()
	var won []int
	for i, err := range errs {
		switch {
		case err == nil && changed[i]:
			won = append(won, i)
		case err != nil && !errors.Is(err, ErrStartMoved):
			t.Fatalf("contender %d: %v, want success or ErrStartMoved", i, err)
		}
	}
	return won
}
