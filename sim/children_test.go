package sim

import (
	"strings"
	"testing"
)

// TestSplitChildren: runs of one region that split range 0 open its
// children and write to them, clean (children.go).
func TestSplitChildren(t *testing.T) {
	var tot SplitResult
	for seed := int64(1); seed <= 8; seed++ {
		res, err := Run(Options{Seed: seed, Steps: 3000, Regions: 1, mut: mutations{splitAlways: true}})
		if err != nil {
			t.Fatalf("%v\n%v", err, res)
		}
		tot = tot.add(res.Splits)
	}
	t.Log(tot)
	if tot.Children != tot.Runs || tot.ChildRecords == 0 || tot.Moved == 0 {
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

// TestSplitChildAgain: a child of the split splits in turn; its
// children take the rest of its keys, and the checks hold across both
// splits (children.go).
func TestSplitChildAgain(t *testing.T) {
	var tot SplitResult
	for seed := int64(1); seed <= 8; seed++ {
		res, err := Run(Options{Seed: seed, Steps: 3000, Regions: 1, mut: mutations{splitAlways: true, resplitAlways: true}})
		if err != nil {
			t.Fatalf("%v\n%v", err, res)
		}
		tot = tot.add(res.Splits)
	}
	t.Log(tot)
	if tot.Resplit == 0 || tot.ChildRecords == 0 {
		t.Fatalf("second splits went unexercised: %v", tot)
	}
}
