package replica

import (
	"testing"

	"github.com/geolog/geolog/apierr"
	"go.etcd.io/raft/v3/raftpb"
)

// tickAwake ticks, n times, only the replicas that are not quiesced (as
// the range driver does), settling in between, and returns the messages
// other than quiesce heartbeats that were sent.
func (c *cluster) tickAwake(n int) (sent int) {
	count := c.drop
	c.drop = func(m *raftpb.Message) bool {
		if !IsQuiesceHeartbeat(m) {
			sent++
		}
		return count != nil && count(m)
	}
	defer func() { c.drop = count }()
	for i := 0; i < n; i++ {
		for _, id := range c.ids {
			if r := c.replicas[id]; r != nil && !r.Quiesced() {
				r.Tick()
			}
		}
		c.settle()
	}
	return sent
}

// quiesceGroup makes the leader quiesce and checks that every replica
// did.
func (c *cluster) quiesceGroup(leader uint64) {
	c.t.Helper()
	c.tick(2) // heartbeats carry the commit index to the followers
	if !c.replicas[leader].Quiesce(nil) {
		c.t.Fatal("an idle leader did not quiesce")
	}
	c.settle()
	for _, id := range c.ids {
		if !c.replicas[id].Quiesced() {
			c.t.Fatalf("node %d is not quiesced after the quiesce heartbeat", id)
		}
	}
}

// TestQuiescedGroupSendsNothing: once an idle group quiesced, ticking only
// the replicas that are awake sends no message at all (without quiescence
// the leader heartbeats every tick); a proposal then wakes the leader, its
// append wakes the followers, it commits, and the group quiesces again.
func TestQuiescedGroupSendsNothing(t *testing.T) {
	c := newCluster(t, 3)
	c.elect(1)
	var res []Result
	c.replicas[1].Propose(op(7, 0, 2, "a", &res))
	c.settle()
	c.quiesceGroup(1)
	if sent := c.tickAwake(50); sent != 0 {
		t.Fatalf("a quiesced group sent %d messages in 50 ticks", sent)
	}
	c.replicas[1].Propose(op(7, 2, 1, "b", &res))
	if c.replicas[1].Quiesced() {
		t.Fatal("the leader stayed quiesced with a proposal in flight")
	}
	c.settle()
	if len(res) != 2 || res[1].Err != nil || res[1].BaseOffset != 2 {
		t.Fatalf("replies: %+v", res)
	}
	for _, id := range []uint64{2, 3} {
		if c.replicas[id].Quiesced() {
			t.Fatalf("follower %d stayed quiesced after an append", id)
		}
	}
	c.quiesceGroup(1)
	if got := c.replicas[3].Committed(); got != 3 {
		t.Fatalf("follower committed %d after quiescing, want 3", got)
	}
}

// TestQuiesceOnlyWhenIdle: a leader with an entry a follower lacks, or a
// proposal in flight, does not quiesce; a follower that lacks the
// entries a quiesce heartbeat commits does not either.
func TestQuiesceOnlyWhenIdle(t *testing.T) {
	c := newCluster(t, 3)
	c.elect(1)
	c.tick(2)
	c.cut[3] = true
	var res []Result
	c.replicas[1].Propose(op(7, 0, 1, "a", &res))
	if c.replicas[1].Quiesce(nil) {
		t.Fatal("quiesced with a proposal in flight")
	}
	c.settle()
	c.tick(2)
	if c.replicas[1].Quiesce(nil) {
		t.Fatal("quiesced while follower 3 lacks an entry")
	}
	// Follower 3's node is down: not waited for once Raft's quorum check
	// found it inactive (until then it holds compaction back, and a
	// quiesced leader would never run the check).
	down3 := func(id uint64) bool { return id != 3 }
	if c.replicas[1].Quiesce(down3) {
		t.Fatal("quiesced while the lagging follower still counts as recently active")
	}
	c.tick(25) // past two election timeouts: the quorum check ran
	if !c.replicas[1].Quiesce(down3) {
		t.Fatal("did not quiesce with the lagging follower down")
	}
	c.settle()
	if !c.replicas[2].Quiesced() || c.replicas[3].Quiesced() {
		t.Fatalf("quiesced: node 2 %v, node 3 %v", c.replicas[2].Quiesced(), c.replicas[3].Quiesced())
	}
	// A forged quiesce heartbeat past follower 3's log does not quiesce
	// it (nor does Raft see a commit index past its log).
	c.cut[3] = false
	st := c.replicas[1].Status()
	err := c.replicas[3].Step(&raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), To: ptr(uint64(3)), From: ptr(uint64(1)),
		Term: ptr(st.GetTerm()), Commit: ptr(st.GetCommit()), Context: quiesceContext})
	if err != nil || c.replicas[3].Quiesced() {
		t.Fatalf("lagging follower: step %v, quiesced %v", err, c.replicas[3].Quiesced())
	}
}

