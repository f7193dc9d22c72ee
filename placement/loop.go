package placement

import (
	"slices"
	"time"
)

// Loop is the rebalancer's decision core (regionsvc/rebalance.go drives
// it): it keeps the moves under way and how long each node has been
// unreachable, and from a snapshot of the region says which moves to start
// next. It is deterministic: time comes in as arguments, nothing runs on
// its own, and the same calls give the same answers.
//
// The driver contract:
//
//  1. Call Observe on every round with the nodes the transport finds down
//     (on every node, leader of the catalogue or not), so a node's
//     unreachable time is known when leadership arrives.
//  2. On the catalogue leader, take a snapshot (the ranges' current voters
//     and learners) and call Next; start each returned move, and each
//     returned learner removal, and report each one's end with Done.
//  3. When this node stops leading the catalogue, cancel the moves and
//     call Reset: the next leader finds them in the ranges' Raft
//     configurations (a learner left behind is removed, and the planner
//     plans again from the voters). Keep reporting each cancelled move's
//     end with Done, whichever leadership it belonged to: until then its
//     range takes no new move here (a cancelled move may still have a
//     membership change on its way, and a second move of the same range
//     started beside it is how a range ended with four voters).
type Loop struct {
	cfg       LoopConfig
	downSince map[uint64]time.Time
	inflight  map[RangeID]Move
	cleanups  map[RangeID]Cleanup
	// cancelled are the ranges whose move or cleanup Reset cancelled and
	// whose end Done has not reported yet.
	cancelled map[RangeID]bool
}

// LoopConfig configures a Loop.
type LoopConfig struct {
	// MovesMax bounds the moves (and learner removals) under way at once;
	// at least 1.
	MovesMax int
	// DeadAfter is how long a node must be unreachable before it is taken
	// as dead (its replicas repaired elsewhere, new ranges avoid it).
	DeadAfter time.Duration
}

// Cleanup removes a learner that no move under way owns (a move of an
// earlier leader, cut short).
type Cleanup struct {
	Range   RangeID
	Learner uint64
}

// NewLoop returns a Loop with nothing under way.
func NewLoop(cfg LoopConfig) *Loop {
	cfg.MovesMax = max(cfg.MovesMax, 1)
	return &Loop{cfg: cfg, downSince: map[uint64]time.Time{}, inflight: map[RangeID]Move{}, cleanups: map[RangeID]Cleanup{},
		cancelled: map[RangeID]bool{}}
}

// Observe records which nodes are unreachable now; a node found reachable
// again starts from zero.
func (l *Loop) Observe(now time.Time, down map[uint64]bool) {
	for id := range l.downSince {
		if !down[id] {
			delete(l.downSince, id)
		}
	}
	for id, d := range down {
		if _, ok := l.downSince[id]; d && !ok {
			l.downSince[id] = now
		}
	}
}

// Unreachable returns how long node id has been unreachable (0: reachable).
func (l *Loop) Unreachable(now time.Time, id uint64) time.Duration {
	if t, ok := l.downSince[id]; ok {
		return now.Sub(t)
	}
	return 0
}

// Dead returns the nodes unreachable for at least DeadAfter, ascending.
func (l *Loop) Dead(now time.Time) []uint64 {
	var out []uint64
	for id, t := range l.downSince {
		if now.Sub(t) >= l.cfg.DeadAfter {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// Next returns the moves and learner removals to start now, given reg
// with the ranges' current voters (Replicas) and learners: the dead nodes
// (Dead) are marked so in reg's node list (live or draining nodes only;
// a decommissioned one stays so), the others found down now Unreachable
// (no move goes to them), ranges under way are left alone, and
// the count returned keeps what is under way within MovesMax, and the
// moves under way count as done (their ranges' replicas as they will be).
// A range with
// a learner that nothing under way owns gets a Cleanup instead of a move.
// A range whose cancelled move has not ended yet (Reset, then no Done)
// takes nothing, and those moves count against MovesMax too.
func (l *Loop) Next(now time.Time, reg Region) ([]Move, []Cleanup) {
	reg = l.Overlay(now, reg)
	free := l.cfg.MovesMax - l.Busy() - len(l.cancelled)
	var cleanups []Cleanup
	for i := range reg.Ranges {
		r := &reg.Ranges[i]
		m, moving := l.inflight[r.ID]
		_, cleaning := l.cleanups[r.ID]
		if moving {
			// Count the move as done: a learner is no replica yet and
			// the old replica still is, so a plan from the snapshot as
			// it is would send more replicas to the move's target than
			// the balance needs.
			r.Replicas = without(r.Replicas, m.From)
			if m.To != 0 {
				r.Replicas = append(r.Replicas, m.To)
			}
			r.Replicas = slices.Compact(slices.Sorted(slices.Values(r.Replicas)))
		}
		r.Moving = r.Moving || moving || cleaning || l.cancelled[r.ID]
		if !r.Moving && len(r.Learners) > 0 {
			r.Moving = true
			if free > 0 {
				c := Cleanup{Range: r.ID, Learner: r.Learners[0]}
				l.cleanups[r.ID] = c
				cleanups = append(cleanups, c)
				free--
			}
		}
	}
	if free <= 0 {
		return nil, cleanups
	}
	moves := Plan(reg, Config{MovesMax: free})
	for _, m := range moves {
		l.inflight[m.Range] = m
	}
	return moves, cleanups
}

// Overlay returns reg with the dead nodes' state set to Dead and the
// other nodes unreachable now marked Unreachable (no target of a move).
func (l *Loop) Overlay(now time.Time, reg Region) Region {
	dead := l.Dead(now)
	reg.Nodes = slices.Clone(reg.Nodes)
	for i, n := range reg.Nodes {
		if slices.Contains(dead, n.ID) && (n.State == Live || n.State == Draining) {
			reg.Nodes[i].State = Dead
		}
		if _, down := l.downSince[n.ID]; down {
			reg.Nodes[i].Unreachable = true
		}
	}
	reg.Ranges = slices.Clone(reg.Ranges)
	return reg
}

// Done records that the move or cleanup of range id ended (either way:
// a failed one is planned again from the next snapshot), whether it was
// started before the last Reset or after.
func (l *Loop) Done(id RangeID) {
	delete(l.inflight, id)
	delete(l.cleanups, id)
	delete(l.cancelled, id)
}

// Reset forgets every move and cleanup under way (leadership moved): their
// slots and what they would change are forgotten, but their ranges stay
// off limits until Done reports each one's end.
func (l *Loop) Reset() {
	for id := range l.inflight {
		l.cancelled[id] = true
	}
	for id := range l.cleanups {
		l.cancelled[id] = true
	}
	clear(l.inflight)
	clear(l.cleanups)
}

// Cancelled returns how many moves and cleanups Reset cancelled whose end
// Done has not reported yet.
func (l *Loop) Cancelled() int { return len(l.cancelled) }

// InFlight returns the moves under way, in range order.
func (l *Loop) InFlight() []Move {
	out := make([]Move, 0, len(l.inflight))
	for _, m := range l.inflight {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Move) int { return compareRangeID(a.Range, b.Range) })
	return out
}

// Busy returns the moves and cleanups under way.
func (l *Loop) Busy() int { return len(l.inflight) + len(l.cleanups) }
