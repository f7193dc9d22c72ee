package clienttest

import (
	"fmt"
	"strings"
	"sync"
)

// Cluster is several fake nodes in one process sharing one log (and one
// dedup state) per range, like the replicas of a region's Raft groups: a
// batch appended through any leader is seen by every node, and a batch
// resent to a new leader is answered as a duplicate with its original
// offsets. Each range has a leader node (node 0 at the start); the others
// answer appends with ERROR_CODE_NOT_LEADER and, unless SetLeaderHints
// turned hints off, the leader's address as leader_hint. Reads, subscribes
// and admin calls are served by every node that is up.
//
// Its methods are safe for concurrent use.
type Cluster struct {
	nodes []*Server

	mu *sync.Mutex // shared with the nodes; guards the fields below
	// leaders holds per-range leaders set by SetRangeLeader; others have
	// leaderDefault. -1 means no leader (an election in progress).
	leaders       map[rangeKey]int
	leaderDefault int
	hints         bool
}

// StartCluster starts n nodes on loopback ports, each configured by cfg,
// with node 0 leading every range and leader hints on.
func StartCluster(n int, cfg Config) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("clienttest: a cluster needs a node")
	}
	cfg = cfg.withDefaults()
	mu := &sync.Mutex{}
	streams := make(map[string]*fakeStream)
	c := &Cluster{mu: mu, leaders: make(map[rangeKey]int), hints: true}
	for i := range n {
		s := newServer(cfg, mu, streams)
		s.cluster, s.index = c, i
		if err := s.serve("127.0.0.1:0"); err != nil {
			c.Close()
			return nil, err
		}
		c.nodes = append(c.nodes, s)
	}
	return c, nil
}

// Node returns node i.
func (c *Cluster) Node(i int) *Server { return c.nodes[i] }

// Nodes returns the nodes, in index order.
func (c *Cluster) Nodes() []*Server { return append([]*Server(nil), c.nodes...) }

// Addrs returns the nodes' addresses, in index order.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		out[i] = s.addr
	}
	return out
}

// AddrList returns the nodes' addresses as one comma-separated list.
func (c *Cluster) AddrList() string { return strings.Join(c.Addrs(), ",") }

// SetLeader makes node i (-1: none) the leader of every range, dropping
// leaders set per range.
func (c *Cluster) SetLeader(i int) {
	c.checkIndex(i)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leaderDefault = i
	clear(c.leaders)
}

// SetRangeLeader makes node i (-1: none) the leader of one range.
func (c *Cluster) SetRangeLeader(stream string, rng uint32, i int) {
	c.checkIndex(i)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leaders[rangeKey{stream, rng}] = i
}

// Leader returns the index of a range's leader node, -1 if none.
func (c *Cluster) Leader(stream string, rng uint32) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leaderLocked(stream, rng)
}

func (c *Cluster) leaderLocked(stream string, rng uint32) int {
	if i, ok := c.leaders[rangeKey{stream, rng}]; ok {
		return i
	}
	return c.leaderDefault
}

func (c *Cluster) checkIndex(i int) {
	if i < -1 || i >= len(c.nodes) {
		panic(fmt.Sprintf("clienttest: no node %d in a cluster of %d", i, len(c.nodes)))
	}
}

// SetLeaderHints turns the leader_hint of NOT_LEADER answers on or off
// (on at the start).
func (c *Cluster) SetLeaderHints(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hints = on
}

// Kill stops node i as a crash would: its listener and every connection to
// it close, streams end, and requests it had not yet applied are never
// applied. Its address refuses connections until Restart. Leadership does
// not move by itself: call SetLeader as an election would.
func (c *Cluster) Kill(i int) { c.nodes[i].Close() }

// Restart serves node i again on its address, with the shared logs.
func (c *Cluster) Restart(i int) error {
	s := c.nodes[i]
	c.mu.Lock()
	s.down = false
	c.mu.Unlock()
	return s.serve(s.addr)
}

// MustCreateStream creates a stream on every node, panicking on error.
func (c *Cluster) MustCreateStream(name string, rangeCount uint32) {
	c.nodes[0].MustCreateStream(name, rangeCount)
}

// Close stops every node.
func (c *Cluster) Close() {
	for _, s := range c.nodes {
		s.Close()
	}
}