// TestCutOffLeaderDoesNotQuiesce: a leader whose followers are all found
// down does not quiesce (it would lead on unseen, not ticking, so never
// running its quorum check); it ticks, and steps down.
func TestCutOffLeaderDoesNotQuiesce(t *testing.T) {
	c := newCluster(t, 3)
	c.elect(1)
	c.tick(2)
	c.cut[2], c.cut[3] = true, true
	alone := func(id uint64) bool { return false }
	if c.replicas[1].Quiesce(alone) {
		t.Fatal("a leader cut off from every follower quiesced")
	}
	if !c.replicas[1].Quiesce(func(id uint64) bool { return id != 3 }) {
		t.Fatal("a leader with one of two followers up did not quiesce")
	}
	c.replicas[1].Unquiesce()
	for i := 0; i < 30 && c.replicas[1].IsLeader(); i++ {
		if !c.replicas[1].Quiesce(alone) {
			c.replicas[1].Tick()
		}
		c.settle()
	}
	if c.replicas[1].IsLeader() {
		t.Fatal("a leader cut off from its quorum still leads after three election timeouts")
	}
}

// TestQuiescedFollowerElectsWhenWoken: the leader of a quiesced group
// dies; the followers, woken (their driver saw the leader's node down),
// forget it and elect a new leader, which takes appends.
func TestQuiescedFollowerElectsWhenWoken(t *testing.T) {
	c := newCluster(t, 3)
	c.elect(1)
	var res []Result
	c.replicas[1].Propose(op(7, 0, 1, "a", &res))
	c.settle()
	c.quiesceGroup(1)
	c.stop(1)
	c.tickAwake(40)
	if c.leader() != 0 {
		t.Fatal("quiesced followers elected without being woken")
	}
	for _, id := range []uint64{2, 3} {
		c.replicas[id].Unquiesce()
		c.replicas[id].ForgetLeader()
	}
	c.tickAwake(40)
	lead := c.leader()
	if lead == 0 {
		t.Fatal("no new leader after the followers woke")
	}
	c.replicas[lead].Propose(op(7, 1, 1, "b", &res))
	c.settle()
	if last := res[len(res)-1]; last.Err != nil || last.BaseOffset != 1 {
		t.Fatalf("append at the new leader: %+v (%v)", last, apierr.CodeOf(last.Err))
	}
}

// A client asking a quiesced follower (its leader cut off, or gone while
// node liveness has not noticed yet) wakes it, and the group elects a new
// leader without the liveness wake.
func TestClientWakesQuiescedFollower(t *testing.T) {
	c := newCluster(t, 3)
	c.elect(1)
	var res []Result
	c.replicas[1].Propose(op(7, 0, 1, "a", &res))
	c.settle()
	c.quiesceGroup(1)
	c.stop(1)
	c.tickAwake(40)
	if c.leader() != 0 {
		t.Fatal("quiesced followers elected without being asked")
	}
	c.replicas[2].Propose(op(7, 1, 1, "b", &res))
	if last := res[len(res)-1]; apierr.CodeOf(last.Err) != apierr.NotLeader {
		t.Fatalf("append at a follower: %+v (%v), want NOT_LEADER", last, apierr.CodeOf(last.Err))
	}
	if c.replicas[2].Quiesced() {
		t.Fatal("the follower a client asked stays quiesced")
	}
	c.tickAwake(100)
	lead := c.leader()
	if lead == 0 || lead == 1 {
		t.Fatalf("leader after the client woke a follower: %d", lead)
	}
	c.replicas[lead].Propose(op(7, 1, 1, "b", &res))
	c.settle()
	if last := res[len(res)-1]; last.Err != nil || last.BaseOffset != 1 {
		t.Fatalf("append at the new leader: %+v (%v)", last, apierr.CodeOf(last.Err))
	}
}

func ptr[T any](v T) *T { return &v }

// TestLeaderWithoutQuorumDoesNotQuiesce: a leader whose quorum watch
// found no quorum (it refuses appends) does not quiesce when its
// followers answer again before its next tick: only a tick clears the
// watch, and a quiesced leader does not tick, so it would refuse every
// append for ever. It ticks on, the watch clears, and it takes appends.
func TestLeaderWithoutQuorumDoesNotQuiesce(t *testing.T) {
	c := newCluster(t, 3)
	c.elect(1)
	var warm []Result
	c.replicas[1].Propose(op(5, 0, 1, "warm", &warm))
	c.settle()
	checkAcks(t, warm, 1)
	// The followers' answers are lost: the leader's quorum watch fires
	// within an election timeout, before Raft's own check deposes it.
	answers := func(m *raftpb.Message) bool {
		t := m.GetType()
		return t == raftpb.MsgHeartbeatResp || t == raftpb.MsgAppResp
	}
	c.drop = answers
	l := c.replicas[1]
	for i := 0; i < 30 && !l.quorum.lost; i++ {
		l.Tick()
		c.settle()
	}
	if !l.quorum.lost || !l.IsLeader() {
		t.Fatalf("quorum watch lost=%v, leads=%v: want a leader that heard no quorum", l.quorum.lost, l.IsLeader())
	}
	var refused []Result
	l.Propose(op(5, 1, 1, "refused", &refused))
	checkRetriableNotLeader(t, refused, "")
	// The answers flow again: the followers answer the heartbeats of its
	// next tick (the watch ran before they did), and the group is idle.
	c.drop = nil
	l.Tick()
	c.settle()
	if !l.IsLeader() {
		t.Fatal("the leader stepped down: the test needs it leading")
	}
	if l.Quiesce(nil) {
		t.Fatal("a leader whose quorum watch has not cleared quiesced")
	}
	l.Tick()
	c.settle()
	var res []Result
	l.Propose(op(5, 1, 1, "after", &res))
	c.settle()
	checkAcks(t, res, 1)
	if !l.Quiesce(nil) {
		t.Fatal("an idle leader that hears its quorum did not quiesce")
	}
}
