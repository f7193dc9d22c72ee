package regionsvc

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/segment"
	"github.com/geolog/geolog/vfs"
)

// TestLeaderFsyncFailureHandsOff: in a region of three, the leader's fsync
// fails (EIO): its range stops on that node, but leadership moves to a
// follower, which takes the appends; an append sent to the stopped node
// gets a retriable NOT_LEADER naming the new leader's address. Before,
// the range waited for the followers' election timeout, and the stopped
// node answered UNAVAILABLE, holding its producers, until a restart.
func TestLeaderFsyncFailureHandsOff(t *testing.T) {
	faults := map[uint64]*vfs.Faults{1: {}, 2: {}, 3: {}}
	tr := newTestRegionWith(t, 3, 3, func(cfg *Config) {
		cfg.FS = vfs.WithFaults(vfs.OS(), faults[cfg.NodeID])
		cfg.Fsync = segment.FsyncAlways // the fault is in the fsync
	})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	tr.retry(ctx, "create stream", func(ctx context.Context, c geologv1.LogClient) error {
		_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "eio", RangeCount: 1})
		if apierr.CodeOf(err) == apierr.StreamExists {
			return nil
		}
		return err
	})
	seq := 0
	appendN := func(n int) {
		for end := seq + n; seq < end; seq++ {
			recs := []*geologv1.Record{{Key: []byte("k"), Value: []byte(fmt.Sprintf("v%d", seq))}}
			tr.retry(ctx, "append", func(ctx context.Context, c geologv1.LogClient) error {
				_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "eio", ProducerId: 3, BaseSequence: uint64(seq), Records: recs})
				return err
			})
		}
	}
	leaderOf := func() uint64 {
		for id := range tr.nodes {
			if d := tr.rangeDriverOf(id, "eio", 0); d != nil && d.rep != nil && d.rep.LeaderID() == id {
				return id
			}
		}
		return 0
	}
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
			if d := tr.rangeDriverOf(id, "eio", 0); id != old && (d == nil || d.committed.Load() != uint64(seq)) {
				return false
			}
		}
		return true
	})
}
