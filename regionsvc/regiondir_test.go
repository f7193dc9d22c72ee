package regionsvc

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/wan"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// joinWorld starts node id of region joining it through member's address,
// with the region's links to the others as its Regions; it returns its
// address.
func (w *world) joinWorld(region string, id, member uint64) string {
	w.t.Helper()
	// Not added to w.addrs: the region's founders hold that map as their
	// Peers.
	addr := freeAddr(w.t)
	cfg := Config{DataDir: w.t.TempDir(), ListenAddr: addr, Region: region, Regions: w.remote[region],
		NodeID: id, Join: w.addrs[region][member], TickInterval: testTick(50 * time.Millisecond), Fsync: 1,
		Logger: hclog.New(&hclog.LoggerOptions{Output: tWriter{w.t}, Level: hclog.Warn, Name: region})}
	n, err := New(cfg)
	if err != nil {
		w.t.Fatalf("join %s node %d: %v", region, id, err)
	}
	if err := n.Start(); err != nil {
		w.t.Fatal(err)
	}
	w.nodes[region][id] = n // stopped by the world's cleanup
	return addr
}

// TestOtherRegionsLearnJoinedNode: node 4 joins region b after region a's
// nodes started with only b's three founding nodes (through WAN links) in
// their Regions. Region a learns node 4 from b's members (NodeDirectory.Members)
// and dials it at its own address, while b's founding nodes stay reached
// through their links (not at their direct addresses). With a's links to
// b's founding nodes reset, a stream created in a for both regions still
// reaches b, through node 4. It fails if a never learns node 4, learns b's
// founding nodes' direct addresses, or cannot create the stream.
func TestOtherRegionsLearnJoinedNode(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := newWorld(t, []string{"a", "b"}, 3, time.Millisecond, 0)
	addr4 := w.joinWorld("b", 4, 2)
	a1 := w.nodes["a"][1]
	want := append(slices.Clone(w.remote["a"]["b"]), addr4)
	waitUntil(t, ctx, time.Minute, "a1 learns b's node 4", func() bool {
		return slices.Equal(a1.regionAddrs("b"), want)
	})
	for id := uint64(1); id <= 3; id++ {
		l, err := w.net.Link(fmt.Sprintf("a->b.n%d", id))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Cut(wan.CutReset); err != nil {
			t.Fatal(err)
		}
	}
	req := &geologv1.CreateStreamRequest{Name: "dir", RangeCount: 2, Regions: []string{"a", "b"}, HomeRegion: "a"}
	var last error
	waitUntil(t, ctx, 40*time.Second, "stream created in both regions with b reached through node 4 only", func() bool {
		_, last = w.conns["a"][1].CreateStream(ctx, req)
		if last != nil {
			t.Logf("create: %v", last)
		}
		return last == nil || rpcerr.CodeOf(last) == apierr.StreamExists
	})
	waitUntil(t, ctx, time.Minute, "b's nodes hold the stream", func() bool {
		_, err := w.conns["b"][2].DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "dir"})
		return err == nil
	})
}

// TestRegionDirOverALongLink: regions a and b behind a link of 700 ms each
// way, so one round trip (1.4 s) fits the 2 s bounds of Members and
// Identify, but a connection opened for the call does not (its HTTP/2
// handshake costs a round trip before the question). Node 3 joins b after
// a's nodes started with only b's founding nodes (through the link) in
// their Regions. Every node of a learns node 3 from b's members and
// identifies b's founding nodes behind the link, so it gives node 3's own
// address after the link's. It fails if either call opens a connection of
// its own (neither is ever answered in time: nothing is learned).
func TestRegionDirOverALongLink(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("two regions behind a slow WAN link")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := newWorld(t, []string{"a", "b"}, 2, 700*time.Millisecond, 0)
	addr3 := w.joinWorld("b", 3, 1)
	want := append(slices.Clone(w.remote["a"]["b"]), addr3)
	for id, n := range w.nodes["a"] {
		waitUntil(t, ctx, 2*time.Minute, fmt.Sprintf("a%d learns b's node 3 behind b's identified seeds", id), func() bool {
			return slices.Equal(n.regionAddrs("b"), want)
		})
		for _, seed := range w.remote["a"]["b"] {
			if ni, ok := n.book.identity(seed); !ok || ni.region != "b" {
				t.Errorf("a%d: seed %s identified as %+v (%v)", id, seed, ni, ok)
			}
		}
	}
}

// TestRegionMembersAnswerChecked: another region's Members answer is taken
// only when it names the region asked, lists each id once, and is bounded;
// a decommissioned node is left out. It fails if a bad answer is taken.
func TestRegionMembersAnswerChecked(t *testing.T) {
	t.Parallel()
	good := &geologinternalv1.MembersResponse{Region: "b", Members: []*geologinternalv1.JoinMember{
		{NodeId: 2, Address: "h2:1", State: "live"}, {NodeId: 1, Address: "h1:1", State: "draining"},
		{NodeId: 3, Address: "h3:1", State: "decommissioned"}}}
	got, err := checkRegionMembers(good, "b")
	if err != nil || !slices.Equal(got, []learnedMember{{1, "h1:1"}, {2, "h2:1"}}) {
		t.Fatalf("good answer: %v %v", got, err)
	}
	big := &geologinternalv1.MembersResponse{Region: "b"}
	for i := range regionMembersMax + 1 {
		big.Members = append(big.Members, &geologinternalv1.JoinMember{NodeId: uint64(i + 1), Address: fmt.Sprintf("h:%d", i+1), State: "live"})
	}
	for name, bad := range map[string]*geologinternalv1.MembersResponse{
		"other region": {Region: "c", Members: good.Members},
		"id twice":     {Region: "b", Members: []*geologinternalv1.JoinMember{{NodeId: 1, Address: "h:1"}, {NodeId: 1, Address: "h:2"}}},
		"id 0":         {Region: "b", Members: []*geologinternalv1.JoinMember{{NodeId: 0, Address: "h:1"}}},
		"bad address":  {Region: "b", Members: []*geologinternalv1.JoinMember{{NodeId: 1, Address: "nohostport"}}},
		"too many":     big,
	} {
		if got, err := checkRegionMembers(bad, "b"); err == nil {
			t.Errorf("%s: taken: %v", name, got)
		}
	}
}

