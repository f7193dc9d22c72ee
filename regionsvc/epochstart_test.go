package regionsvc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/homing"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// TestNewHomeRaisesAShortStart: a new home whose log holds more of the old
// epoch than its recorded start says (what a takeover records when more of
// the taker's log commits after its tail was read: an apply in flight, a
// new leader's predecessor's entries) raises the start to its log's end
// before its first frame of the epoch, and that frame lands there: the
// epoch's recorded start is where its log really leaves the old epoch,
// and the old home's records past the short start stay in the log.
//
// The short start is made by moving the range with the lease store's own
// operations (a planned move completed at 17 while the target holds 20),
// so the test does not depend on catching a race. Without the gate
// (epochstart.go) the first epoch-2 record is acked at 20 while the
// history says epoch 2 starts at 17.
func TestNewHomeRaisesAShortStart(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster with a lease store")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	w := newHomingWorld(t, []string{"us", "eu"}, 1)
	createHomedStream(t, ctx, w.world, "es", 1, "us")
	appendAt(t, ctx, w, "us", "es", 20)
	waitUntil(t, ctx, 2*time.Minute, "eu's mirror holds the 20 records", func() bool {
		tl := w.tails(ctx, "es")
		return tl["eu"] != nil && tl["eu"][0] >= 20
	})
	store, err := homing.OpenSQL(ctx, homing.SQLConfig{URL: w.pgURL})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	key := homing.RangeKey{Stream: "es", Range: 0}
	moveShort(t, ctx, store, key, "eu", 17)

	c, res := produceOne(t, ctx, w, "eu", "es", "after/0")
	if res[0].Epoch != 2 || res[0].Offset != 20 {
		t.Fatalf("the new home's first record acked at %d under epoch %d, want 20 under epoch 2", res[0].Offset, res[0].Epoch)
	}
	hist, err := store.History(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 2 || hist[1].StartOffset != 20 {
		t.Fatalf("history %+v: want epoch 2 to start at 20, where its first frame is", hist)
	}
	got := readValues(t, ctx, c, "es", 17, 3)
	for i, v := range got {
		if want := fmt.Sprintf("after/%d", 17+i); v != want {
			t.Fatalf("offset %d holds %q, want the old home's %q", 17+i, v, want)
		}
	}
}

// TestNewHomeForksItsDivergentTail: a region that was home, lost the
// range while its log held frames past where the next epoch starts, and
// takes it back two epochs later must not raise its new epoch's start over
// those frames (they are not the range's: every offset past the
// intervening epoch's start is of that epoch or later). Its start gate
// forks them off into the orphan log and its first frame lands where the
// intervening epoch starts (seed 6500375 of the simulator, where a
// takeover by a region whose agent's copy lagged did it).
//
// Made with the lease store's own operations: us home at epoch 1 with 20
// records (17, then 3), moved to eu at epoch 2 starting at 17 (eu appends nothing, so
// its start stays at 17), then back to us at epoch 3 starting at 17. us's
// log holds epoch-1 frames to 20. Without the fork (rangecore.DivergeAt
// in Node.confirmStart) the first epoch-3 record is acked at 20.
func TestNewHomeForksItsDivergentTail(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster with a lease store")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	w := newHomingWorld(t, []string{"us", "eu"}, 1)
	createHomedStream(t, ctx, w.world, "ef", 1, "us")
	// Two batches: epoch 2's start (a takeover's tail, a committed end)
	// falls between batches, where a fork can cut.
	appendAt(t, ctx, w, "us", "ef", 17)
	appendAt(t, ctx, w, "us", "ef", 3)
	waitUntil(t, ctx, 2*time.Minute, "eu's mirror holds the 20 records", func() bool {
		tl := w.tails(ctx, "ef")
		return tl["eu"] != nil && tl["eu"][0] >= 20
	})
	store, err := homing.OpenSQL(ctx, homing.SQLConfig{URL: w.pgURL})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	key := homing.RangeKey{Stream: "ef", Range: 0}
	moveShortFrom(t, ctx, store, key, 1, "eu", 17)
	moveShortFrom(t, ctx, store, key, 2, "us", 17)
	// Until its gate forks, the home's copy serves nothing past 17
	// (rangecore's homeFence).
	for i, lc := range w.conns["us"] {
		waitUntil(t, ctx, 2*time.Minute, fmt.Sprintf("us node %d fences its divergent tail at 17", i), func() bool {
			d, err := lc.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "ef"})
			if err != nil || len(d.GetRanges()) == 0 {
				return false
			}
			ri := d.GetRanges()[0]
			// The role is stored after the fence it gives (updateFenceFor).
			return ri.GetHomeRegion() == "us" && ri.GetEpoch() == 3 &&
				ri.TimelineFenceOffset != nil && ri.GetTimelineFenceOffset() == 17 && ri.GetTailOffset() == 20
		})
	}

	c, res := produceOne(t, ctx, w, "us", "ef", "back/0")
	if res[0].Epoch != 3 || res[0].Offset != 17 {
		t.Fatalf("the returning home's first record acked at %d under epoch %d, want 17 under epoch 3 (forked where epoch 2 starts)", res[0].Offset, res[0].Epoch)
	}
	hist, err := store.History(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 3 || hist[2].StartOffset != 17 {
		t.Fatalf("history %+v: want epoch 3 to start at 17, where its first frame is", hist)
	}
	got := readValues(t, ctx, c, "ef", 15, 3)
	if want := []string{"after/15", "after/16", "back/0"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("offsets 15-17 hold %q, want %q", got, want)
	}
}

