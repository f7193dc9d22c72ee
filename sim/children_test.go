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

func TestChildMutationsScan(t *testing.T) {
	for _, m := range []childMutation{childWrongRoute, childEarly, childOpenEarly} {
		caught := 0
		for seed := int64(1); seed <= 20; seed++ {
			_, err := Run(Options{Seed: seed, Steps: 3000, Regions: 1, mut: mutations{splitAlways: true, child: m}})
			if err != nil {
				caught++
				if caught < 3 {
					t.Logf("mutation %d seed %d: %v", m, seed, strings.TrimSpace(err.Error()))
				}
			}
		}
		t.Logf("mutation %d: caught in %d of 20", m, caught)
	}
}
