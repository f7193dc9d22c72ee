package sim

import (
	"strings"
	"testing"
)

// TestFencingIsChecked: an old home that admits and acks appends without
// its lease (the mutation) acks after a takeover; the checker reports it.
func TestFencingIsChecked(t *testing.T) {
	for seed := int64(1); seed <= 30; seed++ {
		res, err := Run(Options{Seed: seed, Steps: 2500, Regions: 3, tamper: func(w *world) bool {
			w.mutateNoLease = true
			return true
		}})
		if res.Homing.Takeovers == 0 {
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "but the range is homed in r1") {
			t.Fatalf("seed %d: an old home acked past its lease after a takeover, unreported: %v", seed, err)
		}
		t.Log(err)
		return
	}
	t.Fatal("no seed of 30 took a range over")
}
