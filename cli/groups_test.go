package cli_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestNodeGroupsCommands: consume --group --max prints records and commits
// them; a second run continues after them; groups list, describe (with
// lag), reset (refused while a member is live: here none is) and delete;
// ranges shows the group's lag.
func TestNodeGroupsCommands(t *testing.T) {
	addr := startNode(t)
	ctx := testCtx(t)
	mustRun(t, addr, "", "streams", "create", "jobs", "--ranges", "2")
	var in strings.Builder
	for i := range 20 {
		fmt.Fprintf(&in, "k%d\tjob %d\n", i%4, i)
	}
	mustRun(t, addr, in.String(), "produce", "jobs", "--tab")
	first := parseConsumed(t, mustRun(t, addr, "", "consume", "jobs", "--group", "workers", "--max", "12"))
	second := parseConsumed(t, mustRun(t, addr, "", "consume", "jobs", "--group", "workers", "--max", "8"))
	seen := map[string]bool{}
	for _, r := range append(first, second...) {
		if seen[r.value] {
			t.Fatalf("%s processed twice: the second member did not start at the group's positions", r.value)
		}
		seen[r.value] = true
	}
	if len(seen) != 20 {
		t.Fatalf("processed %d distinct records, want 20", len(seen))
	}
	out := mustRun(t, addr, "", "groups", "list")
	if !strings.Contains(out, "workers") || !strings.Contains(out, "empty") {
		t.Fatalf("groups list:\n%s", out)
	}
	out = mustRun(t, addr, "", "groups", "describe", "workers", "--json")
	var d struct {
		Stream string
		Ranges []struct{ LagRecords uint64 }
	}
	if err := json.Unmarshal([]byte(out), &d); err != nil || d.Stream != "jobs" || len(d.Ranges) != 2 {
		t.Fatalf("describe: %v\n%s", err, out)
	}
	for _, r := range d.Ranges {
		if r.LagRecords != 0 {
			t.Fatalf("lag after consuming everything: %s", out)
		}
	}
	if _, stderr, code := run(t, ctx, "", "--addr", addr, "groups", "reset", "workers"); code != 2 {
		t.Fatalf("reset without a target: exit %d, %s", code, stderr)
	}
	mustRun(t, addr, "", "groups", "reset", "workers", "--to-earliest")
	if out := mustRun(t, addr, "", "ranges", "jobs"); !strings.Contains(out, "group workers") || !strings.Contains(out, "lag") {
		t.Fatalf("ranges shows no group lag:\n%s", out)
	}
	again := parseConsumed(t, mustRun(t, addr, "", "consume", "jobs", "--group", "workers", "--max", "20"))
	if len(again) != 20 {
		t.Fatalf("after the reset the group processed %d records, want 20", len(again))
	}
	mustRun(t, addr, "", "groups", "delete", "workers")
	if _, _, code := run(t, ctx, "", "--addr", addr, "groups", "describe", "workers"); code != 1 {
		t.Fatalf("describe of a deleted group: exit %d", code)
	}
}
