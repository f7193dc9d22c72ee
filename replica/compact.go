package replica

import (
	"fmt"
	"math"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/segment"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"
)

// Compact runs the log's retention policy (segment.Config.RetentionAge and
// RetentionBytes) as Raft log compaction, on every replica independently:
// of the segments retention would delete, it deletes the oldest ones whose
// entries are all applied here, after recording the compaction point (the
// last deleted entry's index and term, the offset and append time after
// it, and a commit index at least as high) in the state. A crash between
// the two leaves segments that Raft no longer sees (its log starts after
// the compaction point) and the next Compact deletes. It returns how many
// segments it deleted.
//
// What else holds compaction back:
//
//   - Snapshot bodies being sent: their frames stay until the transport
//     closes them.
//   - On a leader, followers it can reach that are behind. A follower
//     behind the first index costs a snapshot, the whole retained log,
//     where the entries it lacks would do; so, like CockroachDB's raft log
//     queue, a leader keeps what its recently active followers (Raft's
//     RecentActive, not being sent a snapshot) have yet to acknowledge, as
//     long as that keeps at most Config.CompactionHoldBackBytesMax beyond
//     the policy. A follower that is down or cut off holds nothing back: it
//     gets a snapshot when it returns. Followers do not hold back for each
//     other (they do not know each other's progress); a follower that
//     becomes leader sends snapshots where its own log falls short.
//
// Compaction runs between Ready cycles (it skips a round while a Ready is
// pending, whose MsgSnap may name frames it would delete, and while a fork
// is proposed or unapplied here, which will orphan frames it would
// delete). For the driver goroutine.
func (r *Replica) Compact() (deletedSegments int, err error) {
	if r.failure.Load() != nil {
		return 0, nil
	}
	r.shareFloor()
	r.saveLeaderFloor() // floor.go
	if r.rn.HasReady() || r.forkPending() || r.holdsAll() {
		return 0, nil
	}
	cands, err := r.cfg.Log.RetentionCandidates()
	if err != nil || len(cands) == 0 {
		return 0, err
	}
	k := r.compactable(cands)
	if floor, ok := r.compactionFloor(); ok {
		// Offsets at or past the floor are still wanted (by the
		// cross-region replicator): keep every segment that holds any. A
		// hard bound, unlike the followers' hold-back above. A follower
		// holds to its leader's floor (floor.go).
		for k > 0 && cands[k-1].NextOffset > floor {
			k--
		}
	}
	if k == 0 {
		return 0, nil
	}
	last := cands[k-1]
	if err := r.moveCompactionPoint(last); err != nil {
		return 0, err
	}
	if err := r.cfg.Log.DeletePrefix(last.NextOffset); err != nil {
		return 0, fmt.Errorf("replica: compact through index %d: %w", last.LastIndex, err)
	}
	r.segmentsCompacted.Add(uint64(k))
	r.logger.Debug("compacted log", "segments", k, "snapshot_index", r.state.SnapshotIndex,
		"start_offset", r.cfg.Log.StartOffset(), "first_index", r.cfg.Log.FirstIndex())
	return k, nil
}

// compactable is how many of cands, from the oldest, the compaction point
// may move over: segments whose entries are all applied, not pinned by a
// snapshot being sent and, on a leader, not held back for followers it
// can reach that lag (within CompactionHoldBackBytesMax; see Compact).
func (r *Replica) compactable(cands []segment.SegmentInfo) int {
	// Only what is published: a reader never finds the start past the
	// committed end.
	limit := min(r.appliedIndex, r.markedIndex())
	if r.split.index != 0 {
		// A split marker is the range's fence against appends (split.go):
		// a replica whose log lost it (retention here, or a snapshot
		// from a leader whose log did) would take appends after the
		// split. The segment that holds it stays, and with it every
		// snapshot of this log carries it. A split range takes no more
		// appends, so this keeps at most one segment.
		limit = min(limit, r.split.index-1)
	}
	if first, ok := r.pins.min(); ok {
		limit = min(limit, first-1)
	}
	k := prefixThrough(cands, limit)
	if r.isLeader && r.cfg.CompactionHoldBackBytesMax >= 0 {
		if hold := r.followersMatch(); hold < limit {
			kh := prefixThrough(cands, hold)
			var held int64
			for _, c := range cands[kh:k] {
				held += c.Bytes
			}
			if held <= r.cfg.CompactionHoldBackBytesMax {
				k = kh
			}
		}
	}
	return k
}

