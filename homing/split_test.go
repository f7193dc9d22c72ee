package homing

import (
	"errors"
	"sync"
	"testing"
	"time"
)

// TestSplitHomes: the children of a split range are homed where the
// parent is, at its epoch (not epoch 1), from offset 0, with a "split"
// history record, in one transaction that bumps the home region's homes
// version; a repeat changes nothing; a split whose parent moved on (a
// takeover), another region, a moving parent or an unknown parent is
// refused with its typed error and homes nothing; a child homed on its own
// since is not reset.
func TestSplitHomes(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s, ctx := newStore(t, kind), ctxT(t)
			parent := RangeKey{Stream: "sp", Range: 1}
			if _, err := s.CreateHomes(ctx, []HomeSpec{{Key: parent, Region: "eu"}}); err != nil {
				t.Fatal(err)
			}
			// Epoch 2 in us: a child at epoch 1 would be fenced out by
			// the parent's copies elsewhere and vice versa.
			if _, err := s.Takeover(ctx, TakeoverRequest{From: "eu", To: "us", NowNanos: int64(time.Hour),
				Ranges: []TakeoverRange{{Key: parent, Epoch: 1, StartOffset: 7}}}); err != nil {
				t.Fatal(err)
			}
			_, v0, err := s.RegionHomes(ctx, "us")
			if err != nil {
				t.Fatal(err)
			}
			req := SplitHomesRequest{Parent: parent, Epoch: 2, Region: "us", Children: [2]uint32{2, 3}, NowNanos: 5}
			for _, c := range []struct {
				req  SplitHomesRequest
				want error
			}{
				{SplitHomesRequest{Parent: parent, Epoch: 1, Region: "us", Children: [2]uint32{2, 3}}, ErrEpochMismatch},
				{SplitHomesRequest{Parent: parent, Epoch: 2, Region: "eu", Children: [2]uint32{2, 3}}, ErrNotHome},
				{SplitHomesRequest{Parent: RangeKey{Stream: "sp", Range: 9}, Epoch: 2, Region: "us", Children: [2]uint32{2, 3}}, ErrRangeNotFound},
				{SplitHomesRequest{Parent: parent, Epoch: 2, Region: "us", Children: [2]uint32{2, 2}}, ErrInvalidArgument},
				{SplitHomesRequest{Parent: parent, Epoch: 2, Region: "us", Children: [2]uint32{1, 3}}, ErrInvalidArgument},
			} {
				if _, err := s.SplitHomes(ctx, c.req); !errors.Is(err, c.want) {
					t.Fatalf("%+v: %v, want %v", c.req, err, c.want)
				}
			}
			expectNoHomes(t, s, RangeKey{Stream: "sp", Range: 2}, RangeKey{Stream: "sp", Range: 3})
			homes, err := s.SplitHomes(ctx, req)
			if err != nil || len(homes) != 2 {
				t.Fatalf("split homes: %+v, %v", homes, err)
			}
			for i, h := range homes {
				want := Home{Key: RangeKey{Stream: "sp", Range: req.Children[i]}, Region: "us", Epoch: 2, PrevRegion: "eu"}
				if h != want {
					t.Fatalf("child %d: %+v, want %+v", i, h, want)
				}
				hist, err := s.History(ctx, h.Key)
				if err != nil || len(hist) != 1 || hist[0].Epoch != 2 || hist[0].Kind != KindSplit || hist[0].StartOffset != 0 || hist[0].Region != "us" {
					t.Fatalf("child %d history %+v, %v", i, hist, err)
				}
			}
			regionHomes, v1, err := s.RegionHomes(ctx, "us")
			if err != nil || v1 <= v0 || len(regionHomes) != 3 {
				t.Fatalf("us after the split: %d homes at version %d (was %d), %v: the region's nodes would not learn the children", len(regionHomes), v1, v0, err)
			}
			if again, err := s.SplitHomes(ctx, req); err != nil || again[0] != homes[0] || again[1] != homes[1] {
				t.Fatalf("repeated split: %+v, %v", again, err)
			}
			if _, v2, _ := s.RegionHomes(ctx, "us"); v2 != v1 {
				t.Fatalf("a repeated split bumped the homes version %d -> %d", v1, v2)
			}
			// A child rehomed on its own keeps its record on a late retry,
			// even once the parent moved on too.
			child := homes[1].Key
			if _, err := s.PrepareRehome(ctx, RehomeRequest{Key: child, Epoch: 2, To: "eu"}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.CompleteRehome(ctx, RehomeRequest{Key: child, Epoch: 2, To: "eu", StartOffset: 4, NowNanos: int64(2 * time.Hour)}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.PrepareRehome(ctx, RehomeRequest{Key: parent, Epoch: 2, To: "eu"}); err != nil {
				t.Fatal(err)
			}
			late, err := s.SplitHomes(ctx, req)
			if err != nil || late[1].Region != "eu" || late[1].Epoch != 3 {
				t.Fatalf("late retry: %+v, %v: want the rehomed child as it is", late, err)
			}
		})
	}
}

// TestSplitHomesRacing: concurrent splits of one parent into the same
// children (a retry racing the original) home each child once.
func TestSplitHomesRacing(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s, ctx := newStore(t, kind), ctxT(t)
			parent := RangeKey{Stream: "race", Range: 0}
			if _, err := s.CreateHomes(ctx, []HomeSpec{{Key: parent, Region: "us"}}); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			errs := make([]error, 4)
			for i := range errs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, errs[i] = s.SplitHomes(ctx, SplitHomesRequest{Parent: parent, Epoch: 1, Region: "us", Children: [2]uint32{1, 2}})
				}()
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("split %d: %v", i, err)
				}
			}
			for _, r := range []uint32{1, 2} {
				hist, err := s.History(ctx, RangeKey{Stream: "race", Range: r})
				if err != nil || len(hist) != 1 {
					t.Fatalf("child %d history %+v, %v: want one record", r, hist, err)
				}
			}
		})
	}
}

func expectNoHomes(t *testing.T, s Store, keys ...RangeKey) {
	t.Helper()
	homes, err := s.Homes(ctxT(t), keys)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range homes {
		if h.Epoch != 0 {
			t.Fatalf("%s homed: %+v", h.Key, h)
		}
	}
}
