package sim

import (
	"fmt"
	"strings"
	"testing"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/replica"
)

// TestSplitChildren: runs of one region that split range 0 open its
// children and write to them, clean; on seed 2 a child splits in turn
// (children.go). Part of make test's fixed slice.
func TestSplitChildren(t *testing.T) {
	var tot SplitResult
	for seed := int64(1); seed <= 2; seed++ {
		res, err := Run(Options{Seed: seed, Steps: 3000, Regions: 1, mut: mutations{splitAlways: true, resplitAlways: seed == 2}})
		if err != nil {
			t.Fatalf("%v\n%v", err, res)
		}
		tot = tot.add(res.Splits)
	}
	t.Log(tot)
	if tot.Children != tot.Runs || tot.ChildRecords == 0 || tot.Moved == 0 || tot.Resplit == 0 {
		t.Fatalf("children went unexercised: %v", tot)
	}
}

// TestChildWrongRouteCaught: producers that send a key's records to the
// child not owning its hash are reported (seed 1).
func TestChildWrongRouteCaught(t *testing.T) {
	_, err := Run(Options{Seed: 1, Steps: 3000, Regions: 1, mut: mutations{splitAlways: true, child: childWrongRoute}})
	if err == nil || !strings.Contains(err.Error(), "in the child that does not own it") {
		t.Fatalf("records routed to the wrong child went unreported: %v", err)
	}
}

// TestChildEarlyCaught: a producer that starts batches on its child while
// a batch of its key is unanswered on the parent breaks the key's order
// when the parent refuses that batch and it goes to the child after the
// later ones: reported (seed 1).
func TestChildEarlyCaught(t *testing.T) {
	_, err := Run(Options{Seed: 1, Steps: 3000, Regions: 1, mut: mutations{splitAlways: true, child: childEarly}})
	if err == nil || !strings.Contains(err.Error(), "per-key order broken across the split") {
		t.Fatalf("a key's records out of order across the split went unreported: %v", err)
	}
}

// TestChildDuplicateCaught: a record of the parent, below its split
// offset, that a child commits too (what a RANGE_SPLIT answered for a
// batch already in the parent would make the producer do) is reported:
// the tamper proposes a copy of the parent's last record to the child
// owning its key once the children are open (seed 1).
func TestChildDuplicateCaught(t *testing.T) {
	tamper := func(w *world) bool {
		s := w.splits
		if !s.kids.open || len(w.canonical[s.r]) == 0 {
			return false
		}
		v := w.canonical[s.r][len(w.canonical[s.r])-1]
		var pid, rr, n int
		if _, err := fmt.Sscanf(v, "p%d/r%d/s%d", &pid, &rr, &n); err != nil {
			t.Fatalf("parent record %q: %v", v, err)
		}
		l := w.leaderOf(0, s.trueOwner(pid))
		if l == nil {
			return false
		}
		frame := batch.Encode(nil, batch.Header{Type: batch.TypeData, ProducerID: 999}, []batch.Record{{Key: []byte(fmt.Sprintf("p%d", pid)), Value: []byte(v)}})
		l.replicas[s.trueOwner(pid)].Propose(&replica.Op{ProducerID: 999, RecordCount: 1, Frame: frame, Reply: func(replica.Result) {}})
		return true
	}
	_, err := Run(Options{Seed: 1, Steps: 3000, Regions: 1, mut: mutations{splitAlways: true}, tamper: tamper})
	if err == nil || !strings.Contains(err.Error(), "is in range 0 too") {
		t.Fatalf("a record in the parent and in a child went unreported: %v", err)
	}
}
