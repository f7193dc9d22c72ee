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
		if err == nil || !strings.Contains(err.Error(), "but the range is homed in r") {
			t.Fatalf("seed %d: an old home acked past its lease after a takeover, unreported: %v", seed, err)
		}
		t.Log(err)
		return
	}
	t.Fatal("no seed of 30 took a range over")
}

// TestUnnecessaryTakeoverIsChecked reverts, in the simulator's agents,
// the fix of "a takeover right after a lease-store outage" (the agent
// waits a lease TTL plus the max offset of its own lease before judging
// other regions, homing.TakeoverConfig.SettleNanos): after an outage
// every region's liveness has expired, and an agent without the wait
// takes homes that were about to renew. The checker must report it.
func TestUnnecessaryTakeoverIsChecked(t *testing.T) {
	// Seed 11 is the first that finds it (at 4051 ms: make sim SEED=11
	// with the fix reverted in homing/takeover.go; then 27 and 31, later
	// in their minute); start there, 5 s each, to keep the test short.
	for seed := int64(11); seed <= 30; seed++ {
		_, err := Run(Options{Seed: seed, Steps: 5000, Regions: 3, mutateNoSettle: true})
		if err == nil {
			continue
		}
		if !strings.Contains(err.Error(), "an unnecessary failover") {
			t.Fatalf("seed %d: %v", seed, err)
		}
		t.Log(err)
		return
	}
	t.Fatal("no seed of 11-30 found the reverted settle wait")
}

// TestClockSkewPastTheMaxOffsetIsFound: clocks skewed past the max
// offset the leases assume let a taker judge an old home dead while the
// old home still acks by its own clock; the checker must report an ack
// from a fenced home (or a takeover the home's renewals should have
// prevented).
func TestClockSkewPastTheMaxOffsetIsFound(t *testing.T) {
	for seed := int64(1); seed <= 20; seed++ {
		_, err := Run(Options{Seed: seed, Steps: 2500, Regions: 3, mutateSkew: true})
		if err == nil {
			continue
		}
		if !strings.Contains(err.Error(), "but the range is homed in") && !strings.Contains(err.Error(), "an unnecessary failover") {
			t.Fatalf("seed %d: %v", seed, err)
		}
		t.Log(err)
		return
	}
	t.Fatal("no seed of 20 found clocks skewed past the max offset")
}

// TestShortStartIsChecked: a taker that continues one offset below its
// tail (what it holds there is the old home's, at the old epoch) leaves
// the old home's records past the new epoch's start in the new home's
// log; the checker must report it.
func TestShortStartIsChecked(t *testing.T) {
	for seed := int64(1); seed <= 20; seed++ {
		res, err := Run(Options{Seed: seed, Steps: 2500, Regions: 3, mutateShortStart: true})
		if res.Homing.Takeovers == 0 {
			continue
		}
		// Reported as an old-epoch frame past the start, as an acked
		// record counted as orphaned that the new home's log holds, as the
		// new home's log going on past a gap at the short start, or as
		// a mirror forking where the store says the epoch does not start
		// (its committed end then falls back where no fork explains it).
		if err == nil || !(strings.Contains(err.Error(), "past the start") || strings.Contains(err.Error(), "counted as orphaned") ||
			strings.Contains(err.Error(), "the range's epoch 2 starts at") || strings.Contains(err.Error(), "(invariant 8)") ||
			strings.Contains(err.Error(), ": a gap")) {
			t.Fatalf("seed %d: a takeover below the taker's tail, unreported: %v", seed, err)
		}
		t.Log(err)
		return
	}
	t.Fatal("no seed of 20 took a range over")
}
