package sim

import (
	"strings"
	"testing"
)

// TestOrphanLogContentsAreChecked: a fork that orphans one record less
// than it cut (Options.mutateOrphanDrop: its orphan log, and its record,
// start a record past the fork point) must be reported, at the fork (the
// copy held that record) or at the end (an acked record counted as
// orphaned that no orphan log holds).
func TestOrphanLogContentsAreChecked(t *testing.T) {
	for seed := int64(1); seed <= 30; seed++ {
		res, err := Run(Options{Seed: seed, Steps: 2500, Regions: 3, mutateOrphanDrop: true})
		if err == nil && res.Homing.Forks == 0 {
			continue
		}
		if err == nil || !(strings.Contains(err.Error(), "the orphan log of the fork") || strings.Contains(err.Error(), "is in no orphan log")) {
			t.Fatalf("seed %d: a fork whose orphan log lacks a record, unreported: %v", seed, err)
		}
		t.Log(err)
		return
	}
	t.Fatal("no seed of 30 forked")
}
