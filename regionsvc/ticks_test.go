package regionsvc

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// testTick returns the Raft tick the in-process test regions run at: base,
// stretched on a slow run. Elections are ElectionTicks (8-16) ticks of
// silence, and a leader that hears no quorum for an election timeout fails
// its appends; under the race detector (several times slower) and on a
// machine whose run queue is much longer than its cores, a goroutine can
// wait longer than that for a core, so leaders were deposed for nothing
// and multi-region tests spent their time in elections. Stretching the
// tick keeps the same number of ticks (the behaviour under test) at a
// pace the machine can hold.
func testTick(base time.Duration) time.Duration {
	return base * time.Duration(tickScale())
}

var tickScaleOnce = sync.OnceValue(func() int {
	scale := 1
	if raceEnabled {
		scale = 2
	}
	if load := loadPerCore(); load > 4 {
		scale *= 2
	}
	return scale
})

func tickScale() int { return tickScaleOnce() }

// loadPerCore is the one-minute load average per core, or 0 when unknown.
func loadPerCore() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	load, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0
	}
	return load / float64(runtime.NumCPU())
}
