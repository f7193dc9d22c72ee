package replica

import (
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// TestFollowersKeepLeaderFloor: only the leader's driver knows the
// compaction floor (what a mirror region still needs); its followers keep
// their logs from it all the same (floor.go), so that whichever of them
// leads next still holds what the mirror needs, and keep it while they
// lead without a floor of their own. Without the sharing, node 2 and 3
// compact past the floor by retention alone and the new leader, node 2,
// no longer holds offset 30.
func TestFollowersKeepLeaderFloor(t *testing.T) {
	c := newClusterOpts(t, 3, 3, withCompaction(2000))
	c.elect(1)
	c.proposeN(7, 0, 40, "a")
	c.tick(2)
	const floor = 30
	c.replicas[1].SetCompactionFloor(floor, true)
	c.compact(1) // shares the floor
	c.settle()
	for _, id := range c.ids {
		c.compact(id)
		if start := c.logs[id].StartOffset(); start > floor {
			t.Fatalf("node %d: log starts at offset %d, past the leader's floor %d", id, start, floor)
		}
	}
	if f, ok := c.replicas[2].LearnedCompactionFloor(); !ok || f != floor {
		t.Fatalf("node 2 learned floor %d (%v), want %d", f, ok, floor)
	}
	// Node 2 leads without a floor of its own: it keeps the learned one.
	// Node 1's driver drops its floor as it no longer leads (regionsvc
	// sets one only on a leader).
	c.transfer(2)
	c.replicas[1].SetCompactionFloor(0, false)
	c.proposeN(7, 120, 20, "b")
	c.tick(2)
	c.compact(2) // shares the floor it learned
	c.settle()
	for _, id := range c.ids {
		c.compact(id)
		if start := c.logs[id].StartOffset(); start > floor {
			t.Fatalf("after the transfer, node %d: log starts at offset %d, past the floor %d", id, start, floor)
		}
	}
	// Its own floor, once set, replaces the learned one, here and on its
	// followers.
	c.replicas[2].SetCompactionFloor(90, true)
	c.compact(2)
	c.settle()
	for _, id := range c.ids {
		c.compact(id)
		if start := c.logs[id].StartOffset(); start <= floor || start > 90 {
			t.Fatalf("with the floor raised to 90, node %d: log starts at offset %d", id, start)
		}
	}
	c.agree()
}

// TestFloorMessageOnlyFromLeader: a floor message from a node that does
// not lead this term is ignored, and no floor message reaches Raft.
func TestFloorMessageOnlyFromLeader(t *testing.T) {
	c := newCluster(t, 3)
	c.elect(1)
	c.transfer(2)
	c.transfer(1) // term 3: a lower one to try
	term := c.replicas[2].Status().GetTerm()
	msg := func(from, term uint64) *raftpb.Message {
		m := floorMsg(from, 2, term, 5, false)
		return m
	}
	for _, m := range []*raftpb.Message{msg(3, term), msg(1, term+1), msg(1, term-1)} {
		if err := c.replicas[2].Step(m); err != nil {
			t.Fatalf("step %v: %v", m, err)
		}
		if _, ok := c.replicas[2].LearnedCompactionFloor(); ok {
			t.Fatalf("learned a floor from %v", m)
		}
	}
	if term2 := c.replicas[2].Status().GetTerm(); term2 != term {
		t.Fatalf("a floor message of term %d moved the term to %d", term+1, term2)
	}
	if err := c.replicas[2].Step(msg(1, term)); err != nil {
		t.Fatal(err)
	}
	if f, ok := c.replicas[2].LearnedCompactionFloor(); !ok || f != 5 {
		t.Fatalf("from the leader: floor %d (%v), want 5", f, ok)
	}
}

// TestLearnedFloorSurvivesRestart: a follower restarted before its
// leader's next floor message holds to the floor it learned (saved in its
// hard state, HardState.SharedFloor); without it, node 3 restarted and
// compacted past the floor by retention alone.
func TestLearnedFloorSurvivesRestart(t *testing.T) {
	c := newClusterOpts(t, 3, 3, withCompaction(2000))
	c.elect(1)
	const floor = 9
	c.replicas[1].SetCompactionFloor(floor, true)
	c.compact(1) // shares the floor before anything is compactable
	c.settle()
	c.proposeN(7, 0, 40, "a")
	c.tick(2)
	c.stop(3)
	c.start(3)
	if f, ok := c.replicas[3].LearnedCompactionFloor(); !ok || f != floor {
		t.Fatalf("node 3 restarted with learned floor %d (%v), want %d", f, ok, floor)
	}
	c.compact(3)
	if start := c.logs[3].StartOffset(); start > floor {
		t.Fatalf("node 3 restarted and compacted to offset %d, past the floor %d", start, floor)
	}
}

// TestLeaderFloorSurvivesRestart: a leader that crashes never steps down,
// so its driver's floor never became a learned one; restarted as a
// follower, it must hold to that floor until its new leader's first floor
// message, not compact by retention alone (seed 743 of the minute runs).
func TestLeaderFloorSurvivesRestart(t *testing.T) {
	c := newClusterOpts(t, 3, 3, withCompaction(2000))
	c.elect(1)
	const floor = 9
	c.replicas[1].SetCompactionFloor(floor, true)
	c.compact(1)
	c.settle()
	c.proposeN(7, 0, 40, "a")
	c.tick(2)
	c.stop(1)
	c.start(1)
	if f, ok := c.replicas[1].LearnedCompactionFloor(); !ok || f != floor {
		t.Fatalf("the leader restarted with learned floor %d (%v), want its own %d", f, ok, floor)
	}
	c.compact(1)
	if start := c.logs[1].StartOffset(); start > floor {
		t.Fatalf("the leader restarted and compacted to offset %d, past its floor %d", start, floor)
	}
}

// TestLeaderLowerFloorSurvivesRestart: a leader whose driver's floor is
// below the one it learned as a follower (floors fall when a takeover
// lowers a mirror's resend point) and that crashes restarts holding to
// its own, lower floor, not the learned one it saved before it led.
func TestLeaderLowerFloorSurvivesRestart(t *testing.T) {
	c := newClusterOpts(t, 3, 3, withCompaction(2000))
	c.elect(2)
	c.replicas[2].SetCompactionFloor(20, true)
	c.compact(2) // node 1 learns and saves 20
	c.transfer(1)
	const floor = 9
	c.replicas[1].SetCompactionFloor(floor, true)
	c.compact(1)
	c.proposeN(7, 0, 40, "a")
	c.tick(2)
	c.stop(1)
	c.start(1)
	if f, ok := c.replicas[1].LearnedCompactionFloor(); !ok || f != floor {
		t.Fatalf("the leader restarted with learned floor %d (%v), want its own %d", f, ok, floor)
	}
	c.compact(1)
	if start := c.logs[1].StartOffset(); start > floor {
		t.Fatalf("the leader restarted and compacted to offset %d, past its floor %d", start, floor)
	}
}

// TestUnheardFloorHoldsCompaction: a follower that has heard from no
// leader whether there is a floor compacts nothing, and once it hears,
// holds to the floor or, told there is none, compacts by retention.
// Seed 486 of the minute runs: a replica added back with a wiped disk took
// the log by snapshot, its leader (with a floor) crashed before its next
// floor message, and the new replica, leaderless, compacted by retention
// alone past the floor; leading the home later, it resent to a divergent
// mirror from inside the mirror's divergent frame. Without the hold node 3
// compacts here to offset 39, past the floor 9.
func TestUnheardFloorHoldsCompaction(t *testing.T) {
	c := newClusterOpts(t, 3, 3, withCompaction(2000))
	c.drop = func(m *raftpb.Message) bool { return IsFloorMessage(m) && m.GetTo() == 3 }
	c.elect(1)
	const floor = 9
	c.replicas[1].SetCompactionFloor(floor, true)
	c.compact(1)
	c.proposeN(7, 0, 40, "a")
	c.tick(2)
	c.compact(1)
	c.stop(1) // crashes before node 3 heard its floor
	if n := c.compact(3); n != 0 {
		t.Fatalf("node 3 heard no floor and compacted %d segments, to offset %d", n, c.logs[3].StartOffset())
	}
	// Node 2, which learned the floor, leads next and shares it.
	c.drop = nil
	for i := 0; i < 100 && !c.replicas[2].IsLeader() && !c.replicas[3].IsLeader(); i++ {
		c.tick(1) // to an election timeout: node 2 or node 3 leads
	}
	if c.replicas[3].IsLeader() {
		c.transfer(2)
	}
	if !c.replicas[2].IsLeader() {
		t.Fatalf("node 2 does not lead: node 3 leads %v, terms %d %d", c.replicas[3].IsLeader(), c.replicas[2].Status().GetTerm(), c.replicas[3].Status().GetTerm())
	}
	c.compact(2)
	c.compact(3)
	if f, ok := c.replicas[3].LearnedCompactionFloor(); !ok || f != floor {
		t.Fatalf("node 3 learned floor %d (%v) from the new leader, want %d", f, ok, floor)
	}
	if start := c.logs[3].StartOffset(); start > floor {
		t.Fatalf("node 3 compacted to offset %d, past the floor %d", start, floor)
	}
}

// TestNoFloorLetsFollowerCompact: a leader with no floor says so, and a
// follower that heard it compacts by retention alone; a restarted one
// waits to hear it again.
func TestNoFloorLetsFollowerCompact(t *testing.T) {
	c := newClusterOpts(t, 3, 3, withCompaction(2000))
	c.elect(1)
	c.proposeN(7, 0, 40, "a")
	c.tick(2)
	if n := c.replicas[2].compactOnly(t); n != 0 {
		t.Fatalf("node 2 compacted %d segments before it heard whether there is a floor", n)
	}
	c.compact(1) // shares that there is none
	if c.compact(2) == 0 {
		t.Fatal("node 2, told there is no floor, compacted nothing")
	}
	c.stop(3)
	c.start(3)
	if n := c.replicas[3].compactOnly(t); n != 0 {
		t.Fatalf("node 3 restarted and compacted %d segments before it heard again", n)
	}
	for i := 0; i < floorShareRounds; i++ {
		c.compact(1) // the leader says it again within floorShareRounds
	}
	if c.compact(3) == 0 {
		t.Fatal("node 3, told again there is no floor, compacted nothing")
	}
}

// compactOnly runs Compact without delivering anything.
func (r *Replica) compactOnly(t *testing.T) int {
	t.Helper()
	n, err := r.Compact()
	if err != nil {
		t.Fatal(err)
	}
	return n
}