// moveCompactionPoint makes the end of segment last the compaction point,
// if it is past the current one, saving it with the producer base as of
// it: Raft then sees the log start after it.
func (r *Replica) moveCompactionPoint(last segment.SegmentInfo) error {
	if last.LastIndex <= r.state.SnapshotIndex {
		return nil
	}
	// The producer base follows the compaction point: it takes in the
	// batches Raft no longer reads.
	base, epoch, err := r.advanceBaseEpoch(last.LastIndex)
	if err != nil {
		return err
	}
	prev := r.state
	r.state.Producers = base.encode()
	// The deleted frames' epoch stays known (HighestEpoch) when retention
	// deletes the whole log.
	r.state.CompactedEpoch = max(r.state.CompactedEpoch, epoch)
	r.keepSharedFloor()
	r.state.SnapshotIndex, r.state.SnapshotTerm = last.LastIndex, last.LastTerm
	r.state.SnapshotNextOffset, r.state.SnapshotAppendUnixNanos = last.NextOffset, last.MaxAppendTimeUnixNanos
	if r.state.Raft.GetCommit() < last.LastIndex {
		// Raft refuses to start with a commit index below the log's
		// start; the compacted entries are applied, so committed.
		hs := proto.Clone(r.state.Raft).(*raftpb.HardState)
		hs.Commit = proto.Uint64(last.LastIndex)
		r.state.Raft = hs
	}
	if err := r.cfg.State.Save(r.state); err != nil {
		r.state = prev
		return fmt.Errorf("replica: save compaction point %d: %w", last.LastIndex, err)
	}
	r.base = base
	return nil
}

// PrepareRewrite readies the log for compaction by key below point (the
// decision KeyCompaction returns): it seals the segments holding an offset
// below point and moves the compaction point over those of them it may
// (see compactable): Raft no longer reads them as entries, so their frames
// may be rewritten with holes (a follower behind them gets a snapshot).
// It returns the offset at which those segments end: segments ending at
// or below it may be rewritten (0: none yet). It does nothing while a
// Ready is pending or a fork is proposed or unapplied (like Compact). For
// the driver goroutine.
func (r *Replica) PrepareRewrite(point uint64) (uint64, error) {
	if r.failure.Load() != nil || r.rn.HasReady() || r.forkPending() || point == 0 {
		return 0, nil
	}
	if err := r.cfg.Log.SealBefore(point); err != nil {
		return 0, fmt.Errorf("replica: seal below %d: %w", point, err)
	}
	var cands []segment.SegmentInfo
	for _, g := range r.cfg.Log.Sealed() {
		if g.BaseOffset >= point {
			break
		}
		cands = append(cands, g)
	}
	k := r.compactable(cands)
	if k == 0 {
		return 0, nil
	}
	if err := r.moveCompactionPoint(cands[k-1]); err != nil {
		return 0, err
	}
	return cands[k-1].NextOffset, nil
}

// KeyCompaction returns the newest compaction decision (a marker,
// batch.TypeCompact) applied here: what PrepareRewrite and the cleaner
// compact below. For the driver goroutine.
func (r *Replica) KeyCompaction() batch.Compaction { return r.keyDecision }

