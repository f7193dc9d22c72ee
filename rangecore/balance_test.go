package rangecore

import (
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/quorum"
	"go.etcd.io/raft/v3/tracker"
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
	const g = 4
	if got := PreferredLeader(g, []uint64{1, 2, 3}); got != 2 {
		t.Fatalf("preferred leader of group 4 over 1-3: %d, want 2", got)
	}
	if got := PreferredLeader(g, nil); got != 0 {
		t.Fatalf("preferred leader with no voters: %d", got)
	}
	if got := PreferredTransferee(1, g, 0, leaderStatus(1), none); got != 2 {
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
		if got := PreferredTransferee(c.self, g, 0, st, c.down); got != 0 {
			t.Errorf("%s: transferee %d, want none", c.name, got)
		}
	}
	// The preferred leader follows the voters: with 2 removed and 4 added,
	// group 4 prefers voters[4%3] of 1, 3, 4 = 3.
	st := leaderStatus(1)
	st.Config.Voters[0] = quorum.MajorityConfig{1: {}, 3: {}, 4: {}}
	st.Progress[4] = st.Progress[3]
	delete(st.Progress, 2)
	if got := PreferredTransferee(1, g, 0, st, none); got != 3 {
		t.Fatalf("after a voter change: transferee %d, want 3", got)
	}
}

// TestPreferredTransfereeNamedByCatalogue: a preferred leader the
// catalogue names (the rebalancer's leader balance) wins over the group
// id's pick while it is a voter, so the two never hand leadership back
// and forth; once it is no voter the group id picks again.
func TestPreferredTransfereeNamedByCatalogue(t *testing.T) {
	none := func(uint64) bool { return false }
	const g = 4 // the group id picks 2 over 1-3
	if got := PreferredTransferee(1, g, 3, leaderStatus(1), none); got != 3 {
		t.Fatalf("leader 1, catalogue names 3: transferee %d, want 3", got)
	}
	if got := PreferredTransferee(3, g, 3, leaderStatus(3), none); got != 0 {
		t.Fatalf("leader 3, catalogue names 3: transferee %d, want none (no hand-back to the group id's pick 2)", got)
	}
	if got := PreferredTransferee(1, g, 5, leaderStatus(1), none); got != 2 {
		t.Fatalf("catalogue names 5, no voter: transferee %d, want the group id's pick 2", got)
	}
}
