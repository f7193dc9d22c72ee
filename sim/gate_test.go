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
