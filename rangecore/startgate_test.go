package rangecore

import "testing"

func TestDivergeAt(t *testing.T) {
	starts := map[uint64]uint64{1: 0, 2: 49, 3: 0, 4: 120}
	for _, c := range []struct {
		logEpoch, epoch, want uint64
	}{
		{1, 3, 49},      // epoch 2 lies between: the log leaves the timeline at its start
		{1, 5, 0},       // epochs 2-4 between: the lowest start (3's takeover from 0)
		{2, 3, NoFence}, // nothing between
		{3, 5, 120},
		{4, 5, NoFence},
		{0, 2, 0}, // a log of no epoch's frames, epoch 1 between
		{5, 3, NoFence},
	} {
		if got := DivergeAt(c.logEpoch, c.epoch, starts); got != c.want {
			t.Errorf("DivergeAt(%d, %d) = %d, want %d", c.logEpoch, c.epoch, got, c.want)
		}
	}
	if got := DivergeAt(1, 3, nil); got != NoFence {
		t.Errorf("no history: %d, want NoFence", got)
	}
}
