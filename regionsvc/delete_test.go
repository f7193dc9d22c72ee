package regionsvc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/homing"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/hashicorp/go-hclog"
)

// checkDeleted checks that no node of w holds stream: it answers
// STREAM_NOT_FOUND everywhere, and its files are gone. Each node applies
// the deletion from its catalogue (the call returns once the answering
// node dropped the stream, before every node removed its files), so the
// check waits, within a bound, for every node to have done so.
func checkDeleted(t *testing.T, ctx context.Context, w *world, stream string) {
	t.Helper()
	var last string
	gone := func() bool {
		for _, region := range w.regions {
			for id, c := range w.conns[region] {
				_, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: stream})
				if rpcerr.CodeOf(err) != apierr.StreamNotFound {
					last = fmt.Sprintf("%s node %d after the deletion: %v", region, id, err)
					return false
				}
				if _, err := os.Stat(filepath.Join(w.dirs[region][id], "streams", stream)); !errors.Is(err, os.ErrNotExist) {
					last = fmt.Sprintf("%s node %d keeps the stream's files: %v", region, id, err)
					return false
				}
			}
		}
		return true
	}
	for deadline := time.Now().Add(30 * time.Second); !gone(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatal(last)
		}
	}
}

// deleteAndRecreate deletes stream through a node of region from, checks
// it is gone everywhere, then creates a stream of the same name anew (one
// range more, homed in home), which starts empty everywhere and takes
// appends.
func deleteAndRecreate(t *testing.T, ctx context.Context, w *world, stream, from, home string, ranges uint32) {
	t.Helper()
	if _, err := w.conns[from][1].DeleteStream(ctx, &geologv1.DeleteStreamRequest{Name: stream}); err != nil {
		t.Fatalf("delete through %s: %v", from, err)
	}
	checkDeleted(t, ctx, w, stream)
	if _, err := w.conns[from][1].DeleteStream(ctx, &geologv1.DeleteStreamRequest{Name: stream}); rpcerr.CodeOf(err) != apierr.StreamNotFound {
		t.Fatalf("deleting it again: %v", err)
	}
	createHomedStream(t, ctx, w, stream, ranges+1, home)
	waitUntil(t, ctx, time.Minute, "the new stream everywhere", func() bool {
		for _, region := range w.regions {
			for _, c := range w.conns[region] {
				d, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: stream})
				if err != nil || uint32(len(d.GetRanges())) != ranges+1 {
					return false
				}
				for _, r := range d.GetRanges() {
					if r.GetTailOffset() != 0 || r.GetStartOffset() != 0 {
						t.Fatalf("%s: the new stream's range %d starts at %d, ends at %d", region, r.GetRange(), r.GetStartOffset(), r.GetTailOffset())
					}
				}
			}
		}
		return true
	})
	produceN(t, ctx, w, from, stream, 5, "new")
	waitCaughtUp(t, ctx, w, stream)
}

// TestDeleteStreamMultiRegion: a stream placed in two regions of three
// replicated nodes is deleted through a node of the region that is not its
// home: every node of both regions drops it (the deletion travels through
// each region's catalogue, and to the other region as a creation does),
// and the name takes a new stream.
func TestDeleteStreamMultiRegion(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := newWorld(t, []string{"us", "eu"}, 3, 2*time.Millisecond, 0)
	createHomedStream(t, ctx, w, "del", 2, "us")
	produceN(t, ctx, w, "us", "del", 20, "old")
	waitCaughtUp(t, ctx, w, "del")
	deleteAndRecreate(t, ctx, w, "del", "eu", "eu", 2)
}

// TestDeleteStreamHoming: with a lease store, a deletion also removes the
// stream's home records and epoch history, so that a new stream of the name
// starts at epoch 1 where its spec homes it, not where the old one was
// last moved.
func TestDeleteStreamHoming(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := newHomingWorld(t, []string{"us", "eu", "ap"}, *homingRegionSize)
	createHomedStream(t, ctx, w.world, "hd", 2, "us")
	produceN(t, ctx, w.world, "us", "hd", 10, "old")
	// Move the homes, so that the records differ from a new stream's.
	waitUntil(t, ctx, time.Minute, "rehomed to ap", func() bool {
		resp, err := geologv1.NewAdminClient(mustConn(t, w.addrs["us"][1])).Rehome(ctx, &geologv1.RehomeRequest{Stream: "hd", AllRanges: true, Region: "ap"})
		return err == nil && resp.GetRanges()[0].GetStatus() == "moved"
	})
	waitCaughtUp(t, ctx, w.world, "hd")
	deleteAndRecreate(t, ctx, w.world, "hd", "eu", "us", 2)
	store, err := homing.OpenSQL(ctx, homing.SQLConfig{URL: w.pgURL})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	for r := uint32(0); r < 3; r++ {
		homes, err := store.Homes(ctx, []homing.RangeKey{{Stream: "hd", Range: r}})
		if err != nil {
			t.Fatal(err)
		}
		if h := homes[0]; h.Region != "us" || h.Epoch != 1 {
			t.Fatalf("range %d of the new stream: home %s at epoch %d", r, h.Region, h.Epoch)
		}
		hist, err := store.History(ctx, homing.RangeKey{Stream: "hd", Range: r})
		if err != nil || len(hist) != 1 {
			t.Fatalf("range %d: history %+v (%v), want the creation alone", r, hist, err)
		}
	}
}

// TestDeletedStreamStaysGoneAfterRestart: a node restarted after it
// deleted a stream does not bring it back while its catalogue group
// replays the stream's creation and deletion: the stream answers
// STREAM_NOT_FOUND from the start, its files do not come back, and the
// replay neither creates nor deletes it again (the stream records the
// saved catalogue reflects are not applied twice: catalogDisk.AppliedTo).
// A stream created after it is applied from the replay as usual when the
// saved catalogue predates it.
func TestDeletedStreamStaysGoneAfterRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	n, c := testNode(t, dir, nil)
	ctx := ctxT(t)
	createStream(t, c, "gone", 1)
	if _, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "gone", Range: 0, Records: recs("a", 1)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeleteStream(ctx, &geologv1.DeleteStreamRequest{Name: "gone"}); err != nil {
		t.Fatal(err)
	}
	createStream(t, c, "kept", 1)
	applied := n.region.metaApplied.Load()
	n.Close()
	logs := &syncBuffer{} // contract_test.go
	n, c = testNode(t, dir, func(cfg *Config) {
		cfg.Logger = hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info})
	})
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if _, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "gone"}); rpcerr.CodeOf(err) != apierr.StreamNotFound {
			t.Fatalf("the deleted stream after a restart: %v, want STREAM_NOT_FOUND", err)
		}
		if _, err := os.Stat(filepath.Join(dir, "streams", "gone")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the deleted stream's files came back after a restart: %v", err)
		}
	}
	waitUntil(t, ctx, 10*time.Second, "the catalogue replayed", func() bool { return n.region.metaApplied.Load() >= applied })
	for _, line := range strings.Split(logs.String(), "\n") {
		if (strings.Contains(line, "stream created") || strings.Contains(line, "stream deleted")) && strings.Contains(line, "stream=gone") {
			t.Fatalf("the catalogue's replay applied the deleted stream's records again: %s", line)
		}
	}
	if _, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "kept"}); err != nil {
		t.Fatalf("the stream kept: %v", err)
	}
}
