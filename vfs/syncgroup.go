package vfs

import "sync"

// SyncGroup is one node's sync point for the files it keeps on one disk
// (every range log's active segment): a group commit across files. A
// caller that finds no flush in flight flushes at once, with no timer; the
// callers that arrive while a flush is in flight join the next round,
// which the first of them starts as soon as the flush in flight ends, for
// all of them together. So however many files are written concurrently,
// at most one round is in flight and one is gathering.
//
// A round fdatasyncs each of its files, concurrently, and gives each
// caller the result of its own file's fdatasync, issued after the caller
// joined (so after its writes): a failure reaches every caller of that
// file in the round and no other. SyncGroup never retries a failed
// fdatasync (the caller must treat its file's data as lost, as after any
// failed Datasync; segment.Store fails itself).
//
// Why not one syncfs(2) per round: it flushes every dirty file of the
// file system, other tenants' included, and its error is the file
// system's, not a file's (one descriptor's errseq sees it once, so a
// later round could succeed over pages a failed writeback dropped unless
// the whole group were failed for good). Measured on ext4 it also lost
// to per-file fdatasync (notes/gcommit.md).
//
// Measured on ext4 over virtio (notes/gcommit.md), this group loses to
// plain concurrent fdatasyncs: the kernel's journal already commits the
// concurrent fdatasyncs of different files together, and the round
// barrier only adds waiting. It is off by default (geologd
// --group-commit).
//
// The zero value is not usable; use NewSyncGroup. Safe for concurrent use.
type SyncGroup struct {
	mu       sync.Mutex
	cond     *sync.Cond
	flushing bool       // a round is in flight
	next     *syncRound // the round gathering callers, nil if none
	rounds   uint64     // rounds run, for tests and metrics
}

// syncRound is one flush of the files its callers joined with.
type syncRound struct {
	files []File
	errs  []error // errs[i] is files[i]'s fdatasync result, set when done
	done  bool
}

// NewSyncGroup returns an idle group.
func NewSyncGroup() *SyncGroup {
	g := &SyncGroup{}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// Datasync makes the data written to f before the call durable, as
// f.Datasync does, sharing the flush with concurrent callers (see
// SyncGroup). It returns f's fdatasync error from the round that covered
// the call.
func (g *SyncGroup) Datasync(f File) error {
	g.mu.Lock()
	r := g.next
	if r == nil {
		r = &syncRound{}
		g.next = r
	}
	i := len(r.files)
	r.files = append(r.files, f)
	for g.flushing && !r.done {
		g.cond.Wait()
	}
	if r.done {
		// Another caller ran the round this one joined.
		err := r.errs[i]
		g.mu.Unlock()
		return err
	}
	// No round in flight and this one not run: this caller runs it. Only
	// g.next can be in that state (a round leaves g.next when it starts).
	g.next = nil
	g.flushing = true
	g.rounds++
	g.mu.Unlock()

	errs := r.flush()

	g.mu.Lock()
	r.errs, r.done = errs, true
	g.flushing = false
	// Wakes this round's callers and the next round's: the first of those
	// to take the lock runs it.
	g.cond.Broadcast()
	g.mu.Unlock()
	return errs[i]
}

// flush fdatasyncs the round's files concurrently (the kernel's journal
// then commits them together) and returns their results in order. The
// round is out of g.next, so nothing appends to files meanwhile.
func (r *syncRound) flush() []error {
	errs := make([]error, len(r.files))
	var wg sync.WaitGroup
	for j := 1; j < len(r.files); j++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[j] = r.files[j].Datasync()
		}()
	}
	errs[0] = r.files[0].Datasync()
	wg.Wait()
	return errs
}

// Rounds returns how many flush rounds the group has run.
func (g *SyncGroup) Rounds() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.rounds
}

// Waiting returns how many callers wait in the round gathering behind
// the one in flight.
func (g *SyncGroup) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.next == nil {
		return 0
	}
	return len(g.next.files)
}
