package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
)

const nodesUsage = `usage:
  nodes list [--json]
      the region's nodes: id, address, zone, state, the replicas and range
      leaders on each and the replica moves under way (as the region's
      rebalancer, on the catalogue leader, last saw them; without one, the
      replicas placed at creation), and how long a node has been
      unreachable (dead: past the dead-node time, its replicas repaired)
  nodes drain <node-id>
      the node takes no new replicas; the rebalancer moves its replicas
      (and so its leaderships) to other nodes
  nodes undrain <node-id>
      a draining node back to live
  nodes decommission [--wait=true] [--poll 2s] <node-id>
      the node leaves the region for good: drained, then, once it holds no
      replica, decommissioned (its id is never reused and the region's
      nodes stop speaking Raft with it). Waits until then, printing
      progress; --wait=false asks once. Without a rebalancer (geologd
      --rebalance-interval 0) move its replicas first: geolog replicas
      replace`

// nodeRow is one node as nodes list prints it.
type nodeRow struct {
	ID          uint64 `json:"node_id"`
	Address     string `json:"address"`
	Zone        string `json:"zone"`
	State       string `json:"state"`
	Seed        bool   `json:"seed"`
	Replicas    uint32 `json:"replicas"`
	Leaders     uint32 `json:"leaders"`
	MovesIn     uint32 `json:"moves_in"`
	MovesOut    uint32 `json:"moves_out"`
	Unreachable string `json:"unreachable,omitempty"`
	Dead        bool   `json:"dead,omitempty"`
}

func toNodeRow(n *geologv1.NodeInfo) nodeRow {
	r := nodeRow{ID: n.GetNodeId(), Address: n.GetAddress(), Zone: n.GetZone(), Seed: n.GetSeed(), Replicas: n.GetReplicaCount(),
		State:   strings.ToLower(strings.TrimPrefix(n.GetState().String(), "NODE_STATE_")),
		Leaders: n.GetLeaderCount(), MovesIn: n.GetMovesIn(), MovesOut: n.GetMovesOut(), Dead: n.GetDead()}
	if d := time.Duration(n.GetUnreachableNanos()); d > 0 {
		r.Unreachable = d.Round(time.Second).String()
	}
	return r
}

// listing is what nodes list prints.
type listing struct {
	Region         string    `json:"region"`
	RebalancerNode uint64    `json:"rebalancer_node"`
	Nodes          []nodeRow `json:"nodes"`
	Moves          []moveRow `json:"moves"`
}

// moveRow is one replica move under way.
type moveRow struct {
	Stream  string `json:"stream"`
	Range   uint32 `json:"range"`
	From    uint64 `json:"from_node"`
	To      uint64 `json:"to_node"`
	Reason  string `json:"reason"`
	Running string `json:"running"`
}

// nodes runs the region membership commands (Admin.ListNodes,
// Admin.SetNodeState).
func (e *env) nodes(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usagef("%s", nodesUsage)
	}
	sub, args := args[0], args[1:]
	fs := e.flagSet("nodes " + sub)
	asJSON := fs.Bool("json", false, "print as JSON (list)")
	wait := fs.Bool("wait", true, "decommission: drain, then wait until the node holds no replica")
	poll := fs.Duration("poll", 2*time.Second, "decommission: pause between checks while waiting")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	states := map[string]geologv1.NodeState{"drain": geologv1.NodeState_NODE_STATE_DRAINING,
		"undrain": geologv1.NodeState_NODE_STATE_LIVE, "decommission": geologv1.NodeState_NODE_STATE_DECOMMISSIONED}
	state, isChange := states[sub]
	switch {
	case sub == "list" && len(pos) == 0, isChange && len(pos) == 1:
	default:
		return usagef("%s", nodesUsage)
	}
	a, err := e.adminDialer()
	if err != nil {
		return err
	}
	defer a.close()
	if sub == "list" {
		return e.listNodes(ctx, a, *asJSON)
	}
	id, err := strconv.ParseUint(pos[0], 10, 64)
	if err != nil || id == 0 {
		return usagef("node id %q is not a positive number", pos[0])
	}
	if sub == "decommission" && *wait {
		return e.decommission(ctx, a, id, *poll)
	}
	resp, err := e.setNodeState(ctx, a, id, state)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "node %d: %s\n", id, toNodeRow(resp.GetNode()).State)
	return nil
}

