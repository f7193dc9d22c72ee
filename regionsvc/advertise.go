package regionsvc

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/geolog/geolog/internal/grpcdial"

	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"google.golang.org/grpc"
)

// Advertised addresses. A node listens at Config.ListenAddr and its peers
// reach it at the address in their Config.Peers, or, from another region,
// at one in their Config.Regions: a WAN link, a proxy, an internal name.
// Clients may see none of these. Every address the node gives a client (a
// leader hint in NOT_LEADER, the home address in NOT_HOME, RangeInfo.leader
// and home_leader, ListOrphans' node addresses) is instead one node's
// Config.AdvertiseAddr: the address that node says clients dial it at.
//
// Nodes learn each other's advertised addresses where they learn about
// each other: every node asks each peer of its region (at its Peers
// address) and each address it has for another region (Regions) who it is
// (NodeDirectory.Identify: region, Raft id, advertised address), at once
// when it starts, again every addrBookRefreshInterval, and sooner while an
// answer is missing (from addrBookRetryInterval, backing off) or a hint
// found no address. What it learned is kept in
// the node's addrBook; a hint names only an address found there, never a
// peer or link address: a node whose advertised address is not known yet
// gives no hint (the client then tries its other addresses).

const (
	// addrBookRefreshInterval is how often a node asks every node it knows
	// who it is, once it has heard from all of them.
	addrBookRefreshInterval = 30 * time.Second // a restarted node's new address is learned within it
	// addrBookRetryInterval is how soon it asks again while some node has
	// not answered (a node starting with its region).
	addrBookRetryInterval = 500 * time.Millisecond
	// identifyTimeout bounds one Identify call.
	identifyTimeout = 2 * time.Second
	// identifyConcurrencyMax bounds the Identify calls in flight at once.
	identifyConcurrencyMax = 8
	// advertiseAddrBytesMax bounds an advertised address taken from a peer.
	advertiseAddrBytesMax = 256
)

// nodeIdentity is one node as it describes itself.
type nodeIdentity struct {
	region    string
	id        uint64
	advertise string
}

// addrBook holds what the node learned of other nodes' advertised
// addresses, by the address it reaches each at (so it holds at most one
// entry per address the node knows, identifyTargets: its size is bounded
// by the configuration and the region directory, whatever the answers
// say, and an address no longer known is forgotten, retain).
type addrBook struct {
	mu       sync.RWMutex
	byTarget map[string]nodeIdentity
	// missed is poked when a lookup found nothing: the refresher asks
	// again soon.
	missed chan struct{}
}

func newAddrBook() *addrBook {
	return &addrBook{byTarget: map[string]nodeIdentity{}, missed: make(chan struct{}, 1)}
}

// lookup returns the advertised address of node id of region, or "".
func (b *addrBook) lookup(region string, id uint64) string {
	b.mu.RLock()
	defer b.mu.RUnlock()
	for _, ni := range b.byTarget {
		if ni.region == region && ni.id == id {
			return ni.advertise
		}
	}
	b.poke()
	return ""
}

// identity returns what the node at target (an address this node
// reaches it at) said it is, if it answered.
func (b *addrBook) identity(target string) (nodeIdentity, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	ni, ok := b.byTarget[target]
	return ni, ok
}

// regionAddrs returns the advertised addresses known for region's nodes,
// in Raft id order.
func (b *addrBook) regionAddrs(region string) []string {
	b.mu.RLock()
	var nodes []nodeIdentity
	for _, ni := range b.byTarget {
		if ni.region == region {
			nodes = append(nodes, ni)
		}
	}
	b.mu.RUnlock()
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].id < nodes[j].id })
	var out []string
	for _, ni := range nodes {
		if !slices.Contains(out, ni.advertise) {
			out = append(out, ni.advertise)
		}
	}
	if len(out) == 0 {
		b.poke()
	}
	return out
}

func (b *addrBook) poke() {
	select {
	case b.missed <- struct{}{}:
	default:
	}
}

func (b *addrBook) set(target string, ni nodeIdentity) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.byTarget[target] = ni
}

