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
	{seed: 1, regions: 1, steps: 3000, digest: "afe8192d74b55d74ed77beb66c9ce15ffbb37e7e308e86b2f9156c0de19397ac"},
	{seed: 2, regions: 1, steps: 3000, digest: "d1503f416b0a4075ed3a93ebc8c605b7111b2b3c44df92877e6b14d74939ee16"},
	{seed: 1, regions: 3, steps: 3000, digest: "7c46affea897434c0b73a343121a44c5250783d5e2748b5aeed4519595da9382"},
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
