package cli

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// The machine's CPU during a bench run, from /proc/stat (Linux): how busy
// its CPUs were, how long they waited for the disk, and how much of their
// time the host took (steal). Steal is the figure a p99 under load has to
// be read beside on a virtual machine: a hypervisor that caps the VM's CPU
// (a bandwidth quota, charged for its disk emulation too) stops every vCPU
// for the rest of each period once the cap is spent, and every append in
// flight then waits that long (notes/lead.md, stop 43: 7-11 ms stalls
// every 100 ms at 6-7% steal on this machine, under a one-at-a-time run).

// MachineCPU is the share of the machine's CPU time (all CPUs) spent in
// each state during a run, in percent.
type MachineCPU struct {
	BusyPct   float64 `json:"busy_pct"`   // user, nice, system, irq, softirq
	IowaitPct float64 `json:"iowait_pct"` // idle with disk I/O outstanding
	StealPct  float64 `json:"steal_pct"`  // taken by the host (a VM's hypervisor)
}

// cpuTicks are /proc/stat's first line: the machine's CPU time in ticks.
type cpuTicks struct {
	busy, idle, iowait, steal uint64
}

func (t cpuTicks) total() uint64 { return t.busy + t.idle + t.iowait + t.steal }

// parseProcStat reads the aggregate "cpu" line of /proc/stat's text.
func parseProcStat(text string) (cpuTicks, error) {
	line, _, _ := strings.Cut(text, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return cpuTicks{}, fmt.Errorf("/proc/stat: no aggregate cpu line with 8 counters: %q", line)
	}
	var v [8]uint64 // user nice system idle iowait irq softirq steal
	for i := range v {
		n, err := strconv.ParseUint(f[i+1], 10, 64)
		if err != nil {
			return cpuTicks{}, fmt.Errorf("/proc/stat: counter %d: %w", i+1, err)
		}
		v[i] = n
	}
	return cpuTicks{busy: v[0] + v[1] + v[2] + v[5] + v[6], idle: v[3], iowait: v[4], steal: v[7]}, nil
}

// readCPUTicks reads the machine's CPU ticks; false where /proc/stat is
// missing or unreadable (not Linux): the run then reports none.
func readCPUTicks() (cpuTicks, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTicks{}, false
	}
	t, err := parseProcStat(string(b))
	return t, err == nil
}

// machineCPU is the CPU time between two readings, by state; nil if no
// time passed.
func machineCPU(from, to cpuTicks) *MachineCPU {
	if to.total() <= from.total() {
		return nil
	}
	all := float64(to.total() - from.total())
	pct := func(a, b uint64) float64 {
		if b < a {
			return 0
		}
		return 100 * float64(b-a) / all
	}
	return &MachineCPU{BusyPct: pct(from.busy, to.busy), IowaitPct: pct(from.iowait, to.iowait), StealPct: pct(from.steal, to.steal)}
}
