package replica

import (
	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
)

// ProposeVerbatim appends a frame built by another region's home leader, as
// a mirror does: the frame keeps its offsets, epoch, append time and
// producer fields (only the Raft term and index are this group's, stamped
// when it is persisted). It must start exactly at the tail of this leader's
// log, its own unacknowledged proposals included (a compacted frame may
// start past it); otherwise the reply is a
// retriable OFFSET_OUT_OF_RANGE whose TailOffset is that tail (after a
// leader change the tail may be ahead of the committed end until the new
// leader's first entry commits). A frame of an epoch older than one known
// to start at or below its offset is refused with STALE_EPOCH
// (epochstarts.go). The reply comes once the entry commits.
// The caller (the replicator's server) has validated the frame.
func (r *Replica) ProposeVerbatim(op *Op) {
	if r.failure.Load() != nil {
		op.Reply(Result{Err: r.StoppedAppendError()})
		return
	}
	if !r.isLeader {
		op.Reply(Result{Err: r.notLeader()})
		return
	}
	if e := r.diskFull.Load(); e != nil {
		op.Reply(Result{Err: e})
		return
	}
	if err := r.forkBlocksAppends(); err != nil {
		op.Reply(Result{Err: err})
		return
	}
	if err := r.splitBlocksAppends(); err != nil {
		op.Reply(Result{Err: err})
		return
	}
	h, err := batch.DecodeHeader(op.Frame)
	if err != nil || h.IsControl() || (h.RecordCount == 0 && !h.Compacted()) {
		op.Reply(Result{Err: apierr.New(apierr.InvalidArgument, "stream %s range %d: a mirrored frame must be a valid data frame or compaction marker", r.cfg.Stream, r.cfg.Range)})
		return
	}
	if err := r.staleMirrored(h); err != nil { // epochstarts.go
		op.Reply(Result{Err: err})
		return
	}
	// A compacted frame (the home compacted below it before shipping it)
	// may start past the tail: the offsets between were compacted away.
	if h.BaseOffset != r.proposeNext && !(h.Compacted() && h.BaseOffset > r.proposeNext) {
		e := apierr.New(apierr.OffsetOutOfRange, "stream %s range %d: mirrored frame at offset %d, the log continues at %d",
			r.cfg.Stream, r.cfg.Range, h.BaseOffset, r.proposeNext)
		e.Retriable = true
		e.StartOffset, e.TailOffset = r.cfg.Log.StartOffset(), r.proposeNext
		op.Reply(Result{Err: e})
		return
	}
	// RecordCount counts the offsets the frame takes, holes included.
	r.proposeFrame(op, Result{BaseOffset: h.BaseOffset, RecordCount: h.Span(), Epoch: h.Epoch, AppendTimeUnixNanos: h.AppendTimeUnixNanos})
}
