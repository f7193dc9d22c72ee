// Package membership is a region's node list: which nodes belong to the
// region, at which address its nodes reach each one, in which zone it runs
// and in which state it is (live, draining, decommissioned). It is a pure,
// deterministic core: the list is the result of applying the catalogue's
// membership records in log order, so every node that applied the same
// records holds the same list. The driver (regionsvc/members.go) proposes
// the records, applies the committed ones, persists the list and tells the
// Raft transport the addresses.
//
// The rules:
//
//  1. A region is seeded once, from the founding nodes (geologd --peers);
//     later seeds are ignored (Seed returns ErrSeeded).
//  2. A node joins with an id no node of the region ever had, or again with
//     its own id and address (idempotent). A decommissioned id is never
//     reused (ErrIDRetired); an address another node holds is refused
//     (ErrAddressInUse), as is a member's id at another address (ErrIDInUse):
//     a member changes its address by Move instead (the driver admits that
//     only from the node itself).
//  3. States move live <-> draining -> decommissioned, and live ->
//     decommissioned; decommissioned is final (ErrDecommissioned). An id the
//     list does not hold is ErrUnknownNode.
package membership

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
)

// State is a node's state in its region.
type State uint8

const (
	// Live nodes serve and take new replicas.
	Live State = iota + 1
	// Draining nodes serve what they hold and take nothing new.
	Draining
	// Decommissioned nodes are out of the region for good: their id is
	// never reused, and their peers stop speaking Raft with them.
	Decommissioned
)

var stateNames = map[State]string{Live: "live", Draining: "draining", Decommissioned: "decommissioned"}