// KeyCompactionMarkerEnd returns the offset after KeyCompaction's marker
// (0 if unknown, as after a snapshot). For the driver goroutine.
func (r *Replica) KeyCompactionMarkerEnd() uint64 { return r.keyMarkerEnd }

// noteCompaction applies a committed compaction marker.
func (r *Replica) noteCompaction(frame []byte) error {
	h, c, err := batch.DecodeCompaction(frame)
	if err != nil {
		return err
	}
	if c.Point > r.keyDecision.Point {
		r.keyDecision, r.keyMarkerEnd = c, h.NextOffset()
	}
	return nil
}

// recoverKeyCompaction finds, on opening, the newest marker at or below
// the applied index among the log's frames (headers): later ones are
// applied again by Raft.
func (r *Replica) recoverKeyCompaction(headers []batch.Header) error {
	for i := len(headers) - 1; i >= 0; i-- {
		h := headers[i]
		if h.Type != batch.TypeCompact || h.Index > r.appliedIndex {
			continue
		}
		f, err := r.cfg.Log.ReadFramesByIndex(h.Index, h.Index+1, 1)
		if err != nil {
			return fmt.Errorf("replica: read compaction marker at index %d: %w", h.Index, err)
		}
		return r.noteCompaction(f)
	}
	return nil
}

// advanceBase returns the producer base as of index: the current one (as
// of the compaction point) with the frames after it up to index.
func (r *Replica) advanceBase(index uint64) (*producerBase, error) {
	base, _, err := r.advanceBaseEpoch(index)
	return base, err
}

// advanceBaseEpoch is advanceBase, and also returns the highest epoch of
// the data frames it read (0: none).
func (r *Replica) advanceBaseEpoch(index uint64) (*producerBase, uint64, error) {
	base := r.base.clone()
	lo := max(r.cfg.Log.FirstIndex(), r.state.SnapshotIndex+1)
	if lo > index {
		return base, 0, nil
	}
	// Headers only: the frames about to be deleted are not copied out
	// (with retention, every compaction reads a whole segment).
	var epoch uint64
	err := r.cfg.Log.HeadersByIndex(lo, index+1, func(h batch.Header) {
		if h.Type == batch.TypeData {
			epoch = max(epoch, h.Epoch)
		}
		base.record(h)
	})
	if err != nil {
		return nil, 0, fmt.Errorf("replica: read frames to compact at index %d: %w", lo, err)
	}
	return base, epoch, nil
}

// prefixThrough is how many of cands, from the oldest, hold only entries
// at or below index.
func prefixThrough(cands []segment.SegmentInfo, index uint64) int {
	k := 0
	for k < len(cands) && cands[k].LastIndex <= index {
		k++
	}
	return k
}

// followersMatch is the lowest index acknowledged by the followers a leader
// should hold compaction back for (see Compact); MaxUint64 if none.
func (r *Replica) followersMatch() uint64 {
	hold := uint64(math.MaxUint64)
	r.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		if id != r.cfg.NodeID && pr.RecentActive && pr.State != tracker.StateSnapshot {
			hold = min(hold, pr.Match)
		}
	})
	return hold
}

