package sim

import "testing"

// TestShortStartIsRaised: takers that continue one offset below their
// tail (mutateShortStart: a start recorded while one more offset of the
// old epoch was still to commit, product bug 3 of notes/simfaults.md)
// are corrected by the new home's start gate: it raises the recorded
// start to its log's end before its first frame of the epoch, and every
// check holds (the same seeds find the short start with the gate off:
// TestShortStartIsChecked). Fails without the gate, or if the checks
// do not follow the raised start.
func TestShortStartIsRaised(t *testing.T) {
	raised := 0
	for seed := int64(1); seed <= 20 && raised == 0; seed++ {
		res, err := Run(Options{Seed: seed, Steps: 2500, Regions: 3, mutateShortStart: true})
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		raised += res.Homing.StartsRaised
		if res.Homing.StartsRaised > 0 {
			t.Logf("seed %d: %v", seed, res)
		}
	}
	if raised == 0 {
		t.Fatal("no seed of 1-20 raised a start")
	}
}
