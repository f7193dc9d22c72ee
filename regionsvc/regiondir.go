package regionsvc

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/geolog/geolog/membership"
	"github.com/geolog/geolog/pki"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
)

// Other regions' nodes (the region directory). A node reaches another
// region at the addresses Config.Regions gives for it (geologd --regions):
// the seeds. A node that joined that region after this one started is at
// none of them, so the node also asks each other region for its members
// (NodeDirectory.Members, answered from the answering node's copy of its
// node list: members.go) and keeps the last answer:
//
//  1. At start, then every regionDirRefreshInterval (every
//     regionDirRetryInterval while a region has answered nothing yet), it
//     asks one node of each other region, trying the region's addresses in
//     regionAddrs order until one answers.
//  2. An answer is taken only if it names the region asked, and, with TLS,
//     comes from a node whose certificate names that region; it is bounded
//     (regionMembersMax nodes, each address host:port of at most
//     advertiseAddrBytesMax bytes). Anything else is dropped and the last
//     list learned is kept: a node that cannot be asked is not forgotten.
//  3. regionAddrs(region) is the seeds, then the address of every learned
//     member that no seed reaches: a seed whose Identify answer (the
//     address book, advertise.go) names a node id stands for that node, so
//     a node reached through a WAN link or proxy in --regions is still
//     reached there, and only nodes the flags do not name are dialled at
//     the address their own region reaches them at. While a seed has not
//     said who it is (it may be any of the learned nodes), only the seeds
//     are given, for regionDirSeedGrace after the directory started: a
//     node would otherwise open direct connections, around a WAN link, to
//     nodes that link stands for; past it, an unidentified seed is taken
//     for a dead node and the learned members are given too.
//
// Every caller that dials another region's nodes takes regionAddrs: the
// replicator's targets, stream creation and its propagation, the rehome
// coordinator, cross-region forwarding of reads and tails, takeovers, the
// consumer coordinator's forwarding, the cluster orphan listing, the
// address book, and peerConn's allow-list.

const (
	// regionDirRefreshInterval is how often a node asks every other region
	// for its members.
	regionDirRefreshInterval = 10 * time.Second
	// regionDirRetryInterval is how soon it asks a region that has not
	// answered yet.
	regionDirRetryInterval = 500 * time.Millisecond
	// peerConnForgetAfter is how long an address must have been unknown
	// (no member of the region, no address of another region's) before
	// its peer connection is closed (forgetPeerConns).
	peerConnForgetAfter = 3 * regionDirRefreshInterval
	// membersTimeout bounds one Members call.
	membersTimeout = 2 * time.Second
	// regionMembersMax bounds the members taken from another region's
	// answer.
	regionMembersMax = 256
	// regionDirSeedGrace is how long regionAddrs waits for every seed to
	// be identified before it gives learned members beside an unidentified
	// seed (the address book retries within it).
	regionDirSeedGrace = addrBookRefreshInterval
)

// learnedMember is a node of another region as its region described it.
type learnedMember struct {
	id   uint64
	addr string
}

// regionDir holds what the node learned of other regions' members.
type regionDir struct {
	mu      sync.RWMutex
	learned map[string][]learnedMember // by region, in id order
	started time.Time                  // when runRegionDir started
}

// regionAddrs is the addresses this node reaches region's nodes at: the
// seeds (Config.Regions), then every learned member no seed reaches.
func (n *Node) regionAddrs(region string) []string {
	seeds := n.cfg.Regions[region]
	n.regionDir.mu.RLock()
	learned, started := n.regionDir.learned[region], n.regionDir.started
	n.regionDir.mu.RUnlock()
	if len(learned) == 0 {
		return seeds
	}
	behindSeeds := map[uint64]bool{}
	unidentified := false
	for _, addr := range seeds {
		if ni, ok := n.book.identity(addr); ok && ni.region == region {
			behindSeeds[ni.id] = true
		} else {
			unidentified = true
		}
	}
	if unidentified && time.Since(started) < regionDirSeedGrace {
		return seeds
	}
	out := slices.Clone(seeds)
	for _, m := range learned {
		if !behindSeeds[m.id] && !slices.Contains(out, m.addr) {
			out = append(out, m.addr)
		}
	}
	return out
}

