package regionsvc

import (
	"context"
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// TestSplitMirrored: a range homed in one region splits; every mirror
// region records the split from the marker it was shipped, opens the
// children, and holds the parent up to its split offset and both children
// at the home's offsets with the home's records. One mirror region (ap) is
// down from before the split until records were appended to the children:
// it catches up with the parent, marker included, then records the split
// and takes the children's records.
func TestSplitMirrored(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	w := newWorld(t, []string{"us", "eu", "ap"}, 3, 10*time.Millisecond, 0)
	home := createGeoStream(t, ctx, w, "sm", 1)[0]
	var down string
	for _, r := range w.regions {
		if r != home {
			down = r // the last mirror region goes down
		}
	}
	const before = 30
	for i := 0; i < before; i++ {
		appendRetry(t, ctx, w, home, "sm", 0, fmt.Sprintf("key-%d", i), fmt.Sprintf("p-%d", i))
	}
	waitUntil(t, ctx, time.Minute, "mirrors hold the parent's records", func() bool {
		tails := w.tails(ctx, "sm")
		for _, r := range w.regions {
			if len(tails[r]) == 0 || tails[r][0] != before {
				return false
			}
		}
		return true
	})
	for id := uint64(1); id <= uint64(w.size); id++ {
		w.stop(down, id)
	}

	start := time.Now()
	res, err := w.nodes[home][1].splitRange(ctx, "sm", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.offset != before {
		t.Fatalf("split offset %d, want %d", res.offset, before)
	}
	m := nodeRangeMap(w.nodes[home][1], "sm")
	counts := map[uint32]int{}
	for i := 0; counts[res.decision.Left] < 10 || counts[res.decision.Right] < 10; i++ {
		key := fmt.Sprintf("key-%d", i)
		r := m.LookupKey([]byte(key))
		appendRetry(t, ctx, w, home, "sm", r, key, fmt.Sprintf("c%d-%d", r, i))
		counts[r]++
	}

	t.Logf("split at offset %d and %d appends to the children in %v", res.offset, counts[res.decision.Left]+counts[res.decision.Right], time.Since(start).Round(time.Millisecond))
	for id := uint64(1); id <= uint64(w.size); id++ {
		w.start(down, id)
	}
	for _, region := range w.regions {
		if region == home {
			continue
		}
		waitUntil(t, ctx, 2*time.Minute, region+" records the split and holds the children's records", func() bool {
			tails := w.tails(ctx, "sm")
			return len(tails[region]) == 3 && tails[region][1] == uint64(counts[res.decision.Left]) &&
				tails[region][2] == uint64(counts[res.decision.Right])
		})
		t.Logf("%s holds the children's records %v after the split", region, time.Since(start).Round(time.Millisecond))
		for id, n := range w.nodes[region] {
			waitUntil(t, ctx, time.Minute, fmt.Sprintf("%s node %d applies the split", region, id), func() bool {
				return nodeRangeMap(n, "sm").Version == m.Version
			})
			if got := nodeRangeMap(n, "sm"); !got.Equal(m) {
				t.Fatalf("%s node %d's range map %+v, the home's %+v", region, id, got, m)
			}
		}
		if tails := w.tails(ctx, "sm"); tails[region][0] != before+1 {
			t.Fatalf("%s: the parent's tail is %d, want the split offset %d plus the marker", region, tails[region][0], before)
		}
		_, err := w.conns[region][1].Append(ctx, &geologv1.AppendRequest{Stream: "sm", Range: res.decision.Left, Records: recs("x", 1)})
		wantCode(t, err, apierr.NotHome)
	}
	sameLogs(t, ctx, w, home, "sm", map[uint32]uint64{0: before, res.decision.Left: uint64(counts[res.decision.Left]),
		res.decision.Right: uint64(counts[res.decision.Right])}, m)
}

// appendRetry appends one keyed record to a range through region's nodes
// in turn, retrying retriable refusals (a child's home is settled a moment after
// its split is recorded).
func appendRetry(t *testing.T, ctx context.Context, w *world, region, stream string, r uint32, key, value string) {
	t.Helper()
	var last error
	for attempt := 0; attempt < 200; attempt++ {
		_, err := w.conns[region][uint64(attempt%w.size)+1].Append(ctx, &geologv1.AppendRequest{Stream: stream, Range: r,
			Records: []*geologv1.Record{{Key: []byte(key), Value: []byte(value)}}})
		if err == nil {
			return
		}
		if !rpcerr.IsRetriable(err) && rpcerr.CodeOf(err) != apierr.RangeNotFound {
			t.Fatalf("append %s to range %d: %v", value, r, err)
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("append %s to range %d: %v", value, r, last)
}

// sameLogs checks that every region holds each range's records [0, end)
// identically (offsets, keys, values, epochs, append times), and that
// every record of a child belongs to it by m.
func sameLogs(t *testing.T, ctx context.Context, w *world, home, stream string, ends map[uint32]uint64, m keyspace.RangeMap) {
	t.Helper()
	for r, end := range ends {
		var ref []byte
		for _, region := range append([]string{home}, w.regions...) {
			got, err := w.readLocal(ctx, region, stream, r, 0, end)
			if err != nil {
				t.Fatalf("read %s range %d: %v", region, r, err)
			}
			if uint64(len(got)) != end {
				t.Fatalf("%s range %d: %d records below %d", region, r, len(got), end)
			}
			h := sha256.New()
			for i, rec := range got {
				if rec.GetOffset() != uint64(i) {
					t.Fatalf("%s range %d: offset %d at position %d", region, r, rec.GetOffset(), i)
				}
				if p, _ := m.Get(r); p.Parent != keyspace.NoRange && !m.Owns(r, keyspace.Hash(rec.GetKey())) {
					t.Fatalf("%s range %d holds key %q of another range", region, r, rec.GetKey())
				}
				recordHash(h, rec)
			}
			if ref == nil {
				ref = h.Sum(nil)
			} else if string(h.Sum(nil)) != string(ref) {
				t.Fatalf("range %d: the log in %s differs from the home's (%s)", r, region, home)
			}
		}
		t.Logf("range %d: %d records, identical in %v", r, end, w.regions)
	}
}

// nodeRangeMap is n's range map of stream.
func nodeRangeMap(n *Node, stream string) keyspace.RangeMap {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.streams[stream].spec.rangeMap()
}
