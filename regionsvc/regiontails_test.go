package regionsvc

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/homing"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/wan"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// TestRegionCandidates: a region's tail of a range is its best copy's (a
// follower, or a node outside the range's group, holds less); a copy
// relearning its commit index is passed over, one holding a divergent
// tail or an epoch it cannot place bars the region, a copy that is not
// the range's log counts for nothing, and a range no copy reported is no
// candidate.
func TestRegionCandidates(t *testing.T) {
	t.Parallel()
	at := func(o uint64) *uint64 { return &o }
	nodeA := &geologv1.DescribeStreamResponse{Ranges: []*geologv1.RangeInfo{
		{Range: 0, Status: "ok", TailOffset: 40},
		{Range: 1, Status: "ok", TailOffset: 40, TimelineFenceOffset: at(12)}, // divergent from 12 on
		{Range: 2, Status: "ok", TailOffset: 40, TimelineFenceOffset: at(40)}, // fenced at its end: a prefix
		{Range: 3, Status: "ok", TailOffset: 90, Relearning: true},
		{Range: 4, Status: "ok", TailOffset: 7, EpochUnplaced: true},
		{Range: 5, Status: "corrupt: frame at 3", TailOffset: 70},
	}}
	nodeB := &geologv1.DescribeStreamResponse{Ranges: []*geologv1.RangeInfo{
		{Range: 0, Status: "ok", TailOffset: 52}, // the group's leader
		{Range: 1, Status: "ok", TailOffset: 10},
		{Range: 2, Status: "ok", TailOffset: 44},
		{Range: 3, Status: "ok", TailOffset: 61},
		{Range: 4, Status: "ok", TailOffset: 9},
		{Range: 5, Status: diskFullStatus, TailOffset: 30},
		{Range: 9, Status: "ok", TailOffset: 99}, // a range this node does not know: ignored
	}}
	// A node outside the groups: empty copies, or stale ones left where a
	// range moved away (divergent, or past the group's end after a fork
	// there): none is the range's log.
	outside := &geologv1.DescribeStreamResponse{Ranges: []*geologv1.RangeInfo{
		{Range: 0, Status: "ok", NotMember: true, TailOffset: 80},
		{Range: 1, Status: "ok", NotMember: true},
		{Range: 2, Status: "ok", NotMember: true, TailOffset: 50, TimelineFenceOffset: at(20)},
		{Range: 3, Status: "ok", NotMember: true}, {Range: 4, Status: "ok", NotMember: true},
		{Range: 5, Status: "ok", NotMember: true}, {Range: 6, Status: "ok", NotMember: true, TailOffset: 3},
	}}
	const ranges = 7
	tails, ok := regionCandidates(ranges, [][]*copyCandidate{candidatesOf(nodeA, ranges), nil, candidatesOf(nodeB, ranges), candidatesOf(outside, ranges)})
	wantTails := []uint64{52, 0, 44, 61, 0, 30, 0}
	wantOK := []bool{true, false, true, true, false, true, false}
	if !slices.Equal(tails, wantTails) || !slices.Equal(ok, wantOK) {
		t.Fatalf("region's tails %v (candidates %v), want %v (%v)", tails, ok, wantTails, wantOK)
	}
	// Every copy of range 3 relearning: no candidate.
	tails, ok = regionCandidates(ranges, [][]*copyCandidate{candidatesOf(nodeA, ranges)})
	if ok[3] || tails[3] != 0 {
		t.Errorf("range 3 with its only copy relearning: tail %d, candidate %v", tails[3], ok[3])
	}
}

// TestRegionTailIsItsBestCopy: in a region of four nodes whose ranges have
// three replicas each, every node's failover agent offers the region's
// whole mirror of each range (not the copy on its own node, empty on the
// node outside the range's group), a planned rehome coordinated by any of
// them finds it caught up, and another region reads the same.
func TestRegionTailIsItsBestCopy(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster with a lease store")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	w := newHomingWorldMut(t, []string{"us", "eu"}, 4, testLeaseTTL, func(_ string, _ uint64, cfg *Config) {
		cfg.ReplicationFactor = 3
	})
	createHomedStream(t, ctx, w.world, "bc", 1, "us")
	appendAt(t, ctx, w, "us", "bc", 20)
	waitUntil(t, ctx, 2*time.Minute, "eu's mirror holds the 20 records", func() bool {
		tl := w.tails(ctx, "bc")
		return tl["eu"] != nil && tl["eu"][0] >= 20
	})
	key := homing.RangeKey{Stream: "bc", Range: 0}
	outside := 0
	for i, n := range w.nodes["eu"] {
		if d, err := n.rangeOf(ctx, "bc", 0); err == nil && !slices.Contains(d.rep.Conf().Voters, n.cfg.NodeID) {
			outside++
			desc, err := n.describeStream(ctx, "bc")
			if err != nil {
				t.Fatal(err)
			}
			if ri := desc.GetRanges()[0]; !ri.GetNotMember() {
				t.Errorf("eu node %d, outside range 0's group, describes its copy (tail %d) as a member's", i, ri.GetTailOffset())
			}
		}
		waitUntil(t, ctx, time.Minute, fmt.Sprintf("eu node %d's agent offers the region's 20", i), func() bool {
			tail, ok := (&failoverAgent{n: n}).surveyTails(ctx, nil, []homing.RangeKey{key}).Local[key]
			return ok && tail == 20
		})
	}
	// A planned rehome to eu coordinated by any of its nodes finds the
	// region's copy caught up (the outside node's own copy never grows).
	for i, n := range w.nodes["eu"] {
		if err := n.waitRegionTail(ctx, "eu", "bc", 0, 20); err != nil {
			t.Errorf("eu node %d: a rehome's wait for eu's copy to reach 20: %v", i, err)
		}
	}
	if outside != 1 {
		t.Fatalf("%d eu nodes outside range 0's group, want 1 (4 nodes, 3 replicas)", outside)
	}
	for i, n := range w.nodes["us"] {
		if tails := n.tailsOf(ctx, "eu", "bc"); !slices.Equal(tails, []uint64{20}) {
			t.Errorf("us node %d reads eu's tails as %v, want [20]", i, tails)
		}
	}
}

