package sim

import "testing"

// TestRetainedMirrorIsForked runs seed 45 for 30.1 simulated seconds: a
// mirror region's copies of range 0 deleted their whole log by retention
// (start = applied end) and restarted; the new mirror leader's open answer
// must carry the epoch its log ended in (replicator.LogEpocher over
// replica.HighestEpoch, which keeps the compacted frames' epoch in the
// hard state: HardState.CompactedEpoch), or the new home ships from the
// applied end on top of the divergent tail a follower of that region
// still holds: "its log ends in epoch 2 frames (at 413) on top of an older
// epoch's tail from the fork point 390, never forked off" (at 30059 ms).
// It fails so with the compacted epoch undone (the replica's New not
// raising HighestEpoch to it; notes/simgaps.md P2). It was seed 129 for a
// minute until simtriage's floor change moved that case (which
// mut.noLogEpochFallback no longer reaches at this seed); the seed's
// draws belong to the simulator of this commit.
func TestRetainedMirrorIsForked(t *testing.T) {
	if testing.Short() {
		t.Skip("30 simulated seconds")
	}
	if _, err := Run(Options{Seed: 45, Steps: 30100, Regions: 3}); err != nil {
		t.Fatal(err)
	}
}

// TestDownDivergentCopyKeepsFloor: seed 169 of the minute runs. Range 1
// is taken over by region 2 at epoch 5 (fork point 402) while region 0,
// the old home, holds an epoch-4 tail to 579; region 0 then goes down
// whole, and the new home compacted to 476 with the floor counting the
// down copies at their published end (579), past their resend point 402.
// Back up, a region-0 copy is resent from the new home's log start 476,
// inside its divergent frame at 475: "frame at 476 differs from the
// mirror's ... (no fork explains it)" at 23064 ms. The floor counts a
// down copy at the resend point of the epoch its log ended in (geo.go
// resendPoint, noteDown), as a replicator Task's lag keeps the resend
// point of its last connection. The seed was found with the floor set on
// every replica (mut.floorEverywhere), as the simulator did before the
// followers learned theirs from their leader (replica floor.go).
func TestDownDivergentCopyKeepsFloor(t *testing.T) {
	if testing.Short() {
		t.Skip("23 simulated seconds")
	}
	if _, err := Run(Options{Seed: 169, Steps: 23100, Regions: 3, mut: mutations{floorEverywhere: true}}); err != nil {
		t.Fatal(err)
	}
}

// TestRestartedLeaderKeepsFloor: seed 743 of the minute runs. Range 1 is
// taken over by r1 at epoch 2 (from 0), then by r0 at epoch 3 (from 15)
// while r1 holds epoch 2's log to 33. r0's leader of the range, whose
// floor (its driver's, 15: r1's resend point) was only in memory,
// crashes at 6480 ms; restarted as a follower with no floor saved, it
// compacted by retention alone to 31 at 6825 ms, and r1, resent from 31,
// forked there, keeping its epoch-2 records [15, 31): "region 1 node 1
// range 1: forked at 31 to epoch 3, the range's epoch 3 starts at 15" at
// 7155 ms. A leader saves its own floor as the one to hold to after a
// restart (replica floor.go saveLeaderFloor).
func TestRestartedLeaderKeepsFloor(t *testing.T) {
	if _, err := Run(Options{Seed: 743, Steps: 8000, Regions: 3}); err != nil {
		t.Fatal(err)
	}
}

// TestNewReplicaHoldsFloor: seed 486 of the minute runs, with the fix
// above. Range 1 is taken over by r1 at epoch 2 (from 6) while r0 holds
// epoch 1's log to 32 (its resend point, and the floor, 6). r1n3 is
// replaced: removed, its disk wiped, added back at 2026 ms; it takes the
// log [6, ...) by snapshot. Its leader r1n1 crashes at 2135 ms before
// its next floor message, and r1n3, leaderless and having heard no floor,
// compacted by retention alone to 25 at 2805 ms. It led the home from
// 5912 ms, and its resend to r0n3 began at its log start, 25, inside
// r0n3's epoch-1 frame [24, 26): "batch [25, 65) against applied end 32:
// ... frame at 25 differs from the mirror's (stored frame at 24 ...) (no
// fork explains it)" at 6380 ms. A follower that has heard from no leader
// whether there is a floor compacts nothing (replica floor.go holdsAll).
func TestNewReplicaHoldsFloor(t *testing.T) {
	if _, err := Run(Options{Seed: 486, Steps: 6500, Regions: 3}); err != nil {
		t.Fatal(err)
	}
}

// TestStraddledTailIsForked: seed 1700391 of the minute runs. Range 0 is
// taken over by r0 at epoch 4 from 1205 while r1n2 holds the old home's
// epoch-3 frame [1205, 1207) in its log, not yet committed: leading r1's
// copy again, it reported its applied end 1205 to the new home, then
// committed that frame. The new home's resend from the frame holding 1207
// met it: the batch's frame [1206, 1208) straddles the mirror's applied
// end 1207, "frame [1206, 1208) straddles the applied end 1207
// (CORRUPTION) (no fork explains it)" at 52595 ms. The mirror's frame
// spans the home's frame boundary at 1206, so it is none of the home's:
// the fork is at its start, 1205 (replicator validate.go forkedOff).
func TestStraddledTailIsForked(t *testing.T) {
	if testing.Short() {
		t.Skip("53 simulated seconds")
	}
	if _, err := Run(Options{Seed: 1700391, Steps: 53000, Regions: 3}); err != nil {
		t.Fatal(err)
	}
}
