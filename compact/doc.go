// Package compact is compaction by key: a stream whose cleanup policy
// includes "compact" keeps, per range, the newest record of each key (a
// changelog), with tombstones (records without a value) that delete a key
// and are themselves removed after a delete-retention time. Offsets stay
// with their records: below the points compaction ran at, a range's
// offsets become sparse (readers see next offsets jump over holes), and
// one offset still holds one record.
//
// # The rule, and why every copy agrees
//
// A range's home leader decides a compaction as a marker appended to the
// log (batch.TypeCompact, carrying a batch.Compaction): a point P (a frame
// boundary no further than the committed tail, the stream's minimum lag,
// and, for a stream in several regions, what every mirror has applied),
// a tombstone cutoff T and a producer cutoff. Decide is that policy. The
// marker takes an offset, is replicated by Raft and shipped to every
// mirror like any frame. Every copy that has applied a marker may then
// rewrite its log below P so that it holds, below P, exactly:
//
//   - every record without a key (it cannot be superseded);
//   - for every key, its newest record in [0, P) (ties cannot happen: one
//     offset, one record), unless that record is a tombstone whose batch
//     was appended before T.
//
// At and past P nothing changes. What a copy holds below P is thereby a
// function of the records of [0, P) and of (P, T), and those are the same
// in every copy: the home's replicas share its Raft log, and mirrors apply
// its frames verbatim. Segment boundaries are local to each copy and
// enter no part of the rule. Decisions only move forward (P and the
// cutoffs never decrease), and compacting at (P1, T1) then at (P2, T2)
// keeps exactly what compacting at (P2, T2) alone keeps: a record newest
// in [0, P2) is newest in [0, P1) if below P1, and a tombstone expired at
// T1 is expired at T2. So a copy that skipped a decision, crashed in the
// middle of one or ran it twice ends where the others do. The points are
// bounded by what every mirror applied, so no region compacts with
// records a failover could later move to its orphan log.
//
// A compaction marker below the point is spent: it is dropped, or kept as
// an empty batch (its offset a hole). Readers never see markers.
//
// # What else a copy keeps
//
// Batch headers without records, which readers never see, stay where the
// log needs them: a segment's last frame (segments join by their names);
// the frame ending at P (what follows is not compacted); the frames a
// kept control frame follows (a Raft control frame or a fork frame cannot
// follow a gap); and the latest dedup.RecentBatchesMax batches of every
// producer whose newest batch below P was appended at or after the
// decision's producer cutoff, so that an idempotent producer's retry is
// recognised from the log alone (Raft replicas also keep their producer
// base at their compaction point). Which empty headers stay depends on
// segment boundaries; the records do not.
//
// # Pieces
//
//   - Decide: the home leader's policy (pure).
//   - Plan: one compaction of one copy at one decision (pure over frames):
//     Observe every frame below the point in log order, then Rewrite.
//   - Cleaner: the driver. One goroutine per node runs Jobs one at a time,
//     reading and rewriting segments through segment.Store (crash-safe
//     segment by segment, see segment.Store.RewriteSegment) at a bounded
//     rate, and reports each result to the range.
//
// # Driver contract (the range)
//
//  1. On the home leader, on its maintenance tick, run Decide and append
//     the marker like an append (its epoch and lease checks included).
//  2. On every copy, apply markers in log order as the log commits; the
//     range's decision is the newest applied (on open: the newest marker
//     at or below what was applied).
//  3. To compact at the decision: seal every segment holding an offset
//     below P (segment.Store.SealBefore); on a Raft replica move the
//     compaction point over the sealed segments about to be rewritten
//     (Raft must no longer read them as entries: followers behind get a
//     snapshot); submit a Job whose Limit is the end of those segments.
//  4. A Result that is not Complete (segments past the limit, a segment
//     that changed meanwhile) is submitted again on a later tick; an
//     error is logged and retried likewise. ErrKeysExceeded compacts
//     nothing until the memory bound is raised.
package compact
