package sim

import (
	"testing"
)

// TestSplitSeeds: runs of one region that split range 0 (split.go) are
// clean and split.
func TestSplitSeeds(t *testing.T) {
	var tot SplitResult
	for seed := int64(1); seed <= 4; seed++ {
		res, err := Run(Options{Seed: seed, Steps: 3000, Regions: 1, mut: mutations{splitAlways: true}})
		if err != nil {
			t.Fatalf("%v\n%v", err, res)
		}
		tot = tot.add(res.Splits)
	}
	t.Log(tot)
	if tot.Runs == 0 || tot.Answered == 0 || tot.Abandoned == 0 {
		t.Fatalf("splits went unexercised: %v", tot)
	}
}

// TestSplitUnderRetention: seed 148 of one region (a minute of faults)
// splits in a run that compacts. Before the marker outlived retention
// (replica/compact.go keeps its segment; a snapshot's body and a restart
// note it below the compaction point), a replica whose log had lost the
// marker led and acked a record after the split.
func TestSplitUnderRetention(t *testing.T) {
	res, err := Run(Options{Seed: 148, Steps: 60000, Regions: 1})
	if err != nil {
		t.Fatalf("seed 148 splitting under retention: %v", err)
	}
	if res.Splits.Runs != 1 || res.Splits.Answered == 0 {
		t.Fatalf("seed 148 did not split: %v", res.Splits)
	}
}