// TestSurveyFindsWarmConnections: a takeover's survey of another region
// answers in one round trip, because the node keeps its connections to
// that region's nodes open before any call and opens them again after
// they break (warmRegionConns). Over a cold connection the HTTP/2
// handshake alone is a round trip (TLS adds one, TCP one more on a real
// WAN), so on a long link a survey bounded by Config.TailSurveyTimeout
// would miss the region, and another region could take over in its
// place. The link here is 1.5 s each way and the bound 5 s: an answer
// over an open connection takes 3 s, over a new one at least 6.
func TestSurveyFindsWarmConnections(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("two regions behind a slow WAN link")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const oneWay = 1500 * time.Millisecond
	w := newWorldWith(t, []string{"us", "eu"}, 2, oneWay, 0, nil, func(_ string, _ uint64, cfg *Config) {
		cfg.TailSurveyTimeout = 5 * time.Second
	})
	// Created in eu (its nodes propagate it to us): no us node has called
	// an eu node through peerConn.
	c, err := client.New(w.regionAddrs("eu"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitUntil(t, ctx, 2*time.Minute, "stream created in both regions", func() bool {
		_, err := c.CreateStream(ctx, client.StreamConfig{Name: "ws", RangeCount: 2, Regions: w.regions, HomeRegion: "eu"})
		if err != nil && client.CodeOf(err) != client.CodeStreamExists {
			t.Logf("create stream: %v", err)
			return false
		}
		for _, lc := range w.conns["us"] {
			if _, err := lc.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "ws"}); err != nil {
				return false
			}
		}
		return true
	})
	conns := func(n *Node) []*grpc.ClientConn { // n's peerConns to eu's nodes (nil: none yet)
		var out []*grpc.ClientConn
		for _, addr := range n.regionAddrs("eu") {
			n.peerConnsMu.Lock()
			out = append(out, n.peerConns[addr])
			n.peerConnsMu.Unlock()
		}
		return out
	}
	ready := func(n *Node) bool {
		for _, pc := range conns(n) {
			if pc == nil || pc.GetState() != connectivity.Ready {
				return false
			}
		}
		return true
	}
	survey := func(when string) {
		t.Helper()
		for id, n := range w.nodes["us"] {
			waitUntil(t, ctx, time.Minute, fmt.Sprintf("%s: us node %d's connections to eu open", when, id), func() bool { return ready(n) })
			start := time.Now()
			if _, _, answered := n.regionTails(ctx, "eu", "ws"); !answered {
				t.Errorf("%s: us node %d's survey of eu: no node answered within %s (took %s)", when, id, n.cfg.TailSurveyTimeout, time.Since(start))
			}
		}
	}
	survey("before any call")
	// Every us->eu connection reset: pick_first leaves a broken connection
	// closed until its next call; the node opens it again.
	var open []*grpc.ClientConn
	for _, n := range w.nodes["us"] {
		open = append(open, conns(n)...)
	}
	for id := uint64(1); id <= 2; id++ {
		l, err := w.net.Link(fmt.Sprintf("us->eu.n%d", id))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Cut(wan.CutReset); err != nil {
			t.Fatal(err)
		}
		if err := l.Heal(); err != nil {
			t.Fatal(err)
		}
	}
	for _, pc := range open {
		wctx, wcancel := context.WithTimeout(ctx, time.Minute)
		if !pc.WaitForStateChange(wctx, connectivity.Ready) {
			t.Fatalf("a us->eu connection still reads ready a minute after its link was reset")
		}
		wcancel()
	}
	survey("after the links reset")
}
