package chaos

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
)

// joiner is a cluster that can start a spare node joining a region.
type joiner interface {
	Join(ctx context.Context, region string) (Node, error)
}

// operator is a cluster whose superuser's credentials the harness holds:
// node membership (drain, decommission) is an operator's act on the whole
// region, which the harness's own principal may not do (admin on its
// streams only, chaosGrants).
type operator interface {
	OperatorTLS() *tls.Config
}

// opConn is a connection to addr as the cluster's operator.
func (in *injector) opConn(addr string) (*grpc.ClientConn, error) {
	op, ok := in.cl.(operator)
	if !ok {
		return nil, ErrUnsupported
	}
	in.connsMu.Lock()
	defer in.connsMu.Unlock()
	if c, ok := in.conns["operator|"+addr]; ok {
		return c, nil
	}
	c, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(transportCreds(op.OperatorTLS())))
	if err != nil {
		return nil, err
	}
	in.conns["operator|"+addr] = c
	return c, nil
}

func canOperate(c Cluster) bool {
	_, ok := c.(operator)
	return ok
}

func canJoin(c Cluster) bool {
	_, ok := c.(joiner)
	return ok
}

// join starts a spare node in region (KindJoin).
func (in *injector) join(ctx context.Context, region string, mark func()) (string, error) {
	j, ok := in.cl.(joiner)
	if !ok {
		return "", ErrUnsupported
	}
	mark()
	n, err := j.Join(ctx, region)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("join %s at %s", n.NodeRef, n.Addr), nil
}

// drainWaitDefault bounds a decommission's wait for the drained node to
// hold no replica when the fault gives no Duration.
const drainWaitDefault = 2 * time.Minute

// drain drains f's node and, with Params.Decommission, waits for it to
// hold no replica, decommissions it and stops it (KindDrain), through the
// Admin API of the region's other nodes, as `geolog nodes drain` and
// `geolog nodes decommission` do.
func (in *injector) drain(ctx context.Context, f Fault, rng uint32, mark func()) (string, error) {
	nodes, err := in.resolveNodes(ctx, f.Target.Node, rng)
	if err != nil {
		return "", err
	}
	if len(nodes) != 1 {
		return "", fmt.Errorf("chaos: drain one node, not %v", nodes)
	}
	victim := nodes[0]
	id := uint64(victim.ID)
	// A decommission is seen through when the window closes meanwhile:
	// the workload goes on until every fault returned.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.Duration.Std()+time.Minute)
	defer cancel()
	mark()
	if _, err := in.setNodeState(ctx, victim, id, geologv1.NodeState_NODE_STATE_DRAINING); err != nil {
		return "", fmt.Errorf("drain %s: %w", victim.NodeRef, err)
	}
	if !f.Params.Decommission {
		return fmt.Sprintf("drain %s", victim.NodeRef), nil
	}
	wait := f.Duration.Std()
	if wait <= 0 {
		wait = drainWaitDefault
	}
	deadline := time.Now().Add(wait)
	for {
		// The region's nodes refuse while it holds a replica (retriable).
		_, err := in.setNodeState(ctx, victim, id, geologv1.NodeState_NODE_STATE_DECOMMISSIONED)
		if err == nil {
			break
		}
		if !rpcerr.IsRetriable(err) || time.Now().After(deadline) {
			return "", fmt.Errorf("decommission %s: %w", victim.NodeRef, err)
		}
		if !sleepUntil(ctx, time.Now().Add(time.Second)) {
			return "", ctx.Err()
		}
	}
	// It left the region for good: stop it, as an operator would (not
	// through in.kill: the heal must not restart it).
	if err := in.cl.Kill(victim.NodeRef); err != nil && !errors.Is(err, ErrUnsupported) {
		in.log.Warn("stopping a decommissioned node", "node", victim.NodeRef, "error", err)
	}
	return fmt.Sprintf("decommission %s", victim.NodeRef), nil
}

// setNodeState asks the region's nodes other than victim in turn.
func (in *injector) setNodeState(ctx context.Context, victim Node, id uint64, state geologv1.NodeState) (*geologv1.SetNodeStateResponse, error) {
	var errs []error
	for _, n := range regionNodes(in.cl, victim.Region) {
		if n.NodeRef == victim.NodeRef {
			continue
		}
		c, err := in.opConn(n.Addr)
		if err != nil {
			return nil, err
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := geologv1.NewAdminClient(c).SetNodeState(cctx, &geologv1.SetNodeStateRequest{NodeId: id, State: state})
		cancel()
		if err == nil {
			return resp, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", n.NodeRef, rpcerr.FromError(err)))
		if !rpcerr.IsRetriable(err) {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// ReplicaSet is one range's replicas in one region at the end of a run,
// as its leader described them (Admin DescribeReplicas).
type ReplicaSet struct {
	Range    uint32   `json:"range"`
	Region   string   `json:"region"`
	Voters   []uint64 `json:"voters"`
	Learners []uint64 `json:"learners,omitempty"`
	Err      string   `json:"err,omitempty"`
}

// replicaSets describes every range's replicas in every region, waiting
// (up to wait) until each has want voters and no learner: a move under way
// at the end holds one more for a moment, a broken one for good.
func (in *injector) replicaSets(ctx context.Context, rangeCount uint32, want int, wait time.Duration) []ReplicaSet {
	deadline := time.Now().Add(wait)
	for {
		var out []ReplicaSet
		settled := true
		for _, region := range in.regions {
			for r := range rangeCount {
				rs := in.describeReplicas(ctx, region, r)
				settled = settled && rs.Err == "" && len(rs.Voters) == want && len(rs.Learners) == 0
				out = append(out, rs)
			}
		}
		if settled || time.Now().After(deadline) || !sleepUntil(ctx, time.Now().Add(time.Second)) {
			return out
		}
	}
}

func (in *injector) describeReplicas(ctx context.Context, region string, r uint32) ReplicaSet {
	rs := ReplicaSet{Range: r, Region: region}
	var errs []error
	for _, n := range regionNodes(in.cl, region) {
		c, err := in.conn(n.Addr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := geologv1.NewAdminClient(c).DescribeReplicas(cctx, &geologv1.DescribeReplicasRequest{Stream: in.stream, Range: r})
		cancel()
		if err != nil || resp.GetLeaderId() == 0 {
			errs = append(errs, fmt.Errorf("%s: %v", n.NodeRef, err))
			continue
		}
		for _, rep := range resp.GetReplicas() {
			if rep.GetRole() == "voter" {
				rs.Voters = append(rs.Voters, rep.GetNodeId())
			} else {
				rs.Learners = append(rs.Learners, rep.GetNodeId())
			}
		}
		slices.Sort(rs.Voters)
		return rs
	}
	rs.Err = errors.Join(errs...).Error()
	return rs
}

// replacedBefore wraps the revert of a kill past the dead-node time: it
// first records in ev the ranges whose replicas in the victims' region
// still name a victim (they were not rebuilt elsewhere while it was dead).
func (in *injector) replacedBefore(revert func(context.Context) error, victims []Node, ev *FaultEvent) func(context.Context) error {
	return func(ctx context.Context) error {
		for r := range uint32(len(in.homes)) {
			rs := in.describeReplicas(ctx, victims[0].Region, r)
			held := rs.Err != ""
			for _, v := range victims {
				held = held || slices.Contains(rs.Voters, uint64(v.ID)) || slices.Contains(rs.Learners, uint64(v.ID))
			}
			if held {
				ev.NotReplaced = append(ev.NotReplaced, r)
			}
		}
		return revert(ctx)
	}
}
