package regionsvc

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/rangecore"
)

// moveLeader hands leadership of the stream's range r to node to, from
// its current leader, until to leads.
func (tr *testRegion) moveLeader(ctx context.Context, stream string, r uint32, to uint64) {
	tr.t.Helper()
	pollUntil(tr.t, ctx, fmt.Sprintf("node %d to lead %s/%d", to, stream, r), func() bool {
		for id := range tr.nodes {
			d := tr.rangeDriverOf(id, stream, r)
			if d == nil {
				continue
			}
			var lead uint64
			_ = d.exec(ctx, func() {
				if d.rep.IsLeader() {
					d.rep.TransferLeadership(to)
				}
				lead = d.rep.LeaderID()
			})
			if lead == to && id == to {
				return true
			}
		}
		time.Sleep(50 * time.Millisecond)
		return false
	})
}

// TestLeaderReturnsToPreferredNode: leadership moved off a range's
// preferred node comes back to it once the leader's balance interval
// passes, and a node configured without balancing keeps what it leads.
func TestLeaderReturnsToPreferredNode(t *testing.T) {
	t.Parallel()
	for _, balance := range []bool{true, false} {
		t.Run(fmt.Sprintf("balance=%v", balance), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			tr := newTestRegionWith(t, 3, 3, func(cfg *Config) {
				if balance {
					cfg.LeaderBalanceInterval = 200 * time.Millisecond
				}
			})
			tr.retry(ctx, "create stream", func(ctx context.Context, c geologv1.LogClient) error {
				_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "lb", RangeCount: 1})
				if rpcerr.CodeOf(err) == apierr.StreamExists {
					return nil
				}
				return err
			})
			pollUntil(t, ctx, "every node to open the range", func() bool {
				for id := range tr.nodes {
					if tr.rangeDriverOf(id, "lb", 0) == nil {
						return false
					}
				}
				return true
			})
			d := tr.rangeDriverOf(1, "lb", 0)
			preferred := rangecore.PreferredLeader(uint64(d.cfg.repl.groupID), d.cfg.repl.peers)
			other := preferred%3 + 1
			tr.moveLeader(ctx, "lb", 0, other)
			// Appends go on across the transfers: a client retries the
			// NOT_LEADER of a range handing off.
			for i := range 5 {
				tr.retry(ctx, "append", func(ctx context.Context, c geologv1.LogClient) error {
					_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "lb", ProducerId: 9, BaseSequence: uint64(i), Records: recs("x", 1)})
					return err
				})
			}
			if !balance {
				// Forty intervals of the balancing run: the leader stays.
				time.Sleep(8 * time.Second)
				if l := tr.leaderOf(ctx, "lb", 0); l != other {
					t.Fatalf("without balancing, leadership moved from node %d to %d", other, l)
				}
				return
			}
			pollUntil(t, ctx, fmt.Sprintf("leadership back on the preferred node %d", preferred), func() bool {
				return tr.leaderOf(ctx, "lb", 0) == preferred
			})
		})
	}
}
