package cli_test

import (
	"strings"
	"testing"

	"github.com/geolog/geolog/internal/portlock"
)

// --addr takes a list; a dead node in it is skipped.
func TestAddrList(t *testing.T) {
	fake := startFake(t)
	fake.MustCreateStream("s", 1)
	dead := portlock.Addr(t) // held, and nothing listens on it
	out := mustRun(t, dead+","+fake.Addr(), "", "streams", "list")
	if !strings.Contains(out, "s ") {
		t.Fatalf("streams list: %q", out)
	}
	mustRun(t, dead+","+fake.Addr(), "", "streams", "create", "t", "--ranges", "2")
	mustRun(t, dead+","+fake.Addr(), "a\nb\n", "produce", "t")
	recs := parseConsumed(t, mustRun(t, dead+","+fake.Addr(), "", "consume", "t"))
	if len(recs) != 2 {
		t.Fatalf("consumed %+v, want a and b", recs)
	}
}
