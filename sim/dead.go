package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Dead nodes and decommissions (one-region runs with moves, one in two;
// notes/simdead.md).
//
// The run's dead-node time (regionsvc's RebalanceConfig.DeadNodeAfter,
// geologd's --dead-node-time; 5 min by default) is scaled to the
// simulator's seconds: deadAfterMs, 500-1500 virtual ms. The rebalancer's
// core (placement.Loop) observes a node down while the rebalancer node's
// failure detector finds it down (moves.go observeDown: a crash found a
// backoff later, a cut a keepalive and a handshake timeout later; a node
// cut off long enough is taken as dead while it still runs). At a random
// time one of the first Nodes nodes dies: its process stops for longer
// than the dead-node time and then starts again on its disk (a stray
// comes back: its configuration still names it a voter of the ranges
// the planner repaired elsewhere), or, one run in three when the region
// keeps RF nodes without it, it never comes back. Faults go on meanwhile.
//
// One run in two decommissions the drained node: the operator's
// SetNodeState(DECOMMISSIONED), which regionsvc refuses while the node
// still holds replicas (rebalance_admin.go), is accepted once no range's
// latest configuration names it and no move involves it; the catalogue
// then lists it decommissioned (what the planner is given), and its
// process stops for good 0-3 s later (or, one time in two, runs on).
//
// Checks: no move (the planner's or an operator's) starts onto a
// decommissioned node or onto one the loop takes as dead; at the end
// every range has RF voters, none on a node that stopped for good or was
// decommissioned, every one up, and each holds the whole log; the moves'
// checks (no replica acks an append of a range it was removed from, one
// change per range at a time, RF to RF+1 voters) go on throughout, across
// the stray's return.

const (
	deadAfterMsMin = 500  // the run's dead-node time, at least
	deadAfterMsAdd = 1000 // ... plus up to this
	deadStopMsMax  = 3000 // a decommissioned node stops within this
)

// deadWorld is the dead node and the decommission of one run.
type deadWorld struct {
	on      bool
	rng     *rand.Rand
	afterMs int64 // the dead-node time
	at      int64 // when the node dies
	downMs  int64 // how long it stays down (forever: math.MaxInt64)
	forever bool
	id      int // the dead node (0: not dead yet)
	// drainID is the node to drain (and, with decomm, decommission),
	// drawn here so that the dead node is another.
	drainID int
	decomm  bool
	// decommissioned is the node the catalogue lists decommissioned (0:
	// none yet); it stops at stopAt.
	decommissioned int
	stopAt         int64
	// gone are the nodes stopped for good.
	gone     map[int]bool
	returned bool
}

// drawDead draws the run's dead node and decommission, from a generator
// of their own (the runs without stay as they were). It may add a spare,
// so that the region keeps RF live nodes.
func (m *moveWorld) drawDead() {
	w := m.w
	d := &m.dead
	d.rng = rand.New(rand.NewPCG(uint64(w.opt.Seed), 0x64656164))
	d.gone = map[int]bool{}
	d.on = d.rng.IntN(2) == 0 || w.opt.mut.deadAlways
	if !d.on {
		return
	}
	steps := int64(w.opt.Steps)
	d.afterMs = deadAfterMsMin + d.rng.Int64N(deadAfterMsAdd)
	d.at = 200 + d.rng.Int64N(max(steps/3, 1))
	d.downMs = d.afterMs + 300 + d.rng.Int64N(2500)
	d.drainID = 1 + d.rng.IntN(w.opt.Nodes)
	d.decomm = d.rng.IntN(2) == 0 || w.opt.mut.decommAlways
	if d.decomm && d.rng.IntN(2) == 0 {
		// After the drain (which the decommission follows), so that its
		// repairs come while the catalogue lists a node decommissioned.
		d.at = m.drainAt + 1000 + d.rng.Int64N(max(steps/3, 1))
	}
	d.forever = d.rng.IntN(3) == 0 || w.opt.mut.deadForever
	if d.forever {
		d.downMs = math.MaxInt64
		// The region must keep RF live nodes that are not draining:
		// Nodes + spares, less the dead node and the drained one (the
		// one decommissioned, if any).
		if w.opt.Nodes+m.res.Spares-2 < m.rf {
			m.res.Spares++
			w.perRegion++
			m.joinAt = append(m.joinAt, 100+d.rng.Int64N(max(steps/2, 1)))
		}
	}
	m.loop = m.newPlacementLoop(time.Duration(d.afterMs) * time.Millisecond)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// drainNode is the node to drain now: the one drawn with the dead node,
// or else one of the first Nodes at random (as before dead nodes).
func (m *moveWorld) drainNode() int {
	if m.dead.on {
		return m.dead.drainID
	}
	return 1 + m.rng.IntN(m.w.opt.Nodes)
}

// stepDead kills the dead node when its time comes, decommissions the
// drained node once it is empty and stops it later.
func (m *moveWorld) stepDead() {
	w, d := m.w, &m.dead
	if !d.on {
		return
	}
	if d.id == 0 && w.now >= d.at {
		var ids []int
		for id := 1; id <= w.opt.Nodes; id++ {
			if id != d.drainID {
				ids = append(ids, id)
			}
		}
		d.id = ids[d.rng.IntN(len(ids))]
		m.stopFor(w.node(0, d.id), d.downMs)
		d.gone[d.id] = d.forever
		m.res.DeadNodes++
		if d.forever {
			m.res.DeadForever++
		}
		w.tracef("node %d: dies for %d ms (dead-node time %d ms)", d.id, d.downMs, d.afterMs)
	}
	if d.decomm && d.decommissioned == 0 && m.drained != 0 && m.empty(uint64(m.drained)) {
		d.decommissioned, d.stopAt = m.drained, w.now+d.rng.Int64N(deadStopMsMax)
		if d.rng.IntN(2) == 0 {
			d.stopAt = math.MaxInt64 // its process runs on
		}
		m.res.Decommissioned++
		w.tracef("node %d: decommissioned", m.drained)
	}
	if d.decommissioned != 0 && !d.gone[d.decommissioned] && w.now >= d.stopAt {
		m.stopFor(w.node(0, d.decommissioned), math.MaxInt64)
		d.gone[d.decommissioned] = true
		w.tracef("node %d: stops for good (decommissioned)", d.decommissioned)
	}
}

// stopFor stops node n's process for downMs (math.MaxInt64: for good).
func (m *moveWorld) stopFor(n *node, downMs int64) {
	if n.up {
		m.w.crash(n)
	}
	n.downTill = math.MaxInt64
	if downMs != math.MaxInt64 {
		n.downTill = m.w.now + downMs
	}
}

// empty reports whether no range's latest configuration names node id
// and no move involves it (regionsvc accepts its decommission then).
func (m *moveWorld) empty(id uint64) bool {
	for _, conf := range m.conf {
		if slices.Contains(conf.GetVoters(), id) || slices.Contains(conf.GetLearners(), id) {
			return false
		}
	}
	return !slices.ContainsFunc(m.moves, func(mv *move) bool { return mv.from == id || mv.to == id })
}

// gone reports whether node n stopped for good (dead for ever, or
// decommissioned): heal leaves it down.
func (m *moveWorld) gone(n *node) bool { return n.region == 0 && m.dead.gone[n.id] }

// deadBusy: the dead node not dead yet, or down and to come back, or a
// decommission drawn whose drain has not emptied the node, or whose
// node has yet to stop.
func (m *moveWorld) deadBusy() bool {
	d := &m.dead
	switch {
	case !d.on:
		return false
	case d.id == 0 || (!d.forever && !m.w.node(0, d.id).up):
		return true
	}
	return m.drained != 0 && d.decomm && (d.decommissioned == 0 || (d.stopAt != math.MaxInt64 && !d.gone[d.decommissioned]))
}

// checkTarget: no move starts onto a decommissioned node, nor onto one
// the loop takes as dead.
func (m *moveWorld) checkTarget(r int, to uint64, kind string) error {
	if to == 0 {
		return nil
	}
	if int(to) == m.dead.decommissioned {
		return fmt.Errorf("range %d: %s move onto node %d, which is decommissioned", r, kind, to)
	}
	since, down := m.downSince[to]
	switch {
	case down && m.w.now-since >= m.deadAfterMs:
		return fmt.Errorf("range %d: %s move onto node %d, which the rebalancer takes as dead (unreachable for %d ms)", r, kind, to, m.w.now-since)
	case down && kind != "operator" && !m.w.opt.mut.targetUnchecked:
		// The rebalancer's own move onto a node its transport finds down:
		// the learner cannot catch up, and the move holds its range (and
		// one of MovesMax) until MoveTimeout.
		return fmt.Errorf("range %d: %s move onto node %d, which the rebalancer finds unreachable (for %d ms)", r, kind, to, m.w.now-since)
	}
	return nil
}

// finalDead: no range ends with a replica on a node stopped for good or
// decommissioned, nor on one that is down.
func (m *moveWorld) finalDead() error {
	for r, conf := range m.conf {
		for _, id := range slices.Concat(conf.GetVoters(), conf.GetLearners()) {
			n := m.w.node(0, int(id))
			switch {
			case int(id) == m.dead.decommissioned:
				return fmt.Errorf("range %d: ends with voters %v, the decommissioned node %d among them", r, conf.GetVoters(), id)
			case m.dead.gone[int(id)]:
				return fmt.Errorf("range %d: ends with voters %v, node %d among them, dead since %d ms", r, conf.GetVoters(), id, m.dead.at)
			case !n.up:
				return fmt.Errorf("range %d: ends with voters %v, node %d among them down", r, conf.GetVoters(), id)
			}
		}
	}
	return nil
}
