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
//
// Skipped since the simtriage branch: the compaction floor now holds a
// divergent copy's resend point (geo.go floor), and seed 129 goes on to
// reach the open product gaps P1 and P2 of notes/simtriage.md (a mirror
// leader that retains nothing where the resend starts refuses it for
// good; a restarted one whose retention deleted its whole log answers no
// log epoch, and the new home ships on top of the divergent tail its
// followers still hold). Re-point it once they are fixed: a seed that
// fails with Options.mut.noLogEpochFallback (the replgap fix undone)
// and passes without it.
func TestRetainedMirrorIsForked(t *testing.T) {
	if testing.Short() {
		t.Skip("a simulated minute")
	}
	if _, err := Run(Options{Seed: 129, Steps: 60000, Regions: 3}); err != nil {
		t.Fatal(err)
	}
}
