package homing

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// TestBatchRehomes: both stores prepare and complete several ranges in one
// call: per-range failures leave their range alone and do not stop the
// others; the region's homes version moves once per call; the moved ranges
// land at epoch+1 from their start offsets, recorded in their history; the
// old home's nodes must have confirmed the move (or expired) first.
func TestBatchRehomes(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := newStore(t, kind)
			b := s.(BatchRehomer)
			ctx := ctxT(t)
			keys := []RangeKey{{Stream: "b", Range: 0}, {Stream: "b", Range: 1}, {Stream: "b", Range: 2}}
			for _, k := range keys {
				if _, err := s.CreateHomes(ctx, []HomeSpec{{Key: k, Region: "us"}}); err != nil {
					t.Fatal(err)
				}
			}
			now := time.Now().UnixNano()
			hb, err := s.Heartbeat(ctx, HeartbeatRequest{NodeID: 1, Region: "us"})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Heartbeat(ctx, HeartbeatRequest{NodeID: 1, Region: "us", Epoch: hb.Liveness.Epoch, ExpirationNanos: now + int64(time.Minute), NowNanos: now}); err != nil {
				t.Fatal(err)
			}
			_, v0, err := s.RegionHomes(ctx, "us")
			if err != nil {
				t.Fatal(err)
			}
			pb, err := b.PrepareRehomes(ctx, []RehomeRequest{
				{Key: keys[0], Epoch: 1, To: "eu"}, {Key: keys[1], Epoch: 7, To: "eu"}, {Key: keys[2], Epoch: 1, To: "eu"}})
			if err != nil {
				t.Fatal(err)
			}
			homes, errs := pb.Homes, pb.Errs
			if errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], ErrEpochMismatch) {
				t.Fatalf("prepare outcomes: %v", errs)
			}
			if homes[0].MovingTo != "eu" || homes[0].DrainVersion != v0+1 || homes[2].DrainVersion != v0+1 {
				t.Fatalf("prepared: %+v %+v (version before %d)", homes[0], homes[2], v0)
			}
			h1, v1, _ := s.RegionHomes(ctx, "us")
			if v1 != v0+1 {
				t.Fatalf("homes version %d after one batch, want %d", v1, v0+1)
			}
			// The batch hands back the old home's homes at the new version:
			// what its nodes' next heartbeat would bring.
			if snap, ok := pb.Region("us"); !ok || len(pb.Regions) != 1 || snap.Version != v1 || !slices.Equal(snap.Homes, h1) {
				t.Fatalf("prepare snapshot %+v, want us at %d: %+v", pb.Regions, v1, h1)
			}
			complete := []RehomeRequest{
				{Key: keys[0], Epoch: 1, To: "eu", StartOffset: 10, NowNanos: now, MaxOffsetNanos: 1},
				{Key: keys[2], Epoch: 1, To: "eu", StartOffset: 20, NowNanos: now, MaxOffsetNanos: 1}}
			// Node 1 of us is live and has not confirmed the move, neither
			// through its heartbeat nor to the caller (a report of an older
			// version, or from another node, does not count).
			cb, err := b.CompleteRehomes(ctx, complete, map[uint64]uint64{1: v0, 2: v0 + 1})
			if err != nil || !errors.Is(cb.Errs[0], ErrNotDrained) || !errors.Is(cb.Errs[1], ErrNotDrained) || len(cb.Regions) != 0 {
				t.Fatalf("complete before the drain: %v %v %+v", cb.Errs, err, cb.Regions)
			}
			if kind == "mem" {
				// Confirmed through its heartbeat.
				if _, err := s.Heartbeat(ctx, HeartbeatRequest{NodeID: 1, Region: "us", Epoch: hb.Liveness.Epoch, ExpirationNanos: now + int64(time.Minute), NowNanos: now, HomesSeen: v0 + 1}); err != nil {
					t.Fatal(err)
				}
				cb, err = b.CompleteRehomes(ctx, complete, nil)
			} else {
				// Confirmed to the caller directly.
				cb, err = b.CompleteRehomes(ctx, complete, map[uint64]uint64{1: v0 + 1})
			}
			homes, errs = cb.Homes, cb.Errs
			if err != nil || errs[0] != nil || errs[1] != nil {
				t.Fatalf("complete: %v %v", errs, err)
			}
			for _, r := range []string{"us", "eu"} {
				want, v, _ := s.RegionHomes(ctx, r)
				if snap, ok := cb.Region(r); !ok || len(cb.Regions) != 2 || snap.Version != v || !slices.Equal(snap.Homes, want) {
					t.Fatalf("complete snapshot of %s: %+v, want %d: %+v", r, cb.Regions, v, want)
				}
			}
			if homes[0].Region != "eu" || homes[0].Epoch != 2 || homes[0].StartOffset != 10 || homes[1].StartOffset != 20 {
				t.Fatalf("completed: %+v", homes)
			}
			got, err := s.Homes(ctx, keys)
			if err != nil {
				t.Fatal(err)
			}
			if got[1].Region != "us" || got[1].Epoch != 1 || got[1].MovingTo != "" {
				t.Fatalf("the failed range changed: %+v", got[1])
			}
			h, err := s.History(ctx, keys[2])
			if err != nil || len(h) != 2 || h[1].Kind != KindRehome || h[1].StartOffset != 20 {
				t.Fatalf("history: %+v %v", h, err)
			}
			if _, err := b.PrepareRehomes(ctx, []RehomeRequest{{Key: keys[0], Epoch: 2, To: "ap"}, {Key: keys[0], Epoch: 2, To: "ap"}}); !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("a range listed twice: %v", err)
			}
		})
	}
}
