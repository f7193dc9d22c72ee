package regionsvc

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/quorum"
	"go.etcd.io/raft/v3/tracker"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/raftnet"
)

// leaderStatus is the Raft status of leader self over voters 1-3, every
// follower caught up and replicating.
func leaderStatus(self uint64) raft.Status {
	st := raft.Status{Progress: map[uint64]tracker.Progress{}}
	st.RaftState = raft.StateLeader
	st.Config.Voters[0] = quorum.MajorityConfig{1: {}, 2: {}, 3: {}}
	for id := uint64(1); id <= 3; id++ {
		st.Progress[id] = tracker.Progress{Match: 40, State: tracker.StateReplicate, RecentActive: true}
	}
	return st
}

func TestPreferredTransferee(t *testing.T) {
	none := func(uint64) bool { return false }
	// Group 4 over voters 1-3 prefers voters[4%3] = 2.
	const g raftnet.GroupID = 4
	if got := preferredLeader(g, []uint64{1, 2, 3}); got != 2 {
		t.Fatalf("preferred leader of group 4 over 1-3: %d, want 2", got)
	}
	if got := preferredLeader(g, nil); got != 0 {
		t.Fatalf("preferred leader with no voters: %d", got)
	}
	if got := preferredTransferee(1, g, 0, leaderStatus(1), none); got != 2 {
		t.Fatalf("leader 1 of group 4: transferee %d, want 2", got)
	}
	cases := []struct {
		name string
		self uint64
		mut  func(*raft.Status)
		down func(uint64) bool
	}{
		{"the leader is the preferred one", 2, nil, none},
		{"not the leader", 1, func(s *raft.Status) { s.RaftState = raft.StateFollower }, none},
		{"a transfer under way", 1, func(s *raft.Status) { s.LeadTransferee = 3 }, none},
		{"a joint configuration", 1, func(s *raft.Status) { s.Config.Voters[1] = quorum.MajorityConfig{1: {}, 2: {}, 4: {}} }, none},
		{"the preferred node is down", 1, nil, func(id uint64) bool { return id == 2 }},
		{"the preferred node is behind", 1, func(s *raft.Status) { p := s.Progress[2]; p.Match = 39; s.Progress[2] = p }, none},
		{"the preferred node is probed", 1, func(s *raft.Status) { p := s.Progress[2]; p.State = tracker.StateProbe; s.Progress[2] = p }, none},
		{"the preferred node is not heard from", 1, func(s *raft.Status) { p := s.Progress[2]; p.RecentActive = false; s.Progress[2] = p }, none},
		{"the preferred node is a learner", 1, func(s *raft.Status) { p := s.Progress[2]; p.IsLearner = true; s.Progress[2] = p }, none},
		{"no progress for the preferred node", 1, func(s *raft.Status) { delete(s.Progress, 2) }, none},
	}
	for _, c := range cases {
		st := leaderStatus(c.self)
		if c.mut != nil {
			c.mut(&st)
		}
		if got := preferredTransferee(c.self, g, 0, st, c.down); got != 0 {
			t.Errorf("%s: transferee %d, want none", c.name, got)
		}
	}
	// The preferred leader follows the voters: with 2 removed and 4 added,
	// group 4 prefers voters[4%3] of 1, 3, 4 = 3.
	st := leaderStatus(1)
	st.Config.Voters[0] = quorum.MajorityConfig{1: {}, 3: {}, 4: {}}
	st.Progress[4] = st.Progress[3]
	delete(st.Progress, 2)
	if got := preferredTransferee(1, g, 0, st, none); got != 3 {
		t.Fatalf("after a voter change: transferee %d, want 3", got)
	}
}

// TestPreferredTransfereeNamedByCatalogue: a preferred leader the
// catalogue names (the rebalancer's leader balance) wins over the group
// id's pick while it is a voter, so the two never hand leadership back
// and forth; once it is no voter the group id picks again.
func TestPreferredTransfereeNamedByCatalogue(t *testing.T) {
	none := func(uint64) bool { return false }
	const g raftnet.GroupID = 4 // the group id picks 2 over 1-3
	if got := preferredTransferee(1, g, 3, leaderStatus(1), none); got != 3 {
		t.Fatalf("leader 1, catalogue names 3: transferee %d, want 3", got)
	}
	if got := preferredTransferee(3, g, 3, leaderStatus(3), none); got != 0 {
		t.Fatalf("leader 3, catalogue names 3: transferee %d, want none (no hand-back to the group id's pick 2)", got)
	}
	if got := preferredTransferee(1, g, 5, leaderStatus(1), none); got != 2 {
		t.Fatalf("catalogue names 5, no voter: transferee %d, want the group id's pick 2", got)
	}
}

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
			preferred := preferredLeader(d.cfg.repl.groupID, d.cfg.repl.peers)
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
