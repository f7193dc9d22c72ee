package replica

import (
	"fmt"
	"time"
)

// The commit mark: a replica never publishes less than it published before
// (DESIGN.md invariant 8), across restarts too.
//
// Readers read the offsets below Committed. Raft's commit index is not
// made durable by the Ready cycle (the hard state is saved when the term
// or the vote changes), so a replica that restarted after a kill knew
// only the commit index of its last election, and served less than
// before until its leader told it the commit index again (1-5 s): a
// reader that had read further saw the tail move back. So publication
// waits for a durable commit mark, which log writes carry, and the state
// when no log write is under way:
//
//  1. Applying committed entries moves the applied end (appliedEnd, for
//     the replica's own decisions: duplicates, forks, read indexes,
//     snapshots) and queues a publication point (the applied index and
//     the end offset it reaches); markApplied wants a mark at the applied
//     index (markWant).
//  2. Each log write carries a mark: WriteLog appends, after the write's
//     frames, a commit mark frame (batch.TypeMark, segment.Store.AppendMark)
//     naming the highest of markWant and Raft's commit index when the
//     write's entries were queued (clamped to the last entry queued: Raft's
//     commit index covers only entries of this log), and makes frames and
//     mark durable with the one fdatasync it makes anyway. Under load the
//     mark costs no fsync: a few dozen bytes in a write that happens.
//  3. When no log write is queued or in progress (the commit of an append
//     that no other follows yet, a quiet range), or the log cannot take a
//     mark (no indexed frame in its active segment), WriteMark saves the
//     mark alone in the state (StateStore.SaveCommit: 16 bytes rewritten
//     in place, one fdatasync, as every mark cost before), in a file of
//     its own: a log write that comes meanwhile runs beside it rather
//     than behind it, as before. A truncation (a new leader overwriting
//     the uncommitted tail) may cut marks written after the frames it
//     drops: it appends the newest durable mark again, with the entries
//     that replace them (persistEntries).
//  4. ProcessReady publishes the publication points the durable mark
//     covers. A restarted replica starts with the newest of the marks the
//     log holds (segment.Store.OpenMark: recovery reads them, a torn one
//     is a torn tail), the state's commit index and the old mark file
//     (_commit, which data directories from before keep), clamped to its
//     log, and publishes it at once: everything it published before.
//
// The trade: under load (a log write in flight when entries commit) every
// node saves the mark's own fdatasync (about 7% of a node's CPU in the
// cursor-commit benchmark, and a second device flush beside every log
// flush): the mark is a few dozen bytes in a write that happens anyway.
// An append that no other follows still pays a lone mark (step 3) one
// fdatasync after its commit, as before: readers of a quiet range see a
// record no later than they did, and a producer appending one record at a
// time still has a mark's flush beside each of its appends once its
// previous one committed (waiting for the next append to carry it would
// delay what readers of a quiet range see). The log holds a mark frame
// (batch.HeaderSize plus 12 bytes) per write that carries one; rewrites
// keep a segment's newest (compaction by key, resealing) and retention
// deletes them with their segments. notes/commitmark.md has the figures.
//
// A fork lowers Committed to the fork offset (the records past it moved to
// the orphan log) and drops the points above it; a snapshot install
// publishes its end at once (the state saved with it holds a commit index
// that covers it). Compaction deletes only what is published, and saves
// the compaction point (a commit index Raft restarts at) before it
// deletes a segment and the marks in it.

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
	now := r.cfg.Now()
	w := &r.writer
	w.mu.Lock()
	need := p.index > w.markDone
	if need && p.index > w.markWant {
		if w.markWant <= w.markDone {
			w.markWantedAt = now // nothing was wanted: the linger starts
		}
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

// HasMarkWrite reports whether a commit mark is wanted, not durable yet,
// and left to WriteMark: no log write is queued or in progress (the
// writer carries the mark, and signals MarkWrites after a write that did
// not cover what is wanted). Safe from any goroutine.
func (r *Replica) HasMarkWrite() bool {
	w := &r.writer
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.markWant > w.markDone && w.err == nil && !w.closed && len(w.queue) == 0 && !w.busy
}

// markLingerMax bounds how long a wanted commit mark waits for a log write
// to carry it (MarkLinger): how much later, at most, a reader sees the
// last record of a range written a record at a time than without the
// linger.
const markLingerMax = 5 * time.Millisecond

// MarkLinger returns how long the driver should wait before WriteMark
// because a log write is likely to carry the wanted mark (0: write it
// now, or nothing is wanted). A producer appending one record at a time
// commits each append before it sends the next, so each commit wants a
// lone mark (one fdatasync per replica beside each append's three log
// fdatasyncs, on the same disk) shortly before the next append's write,
// which would carry it. So while the range's last two log writes were
// queued at most markLingerMax apart, the mark waits for the next write,
// at most markLingerMax after it was wanted; a range written sparsely
// has its mark saved at once. Publication still waits for the durable
// mark: the linger delays what readers see (by about one gap between
// appends; the last record of a burst by markLingerMax), never what is
// durable, and no ack waits for a mark (a group of one's write carries
// its own). Safe from any goroutine.
func (r *Replica) MarkLinger() time.Duration {
	now := r.cfg.Now()
	w := &r.writer
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.markWant <= w.markDone || w.err != nil || w.closed || w.writeGap > markLingerMax {
		return 0
	}
	return max(w.markWantedAt.Add(markLingerMax).Sub(now), 0)
}

// WriteMark makes the commit mark ProcessReady asked for durable, if no log
// write will: the log writer appends the mark after the frames of each
// write it makes, under the same fdatasync (writeQueued), so while entries
// are being written WriteMark writes nothing. With no log write queued or
// in progress it saves the mark in the state (StateStore.SaveCommit: a
// small record rewritten in place and fdatasynced, a file apart from the
// log, so a log write that comes meanwhile does not wait for it), and
// wakes the driver to publish what the mark covers (LogWritten receives).
// It may run on its own goroutine, beside WriteLog; calls are serialised.
// A failure is returned and kept for ProcessReady, which stops the
// replica.
func (r *Replica) WriteMark() error {
	w := &r.writer
	w.markMu.Lock()
	defer w.markMu.Unlock()
	w.mu.Lock()
	want, done, failed := w.markWant, w.markDone, w.err != nil || w.closed
	writing := len(w.queue) > 0 || w.busy
	w.mu.Unlock()
	if want <= done || failed || writing || r.failure.Load() != nil {
		return nil // nothing to do, or the log writer carries it
	}
	err := r.cfg.State.SaveCommit(want)
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