func (e *env) setNodeState(ctx context.Context, a *adminDialer, id uint64, state geologv1.NodeState) (*geologv1.SetNodeStateResponse, error) {
	var resp *geologv1.SetNodeStateResponse
	err := a.call(ctx, e.timeout, func(ctx context.Context, c geologv1.AdminClient) error {
		var err error
		resp, err = c.SetNodeState(ctx, &geologv1.SetNodeStateRequest{NodeId: id, State: state})
		return err
	})
	return resp, err
}

// decommission drains node id, then asks for its decommission until the
// region's nodes accept it (they refuse while it holds a replica), as
// CockroachDB's node decommission waits for its replicas to move.
func (e *env) decommission(ctx context.Context, a *adminDialer, id uint64, poll time.Duration) error {
	resp, err := e.listNodesResp(ctx, a)
	if err != nil {
		return err
	}
	for _, n := range resp.GetNodes() {
		if n.GetNodeId() == id && n.GetState() == geologv1.NodeState_NODE_STATE_LIVE {
			if _, err := e.setNodeState(ctx, a, id, geologv1.NodeState_NODE_STATE_DRAINING); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "node %d: draining\n", id)
		}
	}
	for {
		var st *geologv1.SetNodeStateResponse
		err := a.callConn(ctx, e.timeout, func(ctx context.Context, c *grpc.ClientConn) error {
			var err error
			st, err = geologv1.NewAdminClient(c).SetNodeState(ctx, &geologv1.SetNodeStateRequest{NodeId: id, State: geologv1.NodeState_NODE_STATE_DECOMMISSIONED})
			return err
		})
		if err == nil {
			fmt.Fprintf(e.stdout, "node %d: %s\n", id, toNodeRow(st.GetNode()).State)
			return nil
		}
		if !rpcerr.IsRetriable(err) {
			return err
		}
		fmt.Fprintf(e.stdout, "node %d: waiting: %v\n", id, err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(poll):
		}
	}
}

func (e *env) listNodesResp(ctx context.Context, a *adminDialer) (*geologv1.ListNodesResponse, error) {
	var resp *geologv1.ListNodesResponse
	err := a.call(ctx, e.timeout, func(ctx context.Context, c geologv1.AdminClient) error {
		var err error
		resp, err = c.ListNodes(ctx, &geologv1.ListNodesRequest{})
		return err
	})
	return resp, err
}

func (e *env) listNodes(ctx context.Context, a *adminDialer, asJSON bool) error {
	resp, err := e.listNodesResp(ctx, a)
	if err != nil {
		return err
	}
	doc := listing{Region: resp.GetRegion(), RebalancerNode: resp.GetRebalancerNode(), Nodes: []nodeRow{}, Moves: []moveRow{}}
	for _, n := range resp.GetNodes() {
		doc.Nodes = append(doc.Nodes, toNodeRow(n))
	}
	for _, m := range resp.GetMoves() {
		mr := moveRow{Stream: m.GetStream(), Range: m.GetRange(), From: m.GetFromNode(), To: m.GetToNode(), Reason: m.GetReason()}
		if t := m.GetStartedUnixNanos(); t > 0 {
			mr.Running = time.Since(time.Unix(0, t)).Round(time.Second).String()
		}
		doc.Moves = append(doc.Moves, mr)
	}
	if asJSON {
		// The nodes, as before; each node's moves_in/moves_out count the
		// moves (the text form lists them).
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(doc.Nodes)
	}
	fmt.Fprintf(e.stdout, "region %s\n", resp.GetRegion())
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDRESS\tZONE\tSTATE\tSEED\tREPLICAS\tLEADERS\tMOVES IN/OUT\tUNREACHABLE")
	for _, r := range doc.Nodes {
		unreachable := r.Unreachable
		if r.Dead {
			unreachable += " (dead)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%v\t%d\t%d\t%d/%d\t%s\n", r.ID, r.Address, r.Zone, r.State, r.Seed, r.Replicas, r.Leaders, r.MovesIn, r.MovesOut, unreachable)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if doc.RebalancerNode == 0 {
		fmt.Fprintln(e.stdout, "\n(no rebalancer answered: replicas as placed at creation)")
		return nil
	}
	fmt.Fprintf(e.stdout, "\nmoves under way (rebalancer on node %d): %d\n", doc.RebalancerNode, len(doc.Moves))
	for _, m := range doc.Moves {
		to := strconv.FormatUint(m.To, 10)
		if m.To == 0 {
			to = "(removed)" // an excess voter taken off, no replacement
		}
		fmt.Fprintf(e.stdout, "  %s/%d  %d -> %s  %s  %s\n", m.Stream, m.Range, m.From, to, m.Reason, m.Running)
	}
	return nil
}