func (s State) String() string {
	if n, ok := stateNames[s]; ok {
		return n
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// ParseState reads a state's name ("live", "draining", "decommissioned").
func ParseState(name string) (State, error) {
	for s, n := range stateNames {
		if n == name {
			return s, nil
		}
	}
	return 0, fmt.Errorf("%w: %q", ErrBadState, name)
}

// MarshalText writes the state's name.
func (s State) MarshalText() ([]byte, error) {
	if _, ok := stateNames[s]; !ok {
		return nil, fmt.Errorf("%w: %d", ErrBadState, s)
	}
	return []byte(s.String()), nil
}

// UnmarshalText reads a state's name.
func (s *State) UnmarshalText(b []byte) error {
	v, err := ParseState(string(b))
	*s = v
	return err
}

// Node is one node of a region.
type Node struct {
	// ID is the node's Raft id in the region (non-zero), the id its
	// certificate names.
	ID uint64 `json:"id"`
	// Addr is the address the region's nodes reach it at (host:port).
	Addr string `json:"addr"`
	// Zone is its failure domain inside the region ("" none given).
	Zone  string `json:"zone,omitempty"`
	State State  `json:"state"`
	// Seed marks a founding node: the seeds are the first voters of the
	// catalogue's Raft group.
	Seed bool `json:"seed,omitempty"`
	// Moved marks a node whose address Move changed (a member restarted at
	// another address): that address wins over a static --peers entry.
	Moved bool `json:"moved,omitempty"`
}

// Errors. Each is a refusal of a request that cannot succeed as sent.
var (
	// ErrSeeded: the region's node list was seeded already.
	ErrSeeded = errors.New("membership: the region is seeded already")
	// ErrUnknownNode: no node of the region has the id.
	ErrUnknownNode = errors.New("membership: no node of the region has this id")
	// ErrIDRetired: the id belonged to a decommissioned node; ids are
	// never reused.
	ErrIDRetired = errors.New("membership: the id belonged to a decommissioned node and is never reused")
	// ErrIDInUse: the id is a member's, at another address.
	ErrIDInUse = errors.New("membership: the id is a member's at another address")
	// ErrAddressInUse: another node of the region has the address.
	ErrAddressInUse = errors.New("membership: another node of the region has this address")
	// ErrDecommissioned: the node is decommissioned; that state is final.
	ErrDecommissioned = errors.New("membership: the node is decommissioned")
	// ErrBadNode: the node's id, address or zone is not valid.
	ErrBadNode = errors.New("membership: invalid node")
	// ErrBadState: not a state a node can be put in.
	ErrBadState = errors.New("membership: invalid state")
)

// Bounds on what a node record may hold.
const (
	addrBytesMax = 255
	zoneBytesMax = 64
	// NodesMax bounds a region's node list (decommissioned nodes included).
	NodesMax = 4096
)

// List is a region's node list. The zero value is an empty, unseeded list.
type List struct {
	nodes map[uint64]Node
}

// Seeded reports whether the list was seeded (or holds any node).
func (l *List) Seeded() bool { return len(l.nodes) > 0 }

// Validate checks a node's id, address and zone.
func Validate(n Node) error {
	if n.ID == 0 {
		return fmt.Errorf("%w: id 0", ErrBadNode)
	}
	if len(n.Addr) == 0 || len(n.Addr) > addrBytesMax {
		return fmt.Errorf("%w: address %q", ErrBadNode, n.Addr)
	}
	if _, port, err := net.SplitHostPort(n.Addr); err != nil || port == "" {
		return fmt.Errorf("%w: address %q is not host:port", ErrBadNode, n.Addr)
	}
	if len(n.Zone) > zoneBytesMax {
		return fmt.Errorf("%w: zone of %d bytes, at most %d", ErrBadNode, len(n.Zone), zoneBytesMax)
	}
	return nil
}

// Seed sets the founding nodes, all live: ErrSeeded once the list holds
// any node.
func (l *List) Seed(nodes []Node) error {
	if l.Seeded() {
		return ErrSeeded
	}
	if len(nodes) == 0 || len(nodes) > NodesMax {
		return fmt.Errorf("%w: %d seeds", ErrBadNode, len(nodes))
	}
	next := map[uint64]Node{}
	for _, n := range nodes {
		if err := Validate(n); err != nil {
			return err
		}
		if _, dup := next[n.ID]; dup {
			return fmt.Errorf("%w: id %d listed twice", ErrBadNode, n.ID)
		}
		n.State, n.Seed = Live, true
		next[n.ID] = n
	}
	l.nodes = next
	return nil
}

// CheckJoin says whether n may join: nil if it may (or is a member at
// that address already: Join then changes nothing but its zone), else why
// not.
func (l *List) CheckJoin(n Node) error {
	if err := Validate(n); err != nil {
		return err
	}
	if old, ok := l.nodes[n.ID]; ok {
		switch {
		case old.State == Decommissioned:
			return fmt.Errorf("%w: node %d", ErrIDRetired, n.ID)
		case old.Addr != n.Addr:
			return fmt.Errorf("%w: node %d is at %s", ErrIDInUse, n.ID, old.Addr)
		}
		return nil
	}
	for _, o := range l.nodes {
		if o.Addr == n.Addr && o.State != Decommissioned {
			return fmt.Errorf("%w: %s is node %d's", ErrAddressInUse, n.Addr, o.ID)
		}
	}
	if len(l.nodes) >= NodesMax {
		return fmt.Errorf("%w: the region lists %d nodes already", ErrBadNode, len(l.nodes))
	}
	return nil
}

// Join adds n as a live node (or, for a member at the same address,
// updates its zone); it reports whether the list changed.
func (l *List) Join(n Node) (bool, error) {
	if err := l.CheckJoin(n); err != nil {
		return false, err
	}
	if old, ok := l.nodes[n.ID]; ok {
		if old.Zone == n.Zone {
			return false, nil
		}
		old.Zone = n.Zone
		l.nodes[n.ID] = old
		return true, nil
	}
	if l.nodes == nil {
		l.nodes = map[uint64]Node{}
	}
	n.State, n.Seed = Live, false
	l.nodes[n.ID] = n
	return true, nil
}

// CheckMove says whether member n.ID may move to address n.Addr: it is a
// member, not decommissioned, and no other node has the address. Whether
// the request comes from that node is the caller's to check.
func (l *List) CheckMove(n Node) error {
	if err := Validate(n); err != nil {
		return err
	}
	old, ok := l.nodes[n.ID]
	switch {
	case !ok:
		return fmt.Errorf("%w: node %d", ErrUnknownNode, n.ID)
	case old.State == Decommissioned:
		return fmt.Errorf("%w: node %d", ErrIDRetired, n.ID)
	}
	for _, o := range l.nodes {
		if o.ID != n.ID && o.Addr == n.Addr && o.State != Decommissioned {
			return fmt.Errorf("%w: %s is node %d's", ErrAddressInUse, n.Addr, o.ID)
		}
	}
	return nil
}

// Move records member n.ID at address n.Addr (marked Moved); it reports
// whether the list changed.
func (l *List) Move(n Node) (bool, error) {
	if err := l.CheckMove(n); err != nil {
		return false, err
	}
	old := l.nodes[n.ID]
	if old.Addr == n.Addr && old.Moved {
		return false, nil
	}
	old.Addr, old.Moved = n.Addr, true
	l.nodes[n.ID] = old
	return true, nil
}

// CheckState says whether node id may be put in state s.
func (l *List) CheckState(id uint64, s State) error {
	if _, ok := stateNames[s]; !ok {
		return fmt.Errorf("%w: %d", ErrBadState, s)
	}
	old, ok := l.nodes[id]
	switch {
	case !ok:
		return fmt.Errorf("%w: node %d", ErrUnknownNode, id)
	case old.State == Decommissioned && s != Decommissioned:
		return fmt.Errorf("%w: node %d", ErrDecommissioned, id)
	}
	return nil
}

// SetState puts node id in state s; it reports whether the list changed.
func (l *List) SetState(id uint64, s State) (bool, error) {
	if err := l.CheckState(id, s); err != nil {
		return false, err
	}
	n := l.nodes[id]
	if n.State == s {
		return false, nil
	}
	n.State = s
	l.nodes[id] = n
	return true, nil
}

// Get returns node id (a nil list holds none).
func (l *List) Get(id uint64) (Node, bool) {
	if l == nil {
		return Node{}, false
	}
	n, ok := l.nodes[id]
	return n, ok
}

// Nodes returns every node, decommissioned ones included, by id; the
// caller owns the slice.
func (l *List) Nodes() []Node {
	out := make([]Node, 0, len(l.nodes))
	for _, n := range l.nodes {
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b Node) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Seeds returns the founding nodes' ids, ascending.
func (l *List) Seeds() []uint64 {
	var out []uint64
	for _, n := range l.Nodes() {
		if n.Seed {
			out = append(out, n.ID)
		}
	}
	return out
}

// Founding returns the founding nodes as Seed made them (live, no zone):
// a list seeded with them and given the catalogue's records again from the
// first ends equal to l.
func (l *List) Founding() []Node {
	var out []Node
	for _, n := range l.Nodes() {
		if n.Seed {
			out = append(out, Node{ID: n.ID, Addr: n.Addr, State: Live, Seed: true})
		}
	}
	return out
}

// Merge returns the list of l's nodes and, for ids l lacks, older's: a
// node decommissioned in either is decommissioned (that state is final).
// older may be nil.
func Merge(l, older *List) *List {
	out := l.Clone()
	if older == nil {
		return out
	}
	for id, o := range older.nodes {
		n, ok := out.nodes[id]
		switch {
		case !ok:
			out.nodes[id] = o
		case o.State == Decommissioned:
			n.State = Decommissioned
			out.nodes[id] = n
		}
	}
	return out
}

// Clone returns an independent copy of l.
func (l *List) Clone() *List {
	c := &List{nodes: make(map[uint64]Node, len(l.nodes))}
	for id, n := range l.nodes {
		c.nodes[id] = n
	}
	return c
}

// MarshalJSON writes the list as its nodes in id order.
func (l *List) MarshalJSON() ([]byte, error) { return json.Marshal(l.Nodes()) }

// UnmarshalJSON reads a list MarshalJSON wrote, checking every node.
func (l *List) UnmarshalJSON(b []byte) error {
	var nodes []Node
	if err := json.Unmarshal(b, &nodes); err != nil {
		return err
	}
	c, err := FromNodes(nodes)
	if err != nil {
		return err
	}
	l.nodes = c.nodes
	return nil
}

// FromNodes is the list of nodes (as Nodes returned them, from another
// node: every node is checked).
func FromNodes(nodes []Node) (*List, error) {
	if len(nodes) > NodesMax {
		return nil, fmt.Errorf("%w: %d nodes", ErrBadNode, len(nodes))
	}
	next := map[uint64]Node{}
	for _, n := range nodes {
		if err := Validate(n); err != nil {
			return nil, err
		}
		if _, ok := stateNames[n.State]; !ok {
			return nil, fmt.Errorf("%w: node %d", ErrBadState, n.ID)
		}
		if _, dup := next[n.ID]; dup {
			return nil, fmt.Errorf("%w: id %d listed twice", ErrBadNode, n.ID)
		}
		next[n.ID] = n
	}
	return &List{nodes: next}, nil
}
