package replica

import (
	"fmt"
	"strings"
	"testing"

	"github.com/geolog/geolog/apierr"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// checkRetriableNotLeader fails unless res is one retriable NOT_LEADER
// whose hint is hint.
func checkRetriableNotLeader(t *testing.T, res []Result, hint string) {
	t.Helper()
	if len(res) != 1 || res[0].Err == nil {
		t.Fatalf("answers %+v, want one error", res)
	}
	e := apierr.As(res[0].Err)
	if e.Code != apierr.NotLeader || !e.Retriable || e.LeaderHint != hint {
		t.Fatalf("answer %v (hint %q), want a retriable NOT_LEADER with hint %q", res[0].Err, e.LeaderHint, hint)
	}
}

// TestQuorumLossFailsPendingAppends: a leader cut off from both followers
// fails its pending append within an election timeout and a few ticks,
// long before the partition heals, and refuses new ones; a retry of the
// same batch after the heal lands once.
func TestQuorumLossFailsPendingAppends(t *testing.T) {
	c := newCluster(t, 3)
	c.elect(1)
	var warm []Result
	c.replicas[1].Propose(op(5, 0, 1, "warm", &warm))
	c.settle()
	checkAcks(t, warm, 1)

	// A leader with its quorum keeps acking past any number of timeouts.
	c.tick(3 * 10)
	var kept []Result
	c.replicas[1].Propose(op(5, 1, 1, "kept", &kept))
	c.settle()
	checkAcks(t, kept, 1)

	c.cut[1] = true
	var pending []Result
	c.replicas[1].Propose(op(5, 2, 2, "cut", &pending))
	c.settle()
	ticks := 0
	for ; ticks < 40 && len(pending) == 0; ticks++ {
		c.replicas[1].Tick()
		c.settle()
	}
	// ElectionTick is 10: the leader notices within it (and a tick of
	// slack), however Raft's own quorum check falls.
	if ticks > 11 {
		t.Fatalf("pending append answered after %d ticks, want within an election timeout", ticks)
	}
	checkRetriableNotLeader(t, pending, "")
	var refused []Result
	c.replicas[1].Propose(op(5, 2, 2, "cut", &refused))
	checkRetriableNotLeader(t, refused, "")
	// Both say that this leader is cut off, so that a client follows no
	// hint of its followers back to it while they elect another.
	for _, r := range []Result{pending[0], refused[0]} {
		if !apierr.As(r.Err).LeaderCutOff {
			t.Fatalf("the cut-off leader's refusal %v does not say it is cut off", r.Err)
		}
	}

	// The others elect a leader; the producer's retry goes there.
	for i := 0; i < 100 && c.leaderAmong(2, 3) == 0; i++ {
		c.tick(1)
	}
	l := c.leaderAmong(2, 3)
	if l == 0 {
		t.Fatal("nodes 2 and 3 elected no leader")
	}
	delete(c.cut, 1)
	var retry []Result
	c.replicas[l].Propose(op(5, 2, 2, "cut", &retry))
	c.settle()
	checkAcks(t, retry, 1)
	c.tick(3)
	for _, id := range c.ids {
		if got := strings.Join(c.logValues(id), " "); got != "warm-0 kept-0 cut-0 cut-1" {
			t.Fatalf("node %d log: %s", id, got)
		}
	}
}

// leaderAmong returns the first of ids that leads, 0 if none.
func (c *cluster) leaderAmong(ids ...uint64) uint64 {
	for _, id := range ids {
		if r := c.replicas[id]; r != nil && r.IsLeader() {
			return id
		}
	}
	return 0
}

// TestDeposedLeaderFailsPendingAtOnce: a leader that learns of a newer
// leader fails its pending appends as it steps down, with the new leader
// as the hint, without waiting for the new leader's first entry to
// commit.
func TestDeposedLeaderFailsPendingAtOnce(t *testing.T) {
	c := newCluster(t, 3)
	c.elect(1)
	// Node 1's appends get lost (its heartbeats do not): its proposal
	// stays pending while it keeps its quorum.
	c.drop = func(m *raftpb.Message) bool { return m.GetFrom() == 1 && m.GetType() == raftpb.MsgApp }
	var pending []Result
	c.replicas[1].Propose(op(5, 0, 1, "lost", &pending))
	c.tick(2)
	if len(pending) != 0 {
		t.Fatalf("answered %+v with its appends lost", pending)
	}
	// Node 2 campaigns (as after a transfer) and wins with node 3's vote;
	// its first append reaches node 1, which steps down.
	c.replicas[2].Step(&raftpb.Message{Type: raftpb.MsgTimeoutNow.Enum(), From: proto.Uint64(1), To: proto.Uint64(2),
		Term: proto.Uint64(c.replicas[1].Status().GetTerm())})
	c.settle()
	if !c.replicas[2].IsLeader() || c.replicas[1].IsLeader() {
		t.Fatal("node 2 did not take over")
	}
	// Node 1 steps down on node 2's vote request, before it knows the
	// winner, or on its first append: either way at once.
	if len(pending) == 1 && apierr.As(pending[0].Err).LeaderHint == "" {
		checkRetriableNotLeader(t, pending, "")
	} else {
		checkRetriableNotLeader(t, pending, "node:2")
	}
}

// TestStoppedLeaderHandsOff: a leader whose fsync fails stops, and hands
// leadership to a follower at once (no election timeout: no tick runs);
// appends to it are then refused with a retriable NOT_LEADER naming the
// new leader, which takes them.
func TestStoppedLeaderHandsOff(t *testing.T) {
	c, mems := newMemDiskCluster(t)
	c.elect(1)
	var res []Result
	var seq uint64
	proposeN(c, 1, &seq, 3, &res)
	checkAcks(t, res, 3)

	c.holdWrites[1] = true
	proposeN(c, 1, &seq, 1, &res) // committed by the followers' acks
	mems[1].FailDatasyncs(1)
	if err := c.replicas[1].WriteLog(); err == nil {
		t.Fatal("WriteLog succeeded over a failed fsync")
	}
	if err := c.replicas[1].ProcessReady(); err == nil {
		t.Fatal("ProcessReady went on after a failed fsync")
	}
	c.holdWrites[1] = false
	c.settle()
	if c.replicas[1].Failure() == nil {
		t.Fatal("node 1 did not stop")
	}
	l := c.leaderAmong(2, 3)
	if l == 0 || c.replicas[1].IsLeader() {
		t.Fatalf("no leader among the followers (node 1 leads: %v)", c.replicas[1].IsLeader())
	}
	var refused []Result
	c.replicas[1].Propose(op(9, seq, 2, "refused", &refused))
	checkRetriableNotLeader(t, refused, fmt.Sprintf("node:%d", l))
	if e := c.replicas[1].StoppedAppendError(); apierr.CodeOf(e) != apierr.NotLeader {
		t.Fatalf("StoppedAppendError %v, want NOT_LEADER", e)
	}

	// The new leader takes the refused batch, with the third replica, and
	// answers its resend as a duplicate.
	var retry []Result
	for range 2 {
		c.replicas[l].Propose(op(9, seq, 2, "refused", &retry))
		c.settle()
	}
	checkAcks(t, retry, 2)
	if retry[0].Duplicate || !retry[1].Duplicate || retry[0].BaseOffset != retry[1].BaseOffset {
		t.Fatalf("the batch and its resend: %+v", retry)
	}
}
