package regionsvc

import (
	"cmp"
	"context"
	"sort"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/replicamove"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// adminServer implements geologv1.AdminServer.
type adminServer struct {
	geologv1.UnimplementedAdminServer
	node *Node
}

// replicatedRange finds a range that is a Raft group.
func (n *Node) replicatedRange(ctx context.Context, stream string, r uint32) (*rangeDriver, error) {
	rd, err := n.rangeOf(ctx, stream, r)
	if err != nil {
		return nil, err
	}
	if f := rd.failure.Load(); f != nil {
		return nil, f
	}
	if rd.rep == nil {
		return nil, apierr.New(apierr.Unavailable, "stream %s range %d is not served here", stream, r)
	}
	return rd, nil
}

func (s *adminServer) ChangeReplicas(ctx context.Context, req *geologv1.ChangeReplicasRequest) (*geologv1.ChangeReplicasResponse, error) {
	rd, err := s.node.replicatedRange(ctx, req.GetStream(), req.GetRange())
	if err != nil {
		return nil, err
	}
	node := req.GetNodeId()
	// A replica on a node no longer of the region (decommissioned) may
	// still be removed.
	if !s.node.isRegionPeer(node) && req.GetChange() != geologv1.ReplicaChange_REPLICA_CHANGE_REMOVE {
		return nil, apierr.New(apierr.InvalidArgument, "node %d is not a node of this region", node)
	}
	typ, err := confChangeType(req.GetChange())
	if err != nil {
		return nil, err
	}
	rf := 0 // the range's replication factor, as the rebalancer counts it
	if spec, ok := s.node.streamSpec(req.GetStream()); ok {
		rf = len(s.node.rangeReplicas(spec, req.GetRange()))
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := caughtUpLeader(cctx, rd); err != nil {
		return nil, err
	}
	type outcome struct {
		cs  *raftpb.ConfState
		err error
	}
	done := make(chan outcome, 1)
	err = rd.exec(cctx, func() {
		if err := refuseChange(rd.rep.Conf(), typ, node, rf, req.GetExpectedVoters()); err != nil {
			done <- outcome{err: err}
			return
		}
		if typ == raftpb.ConfChangeRemoveNode && node == rd.cfg.repl.nodeID && rd.rep.IsLeader() {
			// The leader would go on leading a group it is not a member
			// of: hand leadership to another voter first; the caller
			// retries at the new leader (rebalance_admin.go).
			done <- outcome{err: rd.handOffBeforeRemoval()}
			return
		}
		cc := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: typ.Enum(), NodeId: proto.Uint64(node)}}}
		rd.rep.ProposeConfChange(cc, func(cs *raftpb.ConfState, err error) { done <- outcome{cs, err} })
	})
	if err != nil {
		return nil, err
	}
	select {
	case o := <-done:
		if o.err != nil {
			return nil, rd.hintAddress(o.err)
		}
		return &geologv1.ChangeReplicasResponse{Voters: o.cs.GetVoters(), Learners: o.cs.GetLearners()}, nil
	case <-cctx.Done():
		return nil, apierr.Wrap(apierr.Timeout, cctx.Err(), "membership change not applied")
	}
}

// refuseChange refuses a membership change of node that makes no sense
// for the group as it is now (conf; rf: the range's replication factor, 0
// unknown), or one decided from voters other than expect.
func refuseChange(conf *raftpb.ConfState, typ raftpb.ConfChangeType, node uint64, rf int, expect []uint64) error {
	isVoter, isLearner := contains(conf.GetVoters(), node), contains(conf.GetLearners(), node)
	// The caller's expectation is checked in the step that proposes,
	// against this leader's configuration once it applied everything
	// committed before the call (caughtUpLeader); a change proposed since
	// is pending, and Raft refuses another while it is.
	if len(expect) > 0 && !replicamove.SameVoters(conf.GetVoters(), expect) {
		return apierr.New(apierr.InvalidArgument, "the range's voters changed: %v, not the expected %v (describe the range again)", conf.GetVoters(), expect)
	}
	switch {
	case typ == raftpb.ConfChangeAddLearnerNode && (isVoter || isLearner):
		return apierr.New(apierr.InvalidArgument, "node %d is already a member", node)
	case typ == raftpb.ConfChangeAddLearnerNode && rf > 0 && len(conf.GetVoters()) > rf:
		// A move cut short after its promotion left a voter too many; a
		// replace now would take the range to two past its factor. The
		// excess goes first (the rebalancer removes it).
		return apierr.New(apierr.InvalidArgument, "the range has %d voters %v, more than its replication factor %d: remove one before adding a learner", len(conf.GetVoters()), conf.GetVoters(), rf)
	case typ == raftpb.ConfChangeAddNode && !isLearner:
		return apierr.New(apierr.InvalidArgument, "node %d is not a learner: add it as a learner first", node)
	case typ == raftpb.ConfChangeRemoveNode && !isVoter && !isLearner:
		return apierr.New(apierr.InvalidArgument, "node %d is not a member", node)
	case typ == raftpb.ConfChangeRemoveNode && isVoter && len(conf.GetVoters()) <= 1:
		return apierr.New(apierr.InvalidArgument, "node %d is the last voter", node)
	}
	return nil
}

