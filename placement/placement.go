// Package placement decides where a region's range replicas and range
// leaders go. It is a pure, deterministic core (DESIGN.md: cores decide,
// drivers do the I/O): its inputs are a snapshot of the region (nodes with
// their zone and state, ranges with their replicas, leader and size, the
// moves already under way); its outputs are the next steps to take
// (replica moves, leadership transfers). The same snapshot always gives the
// same answer, so a planner's decisions can be replayed and tested without
// a cluster.
//
// The rules, in order of priority:
//
//  1. Repair. A range with more voters than its replication factor (two
//     moves of it that overlapped, or one made by hand) loses one: the
//     one on a dead or decommissioned node, else on a draining one, else
//     on the live node holding the most replicas (a voter in a doubled
//     zone first, the range's leader last: its removal hands leadership
//     off first), never going below the factor. A range with a replica on
//     a dead or decommissioned node, or with fewer replicas than its
//     replication factor, gets a replacement; the ranges with the fewest
//     live replicas go first.
//  2. Drain. A replica on a draining node moves to a live one.
//  3. Spread. A range whose replicas span fewer zones than the live nodes
//     offer moves a replica out of a doubled zone into an unused one.
//  4. Balance. While the live node holding the most replicas holds more
//     than its share (the mean rounded up) and another holds less than its
//     share (the mean rounded down), one replica moves from the first to
//     the second, never onto a node of a zone the range already uses if
//     that lowers the number of zones its replicas span.
//
// Targets are chosen by: zones the range does not use yet first, then the
// fewest replicas, then the fewest bytes, then the lowest node id. A range
// takes part in at most one move per plan, and none while a move of it is
// under way; a plan holds at most Config.MovesMax moves (the bound on
// concurrent moves). Leaders are balanced separately (LeaderTransfers).
package placement

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// NodeState is a node's state in the region's membership.
type NodeState uint8

const (
	// Live nodes take new replicas and leaders.
	Live NodeState = iota
	// Draining nodes keep serving what they hold while it moves away;
	// they take nothing new.
	Draining
	// Decommissioned nodes hold nothing: what they held is repaired
	// elsewhere at once.
	Decommissioned
	// Dead nodes have been unreachable for longer than the dead-node
	// time: what they held is repaired elsewhere.
	Dead
)

var stateNames = [...]string{"live", "draining", "decommissioned", "dead"}

func (s NodeState) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("NodeState(%d)", uint8(s))
}

// Node is one member of a region.
type Node struct {
	ID    uint64
	Zone  string
	State NodeState
	// Unreachable: the node is down now, but not for the dead-node time
	// yet (Loop.Overlay sets it). It keeps its replicas (they are not
	// repaired) and counts in the balance, but takes no new replica nor
	// leadership: a learner there could not catch up, and its move would
	// hold the range, and one of the moves allowed, until it timed out.
	Unreachable bool
}

// RangeID names a range of a stream.
type RangeID struct {
	Stream string
	Range  uint32
}

func (r RangeID) String() string { return fmt.Sprintf("%s/%d", r.Stream, r.Range) }

// Range is one range's placement: its replicas (node ids), its leader (0:
// none known), its size and its replication factor.
type Range struct {
	ID                RangeID
	Replicas          []uint64
	Leader            uint64
	SizeBytes         int64
	ReplicationFactor int
	// Learners are the range's learners (a move's new replica catching
	// up); the planner does not count them as replicas.
	Learners []uint64
	// Moving says that a move of this range is under way (planned earlier,
	// not finished): the planner leaves it alone.
	Moving bool
}

// Region is the snapshot a plan is made from.
type Region struct {
	Nodes  []Node
	Ranges []Range
}

// Config bounds a plan.
type Config struct {
	// MovesMax bounds the moves in one plan (and so, with Range.Moving,
	// the moves under way at once); at least 1.
	MovesMax int
}

// Reason says why a move was planned.
type Reason uint8

const (
	// Repair replaces a replica on a dead or decommissioned node, or adds
	// a missing one.
	Repair Reason = iota
	// Drain moves a replica off a draining node.
	Drain
	// Spread moves a replica into a zone the range does not use yet.
	Spread
	// Balance evens out the replicas per node.
	Balance
	// Excess removes a voter beyond the range's replication factor (a
	// move with no To).
	Excess
)

var reasonNames = [...]string{"repair", "drain", "spread", "balance", "excess"}

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// Move replaces one replica of a range: add To (as a learner that catches
// up, then a voter), then remove From (0: nothing to remove, a missing
// replica is added). A move with To 0 (Reason Excess) only removes From,
// a voter beyond the range's replication factor.
type Move struct {
	Range  RangeID
	From   uint64
	To     uint64
	Reason Reason
}

