package sim

import "testing"

// TestRehomeShortTailIsChecked: a stop that reports every final tail one
// offset short makes the new home start below an acked record; the
// checker must report the planned rehome losing it.
func TestRehomeShortTailIsChecked(t *testing.T) {
	findMutation(t, "a planned rehome below the final tail", 1, 30, 3000, mutations{rehomeShortTail: true}, "a planned rehome lost an acked record")
}
