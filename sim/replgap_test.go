package sim

import "testing"

// TestRetainedMirrorIsForked runs seed 129 for a simulated minute: the old
// home's mirror leader had deleted its whole log by retention (start =
// applied end), so the frame at its applied end was gone; its open answer
// must still carry its log's epoch (replicator.LogEpocher), or the new
// home ships from the applied end on top of the divergent tail another
// node of that region still holds ("never forked off"). The seed's draws
// belong to the simulator of this commit: a change to them may move the
// case elsewhere.
func TestRetainedMirrorIsForked(t *testing.T) {
	if testing.Short() {
		t.Skip("a simulated minute")
	}
	if _, err := Run(Options{Seed: 129, Steps: 60000, Regions: 3}); err != nil {
		t.Fatal(err)
	}
}
