package regionsvc

import (
	"context"
	"slices"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/membership"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
)

// rangeRouter is replicamove.Admin for one range, from inside the region:
// each call goes to the range leader, found by trying the leader last
// seen, the leader this node's replica knows, then every member the
// transport does not find down; NOT_LEADER and other retriable refusals
// move on to the next, a bounded number of rounds.
type rangeRouter struct {
	n      *Node
	stream string
	r      uint32
	leader uint64 // the node that last answered as leader
}

const (
	// routeRoundsMax bounds the rounds over the candidates of one call;
	// routeCallTimeout bounds each attempt.
	routeRoundsMax   = 6
	routeCallTimeout = 5 * time.Second
)

// rangeAdminCalls are the two calls a move makes, as both adminServer
// (this node) and the remote client (rangeAdminClient) offer them.
type rangeAdminCalls interface {
	ChangeReplicas(context.Context, *geologv1.ChangeReplicasRequest) (*geologv1.ChangeReplicasResponse, error)
	DescribeReplicas(context.Context, *geologv1.DescribeReplicasRequest) (*geologv1.DescribeReplicasResponse, error)
}

type rangeAdminClient struct{ c geologv1.AdminClient }

func (a rangeAdminClient) ChangeReplicas(ctx context.Context, req *geologv1.ChangeReplicasRequest) (*geologv1.ChangeReplicasResponse, error) {
	resp, err := a.c.ChangeReplicas(ctx, req)
	return resp, rpcErr(err)
}

func (a rangeAdminClient) DescribeReplicas(ctx context.Context, req *geologv1.DescribeReplicasRequest) (*geologv1.DescribeReplicasResponse, error) {
	resp, err := a.c.DescribeReplicas(ctx, req)
	return resp, rpcErr(err)
}

func rpcErr(err error) error {
	if err == nil {
		return nil
	}
	return rpcerr.FromError(err)
}

// Change implements replicamove.Admin.
func (rr *rangeRouter) Change(ctx context.Context, c geologv1.ReplicaChange, node uint64, expectVoters []uint64) (*geologv1.ChangeReplicasResponse, error) {
	var resp *geologv1.ChangeReplicasResponse
	err := rr.call(ctx, func(ctx context.Context, a rangeAdminCalls) error {
		var err error
		resp, err = a.ChangeReplicas(ctx, &geologv1.ChangeReplicasRequest{Stream: rr.stream, Range: rr.r, Change: c, NodeId: node, ExpectedVoters: expectVoters})
		return err
	})
	return resp, err
}

// Describe implements replicamove.Admin.
func (rr *rangeRouter) Describe(ctx context.Context) (*geologv1.DescribeReplicasResponse, error) {
	var resp *geologv1.DescribeReplicasResponse
	err := rr.call(ctx, func(ctx context.Context, a rangeAdminCalls) error {
		var err error
		resp, err = a.DescribeReplicas(ctx, &geologv1.DescribeReplicasRequest{Stream: rr.stream, Range: rr.r})
		return err
	})
	return resp, err
}

// candidates lists the nodes to try, the likeliest leader first.
func (rr *rangeRouter) candidates() []uint64 {
	n := rr.n
	var out []uint64
	add := func(id uint64) {
		if id != 0 && !slices.Contains(out, id) && (id == n.cfg.NodeID || !n.region.transport.PeerDown(raftnetID(id))) {
			out = append(out, id)
		}
	}
	add(rr.leader)
	if rd := n.localRange(rr.stream, rr.r); rd != nil && rd.rep != nil {
		add(rd.rep.LeaderID())
	}
	for _, m := range n.memberNodes() {
		if m.State != membership.Decommissioned {
			add(m.ID)
		}
	}
	return out
}

