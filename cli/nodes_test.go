package cli_test

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestNodeNodesCommands: nodes list shows a region of one's node; drain and
// undrain change its state; an unknown id is NODE_NOT_FOUND (exit 1, with
// the hint to list the nodes) and
// a bad id a usage error (exit 2). It fails if any command's output or
// exit code differs.
func TestNodeNodesCommands(t *testing.T) {
	addr := startNode(t)
	var rows []struct {
		ID    uint64 `json:"node_id"`
		State string `json:"state"`
		Seed  bool   `json:"seed"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, addr, "", "nodes", "list", "--json")), &rows); err != nil || len(rows) != 1 || rows[0].ID != 1 || rows[0].State != "live" || !rows[0].Seed {
		t.Fatalf("nodes list: %+v %v", rows, err)
	}
	if out := mustRun(t, addr, "", "nodes", "drain", "1"); !strings.Contains(out, "node 1: draining") {
		t.Fatalf("drain printed %q", out)
	}
	if out := mustRun(t, addr, "", "nodes", "list"); !strings.Contains(out, "draining") || !strings.Contains(out, "LEADERS") || !strings.Contains(out, "no rebalancer answered") {
		t.Fatalf("list after drain: %q", out)
	}
	mustRun(t, addr, "", "nodes", "undrain", "1")
	ctx := testCtx(t)
	if _, errOut, code := run(t, ctx, "", "--addr", addr, "nodes", "drain", "7"); code != 1 || !strings.Contains(errOut, "NODE_NOT_FOUND") || !strings.Contains(errOut, "geolog nodes list") {
		t.Fatalf("drain of unknown node 7: exit %d, %q", code, errOut)
	}
	if _, _, code := run(t, ctx, "", "--addr", addr, "nodes", "decommission", "x"); code != 2 {
		t.Fatalf("bad id: exit %d", code)
	}
}
