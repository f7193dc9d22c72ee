package chaos

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Orphans and epochs in the checkers (DESIGN.md "Divergent tails",
// invariants 1 and 5). After an unplanned failover the old home's records
// past the fork are not in the range's log any more: they are in its
// orphan log, with their original offsets and epoch. So an observation or
// an ack of (range, offset, epoch, value) that the orphan logs hold is of
// that divergent tail: it is judged against the orphan log, not the final
// log. An acknowledged record found only there is "orphaned" (the RPO
// suffered), allowed only when a fault took its home region away
// (FaultEvent.HomeEpochs) under that epoch or a later one; anywhere else it
// is lost.

// orphanPos is a position in a divergent tail: the epoch tells two forks
// over the same offsets apart (one home per epoch).
type orphanPos struct {
	rng    uint32
	offset uint64
	epoch  uint64
}

// fork is one divergent tail of a range, as the orphan logs hold it.
type fork struct {
	rng    uint32
	at     uint64 // the fork offset: the log continued there in a newer epoch
	epoch  uint64
	values map[uint64]string // offset → value
}

// orphanIndex is every orphan log of a history, merged across the nodes
// that hold a copy.
type orphanIndex struct {
	at    map[orphanPos]string
	forks []*fork
}

// indexOrphans merges h.Orphans; two nodes that disagree about one
// position are reported through add as Inconsistent.
func indexOrphans(h *History, add func(Anomaly)) *orphanIndex {
	ix := &orphanIndex{at: map[orphanPos]string{}}
	src := map[orphanPos]string{}
	type forkKey struct {
		rng       uint32
		at, epoch uint64
	}
	forks := map[forkKey]*fork{}
	for _, o := range h.Orphans {
		p := orphanPos{o.Range, o.Offset, o.Epoch}
		if v, ok := ix.at[p]; ok {
			if v != o.Value {
				add(Anomaly{Kind: Inconsistent, Range: o.Range, Offset: o.Offset, Value: o.Value,
					Detail: fmt.Sprintf("orphan logs disagree at epoch %d: %s holds %.40q, %s holds %.40q", o.Epoch, src[p], v, o.Node, o.Value)})
			}
			continue
		}
		ix.at[p], src[p] = o.Value, o.Node
		k := forkKey{o.Range, o.ForkOffset, o.Epoch}
		f := forks[k]
		if f == nil {
			f = &fork{rng: o.Range, at: o.ForkOffset, epoch: o.Epoch, values: map[uint64]string{}}
			forks[k] = f
			ix.forks = append(ix.forks, f)
		}
		f.values[o.Offset] = o.Value
	}
	sort.Slice(ix.forks, func(i, j int) bool {
		a, b := ix.forks[i], ix.forks[j]
		return a.rng < b.rng || (a.rng == b.rng && (a.at < b.at || (a.at == b.at && a.epoch < b.epoch)))
	})
	return ix
}

// holds reports whether the orphan logs hold value at (rng, offset) under
// epoch.
func (ix *orphanIndex) holds(rng uint32, offset, epoch uint64, value string) bool {
	v, ok := ix.at[orphanPos{rng, offset, epoch}]
	return ok && v == value
}

// orphanAllowed reports whether an acknowledged record of range rng under
// epoch may have been orphaned: a fault took the range's home region away
// while the range was homed there at that epoch or a later one.
func orphanAllowed(h *History, rng uint32, epoch uint64) bool {
	for _, ev := range h.Faults {
		if e0, ok := ev.HomeEpochs[rng]; ok && ev.Err == "" && epoch <= e0 {
			return true
		}
	}
	return false
}

// checkEpochs reports acks that the homing rules forbid (Stale):
//
//   - under a lease-store outage of a home region (FaultEvent.LeaseCut),
//     an ack under the range's epoch then that returned after the lease
//     could have expired (Start + LeaseTTL: the last heartbeat preceded
//     the cut, and the node stops MaxClockOffset before expiry, which is
//     the slack left for the reply's way back) and before the store came
//     back. A duplicate's ack carries the original's epoch whoever gives
//     it (the new home dedups a record the old one appended), so it is
//     left out; so is an ack whose reply crossed a link a partition or a
//     latency fault held while it was out (a producer of another region
//     than the home's, such a fault between the two): its return time is
//     the link's, not the node's;
//   - an ack under epoch e of an append invoked after an ack under a
//     newer epoch of the same range had returned: the newer home was in
//     service, so e was no longer the newest granted (invariant 5).
func checkEpochs(h *History, add func(Anomaly)) {
	type firstAck struct {
		ret    int64
		offset uint64
	}
	first := map[uint32]map[uint64]firstAck{} // range → epoch → its first ack
	for _, op := range h.Ops {
		if op.Kind != OpAppend || op.Outcome != OK {
			continue
		}
		if first[op.Range] == nil {
			first[op.Range] = map[uint64]firstAck{}
		}
		if f, ok := first[op.Range][op.Epoch]; !ok || op.Return < f.ret {
			first[op.Range][op.Epoch] = firstAck{op.Return, op.Offset}
		}
	}
	for _, op := range h.Ops {
		if op.Kind != OpAppend || op.Outcome != OK {
			continue
		}
		for e, f := range first[op.Range] {
			if e > op.Epoch && f.ret < op.Call {
				add(Anomaly{Kind: Stale, Range: op.Range, Offset: op.Offset, Value: op.Value,
					Detail: fmt.Sprintf("acked under epoch %d, invoked %v after an ack under epoch %d (offset %d) returned",
						op.Epoch, durMs(op.Call-f.ret), e, f.offset)})
				break
			}
		}
		if h.LeaseTTL <= 0 {
			continue
		}
		for _, ev := range h.Faults {
			e0, ok := ev.HomeEpochs[op.Range]
			if !ev.LeaseCut || !ok || ev.Err != "" || op.Duplicate || op.Epoch > e0 || replyHeld(h, op, ev.Sides) {
				continue
			}
			expired := ev.Start + int64(h.LeaseTTL)
			if op.Return > expired && op.Return < ev.End {
				add(Anomaly{Kind: Stale, Range: op.Range, Offset: op.Offset, Value: op.Value,
					Detail: fmt.Sprintf("acked under epoch %d %v after its home lost the lease store (lease TTL %v)",
						op.Epoch, durMs(op.Return-ev.Start), h.LeaseTTL.Std())})
				break
			}
		}
	}
}

// replyHeld reports whether op's reply may have been held by a faulted
// link: its producer's region is not among the regions cut off from the
// lease store (cut[0]), and a partition or a latency fault between that
// region and one of those overlapped the op.
func replyHeld(h *History, op Op, cut [][]string) bool {
	if op.Process >= len(h.ProducerRegions) || len(cut) == 0 {
		return false
	}
	homes := cut[0]
	from := h.ProducerRegions[op.Process]
	if slices.Contains(homes, from) {
		return false // its client reaches the home directly
	}
	in := func(side []string, region string) bool {
		return slices.ContainsFunc(side, func(s string) bool { return s == region || strings.HasPrefix(s, region+":") })
	}
	for _, ev := range h.Faults {
		k := ev.Fault.Kind
		if (k != KindPartition && k != KindLatency) || len(ev.Sides) != 2 || ev.Start > op.Return || ev.End < op.Call {
			continue
		}
		for _, home := range homes {
			if (in(ev.Sides[0], from) && in(ev.Sides[1], home)) || (in(ev.Sides[1], from) && in(ev.Sides[0], home)) {
				return true
			}
		}
	}
	return false
}

// checkFinalEpochs reports a home's final log whose epochs go back along
// its offsets (records of epoch N+1 must follow those of epoch N).
func checkFinalEpochs(h *History, add func(Anomaly)) {
	last := map[uint32]Observation{}
	for _, o := range h.Reads {
		if !o.Final || o.Region != h.FinalHome(o.Range) {
			continue
		}
		if prev, ok := last[o.Range]; ok && o.Epoch < prev.Epoch {
			add(Anomaly{Kind: OutOfOrder, Range: o.Range, Offset: o.Offset, Value: o.Value,
				Detail: fmt.Sprintf("the home's final log goes back from epoch %d at offset %d to epoch %d", prev.Epoch, prev.Offset, o.Epoch)})
		}
		last[o.Range] = o
	}
}

func durMs(ns int64) string { return ms(Duration(ns).Std()) }
