package regionsvc

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/geolog/geolog/membership"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"go.etcd.io/raft/v3/raftpb"
)

// catalogueConf is node id's catalogue group configuration, read on its
// driver.
func (tr *testRegion) catalogueConf(ctx context.Context, id uint64) (voters, learners []uint64) {
	tr.t.Helper()
	meta := tr.nodes[id].region.meta
	if err := meta.exec(ctx, func() {
		c := meta.rep.Conf()
		voters, learners = c.GetVoters(), c.GetLearners()
	}); err != nil {
		tr.t.Fatalf("node %d: catalogue conf: %v", id, err)
	}
	slices.Sort(voters)
	slices.Sort(learners)
	return voters, learners
}

// waitCatalogueConf waits until node id's catalogue group has exactly
// these voters and learners.
func (tr *testRegion) waitCatalogueConf(ctx context.Context, id uint64, voters, learners []uint64) {
	tr.t.Helper()
	var v, l []uint64
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, l = tr.catalogueConf(ctx, id)
		if slices.Equal(v, voters) && slices.Equal(l, learners) {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			tr.t.Fatalf("node %d: catalogue voters %v learners %v, want voters %v learners %v", id, v, l, voters, learners)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCatalogueKeepsVotersOverLiveNodes: founders 1-3 are the catalogue's
// voters, joined nodes 4 and 5 its learners. Draining voter 3 promotes
// learner 4 and demotes 3 to a learner; decommissioning founder 1 promotes
// 5 and removes 1. With 1 and 2 then stopped, the catalogue still has a
// quorum (4 and 5 of voters 2, 4, 5): a stream is created. It fails if a
// voter is not replaced, the leaving one stays a voter, or the create finds
// no quorum (the founders kept as voters).
func TestCatalogueKeepsVotersOverLiveNodes(t *testing.T) {
	t.Parallel()
	tr := newTestRegion(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tr.createStream(ctx, "before", 1)
	tr.joinNode(4, 2)
	tr.joinNode(5, 3)
	tr.waitNodes(ctx, "nodes 4 and 5 live", func(nodes []*geologv1.NodeInfo) error {
		if err := nodeState(4, geologv1.NodeState_NODE_STATE_LIVE)(nodes); err != nil {
			return err
		}
		return nodeState(5, geologv1.NodeState_NODE_STATE_LIVE)(nodes)
	})
	tr.waitCatalogueConf(ctx, 2, []uint64{1, 2, 3}, []uint64{4, 5})

	if _, err := tr.admins[1].SetNodeState(ctx, &geologv1.SetNodeStateRequest{NodeId: 3, State: geologv1.NodeState_NODE_STATE_DRAINING}); err != nil {
		t.Fatalf("drain 3: %v", err)
	}
	tr.waitCatalogueConf(ctx, 2, []uint64{1, 2, 4}, []uint64{3, 5})

	if _, err := tr.admins[2].SetNodeState(ctx, &geologv1.SetNodeStateRequest{NodeId: 1, State: geologv1.NodeState_NODE_STATE_DECOMMISSIONED}); err != nil {
		t.Fatalf("decommission 1: %v", err)
	}
	tr.waitCatalogueConf(ctx, 2, []uint64{2, 4, 5}, []uint64{3})

	tr.stop(1)
	tr.stop(2)
	tr.createStream(ctx, "after", 1)
}

// TestNextVoterChange: the voter rules' steps, one case each. It fails on
// any other step.
func TestNextVoterChange(t *testing.T) {
	t.Parallel()
	live := func(id uint64) membership.Node { return membership.Node{ID: id, State: membership.Live} }
	in := func(id uint64, zone string, st membership.State) membership.Node {
		return membership.Node{ID: id, Zone: zone, State: st}
	}
	all := func(uint64) bool { return true }
	for _, tc := range []struct {
		name             string
		self             uint64
		voters, learners []uint64
		nodes            []membership.Node
		caughtUp         func(uint64) bool
		want             voterChange
		due              bool
	}{
		{name: "all live", self: 1, voters: []uint64{1, 2, 3}, learners: []uint64{4},
			nodes: []membership.Node{live(1), live(2), live(3), live(4)}, caughtUp: all},
		{name: "draining voter: promote first", self: 1, voters: []uint64{1, 2, 3}, learners: []uint64{4},
			nodes: []membership.Node{live(1), live(2), in(3, "", membership.Draining), live(4)}, caughtUp: all,
			want: voterChange{typ: raftpb.ConfChangeAddNode, id: 4}, due: true},
		{name: "draining voter replaced: demote", self: 1, voters: []uint64{1, 2, 3, 4},
			nodes: []membership.Node{live(1), live(2), in(3, "", membership.Draining), live(4)}, caughtUp: all,
			want: voterChange{typ: raftpb.ConfChangeAddLearnerNode, id: 3}, due: true},
		{name: "draining voter, nobody to replace it: stays", self: 1, voters: []uint64{1, 2, 3},
			nodes: []membership.Node{live(1), live(2), in(3, "", membership.Draining)}, caughtUp: all},
		{name: "learner behind: not promoted", self: 1, voters: []uint64{1, 2, 3}, learners: []uint64{4},
			nodes: []membership.Node{live(1), live(2), in(3, "", membership.Draining), live(4)}, caughtUp: func(id uint64) bool { return id != 4 }},
		{name: "decommissioned voter, nobody to replace it: removed", self: 1, voters: []uint64{1, 2, 3},
			nodes: []membership.Node{live(1), live(2), in(3, "", membership.Decommissioned)}, caughtUp: all,
			want: voterChange{typ: raftpb.ConfChangeRemoveNode, id: 3}, due: true},
		{name: "leader leaves: hands off", self: 3, voters: []uint64{1, 2, 3, 4},
			nodes: []membership.Node{live(1), live(2), in(3, "", membership.Decommissioned), live(4)}, caughtUp: all,
			want: voterChange{transferTo: 1}, due: true},
		{name: "new zone first", self: 1, voters: []uint64{1, 2, 3}, learners: []uint64{4, 5},
			nodes: []membership.Node{in(1, "a", membership.Live), in(2, "b", membership.Live), in(3, "c", membership.Draining),
				in(4, "a", membership.Live), in(5, "c", membership.Live)}, caughtUp: all,
			want: voterChange{typ: raftpb.ConfChangeAddNode, id: 5}, due: true},
		{name: "draining learner not promoted", self: 1, voters: []uint64{1, 2, 3}, learners: []uint64{4},
			nodes: []membership.Node{live(1), live(2), in(3, "", membership.Draining), in(4, "", membership.Draining)}, caughtUp: all},
		{name: "decommissioned learner removed", self: 1, voters: []uint64{1, 2, 3}, learners: []uint64{4},
			nodes: []membership.Node{live(1), live(2), live(3), in(4, "", membership.Decommissioned)}, caughtUp: all,
			want: voterChange{typ: raftpb.ConfChangeRemoveNode, id: 4}, due: true},
		{name: "voter not in the list: left alone", self: 1, voters: []uint64{1, 2, 3},
			nodes: []membership.Node{live(1), live(2)}, caughtUp: all},
	} {
		got, due := nextVoterChange(tc.self, tc.voters, tc.learners, tc.nodes, 3, tc.caughtUp)
		if got != tc.want || due != tc.due {
			t.Errorf("%s: got %+v %v, want %+v %v", tc.name, got, due, tc.want, tc.due)
		}
	}
}
