package homing

import (
	"errors"
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
			homes, errs, err := b.PrepareRehomes(ctx, []RehomeRequest{
				{Key: keys[0], Epoch: 1, To: "eu"}, {Key: keys[1], Epoch: 7, To: "eu"}, {Key: keys[2], Epoch: 1, To: "eu"}})
			if err != nil {
				t.Fatal(err)
			}
			if errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], ErrEpochMismatch) {
				t.Fatalf("prepare outcomes: %v", errs)
			}
			if homes[0].MovingTo != "eu" || homes[0].DrainVersion != v0+1 || homes[2].DrainVersion != v0+1 {
				t.Fatalf("prepared: %+v %+v (version before %d)", homes[0], homes[2], v0)
			}
			if _, v1, _ := s.RegionHomes(ctx, "us"); v1 != v0+1 {
				t.Fatalf("homes version %d after one batch, want %d", v1, v0+1)
			}
			complete := []RehomeRequest{
				{Key: keys[0], Epoch: 1, To: "eu", StartOffset: 10, NowNanos: now, MaxOffsetNanos: 1},
				{Key: keys[2], Epoch: 1, To: "eu", StartOffset: 20, NowNanos: now, MaxOffsetNanos: 1}}
			// Node 1 of us is live and has not confirmed the move.
			_, errs, err = b.CompleteRehomes(ctx, complete)
			if err != nil || !errors.Is(errs[0], ErrNotDrained) || !errors.Is(errs[1], ErrNotDrained) {
				t.Fatalf("complete before the drain: %v %v", errs, err)
			}
			if _, err := s.Heartbeat(ctx, HeartbeatRequest{NodeID: 1, Region: "us", Epoch: hb.Liveness.Epoch, ExpirationNanos: now + int64(time.Minute), NowNanos: now, HomesSeen: v0 + 1}); err != nil {
				t.Fatal(err)
			}
			homes, errs, err = b.CompleteRehomes(ctx, complete)
			if err != nil || errs[0] != nil || errs[1] != nil {
				t.Fatalf("complete: %v %v", errs, err)
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
			if _, _, err := b.PrepareRehomes(ctx, []RehomeRequest{{Key: keys[0], Epoch: 2, To: "ap"}, {Key: keys[0], Epoch: 2, To: "ap"}}); !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("a range listed twice: %v", err)
			}
		})
	}
}
