package replica

import "fmt"

// The commit mark: a replica never publishes less than it published before
// (DESIGN.md invariant 8), across restarts too.
//
// Readers read the offsets below Committed. Raft's commit index is not
// made durable by the Ready cycle (the hard state is saved when the term
// or the vote changes), so a restarted replica would know only the commit
// index of its last election, and serve less than before until its leader
// told it the commit index again: a reader that had read further would
// see the tail move back. Two things prevent it:
//
//  1. A mark that survives the process. Before it publishes applied
//     entries, a replica makes sure a commit mark covers them: the log's
//     (each log write carries one: WriteLog appends, after the write's
//     frames, a commit mark frame naming the highest of markWant and
//     Raft's commit index when its entries were queued, under the
//     fdatasync it makes anyway), or else the state's mark record
//     (StateStore.WriteCommit: 32 bytes rewritten in place, no
//     fdatasync, stamped with the machine's boot). A process that
//     crashed left the record in the page cache: the restarted replica
//     starts with the newest of the marks the log holds
//     (segment.Store.OpenMark) and the record, clamped to its log, and
//     publishes it at once: everything it published before.
//  2. Relearning after the machine's crash (relearn.go). A record written
//     in another boot may have been lost with the page cache, so Load
//     says it is not trusted (HardState.MarkTrusted); the replica then
//     publishes what its marks say but serves no reader (Relearning)
//     until a Raft ReadIndex, answered by a leader that committed an
//     entry of its term, gave it a commit index covering everything ever
//     committed, and it applied up to it. Only then does it stamp the
//     record with the new boot. A replica closed cleanly saves a synced
//     record (Close), trusted in any boot: a planned reboot relearns
//     nothing.
//
// So no publication waits for an fdatasync of its own: before, a commit
// that no log write carried waited for a lone mark's fdatasync (one more
// device flush per replica beside each append's, on a range taking a few
// hundred appends a second; notes/lonemarks.md).
//
// A fork lowers Committed to the fork offset (the records past it moved to
// the orphan log) and drops the points above it; a snapshot install
// publishes its end at once (the state saved with it holds a commit index
// that covers it). Compaction deletes only what is published, and saves
// the compaction point (a commit index Raft restarts at) before it
// deletes a segment and the marks in it.

// pubPoint is applied entries awaiting publication: once a mark covers
// index, offsets below end may be published.
type pubPoint struct{ index, end uint64 }

// pubPointsMax bounds the points waiting for the mark; past it the newest
// point absorbs the next (published a little later, never earlier).
const pubPointsMax = 64

// markApplied queues the applied end for publication and asks the log
// writer's next write to carry a mark covering it. For the driver goroutine, after applying.
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
	w.markWant = max(w.markWant, p.index)
	w.mu.Unlock()
}

// publish publishes what is applied, once a mark covers it: a durable one
// the log carries, or the state's record (saveRecord). For the driver
// goroutine.
func (r *Replica) publish() {
	if len(r.pubs) == 0 {
		return
	}
	end, index := r.committed.Load(), uint64(0)
	for _, p := range r.pubs {
		end, index = max(end, p.end), max(index, p.index)
	}
	r.pubs = r.pubs[:0]
	if index > r.markedIndex() {
		if err := r.saveRecord(index); err != nil {
			r.fail(err)
			return
		}
	}
	if end > r.committed.Load() {
		r.committed.Store(end)
		r.notify()
	}
}

// saveRecord brings the state's mark record up to index (WriteCommit),
// unless it is there already or the replica is relearning: the record
// must not carry this boot's stamp before the replica publishes at least
// what it published before (relearn.go). Safe from any goroutine; under
// markMu, so that an older mark never lands over a newer one.
func (r *Replica) saveRecord(index uint64) error {
	w := &r.writer
	w.markMu.Lock()
	defer w.markMu.Unlock()
	if index <= w.record.Load() || r.relearning.Load() {
		return nil
	}
	if w.recorder == nil {
		cw, err := r.cfg.State.OpenCommitWriter()
		if err != nil {
			return fmt.Errorf("replica: open the commit mark: %w", err)
		}
		w.recorder = cw
	}
	if err := w.recorder.WriteCommit(index); err != nil {
		return fmt.Errorf("replica: commit mark %d: %w", index, err)
	}
	w.record.Store(index)
	return nil
}

// closeRecorder closes the commit mark's writer, if open; a later
// saveRecord opens it again.
func (r *Replica) closeRecorder() {
	w := &r.writer
	w.markMu.Lock()
	defer w.markMu.Unlock()
	if w.recorder != nil {
		if err := w.recorder.Close(); err != nil {
			r.logger.Warn("close the commit mark", "error", err)
		}
		w.recorder = nil
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

// markedIndex is the highest index a mark covers: the durable one the log
// carries, or the state's record.
func (r *Replica) markedIndex() uint64 {
	w := &r.writer
	w.mu.Lock()
	defer w.mu.Unlock()
	return max(w.markDone, w.record.Load())
}
