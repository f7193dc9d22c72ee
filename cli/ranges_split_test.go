package cli_test

import (
	"strings"
	"testing"
)

// TestNodeRangesSplit: ranges split splits a range of a stream on a node
// (a region of one) and prints its split offset and children; a second
// split of it is RANGE_SPLIT (exit 1, with a hint), an unknown range
// RANGE_NOT_FOUND, a missing --stream or a bad --at a usage error (exit 2);
// a child splits in turn.
func TestNodeRangesSplit(t *testing.T) {
	addr := startNode(t)
	mustRun(t, addr, "", "streams", "create", "sp", "--ranges", "2")
	mustRun(t, addr, "", "produce", "sp", "--key", "k", "--value", "v")
	out := mustRun(t, addr, "", "ranges", "split", "--stream", "sp", "--range", "1")
	if !strings.Contains(out, "children 2 and 3") || !strings.Contains(out, "range map version 1") {
		t.Fatalf("split printed %q", out)
	}
	ctx := testCtx(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"ranges", "split", "--stream", "sp", "--range", "1"}, 1, "split already"},
		{[]string{"ranges", "split", "--stream", "sp", "--range", "9"}, 1, "RANGE_NOT_FOUND"},
		{[]string{"ranges", "split", "--range", "0"}, 2, "usage"},
		{[]string{"ranges", "split", "--stream", "sp", "--range", "0", "--at", "x"}, 2, "--at"},
	} {
		_, errOut, code := run(t, ctx, "", append([]string{"--addr", addr}, tc.args...)...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("geolog %v: exit %d, stderr %q; want exit %d mentioning %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
	if out := mustRun(t, addr, "", "ranges", "split", "--stream", "sp", "--range", "3", "--at", "0xf000000000000000"); !strings.Contains(out, "children 4 and 5") {
		t.Fatalf("split of child 3 printed %q", out)
	}
	// geolog ranges lists the children too.
	if out := mustRun(t, addr, "", "ranges", "sp", "--json"); !strings.Contains(out, `"range":5`) {
		t.Fatalf("ranges after the splits: %s", out)
	}
}
