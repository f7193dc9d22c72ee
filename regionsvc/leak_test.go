package regionsvc

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/geolog/geolog/homing/pgtest"
	"github.com/geolog/geolog/segment"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// TestCloseLeavesNoGoroutine: a 3-node region that served appends, a
// subscription, a cursor commit and a group, then closed, leaves no
// goroutine of its own behind (every background goroutine goes through the
// node's stopper or is waited for by Close).
func TestCloseLeavesNoGoroutine(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Run("region", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		tr := newTestRegionWith(t, 3, 3, nil)
		tr.retry(ctx, "create", func(ctx context.Context, c geologv1.LogClient) error {
			_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "s", RangeCount: 2})
			return err
		})
		tr.retry(ctx, "append", func(ctx context.Context, c geologv1.LogClient) error {
			_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "s", Range: 0, Records: recs("a", 5)})
			return err
		})
		sctx, scancel := context.WithCancel(ctx)
		sub, err := tr.clients[1].Subscribe(sctx, &geologv1.SubscribeRequest{Stream: "s", Range: 0})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sub.Recv(); err != nil {
			t.Fatal(err)
		}
		scancel()
		for id := range tr.nodes {
			conn := mustConn(t, tr.peers[id])
			cc := geologv1.NewConsumerClient(conn)
			waitUntil(t, ctx, time.Minute, "a cursor commit", func() bool {
				_, err := cc.CommitCursors(ctx, &geologv1.CommitCursorsRequest{Cursor: "c", Positions: []*geologv1.CursorPosition{{Stream: "s", Range: 0, Offset: 1}}})
				return err == nil
			})
			break
		}
	})
	goleak.VerifyNone(t, before)
}

// TestCloseAfterRehomeLeavesNoGoroutine: nodes of three regions with a
// lease store that moved a stream's homes (the rehome's background
// refreshes of the directory and of the old home's tails run on the
// stopper) close leaving no goroutine behind.
func TestCloseAfterRehomeLeavesNoGoroutine(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region cluster with a lease store")
	}
	pgtest.NewDatabase(t) // the shared server, before the baseline
	before := goleak.IgnoreCurrent()
	t.Run("world", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		w := newHomingWorld(t, []string{"us", "eu", "ap"}, 1)
		createHomedStream(t, ctx, w.world, "lk", 1, "us")
		produceN(t, ctx, w.world, "us", "lk", 10, "v")
		conn := mustConn(t, w.addrs["eu"][1])
		waitUntil(t, ctx, time.Minute, "rehomed to eu", func() bool {
			resp, err := geologv1.NewAdminClient(conn).Rehome(ctx, &geologv1.RehomeRequest{Stream: "lk", AllRanges: true, Region: "eu"})
			return err == nil && resp.GetRanges()[0].GetStatus() == "moved"
		})
		produceN(t, ctx, w.world, "eu", "lk", 5, "w")
	})
	goleak.VerifyNone(t, before)
}

// TestCloseDuringStreamOpenLeavesNoGoroutine: a node closed while its
// catalogue applies a stream's creation (opening the stream's ranges on the
// catalogue driver's goroutine) stops those ranges too, though they were
// not yet listed when Close began. The nodes close at once after the
// create returned (once one node applied it), so the others' applies
// overlap their Close; a few rounds make the overlap likely.
func TestCloseDuringStreamOpenLeavesNoGoroutine(t *testing.T) {
	before := goleak.IgnoreCurrent()
	for round := range 4 {
		t.Run(fmt.Sprintf("round%d", round), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			// Durable opens (each range's Raft state is fsynced) widen the
			// window in which an apply is still opening ranges.
			tr := newTestRegionWith(t, 3, 3, func(c *Config) { c.Fsync = segment.FsyncAlways })
			tr.retry(ctx, "create", func(ctx context.Context, c geologv1.LogClient) error {
				_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "s", RangeCount: 64})
				return err
			})
			var wg sync.WaitGroup
			for _, n := range tr.nodes {
				wg.Add(1)
				go func() { defer wg.Done(); n.Close() }()
			}
			wg.Wait()
		})
		goleak.VerifyNone(t, before)
	}
}