// call runs fn at the range leader.
func (rr *rangeRouter) call(ctx context.Context, fn func(context.Context, rangeAdminCalls) error) error {
	var last error = apierr.New(apierr.Unavailable, "stream %s range %d: no node to ask", rr.stream, rr.r)
	for round := 0; round < routeRoundsMax; round++ {
		for _, id := range rr.candidates() {
			a, err := rr.n.adminOf(id)
			if err != nil {
				last = err
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, routeCallTimeout)
			err = fn(cctx, a)
			cancel()
			if err == nil {
				rr.leader = id
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			last = err
			if !apierr.IsRetriable(err) {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(round+1) * 100 * time.Millisecond):
		}
	}
	return last
}

// adminOf returns node id's admin calls: this node's own in process.
func (n *Node) adminOf(id uint64) (rangeAdminCalls, error) {
	if id == n.cfg.NodeID {
		return &adminServer{node: n}, nil
	}
	addr := n.peerAddr(id)
	if addr == "" {
		return nil, apierr.New(apierr.Unavailable, "node %d has no address", id)
	}
	conn, err := n.peerConn(addr)
	if err != nil {
		return nil, apierr.Wrap(apierr.Unavailable, err, "node %d", id)
	}
	return rangeAdminClient{c: geologv1.NewAdminClient(conn)}, nil
}

// localRange returns this node's driver of a stream's range, or nil.
func (n *Node) localRange(stream string, r uint32) *rangeDriver {
	n.mu.RLock()
	defer n.mu.RUnlock()
	st, ok := n.streams[stream]
	if !ok || int(r) >= len(st.ranges) {
		return nil
	}
	return st.ranges[r]
}

// handOffBeforeRemoval runs on the driver goroutine of a range leader asked
// to remove itself: it hands leadership to the voter holding the most of
// the log (not down), and answers NOT_LEADER naming it, so the caller asks
// again there. UNAVAILABLE if no voter can take over.
func (d *rangeDriver) handOffBeforeRemoval() error {
	self := d.cfg.repl.nodeID
	st := d.rep.Status()
	var to, match uint64
	for id, pr := range st.Progress {
		if id == self || pr.IsLearner || d.peerDown(id) {
			continue
		}
		if to == 0 || pr.Match > match || (pr.Match == match && id < to) {
			to, match = id, pr.Match
		}
	}
	if to == 0 {
		return apierr.New(apierr.Unavailable, "node %d leads the range and no other voter can take over", self)
	}
	d.rep.TransferLeadership(to)
	e := apierr.New(apierr.NotLeader, "node %d leads the range: leadership goes to node %d before the removal", self, to)
	e.LeaderHint = d.cfg.repl.addrOf(to)
	return e
}

// checkDecommissionEmpty refuses, while the rebalancer runs, to
// decommission a node that still holds a replica (voter or learner) of a
// range: decommission is drain, moves, then decommissioned (`geolog nodes
// decommission` drains first and asks again until the node is empty).
// Without a rebalancer nothing would empty it, and decommission retires
// the id at once as before.
func (n *Node) checkDecommissionEmpty(ctx context.Context, id uint64) error {
	if n.rebalancer == nil {
		return nil
	}
	reg, err := n.currentRegion(ctx)
	if err != nil {
		return apierr.Wrap(apierr.Unavailable, err, "node %d: cannot tell whether it holds replicas", id)
	}
	held := 0
	for _, r := range reg.Ranges {
		if contains(r.Replicas, id) || contains(r.Learners, id) {
			held++
		}
	}
	if held > 0 {
		return apierr.Wrap(apierr.Unavailable, ErrNodeNotEmpty, "node %d holds %d replicas: drain it and decommission once they have moved", id, held)
	}
	return nil
}

// rebalanceListNodes fills resp's counts and moves from the rebalancer of
// the catalogue leader: this node's if it leads, else the leader's (asked
// once, not forwarded further). Without an answer resp keeps the counts
// as created.
func (n *Node) rebalanceListNodes(ctx context.Context, resp *geologv1.ListNodesResponse) {
	if rb := n.rebalancer; rb != nil {
		if st := rb.snapshotStatus(); st.leading && st.haveSnap {
			fillNodeStatus(resp, st, n.cfg.NodeID)
			return
		}
	}
	if n.rebalancer == nil || isForwarded(ctx) {
		return
	}
	var lr *geologv1.ListNodesResponse
	err := n.forwardToCatalogueLeader(ctx, func(ctx context.Context, conn *grpc.ClientConn) error {
		var err error
		lr, err = geologv1.NewAdminClient(conn).ListNodes(ctx, &geologv1.ListNodesRequest{})
		return err
	})
	if err != nil || lr.GetRebalancerNode() == 0 {
		return
	}
	byID := map[uint64]*geologv1.NodeInfo{}
	for _, m := range lr.GetNodes() {
		byID[m.GetNodeId()] = m
	}
	for _, m := range resp.Nodes {
		if l, ok := byID[m.NodeId]; ok {
			m.ReplicaCount, m.LeaderCount, m.MovesIn, m.MovesOut = l.ReplicaCount, l.LeaderCount, l.MovesIn, l.MovesOut
			m.UnreachableNanos, m.Dead = l.UnreachableNanos, l.Dead
		}
	}
	resp.Moves, resp.RebalancerNode = lr.Moves, lr.RebalancerNode
}

// fillNodeStatus sets resp's per-node counts and moves from st.
func fillNodeStatus(resp *geologv1.ListNodesResponse, st rebalanceStatus, self uint64) {
	replicas, leaders := map[uint64]uint32{}, map[uint64]uint32{}
	for _, r := range st.snapshot.Ranges {
		for _, id := range r.Replicas {
			replicas[id]++
		}
		if r.Leader != 0 {
			leaders[r.Leader]++
		}
	}
	in, out := map[uint64]uint32{}, map[uint64]uint32{}
	for _, m := range st.moves {
		in[m.To]++
		out[m.From]++
		resp.Moves = append(resp.Moves, &geologv1.ReplicaMove{Stream: m.Range.Stream, Range: m.Range.Range, FromNode: m.From, ToNode: m.To,
			Reason: m.Reason.String(), StartedUnixNanos: st.started[m.Range].UnixNano()})
	}
	for _, m := range resp.Nodes {
		m.ReplicaCount, m.LeaderCount, m.MovesIn, m.MovesOut = replicas[m.NodeId], leaders[m.NodeId], in[m.NodeId], out[m.NodeId]
		m.UnreachableNanos, m.Dead = int64(st.unreachable[m.NodeId]), st.dead[m.NodeId]
	}
	resp.RebalancerNode = self
}
