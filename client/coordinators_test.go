package client

import (
	"fmt"
	"testing"

	"github.com/geolog/geolog/keyspace"
	"google.golang.org/grpc/metadata"
)

// TestCoordinatorsByRange: a coordinator learned with its cursor range
// serves every name of that range, not the others; without a range it
// serves its name only; a malformed range header is a per-name hint.
func TestCoordinatorsByRange(t *testing.T) {
	var cs coordinators
	const count = 16
	first := keyspace.RangeForKey([]byte("a"), count)
	var same, other string
	for i := 0; same == "" || other == ""; i++ {
		name := fmt.Sprintf("n%d", i)
		if keyspace.RangeForKey([]byte(name), count) == first {
			same = name
		} else {
			other = name
		}
	}
	cs.learn("a", metadata.Pairs(coordinatorHeader, "10.0.0.1:7000", cursorRangeHeader, fmt.Sprintf("%d/%d", first, count)))
	if got := cs.get(same); got != "10.0.0.1:7000" {
		t.Fatalf("a name of the same range goes to %q", got)
	}
	if got := cs.get(other); got != "" {
		t.Fatalf("a name of another range goes to %q", got)
	}
	cs.forget(same, "10.0.0.1:7000")
	if got := cs.get("a"); got != "" {
		t.Fatalf("after forget, %q", got)
	}
	// A range header that does not match the name's range, or is
	// malformed, is not taken for the range.
	for _, v := range []string{fmt.Sprintf("%d/%d", (first+1)%count, count), "x/16", "3/0", "16/16", "1/5000"} {
		cs.learn("a", metadata.Pairs(coordinatorHeader, "10.0.0.2:7000", cursorRangeHeader, v))
		if got := cs.get(same); got != "" {
			t.Fatalf("range header %q: a name of the same range goes to %q", v, got)
		}
		if got := cs.get("a"); got != "10.0.0.2:7000" {
			t.Fatalf("range header %q: the name itself goes to %q", v, got)
		}
	}
}
