package sim

import (
	"os"
	"strings"
	"testing"
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
// (seed 44 is the first of 1-200 that this check, not another, catches
// with dead nodes and split children drawn; seed 2, then 5, were before:
// notes/simchildren.md, notes/simdead.md).
func TestMovesRemovedReplicaAcks(t *testing.T) {
	_, err := Run(Options{Seed: 44, Steps: 3000, Regions: 1, mut: mutations{movesAlways: true, moveStray: true}})
	if err == nil || !strings.Contains(err.Error(), "after its removal from the range") {
		t.Fatalf("got %v, want a removed replica's ack reported", err)
	}
	if _, err := Run(Options{Seed: 44, Steps: 3000, Regions: 1, mut: mutations{movesAlways: true}}); err != nil {
		t.Fatalf("without the mutation: %v", err)
	}
}

// TestMovesStaleDescribe: regionsvc's DescribeReplicas and
// ChangeReplicas used the leader's applied configuration, which may lag
// what its log already commits (a new leader that has not applied its
// predecessors' changes); replicamove.Replace then took a range below its
// replication factor. First found at seed 459 of 3 s with moves in every
// run, then at seeds 92 and 125 of a minute. Both now answer after a
// ReadIndex (admin.go caughtUpLeader) and every change carries the voters
// it was decided from (replicamove TestChangeOvertaken, regionsvc
// TestReplaceReplicaThroughAdmin). Since the planner no longer targets an
// unreachable node (placement Node.Unreachable) and split runs open
// children (other draws), no seed of 1-400 of a minute nor 1-2000 of 3 s
// with moves (with and without dead nodes) reaches the interleaving with
// the old Describe (the mutation describeStale, kept for a rescan:
// SIMSCAN); the seeds that found it stay as regressions.
func TestMovesStaleDescribe(t *testing.T) {
	for _, seed := range []int64{92, 125} {
		if _, err := Run(Options{Seed: seed, Steps: 60000, Regions: 1}); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
	if os.Getenv("SIMSCAN") == "" {
		return
	}
	mut := mutations{describeStale: true, targetUnreachable: true, targetUnchecked: true}
	for seed := int64(1); seed <= 400; seed++ {
		if _, err := Run(Options{Seed: seed, Steps: 60000, Regions: 1, mut: mut}); err != nil {
			t.Logf("seed %d with the old Describe: %v", seed, err)
		}
	}
}
