package rangecore

import "time"

// HeldCommitTimer is the range driver's timer decision for the commit-only
// appends its replica holds (replica.Config.HoldCommits: while appends come
// continuously, the next append carries the commit index to the followers
// instead of an append of its own). After every event the driver handles,
// it calls Arm with the replica's HeldCommitsWait; when the timer it set
// fires, it calls Fired and the replica's SendHeldCommits.
type HeldCommitTimer struct {
	armed bool
}

// TimerAction is what Arm asks of the driver's timer.
type TimerAction int

const (
	// TimerKeep: leave the timer as it is.
	TimerKeep TimerAction = iota
	// TimerReset: set it to fire after the wait.
	TimerReset
	// TimerStop: stop it.
	TimerStop
)

// Arm sets the timer for the replica's held commits (wait, held: its
// HeldCommitsWait), unless it is set (firing early only sends them early),
// and stops it once none are held (the next append replaced them): a range
// written continuously does not wake every few milliseconds for nothing.
func (h *HeldCommitTimer) Arm(wait time.Duration, held bool) (TimerAction, time.Duration) {
	switch {
	case held && !h.armed:
		h.armed = true
		return TimerReset, wait
	case !held && h.armed:
		h.armed = false
		return TimerStop, 0
	}
	return TimerKeep, 0
}

// Fired notes that the timer fired: the driver sends the held commits.
func (h *HeldCommitTimer) Fired() { h.armed = false }