// isOtherRegionAddr reports whether addr is one regionAddrs gives for some
// other region.
func (n *Node) isOtherRegionAddr(addr string) bool {
	for region := range n.cfg.Regions {
		if slices.Contains(n.regionAddrs(region), addr) {
			return true
		}
	}
	return false
}

// runRegionDir keeps the region directory current until ctx ends (a
// stopper task).
func (n *Node) runRegionDir(ctx context.Context) {
	n.regionDir.mu.Lock()
	n.regionDir.started = time.Now()
	n.regionDir.mu.Unlock()
	for {
		next := regionDirRefreshInterval
		if !n.refreshRegionDir(ctx) {
			next = regionDirRetryInterval
		}
		select {
		case <-time.After(next):
		case <-ctx.Done():
			return
		}
	}
}

// warmRegionConns makes sure this node has a connection open, or being
// opened, to every node of every other region it knows (regionAddrs), the
// connections peerConn gives. A takeover's survey and a rehome's wait ask
// those nodes with a short deadline (Config.TailSurveyTimeout) and take a
// node that has not answered by then for absent; over a cold connection
// an answer needs the TCP, TLS and HTTP/2 handshakes first, three or four
// round trips instead of one, so a region behind a long WAN link could
// miss a survey and another region take over in its place. peerConn's
// connections never go idle (peerDialConfig), and one that broke (a
// restarted node, a cut link) stays closed until its next call: this
// opens it again.
func (n *Node) warmRegionConns() {
	for region := range n.cfg.Regions {
		if region == n.cfg.Region {
			continue
		}
		for _, addr := range n.regionAddrs(region) {
			if c, err := n.peerConn(addr); err == nil {
				c.Connect() // a connection open or opening is left as it is
			}
		}
	}
}

// forgetPeerConns closes the peer connections (peerConn) to addresses
// this node no longer knows: neither a member of its region
// (isKnownPeerAddr) nor an address regionAddrs gives for another region.
// A node that left, or another region's member list that changed, would
// otherwise leave its connections open, each redialling a dead address
// for ever, and another region's answers (up to regionMembersMax new
// addresses every regionDirRefreshInterval, each dialled by
// warmRegionConns) would grow them without bound. An address is forgotten
// once it has been unknown for peerConnForgetAfter at successive calls
// (now is the time of this call), so that a member list changing back and
// forth, or a call in flight to a node just gone, is not cut at once.
func (n *Node) forgetPeerConns(now time.Time) {
	n.peerConnsMu.Lock()
	defer n.peerConnsMu.Unlock()
	for addr, c := range n.peerConns {
		if n.isKnownPeerAddr(addr) || n.isOtherRegionAddr(addr) {
			delete(n.peerConnsUnknown, addr)
			continue
		}
		since, ok := n.peerConnsUnknown[addr]
		if !ok {
			if n.peerConnsUnknown == nil {
				n.peerConnsUnknown = map[string]time.Time{}
			}
			n.peerConnsUnknown[addr] = now
			continue
		}
		if now.Sub(since) >= peerConnForgetAfter {
			c.Close()
			delete(n.peerConns, addr)
			delete(n.peerConnsUnknown, addr)
		}
	}
}

// runWarmRegionConns runs warmRegionConns and forgetPeerConns at once,
// then every regionDirRefreshInterval until ctx ends: on its own, so that
// a region whose nodes do not answer the directory's calls (each waited
// for up to membersTimeout, in turn) delays no other region's
// connections.
func (n *Node) runWarmRegionConns(ctx context.Context) {
	for {
		n.forgetPeerConns(time.Now())
		n.warmRegionConns()
		select {
		case <-time.After(regionDirRefreshInterval):
		case <-ctx.Done():
			return
		}
	}
}

// refreshRegionDir asks every other region for its members and reports
// whether every region answered.
func (n *Node) refreshRegionDir(ctx context.Context) bool {
	all := true
	for region := range n.cfg.Regions {
		if region == n.cfg.Region {
			continue
		}
		members, err := n.askRegionMembers(ctx, region)
		if err != nil {
			all = false
			if ctx.Err() == nil {
				n.logger.Debug("region members", "region", region, "error", err)
			}
			continue
		}
		n.regionDir.mu.Lock()
		if n.regionDir.learned == nil {
			n.regionDir.learned = map[string][]learnedMember{}
		}
		n.regionDir.learned[region] = members
		n.regionDir.mu.Unlock()
	}
	return all
}

