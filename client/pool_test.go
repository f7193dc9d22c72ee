package client

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func testPool(t *testing.T, addrs ...string) *connPool {
	t.Helper()
	p := newConnPool(addrs, []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, time.Hour, time.Hour)
	t.Cleanup(func() { p.close() })
	return p
}

func TestPoolPickNextFailed(t *testing.T) {
	p := testPool(t, "a:1", "b:1", "c:1")
	if got := p.pick(); got != "a:1" {
		t.Fatalf("pick %s, want the first address", got)
	}
	if got := p.next("a:1"); got != "b:1" {
		t.Fatalf("next(a) = %s", got)
	}
	p.failed("a:1")
	if got := p.pick(); got != "b:1" {
		t.Fatalf("pick after a failed: %s", got)
	}
	p.failed("c:1")
	if got := p.next("b:1"); got != "b:1" {
		t.Fatalf("next(b) with a and c down = %s, want b, the one up", got)
	}
	p.failed("b:1")
	if got := p.next("b:1"); got != "c:1" {
		t.Fatalf("next(b) with all down = %s, want c (round robin)", got)
	}
	p.succeeded("a:1")
	if got := p.pick(); got != "a:1" {
		t.Fatalf("pick after a came back: %s", got)
	}
	if got := p.next("unknown:1"); got == "" {
		t.Fatal("next of an unknown address is empty")
	}
}

func TestPoolLearnsWithinBound(t *testing.T) {
	p := testPool(t, "boot:1", "boot:2")
	for i := range AddrsMax + 10 {
		if _, _, err := p.api(fmt.Sprintf("learned:%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	addrs := p.addrs()
	if len(addrs) != AddrsMax || addrs[0] != "boot:1" || addrs[1] != "boot:2" {
		t.Fatalf("%d addresses, first %v", len(addrs), addrs[:2])
	}
	// The least recently used learned addresses went first.
	if slices.Contains(addrs, "learned:0") || !slices.Contains(addrs, fmt.Sprintf("learned:%d", AddrsMax+9)) {
		t.Fatalf("evicted the wrong addresses: %v", addrs)
	}
	if _, _, err := p.api("not an address"); !IsRetriable(err) {
		t.Fatalf("a malformed hint: %v, want a retriable error", err)
	}
	if got := p.pick(); got == "" {
		t.Fatal("pick after evictions is empty")
	}
	p.close()
	if _, _, err := p.api("boot:1"); err != ErrClosed {
		t.Fatalf("api after close: %v", err)
	}
}

func TestPoolLeaderCache(t *testing.T) {
	p := testPool(t, "a:1")
	p.setLeader("s", 0, "b:1")
	if got := p.leader("s", 0); got != "b:1" {
		t.Fatalf("leader %q", got)
	}
	p.forgetLeader("s", 0, "c:1") // another producer's stale view
	if got := p.leader("s", 0); got != "b:1" {
		t.Fatalf("forgetting another address dropped the entry: %q", got)
	}
	p.forgetLeader("s", 0, "b:1")
	if got := p.leader("s", 0); got != "" {
		t.Fatalf("leader after forget %q", got)
	}
	for i := range leaderCacheEntriesMax + 5 {
		p.setLeader("s", uint32(i), "a:1")
	}
	if n := len(p.leaders); n != leaderCacheEntriesMax {
		t.Fatalf("%d cached leaders", n)
	}
}
