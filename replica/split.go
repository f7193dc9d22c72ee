package replica

import (
	"fmt"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
)

// A range split (docs/split.md) in a replica: the range's home leader
// proposes a split marker (batch.TypeSplit) like any append. From the
// moment the marker is in this replica's log (proposed here, or written
// from a leader's entries: committed or not), the replica refuses every
// append that is not already in its log. So no record follows the marker
// in any copy of the log:
//
//   - a leader proposes nothing after its own marker (pending is set as
//     it proposes it, before the log writer has the entry);
//   - a new leader whose log holds an uncommitted marker of an earlier
//     term refuses as well: Raft commits the marker with the leader's
//     first entry, and nothing may be proposed after it;
//   - a new leader whose log lacks the marker knows it is not committed
//     (Raft's leader completeness): the split did not happen, and the
//     marker is truncated away where it was written (rebuildDedup forgets
//     it and the replay of what is left notes what remains);
//   - a retry of a batch already in the log is answered from the
//     idempotence table, with its offset, before the split is checked.
//
// The refusal says RANGE_SPLIT (the producer sends the batch to a child)
// only once this replica has applied the marker: the marker is committed,
// this log holds every batch the range will ever hold, and one not in
// its idempotence table is not in the range. Before that the refusal is
// a retriable UNAVAILABLE: a leader deposed while its marker was on its
// way does not hold what its successor committed meanwhile (a producer's
// batch whose answer was lost and that it resends here), and its marker
// may never commit (seed 864430 of one region: the batch answered
// RANGE_SPLIT there was in the log at the next leader, and would have
// been in a child too). A rejection of the idempotence table turns into
// RANGE_SPLIT only where it says the batch is not in the range (a
// sequence gap: a pipelined batch behind one refused for the split; a
// producer whose state the range lost), never for a batch it holds but
// no longer remembers (DUPLICATE_OUT_OF_WINDOW) or one that overlaps.
//
// A mirror (ProposeVerbatim) holds the marker as the home shipped it and
// refuses any frame after it alike.

// splitState is the split marker in this replica's log, if any; owned by
// the driver goroutine.
type splitState struct {
	// pending says this leader proposed a marker that the log writer has
	// not noted yet.
	pending bool
	// index and offset are the marker's Raft index and offset (the split
	// offset) once noted; index 0: none in the log.
	index, offset uint64
	// decision is the marker's decision, read once it is applied.
	decision    batch.Split
	decisionSet bool
}

// has reports whether the log holds (or this leader proposed) a marker.
func (s *splitState) has() bool { return s.pending || s.index != 0 }

// noteSplitFrame follows a split marker that enters the log (noteFrame).
func (r *Replica) noteSplitFrame(h batch.Header) {
	r.split.pending = false
	r.split.index, r.split.offset = h.Index, h.BaseOffset
}

// forgetUnappliedSplit forgets a marker above the applied index: called
// before the log is replayed after a truncation or an install
// (rebuildDedup), which notes again what is left of it.
func (r *Replica) forgetUnappliedSplit() {
	if r.split.index > r.appliedIndex || r.split.pending {
		r.split = splitState{}
	}
}

// splitBlocksAppends is the error for an append once the log holds a
// split marker (see above): RANGE_SPLIT once the marker is applied here,
// a retriable UNAVAILABLE until then.
func (r *Replica) splitBlocksAppends() error {
	switch {
	case !r.split.has():
		return nil
	case r.split.index == 0 || r.split.index > r.appliedIndex:
		return apierr.New(apierr.Unavailable, "stream %s range %d: a split marker is in this replica's log, not yet committed: retry (the range either splits or goes on)",
			r.cfg.Stream, r.cfg.Range)
	}
	return apierr.New(apierr.RangeSplit, "stream %s range %d split at offset %d: describe the stream again and append to the child that owns the keys",
		r.cfg.Stream, r.cfg.Range, r.split.offset)
}

// splitMovesRejected reports whether the idempotence table's rejection
// err says that the batch is not in this range (see above).
func splitMovesRejected(err error) bool {
	c := apierr.CodeOf(err)
	return c == apierr.SequenceGap || c == apierr.ProducerStateLost
}

// proposingSplit notes, before frame is proposed, that it is a split
// marker: from now on this leader proposes nothing after it. It reports
// whether it is one (the caller undoes the note if Raft refuses it).
func (r *Replica) proposingSplit(frame []byte) bool {
	if !batch.IsSplit(frame) {
		return false
	}
	r.split.pending = true
	return true
}

// SplitPending reports whether this replica's log holds a split marker
// (applied or not) or this leader proposed one: the range takes no more
// appends. For the driver goroutine.
func (r *Replica) SplitPending() bool { return r.split.has() }

// SplitApplied returns the decision of the split marker this replica
// applied and its offset (the split offset); ok false if none is applied
// yet. It reads the marker from the log once. For the driver goroutine.
func (r *Replica) SplitApplied() (d batch.Split, offset uint64, ok bool, err error) {
	s := &r.split
	if s.index == 0 || s.index > r.appliedIndex {
		return batch.Split{}, 0, false, nil
	}
	if !s.decisionSet {
		f, err := r.cfg.Log.ReadFramesByIndex(s.index, s.index+1, 1)
		if err != nil {
			return batch.Split{}, 0, false, fmt.Errorf("replica: read split marker at index %d: %w", s.index, err)
		}
		_, d, err := batch.DecodeSplit(f)
		if err != nil {
			return batch.Split{}, 0, false, fmt.Errorf("replica: split marker at index %d: %w", s.index, err)
		}
		s.decision, s.decisionSet = d, true
	}
	return s.decision, s.offset, true, nil
}
