package segment

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/vfs"
)

// sharedStores opens n stores in one file system that share a SyncGroup,
// counting Datasyncs through the vfs fault layer; hold, when set, is
// called before every fdatasync reaches the file system.
func sharedStores(t *testing.T, n int, hold func(name string)) ([]*Store, *vfs.Faults, *vfs.SyncGroup) {
	t.Helper()
	m := vfs.NewMem(rand.New(rand.NewPCG(1, 2)))
	var faults vfs.Faults
	fsys := vfs.WithFaults(m, &faults)
	g := vfs.NewSyncGroup()
	stores := make([]*Store, n)
	for i := range stores {
		cfg := smallConfig(t, env{fs: fsys, dir: fmt.Sprintf("/r%d", i), mem: m})
		cfg.SegmentBytesMax = 1 << 20 // no roll: every Sync is one fdatasync
		cfg.SyncGroup = g
		stores[i] = mustOpen(t, cfg)
		t.Cleanup(func() { stores[i].Close() })
	}
	if hold != nil {
		m.SetHook(func(op vfs.Op, name string) error {
			if op == vfs.OpDatasync {
				hold(name)
			}
			return nil
		})
	}
	return stores, &faults, g
}

// syncAll appends a frame to each store and Syncs them all at once,
// returning each Sync's error.
func syncAll(t *testing.T, stores []*Store) []error {
	t.Helper()
	errs := make([]error, len(stores))
	var wg sync.WaitGroup
	for i, s := range stores {
		if err := s.Append(makeFrame(s.NextOffset(), 1, 0)); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = s.Sync() }()
	}
	wg.Wait()
	return errs
}

// Range logs sharing a node's SyncGroup make their appends durable in
// shared rounds: stores syncing while one round is in flight are flushed
// together in the next, so rounds stay far below Syncs, and each Sync
// returns only once its own frames are durable.
func TestSyncGroupSharedByStores(t *testing.T) {
	const n = 12
	gate := make(chan struct{})
	var once sync.Once
	first := make(chan struct{})
	stores, faults, g := sharedStores(t, n, func(string) {
		// Hold the first fdatasync until every store has asked for its
		// Sync, so that the other stores line up behind it.
		once.Do(func() { close(first); <-gate })
	})
	var opened sync.Once
	openGate := func() { opened.Do(func() { close(gate) }) }
	t.Cleanup(openGate) // before the stores close, should the test fail
	syncsBefore, roundsBefore := faults.Datasyncs(), g.Rounds()
	done := make(chan []error, 1)
	go func() { done <- syncAll(t, stores) }()
	<-first
	deadline := time.Now().Add(10 * time.Second)
	for g.Rounds()-roundsBefore != 1 || faults.Datasyncs()-syncsBefore != 1 || !allWaiting(g, n-1) {
		if time.Now().After(deadline) {
			t.Fatalf("the other stores did not line up behind the first flush: %d rounds, %d fdatasyncs", g.Rounds()-roundsBefore, faults.Datasyncs()-syncsBefore)
		}
		time.Sleep(time.Millisecond)
	}
	openGate()
	for i, err := range <-done {
		if err != nil {
			t.Fatalf("store %d: %v", i, err)
		}
	}
	if r := g.Rounds() - roundsBefore; r != 2 {
		t.Fatalf("%d rounds for %d stores syncing while one flush was in flight, want 2", r, n)
	}
	for i, s := range stores {
		if s.DurableOffset() != s.NextOffset() {
			t.Fatalf("store %d: durable %d of %d after its Sync", i, s.DurableOffset(), s.NextOffset())
		}
	}
}

// allWaiting reports whether n callers wait in g's next round.
func allWaiting(g *vfs.SyncGroup, n int) bool { return g.Waiting() == n }

// A failed shared flush reaches every store it covered: each fails (its
// Sync returns ErrFailed wrapping the cause), stays failed when the disk
// recovers, and never retries the fdatasync (fsyncgate).
func TestSyncGroupFailureFailsEveryCoveredStore(t *testing.T) {
	const n = 6
	stores, faults, _ := sharedStores(t, n, nil)
	faults.SetSyncFail(true)
	for i, err := range syncAll(t, stores) {
		if !errors.Is(err, ErrFailed) || !errors.Is(err, vfs.ErrInjected) {
			t.Fatalf("store %d: Sync with a failing shared flush: %v, want ErrFailed wrapping the injected error", i, err)
		}
	}
	faults.SetSyncFail(false)
	calls := faults.Datasyncs()
	for i, s := range stores {
		if err := s.Sync(); !errors.Is(err, ErrFailed) {
			t.Fatalf("store %d: Sync after the disk recovered: %v, want ErrFailed", i, err)
		}
		if s.DurableOffset() != 0 {
			t.Fatalf("store %d: durable offset %d after a failed flush", i, s.DurableOffset())
		}
	}
	if faults.Datasyncs() != calls {
		t.Fatalf("a failed store retried fdatasync: %d calls, then %d", calls, faults.Datasyncs())
	}
}
