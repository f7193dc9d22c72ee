package cli_test

import (
	"net"
	"strings"
	"testing"
)

// --addr takes a list; a dead node in it is skipped.
func TestAddrList(t *testing.T) {
	fake := startFake(t)
	fake.MustCreateStream("s", 1)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
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
