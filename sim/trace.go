package sim

import (
	"fmt"
	"strings"

	"github.com/geolog/geolog/batch"
)

// Traces for replaying a seed (make sim SEED=n SIMTRACE=true): one line
// per event of the layers above the replicas, in virtual time, naming
// regions, nodes and homing epochs, which the replicas' own logs
// (SIMLOG) do not. Nothing is drawn from the run's generator and nothing
// is written without Options.Trace, so a seed traced is the seed run.

// tracef writes one trace line at the current virtual time.
func (w *world) tracef(format string, args ...any) {
	if w.opt.Trace == nil {
		return
	}
	fmt.Fprintf(w.opt.Trace, "%7d ms  %s\n", w.now, fmt.Sprintf(format, args...))
}

// tracing reports whether traces are written (to skip building their
// arguments).
func (w *world) tracing() bool { return w.opt.Trace != nil }

// traceName names node n with its region ("r1n3").
func traceName(n *node) string { return fmt.Sprintf("r%dn%d", n.region, n.id) }

// traceFrames describes concatenated frames as [base, next)@epoch each;
// what does not parse ends the description.
func traceFrames(frames []byte) string {
	var b strings.Builder
	for p := 0; p < len(frames); {
		size, err := batch.FrameSize(frames[p:])
		if err != nil || size > len(frames)-p {
			b.WriteString(" ?")
			break
		}
		h, err := batch.DecodeHeader(frames[p : p+size])
		if err != nil {
			b.WriteString(" ?")
			break
		}
		fmt.Fprintf(&b, " [%d,%d)@%d/%dB", h.BaseOffset, h.NextOffset(), h.Epoch, size)
		p += size
	}
	return b.String()
}

// traceLeaders writes a line whenever a region's leader of a range
// changes (none: "-"), with its term.
func (w *world) traceLeaders() {
	if !w.tracing() {
		return
	}
	if w.traceLead == nil {
		w.traceLead = make(map[[2]int]string)
	}
	for g := 0; g < w.opt.Regions; g++ {
		for r := 0; r < w.opt.Ranges; r++ {
			name := "-"
			if l := w.leaderOf(g, r); l != nil {
				name = fmt.Sprintf("%s term %d", traceName(l), l.replicas[r].LeaderTerm())
			}
			if k := [2]int{g, r}; w.traceLead[k] != name {
				w.traceLead[k] = name
				w.tracef("r%d range %d: leader %s", g, r, name)
			}
		}
	}
}

// traceCompaction writes a line if node n's log of range r starts past
// before now: with the floors the simulator and the replica hold to.
func (w *world) traceCompaction(n *node, r int, before uint64) {
	after := n.stores[r].StartOffset()
	if after == before {
		return
	}
	rep := n.replicas[r]
	f, ok := rep.LearnedCompactionFloor()
	var floor uint64
	if w.geo != nil {
		floor = w.geo.floor(r, n.region)
	}
	w.tracef("%s range %d: compacted [%d, %d) (leader %v, sim floor %d, learned %d %v)", traceName(n), r, before, after, rep.IsLeader(), floor, f, ok)
}
