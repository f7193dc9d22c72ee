package placement

import (
	"cmp"
	"math"
	"slices"
)

// Plan returns the next replica moves for reg, at most cfg.MovesMax, in the
// order of the package doc's rules: repairs (an excess voter removed
// first), then drains, then balance.
// Applying every move of a plan and planning again converges: each balance
// move narrows the gap between the fullest and the emptiest live node, and
// a plan is empty once the replicas per live node differ by at most one
// (or no allowed move narrows it further).
func Plan(reg Region, cfg Config) []Move {
	p := &planner{l: newLoad(reg), max: max(cfg.MovesMax, 1), touched: map[RangeID]bool{}}
	ranges := slices.Clone(reg.Ranges)
	slices.SortFunc(ranges, func(a, b Range) int { return compareRangeID(a.ID, b.ID) })
	for _, r := range ranges {
		if r.Moving {
			p.touched[r.ID] = true
		}
	}
	p.excess(ranges)
	p.repair(ranges)
	p.drain(ranges)
	p.spread(ranges)
	p.balance(ranges)
	return p.moves
}

type planner struct {
	l       *load
	max     int
	moves   []Move
	touched map[RangeID]bool
}

func (p *planner) full() bool { return len(p.moves) >= p.max }

func (p *planner) add(r Range, from, to uint64, why Reason) {
	p.moves = append(p.moves, Move{Range: r.ID, From: from, To: to, Reason: why})
	p.touched[r.ID] = true
	p.l.move(from, to, r.SizeBytes)
}

func compareRangeID(a, b RangeID) int {
	if c := cmp.Compare(a.Stream, b.Stream); c != 0 {
		return c
	}
	return cmp.Compare(a.Range, b.Range)
}

// liveReplicas counts r's replicas on live or draining nodes (the ones that
// still serve).
func (l *load) liveReplicas(r Range) int {
	n := 0
	for _, id := range r.Replicas {
		if s := l.state(id); s == Live || s == Draining {
			n++
		}
	}
	return n
}

// excess removes one voter of each range that holds more than its
// replication factor (never going below it): which one, excessVoter says.
func (p *planner) excess(ranges []Range) {
	for _, r := range ranges {
		if p.full() {
			return
		}
		if p.touched[r.ID] || r.ReplicationFactor < 1 || len(r.Replicas) <= r.ReplicationFactor {
			continue
		}
		if from := p.l.excessVoter(r); from != 0 {
			p.add(r, from, 0, Excess)
		}
	}
}

// excessVoter returns the voter of r to remove first: one on a dead or
// decommissioned node, then on a draining one, then on a live one; among
// those, not r's leader (its removal hands leadership off first, a pause
// the others do not cost), then one in a zone holding two or more of r's
// voters, then the node holding the most replicas, then the highest id.
func (l *load) excessVoter(r Range) uint64 {
	perZone := map[string]int{}
	for _, id := range r.Replicas {
		perZone[l.nodes[id].Zone]++
	}
	stateRank := func(id uint64) int {
		switch l.state(id) {
		case Dead, Decommissioned:
			return 0
		case Draining:
			return 1
		}
		return 2
	}
	// key orders candidates: the smallest key goes.
	key := func(id uint64) []int64 {
		return []int64{int64(stateRank(id)), int64(boolInt(id == r.Leader)), int64(boolInt(perZone[l.nodes[id].Zone] < 2)),
			-int64(l.replicas[id]), -int64(id)}
	}
	var best uint64
	for _, id := range r.Replicas {
		if best == 0 || slices.Compare(key(id), key(best)) < 0 {
			best = id
		}
	}
	return best
}

// repair replaces replicas on dead or decommissioned nodes and adds
// missing ones, the ranges with the fewest serving replicas first.
func (p *planner) repair(ranges []Range) {
	var need []Range
	for _, r := range ranges {
		if !p.touched[r.ID] && (p.l.liveReplicas(r) < len(r.Replicas) || len(r.Replicas) < r.ReplicationFactor) {
			need = append(need, r)
		}
	}
	slices.SortStableFunc(need, func(a, b Range) int { return cmp.Compare(p.l.liveReplicas(a), p.l.liveReplicas(b)) })
	for _, r := range need {
		if p.full() {
			return
		}
		var from uint64
		for _, id := range r.Replicas {
			if s := p.l.state(id); s == Dead || s == Decommissioned {
				from = id
				break
			}
		}
		if from == 0 && len(r.Replicas) >= r.ReplicationFactor {
			continue
		}
		others := without(r.Replicas, from)
		if to := p.l.target(others, from); to != 0 {
			p.add(r, from, to, Repair)
		}
	}
}

// drain moves replicas off draining nodes.
func (p *planner) drain(ranges []Range) {
	for _, r := range ranges {
		if p.full() {
			return
		}
		if p.touched[r.ID] {
			continue
		}
		for _, id := range r.Replicas {
			if p.l.state(id) != Draining {
				continue
			}
			if to := p.l.target(without(r.Replicas, id), id); to != 0 {
				p.add(r, id, to, Drain)
			}
			break
		}
	}
}

// spread moves a replica out of a zone that holds two of a range's replicas
// into a zone it does not use, for ranges that span fewer zones than the
// live nodes offer (placed before a zone joined, or repaired when only one
// zone had room).
func (p *planner) spread(ranges []Range) {
	zones := map[string]bool{}
	for _, id := range p.l.live {
		zones[p.l.nodes[id].Zone] = true
	}
	for _, r := range ranges {
		if p.full() {
			return
		}
		used := p.l.zones(r.Replicas, 0)
		if p.touched[r.ID] || len(used) >= min(len(r.Replicas), len(zones)) {
			continue
		}
		from := p.l.doubled(r.Replicas)
		if from == 0 {
			continue
		}
		if to := p.l.target(without(r.Replicas, from), from); to != 0 && !used[p.l.nodes[to].Zone] {
			p.add(r, from, to, Spread)
		}
	}
}

