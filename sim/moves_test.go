package sim

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"go.etcd.io/raft/v3/raftpb"
)

// TestMovesSeeds: runs of one region with spares that join, a drained
// node, planner and operator moves carried out by internal/replicamove
// (moves.go) are clean, move replicas, and replay exactly.
func TestMovesSeeds(t *testing.T) {
	var tot MoveResult
	for seed := int64(1); seed <= 4; seed++ {
		res, err := Run(Options{Seed: seed, Steps: 3000, Regions: 1, mut: mutations{movesAlways: true}})
		if err != nil {
			t.Fatalf("%v\n%v", err, res)
		}
		tot = tot.add(res.Moves)
	}
	t.Log(tot)
	if tot.Joined == 0 || tot.Drained == 0 || tot.Done == 0 || tot.HandOffs == 0 || tot.AimedCrashes == 0 || tot.AimedPartition == 0 {
		t.Fatalf("moves went unexercised: %v", tot)
	}
	a, errA := Run(Options{Seed: 2, Steps: 1500, Regions: 1, mut: mutations{movesAlways: true}})
	b, errB := Run(Options{Seed: 2, Steps: 1500, Regions: 1, mut: mutations{movesAlways: true}})
	if errA != nil || errB != nil || a != b || a.Moves.Changes == 0 {
		t.Fatalf("seed 2 with moves ran differently or moved nothing:\n%v %v\n%v\n%v", errA, errB, a, b)
	}
}

// TestMovesOneChangePerRange: with the rebalancer's one-move-per-range
// rule undone (the planner's snapshot shows no move under way, its moves
// carry no Planned voters), two moves of a range run at once; the check
// of one change asked per range reports it, and without that check the
// configuration checks do.
func TestMovesOneChangePerRange(t *testing.T) {
	for _, c := range []struct {
		mut  mutations
		want string
	}{
		{mutations{movesAlways: true, moveConcurrent: true}, "membership changes asked at once"},
		{mutations{movesAlways: true, moveConcurrent: true, moveAskUnchecked: true, changeUnexpected: true}, "fewer than its replication factor"},
	} {
		_, err := Run(Options{Seed: 1, Steps: 3000, Regions: 1, mut: c.mut})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("seed 1 with %+v: got %v, want an error with %q", c.mut, err, c.want)
		}
	}
}

// TestMovesRemovedReplicaAcks: a replica removed from its range that
// restarts as the only voter of a group of its own (a stray) acks
// appends; the check that a removed replica acks nothing reports it
// (seed 38 is the first that this check, not another, catches since
// publication stopped waiting for lone commit marks, replica's
// relearn.go: node 3 of range 1 acks at offset 41 at 3,033 ms; seed 3
// since the failure detector has the transport's delays, detector.go, and still is
// since the rebalancer asks its own node's detector; seed 9 when
// the replicas came to elect by succession; seeds 14, 2, 5, 18 and 44
// were before: notes/simchildren.md, notes/simdead.md,
// notes/simdriver2.md).
func TestMovesRemovedReplicaAcks(t *testing.T) {
	_, err := Run(Options{Seed: 38, Steps: 3000, Regions: 1, mut: mutations{movesAlways: true, moveStray: true}})
	if err == nil || !strings.Contains(err.Error(), "after its removal from the range") {
		t.Fatalf("got %v, want a removed replica's ack reported", err)
	}
	if _, err := Run(Options{Seed: 38, Steps: 3000, Regions: 1, mut: mutations{movesAlways: true}}); err != nil {
		t.Fatalf("without the mutation: %v", err)
	}
}

