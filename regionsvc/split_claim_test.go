package regionsvc

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/homing"
	"github.com/geolog/geolog/internal/rpcerr"
)

// TestSplitsAcrossHomes: a stream's two ranges are homed in two regions,
// and each region splits its own range at the same moment. Each region
// orders splits through its own catalogue; the lease store's claim on the
// map version (homing.ClaimSplit) makes one of them wait until its map has
// the other's split, so the two splits take versions 1 and 2 and four
// distinct children, every region ends with the same map, and each
// parent's children are homed where the parent is. Without the claim both
// take version 1 and children 2 and 3.
func TestSplitsAcrossHomes(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	store := homing.NewMemStore() // the lease store all regions share
	w := newWorldWith(t, []string{"us", "eu", "ap"}, 3, 10*time.Millisecond, 0, nil, func(_ string, _ uint64, cfg *Config) {
		cfg.LeaseStore, cfg.LeaseTTL, cfg.LeaseHeartbeat, cfg.MaxClockOffset = store, testLeaseTTL, testLeaseHeartbeat, testMaxClockOffset
		cfg.FailoverDisabled = true
	})
	homes := createGeoStream(t, ctx, w, "sx", 2)
	if homes[0] == homes[1] {
		t.Fatalf("ranges homed in %v, want two regions", homes)
	}
	for r := range uint32(2) {
		for i, k := range keysOf(r, 2, 5) {
			appendRetry(t, ctx, w, homes[r], "sx", r, string(k), fmt.Sprintf("v%d-%d", r, i))
		}
	}
	var wg sync.WaitGroup
	res := make([]splitResult, 2)
	waited := make([]int, 2)
	for r := range uint32(2) {
		wg.Go(func() {
			for ctx.Err() == nil {
				var err error
				res[r], err = w.nodes[homes[r]][1].splitRange(ctx, "sx", r, 0)
				if err == nil {
					return
				}
				if rpcerr.CodeOf(err) == apierr.SplitInProgress {
					waited[r]++
				} else if !rpcerr.IsRetriable(err) {
					t.Errorf("split range %d in %s: %v", r, homes[r], err)
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if v0, v1 := res[0].decision.MapVersion, res[1].decision.MapVersion; v0+v1 != 3 || v0 == v1 {
		t.Fatalf("the splits took map versions %d and %d, want 1 and 2", v0, v1)
	}
	kids := map[uint32]bool{}
	for _, r := range res {
		kids[r.decision.Left], kids[r.decision.Right] = true, true
	}
	if len(kids) != 4 || kids[0] || kids[1] {
		t.Fatalf("children %v, want four new ranges", kids)
	}
	for _, region := range w.regions {
		for id, n := range w.nodes[region] {
			waitUntil(t, ctx, 2*time.Minute, fmt.Sprintf("%s node %d applies both splits", region, id), func() bool {
				return nodeRangeMap(n, "sx").Version == 2
			})
		}
	}
	ref := nodeRangeMap(w.nodes[homes[0]][1], "sx")
	for _, region := range w.regions {
		for id, n := range w.nodes[region] {
			if got := nodeRangeMap(n, "sx"); !got.Equal(ref) {
				t.Fatalf("%s node %d's map %+v, %s's %+v", region, id, got, homes[0], ref)
			}
		}
	}
	for r, s := range res {
		for _, child := range []uint32{s.decision.Left, s.decision.Right} {
			waitUntil(t, ctx, time.Minute, fmt.Sprintf("child %d homed", child), func() bool {
				h, ok := w.nodes[homes[r]][1].homing.homes.View().Home(homing.RangeKey{Stream: "sx", Range: child})
				return ok && h.Region == homes[r]
			})
			key := ""
			for i := 0; key == ""; i++ {
				if k := fmt.Sprintf("c-%d", i); ref.LookupKey([]byte(k)) == child {
					key = k
				}
			}
			appendRetry(t, ctx, w, homes[r], "sx", child, key, "after")
		}
	}
	t.Logf("splits: range 0 in %s at version %d, range 1 in %s at version %d; SPLIT_IN_PROGRESS answers %v",
		homes[0], res[0].decision.MapVersion, homes[1], res[1].decision.MapVersion, waited)
}

// TestSplitAcrossHomesNeedsLeaseStore: without a lease store nothing
// orders the splits of two regions, so a stream homed in more than one
// region does not split (INVALID_ARGUMENT naming the regions); one homed
// in a single region does.
func TestSplitAcrossHomesNeedsLeaseStore(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := newWorld(t, []string{"us", "eu"}, 1, time.Millisecond, 0)
	homes := createGeoStream(t, ctx, w, "sx", 2)
	if homes[0] == homes[1] {
		t.Fatalf("ranges homed in %v, want two regions", homes)
	}
	_, err := w.nodes[homes[0]][1].splitRange(ctx, "sx", 0, 0)
	if e := rpcerr.FromError(err); e == nil || e.Code != apierr.InvalidArgument || !strings.Contains(e.Message, "lease store") {
		t.Fatalf("split of a stream homed in two regions without a lease store: %v, want INVALID_ARGUMENT", err)
	}
}
