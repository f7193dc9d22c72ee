package sim

import (
	"time"

	"github.com/geolog/geolog/rangecore"
)

// Held commits (replica.Config.HoldCommits, as regionsvc's openReplica
// sets it): while appends come continuously, a leader holds the
// commit-only appends to caught-up followers for the next append to carry.
// After every step's Ready cycles each replica's timer is armed by the
// product's own decision (rangecore.HeldCommitTimer, which regionsvc's
// driver loop runs on a time.Timer); when it fires, on the virtual clock,
// the held commits are sent (replica.SendHeldCommits).

// heldTimer is a replica's held-commit timer: the core's decision, and
// the sequence that makes a stopped or reset timer's event a no-op.
type heldTimer struct {
	core rangecore.HeldCommitTimer
	seq  uint64
}

// armHeld arms or stops n's timer of range r after its Ready cycles.
func (w *world) armHeld(n *node, r int) {
	t := &n.held[r]
	switch a, wait := t.core.Arm(n.replicas[r].HeldCommitsWait()); a {
	case rangecore.TimerReset:
		t.seq++
		seq := t.seq
		w.later(n, int64((wait+time.Millisecond-1)/time.Millisecond), func() {
			if t := &n.held[r]; t.seq == seq {
				t.core.Fired()
				if _, held := n.replicas[r].HeldCommitsWait(); held {
					w.res.HeldCommitsSent++
				}
				n.replicas[r].SendHeldCommits()
			}
		})
	case rangecore.TimerStop:
		t.seq++
	}
}
