package chaos

import (
	"fmt"
	"time"
)

// Split reads (DESIGN.md invariant 8; docs/reads-never-go-backwards.md).
// An offset must never be read with two different records. The queue
// checker compares every observation of an offset with the first
// (Inconsistent), except reads of a divergent tail: records now in an
// orphan log, which a returning old home (or a mirror ahead of the region
// that took over) served before the range's log replaced them. Those are
// allowed only in the pre-knowledge window: until the fault that took
// the range's home away under their epoch ended, plus the time a node
// needs to learn the newer epoch once it can (a lease heartbeat and a
// read of the home directory: KnowledgeSlack). A read of a divergent
// record that returned later is a SplitRead: the node knew, or could
// have known, and served it anyway.

// KnowledgeSlack is how long after the end of a fault that took a range's
// home away its old home may still serve the divergent tail: the lease TTL
// of the history (a node heartbeats several times per TTL, and reads the
// home directory at once when its heartbeat shows it lost a range), and
// at least a second (homing off: the replicator's first batch forks the
// copy).
func KnowledgeSlack(h *History) time.Duration {
	return max(h.LeaseTTL.Std(), time.Second)
}

// checkSplitReads reports every read of a divergent record (one the orphan
// logs hold) that returned after its pre-knowledge window.
func checkSplitReads(h *History, orphans *orphanIndex, add func(Anomaly)) {
	slack := int64(KnowledgeSlack(h))
	for _, o := range h.Reads {
		if !orphans.holds(o.Range, o.Offset, o.Epoch, o.Value) {
			continue
		}
		end, ok := divergenceWindowEnd(h, o.Range, o.Epoch)
		switch {
		case !ok:
			add(Anomaly{Kind: SplitRead, Range: o.Range, Offset: o.Offset, Value: o.Value,
				Detail: fmt.Sprintf("%s read offset %d of epoch %d, now in an orphan log, and no fault took the range's home away under that epoch", o.Source, o.Offset, o.Epoch)})
		case o.At > end+slack:
			add(Anomaly{Kind: SplitRead, Range: o.Range, Offset: o.Offset, Value: o.Value,
				Detail: fmt.Sprintf("%s read offset %d of epoch %d, now in an orphan log (the log holds another record there), %v after the fault that took its home away ended (allowed: %v)",
					o.Source, o.Offset, o.Epoch, durMs(o.At-end), KnowledgeSlack(h))})
		}
	}
}

// divergenceWindowEnd is when the last fault that took range rng's home
// away under epoch or a later one ended; ok is false if none did.
func divergenceWindowEnd(h *History, rng uint32, epoch uint64) (end int64, ok bool) {
	for _, ev := range h.Faults {
		if e0, in := ev.HomeEpochs[rng]; in && ev.Err == "" && epoch <= e0 && (!ok || ev.End > end) {
			end, ok = ev.End, true
		}
	}
	return end, ok
}

// isForkPoint reports whether offset is where range rng's log forked: a
// reader that read the divergent tail goes back there to read the log
// (the SDK's ForkError), which is no gap.
func (ix *orphanIndex) isForkPoint(rng uint32, offset uint64) bool {
	for _, f := range ix.forks {
		if f.rng == rng && f.at == offset {
			return true
		}
	}
	return false
}
