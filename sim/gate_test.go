package sim

import "testing"

// TestDriverCoresSeeds replays the seeds that find the range driver's
// fixes undone in its cores (package rangecore, which regionsvc's driver
// and the simulator both run): seed 2 finds the epoch start gate undone
// (StartGate.Admit passing every append: a mirror's frames diverge from
// the new home's where no fork explains it), seed 121 the timeline
// fence's history gap undone (Timeline.Fence placing the fence at the
// home's epoch's start when an epoch between is unknown: a home read on
// another region's copy serves a divergent record). Both run clean with
// the fixes.
func TestDriverCoresSeeds(t *testing.T) {
	for _, seed := range []int64{2, 121} {
		if _, err := Run(Options{Seed: seed, Steps: 3000, Regions: 3}); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
}

// TestHomeForksItsDivergentTail replays seed 6500375 (three regions): range
// 0 was homed in region 0 at epoch 1, region 2 took it over at epoch 2 from
// 49 while region 0's group held epoch-1 frames to 104, and region 0 took
// it back at epoch 3 (its agent's copy, a replaced node, was empty). Its
// leader's log then held that unreplicated tail past epoch 2's start. The
// start gate must fork it off at 49 (rangecore.DivergeAt, StartFork),
// not raise the start over it; and until it does, home reads must not
// serve it (the home's own timeline fence, rangecore's homeFence). Each
// fix undone fails the seed: homeNoFork with the tail kept under epoch
// 3's frames, homeNoFence with a home read of a record the fork replaced.
//
// Region 0 wins only as the seed first ran, its tail read from its
// agent's node alone (takerOwnCopy): read from the region's best copy
// (regionTail), its copy holding the divergent tail bars it and no new
// home has a tail to fork (checked too). The gate's fork stays the line behind that bar (a copy whose
// fence cannot show its tail yet), so the replay keeps the old reading.
func TestHomeForksItsDivergentTail(t *testing.T) {
	const seed, steps = 6500375, 5000
	res, err := Run(Options{Seed: seed, Steps: steps, Regions: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res.Homing.HomeForks != 0 || res.Homing.DivergentTakers == 0 {
		t.Errorf("region 0's divergent copy read as its region's: %d home forks, %d tails barred; want none, and some", res.Homing.HomeForks, res.Homing.DivergentTakers)
	}
	own := mutations{takerOwnCopy: true}
	res, err = Run(Options{Seed: seed, Steps: steps, Regions: 3, mut: own})
	if err != nil {
		t.Fatal(err)
	}
	if res.Homing.HomeForks == 0 {
		t.Fatalf("no new home forked its divergent tail: the seed no longer reaches the case")
	}
	for name, m := range map[string]mutations{"homeNoFork": {homeNoFork: true, takerOwnCopy: true}, "homeNoFence": {homeNoFence: true, takerOwnCopy: true}} {
		if _, err := Run(Options{Seed: seed, Steps: steps, Regions: 3, mut: m}); err == nil {
			t.Errorf("%s: seed %d ran clean with the fix undone", name, seed)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

// TestRaiseBelowRetainedKeepsRecords replays seed 6681378 (three regions,
// a simulated minute): region 1 took range 1 over "from 0" (its agent's
// copy was a node added back empty) while every copy of region 1 had
// compacted [0, 18), and its leader raised the start to 92. The checks
// must put back the records below the raised start that no home copy
// retains any more, from what the grant's cut took (restoreCanon), and
// their acks (fillFromCuts): without the first the home's next frame
// at 18 reads as a gap, without the second a record acked at 16 stays
// counted as orphaned while the range's log holds it. The takeover "from
// 0" needs the agent's own copy read as its region's (takerOwnCopy, the
// reading of the seed's first run); read from the region's best copy, no
// start of the seed's seven takeovers is raised.
func TestRaiseBelowRetainedKeepsRecords(t *testing.T) {
	res, err := Run(Options{Seed: 6681378, Steps: 60000, Regions: 3, mut: mutations{takerOwnCopy: true}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Homing.StartsRaised == 0 {
		t.Fatal("no epoch start raised: the seed no longer reaches the case")
	}
}
