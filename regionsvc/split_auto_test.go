package regionsvc

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/geolog/geolog/keyspace"
)

// TestSplitBySize: with SplitRangeBytes set, a range whose log grows past
// it splits by itself at its hash midpoint, under an idempotent producer:
// every acked record is below the split offset on every replica, the
// producer is told RANGE_SPLIT, every node's map shows the split, and the
// range that stayed small does not split.
func TestSplitBySize(t *testing.T) {
	t.Parallel()
	const thresholdBytes = 8 << 10
	tr := newTestRegionWith(t, 3, 3, func(c *Config) {
		c.MaintenanceInterval = 200 * time.Millisecond
		c.SplitRangeBytes = thresholdBytes
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tr.createStream(ctx, "sp", 2)
	p := &splitProducer{tr: tr, stream: "sp", rng: 1, pid: 93, keys: keysOf(1, 2, 5)}
	p.run(ctx, nil) // until the range answers RANGE_SPLIT
	if p.refuse == nil {
		t.Fatalf("range 1 did not split by size after %d records", len(p.acked))
	}
	want := keyspace.NewRangeMap(2)
	mid, err := want.MidPoint(1)
	if err != nil {
		t.Fatal(err)
	}
	want, err = want.Split(1, mid, uint64(len(p.acked)))
	if err != nil {
		t.Fatal(err)
	}
	for id := range tr.nodes {
		pollUntil(t, ctx, fmt.Sprintf("node %d applies the split", id), func() bool { return tr.rangeMapOn(id, "sp").Version == 1 })
		if got := tr.rangeMapOn(id, "sp"); !got.Equal(want) {
			t.Fatalf("node %d's map %+v, want range 1 split at its midpoint at offset %d: %+v", id, got, len(p.acked), want)
		}
	}
	checkSplitLog(t, ctx, tr, p, uint64(len(p.acked)))
	leader := tr.leaderOf(ctx, "sp", 1)
	if size := tr.rangeDriverOf(leader, "sp", 1).store.Size(); size <= thresholdBytes {
		t.Fatalf("range 1 split with %d bytes, below the threshold %d", size, thresholdBytes)
	}
	t.Logf("range 1 split by size at offset %d", len(p.acked))
}
