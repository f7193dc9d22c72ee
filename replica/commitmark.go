package replica

import "fmt"

// The commit mark: a replica never publishes less than it published before
// (DESIGN.md invariant 8), across restarts too.
//
// Readers read the offsets below Committed. Raft's commit index is not
// made durable by the Ready cycle (the hard state is saved when the term
// or the vote changes), so a replica that restarted after a kill knew
// only the commit index of its last election, and served less than
// before until its leader told it the commit index again (1-5 s): a
// reader that had read further saw the tail move back. So publication
// waits for the mark:
//
//  1. Applying committed entries moves the applied end (appliedEnd, for
//     the replica's own decisions: duplicates, forks, read indexes,
//     snapshots) and queues a publication point (the applied index and
//     the end offset it reaches); ProcessReady asks the log writer for a
//     mark at the applied index (entries are applied only once durable
//     here, so the mark never names an entry this log could lose).
//  2. WriteMark, on its own goroutine beside WriteLog (acks and log
//     writes do not wait for the mark), saves the mark
//     (StateStore.SaveCommit: one small record rewritten in place, one
//     fdatasync) and wakes the driver.
//  3. ProcessReady publishes the publication points the durable mark
//     covers. A restarted replica starts with the commit index the mark
//     (or the state) holds, clamped to its log, and publishes it at once:
//     everything it published before.
//
// A fork lowers Committed to the fork offset (the records past it moved to
// the orphan log) and drops the points above it; a snapshot install
// publishes its end at once (the state saved with it holds a commit index
// that covers it). Compaction deletes only what is published.

// pubPoint is applied entries awaiting the durable mark: once the mark
// covers index, offsets below end may be published.
type pubPoint struct{ index, end uint64 }

// pubPointsMax bounds the points waiting for the mark; past it the newest
// point absorbs the next (published a little later, never earlier).
const pubPointsMax = 64

// markApplied queues the applied end for publication and asks the log
// writer for a mark covering it. For the driver goroutine, after applying.
func (r *Replica) markApplied() {
	p := pubPoint{index: r.appliedIndex, end: r.appliedEnd}
	if n := len(r.pubs); n > 0 && r.pubs[n-1].index >= p.index {
		return
	}
	if len(r.pubs) >= pubPointsMax {
		r.pubs[len(r.pubs)-1] = p
	} else {
		r.pubs = append(r.pubs, p)
	}
	w := &r.writer
	w.mu.Lock()
	need := p.index > w.markDone
	if need && p.index > w.markWant {
		w.markWant = p.index
	}
	w.mu.Unlock()
	if need {
		signal(w.marks)
	}
}

// publish publishes the points the durable mark covers. For the driver
// goroutine.
func (r *Replica) publish() {
	if len(r.pubs) == 0 {
		return
	}
	w := &r.writer
	w.mu.Lock()
	done := w.markDone
	w.mu.Unlock()
	k := 0
	end := r.committed.Load()
	for k < len(r.pubs) && r.pubs[k].index <= done {
		end = max(end, r.pubs[k].end)
		k++
	}
	if k == 0 {
		return
	}
	r.pubs = append(r.pubs[:0], r.pubs[k:]...)
	if end > r.committed.Load() {
		r.committed.Store(end)
		r.notify()
	}
}

// publishNow publishes end at once, dropping the points waiting: the state
// just saved durably covers it (a fork's, a snapshot's), and it may be
// lower than what was published (a fork cut the log back). For the driver
// goroutine.
func (r *Replica) publishNow(index, end uint64) {
	r.pubs = r.pubs[:0]
	w := &r.writer
	w.mu.Lock()
	w.markDone = max(w.markDone, index)
	w.mu.Unlock()
	if end != r.committed.Load() {
		r.committed.Store(end)
		r.notify()
	}
}

// markedIndex is the highest index the durable mark covers.
func (r *Replica) markedIndex() uint64 {
	w := &r.writer
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.markDone
}

// MarkWrites returns a channel that receives when ProcessReady wants a
// commit mark saved: the driver then calls WriteMark. Safe from any
// goroutine.
func (r *Replica) MarkWrites() <-chan struct{} { return r.writer.marks }

// HasMarkWrite reports whether a commit mark is wanted and not saved yet.
// Safe from any goroutine.
func (r *Replica) HasMarkWrite() bool {
	w := &r.writer
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.markWant > w.markDone && w.err == nil && !w.closed
}

// WriteMark makes the commit mark ProcessReady asked for durable, if no log
// write will: the log writer appends the mark after the frames of each
// write it makes, under the same fdatasync (writeQueued), so while entries
// are being written WriteMark writes nothing. With none queued it appends
// the mark alone to the log and syncs it (one small write: the case of a
// commit that no append follows), or, where the log cannot take one,
// saves it in the state (StateStore.SaveCommit). Either way it wakes the
// driver to publish what the mark covers (LogWritten receives). It may run
// on its own goroutine; calls are serialised, and it waits for a log write
// in progress. A failure is returned and kept for ProcessReady, which
// stops the replica.
func (r *Replica) WriteMark() error {
	w := &r.writer
	w.markMu.Lock()
	defer w.markMu.Unlock()
	w.wmu.Lock()
	w.mu.Lock()
	want, done, failed := w.markWant, w.markDone, w.err != nil || w.closed
	queued := len(w.queue) > 0
	w.mu.Unlock()
	if want <= done || failed || queued || r.failure.Load() != nil {
		w.wmu.Unlock()
		return nil // nothing to do, or the log writer's next write carries it
	}
	marked, err := r.appendMark(want)
	w.wmu.Unlock() // the sync below lets a log write append meanwhile
	if err == nil && marked < want {
		err = r.cfg.State.SaveCommit(want)
	} else if err == nil {
		err = r.cfg.Log.Sync()
	}
	w.mu.Lock()
	if err != nil {
		err = fmt.Errorf("replica: save commit mark %d: %w", want, err)
		if w.err == nil {
			w.err = err
		}
	} else {
		w.markDone = max(w.markDone, want)
	}
	w.pending.Store(true)
	w.mu.Unlock()
	signal(w.written)
	return err
}
