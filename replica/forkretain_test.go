package replica

import (
	"testing"

	"github.com/geolog/geolog/dedup"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// installedCluster is a 4-node cluster (node 4 joins later) with orphan
// stores and tiny segments whose node 3 was cut off while nodes 1 and 2
// appended and compacted, then caught up by a snapshot and leads: its
// log holds the leader's retained frames [start, 195) while its
// compaction point is the snapshot's, at the log's end (195).
func installedCluster(t *testing.T) (c *cluster, start uint64) {
	c = newClusterOpts(t, 4, 3, opts(withOrphans, withCompaction(3000)))
	c.elect(1)
	c.proposeN(7, 0, 5, "a")
	c.tick(2)
	c.cut[3] = true
	c.proposeN(7, 15, 60, "b")
	c.tick(25) // node 3 is no longer recently active: nothing held back for it
	if c.compact(1) == 0 || c.compact(2) == 0 {
		t.Fatal("retention deleted nothing")
	}
	delete(c.cut, 3)
	c.tick(5)
	r3 := c.replicas[3]
	start = c.logs[3].StartOffset()
	if r3.Stats().SnapshotsInstalled != 1 || r3.state.SnapshotNextOffset != 195 || start+12 > 195 || start == 0 {
		t.Fatalf("node 3: %d snapshots, log from %d, compaction point %d", r3.Stats().SnapshotsInstalled, start, r3.state.SnapshotNextOffset)
	}
	for _, id := range []uint64{1, 2} {
		if s := c.logs[id].StartOffset(); s > start {
			t.Fatalf("node %d's log starts at %d, past node 3's %d", id, s, start)
		}
	}
	c.transfer(3)
	return c, start
}

// TestForkBelowInstalledSnapshotKeepsLog: a leader whose log came from a
// snapshot forks below the snapshot's point but past its log's start (a
// mirror group told by a new home to fork there). The fork cuts after the
// frame ending at the fork point and keeps what lies below it, on every
// replica: it is no reset, which would drop records retention kept for a
// lagging mirror of another region (seed 311323 of the three-region
// simulator: that mirror could never catch up).
func TestForkBelowInstalledSnapshotKeepsLog(t *testing.T) {
	c, start := installedCluster(t)
	at := start + 6 // batches are of 3 records
	res := c.proposeFork(at, 2)
	if res.Err != nil || res.At != at || res.PrevIndex == 0 || res.FirstOffset != at || res.NextOffset != 195 {
		t.Fatalf("fork at %d: %+v %v", at, res.ForkRecord, res.Err)
	}
	c.tick(2)
	for _, id := range []uint64{1, 2, 3} {
		got := c.retained(id)
		if st := c.logs[id]; st.StartOffset() > start || st.NextOffset() != at || c.replicas[id].Committed() != at {
			t.Fatalf("node %d: log [%d, %d), committed %d; want [<=%d, %d)", id, st.StartOffset(), st.NextOffset(), c.replicas[id].Committed(), start, at)
		}
		if uint64(len(got)) != at-c.logs[id].StartOffset() || got[start] == "" || got[at-1] == "" {
			t.Fatalf("node %d retains %d records from %d", id, len(got), c.logs[id].StartOffset())
		}
	}
	// The producer state is as of the fork: producer 7 appended sequence
	// s at offset s, and those from at on are orphaned. Nodes 1 and 2
	// know that exactly; node 3's state was as of its compaction point
	// (195), whose window held only orphaned batches: it forgets the
	// producer (a retry is refused, never taken for a duplicate), as a
	// follower compacted past the fork point does (TestForkAfterCompaction).
	for id, want := range map[uint64][2]dedup.Verdict{1: {dedup.Duplicate, dedup.Append}, 2: {dedup.Duplicate, dedup.Append},
		3: {dedup.Reject, dedup.Reject}} {
		v, orig, _ := c.replicas[id].dedup.Check(7, at-3, 3, 0)
		next, _, _ := c.replicas[id].dedup.Check(7, at, 3, 0)
		if v != want[0] || next != want[1] || (v == dedup.Duplicate && orig.BaseOffset != at-3) {
			t.Fatalf("node %d: sequence %d is %v (at %d), %d is %v", id, at-3, v, orig.BaseOffset, at, next)
		}
	}
	var mres []Result
	c.replicas[3].ProposeVerbatim(mirrorOp(at, 2, 3, "m", &mres))
	c.settle()
	c.tick(2)
	if len(mres) != 1 || mres[0].Err != nil || mres[0].BaseOffset != at {
		t.Fatalf("mirrored after the fork: %+v", mres)
	}
	c.identical()
}

// TestForkBelowEarlierFork: a second fork that cuts below the first (a
// newer home that started lower) swallows the first fork's frame and gap;
// a snapshot of that log counts the outer gap only, and a new member
// installs it and ends identical.
func TestForkBelowEarlierFork(t *testing.T) {
	c, start := installedCluster(t)
	first := c.proposeFork(start+9, 2)
	if first.Err != nil || first.PrevIndex == 0 {
		t.Fatalf("first fork: %+v %v", first.ForkRecord, first.Err)
	}
	var mres []Result
	c.replicas[3].ProposeVerbatim(mirrorOp(start+9, 2, 3, "m", &mres))
	c.settle()
	second := c.proposeFork(start+3, 3)
	if second.Err != nil || second.PrevIndex == 0 || second.PrevIndex >= first.PrevIndex || second.NextOffset != start+12 {
		t.Fatalf("second fork: %+v %v (first %+v)", second.ForkRecord, second.Err, first.ForkRecord)
	}
	c.replicas[3].ProposeVerbatim(mirrorOp(start+3, 3, 2, "n", &mres))
	c.settle()
	c.tick(2)
	if len(mres) != 2 || mres[1].Err != nil || mres[1].BaseOffset != start+3 {
		t.Fatalf("mirrored: %+v", mres)
	}
	var done []error
	cc := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddLearnerNode.Enum(), NodeId: proto.Uint64(4)}}}
	c.replicas[3].ProposeConfChange(cc, func(_ *raftpb.ConfState, err error) { done = append(done, err) })
	c.settle()
	c.tick(5)
	if len(done) != 1 || done[0] != nil {
		t.Fatalf("add learner: %v", done)
	}
	if got := c.replicas[4].Stats().SnapshotsInstalled; got != 1 {
		t.Fatalf("node 4 installed %d snapshots", got)
	}
	if got := c.replicas[4].Orphans(); len(got) != 2 || got[1] != second.ForkRecord {
		t.Fatalf("node 4 orphans: %+v", got)
	}
	if g := c.retained(4); g[start] == "" || g[start+3] != "n-0" || c.replicas[4].Committed() != start+5 {
		t.Fatalf("node 4 retains %v, committed %d", g, c.replicas[4].Committed())
	}
	c.identical()
}
