package replica

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/segment"
	"go.etcd.io/raft/v3/raftpb"
)

// Log writes run off the driver goroutine (etcd raft's AsyncStorageWrites):
// ProcessReady turns each MsgStorageAppend into frames and queues them with
// the messages Raft may deliver only once they are durable (a follower's
// MsgAppResp, a vote, the leader's own MsgAppResp, MsgStorageAppendResp);
// WriteLog, on the driver's log-writer goroutine, appends everything queued,
// fsyncs once (group commit across Ready cycles) and delivers those
// messages: to peers at once through Config.Send, to this replica's Raft
// through a queue that the next ProcessReady steps. Meanwhile the driver
// keeps stepping messages, proposing and committing: a leader sends its
// appends and counts its followers' acks while its own fsync is in flight.
//
// What the two goroutines share, and how:
//
//   - The queue, the delivered local messages and the first write error:
//     logWriter.mu.
//   - The segment store: the writer is its one appender while the driver
//     reads (Raft reads only entries it knows are stable, which are below
//     anything being written) and compacts (segment.Store serialises
//     DeletePrefix with Append). Truncations and snapshot installs, which
//     replace what the driver reads, happen on the driver with the writer
//     drained and held off (logWriter.wmu); both are rare (leader changes,
//     catch-up).
//   - Config.Send: called from both (the transport is goroutine-safe).
//   - The commit mark wanted and durable (markWant, markDone):
//     logWriter.mu. WriteLog appends a mark after each write's frames;
//     the state's mark record (record) is written under markMu, by the
//     driver's publication and by WriteLog's truncations; commitmark.go.
//
// Everything else stays on the driver goroutine: the hard state (term and
// vote are saved synchronously before anything that depends on them is
// queued or sent), the idempotence table and append times (fed from each
// entry as it is queued, so a replica that becomes leader knows every batch
// of its log, written or not), the tail of the log as Raft sees it (where a
// new leader's proposals continue), applying, acks.

// logWrite is one MsgStorageAppend: its entries encoded as frames and the
// messages to deliver once they are durable.
type logWrite struct {
	frames    [][]byte
	bytes     int
	responses []*raftpb.Message
	// written counts the frames already in the log: a write refused for
	// space (segment.ErrNoSpace) goes back to the queue and continues
	// from there.
	written int
	// mark is Raft's commit index when the write was queued, at most the
	// last index queued with it: a commit mark the writer may append after
	// the frames (commitmark.go).
	mark uint64
}

// logWriteQueueBytesMax bounds the frame bytes queued for the writer: past
// it ProcessReady writes the queue itself, so that the driver takes no more
// work until the disk has caught up.
const logWriteQueueBytesMax = 64 << 20

// logWriter is the state the driver and the log-writer goroutine share.
type logWriter struct {
	// wmu is held while writing: by WriteLog, and by the driver while it
	// writes itself (truncation, snapshot, backpressure).
	wmu sync.Mutex

	mu          sync.Mutex // guards the fields below
	queue       []*logWrite
	queuedBytes int
	busy        bool              // WriteLog took queue and has not delivered it yet
	local       []*raftpb.Message // delivered to this replica's Raft, to step
	err         error             // first write failure; nothing is written after it
	closed      bool
	// markWant is the commit index ProcessReady wants marked durable,
	// markDone the one the last mark saved (commitmark.go).
	markWant, markDone uint64
	// writeQueuedAt and writeGap are when the last write with frames was
	// queued and how long after the one before it (commithold.go).
	writeQueuedAt time.Time
	writeGap      time.Duration

	// markMu is held while the state's mark record is written; record is
	// the index it holds (written by this process, under markMu, read
	// anywhere; commitmark.go).
	markMu   sync.Mutex
	record   atomic.Uint64
	recorder CommitWriter // open once a record was written (saveRecord)

	// pending is set with local or err: the driver has work (HasReady).
	pending atomic.Bool
	// queued and written are signals (capacity 1): writes were queued for
	// WriteLog; WriteLog left work for the driver.
	queued, written chan struct{}
}

