package regionsvc

import (
	"context"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/membership"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
)

// ListNodes lists the region's nodes as this node's copy of the catalogue
// holds them.
func (s *adminServer) ListNodes(ctx context.Context, req *geologv1.ListNodesRequest) (*geologv1.ListNodesResponse, error) {
	n := s.node
	if !n.replicated() {
		return nil, apierr.New(apierr.Unavailable, "the node is not open")
	}
	counts := map[uint64]uint32{}
	for _, r := range n.placementRegion().Ranges {
		for _, id := range r.Replicas {
			counts[id]++
		}
	}
	resp := &geologv1.ListNodesResponse{Region: n.cfg.Region}
	for _, m := range n.memberNodes() {
		resp.Nodes = append(resp.Nodes, nodeInfo(m, counts[m.ID]))
	}
	n.rebalanceListNodes(ctx, resp) // rebalance_admin.go: current voters, leaders, moves
	return resp, nil
}

func nodeInfo(m membership.Node, replicas uint32) *geologv1.NodeInfo {
	st := map[membership.State]geologv1.NodeState{membership.Live: geologv1.NodeState_NODE_STATE_LIVE,
		membership.Draining: geologv1.NodeState_NODE_STATE_DRAINING, membership.Decommissioned: geologv1.NodeState_NODE_STATE_DECOMMISSIONED}[m.State]
	return &geologv1.NodeInfo{NodeId: m.ID, Address: m.Addr, Zone: m.Zone, State: st, Seed: m.Seed, ReplicaCount: replicas}
}

// SetNodeState drains, undrains or decommissions a node: a catalogue
// record, proposed by the catalogue leader (other nodes forward it).
func (s *adminServer) SetNodeState(ctx context.Context, req *geologv1.SetNodeStateRequest) (*geologv1.SetNodeStateResponse, error) {
	n := s.node
	if !n.replicated() {
		return nil, apierr.New(apierr.Unavailable, "the node is not open")
	}
	st, ok := map[geologv1.NodeState]membership.State{geologv1.NodeState_NODE_STATE_LIVE: membership.Live,
		geologv1.NodeState_NODE_STATE_DRAINING: membership.Draining, geologv1.NodeState_NODE_STATE_DECOMMISSIONED: membership.Decommissioned}[req.GetState()]
	if !ok {
		return nil, apierr.New(apierr.InvalidArgument, "state %v: give live, draining or decommissioned", req.GetState())
	}
	id := req.GetNodeId()
	if err := n.checkNodeState(id, st); err != nil {
		return nil, err
	}
	if st == membership.Decommissioned {
		if err := n.checkDecommissionEmpty(ctx, id); err != nil { // rebalance_admin.go
			return nil, err
		}
	}
	err := n.setStateAsLeader(ctx, id, st)
	if err != nil && apierr.As(err).Code == apierr.NotLeader && !isForwarded(ctx) {
		var resp *geologv1.SetNodeStateResponse
		err = n.forwardToCatalogueLeader(ctx, func(ctx context.Context, conn *grpc.ClientConn) error {
			var err error
			resp, err = geologv1.NewAdminClient(conn).SetNodeState(ctx, req)
			return err
		})
		if err != nil {
			return nil, err
		}
		// Answer once this node applied it too.
		if err := n.waitNodeState(ctx, id, st); err != nil {
			return nil, err
		}
		return resp, nil
	}
	if err != nil {
		return nil, err
	}
	m, _ := n.memberNode(id)
	return &geologv1.SetNodeStateResponse{Node: nodeInfo(m, 0)}, nil
}

// checkNodeState refuses, with a typed error, a change this node's copy
// of the list refuses.
func (n *Node) checkNodeState(id uint64, st membership.State) error {
	m := &n.region.members
	m.mu.RLock()
	defer m.mu.RUnlock()
	return membershipError(m.list.CheckState(id, st))
}

// setStateAsLeader commits the change; NOT_LEADER if this node does not
// lead the catalogue. A decommissioned learner of the catalogue group
// leaves it.
func (n *Node) setStateAsLeader(ctx context.Context, id uint64, st membership.State) error {
	if err := n.commitMeta(ctx, metaRecord{Op: opNodeState, Node: &nodeChange{ID: id, State: st}}); err != nil {
		return err
	}
	if got, _ := n.memberNode(id); got.State != st {
		return n.checkNodeState(id, st) // refused when applied: a racing decommission
	}
	if st == membership.Decommissioned {
		return n.changeCatalogueConf(ctx, raftpb.ConfChangeRemoveNode, id)
	}
	return nil
}

// waitNodeState waits until this node applied node id's state st.
func (n *Node) waitNodeState(ctx context.Context, id uint64, st membership.State) error {
	for {
		n.mu.RLock()
		applied := n.region.applied
		n.mu.RUnlock()
		if m, _ := n.memberNode(id); m.State == st {
			return nil
		}
		select {
		case <-applied:
		case <-ctx.Done():
			return apierr.Wrap(apierr.Timeout, ctx.Err(), "node %d: %s, not yet applied here", id, st)
		}
	}
}
