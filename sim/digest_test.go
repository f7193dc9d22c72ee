package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"
)

// scheduleDigests pins what a few short seeds do, event for event: the
// SHA-256 of each run's trace (Options.Trace) and Result. A change that is
// meant to leave every schedule as it was (a faster simulator: see
// notes/simfast.md) must leave these alone; one that changes schedules on
// purpose (a new draw, a new fault, a product change the runs see) changes
// them, and its author puts the digests the failure prints here (and
// checks that the pinned seeds of the other tests still find what they
// look for).
var scheduleDigests = []struct {
	seed    int64
	regions int
	steps   int
	digest  string
}{
	{seed: 1, regions: 1, steps: 3000, digest: "7e21ad5d85996f7553ef23c8107e135116fd47b2465271c6a490b871ed7e7385"},
	{seed: 2, regions: 1, steps: 3000, digest: "19e50e7d8c65844d42269bbf9d938352e7c8484310d30fc3fbb0d21a7e6e6d07"},
	{seed: 1, regions: 3, steps: 3000, digest: "37e64443f14dfa7d73ce5c296075f0022c57c217569ed4fbda853d412563dfec"},
}

// TestScheduleDigests: the seeds of scheduleDigests run as pinned.
func TestScheduleDigests(t *testing.T) {
	for _, c := range scheduleDigests {
		h := sha256.New()
		res, err := Run(Options{Seed: c.seed, Steps: c.steps, Regions: c.regions, Trace: h})
		fmt.Fprintf(h, "%+v %v", res, err)
		if got := hex.EncodeToString(h.Sum(nil)); got != c.digest {
			t.Errorf("seed %d of %d regions, %d ms: schedule digest %s, pinned %s: the run changed (if on purpose, pin the new digest in scheduleDigests)",
				c.seed, c.regions, c.steps, got, c.digest)
		}
	}
}