// doubled returns, among ids, the replica with the most replicas (then
// the highest id) in a zone that holds two or more of ids (0 if none).
func (l *load) doubled(ids []uint64) uint64 {
	per := map[string]int{}
	for _, id := range ids {
		per[l.nodes[id].Zone]++
	}
	var best uint64
	for _, id := range ids {
		if per[l.nodes[id].Zone] < 2 {
			continue
		}
		if best == 0 || l.replicas[id] > l.replicas[best] || (l.replicas[id] == l.replicas[best] && id > best) {
			best = id
		}
	}
	return best
}

// balance moves replicas from the fullest live nodes to the emptiest while
// they differ by two or more.
func (p *planner) balance(ranges []Range) {
	for !p.full() && p.balanceOne(ranges) {
	}
}

// balanceOne plans one balance move, if an allowed one narrows the gap.
func (p *planner) balanceOne(ranges []Range) bool {
	byLoad := slices.Clone(p.l.live)
	slices.SortStableFunc(byLoad, func(a, b uint64) int { return cmp.Compare(p.l.replicas[b], p.l.replicas[a]) })
	for _, src := range byLoad {
		for i := len(byLoad) - 1; i >= 0; i-- {
			dst := byLoad[i]
			if p.l.replicas[src]-p.l.replicas[dst] < 2 {
				break
			}
			if p.l.nodes[dst].Unreachable {
				continue
			}
			if r, ok := p.movable(ranges, src, dst); ok {
				p.add(r, src, dst, Balance)
				return true
			}
		}
	}
	return false
}

// movable returns a range (the first by id) with a replica on src and none
// on dst whose move from src to dst spans no fewer zones.
func (p *planner) movable(ranges []Range, src, dst uint64) (Range, bool) {
	for _, r := range ranges {
		if p.touched[r.ID] || !slices.Contains(r.Replicas, src) || slices.Contains(r.Replicas, dst) {
			continue
		}
		before := len(p.l.zones(r.Replicas, 0))
		after := p.l.zones(r.Replicas, src)
		after[p.l.nodes[dst].Zone] = true
		if len(after) >= before {
			return r, true
		}
	}
	return Range{}, false
}

// without returns ids without id (a new slice).
func without(ids []uint64, id uint64) []uint64 {
	out := make([]uint64, 0, len(ids))
	for _, x := range ids {
		if x != id {
			out = append(out, x)
		}
	}
	return out
}

// Transfer moves a range's leadership from one replica to another.
type Transfer struct {
	Range RangeID
	From  uint64
	To    uint64
}

// LeaderTransfers returns at most transfersMax leadership transfers for
// reg: first away from nodes that are not live (draining), then from the
// live node leading the most ranges to a replica of the range on a live
// node leading at least two fewer, until no transfer narrows the gap. A
// transfer only goes to a replica of the range, so leaders end as even as
// the replicas' placement allows.
func LeaderTransfers(reg Region, transfersMax int) []Transfer {
	l := newLoad(reg)
	ranges := slices.Clone(reg.Ranges)
	slices.SortFunc(ranges, func(a, b Range) int { return compareRangeID(a.ID, b.ID) })
	var out []Transfer
	done := map[RangeID]bool{}
	transfer := func(r Range, to uint64) {
		out = append(out, Transfer{Range: r.ID, From: r.Leader, To: to})
		l.leaders[r.Leader]--
		l.leaders[to]++
		done[r.ID] = true
	}
	for _, r := range ranges {
		if len(out) >= transfersMax {
			return out
		}
		if r.Leader != 0 && !r.Moving && l.state(r.Leader) != Live {
			if to := l.leastLeading(r.Replicas, math.MaxInt); to != 0 {
				transfer(r, to)
			}
		}
	}
	for len(out) < transfersMax {
		r, to, ok := l.leaderMove(ranges, done)
		if !ok {
			break
		}
		transfer(r, to)
	}
	return out
}

// leastLeading returns the live node among ids leading the fewest ranges,
// if it leads fewer than below (0 if none).
func (l *load) leastLeading(ids []uint64, below int) uint64 {
	var best uint64
	for _, id := range ids {
		if l.state(id) != Live || l.nodes[id].Unreachable || l.leaders[id] >= below {
			continue
		}
		if best == 0 || l.leaders[id] < l.leaders[best] || (l.leaders[id] == l.leaders[best] && id < best) {
			best = id
		}
	}
	return best
}

// leaderMove finds one transfer from the live node leading the most ranges
// that narrows the gap, trying the fullest leaders first.
func (l *load) leaderMove(ranges []Range, done map[RangeID]bool) (Range, uint64, bool) {
	byLeaders := slices.Clone(l.live)
	slices.SortStableFunc(byLeaders, func(a, b uint64) int { return cmp.Compare(l.leaders[b], l.leaders[a]) })
	for _, src := range byLeaders {
		for _, r := range ranges {
			if r.Leader != src || r.Moving || done[r.ID] {
				continue
			}
			if to := l.leastLeading(r.Replicas, l.leaders[src]-1); to != 0 {
				return r, to, true
			}
		}
	}
	return Range{}, 0, false
}
