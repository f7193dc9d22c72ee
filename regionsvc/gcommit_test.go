package regionsvc

import (
	"context"
	"testing"
	"time"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/segment"
)

// TestGroupCommitRegion: with group commit on (Config.GroupCommit), every
// node's range logs flush through the node's sync point, appends are
// acked, and none is acked while only the leader's flushes succeed: the
// ack still waits for a quorum's durable copies.
func TestGroupCommitRegion(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	f := newFaultRegion(t, ctx, "gc", func(cfg *Config) { cfg.GroupCommit, cfg.Fsync = true, segment.FsyncAlways })
	f.appendN(ctx, 20)
	pollUntil(t, ctx, "a leader", func() bool { return f.leaderOf() != 0 })
	pollUntil(t, ctx, "every node to hold every record", func() bool {
		for id := range f.nodes {
			if d := f.rangeDriverOf(id, f.stream, 0); d == nil || d.committed.Load() != uint64(f.acked) {
				return false
			}
		}
		return true
	})
	for id, n := range f.nodes {
		if n.syncs == nil || n.syncs.Rounds() == 0 {
			t.Fatalf("node %d: its logs did not flush through the node's sync point", id)
		}
	}
	leader := f.leaderOf()
	for id := range f.nodes {
		if id != leader {
			f.faults[id].SetSyncFail(true)
		}
	}
	actx, acancel := context.WithTimeout(ctx, 3*time.Second)
	defer acancel()
	_, err := f.clients[leader].Append(actx, &geologv1.AppendRequest{Stream: f.stream, Records: recs("one copy", 1)})
	if err == nil {
		t.Fatal("an append was acked while only the leader could make it durable")
	}
}