// TestMovesStaleDescribe: regionsvc's DescribeReplicas and
// ChangeReplicas used the leader's applied configuration, which may lag
// what its log already commits (a new leader that has not applied its
// predecessors' changes); replicamove.Replace then took a range below its
// replication factor. First found at seed 459 of 3 s with moves in every
// run (node 2 moved off range 0, voters [1 3 4]; the drain move 3 -> 2,
// planned from [1 3 4], asked a new leader whose applied configuration
// still was [1 2 3 4]: StepOf found its target a voter already and the
// Planned check four voters, so it removed node 3: voters [1 4]); with
// today's draws (dead nodes, split children, rangecore.Driver's loop)
// seed 100 of a minute (range 1 left with voters [3 4] at 37,451 ms;
// seeds 92 and 125 before); since the simulator's replicas elect by
// succession seed 988 is the first of 1-1300 (node 5 of range 0 holds
// voters [4 5] at 39,841 ms; seed 500 fails under the mutation with two
// nodes committing different records at one offset); since the failure
// detector has the transport's delays (detector.go) seed 1437 is the
// first of 1-1437 (node 3 of range 1 holds voters [1 4] at 26,871 ms;
// under the mutation seeds 336 and 770 fail with two moves of a range at
// once, 544 with two records acked at one offset, 903 with producers
// still waiting); since the rebalancer asks its own node's detector
// (moves.go observeDown) node 4 of range 1 holds voters [1 4] at 26,841
// ms; since every node's rebalancer probes every member (moves.go
// probeMembers) seed 358 is the first of 1-358 (node 1 of range 1 holds
// voters [1 4] at 30,911 ms); since publication stopped waiting for lone
// commit marks (replica's relearn.go) seed 315 is the first of 1-315
// (node 2 of range 0 holds voters [2 5] at 36,431 ms); seed 396 is the
// first of 1-396 since a relearning leader waits for its term's entry
// (replica's relearn.go) (node 4 of range 0 holds voters [4 5] at
// 50,241 ms; under the mutation seed 341 fails with a removed replica's
// ack). Both now answer after a ReadIndex (admin.go caughtUpLeader), and
// the seed is clean.
func TestMovesStaleDescribe(t *testing.T) {
	_, err := Run(Options{Seed: 396, Steps: 60000, Regions: 1, mut: mutations{describeStale: true}})
	if err == nil || !strings.Contains(err.Error(), "fewer than its replication factor") {
		t.Fatalf("seed 396 with the old Describe and ChangeReplicas: got %v, want a range below its replication factor", err)
	}
	if _, err := Run(Options{Seed: 396, Steps: 60000, Regions: 1}); err != nil {
		t.Fatalf("seed 396 with both after a ReadIndex: %v", err)
	}
}

// TestAddPastFactor: a move cut short between its promotion and its
// removal leaves its range a voter past its replication factor; an
// operator's replace on the range then asks for a learner, which
// regionsvc's ChangeReplicas refuses while the range holds more voters
// than its factor. Without that refusal (addPastFactor) the replace
// takes the range to two voters past its factor, and the configuration
// check reports five voters (the only check that does: the planner
// removes both excess voters afterwards, so the final state is sound).
// First found at seed 766151 of a minute, one region (a repair cut
// short, then an operator's move; TestAddPastFactor pinned that seed
// until the draws moved on and no seed of the scans reached the case:
// notes/addpastfactor.md); the window is now opened on purpose
// (addPastFactorRun), on every seed with two spares (33 of 1-60). The
// test asserts, without the mutation, a clean run in which the
// operator's learner was asked beside four voters and refused, the
// range never past four voters; with it, the five voters reported.
func TestAddPastFactor(t *testing.T) {
	ran := 0
	for seed := int64(1); seed <= 20 && ran < 3; seed++ {
		run, res, err := addPastFactorRun(seed, mutations{})
		if run.skipped {
			continue
		}
		ran++
		if err != nil {
			t.Fatalf("seed %d, the learner refused past the factor: %v\n%v", seed, err, res)
		}
		if run.pastFactor == 0 || run.votersAsked != 4 || run.replaceErr == nil ||
			!strings.Contains(run.replaceErr.Error(), "more than its replication factor 3") {
			t.Fatalf("seed %d: the window was not opened: %d learners asked past the factor, the replace started beside %d voters, ended with %v",
				seed, run.pastFactor, run.votersAsked, run.replaceErr)
		}
		if run.votersMax != 4 || run.cutErr == nil {
			t.Fatalf("seed %d: the range held up to %d voters (want 4: one past the factor, never more); the move cut short ended with %v",
				seed, run.votersMax, run.cutErr)
		}
		t.Logf("seed %d: move cut short at %d ms, the operator's replace started at %d ms and was refused: %v", seed, run.cutAt, run.replaceAt, run.replaceErr)
		run, _, err = addPastFactorRun(seed, mutations{addPastFactor: true})
		if run.pastFactor == 0 {
			t.Fatalf("seed %d, addPastFactor: no learner asked past the factor: %v", seed, err)
		}
		if err == nil || !strings.Contains(err.Error(), "more than its replication factor 3 + 1") {
			t.Fatalf("seed %d, a learner added past the factor: got %v, want five voters reported", seed, err)
		}
		t.Logf("seed %d, addPastFactor: %v", seed, err)
	}
	if ran < 3 {
		t.Fatalf("only %d seeds of 1-20 have two spares", ran)
	}
}

// pastRun is what addPastFactorRun saw of its window.
type pastRun struct {
	skipped bool // the seed has fewer than two spares
	// cutAt: when move A was cut short (its removal asked, never
	// proposed), cutErr what A's replicamove.Replace returned.
	cutAt  int64
	cutErr error
	// replaceAt: when the operator's replace B started, beside
	// votersAsked voters; replaceErr what B returned (nil: none yet, or
	// B done).
	replaceAt   int64
	votersAsked int
	replaceErr  error
	// pastFactor: learners asked of a leader past the factor
	// (moveWorld.pastFactor); votersMax the most voters range r's
	// leader held (until the run's faults end).
	pastFactor, votersMax int
}

