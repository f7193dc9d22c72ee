package chaos

import (
	"fmt"
	"slices"
	"sort"
)

// AnomalyKind classifies what a checker found wrong.
type AnomalyKind string

// The anomalies of the queue checker (after Jepsen's queue and Kafka
// checkers, adapted to a log whose offsets are observable) and the
// linearizability checker.
const (
	// Lost: an acknowledged record is missing from the complete final
	// read of its range's home.
	Lost AnomalyKind = "lost"
	// Duplicated: one unique value observed at two offsets (an ambiguous
	// append too: it may be present or absent, never twice).
	Duplicated AnomalyKind = "duplicated"
	// Inconsistent: two observations of one offset disagree (value or
	// epoch; an ack counts as an observation), or a record was seen past
	// the home's final tail, or in another range than it was appended to,
	// or (after splits, checkSpans) in a range that does not own its key
	// or at or past the split offset of a range that split.
	Inconsistent AnomalyKind = "inconsistent"
	// OutOfOrder: two acknowledged records of one producer and key whose
	// offsets are in the opposite order of their sequence numbers.
	OutOfOrder AnomalyKind = "out-of-order"
	// Unexpected: a record read that no append attempted, or whose
	// append definitely failed.
	Unexpected AnomalyKind = "unexpected"
	// Gap: a reader of a range skipped or repeated an offset (offsets are
	// dense and each reader reads in order from 0).
	Gap AnomalyKind = "gap"
	// Stale: an ack the homing rules forbid: under a lease that may have
	// expired, or under an epoch older than one already in service
	// (checkEpochs).
	Stale AnomalyKind = "stale-epoch"
	// NonLinearizable: a range's appends and home reads have no
	// linearization in the log model (see CheckLinearizable).
	NonLinearizable AnomalyKind = "non-linearizable"
	// SplitRead: an offset read with two different records: a read of a
	// divergent tail (now in an orphan log) that returned after its node
	// could know of the newer epoch (checktimeline.go).
	SplitRead AnomalyKind = "split-read"
	// Replicas: a range ended with another number of voters than the
	// replication factor, or with a learner, in a region (checkReplicas:
	// scenarios that join, drain or replace nodes).
	Replicas AnomalyKind = "replicas"
)

// AnomalyKinds lists the kinds in report order.
var AnomalyKinds = []AnomalyKind{Lost, Duplicated, Inconsistent, OutOfOrder, Unexpected, Gap, Stale, NonLinearizable, SplitRead, Replicas}

// Anomaly is one finding.
type Anomaly struct {
	Kind   AnomalyKind `json:"kind"`
	Range  uint32      `json:"range"`
	Offset uint64      `json:"offset"`
	Value  string      `json:"value,omitempty"`
	Detail string      `json:"detail"`
}

func (a Anomaly) String() string {
	v := a.Value
	if len(v) > 40 {
		v = v[:40] + "…"
	}
	return fmt.Sprintf("%s r%d@%d %q: %s", a.Kind, a.Range, a.Offset, v, a.Detail)
}

// anomaliesKept bounds the anomalies a result lists (counts stay exact).
const anomaliesKept = 50

// QueueResult is the queue checker's verdict.
type QueueResult struct {
	Attempted, Acked, Failed, Ambiguous int
	// Deduplicated counts acks of resent batches the server recognised
	// (evidence that the retry path ran).
	Deduplicated int
	// AmbiguousPresent counts ambiguous appends found in the home's final
	// read (the others are absent: both are allowed).
	AmbiguousPresent int
	// Orphaned counts acknowledged records found in an orphan log instead
	// of the final log (allowed after an unplanned failover of their
	// home: the RPO suffered); OrphanRecords counts every record of the
	// orphan logs (acked or not). Both are -1 when the history has no
	// orphan logs read.
	Orphaned, OrphanRecords int
	Counts                  map[AnomalyKind]int
	Anomalies               []Anomaly
	// Unverified lists ranges whose home final read did not complete:
	// their losses could not be judged.
	Unverified []string
	// Unconverged lists copies ("region/range") whose final read is
	// shorter than the home's: a liveness finding, not a safety one.
	Unconverged []string
}

