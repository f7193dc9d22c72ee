package sim

import (
	"errors"
	"fmt"
	"sort"
	"testing"
)

// errDetectorSkip ends a run of detectorScenario whose seed moves or
// splits (their crashes and cuts would mix with the scenario's).
var errDetectorSkip = errors.New("sim: seed moves or splits")

// detectorTimes are the scenario's faults, in virtual ms: node 2 crashes
// and restarts, node 3 is cut off long, node 1 short.
const (
	detCrashAt, detRestartAt = 1000, 1600
	detLongCut, detLongHeal  = 2500, 4000
	detShortCut, detShortEnd = 5000, 5300
	detSteps                 = 6500
)

// detectorScenario runs seed under the scenario, observing every node's
// view of its peers each virtual ms, and returns what the views broke of
// the product's delays (empty: none); skipped if the seed moves or
// splits.
func detectorScenario(seed int64, instant bool) (broken []string, skipped bool, err error) {
	type view struct{ n, p int }
	was := map[view]bool{}
	first := map[string]string{} // by kind of fault: the first delay broken
	note := func(kind, format string, args ...any) {
		if _, ok := first[kind]; !ok {
			first[kind] = fmt.Sprintf(format, args...)
		}
	}
	crashFound, cutFound := false, false
	tamper := func(w *world) bool {
		if w.now == 0 {
			if w.moves.on || w.splits.on {
				w.err = errDetectorSkip
				return true
			}
			w.crashP, w.cutP, w.syncCrashP = 0, 0, 0
		}
		switch w.now {
		case detCrashAt:
			w.crash(w.node(0, 2))
			w.node(0, 2).downTill = detRestartAt
		case detLongCut:
			w.node(0, 3).cutTill = detLongHeal
		case detShortCut:
			w.node(0, 1).cutTill = detShortEnd
		}
		for _, n := range w.regionNodes(0) {
			for p := 1; p <= w.perRegion; p++ {
				if !n.up || p == n.id {
					continue
				}
				down := w.peerDown(n, uint64(p))
				v := view{n.id, p}
				if down == was[v] {
					continue
				}
				was[v] = down
				if down {
					crashFound, cutFound = checkDown(w.now, n.id, p, note, crashFound, cutFound)
				}
			}
		}
		return false
	}
	res, err := Run(Options{Seed: seed, Steps: detSteps, Regions: 1, tamper: tamper, mut: mutations{instantDetector: instant}})
	if errors.Is(err, errDetectorSkip) {
		return nil, true, nil
	}
	if err != nil {
		return nil, false, err
	}
	if res.Crashes != 1 || res.Partitions != 0 {
		return nil, true, nil // a random fault before the rates were zeroed
	}
	if !crashFound {
		note("crash", "no peer found node 2 down between its crash at %d ms and its restart at %d", detCrashAt, detRestartAt)
	}
	if !cutFound {
		note("cut", "no node found node 3 cut off (%d-%d ms) down, or node 3 any peer", detLongCut, detLongHeal)
	}
	for _, b := range first {
		broken = append(broken, b)
	}
	sort.Strings(broken)
	return broken, false, nil
}

// checkDown checks that node n finding peer p down at now fits the
// scenario's faults and the product's delays, and returns whether the
// crash and the long cut were found yet.
func checkDown(now int64, n, p int, note func(kind, format string, args ...any), crashFound, cutFound bool) (bool, bool) {
	crashMin := scaledMs(reconnectBackoffMin / 2) // the shortest backoff's jitter
	cutMin := scaledMs(keepaliveTimeout + handshakeTimeout)
	switch {
	case p == 2 && now >= detCrashAt && now <= detRestartAt:
		if now < detCrashAt+crashMin {
			note("crash", "node %d found node 2 down %d ms after its crash: a refused dial comes a backoff (at least %d ms) after the stream broke", n, now-detCrashAt, crashMin)
		}
		return true, cutFound
	case (p == 3 || n == 3) && now >= detLongCut && now <= detLongHeal+cutMin:
		// (a dial begun during the cut may fail after it healed)
		if now < detLongCut+cutMin {
			note("cut", "node %d found node %d down %d ms into a cut: a keepalive and a handshake timeout (%d ms) must pass first", n, p, now-detLongCut, cutMin)
		}
		return crashFound, true
	case (p == 1 || n == 1) && now >= detShortCut && now < detShortCut+cutMin:
		note("short", "node %d found node %d down %d ms into a cut of %d ms, shorter than the keepalive timeout", n, p, now-detShortCut, detShortEnd-detShortCut)
	case now > 0:
		note("other", "node %d found node %d down at %d ms, with no fault to find", n, p, now)
	}
	return crashFound, cutFound
}

// TestDetectorDelays: each node's failure detector finds a crashed peer
// down a reconnect backoff after the crash, not at once, one cut off a
// keepalive and a handshake timeout after the cut, and one cut off for
// less never (detector.go); the instant detector (the simulator's before:
// the mutation) breaks all three.
func TestDetectorDelays(t *testing.T) {
	ran := 0
	for seed := int64(1); seed <= 30 && ran < 2; seed++ {
		broken, skipped, err := detectorScenario(seed, false)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if skipped {
			continue
		}
		ran++
		for _, b := range broken {
			t.Errorf("seed %d: %s", seed, b)
		}
		broken, _, err = detectorScenario(seed, true)
		if err != nil {
			t.Fatalf("seed %d, instant detector: %v", seed, err)
		}
		if len(broken) < 3 {
			t.Errorf("seed %d: the instant detector broke %d of the 3 delays: %q", seed, len(broken), broken)
		}
		t.Logf("seed %d, instant detector: %q", seed, broken)
	}
	if ran == 0 {
		t.Fatal("no seed of 1-30 runs without moves and splits")
	}
}
