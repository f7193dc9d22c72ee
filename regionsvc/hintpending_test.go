package regionsvc

import (
	"context"
	"testing"
	"time"

	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
)

// TestPendingHintsBounded: the set of pending hints keeps one hint per
// target node, stream incarnation and range (a second adds nothing),
// drops the oldest past its cap (counting it), and a round's pruning
// forgets the hints to a node that left the region and those of a
// stream, incarnation or range this node no longer has. It fails if the
// set grows past its cap, keeps duplicates, or keeps hints for nothing.
func TestPendingHintsBounded(t *testing.T) {
	t.Parallel()
	hint := func(stream string, meta uint64, r uint32) *geologinternalv1.ReplicaRemovedRequest {
		return &geologinternalv1.ReplicaRemovedRequest{Region: "r", NodeId: 1, Stream: stream, StreamMetaOffset: meta, Range: r}
	}
	p := newPendingHints(3)
	p.add(2, hint("a", 5, 0))
	if _, dropped := p.add(2, hint("a", 5, 0)); dropped || p.size() != 1 {
		t.Fatalf("the same hint twice: %d pending, dropped %v", p.size(), dropped)
	}
	p.add(3, hint("a", 5, 0)) // another node: another hint
	p.add(2, hint("a", 5, 1)) // another range
	if p.size() != 3 || p.dropped.Load() != 0 {
		t.Fatalf("%d pending, %d dropped; want 3, 0", p.size(), p.dropped.Load())
	}
	gone, dropped := p.add(2, hint("a", 6, 0)) // another incarnation, past the cap
	if !dropped || gone != (pendingHintKey{node: 2, stream: "a", metaOffset: 5, r: 0}) || p.size() != 3 || p.dropped.Load() != 1 {
		t.Fatalf("past the cap: dropped %v (%v), %d pending, %d counted; want the oldest, 3, 1", dropped, gone, p.size(), p.dropped.Load())
	}
	if _, ok := p.snapshot()[pendingHintKey{node: 2, stream: "a", metaOffset: 6, r: 0}]; !ok {
		t.Fatal("the newest hint was not kept")
	}

	n := &Node{cfg: Config{NodeID: 1, Peers: map[uint64]string{1: "a:1", 2: "a:2", 3: "a:3"}},
		streams: map[string]*streamState{"a": {spec: streamSpec{MetaOffset: 5}, ranges: []*rangeDriver{{}}}}}
	p = newPendingHints(16)
	p.add(2, hint("a", 5, 0)) // wanted
	p.add(3, hint("a", 5, 0)) // node 3 decommissioned below
	p.add(2, hint("a", 4, 0)) // another incarnation
	p.add(2, hint("a", 5, 1)) // no such range here
	p.add(2, hint("b", 5, 0)) // no such stream here
	delete(n.cfg.Peers, 3)
	if k := p.prune(n.pendingHintWanted); k != 4 || p.size() != 1 {
		t.Fatalf("pruned %d, %d left; want 4, 1", k, p.size())
	}
	if _, ok := p.snapshot()[pendingHintKey{node: 2, stream: "a", metaOffset: 5, r: 0}]; !ok {
		t.Fatal("the wanted hint was pruned")
	}
}

// TestRemovedReplicaToldAfterLongCut: as TestRemovedReplicaToldByLeader,
// but x stays cut off well past the hint's attempts (two here), so that
// the hint is kept pending, and past several of the pending retries
// (every 500 ms here) while x is still cut off. Healed, x must be told by
// a pending retry: its subscription ends with a retriable NOT_LEADER and
// its replica is emptied, with its stray sweep as good as off. Without
// pending hints the hint is given up and x keeps its stale copy and its
// subscriber for ever.
func TestRemovedReplicaToldAfterLongCut(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := newStrayScene(t, ctx, func(c *Config) {
		c.Rebalance.StrayCheckInterval = 10 * time.Minute
		c.hintAttempts = 2
		c.hintPendingRetry = 500 * time.Millisecond
	})
	s.cut(true)
	s.moveOffX(t, ctx)
	s.appendN(t, ctx, 10)
	pending := func() int {
		k := 0
		for _, n := range s.tr.nodes {
			k += n.pendingHints.size()
		}
		return k
	}
	waitUntil(t, ctx, time.Minute, "the hint's attempts run out: it is pending", func() bool { return pending() > 0 })
	time.Sleep(3 * time.Second) // several pending rounds fail
	if pending() == 0 {
		t.Fatal("the pending hint left the set while x is cut off")
	}
	select {
	case err := <-s.sub.done:
		t.Fatalf("the subscription at x ended while it was cut off: %v", err)
	default:
	}
	s.cut(false)
	healed := time.Now()
	checkNotLeader(t, "the subscription at the removed replica", s.sub.waitEnd(t, 20*time.Second))
	s.checkRemoved(t, ctx, 30*time.Second-time.Since(healed))
	t.Logf("node %d removed (leader %d, replaced by %d): subscription ended and replica emptied %v after the heal",
		s.x, s.leader, s.y, time.Since(healed).Round(time.Millisecond))
	waitUntil(t, ctx, 10*time.Second, "the pending hint delivered", func() bool { return pending() == 0 })
	s.checkEveryRecord(t, ctx, s.y)
}
