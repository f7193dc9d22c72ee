package rangecore

import (
	"testing"
	"time"
)

// TestHeldCommitTimer: the timer is set once when commits are first held
// (not pushed back by later arms: firing early only sends them early),
// stopped once none are held, and set again after it fired.
func TestHeldCommitTimer(t *testing.T) {
	var h HeldCommitTimer
	for i, c := range []struct {
		wait   time.Duration
		held   bool
		fired  bool
		action TimerAction
	}{
		{0, false, false, TimerKeep},
		{5 * time.Millisecond, true, false, TimerReset},
		{3 * time.Millisecond, true, false, TimerKeep}, // set already
		{0, false, false, TimerStop},                   // the next append replaced them
		{0, false, false, TimerKeep},
		{4 * time.Millisecond, true, false, TimerReset},
		{0, true, true, TimerReset}, // fired, still held: due now
	} {
		if c.fired {
			h.Fired()
		}
		a, wait := h.Arm(c.wait, c.held)
		if a != c.action || (a == TimerReset && wait != c.wait) {
			t.Fatalf("step %d: Arm(%v, %v) = %v %v, want %v", i, c.wait, c.held, a, wait, c.action)
		}
	}
}
