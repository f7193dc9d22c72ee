package sim

import "testing"

// TestMovesSeeds: runs of one region with spares that join, a drained
// node, planner and operator moves (moves.go), clean.
func TestMovesSeeds(t *testing.T) {
	for seed := int64(1); seed <= 6; seed++ {
		res, err := Run(Options{Seed: seed, Steps: 3000, Regions: 1, mut: mutations{movesAlways: true}})
		if err != nil {
			t.Fatalf("%v\n%v", err, res)
		}
		t.Log(res.Moves)
		if res.Moves.Done == 0 {
			t.Errorf("seed %d: no move done: %v", seed, res.Moves)
		}
	}
}