// TestRegionAddrsSeedsStandForTheirNodes: learned members behind an
// identified seed are not given; while a seed is unidentified only the
// seeds are, until the grace has passed. It fails if a node behind a seed
// is dialled directly or a joined node is never given.
func TestRegionAddrsSeedsStandForTheirNodes(t *testing.T) {
	t.Parallel()
	n := &Node{cfg: Config{Region: "a", Regions: map[string][]string{"b": {"link1:1", "link2:1"}}}, book: newAddrBook()}
	n.regionDir.learned = map[string][]learnedMember{"b": {{1, "b1:1"}, {2, "b2:1"}, {4, "b4:1"}}}
	n.regionDir.started = time.Now()
	n.book.set("link1:1", nodeIdentity{region: "b", id: 1, advertise: "x:1"})
	if got := n.regionAddrs("b"); !slices.Equal(got, []string{"link1:1", "link2:1"}) {
		t.Fatalf("link2 unidentified, within the grace: %v", got)
	}
	n.regionDir.started = time.Now().Add(-2 * regionDirSeedGrace)
	if got := n.regionAddrs("b"); !slices.Equal(got, []string{"link1:1", "link2:1", "b2:1", "b4:1"}) {
		t.Fatalf("link2 unidentified, past the grace: %v", got)
	}
	n.regionDir.started = time.Now()
	n.book.set("link2:1", nodeIdentity{region: "b", id: 2, advertise: "x:2"})
	if got := n.regionAddrs("b"); !slices.Equal(got, []string{"link1:1", "link2:1", "b4:1"}) {
		t.Fatalf("both seeds identified: %v", got)
	}
}

// TestForgetPeerConns: a peer connection to an address the node no longer
// knows (another region's member that left its answer, a peer of its own
// region gone from its list) is closed once the address has been unknown
// for peerConnForgetAfter, and one whose address came back is kept. It
// fails if the connections of departed nodes stay open (each redials a
// dead address for ever, and another region's changing answers would
// grow them without bound) or if a known address's is closed.
func TestForgetPeerConns(t *testing.T) {
	t.Parallel()
	const seed, joined, back, peer = "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"
	n := &Node{cfg: Config{Region: "a", NodeID: 1, Peers: map[uint64]string{1: "127.0.0.1:5", 2: peer},
		Regions: map[string][]string{"b": {seed}}}, book: newAddrBook()}
	n.regionDir.started = time.Now().Add(-2 * regionDirSeedGrace)
	n.regionDir.learned = map[string][]learnedMember{"b": {{4, joined}, {5, back}}}
	defer func() {
		for _, c := range n.peerConns {
			c.Close()
		}
	}()
	conns := map[string]*grpc.ClientConn{}
	for _, addr := range []string{seed, joined, back, peer} {
		c, err := n.peerConn(addr)
		if err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
		conns[addr] = c
	}
	// joined and back leave b's answer, the peer leaves the region.
	n.regionDir.learned["b"] = nil
	delete(n.cfg.Peers, 2)
	now := time.Now()
	n.forgetPeerConns(now)
	if len(n.peerConns) != 4 {
		t.Fatalf("closed at once: %v", slices.Sorted(maps.Keys(n.peerConns)))
	}
	// back returns before the wait is over.
	n.regionDir.learned["b"] = []learnedMember{{5, back}}
	n.forgetPeerConns(now.Add(peerConnForgetAfter / 2))
	n.forgetPeerConns(now.Add(peerConnForgetAfter))
	if got := slices.Sorted(maps.Keys(n.peerConns)); !slices.Equal(got, []string{seed, back}) {
		t.Fatalf("after the wait: %v, want the seed's and back's", got)
	}
	for addr, c := range conns {
		closed := c.GetState() == connectivity.Shutdown
		if closed != (addr == joined || addr == peer) {
			t.Errorf("%s: closed %v", addr, closed)
		}
	}
	if _, err := n.peerConn(joined); err == nil {
		t.Errorf("a connection to %s, an address no longer known, was opened again", joined)
	}
}

// TestAddrBookForgetsUnknownTargets: the address book forgets what a node
// said at an address the node no longer asks (a node restarted at a new
// address names itself at both); lookup then gives the new one. It fails
// if the old entry stays (lookup could give either address).
func TestAddrBookForgetsUnknownTargets(t *testing.T) {
	t.Parallel()
	b := newAddrBook()
	b.set("old:1", nodeIdentity{region: "a", id: 2, advertise: "a-2-old:7400"})
	b.set("new:1", nodeIdentity{region: "a", id: 2, advertise: "a-2-new:7400"})
	b.set("b:1", nodeIdentity{region: "b", id: 1, advertise: "b-1:7400"})
	b.retain([]identifyTarget{{addr: "new:1", region: "a", id: 2}, {addr: "b:1", region: "b"}})
	if _, ok := b.identity("old:1"); ok {
		t.Fatal("old:1 still in the book")
	}
	for range 20 {
		if got := b.lookup("a", 2); got != "a-2-new:7400" {
			t.Fatalf("lookup of a's node 2: %q", got)
		}
	}
	if got := b.lookup("b", 1); got != "b-1:7400" {
		t.Fatalf("lookup of b's node 1: %q", got)
	}
}
