package cli

import (
	"math"
	"testing"
)

func TestMachineCPUFromProcStat(t *testing.T) {
	a, err := parseProcStat("cpu  28381 57894 19807 50911 7292 0 3175 3670 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
	if err != nil {
		t.Fatal(err)
	}
	b, err := parseProcStat("cpu  28658 57894 20101 51067 7405 0 3262 3736 0 0\n")
	if err != nil {
		t.Fatal(err)
	}
	m := machineCPU(a, b)
	// 5 s of two CPUs, measured during a one-at-a-time run: busy 277 + 294
	// + 87, idle 156, iowait 113, steal 66 of 993 ticks.
	near := func(got, want float64) bool { return math.Abs(got-want) < 0.01 }
	if m == nil || !near(m.BusyPct, 100*658.0/993) || !near(m.IowaitPct, 100*113.0/993) || !near(m.StealPct, 100*66.0/993) {
		t.Fatalf("machine CPU %+v", m)
	}
	if machineCPU(b, b) != nil {
		t.Fatal("no time passed, yet a share")
	}
	for _, bad := range []string{"", "intr 1 2 3", "cpu 1 2 3", "cpu 1 2 3 4 5 6 7 x"} {
		if _, err := parseProcStat(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