func (s *adminServer) DescribeReplicas(ctx context.Context, req *geologv1.DescribeReplicasRequest) (*geologv1.DescribeReplicasResponse, error) {
	rd, err := s.node.replicatedRange(ctx, req.GetStream(), req.GetRange())
	if err != nil {
		return nil, err
	}
	// Bounded as ChangeReplicas is: a caller without a deadline gets a
	// retriable TIMEOUT, not a call that waits for a quorum forever.
	ctx, cancel := context.WithTimeout(ctx, describeConfirmMax)
	defer cancel()
	if err := caughtUpLeader(ctx, rd); err != nil {
		return nil, err
	}
	var resp *geologv1.DescribeReplicasResponse
	var notLeader error
	err = rd.exec(ctx, func() {
		if !rd.rep.IsLeader() {
			notLeader = rd.hintAddress(rd.rep.NotLeaderError())
			return
		}
		resp = s.describe(rd)
	})
	if err != nil {
		return nil, err
	}
	if notLeader != nil {
		return nil, notLeader
	}
	return resp, nil
}

// describeConfirmMax bounds DescribeReplicas' wait for its leader to
// confirm itself.
const describeConfirmMax = 10 * time.Second

// caughtUpLeader returns once rd's replica, as leader, has committed an
// entry of its term and applied everything committed before the call (a
// ReadIndex), or NOT_LEADER. A leader just elected may not have applied
// its predecessors' configuration changes yet: its applied configuration
// can still name a voter a committed change removed, and a move decided
// from it removes one voter too many (sim seeds 459, 92, 125;
// notes/simmoves.md). Membership is described and changed only after it.
func caughtUpLeader(ctx context.Context, rd *rangeDriver) error {
	done := make(chan struct{})
	var rerr error
	err := rd.exec(ctx, func() {
		if !rd.rep.IsLeader() {
			rerr = rd.hintAddress(rd.rep.NotLeaderError())
			close(done)
			return
		}
		rd.rep.ReadIndex(func(_ uint64, err error) {
			if err != nil {
				rerr = rd.hintAddress(err)
			}
			close(done)
		})
	})
	if err != nil {
		return err
	}
	select {
	case <-done:
		return rerr
	case <-ctx.Done():
		return apierr.Wrap(apierr.Timeout, ctx.Err(), "confirming the range's leadership")
	}
}

// describe is DescribeReplicas' answer at rd's leader, on its driver
// goroutine.
func (s *adminServer) describe(rd *rangeDriver) *geologv1.DescribeReplicasResponse {
	st := rd.rep.Status()
	conf := rd.rep.Conf()
	resp := &geologv1.DescribeReplicasResponse{
		LeaderId:        st.ID,
		LastIndex:       st.Progress[st.ID].Match,
		CommittedOffset: rd.rep.Committed(),
	}
	add := func(ids []uint64, role string) {
		for _, id := range ids {
			resp.Replicas = append(resp.Replicas, &geologv1.ReplicaStatus{
				NodeId: id, Address: cmp.Or(s.node.clientAddr(s.node.cfg.Region, id), s.node.peerAddr(id)), Role: role, MatchIndex: st.Progress[id].Match,
			})
		}
	}
	add(conf.GetVoters(), "voter")
	add(conf.GetLearners(), "learner")
	sort.Slice(resp.Replicas, func(i, j int) bool { return resp.Replicas[i].NodeId < resp.Replicas[j].NodeId })
	return resp
}

// confChangeType is Raft's change type for c.
func confChangeType(c geologv1.ReplicaChange) (raftpb.ConfChangeType, error) {
	switch c {
	case geologv1.ReplicaChange_REPLICA_CHANGE_ADD_LEARNER:
		return raftpb.ConfChangeAddLearnerNode, nil
	case geologv1.ReplicaChange_REPLICA_CHANGE_PROMOTE:
		return raftpb.ConfChangeAddNode, nil
	case geologv1.ReplicaChange_REPLICA_CHANGE_REMOVE:
		return raftpb.ConfChangeRemoveNode, nil
	}
	return 0, apierr.New(apierr.InvalidArgument, "unknown change %v", c)
}

func contains(ids []uint64, id uint64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}
