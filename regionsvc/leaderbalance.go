package regionsvc

import (
	"sync/atomic"
)

// Preferred leaders: the range leaders of a region stay spread over its
// nodes. The driver's core runs it (rangecore/balance.go: a leader that
// is not its range's preferred leader hands leadership to it once that
// one is up and caught up, checked every Config.LeaderBalanceInterval it
// has led); the node supplies the preferred leader the catalogue names,
// if any, and the group id that picks one otherwise.

// leaderBalance is a range driver's preferred-leader state.
type leaderBalance struct {
	// pref is the preferred leader the catalogue names for the range (a
	// "range-leaders" record, leaders.go; 0: none, the group id picks),
	// set by the catalogue's apply (any goroutine), read by the core on
	// its ticks.
	pref atomic.Uint64
}
