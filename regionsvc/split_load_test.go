package regionsvc

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/keyspace"
)

// TestLoadBoundary: the boundary halves the sampled records, not the
// hash space; too few samples, or load that one key carries, give none.
func TestLoadBoundary(t *testing.T) {
	t.Parallel()
	lo, hi := uint64(1000), uint64(1_000_000)
	// 90 records on 30 keys in the lowest tenth of the range: the
	// midpoint would leave every one of them on the left.
	var skewed []uint64
	for i := range 90 {
		skewed = append(skewed, lo+uint64(i%30)*3000+7)
	}
	at, ok := loadBoundary(skewed, lo, hi)
	if !ok {
		t.Fatal("no boundary for 30 keys of even load")
	}
	left := 0
	for _, h := range skewed {
		if h < at {
			left++
		}
	}
	if left < 40 || left > 50 || at <= lo || at > hi {
		t.Fatalf("boundary %d leaves %d of 90 records left, want about half, inside (%d, %d]", at, left, lo, hi)
	}

	// One key with most of the load: no split spreads it.
	hot := make([]uint64, 0, 100)
	for i := range 100 {
		h := uint64(500_000)
		if i%5 == 0 {
			h = lo + uint64(i)*100
		}
		hot = append(hot, h)
	}
	if at, ok := loadBoundary(hot, lo, hi); ok {
		t.Fatalf("one key with 80%% of the records: boundary %d, want none", at)
	}
	if _, ok := loadBoundary(skewed[:loadSplitSamplesMin-1], lo, hi); ok {
		t.Fatalf("a boundary from %d samples, want at least %d", loadSplitSamplesMin-1, loadSplitSamplesMin)
	}
	// Hashes outside the range are not the range's load.
	outside := append([]uint64{}, skewed...)
	for range 500 {
		outside = append(outside, hi+1)
	}
	if at2, ok := loadBoundary(outside, lo, hi); !ok || at2 != at {
		t.Fatalf("with foreign hashes: boundary %d (%v), want %d", at2, ok, at)
	}
}

// keysInHashes returns count keys whose hashes fall in [lo, hi].
func keysInHashes(lo, hi uint64, count int) [][]byte {
	var out [][]byte
	for i := 0; len(out) < count; i++ {
		k := []byte(fmt.Sprintf("key-%d", i))
		if h := keyspace.Hash(k); h >= lo && h <= hi {
			out = append(out, k)
		}
	}
	return out
}

// TestSplitByLoad: with SplitRangeRecordsPerSecond set, a range whose
// load passes it splits by itself, at the boundary that halves its keys.
// The keys all hash into the lowest quarter of the range, so a split at
// the hash midpoint would leave every one of them in one child. Every
// acked record is below the split offset on every replica.
func TestSplitByLoad(t *testing.T) {
	t.Parallel()
	tr := newTestRegionWith(t, 3, 3, func(c *Config) {
		c.MaintenanceInterval = 200 * time.Millisecond
		c.SplitRangeRecordsPerSecond = 40
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tr.createStream(ctx, "sp", 2)
	lo, hi := keyspace.HashStart(1, 2), keyspace.HashEnd(1, 2)
	keys := keysInHashes(lo, lo+(hi-lo)/4, 32)
	// Until the range answers RANGE_SPLIT, however fast appends are here:
	// the split needs loadSplitLooks looks over the rate and a catalogue
	// round, and a fast machine acks a thousand records before that.
	p := &splitProducer{tr: tr, stream: "sp", rng: 1, pid: 94, keys: keys, batchesMax: 1 << 40}
	start := time.Now()
	p.run(ctx, nil)
	t.Logf("range 1 split by load after %d records, %v", len(p.acked), time.Since(start).Round(time.Millisecond))
	if p.refuse == nil {
		t.Fatalf("range 1 did not split by load after %d records", len(p.acked))
	}
	var m keyspace.RangeMap
	for id := range tr.nodes {
		pollUntil(t, ctx, fmt.Sprintf("node %d applies the split", id), func() bool { return tr.rangeMapOn(id, "sp").Version == 1 })
		m = tr.rangeMapOn(id, "sp")
	}
	parent, _ := m.Get(1)
	left := 0
	for _, k := range keys {
		if m.LookupKey(k) == parent.Left {
			left++
		}
	}
	if left < len(keys)/4 || left > len(keys)*3/4 {
		t.Fatalf("split at %#x leaves %d of %d keys in the left child, want about half", m.Ranges[parent.Left].HashEnd+1, left, len(keys))
	}
	checkSplitLog(t, ctx, tr, p, uint64(len(p.acked)))
	t.Logf("range 1 split by load at offset %d: %d of %d keys left", len(p.acked), left, len(keys))
}

// TestNoSplitForOneHotKey: a range over the load threshold whose load is
// one key is not split (no boundary spreads it), however long it stays
// hot; the node records that it looked and found none.
func TestNoSplitForOneHotKey(t *testing.T) {
	t.Parallel()
	tr := newTestRegionWith(t, 3, 3, func(c *Config) {
		c.MaintenanceInterval = 200 * time.Millisecond
		c.SplitRangeRecordsPerSecond = 40
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tr.createStream(ctx, "hk", 2)
	p := &splitProducer{tr: tr, stream: "hk", rng: 1, pid: 95, keys: keysOf(1, 2, 1)}
	looked := func() bool {
		for _, n := range tr.nodes {
			if n.loadSplits.lookOf("hk", 1).unsplittable >= 2 {
				return true
			}
		}
		return false
	}
	for seq := uint64(0); !looked(); {
		if ctx.Err() != nil {
			t.Fatal("the hot range was never found over the threshold")
		}
		_, err := p.send(ctx, p.request(seq))
		switch {
		case err == nil:
			seq++
		case rpcerr.IsRetriable(err):
			time.Sleep(10 * time.Millisecond) // the same sequence again
		default:
			t.Fatalf("append %d: %v", seq, err)
		}
	}
	for id := range tr.nodes {
		if v := tr.rangeMapOn(id, "hk").Version; v != 0 {
			t.Fatalf("node %d: map version %d: a range whose load is one key split", id, v)
		}
	}
}
