package replica

import "testing"

// TestReadIndexNewSingleVoter: a group of one voter asked for a read just
// after its first election, before its term's first entry is written, has
// committed nothing yet, and Raft confirms the read at index 0. The read
// must still be answered (a DescribeReplicas of a new replication-factor-1
// range hung on it until its caller gave up). It fails if the reply never
// comes, or comes before the replica applied what it had committed.
func TestReadIndexNewSingleVoter(t *testing.T) {
	c := newCluster(t, 1)
	c.holdWrites[1] = true // the election's entry stays unwritten
	r := c.replicas[1]
	if err := r.Campaign(); err != nil {
		t.Fatal(err)
	}
	c.settle()
	if !r.IsLeader() {
		t.Fatal("node 1 did not become leader")
	}
	if got := r.Status().GetCommit(); got != 0 {
		t.Fatalf("committed %d before the first write; the test needs 0", got)
	}
	answered, end := false, uint64(0)
	var rerr error
	r.ReadIndex(func(e uint64, err error) { answered, end, rerr = true, e, err })
	c.settle()
	c.holdWrites[1] = false
	c.settle()
	if !answered {
		t.Fatal("the read was never answered")
	}
	if rerr != nil || end != r.Committed() {
		t.Fatalf("read answered %d, %v; committed end %d", end, rerr, r.Committed())
	}
}
