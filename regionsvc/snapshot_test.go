package regionsvc

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/atrest"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// newCompactingRegion is newTestRegion with tiny segments and a fast
// maintenance ticker, so that retention compacts replicated ranges within
// the test.
func newCompactingRegion(t *testing.T, size int) *testRegion {
	return newTestRegionWith(t, size, 3, func(cfg *Config) {
		cfg.SegmentBytesMax, cfg.MaintenanceInterval = 1<<10, 30*time.Millisecond
	})
}

// rangeDriverOf returns node id's driver of the stream's range, or nil.
func (tr *testRegion) rangeDriverOf(id uint64, stream string, r uint32) *rangeDriver {
	n := tr.nodes[id]
	if n == nil {
		return nil
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	st, ok := n.streams[stream]
	if !ok {
		return nil
	}
	return st.ranges[r]
}

// TestSnapshotCatchUpThroughRegion: a follower is stopped, the leader's
// retention compacts its log past the follower's, and the restarted
// follower catches up by segment transfer; all three nodes then serve the
// same records at the same offsets, and the follower reads by key.
func TestSnapshotCatchUpThroughRegion(t *testing.T) {
	t.Parallel()
	testSnapshotCatchUp(t, false)
}

// TestSnapshotCatchUpSealed is TestSnapshotCatchUpThroughRegion with
// encryption at rest on, each node under its own KEK: segment transfer
// ships frames the follower seals under its own key, and no node's data
// directory holds a record value in the clear.
func TestSnapshotCatchUpSealed(t *testing.T) {
	t.Parallel()
	testSnapshotCatchUp(t, true)
}

func testSnapshotCatchUp(t *testing.T, sealed bool) {
	var tr *testRegion
	if !sealed {
		tr = newCompactingRegion(t, 3)
	} else {
		keks := map[uint64]atrest.KEKProvider{}
		for id := uint64(1); id <= 3; id++ {
			_, keks[id] = newKEKFile(t)
		}
		tr = newTestRegionWith(t, 3, 3, func(cfg *Config) {
			cfg.SegmentBytesMax, cfg.MaintenanceInterval = 1<<10, 30*time.Millisecond
			cfg.KEK = keks[cfg.NodeID]
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tr.retry(ctx, "create stream", func(ctx context.Context, c geologv1.LogClient) error {
		_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "snap", RangeCount: 1,
			Retention: &geologv1.RetentionPolicy{MaxBytes: 6 << 10}})
		if rpcerr.CodeOf(err) == apierr.StreamExists {
			return nil
		}
		return err
	})
	value := func(i int) []byte { return []byte(fmt.Sprintf("v%04d-%s", i, strings.Repeat("x", 80))) }
	seq := 0
	appendN := func(n int) {
		for end := seq + n; seq < end; {
			i := seq
			var recs []*geologv1.Record
			for j := 0; j < 4; j++ {
				recs = append(recs, &geologv1.Record{Key: []byte("k"), Value: value(i + j)})
			}
			tr.retry(ctx, "append", func(ctx context.Context, c geologv1.LogClient) error {
				_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "snap", Range: 0, ProducerId: 9,
					BaseSequence: uint64(i), Records: recs})
				return err
			})
			seq += 4
		}
	}
	appendN(40)
	leaderOf := func() uint64 {
		for id := range tr.nodes {
			// LeaderID, unlike IsLeader, is safe off the driver goroutine.
			if d := tr.rangeDriverOf(id, "snap", 0); d != nil && d.rep != nil && d.rep.LeaderID() == id {
				return id
			}
		}
		return 0
	}
	pollUntil(t, ctx, "a leader of range 0", func() bool { return leaderOf() != 0 })
	leader := leaderOf()
	follower := leader%3 + 1
	pollUntil(t, ctx, "the follower to catch up before it stops", func() bool {
		d := tr.rangeDriverOf(follower, "snap", 0)
		return d != nil && d.committed.Load() == uint64(seq)
	})
	followerEnd := tr.rangeDriverOf(follower, "snap", 0).store.NextOffset()
	tr.stop(follower)

	// The leader compacts past everything the follower holds.
	appendN(200)
	pollUntil(t, ctx, "the leader to compact past the stopped follower", func() bool {
		d := tr.rangeDriverOf(leaderOf(), "snap", 0)
		return d != nil && d.store.StartOffset() > followerEnd
	})
	tr.start(follower)
	pollUntil(t, ctx, "the restarted follower to catch up", func() bool {
		d := tr.rangeDriverOf(follower, "snap", 0)
		return d != nil && d.rep != nil && d.committed.Load() == uint64(seq)
	})
	fd := tr.rangeDriverOf(follower, "snap", 0)
	if got := fd.rep.Stats().SnapshotsInstalled; got == 0 {
		t.Fatal("the follower caught up without a snapshot")
	}
	if fd.store.StartOffset() <= followerEnd {
		t.Fatalf("the follower's log starts at %d, below what it held before (%d): no segment transfer", fd.store.StartOffset(), followerEnd)
	}
	// Appends after the snapshot reach it by MsgApp.
	appendN(20)
	pollUntil(t, ctx, "every node to commit everything", func() bool {
		for id := range tr.nodes {
			if d := tr.rangeDriverOf(id, "snap", 0); d == nil || d.committed.Load() != uint64(seq) {
				return false
			}
		}
		return true
	})
	// Every node serves the same records at the same offsets where what
	// they retain overlaps (retention may still be moving their starts).
	var from uint64
	for id, c := range tr.clients {
		start, got := readRetained(t, ctx, c, tr.rangeDriverOf(id, "snap", 0), uint64(seq))
		from = max(from, start)
		for i, v := range got {
			if want := string(value(int(start) + i)); v != want {
				t.Fatalf("node %d offset %d: %q, want %q", id, int(start)+i, v[:6], want[:6])
			}
		}
	}
	if from >= uint64(seq) {
		t.Fatalf("nothing retained in common: start %d, tail %d", from, seq)
	}
	// The follower's key index came with the transfer: a read by key
	// (every record has key "k") gives what it retains.
	for attempt := 0; ; attempt++ {
		start := fd.store.StartOffset()
		resp, err := tr.clients[follower].Read(ctx, &geologv1.ReadRequest{Stream: "snap", FromOffset: start, Key: []byte("k"), MaxRecords: 1000})
		if rpcerr.CodeOf(err) == apierr.OffsetOutOfRange && attempt < 10 {
			continue // retention moved the start
		}
		if err != nil || len(resp.Records) != seq-int(start) || resp.NextOffset != uint64(seq) {
			t.Fatalf("read by key on the follower from %d: %v, %d records next %d, want %d", start, err, len(resp.GetRecords()), resp.GetNextOffset(), seq-int(start))
		}
		for i, r := range resp.Records {
			if string(r.Value) != string(value(int(start)+i)) {
				t.Fatalf("read by key on the follower: offset %d holds %q", r.Offset, r.Value[:6])
			}
		}
		break
	}
	t.Logf("follower installed %d snapshot(s); logs start at %d, end at %d", fd.rep.Stats().SnapshotsInstalled, from, seq)
	if sealed {
		for id := range tr.nodes {
			tr.stop(id)
		}
		for _, dir := range tr.dirs {
			grepTree(t, dir, []byte(strings.Repeat("x", 80)))
		}
	}
}

