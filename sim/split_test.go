package sim

import (
	"strings"
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

// TestSplitRetentionGap: the known gap of docs/split.md ("Not built: the
// durable fence against appends once retention deletes the marker's
// segment"): in a run that compacts, a replica whose log no longer holds
// the marker (retention deleted it, or it was rebuilt from a snapshot
// past it) leads and takes appends after the split. Seed 148 of one
// region (a minute of faults) shows it; split.go splits only in runs
// without retention until the fence is built. This test fails once it
// is: then let split.go split in every run.
func TestSplitRetentionGap(t *testing.T) {
	_, err := Run(Options{Seed: 148, Steps: 60000, Regions: 1, mut: mutations{splitCompacting: true}})
	if err == nil || !strings.Contains(err.Error(), "past the split marker") {
		t.Fatalf("seed 148 splitting under retention: got %v, want a record acked past the split marker", err)
	}
}
