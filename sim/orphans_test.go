package sim

import (
	"strings"
	"testing"

	"github.com/geolog/geolog/homing"
)

// TestOrphanLogContentsAreChecked: a fork that orphans one record less
// than it cut (Options.mutateOrphanDrop: its orphan log, and its record,
// start a record past the fork point) must be reported, at the fork (the
// copy held that record) or at the end (an acked record counted as
// orphaned that no orphan log holds).
func TestOrphanLogContentsAreChecked(t *testing.T) {
	for seed := int64(1); seed <= 30; seed++ {
		res, err := Run(Options{Seed: seed, Steps: 2500, Regions: 3, mutateOrphanDrop: true})
		if err == nil && res.Homing.Forks == 0 {
			continue
		}
		if err == nil || !(strings.Contains(err.Error(), "the orphan log of the fork") || strings.Contains(err.Error(), "is in no orphan log")) {
			t.Fatalf("seed %d: a fork whose orphan log lacks a record, unreported: %v", seed, err)
		}
		t.Log(err)
		return
	}
	t.Fatal("no seed of 30 forked")
}

// TestOrphanedAckRegion: an ack orphaned by a takeover is held against
// the copies of the region that acked it, the home of the epoch its
// offset was in. After two takeovers, the second starting below the
// first's start (seed 15 of the minute runs: r1 at 36, then r2 at 31),
// the offsets between the two starts were acked by the first home (r0),
// not by the latest grant's PrevRegion (r1).
func TestOrphanedAckRegion(t *testing.T) {
	h := &homeWorld{history: [][]grant{{
		{home: homing.Home{Region: "r1", Epoch: 2, StartOffset: 36}},
		{home: homing.Home{Region: "r2", Epoch: 3, StartOffset: 31}},
	}}}
	for _, c := range []struct {
		off          uint64
		epoch        uint64
		region, hist int
	}{
		{off: 20, epoch: 1, region: 0, hist: 2},
		{off: 33, epoch: 1, region: 0, hist: 1}, // before the second grant: r0's
		{off: 40, epoch: 2, region: 1, hist: 1},
		{off: 33, epoch: 3, region: 2, hist: 2}, // after it: the new home's
	} {
		h.history[0] = h.history[0][:c.hist]
		if e := h.epochAt(0, c.off); e != c.epoch {
			t.Errorf("offset %d with %d grants: epoch %d, want %d", c.off, c.hist, e, c.epoch)
		}
		if g := h.epochRegion(0, c.epoch); g != c.region {
			t.Errorf("epoch %d: region %d, want %d", c.epoch, g, c.region)
		}
		h.history[0] = h.history[0][:2]
	}
}
