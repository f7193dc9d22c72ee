package chaos

import (
	"fmt"
	"slices"
	"testing"

	"github.com/geolog/geolog/keyspace"
)

// splitKeys returns a key whose hash is below at and one whose hash is not.
func splitKeys(at uint64) (left, right string) {
	for i := 0; left == "" || right == ""; i++ {
		k := fmt.Sprintf("k%d", i)
		if keyspace.Hash([]byte(k)) < at {
			left = cmpOr(left, k)
		} else {
			right = cmpOr(right, k)
		}
	}
	return left, right
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// splitHistory is one producer on a stream of one range (us) that split at
// offset 2 into ranges 1 (hashes below 1<<63) and 2: each key's records
// before the split are in range 0, after it in the child owning the key.
// place lists, per record in producer order, where it was acked; the final
// reads and a consumer read the logs these acks make.
type splitRecord struct {
	key    string
	seq    uint64
	rng    uint32
	offset uint64
}

func splitHistory(recs []splitRecord) *History {
	const at = uint64(1) << 63
	b := newHB([]string{"us"}, "us", "us", "us")
	logs := map[uint32][]Observation{}
	for _, r := range recs {
		v := b.append(OK, 0, r.rng, r.key, r.seq, r.offset, 1)
		b.h.Ops[len(b.h.Ops)-1].Key = r.key
		logs[r.rng] = append(logs[r.rng], Observation{Region: "us", Range: r.rng, Offset: r.offset, Epoch: 1, Key: r.key, Value: v})
	}
	for _, rng := range []uint32{0, 1, 2} {
		list := logs[rng]
		slices.SortFunc(list, func(a, b Observation) int { return int(a.Offset) - int(b.Offset) })
		for _, src := range []string{"consume/us", "final/us"} {
			for _, o := range list {
				o.Source, o.Final, o.At = src, src == "final/us", b.tick()
				b.h.Reads = append(b.h.Reads, o)
			}
		}
		b.h.FinalRead[FinalKey("us", rng)] = true
	}
	b.h.Spans = []RangeSpan{
		{Range: 0, HashStart: 0, HashEnd: ^uint64(0), Children: []uint32{1, 2}, SplitOffset: 2},
		{Range: 1, HashStart: 0, HashEnd: at - 1},
		{Range: 2, HashStart: at, HashEnd: ^uint64(0)},
	}
	return b.history()
}

// TestCheckersAcrossSplit: a history across a split passes, and the
// checkers find a lost record, a duplicate in parent and child, a key's
// records out of order across the split, a record past the split offset
// and a key in the child that does not own it.
func TestCheckersAcrossSplit(t *testing.T) {
	left, right := splitKeys(1 << 63)
	good := []splitRecord{
		{left, 0, 0, 0}, {right, 0, 0, 1}, // the parent's log: [0, 2)
		{left, 1, 1, 0}, {right, 1, 2, 0}, {left, 2, 1, 1}, // the children's
	}
	if q := CheckQueue(splitHistory(good)); q.Total() != 0 || len(q.Unverified) != 0 {
		t.Fatalf("a good history across a split: %v (unverified %v)", q.Anomalies, q.Unverified)
	}
	for _, tc := range []struct {
		name string
		edit func(h *History)
		recs []splitRecord
		want AnomalyKind
	}{
		{name: "a child's record lost", want: Lost, edit: func(h *History) {
			h.Reads = slices.DeleteFunc(h.Reads, func(o Observation) bool { return o.Final && o.Range == 1 && o.Offset == 1 })
		}},
		{name: "a parent's record again in a child", want: Duplicated, edit: func(h *History) {
			o := h.Reads[slices.IndexFunc(h.Reads, func(o Observation) bool { return o.Final && o.Range == 0 && o.Offset == 0 })]
			o.Range, o.Offset = 1, 2
			h.Reads = append(h.Reads, o)
		}},
		{name: "a key's later record in the parent", want: OutOfOrder, recs: []splitRecord{
			{left, 0, 1, 0}, {left, 1, 0, 0}, {right, 0, 0, 1}, {right, 1, 2, 0},
		}},
		{name: "a record past the split offset", want: Inconsistent, recs: append(slices.Clone(good), splitRecord{right, 2, 0, 2})},
		{name: "a key in the child that does not own it", want: Inconsistent, recs: []splitRecord{
			{left, 0, 0, 0}, {right, 0, 0, 1}, {right, 1, 1, 0},
		}},
	} {
		recs := tc.recs
		if recs == nil {
			recs = good
		}
		h := splitHistory(recs)
		if tc.edit != nil {
			tc.edit(h)
		}
		if q := CheckQueue(h); q.Counts[tc.want] == 0 {
			t.Errorf("%s: no %s found (%v)", tc.name, tc.want, q.Anomalies)
		}
	}
}

// TestCheckReplicas: after a join or drain every range must end with the
// replication factor of voters and no learner in every region: four
// voters (two concurrent moves of one range), a learner left behind, two
// voters, or a range whose replicas could not be described are found.
func TestCheckReplicas(t *testing.T) {
	h := goodHistory().history()
	h.ReplicationFactor = 3
	h.Replicas = []ReplicaSet{{Range: 0, Region: "us", Voters: []uint64{1, 3, 4}}, {Range: 0, Region: "eu", Voters: []uint64{1, 2, 3}}}
	if q := CheckQueue(h); q.Total() != 0 {
		t.Fatalf("three voters each: %v", q.Anomalies)
	}
	for _, bad := range []ReplicaSet{
		{Range: 1, Region: "us", Voters: []uint64{1, 2, 3, 4}},
		{Range: 1, Region: "us", Voters: []uint64{1, 2, 3}, Learners: []uint64{4}},
		{Range: 1, Region: "us", Voters: []uint64{1, 2}},
		{Range: 1, Region: "us", Err: "no leader"},
	} {
		c := *h
		c.Replicas = append(slices.Clone(h.Replicas), bad)
		if q := CheckQueue(&c); q.Counts[Replicas] != 1 {
			t.Errorf("%+v: %d replicas anomalies, want 1 (%v)", bad, q.Counts[Replicas], q.Anomalies)
		}
	}
}

// TestCheckNotReplaced: a range that still named a node killed past the
// dead-node time when it returned is a replicas anomaly.
func TestCheckNotReplaced(t *testing.T) {
	h := goodHistory().history()
	h.Faults = []FaultEvent{{What: "kill [us:n3]"}}
	if q := CheckQueue(h); q.Counts[Replicas] != 0 {
		t.Fatalf("every range rebuilt: %v", q.Anomalies)
	}
	h.Faults[0].NotReplaced = []uint32{1}
	if q := CheckQueue(h); q.Counts[Replicas] != 1 {
		t.Errorf("range 1 left on the dead node: %v", q.Anomalies)
	}
}
