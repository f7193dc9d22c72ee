package regionsvc

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/homing"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// adminSplit asks node id for Admin.SplitRange, retrying what is
// retriable but SPLIT_IN_PROGRESS and RANGE_SPLIT (the answers under
// test).
func (tr *testRegion) adminSplit(ctx context.Context, id uint64, stream string, r uint32, at uint64) (*geologv1.SplitRangeResponse, error) {
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := tr.admins[id].SplitRange(cctx, &geologv1.SplitRangeRequest{Stream: stream, Range: r, At: at})
		cancel()
		code := rpcerr.CodeOf(err)
		if err == nil || !rpcerr.IsRetriable(err) || code == apierr.SplitInProgress || code == apierr.RangeSplit || ctx.Err() != nil {
			return resp, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// notCatalogueLeader returns a node that does not lead the catalogue.
func (tr *testRegion) notCatalogueLeader(ctx context.Context) uint64 {
	lead := tr.catalogueLeader(ctx)
	for id := range tr.nodes {
		if id != lead {
			return id
		}
	}
	tr.t.Fatal("a region of one node")
	return 0
}

// waitMaps waits until every node's map of stream is at version and
// returns node 1's; every node's must be equal.
func (tr *testRegion) waitMaps(ctx context.Context, stream string, version uint64) keyspace.RangeMap {
	tr.t.Helper()
	for id := range tr.nodes {
		pollUntil(tr.t, ctx, fmt.Sprintf("node %d at map version %d", id, version), func() bool {
			n := tr.nodes[id]
			n.mu.RLock()
			defer n.mu.RUnlock()
			st, ok := n.streams[stream] // a node may not have learned the stream yet
			return ok && st.spec.rangeMap().Version >= version
		})
	}
	m := tr.rangeMapOn(1, stream)
	for id := range tr.nodes {
		if got := tr.rangeMapOn(id, stream); !got.Equal(m) || got.Version != version {
			tr.t.Fatalf("node %d's map %+v, node 1's %+v (want version %d)", id, got, m, version)
		}
	}
	return m
}

// TestSplitRangeAdmin: Admin.SplitRange sent to a node that does not lead
// the catalogue splits the range (forwarded to the catalogue leader, which
// reserves the map version, has the range leader write the marker and
// records the split); every node ends with the same map. Two reservations
// decided from the same map (two nodes that both believed they led the
// catalogue) do not both stand: the second is refused SPLIT_IN_PROGRESS,
// as is a SplitRange of another range while the first stands; asking for
// the reserved split again finishes it; a split range answers
// RANGE_SPLIT, a boundary outside the range INVALID_ARGUMENT.
func TestSplitRangeAdmin(t *testing.T) {
	t.Parallel()
	tr := newTestRegion(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	tr.createStream(ctx, "sa", 4)
	other := tr.notCatalogueLeader(ctx)
	resp, err := tr.adminSplit(ctx, other, "sa", 1, 0)
	if err != nil {
		t.Fatalf("split through node %d: %v", other, err)
	}
	if resp.GetRangeMapVersion() != 1 || resp.GetLeft() != 4 || resp.GetRight() != 5 {
		t.Fatalf("split answer %+v", resp)
	}
	m := tr.waitMaps(ctx, "sa", 1)
	if p, _ := m.Get(1); p.SplitOffset != resp.GetSplitOffset() || !p.IsSplit() {
		t.Fatalf("parent in the map %+v, split offset %d answered", p, resp.GetSplitOffset())
	}

	// Two reservations from the same map: one stands.
	lead := tr.nodes[tr.catalogueLeader(ctx)]
	st, err := lead.lookupStream(ctx, "sa")
	if err != nil {
		t.Fatal(err)
	}
	first, err := lead.reserveSplit(ctx, st.spec, 2, 0)
	if err != nil {
		t.Fatalf("first reservation: %v", err)
	}
	if _, err := lead.reserveSplit(ctx, st.spec, 3, 0); err == nil || apierr.As(err).Code != apierr.SplitInProgress {
		t.Fatalf("second reservation from the same map: %v, want SPLIT_IN_PROGRESS", err)
	}
	if _, err := tr.adminSplit(ctx, other, "sa", 3, 0); rpcerr.CodeOf(err) != apierr.SplitInProgress {
		t.Fatalf("split of range 3 while range 2's stands: %v, want SPLIT_IN_PROGRESS", err)
	}
	resp, err = tr.adminSplit(ctx, other, "sa", 2, 0)
	if err != nil || resp.GetRangeMapVersion() != 2 || resp.GetLeft() != first.Left || resp.GetAt() != first.At {
		t.Fatalf("the reserved split asked for again: %+v, %v (reserved %+v)", resp, err, first)
	}
	tr.waitMaps(ctx, "sa", 2)
	if _, err := tr.adminSplit(ctx, other, "sa", 1, 0); rpcerr.CodeOf(err) != apierr.RangeSplit {
		t.Fatalf("split of a split range: %v, want RANGE_SPLIT", err)
	}
	if _, err := tr.adminSplit(ctx, other, "sa", 0, keyspace.HashStart(1, 4)); rpcerr.CodeOf(err) != apierr.InvalidArgument {
		t.Fatalf("split of range 0 at range 1's start: %v, want INVALID_ARGUMENT", err)
	}
	// Then the stream splits as usual again.
	if resp, err = tr.adminSplit(ctx, other, "sa", 3, 0); err != nil || resp.GetRangeMapVersion() != 3 {
		t.Fatalf("split of range 3 once range 2's ended: %+v, %v", resp, err)
	}
	tr.waitMaps(ctx, "sa", 3)
}

// TestSplitRangeRacing: splits of four ranges of one stream asked of
// every node at once each succeed or answer SPLIT_IN_PROGRESS; the map
// counts exactly the successes, and every node holds the same one.
func TestSplitRangeRacing(t *testing.T) {
	t.Parallel()
	tr := newTestRegion(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	tr.createStream(ctx, "sr", 4)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for r := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[r] = tr.adminSplit(ctx, uint64(r%3)+1, "sr", uint32(r), 0)
		}()
	}
	wg.Wait()
	ok := 0
	for r, err := range errs {
		switch {
		case err == nil:
			ok++
		case rpcerr.CodeOf(err) != apierr.SplitInProgress:
			t.Fatalf("split of range %d: %v, want success or SPLIT_IN_PROGRESS", r, err)
		}
	}
	if ok == 0 {
		t.Fatal("no split succeeded")
	}
	m := tr.waitMaps(ctx, "sr", uint64(ok))
	if len(m.Active()) != 4+ok {
		t.Fatalf("%d active ranges after %d splits", len(m.Active()), ok)
	}
	t.Logf("%d of 4 racing splits succeeded", ok)
}

// TestSplitRangeHomes: with homing on, the children of a split are homed
// in the lease store where the parent is, at its epoch, from offset 0,
// before the split is recorded; they take appends of their keys.
func TestSplitRangeHomes(t *testing.T) {
	t.Parallel()
	store := homing.NewMemStore()
	tr := newTestRegionWith(t, 3, 3, func(cfg *Config) {
		cfg.Region = "us"
		cfg.LeaseStore, cfg.LeaseTTL, cfg.LeaseHeartbeat, cfg.MaxClockOffset = store, testLeaseTTL, testLeaseHeartbeat, testMaxClockOffset
		cfg.FailoverDisabled = true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	tr.createStream(ctx, "sh", 2)
	parent := homing.RangeKey{Stream: "sh", Range: 1}
	ph, err := store.Homes(ctx, []homing.RangeKey{parent})
	if err != nil || ph[0].Epoch == 0 {
		t.Fatalf("parent's home %+v, %v", ph, err)
	}
	resp, err := tr.adminSplit(ctx, tr.notCatalogueLeader(ctx), "sh", 1, 0)
	if err != nil {
		t.Fatalf("split: %v", err)
	}
	if resp.GetEpoch() != ph[0].Epoch {
		t.Fatalf("split at epoch %d, the parent's is %d", resp.GetEpoch(), ph[0].Epoch)
	}
	m := tr.waitMaps(ctx, "sh", 1)
	for _, child := range []uint32{resp.GetLeft(), resp.GetRight()} {
		key := homing.RangeKey{Stream: "sh", Range: child}
		h, err := store.Homes(ctx, []homing.RangeKey{key})
		if err != nil || h[0].Region != "us" || h[0].Epoch != ph[0].Epoch || h[0].StartOffset != 0 {
			t.Fatalf("child %d's home %+v, %v: want us at epoch %d from 0", child, h, err, ph[0].Epoch)
		}
		hist, err := store.History(ctx, key)
		if err != nil || len(hist) != 1 || hist[0].Kind != homing.KindSplit {
			t.Fatalf("child %d's history %+v, %v", child, hist, err)
		}
		k := keyOfRange(m, child)
		tr.retry(ctx, fmt.Sprintf("append to child %d", child), func(ctx context.Context, c geologv1.LogClient) error {
			_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "sh", Range: child, Records: []*geologv1.Record{{Key: k, Value: []byte("v")}}})
			return err
		})
	}
}

// keyOfRange returns a key m routes to range r.
func keyOfRange(m keyspace.RangeMap, r uint32) []byte {
	for i := 0; ; i++ {
		k := []byte(fmt.Sprintf("key-%d", i))
		if m.LookupKey(k) == r {
			return k
		}
	}
}