// ErrNotEnoughNodes is returned when fewer live nodes than a replication
// factor can take a range.
var ErrNotEnoughNodes = errors.New("placement: not enough live nodes")

// load is the planner's running view of where replicas are.
type load struct {
	nodes    map[uint64]Node
	replicas map[uint64]int
	bytes    map[uint64]int64
	leaders  map[uint64]int
	live     []uint64 // live node ids, ascending
}

func newLoad(reg Region) *load {
	l := &load{nodes: map[uint64]Node{}, replicas: map[uint64]int{}, bytes: map[uint64]int64{}, leaders: map[uint64]int{}}
	for _, n := range reg.Nodes {
		l.nodes[n.ID] = n
		if n.State == Live {
			l.live = append(l.live, n.ID)
		}
	}
	slices.Sort(l.live)
	for _, r := range reg.Ranges {
		for _, id := range r.Replicas {
			l.replicas[id]++
			l.bytes[id] += r.SizeBytes
		}
		if r.Leader != 0 {
			l.leaders[r.Leader]++
		}
	}
	return l
}

// state returns the state of node id; a node the region does not list is
// taken as dead (its replicas are repaired).
func (l *load) state(id uint64) NodeState {
	if n, ok := l.nodes[id]; ok {
		return n.State
	}
	return Dead
}

// zones returns the zones of the nodes in ids (skipping skip).
func (l *load) zones(ids []uint64, skip uint64) map[string]bool {
	z := map[string]bool{}
	for _, id := range ids {
		if id != skip {
			z[l.nodes[id].Zone] = true
		}
	}
	return z
}

// target returns the best live node for a replica of a range whose other
// replicas are on others (see the package doc), or 0 if none can take it.
// exclude are nodes that may not take it.
func (l *load) target(others []uint64, exclude ...uint64) uint64 {
	used := l.zones(others, 0)
	var best uint64
	better := func(a, b uint64) bool { // is a a better target than b?
		if c := cmp.Compare(boolInt(used[l.nodes[a].Zone]), boolInt(used[l.nodes[b].Zone])); c != 0 {
			return c < 0
		}
		if c := cmp.Compare(l.replicas[a], l.replicas[b]); c != 0 {
			return c < 0
		}
		if c := cmp.Compare(l.bytes[a], l.bytes[b]); c != 0 {
			return c < 0
		}
		return a < b
	}
	for _, id := range l.live {
		if slices.Contains(others, id) || slices.Contains(exclude, id) || l.nodes[id].Unreachable {
			continue
		}
		if best == 0 || better(id, best) {
			best = id
		}
	}
	return best
}

// move records in l that a replica of size bytes moves from one node to
// another (either may be 0).
func (l *load) move(from, to uint64, size int64) {
	if from != 0 {
		l.replicas[from]--
		l.bytes[from] -= size
	}
	if to != 0 {
		l.replicas[to]++
		l.bytes[to] += size
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Choose returns the nodes for a new range of replication factor rf, given
// the region as it is: rf distinct live nodes, spread over zones first,
// then the least loaded (see the package doc). Fewer than rf live nodes
// give ErrNotEnoughNodes.
func Choose(reg Region, rf int) ([]uint64, error) {
	if rf < 1 {
		return nil, fmt.Errorf("placement: replication factor %d", rf)
	}
	l := newLoad(reg)
	if len(l.live) < rf {
		return nil, fmt.Errorf("%w: %d live, replication factor %d", ErrNotEnoughNodes, len(l.live), rf)
	}
	var chosen []uint64
	for len(chosen) < rf {
		id := l.target(chosen)
		chosen = append(chosen, id)
		l.move(0, id, 0)
	}
	return chosen, nil
}

// ChooseEach returns the nodes of count new ranges of replication factor
// rf, chosen one range after the other as Choose does, each seeing the
// replicas the ones before it took: a new stream's ranges spread over the
// live nodes instead of all landing on the least loaded few.
func ChooseEach(reg Region, rf, count int) ([][]uint64, error) {
	if rf < 1 {
		return nil, fmt.Errorf("placement: replication factor %d", rf)
	}
	l := newLoad(reg)
	if len(l.live) < rf {
		return nil, fmt.Errorf("%w: %d live, replication factor %d", ErrNotEnoughNodes, len(l.live), rf)
	}
	out := make([][]uint64, count)
	for i := range out {
		for len(out[i]) < rf {
			id := l.target(out[i])
			out[i] = append(out[i], id)
			l.move(0, id, 0)
		}
	}
	return out, nil
}