func newLogWriter() logWriter {
	return logWriter{queued: make(chan struct{}, 1), written: make(chan struct{}, 1)}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// LogWrites returns a channel that receives when ProcessReady queued log
// writes: the driver's log-writer goroutine then calls WriteLog. Safe from
// any goroutine.
func (r *Replica) LogWrites() <-chan struct{} { return r.writer.queued }

// LogWritten returns a channel that receives when WriteLog left work for
// the driver (messages to step, or a failure): the driver then runs
// ProcessReady. Safe from any goroutine.
func (r *Replica) LogWritten() <-chan struct{} { return r.writer.written }

// HasLogWrites reports whether ProcessReady queued log writes that WriteLog
// has not taken yet. Safe from any goroutine.
func (r *Replica) HasLogWrites() bool {
	r.writer.mu.Lock()
	defer r.writer.mu.Unlock()
	return len(r.writer.queue) > 0
}

// WriteLog appends the frames ProcessReady queued, fsyncs, and delivers the
// messages that waited for them: to peers through Config.Send, to this
// replica's Raft for the next ProcessReady (LogWritten receives). It is
// for the driver's log-writer goroutine (one per replica, or a pool that
// never runs two WriteLog of one replica at once: a second waits), and
// returns once what it took is durable. A failure is returned and also
// kept for ProcessReady, which stops the replica: nothing is written or
// delivered after it.
func (r *Replica) WriteLog() error {
	r.writer.wmu.Lock()
	defer r.writer.wmu.Unlock()
	return r.writeQueued()
}

// writeQueued is WriteLog; the caller holds wmu.
func (r *Replica) writeQueued() error {
	w := &r.writer
	w.mu.Lock()
	writes := w.queue
	w.queue, w.queuedBytes = nil, 0
	if w.err != nil || w.closed || len(writes) == 0 || r.failure.Load() != nil {
		err := w.err
		w.mu.Unlock()
		return err
	}
	w.busy = true
	mark := w.markWant
	for _, lw := range writes {
		mark = max(mark, lw.mark)
	}
	if mark <= w.markDone {
		mark = 0
	}
	w.mu.Unlock()
	marked, err := r.appendFrames(writes, mark)
	markedNew := false
	if err == nil {
		// The mark is durable before the acks that waited for the write
		// are delivered: the driver that steps them and applies what they
		// commit finds it (no record written in the state for entries
		// whose write carried their mark).
		w.mu.Lock()
		if markedNew = marked > w.markDone; markedNew {
			w.markDone = marked
			w.pending.Store(true) // the driver publishes what it covers
		}
		w.mu.Unlock()
		for _, lw := range writes {
			r.deliver(lw.responses)
		}
	}
	if errors.Is(err, segment.ErrNoSpace) {
		var rest []*logWrite
		if rest, err = r.deliverWritten(writes, err); errors.Is(err, segment.ErrNoSpace) {
			return r.requeueNoSpace(rest, err)
		}
		// The sync of what fitted failed: a failure like any other.
	} else {
		r.noteSpace(nil)
	}
	w.mu.Lock()
	// busy is cleared only after delivering, so that ProcessReady delivers
	// nothing of a later write ahead of these (see queueWrite).
	w.busy = false
	if err != nil && w.err == nil {
		w.err = err
		w.pending.Store(true)
	}
	wake := err != nil || markedNew
	w.mu.Unlock()
	if wake {
		signal(w.written)
	}
	return err
}

// deliverWritten, after the log refused a frame of writes for want of
// space (noSpace), makes the writes it took whole durable and delivers
// their messages, so that a follower acks what did fit; it returns the
// writes left and noSpace, or the error of a failed sync.
func (r *Replica) deliverWritten(writes []*logWrite, noSpace error) ([]*logWrite, error) {
	done := 0
	for done < len(writes) && writes[done].written == len(writes[done].frames) {
		done++
	}
	if done == 0 {
		return writes, noSpace
	}
	if err := r.cfg.Log.Sync(); err != nil {
		return writes, fmt.Errorf("replica: sync: %w", err)
	}
	for _, lw := range writes[:done] {
		r.deliver(lw.responses)
	}
	return writes[done:], noSpace
}

// requeueNoSpace puts writes, which the log refused for want of space,
// back at the head of the queue, undelivered: nothing they promise is
// durable, so no ack leaves (a follower does not ack the leader's append,
// a leader does not count itself, no producer is answered). The frames
// the log took stay in it (lw.written); the log cut off the torn one. The
// next WriteLog, which the driver runs again after a backoff, continues
// where this one stopped, and the replica refuses proposals meanwhile
// (DiskFull). The caller holds wmu.
func (r *Replica) requeueNoSpace(writes []*logWrite, err error) error {
	w := &r.writer
	w.mu.Lock()
	w.queue = append(writes, w.queue...)
	for _, lw := range writes {
		w.queuedBytes += lw.bytes
	}
	w.busy = false
	w.mu.Unlock()
	r.noteSpace(err)
	return err
}

// noteSpace records whether the last log write was refused for space.
func (r *Replica) noteSpace(err error) {
	if err == nil {
		if r.diskFull.Swap(nil) != nil {
			r.logger.Info("log writes resumed: the disk has space again")
		}
		return
	}
	e := apierr.New(apierr.Unavailable, "stream %s range %d: node %d is out of disk space; appends resume once space is freed: %v",
		r.cfg.Stream, r.cfg.Range, r.cfg.NodeID, err)
	if r.diskFull.Swap(e) == nil {
		r.logger.Warn("log write refused for want of disk space; retrying with backoff, refusing proposals meanwhile", "error", err)
	}
}

// DiskFull returns the retriable error this replica answers proposals
// with while its log refuses writes for want of space, or nil. Safe from
// any goroutine.
func (r *Replica) DiskFull() *apierr.Error { return r.diskFull.Load() }

// appendFrames writes the frames of writes, then a commit mark at mark
// (if not 0) when frames were written, and makes them durable with one
// Sync. It returns the mark written (0: none): what a mark the log cannot
// take covers is published under the state's record (commitmark.go).
func (r *Replica) appendFrames(writes []*logWrite, mark uint64) (uint64, error) {
	n := 0
	for _, lw := range writes {
		for ; lw.written < len(lw.frames); lw.written++ {
			// entryFrame validated (or encoded) each frame and computed
			// its CRC afresh.
			if err := r.cfg.Log.AppendChecked(lw.frames[lw.written]); err != nil {
				return 0, fmt.Errorf("replica: append: %w", err)
			}
			n++
		}
	}
	if n == 0 {
		return 0, nil
	}
	marked, err := r.appendMark(mark)
	if err != nil {
		return 0, err
	}
	if err := r.cfg.Log.Sync(); err != nil {
		return 0, fmt.Errorf("replica: sync: %w", err)
	}
	return marked, nil
}

// appendMark appends a commit mark at mark, clamped to the log (a mark
// never names an entry the log does not hold), and returns the index
// written, 0 if none: mark is 0, or the log cannot take one (no indexed
// frame in its active segment, or no space: not a failure, the mark is
// optional until a reader waits for it). The caller holds wmu.
func (r *Replica) appendMark(mark uint64) (uint64, error) {
	mark = min(mark, r.cfg.Log.LastIndex())
	if mark == 0 {
		return 0, nil
	}
	ok, err := r.cfg.Log.AppendMark(mark)
	if err != nil && !errors.Is(err, segment.ErrNoSpace) {
		return 0, fmt.Errorf("replica: append commit mark %d: %w", mark, err)
	}
	if !ok || err != nil {
		return 0, nil
	}
	return mark, nil
}

// deliver hands messages that waited for durability on: to peers through
// Config.Send, to this replica's Raft through the local queue.
func (r *Replica) deliver(msgs []*raftpb.Message) {
	var remote, local []*raftpb.Message
	for _, m := range msgs {
		if m.GetTo() == r.cfg.NodeID {
			local = append(local, m)
		} else {
			remote = append(remote, m)
		}
	}
	// The driver is woken before the peers' messages are handed on: Go
	// runs the goroutine readied last first on this processor, and that
	// should be the transport's sender carrying a follower's ack (on the
	// commit path of the leader's appends), not the driver's Ready cycle
	// (tens of microseconds) for the local half.
	if len(local) > 0 {
		w := &r.writer
		w.mu.Lock()
		w.local = append(w.local, local...)
		w.pending.Store(true)
		w.mu.Unlock()
		signal(w.written)
	}
	if len(remote) > 0 {
		r.cfg.Send(remote)
	}
}

// queueWrite hands lw to the writer. A write without frames whose
// predecessors are all written and delivered needs no disk: its messages
// are delivered at once. Past logWriteQueueBytesMax the driver writes the
// queue itself. For the driver goroutine.
func (r *Replica) queueWrite(lw *logWrite) error {
	w := &r.writer
	w.mu.Lock()
	if len(lw.frames) == 0 && len(w.queue) == 0 && !w.busy && w.err == nil {
		w.mu.Unlock()
		r.deliver(lw.responses)
		return nil
	}
	w.queue = append(w.queue, lw)
	w.queuedBytes += lw.bytes
	if len(lw.frames) > 0 {
		now := r.cfg.Now()
		w.writeGap = now.Sub(w.writeQueuedAt)
		w.writeQueuedAt = now
	}
	over := w.queuedBytes > logWriteQueueBytesMax && r.diskFull.Load() == nil
	w.mu.Unlock()
	if over {
		if err := r.WriteLog(); !errors.Is(err, segment.ErrNoSpace) {
			return err
		}
		// The writer retries; the queue waits (bounded: proposals are
		// refused meanwhile, and a leader sends a follower that does not
		// ack no more than its in-flight window).
	}
	signal(w.queued)
	return nil
}

// stepLogWritten steps the messages WriteLog delivered to this replica's
// Raft and returns the writer's failure, if any. For the driver goroutine.
func (r *Replica) stepLogWritten() error {
	w := &r.writer
	if !w.pending.Load() {
		return nil
	}
	w.mu.Lock()
	msgs, err := w.local, w.err
	w.local = nil
	w.pending.Store(false)
	w.mu.Unlock()
	for _, m := range msgs {
		_ = r.step(m) // informational only, as for any message
	}
	return err
}

// handleAppend takes a Ready's MsgStorageAppend: the common case (entries
// that extend the log) is encoded here and queued for WriteLog; a snapshot
// or entries that overwrite part of the log are written here (appendSync).
// For the driver goroutine.
func (r *Replica) handleAppend(m *raftpb.Message) error {
	ents := m.GetEntries()
	if m.GetSnapshot() != nil || (len(ents) > 0 && ents[0].GetIndex() <= r.tailIndex) {
		return r.appendSync(m)
	}
	lw := &logWrite{responses: m.GetResponses()}
	if len(ents) > 0 {
		lw.frames = make([][]byte, 0, len(ents))
	}
	j := 0 // r.proposals before j start before the entry at hand
	for _, e := range ents {
		if e.GetIndex() != r.tailIndex+1 {
			return fmt.Errorf("%w: raft appends index %d after %d", ErrLogMismatch, e.GetIndex(), r.tailIndex)
		}
		frame, h, err := entryFrame(e, r.tailOffset, r.cfg.Epoch, r.logAppendUnixNanos)
		if err != nil {
			return err
		}
		if !continues(h, r.tailOffset) {
			// The leader assigned offsets from its log's tail, and Step
			// refuses an append that does not continue this log: a log
			// that disagrees here is a broken invariant. It stops this
			// replica (the node serves on), storing nothing.
			return fmt.Errorf("%w: node %d: entry %d carries base offset %d, the log's tail is at %d", ErrLogMismatch, r.cfg.NodeID, e.GetIndex(), h.BaseOffset, r.tailOffset)
		}
		// The idempotence table and append times follow the log as Raft
		// sees it, written or not: a replica that becomes leader must know
		// every batch of its log before it accepts a retry.
		r.recordHeader(h)
		r.tailOffset, r.tailIndex = h.NextOffset(), e.GetIndex()
		lw.frames = append(lw.frames, frame)
		lw.bytes += len(frame)
		if h.Type == batch.TypeData {
			// The leader's own proposal at this offset, in this term, is
			// this entry: note its index, so that it is answered as soon
			// as the commit index covers it (answerCommittedIndex).
			for j < len(r.proposals) && r.proposals[j].baseOffset < h.BaseOffset {
				j++
			}
			if j < len(r.proposals) {
				if p := r.proposals[j]; p.baseOffset == h.BaseOffset && p.term == e.GetTerm() {
					p.index = e.GetIndex()
				}
			}
		}
	}
	r.storage.cache.add(ents)
	// Raft's commit index covers entries of this log only (a follower's
	// stops at the last entry its leader's append matched), at most the
	// ones queued so far: a mark after these frames may name it.
	lw.mark = min(r.state.Raft.GetCommit(), r.tailIndex)
	if r.isLeader && r.SoleVoter() {
		// A group of one: its leader's entries are committed once its own
		// write of them is durable, so the write that makes them durable
		// may carry their mark (one fdatasync for entries and mark, and
		// they are published as soon as they are applied).
		lw.mark = r.tailIndex
	}
	return r.queueWrite(lw)
}

// appendSync writes a MsgStorageAppend on the driver goroutine: a snapshot
// to install, or entries that overwrite this replica's uncommitted tail
// (a new leader's). Everything queued before is written first, and the
// writer is held off meanwhile: the log, the idempotence table and the
// compaction point change under the driver's reads only here.
func (r *Replica) appendSync(m *raftpb.Message) error {
	r.writer.wmu.Lock()
	defer r.writer.wmu.Unlock()
	if err := r.writeQueued(); err != nil {
		return err
	}
	if snap := m.GetSnapshot(); snap != nil {
		r.storage.cache.clear()
		if err := r.installSnapshot(snap); err != nil {
			return err
		}
	}
	if err := r.persistEntries(m.GetEntries()); err != nil {
		return err
	}
	r.storage.cache.add(m.GetEntries())
	r.tailIndex, r.tailOffset = max(r.cfg.Log.LastIndex(), r.state.SnapshotIndex), r.cfg.Log.NextOffset()
	r.deliver(m.GetResponses())
	return nil
}

// persistEntries appends ents durably, truncating first where a new leader
// overwrites this replica's uncommitted tail (and then rebuilding the
// idempotence table from the log). A truncation may cut commit marks that
// followed the frames it drops (a mark names committed entries only, but
// is written after whatever the write held): the newest durable mark is
// appended again after the new entries, under the same fdatasync. The
// caller holds the writer off (wmu).
func (r *Replica) persistEntries(ents []*raftpb.Entry) error {
	truncated := false
	for _, e := range ents {
		if err := r.checkOverwrite(e); err != nil {
			return err
		}
		if last := r.cfg.Log.LastIndex(); last != 0 && e.GetIndex() <= last {
			if !truncated {
				if err := r.saveMarkBeforeCut(); err != nil {
					return err
				}
			}
			if err := r.cfg.Log.TruncateSuffixAtIndex(e.GetIndex()); err != nil {
				return fmt.Errorf("replica: truncate at index %d: %w", e.GetIndex(), err)
			}
			truncated = true
			// Recompute what the dropped entries contributed (idempotence
			// state, newest append time) before writing the replacements.
			if err := r.rebuildDedup(); err != nil {
				return err
			}
			r.recheckDuplicates()
		}
		frame, h, err := entryFrame(e, r.cfg.Log.NextOffset(), r.cfg.Epoch, r.logAppendUnixNanos)
		if err != nil {
			return err
		}
		if !continues(h, r.cfg.Log.NextOffset()) {
			// Defence in depth, as in handleAppend (checkOverwrite ran
			// before the truncation, this after it).
			return fmt.Errorf("%w: node %d: entry %d carries base offset %d, log is at %d", ErrLogMismatch, r.cfg.NodeID, e.GetIndex(), h.BaseOffset, r.cfg.Log.NextOffset())
		}
		if err := r.cfg.Log.AppendChecked(frame); err != nil { // entryFrame checked it
			return fmt.Errorf("replica: append entry %d: %w", e.GetIndex(), err)
		}
		r.recordHeader(h)
	}
	if truncated {
		if err := r.markAgain(); err != nil {
			return err
		}
	}
	if len(ents) > 0 {
		if err := r.cfg.Log.Sync(); err != nil {
			return fmt.Errorf("replica: sync: %w", err)
		}
	}
	return nil
}

// saveMarkBeforeCut brings the state's mark record up to the newest
// durable commit mark before a truncation may cut the log's copy of it.
// The truncation can reach the disk while the mark appended again after
// the replacing entries (markAgain) does not: a crash before their
// fdatasync left a log whose newest mark was older than what the replica
// had published, and the restarted replica published less than before
// (invariant 8; the simulator's seed 800578 of three regions: 217 after
// 218). Publication writes the record only for what no log mark covers,
// so the record may hold less. The caller holds wmu.
func (r *Replica) saveMarkBeforeCut() error {
	w := &r.writer
	w.mu.Lock()
	done := w.markDone
	w.mu.Unlock()
	if err := r.saveRecord(done); err != nil {
		return fmt.Errorf("replica: commit mark %d before a truncation: %w", done, err)
	}
	return nil
}

// markAgain appends the newest durable commit mark again (after a
// truncation), or brings the state's record up to it where the log cannot
// take it. The caller holds wmu, which every mark appended to the log was
// written under.
func (r *Replica) markAgain() error {
	w := &r.writer
	w.mu.Lock()
	done := w.markDone
	w.mu.Unlock()
	marked, err := r.appendMark(done)
	if err == nil && marked < done {
		err = r.saveRecord(done)
	}
	if err != nil {
		return fmt.Errorf("replica: commit mark %d after a truncation: %w", done, err)
	}
	return nil
}

// ErrLogMismatch reports entries Raft handed over that do not continue
// this replica's log (Step refuses the messages that would carry them, so
// it means a bug): the replica stops instead of storing them.
var ErrLogMismatch = errors.New("replica: entries do not continue the log")

// checkOverwrite checks, before a truncation, that a data or fork entry
// overwriting the log's uncommitted tail starts where the log keeps going
// after the entries it keeps: nothing is truncated for an entry that
// could not be stored after.
func (r *Replica) checkOverwrite(e *raftpb.Entry) error {
	last := r.cfg.Log.LastIndex()
	if last == 0 || e.GetIndex() > last || e.GetType() != raftpb.EntryNormal || len(e.GetData()) == 0 {
		return nil
	}
	h, err := batch.PeekHeader(e.GetData())
	if err != nil {
		return fmt.Errorf("%w: entry %d: %w", errBadEntry, e.GetIndex(), err)
	}
	var next uint64
	found := false
	if e.GetIndex()-1 == r.state.SnapshotIndex {
		next, found = r.state.SnapshotNextOffset, true
	} else if err := r.cfg.Log.HeadersByIndex(e.GetIndex()-1, e.GetIndex(), func(p batch.Header) { next, found = p.NextOffset(), true }); err != nil {
		return fmt.Errorf("replica: read index %d: %w", e.GetIndex()-1, err)
	}
	if found && !continues(h, next) {
		return fmt.Errorf("%w: node %d: entry %d carries base offset %d, the log keeps going at %d", ErrLogMismatch, r.cfg.NodeID, e.GetIndex(), h.BaseOffset, next)
	}
	return nil
}