// askRegionMembers asks region's nodes in turn for its members; the first
// valid answer wins.
func (n *Node) askRegionMembers(ctx context.Context, region string) ([]learnedMember, error) {
	var last error = fmt.Errorf("region %q has no known address", region)
	for _, addr := range n.regionAddrs(region) {
		members, err := n.regionMembersAt(ctx, addr, region)
		if err == nil {
			return members, nil
		}
		last = fmt.Errorf("%s: %w", addr, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, last
}

// regionMembersAt asks the node at addr for its region's members and
// checks the answer (step 2 above). It asks over the node's shared
// connection to addr (peerConn), the one warmRegionConns keeps open: over
// a long WAN link a connection of its own would spend three or four round
// trips on its handshakes before the question, and a round trip past
// membersTimeout/4 would then never be answered in time.
func (n *Node) regionMembersAt(ctx context.Context, addr, region string) ([]learnedMember, error) {
	conn, err := n.peerConn(addr)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, membersTimeout)
	defer cancel()
	var p peer.Peer
	resp, err := geologinternalv1.NewNodeDirectoryClient(conn).Members(cctx,
		&geologinternalv1.MembersRequest{Region: n.cfg.Region, NodeId: n.cfg.NodeID}, grpc.Peer(&p))
	if err != nil {
		return nil, err
	}
	if n.secure() {
		id, err := pki.PeerIdentity(peer.NewContext(ctx, &p))
		if err != nil {
			return nil, fmt.Errorf("members answer: %w", err)
		}
		if !id.IsNode() || id.Region != region {
			return nil, fmt.Errorf("members of region %q answered by %s", region, id.Name())
		}
	}
	return checkRegionMembers(resp, region)
}

// checkRegionMembers validates another region's Members answer.
func checkRegionMembers(resp *geologinternalv1.MembersResponse, region string) ([]learnedMember, error) {
	if resp.GetRegion() != region {
		return nil, fmt.Errorf("asked region %q's members, the answer is region %q's", region, resp.GetRegion())
	}
	if len(resp.GetMembers()) > regionMembersMax {
		return nil, fmt.Errorf("region %q answered %d members, at most %d are taken", region, len(resp.GetMembers()), regionMembersMax)
	}
	seen := map[uint64]bool{}
	out := make([]learnedMember, 0, len(resp.GetMembers()))
	for _, m := range resp.GetMembers() {
		if m.GetNodeId() == 0 || seen[m.GetNodeId()] {
			return nil, fmt.Errorf("region %q answered node id %d twice or 0", region, m.GetNodeId())
		}
		seen[m.GetNodeId()] = true
		if err := validAdvertised(m.GetAddress()); err != nil {
			return nil, fmt.Errorf("region %q node %d: %w", region, m.GetNodeId(), err)
		}
		if m.GetState() == membership.Decommissioned.String() {
			continue // not listed by a node of this build; skipped if another does
		}
		out = append(out, learnedMember{id: m.GetNodeId(), addr: m.GetAddress()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out, nil
}

// Members implements NodeDirectory.Members: the region's nodes that are
// not decommissioned, at the addresses the region's nodes reach them at.
func (s *directoryServer) Members(ctx context.Context, req *geologinternalv1.MembersRequest) (*geologinternalv1.MembersResponse, error) {
	n := s.node
	resp := &geologinternalv1.MembersResponse{Region: n.cfg.Region}
	if !n.replicated() {
		return resp, nil
	}
	addrs := n.memberAddrs() // members.go: decommissioned nodes left out
	states := map[uint64]membership.Node{}
	for _, m := range n.memberNodes() {
		states[m.ID] = m
	}
	ids := make([]uint64, 0, len(addrs))
	for id := range addrs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		m := states[id]
		st := m.State
		if st == 0 {
			st = membership.Live
		}
		resp.Members = append(resp.Members, &geologinternalv1.JoinMember{NodeId: id, Address: addrs[id], Zone: m.Zone, State: st.String(), Seed: m.Seed})
	}
	return resp, nil
}