func (q *QueueResult) add(a Anomaly) {
	if q.Counts == nil {
		q.Counts = map[AnomalyKind]int{}
	}
	q.Counts[a.Kind]++
	if len(q.Anomalies) < anomaliesKept {
		q.Anomalies = append(q.Anomalies, a)
	}
}

// Total is the number of anomalies.
func (q *QueueResult) Total() int {
	n := 0
	for _, c := range q.Counts {
		n += c
	}
	return n
}

type position struct {
	rng    uint32
	offset uint64
}

// seen is the first observation of an offset, the reference the others
// must match.
type seen struct {
	value  string
	epoch  uint64
	source string
}

// CheckQueue checks a history as a queue whose positions are observable:
// see the AnomalyKind constants for what it reports. Appends with unknown
// outcome may be present or absent, but not twice.
func CheckQueue(h *History) QueueResult {
	q := QueueResult{Orphaned: -1, OrphanRecords: -1}
	orphans := indexOrphans(h, q.add)
	if h.OrphansRead {
		q.Orphaned, q.OrphanRecords = 0, len(orphans.at)
	}
	attempts := map[string]*Op{}
	for i := range h.Ops {
		op := &h.Ops[i]
		if op.Kind != OpAppend {
			continue
		}
		if _, dup := attempts[op.Value]; dup {
			// Values are unique by construction (EncodeValue): two
			// attempts of one value are a harness bug, not a finding.
			panic(fmt.Sprintf("chaos: value %q attempted twice", op.Value))
		}
		attempts[op.Value] = op
		q.Attempted++
		switch op.Outcome {
		case OK:
			q.Acked++
			if op.Duplicate {
				q.Deduplicated++
			}
		case Fail:
			q.Failed++
		default:
			q.Ambiguous++
		}
	}

	at := map[position]seen{}               // offset → its first observation
	where := map[string]map[position]bool{} // value → the offsets it was seen at
	observe := func(p position, s seen) {
		if where[s.value] == nil {
			where[s.value] = map[position]bool{}
		}
		where[s.value][p] = true
		first, ok := at[p]
		if !ok {
			at[p] = s
			return
		}
		if first.value != s.value || first.epoch != s.epoch {
			q.add(Anomaly{Kind: Inconsistent, Range: p.rng, Offset: p.offset, Value: s.value,
				Detail: fmt.Sprintf("%s saw epoch %d %.40q; %s saw epoch %d %.40q", first.source, first.epoch, first.value, s.source, s.epoch, s.value)})
		}
	}
	// Acks first: an acknowledged offset is the reference reads must match.
	// An ack of a record now in an orphan log is checked against it below.
	orphanedAck := map[string]bool{}
	for _, op := range h.Ops {
		if op.Kind == OpAppend && op.Outcome == OK {
			if orphans.holds(op.Range, op.Offset, op.Epoch, op.Value) {
				orphanedAck[op.Value] = true
				continue
			}
			observe(position{op.Range, op.Offset}, seen{op.Value, op.Epoch, "ack"})
		}
	}
	// The orphan logs hold only records some producer attempted.
	for p, v := range orphans.at {
		if op, ok := attempts[v]; !ok || op.Outcome == Fail {
			q.add(Anomaly{Kind: Unexpected, Range: p.rng, Offset: p.offset, Value: v,
				Detail: "an orphan log holds a record no producer attempted, or whose append definitely failed"})
		}
	}

	// Each (source, range) reads in offset order from 0; it may go back
	// to a fork point only (a reader told that it read a divergent tail
	// reads the log again from where it forked).
	type stream struct {
		source string
		rng    uint32
	}
	next := map[stream]uint64{}
	for _, o := range h.Reads {
		s := stream{o.Source, o.Range}
		want := next[s]
		switch {
		case o.Offset > want:
			q.add(Anomaly{Kind: Gap, Range: o.Range, Offset: o.Offset, Value: o.Value,
				Detail: fmt.Sprintf("%s skipped offsets [%d, %d)", o.Source, want, o.Offset)})
		case o.Offset < want && orphans.isForkPoint(o.Range, o.Offset):
			want = o.Offset // rewound to a fork point
		case o.Offset < want:
			q.add(Anomaly{Kind: Gap, Range: o.Range, Offset: o.Offset, Value: o.Value,
				Detail: fmt.Sprintf("%s went back from %d to %d", o.Source, want, o.Offset)})
		}
		if o.Offset >= want {
			next[s] = o.Offset + 1
		}
		// A read of a divergent tail before its fork: the orphan log
		// holds what it saw.
		if !orphans.holds(o.Range, o.Offset, o.Epoch, o.Value) {
			observe(position{o.Range, o.Offset}, seen{o.Value, o.Epoch, o.Source})
		}

		op, attempted := attempts[o.Value]
		switch {
		case !attempted:
			q.add(Anomaly{Kind: Unexpected, Range: o.Range, Offset: o.Offset, Value: o.Value,
				Detail: o.Source + " read a record no producer attempted"})
		case op.Outcome == Fail:
			q.add(Anomaly{Kind: Unexpected, Range: o.Range, Offset: o.Offset, Value: o.Value,
				Detail: fmt.Sprintf("%s read a record whose append definitely failed (%s)", o.Source, op.Err)})
		case op.Range != o.Range:
			q.add(Anomaly{Kind: Inconsistent, Range: o.Range, Offset: o.Offset, Value: o.Value,
				Detail: fmt.Sprintf("%s read it in range %d; it was appended to range %d", o.Source, o.Range, op.Range)})
		}
	}

	// The home's final read is the log: loss, and the tails of the others.
	homeFinal := make([]map[string]bool, h.RangeCount())
	homeTail := make([]uint64, h.RangeCount())
	for rng := range h.RangeCount() {
		if h.FinalRead[FinalKey(h.FinalHome(rng), rng)] {
			homeFinal[rng] = map[string]bool{}
		} else {
			q.Unverified = append(q.Unverified, FinalKey(h.FinalHome(rng), rng))
		}
	}
	finalLen := map[string]uint64{}
	for _, o := range h.Reads {
		if !o.Final {
			continue
		}
		finalLen[FinalKey(o.Region, o.Range)] = max(finalLen[FinalKey(o.Region, o.Range)], o.Offset+1)
		if o.Range < h.RangeCount() && o.Region == h.FinalHome(o.Range) && homeFinal[o.Range] != nil {
			homeFinal[o.Range][o.Value] = true
			homeTail[o.Range] = max(homeTail[o.Range], o.Offset+1)
		}
	}
	for _, o := range h.Reads {
		if o.Range < h.RangeCount() && homeFinal[o.Range] != nil && o.Offset >= homeTail[o.Range] && !orphans.holds(o.Range, o.Offset, o.Epoch, o.Value) {
			q.add(Anomaly{Kind: Inconsistent, Range: o.Range, Offset: o.Offset, Value: o.Value,
				Detail: fmt.Sprintf("%s read it past the home's final tail %d", o.Source, homeTail[o.Range])})
		}
	}
	for rng := range h.RangeCount() {
		if homeFinal[rng] == nil {
			continue
		}
		for _, region := range h.Regions {
			k := FinalKey(region, rng)
			if region != h.FinalHome(rng) && (!h.FinalRead[k] || finalLen[k] < homeTail[rng]) {
				q.Unconverged = append(q.Unconverged, k)
			}
		}
	}
	for i := range h.Ops {
		op := &h.Ops[i]
		if op.Kind != OpAppend {
			continue
		}
		if op.Range >= h.RangeCount() {
			// A range the history has no home of (a split's child the
			// final reads did not cover): nothing to judge it against.
			if k := FinalKey("?", op.Range); op.Outcome == OK && !slices.Contains(q.Unverified, k) {
				q.Unverified = append(q.Unverified, k)
			}
			continue
		}
		if homeFinal[op.Range] == nil {
			continue
		}
		present := homeFinal[op.Range][op.Value]
		switch {
		case op.Outcome == OK && orphanedAck[op.Value]:
			switch {
			case present:
				q.add(Anomaly{Kind: Duplicated, Range: op.Range, Offset: op.Offset, Value: op.Value,
					Detail: fmt.Sprintf("acknowledged at offset %d epoch %d, forked off into the orphan log, and in the home's final log too", op.Offset, op.Epoch)})
			case !orphanAllowed(h, op.Range, op.Epoch):
				q.add(Anomaly{Kind: Lost, Range: op.Range, Offset: op.Offset, Value: op.Value,
					Detail: fmt.Sprintf("acknowledged at offset %d epoch %d, found only in an orphan log, and no fault took its home region away", op.Offset, op.Epoch)})
			default:
				q.Orphaned++
			}
		case op.Outcome == OK && !present:
			q.add(Anomaly{Kind: Lost, Range: op.Range, Offset: op.Offset, Value: op.Value,
				Detail: fmt.Sprintf("acknowledged at offset %d epoch %d, absent from the home's final read (tail %d)", op.Offset, op.Epoch, homeTail[op.Range])})
		case op.Outcome == Info && present:
			q.AmbiguousPresent++
		}
	}

	// One value, one offset.
	values := make([]string, 0, len(where))
	for value := range where {
		values = append(values, value)
	}
	sort.Strings(values)
	for _, value := range values {
		ps := where[value]
		if len(ps) < 2 {
			continue
		}
		var list []position
		for p := range ps {
			list = append(list, p)
		}
		sort.Slice(list, func(i, j int) bool {
			return list[i].rng < list[j].rng || (list[i].rng == list[j].rng && list[i].offset < list[j].offset)
		})
		q.add(Anomaly{Kind: Duplicated, Range: list[0].rng, Offset: list[0].offset, Value: value,
			Detail: fmt.Sprintf("seen at %d offsets: %v", len(list), list)})
	}

	// Per producer and key, acknowledged offsets follow sequence numbers.
	type pk struct {
		producer int
		key      string
	}
	type acked struct {
		seq    uint64
		offset uint64
		value  string
		rng    uint32
	}
	byKey := map[pk][]acked{}
	var keys []pk
	for i := range h.Ops {
		op := &h.Ops[i]
		if op.Kind != OpAppend || op.Outcome != OK || orphanedAck[op.Value] {
			continue
		}
		p, key, seq, ok := DecodeValue(op.Value)
		if !ok {
			continue
		}
		if byKey[pk{p, key}] == nil {
			keys = append(keys, pk{p, key})
		}
		byKey[pk{p, key}] = append(byKey[pk{p, key}], acked{seq, op.Offset, op.Value, op.Range})
	}
	for _, k := range keys {
		list := byKey[k]
		sort.Slice(list, func(i, j int) bool { return list[i].seq < list[j].seq })
		for i := 1; i < len(list); i++ {
			// A key's records after a split are in a child, whose id is
			// above every id the stream had (keyspace: ids grow, never
			// reused), so a key's place in its log is (range, offset).
			if list[i].rng < list[i-1].rng || (list[i].rng == list[i-1].rng && list[i].offset <= list[i-1].offset) {
				q.add(Anomaly{Kind: OutOfOrder, Range: list[i].rng, Offset: list[i].offset, Value: list[i].value,
					Detail: fmt.Sprintf("producer %d key %s: seq %d at %d/%d, seq %d at %d/%d",
						k.producer, k.key, list[i-1].seq, list[i-1].rng, list[i-1].offset, list[i].seq, list[i].rng, list[i].offset)})
			}
		}
	}
	checkFinalEpochs(h, q.add)
	checkEpochs(h, q.add)
	checkSplitReads(h, orphans, q.add)
	checkSpans(h, orphanedAck, q.add)
	checkReplicas(h, q.add)
	sort.Strings(q.Unverified)
	sort.Strings(q.Unconverged)
	return q
}
