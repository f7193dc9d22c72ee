package regionsvc

import (
	"context"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/segment"
)

// TestLeaderFsyncFailureHandsOff: in a region of three, the leader's fsync
// fails (EIO): its range stops on that node, but leadership moves to a
// follower, which takes the appends; an append sent to the stopped node
// gets a retriable NOT_LEADER naming the new leader's address. Before,
// the range waited for the followers' election timeout, and the stopped
// node answered UNAVAILABLE, holding its producers, until a restart.
func TestLeaderFsyncFailureHandsOff(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	f := newFaultRegion(t, ctx, "eio", func(cfg *Config) {
		cfg.Fsync = segment.FsyncAlways // the fault is in the fsync
	})
	tr, faults := f, f.faults
	appendN := func(n int) { f.appendN(ctx, n) }
	leaderOf := f.leaderOf
	appendN(5)
	pollUntil(t, ctx, "a leader", func() bool { return leaderOf() != 0 })
	old := leaderOf()
	faults[old].SetSyncFail(true)
	appendN(5)
	pollUntil(t, ctx, "leadership to leave the failed node", func() bool {
		l := leaderOf()
		return l != 0 && l != old
	})
	if f := tr.rangeDriverOf(old, "eio", 0).failure.Load(); f == nil {
		t.Fatal("the range did not stop on the node whose fsync failed")
	}
	pollUntil(t, ctx, "the stopped node to name the new leader", func() bool {
		_, err := tr.clients[old].Append(ctx, &geologv1.AppendRequest{Stream: "eio", ProducerId: 4, Records: recs("x", 1)})
		e := rpcerr.FromError(err)
		return e.Code == apierr.NotLeader && e.Retriable && e.LeaderHint == tr.nodes[leaderOf()].advertise
	})
	faults[old].SetSyncFail(false)
	appendN(5)
	pollUntil(t, ctx, "the others to hold every record", func() bool {
		for id := range tr.nodes {
			if d := tr.rangeDriverOf(id, "eio", 0); id != old && (d == nil || d.committed.Load() != uint64(f.acked)) {
				return false
			}
		}
		return true
	})
}