// addPastFactorRun runs seed (one region, moves on, two spares or more)
// with range 0 taken a voter past its factor and an operator's replace
// asked on it then, on purpose. No random fault (no loss, duplicate,
// lost reply, crash, partition, fault aimed at a move, dead node, drain,
// split, random operator move); the spares join at 100 ms;
//
//  1. once both spares are up and range 0 has no move, its three voters
//     and no learner: move A, an operator's replace of a voter that does
//     not lead onto a spare s1 (replicamove.Replace, as the CLI runs
//     it), adds s1 as a learner, waits for its catch-up and promotes it;
//  2. when A asks for its source's removal, its context ends
//     (moveWorld.expire, as at moveTimeoutMs): the removal is never
//     proposed, A fails, and the range holds four voters;
//  3. at the step A returns, before the planner can see the range
//     without a move (it would plan the excess voter's removal), move
//     B, an operator's replace of the range's lowest voter onto the
//     other spare s2, starts: it describes four voters and asks for s2
//     as a learner. regionsvc's ChangeReplicas refuses (B fails: "more
//     than its replication factor"), and the planner removes the excess
//     voter afterwards; under addPastFactor the learner is added and
//     promoted: five voters.
func addPastFactorRun(seed int64, mut mutations) (pastRun, Result, error) {
	const (
		r                 = 0
		joinAt, startBy   = 100, 1500
		steps             = 3000
		errSkipPastFactor = "addPastFactorRun: fewer than two spares"
	)
	mut.movesAlways = true
	var (
		run    pastRun
		s1, s2 uint64
		a, b   *move
	)
	res, err := Run(Options{Seed: seed, Steps: steps, Regions: 1, mut: mut,
		tamper: func(w *world) bool {
			m := w.moves
			if w.now == 0 {
				if m.res.Spares < 2 {
					run.skipped = true
					w.err = errors.New(errSkipPastFactor)
					return true
				}
				w.dropP, w.dupP, w.lostReplyP, w.crashP, w.cutP, w.syncCrashP = 0, 0, 0, 0, 0, 0
				m.operatorP = 0
				m.dead.on = false
				m.drainAt = math.MaxInt64
				w.splits.on, w.splits.res.Runs = false, 0
				for _, n := range w.regionNodes(0)[w.opt.Nodes:] {
					n.downTill = joinAt
				}
			}
			for _, mv := range m.moves {
				mv.faultAt = -1 // no fault aimed at a move
			}
			l := w.leaderOf(0, r)
			var conf *raftpb.ConfState
			if l != nil {
				conf = l.replicas[r].Conf()
				run.votersMax = max(run.votersMax, len(conf.GetVoters()))
			}
			run.pastFactor = m.pastFactor
			switch {
			case a == nil:
				if w.now > startBy {
					w.err = fmt.Errorf("addPastFactorRun: range %d never free with both spares up by %d ms", r, startBy)
					return true
				}
				if l == nil || m.moving(r) || len(conf.GetVoters()) != m.rf || len(conf.GetLearners()) > 0 {
					return false
				}
				var outside []uint64 // up nodes not in the range: the spares, or a node a planned move emptied
				for _, n := range w.regionNodes(0) {
					if id := uint64(n.id); n.up && n.gen > 0 && !slices.Contains(conf.GetVoters(), id) {
						outside = append(outside, id)
					}
				}
				if len(outside) < 2 {
					return false
				}
				s1, s2 = outside[0], outside[1]
				from := conf.GetVoters()[0]
				if from == uint64(l.id) {
					from = conf.GetVoters()[1]
				}
				m.res.Operator++
				a = m.start(r, from, s1, "operator", nil)
				a.faultAt = -1
			case run.cutAt == 0:
				if a.cur == nil || a.cur.end {
					w.err = fmt.Errorf("addPastFactorRun: move %d -> %d ended before its removal: %v", a.from, a.to, a.cur)
					return true
				}
				if a.cur.change && a.cur.typ == geologv1.ReplicaChange_REPLICA_CHANGE_REMOVE {
					run.cutAt = w.now
					m.expire(a)
				}
			case b == nil:
				if a.cur == nil || !a.cur.end {
					return false
				}
				run.cutErr = a.cur.err
				if l == nil {
					w.err = fmt.Errorf("addPastFactorRun: range %d has no leader when move %d -> %d returned at %d ms", r, a.from, a.to, w.now)
					return true
				}
				run.replaceAt, run.votersAsked = w.now, len(conf.GetVoters())
				m.res.Operator++
				b = m.start(r, slices.Min(conf.GetVoters()), s2, "operator", nil)
				b.faultAt = -1
			case b.cur != nil && b.cur.end:
				run.replaceErr = b.cur.err
			}
			return w.now >= steps
		}})
	if run.skipped {
		return run, res, nil
	}
	return run, res, err
}
