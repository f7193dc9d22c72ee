package replicator

import (
	"fmt"

	"github.com/geolog/geolog/batch"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
)

// The functions here expose, without a stream, a goroutine or a lock, the
// per-request steps of Task and Server that a driver of its own needs:
// the deterministic simulator (package sim) drives a Cursor and serves
// mirrors on one goroutine, in virtual time, and runs these so that what
// it ships and what it accepts are checked by this package's code, not by
// a copy of it.

// BuildBatch is what a Task does with the frames a Read action from
// offset from returned: it checks that they are whole frames extending
// each other and covering from (a leading hole only before a compacted
// frame), and describes them as an uncompressed MirrorBatch whose payload
// aliases frames.
func BuildBatch(frames []byte, from uint64) (*geologinternalv1.MirrorBatch, error) {
	first, end, count, err := scanFrames(frames)
	if err == nil && first > from && frameCompacted(frames) {
		first = from // the batch covers the hole compaction left
	}
	if err == nil && (first > from || end <= from) {
		err = fmt.Errorf("%w: source returned [%d, %d) for a read from %d", ErrOutOfRange, first, end, from)
	}
	if err != nil {
		return nil, err
	}
	return &geologinternalv1.MirrorBatch{
		FirstOffset: first, EndOffset: end, FrameCount: count,
		UncompressedBytes: uint64(len(frames)), Compression: CompressionNone, Payload: frames,
	}, nil
}

// CheckedBatch is a MirrorBatch that passed CheckBatch: FrameCount whole,
// valid data frames (or compaction markers) covering [First, End).
type CheckedBatch struct {
	First, End uint64
	FrameCount int
	Frames     []byte
}

// CheckBatch validates b, sent by a home at homeEpoch, as the Server does
// before anything of it reaches a MirrorRange (sizes, CRCs, structure,
// dense offsets, epochs, append times); a zstd payload is refused. Every
// failure is an ErrMalformed refusal.
func CheckBatch(b *geologinternalv1.MirrorBatch, homeEpoch uint64) (CheckedBatch, error) {
	d, err := decodeBatch(b, homeEpoch, batch.FrameBytesMax, nil)
	if err != nil {
		return CheckedBatch{}, err
	}
	return CheckedBatch{First: d.first, End: d.end, FrameCount: d.frameCount, Frames: d.frames}, nil
}

// Overlap is the Server's comparison of a checked batch with a mirror
// whose applied end is applied: a batch starting past it is refused with
// ErrGap (ExpectedOffset = applied); the part below it must be what the
// mirror holds there (stored: the mirror's frames from the one holding
// First, as ReadOverlap(mirror, First, len(Frames), min(applied, End))
// returns them; nil when First >= applied), else an ErrDiverged refusal
// (a fork point, if any, is for a Forker: the simulator has none yet). It
// returns the frames to Apply: those at and past applied, none for a
// batch wholly below it (a duplicate, acknowledged as is).
func (c CheckedBatch) Overlap(applied uint64, stored []byte) ([]byte, error) {
	if c.First > applied {
		return nil, gapRefusal(c.First, applied)
	}
	if c.First == applied {
		return c.Frames, nil
	}
	d := decodedBatch{first: c.First, end: c.End, frameCount: c.FrameCount, frames: c.Frames}
	suffix, err := overlapSuffix(d, applied, stored)
	if err != nil {
		return nil, err
	}
	return c.Frames[suffix:], nil
}

// ResetPoint is the Server's decision for a checked batch that overlaps a
// mirror's applied end (applied) where the mirror's frames are gone, so
// that MirrorRange.ReadFrames failed: when every frame the mirror holds is
// of an older epoch than the batch (logEpoch: the epoch its log ends in,
// as the Server answers an open with it; 0 unknown), the mirror forks at
// First to epoch (below its log start: replica.ProposeFork resets it) and
// serves the batch again; ok false: the Server refuses the batch with
// UNAVAILABLE.
func (c CheckedBatch) ResetPoint(applied, logEpoch uint64) (at, epoch uint64, ok bool) {
	fp, ok := resetPoint(decodedBatch{first: c.First, end: c.End, frameCount: c.FrameCount, frames: c.Frames}, applied, logEpoch)
	return fp.at, fp.epoch, ok
}

// ForkPoint reports, for an ErrDiverged refusal from Overlap, where the
// mirror's stored frames leave a newer home's: the offset to fork at and
// the epoch to fork to (a Forker's arguments); ok is false for any other
// refusal.
func (r *Refusal) ForkPoint() (at, epoch uint64, ok bool) {
	if r == nil || r.fork == nil {
		return 0, 0, false
	}
	return r.fork.at, r.fork.epoch, true
}
