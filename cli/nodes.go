package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

const nodesUsage = `usage:
  nodes list [--json]
      the region's nodes as the node at --addr holds its catalogue: id,
      address, zone, state, and the replicas placed on each at creation
  nodes drain <node-id>
      the node takes no new replicas (it keeps serving what it holds)
  nodes undrain <node-id>
      a draining node back to live
  nodes decommission <node-id>
      the node leaves the region for good: its id is never reused and the
      region's nodes stop speaking Raft with it (move its replicas first:
      geolog replicas replace)`

// nodeRow is one node as nodes list prints it.
type nodeRow struct {
	ID       uint64 `json:"node_id"`
	Address  string `json:"address"`
	Zone     string `json:"zone"`
	State    string `json:"state"`
	Seed     bool   `json:"seed"`
	Replicas uint32 `json:"replicas"`
}

func toNodeRow(n *geologv1.NodeInfo) nodeRow {
	return nodeRow{ID: n.GetNodeId(), Address: n.GetAddress(), Zone: n.GetZone(), Seed: n.GetSeed(), Replicas: n.GetReplicaCount(),
		State: strings.ToLower(strings.TrimPrefix(n.GetState().String(), "NODE_STATE_"))}
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
	var resp *geologv1.SetNodeStateResponse
	err = a.call(ctx, e.timeout, func(ctx context.Context, c geologv1.AdminClient) error {
		var err error
		resp, err = c.SetNodeState(ctx, &geologv1.SetNodeStateRequest{NodeId: id, State: state})
		return err
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "node %d: %s\n", id, toNodeRow(resp.GetNode()).State)
	return nil
}

func (e *env) listNodes(ctx context.Context, a *adminDialer, asJSON bool) error {
	var resp *geologv1.ListNodesResponse
	err := a.call(ctx, e.timeout, func(ctx context.Context, c geologv1.AdminClient) error {
		var err error
		resp, err = c.ListNodes(ctx, &geologv1.ListNodesRequest{})
		return err
	})
	if err != nil {
		return err
	}
	rows := make([]nodeRow, 0, len(resp.GetNodes()))
	for _, n := range resp.GetNodes() {
		rows = append(rows, toNodeRow(n))
	}
	if asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	fmt.Fprintf(e.stdout, "region %s\n", resp.GetRegion())
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDRESS\tZONE\tSTATE\tSEED\tREPLICAS")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%v\t%d\n", r.ID, r.Address, r.Zone, r.State, r.Seed, r.Replicas)
	}
	return tw.Flush()
}
