package regionsvc

import (
	"cmp"
	"context"
	"sort"
	"time"

	"github.com/geolog/geolog/apierr"
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
	var typ raftpb.ConfChangeType
	switch req.GetChange() {
	case geologv1.ReplicaChange_REPLICA_CHANGE_ADD_LEARNER:
		typ = raftpb.ConfChangeAddLearnerNode
	case geologv1.ReplicaChange_REPLICA_CHANGE_PROMOTE:
		typ = raftpb.ConfChangeAddNode
	case geologv1.ReplicaChange_REPLICA_CHANGE_REMOVE:
		typ = raftpb.ConfChangeRemoveNode
	default:
		return nil, apierr.New(apierr.InvalidArgument, "unknown change %v", req.GetChange())
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	type outcome struct {
		cs  *raftpb.ConfState
		err error
	}
	done := make(chan outcome, 1)
	err = rd.exec(cctx, func() {
		// Refuse what would make no sense for the group as it is now.
		conf := rd.rep.Conf()
		isVoter, isLearner := contains(conf.GetVoters(), node), contains(conf.GetLearners(), node)
		switch {
		case typ == raftpb.ConfChangeAddLearnerNode && (isVoter || isLearner):
			done <- outcome{err: apierr.New(apierr.InvalidArgument, "node %d is already a member", node)}
			return
		case typ == raftpb.ConfChangeAddNode && !isLearner:
			done <- outcome{err: apierr.New(apierr.InvalidArgument, "node %d is not a learner: add it as a learner first", node)}
			return
		case typ == raftpb.ConfChangeRemoveNode && !isVoter && !isLearner:
			done <- outcome{err: apierr.New(apierr.InvalidArgument, "node %d is not a member", node)}
			return
		case typ == raftpb.ConfChangeRemoveNode && isVoter && len(conf.GetVoters()) <= 1:
			done <- outcome{err: apierr.New(apierr.InvalidArgument, "node %d is the last voter", node)}
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

func (s *adminServer) DescribeReplicas(ctx context.Context, req *geologv1.DescribeReplicasRequest) (*geologv1.DescribeReplicasResponse, error) {
	rd, err := s.node.replicatedRange(ctx, req.GetStream(), req.GetRange())
	if err != nil {
		return nil, err
	}
	// A leader just elected may not have applied its predecessors'
	// configuration changes yet: its applied configuration can still name
	// a voter a committed change removed, and a move planned from it
	// removes one voter too many (sim seed 459, notes/simmoves.md). So it
	// answers after a ReadIndex: once it has committed an entry of its
	// term and applied everything committed before the call.
	done := make(chan struct{})
	var resp *geologv1.DescribeReplicasResponse
	var notLeader error
	err = rd.exec(ctx, func() {
		if !rd.rep.IsLeader() {
			notLeader = rd.hintAddress(rd.rep.NotLeaderError())
			close(done)
			return
		}
		rd.rep.ReadIndex(func(_ uint64, err error) {
			if err != nil {
				notLeader = rd.hintAddress(err)
			} else {
				resp = s.describe(rd)
			}
			close(done)
		})
	})
	if err != nil {
		return nil, err
	}
	select {
	case <-done:
	case <-ctx.Done():
		return nil, apierr.Wrap(apierr.Timeout, ctx.Err(), "confirming the range's leadership")
	}
	if notLeader != nil {
		return nil, notLeader
	}
	return resp, nil
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

func contains(ids []uint64, id uint64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}