// reconcileState runs when a replica opens: it completes or drops an
// interrupted snapshot install (see installSnapshot), checks that the log
// reaches the compaction point, and brings the commit index within what the
// log holds (a hard state saved with a commit index ahead of entries that
// a crash then lost; the commit index is relearned from the leader).
func (r *Replica) reconcileState() error {
	log := r.cfg.Log
	if m := r.state.Installing; m != nil {
		var swapped bool
		if last := log.LastIndex(); last != 0 {
			t, err := log.TermAt(last)
			swapped = err == nil && last == m.Index && t == m.Term
		} else {
			swapped = log.NextOffset() == m.NextOffset
		}
		if swapped {
			r.adoptSnapshot(*m)
			r.logger.Warn("completed an interrupted snapshot install", "index", m.Index, "term", m.Term)
		} else {
			r.state.Installing = nil
			r.logger.Warn("dropped an interrupted snapshot install; the log is the old one", "index", m.Index)
		}
		if err := r.cfg.State.Save(r.state); err != nil {
			return fmt.Errorf("replica: save state: %w", err)
		}
	}
	if last := log.LastIndex(); (last != 0 && last < r.state.SnapshotIndex) || log.NextOffset() < r.state.SnapshotNextOffset {
		return fmt.Errorf("replica: the log ends at index %d offset %d, before the compaction point (index %d, offset %d)",
			last, log.NextOffset(), r.state.SnapshotIndex, r.state.SnapshotNextOffset)
	}
	if first := log.FirstIndex(); first > r.state.SnapshotIndex+1 {
		return fmt.Errorf("replica: the log starts at index %d, after the compaction point %d: entries are missing",
			first, r.state.SnapshotIndex)
	}
	commit := r.state.Raft.GetCommit()
	if c := min(max(commit, r.state.SnapshotIndex), max(log.LastIndex(), r.state.SnapshotIndex)); c != commit {
		hs := proto.Clone(r.state.Raft).(*raftpb.HardState)
		hs.Commit = proto.Uint64(c)
		r.state.Raft = hs
	}
	r.raftCommit.Store(r.state.Raft.GetCommit())
	return nil
}

// initApplied sets the index Raft restarts applying after (entries after
// it are applied again), and what follows from it: the applied end and the
// newest append time up to it; and publishes the commit index the state
// and the commit mark hold (reconcileState clamped it to the log): at
// least what this replica published before it stopped (commitmark.go).
func (r *Replica) initApplied() error {
	r.appliedIndex = r.state.AppliedConfIndex()
	h, err := r.endAt(r.appliedIndex)
	if err != nil {
		return fmt.Errorf("replica: read applied entry %d: %w", r.appliedIndex, err)
	}
	r.appliedEnd, r.appliedAppendUnixNanos = h.NextOffset(), h.AppendTimeUnixNanos
	commit := r.state.Raft.GetCommit()
	if h, err = r.endAt(commit); err != nil {
		return fmt.Errorf("replica: read committed entry %d: %w", commit, err)
	}
	r.committed.Store(h.NextOffset())
	r.writer.markDone = commit
	return nil
}

// endAt is the header of the entry at index, or the compaction point's
// end (offset and append time) for an index at or below it.
func (r *Replica) endAt(index uint64) (batch.Header, error) {
	if index <= r.state.SnapshotIndex {
		return batch.Header{BaseOffset: r.state.SnapshotNextOffset, AppendTimeUnixNanos: r.state.SnapshotAppendUnixNanos}, nil
	}
	return r.frameHeader(index)
}

// Stats are a replica's snapshot and compaction counters.
type Stats struct {
	// SnapshotsSent counts snapshots handed to the transport.
	SnapshotsSent uint64
	// SnapshotsInstalled counts snapshots installed here.
	SnapshotsInstalled uint64
	// SegmentsCompacted counts segments deleted by Compact.
	SegmentsCompacted uint64
}

// Stats returns the counters; safe from any goroutine.
func (r *Replica) Stats() Stats {
	return Stats{SnapshotsSent: r.snapshotsSent.Load(), SnapshotsInstalled: r.snapshotsInstalled.Load(),
		SegmentsCompacted: r.segmentsCompacted.Load()}
}

// SetCompactionFloor makes Compact keep every segment holding an offset at
// or past offset (set: false removes the floor). The home range's leader
// sets it to the lowest offset its mirrors in other regions have applied,
// so that retention never deletes what the replicator has yet to ship: a
// mirror must stay a gapless prefix. A leader shares its floor with its
// followers, which keep their logs from it too (floor.go). For the driver
// goroutine.
func (r *Replica) SetCompactionFloor(offset uint64, set bool) {
	r.floorOffset, r.floorSet = offset, set
}