// pollUntil polls cond every 10 ms until it holds or ctx ends.
func pollUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}

// readRetained reads range 0 of "snap" through c from d's start offset to
// tail, starting over (a bounded number of times) if retention moves the
// start meanwhile. It returns the start and the values in offset order.
func readRetained(t *testing.T, ctx context.Context, c geologv1.LogClient, d *rangeDriver, tail uint64) (uint64, []string) {
	t.Helper()
	for attempt := 0; attempt < 10; attempt++ {
		start := d.store.StartOffset()
		var got []string
		var err error
		for off := start; off < tail && err == nil; {
			var rr *geologv1.ReadResponse
			rr, err = c.Read(ctx, &geologv1.ReadRequest{Stream: "snap", Range: 0, FromOffset: off, MaxRecords: 1000})
			if err != nil {
				break
			}
			if len(rr.Records) == 0 {
				t.Fatalf("nothing at offset %d of %d", off, tail)
			}
			for _, r := range rr.Records {
				if r.Offset != off {
					t.Fatalf("record at offset %d, want %d", r.Offset, off)
				}
				got = append(got, string(r.Value))
				off++
			}
		}
		if err == nil {
			return start, got
		}
		if rpcerr.CodeOf(err) != apierr.OffsetOutOfRange {
			t.Fatalf("read from %d: %v", start, err)
		}
	}
	t.Fatal("the log's start kept moving")
	return 0, nil
}