// retain forgets what the nodes at addresses other than targets said: a
// node that left, or moved (a restart at a new address leaves its old
// address's entry naming the same node, and lookup would then give either
// address), and keeps the book bounded by what the node knows now.
func (b *addrBook) retain(targets []identifyTarget) {
	keep := make(map[string]bool, len(targets))
	for _, tg := range targets {
		keep[tg.addr] = true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for target := range b.byTarget {
		if !keep[target] {
			delete(b.byTarget, target)
		}
	}
}

// AdvertiseAddr is the address the node gives clients for itself (after
// Start): Config.AdvertiseAddr, or the address it listens on.
func (n *Node) AdvertiseAddr() string { return n.advertise }

// clientAddr is the advertised address of node id of region, or "" when
// the node does not know it (yet).
func (n *Node) clientAddr(region string, id uint64) string {
	if id == 0 {
		return ""
	}
	if region == n.cfg.Region && id == n.cfg.NodeID {
		return n.advertise
	}
	return n.book.lookup(region, id)
}

// identifyTarget is one address to ask, with what the node expects there.
type identifyTarget struct {
	addr   string
	region string
	// id is the Raft id expected (a peer of the node's region); 0 for
	// another region's node, whose id the answer tells.
	id uint64
}

// identifyTargets lists the nodes this node knows: its region's peers and
// the addresses it has for other regions.
func (n *Node) identifyTargets() []identifyTarget {
	var out []identifyTarget
	for id, addr := range n.memberAddrs() { // members.go
		if id != n.cfg.NodeID {
			out = append(out, identifyTarget{addr: addr, region: n.cfg.Region, id: id})
		}
	}
	for region := range n.cfg.Regions {
		for _, addr := range n.regionAddrs(region) { // regiondir.go
			out = append(out, identifyTarget{addr: addr, region: region})
		}
	}
	return out
}

// runAddrBook keeps the address book current until the node closes.
func (n *Node) runAddrBook() {
	defer close(n.bookDone)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-n.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	retry := addrBookRetryInterval
	for {
		next := addrBookRefreshInterval
		if n.refreshAddrBook(ctx) {
			retry = addrBookRetryInterval
		} else {
			// Some node did not answer (down, or not started yet): ask
			// again soon, backing off while it stays away.
			next, retry = retry, min(2*retry, addrBookRefreshInterval/3)
		}
		t := time.NewTimer(next)
		select {
		case <-t.C:
		case <-n.book.missed:
			// A lookup missed: ask again, but no sooner than the retry
			// interval (a client hammering a node must not make it
			// hammer its peers).
			t.Stop()
			select {
			case <-time.After(addrBookRetryInterval):
			case <-ctx.Done():
				return
			}
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}

// refreshAddrBook asks every target who it is, a bounded number at a time,
// and reports whether all answered.
func (n *Node) refreshAddrBook(ctx context.Context) bool {
	targets := n.identifyTargets()
	n.book.retain(targets)
	var wg sync.WaitGroup
	var mu sync.Mutex
	all := true
	sem := make(chan struct{}, identifyConcurrencyMax)
	for _, tg := range targets {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ni, err := n.identify(ctx, tg)
			if err != nil {
				if ctx.Err() == nil {
					n.logger.Debug("identify", "addr", tg.addr, "region", tg.region, "error", err)
				}
				mu.Lock()
				all = false
				mu.Unlock()
				return
			}
			n.book.set(tg.addr, ni)
		}()
	}
	wg.Wait()
	return all
}

// identify asks the node at tg who it is, and checks the answer against
// what this node's configuration says is there. A peer of this node's
// region is asked over a connection of its own, closed after the call: a
// peer that is not up yet (a region starting) must not leave the node's
// shared connection to it (peerConn) backing off, failing the forwards
// that follow as soon as it is up. Another region's node is asked over the
// shared connection, which warmRegionConns keeps open anyway: a
// connection of its own would spend three or four round trips of a WAN
// link on handshakes, past identifyTimeout on a long one.
func (n *Node) identify(ctx context.Context, tg identifyTarget) (nodeIdentity, error) {
	var conn *grpc.ClientConn
	var err error
	if tg.region == n.cfg.Region {
		conn, err = grpcdial.Dial(tg.addr, n.peerDialConfig())
		if err == nil {
			defer conn.Close()
		}
	} else {
		conn, err = n.peerConn(tg.addr)
	}
	if err != nil {
		return nodeIdentity{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, identifyTimeout)
	defer cancel()
	resp, err := geologinternalv1.NewNodeDirectoryClient(conn).Identify(cctx,
		&geologinternalv1.IdentifyRequest{Region: n.cfg.Region, NodeId: n.cfg.NodeID})
	if err != nil {
		return nodeIdentity{}, err
	}
	ni := nodeIdentity{region: resp.GetRegion(), id: resp.GetNodeId(), advertise: resp.GetAdvertiseAddr()}
	if err := validAdvertised(ni.advertise); err != nil {
		return nodeIdentity{}, err
	}
	if ni.region != tg.region || ni.id == 0 || (tg.id != 0 && ni.id != tg.id) {
		return nodeIdentity{}, fmt.Errorf("the node at %s is %s node %d, not what the configuration says is there (%s node %d)",
			tg.addr, ni.region, ni.id, tg.region, tg.id)
	}
	return ni, nil
}

// validAdvertised checks an advertised address taken from the network.
func validAdvertised(addr string) error {
	if addr == "" || len(addr) > advertiseAddrBytesMax {
		return fmt.Errorf("advertised address of %d bytes: want host:port of at most %d", len(addr), advertiseAddrBytesMax)
	}
	if host, port, err := net.SplitHostPort(addr); err != nil || host == "" || port == "" {
		return fmt.Errorf("advertised address %q is not host:port", addr)
	}
	return nil
}

// directoryServer answers Identify for the node.
type directoryServer struct {
	geologinternalv1.UnimplementedNodeDirectoryServer
	node *Node
}

func (s *directoryServer) Identify(ctx context.Context, req *geologinternalv1.IdentifyRequest) (*geologinternalv1.IdentifyResponse, error) {
	n := s.node
	return &geologinternalv1.IdentifyResponse{Region: n.cfg.Region, NodeId: n.cfg.NodeID, AdvertiseAddr: n.advertise}, nil
}
