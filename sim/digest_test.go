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
	{seed: 1, regions: 1, steps: 3000, digest: "6e475a30307c81a696a7ec449f1dd7e3f7db82271a3ca978e07f1ab072a14ba9"},
	{seed: 2, regions: 1, steps: 3000, digest: "5c3b6142aa30f324be59884ca5ee026a8e03bda845d0dadc1c503762cb881c51"},
	{seed: 1, regions: 3, steps: 3000, digest: "a1ff0de6a71b0af6d3be42f812efd461a2700b7a31bada742795d56826f24331"},
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
