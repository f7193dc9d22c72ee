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
	{seed: 1, regions: 1, steps: 3000, digest: "4211c225a3080a92e7039466b8ccb756782594df7cf0ae9b938709896ab20a8b"},
	{seed: 2, regions: 1, steps: 3000, digest: "20ce315d1077f947b69e58d20c242aa2059d47b6337d4d647657e4c2b81676c4"},
	{seed: 1, regions: 3, steps: 3000, digest: "660fe3d4192f8ff1062788df8f10d97e57c8ddd34dd71e386310f86df1ee9a15"},
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
