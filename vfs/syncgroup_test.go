package vfs

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"
)

// heldSyncs is a Mem hook that holds every Datasync until released,
// announcing each on entered.
type heldSyncs struct {
	entered chan string
	release chan struct{}
}

func holdSyncs(m *Mem) *heldSyncs {
	h := &heldSyncs{entered: make(chan string, 64), release: make(chan struct{}, 64)}
	m.SetHook(func(op Op, name string) error {
		if op == OpDatasync {
			h.entered <- name
			<-h.release
		}
		return nil
	})
	return h
}

// waitEntered waits for the next held Datasync and returns its file's name.
func (h *heldSyncs) waitEntered(t *testing.T) string {
	t.Helper()
	select {
	case name := <-h.entered:
		return name
	case <-time.After(10 * time.Second):
		t.Fatal("no Datasync started")
		return ""
	}
}

// gathering returns how many callers wait in the group's next round.
func gathering(g *SyncGroup) int { return g.Waiting() }

// waitGathering polls until n callers wait in the next round.
func waitGathering(t *testing.T, g *SyncGroup, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for gathering(g) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d callers gathered for the next round, want %d", gathering(g), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// openWritten creates name in fsys, durably, and writes data to it.
func openWritten(t *testing.T, fsys FS, name string, data []byte) File {
	t.Helper()
	f, err := fsys.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := fsys.SyncDir("/"); err != nil { // the entry is durable, the data not yet
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	return f
}

// An idle group flushes a caller's file at once, in the caller's own
// round: no timer, no waiting for company.
func TestSyncGroupIdleFlushesAtOnce(t *testing.T) {
	m := NewMem(rand.New(rand.NewPCG(1, 2)))
	held := holdSyncs(m)
	faults := &Faults{}
	fsys := WithFaults(m, faults)
	g := NewSyncGroup()
	f := openWritten(t, fsys, "/a", []byte("a"))
	done := make(chan error, 1)
	go func() { done <- g.Datasync(f) }()
	// The fdatasync starts with the one caller alone: nothing else will
	// come, so a group that waited for a timer or a second caller would
	// never get here.
	if name := held.waitEntered(t); name != "/a" {
		t.Fatalf("flushed %s, want /a", name)
	}
	held.release <- struct{}{}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n, r := faults.Datasyncs(), g.Rounds(); n != 1 || r != 1 {
		t.Fatalf("%d fdatasyncs in %d rounds, want 1 in 1", n, r)
	}
	if got := readDurable(t, m, "/a"); got != "a" {
		t.Fatalf("after a crash /a holds %q, want %q", got, "a")
	}
}

// readDurable returns what a crash now leaves in name.
func readDurable(t *testing.T, m *Mem, name string) string {
	t.Helper()
	c := m.Crash()
	f, err := c.OpenFile(name, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, size)
	if _, err := f.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Writers arriving while a flush is in flight wait for it and are then
// flushed together in one round, whatever their number: rounds stay at
// two while the fdatasyncs asked for by the vfs layer are one per file
// per round (each issued after its writer joined, so it covers its
// writes).
func TestSyncGroupBatchesWritersDuringAFlush(t *testing.T) {
	m := NewMem(rand.New(rand.NewPCG(1, 2)))
	held := holdSyncs(m)
	faults := &Faults{}
	fsys := WithFaults(m, faults)
	g := NewSyncGroup()
	const writers = 8
	files := make([]File, writers+1)
	for i := range files {
		files[i] = openWritten(t, fsys, fmt.Sprintf("/f%d", i), []byte{byte('a' + i)})
	}
	errs := make([]error, len(files))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); errs[0] = g.Datasync(files[0]) }()
	held.waitEntered(t) // the first writer's flush is in flight
	for i := 1; i <= writers; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = g.Datasync(files[i]) }()
	}
	waitGathering(t, g, writers)
	if n := faults.Datasyncs(); n != 1 {
		t.Fatalf("%d fdatasyncs while the first was in flight, want 1 (the others wait for the next round)", n)
	}
	held.release <- struct{}{}
	for i := 0; i < writers; i++ {
		held.waitEntered(t) // the whole next round is in flight at once
	}
	for i := 0; i < writers; i++ {
		held.release <- struct{}{}
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("writer %d: %v", i, err)
		}
	}
	if r := g.Rounds(); r != 2 {
		t.Fatalf("%d rounds for one writer and %d arriving during its flush, want 2", r, writers)
	}
	if n := faults.Datasyncs(); n != writers+1 {
		t.Fatalf("%d fdatasyncs, want %d (one per file per round)", n, writers+1)
	}
	for i := range files {
		if got, want := readDurable(t, m, fmt.Sprintf("/f%d", i)), string(rune('a'+i)); got != want {
			t.Fatalf("after a crash /f%d holds %q, want %q", i, got, want)
		}
	}
}

// A failed fdatasync in a round reaches every writer of that file in the
// round, and the group does not retry it: the next round's fdatasync is a
// new call by a new writer, and a writer that got the failure never got a
// success for it.
func TestSyncGroupFailureReachesEveryWriterOfTheRound(t *testing.T) {
	m := NewMem(rand.New(rand.NewPCG(1, 2)))
	held := holdSyncs(m)
	faults := &Faults{}
	fsys := WithFaults(m, faults)
	g := NewSyncGroup()
	first := openWritten(t, fsys, "/first", []byte("x"))
	bad := openWritten(t, fsys, "/bad", []byte("y"))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = g.Datasync(first) }()
	held.waitEntered(t)
	const writers = 4
	errs := make([]error, writers)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = g.Datasync(bad) }()
	}
	waitGathering(t, g, writers)
	faults.SetSyncFail(true) // the next round's fdatasyncs fail
	held.release <- struct{}{}
	for range writers {
		held.release <- struct{}{}
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, ErrInjected) {
			t.Fatalf("writer %d of the failed round got %v, want the injected failure", i, err)
		}
	}
	if n := faults.Datasyncs(); n != 1+writers {
		t.Fatalf("%d fdatasyncs, want %d: a failed one is never retried", n, 1+writers)
	}
}