// produceOne appends one record of value (its key the part before "/") to
// stream from region, waiting for its ack; the client stays open for the
// test's reads (closed at its end).
func produceOne(t *testing.T, ctx context.Context, w *homingWorld, region, stream, value string) (*client.Client, []client.ProduceResult) {
	t.Helper()
	c, err := client.New(w.regionAddrs(region))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	p, err := c.NewProducer(stream, client.DeliveryTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	key, _, _ := strings.Cut(value, "/")
	res, err := p.ProduceSync(ctx, &client.Record{Key: []byte(key), Value: []byte(value)})
	if err != nil {
		t.Fatal(err)
	}
	return c, res
}

// moveShort moves key's home to region to at epoch 2 starting at start
// (PrepareRehome, then CompleteRehome once the old home confirmed it
// stopped: its next heartbeat).
func moveShort(t *testing.T, ctx context.Context, store homing.Store, key homing.RangeKey, to string, start uint64) {
	t.Helper()
	moveShortFrom(t, ctx, store, key, 1, to, start)
}

// moveShortFrom is moveShort from epoch (to epoch + 1).
func moveShortFrom(t *testing.T, ctx context.Context, store homing.Store, key homing.RangeKey, epoch uint64, to string, start uint64) {
	t.Helper()
	if _, err := store.PrepareRehome(ctx, homing.RehomeRequest{Key: key, Epoch: epoch, To: to}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, ctx, 2*time.Minute, "the move completed", func() bool {
		_, err := store.CompleteRehome(ctx, homing.RehomeRequest{Key: key, Epoch: epoch, To: to, StartOffset: start,
			NowNanos: time.Now().UnixNano(), MaxOffsetNanos: int64(testMaxClockOffset)})
		if err != nil && !errors.Is(err, homing.ErrNotDrained) {
			t.Fatal(err)
		}
		return err == nil
	})
}

// readValues reads n record values of stream's range 0 from offset from.
func readValues(t *testing.T, ctx context.Context, c *client.Client, stream string, from uint64, n int) []string {
	t.Helper()
	var out []string
	for rec, err := range c.Subscribe(ctx, stream, 0, client.StartAt{Offset: from}) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(rec.Value))
		if len(out) == n {
			break
		}
	}
	return out
}
