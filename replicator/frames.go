package replicator

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/geolog/geolog/batch"
)

// Byte positions of the frame header fields this package reads without a
// CRC pass, on frames already validated (see batch/doc.go for the layout;
// TestHeaderPositions pins them against batch.DecodeHeader).
const (
	posFlags       = 10
	posRecordCount = 12
	posBaseOffset  = 16
	posEpoch       = 24
	posTerm        = 32
	posAppendTime  = 48 // first byte after Term and Index
	posSpan        = 80 // a compacted frame's OffsetSpan
)

// frameBase is the BaseOffset of a validated frame.
func frameBase(f []byte) uint64 { return binary.LittleEndian.Uint64(f[posBaseOffset:]) }

func frameEpoch(f []byte) uint64 { return binary.LittleEndian.Uint64(f[posEpoch:]) }

// frameNext is the NextOffset of a validated frame: past its span, for a
// frame compaction by key rewrote.
func frameNext(f []byte) uint64 {
	if frameCompacted(f) {
		return frameBase(f) + uint64(binary.LittleEndian.Uint32(f[posSpan:]))
	}
	return frameBase(f) + uint64(binary.LittleEndian.Uint32(f[posRecordCount:]))
}

// frameCompacted reports whether a validated frame was rewritten by
// compaction by key: it may start past the previous frame's end.
func frameCompacted(f []byte) bool {
	return binary.LittleEndian.Uint16(f[posFlags:])&batch.FlagCompacted != 0
}

// follows reports whether frame h may come next in a log whose frames so
// far end at next: exactly there, or past it if compaction rewrote it (the
// offsets between were compacted away).
func follows(h batch.Header, next uint64) bool {
	return h.BaseOffset == next || (h.Compacted() && h.BaseOffset > next)
}

// shipped reports whether frame h is one the replicator ships: a data
// frame (with records, unless compaction emptied it) or a compaction
// marker. Control frames never are.
func shipped(h batch.Header) bool {
	return !h.IsControl() && (h.RecordCount > 0 || h.Compacted())
}

// sameData reports whether two validated frames are equal in every field
// that carries data: everything but the CRC and the Raft term and index,
// which each region's Raft group stamps for itself. Both frames' CRCs were
// verified, so equal bytes outside the CRC mean equal frames up to those
// two fields.
func sameData(a, b []byte) bool {
	return len(a) == len(b) &&
		bytes.Equal(a[8:posTerm], b[8:posTerm]) &&
		bytes.Equal(a[posAppendTime:], b[posAppendTime:])
}

// SameData reports whether two frames hold the same data: both are valid
// frames, equal in every field but the CRC and the Raft term and index (the
// fields a mirror's own Raft group re-stamps). Tests and checkers use it to
// compare a mirror with its home.
func SameData(a, b []byte) bool {
	sa, err := batch.FrameSize(a)
	if err != nil || sa != len(a) {
		return false
	}
	if _, err := batch.DecodeHeader(a); err != nil {
		return false
	}
	if _, err := batch.DecodeHeader(b); err != nil {
		return false
	}
	return sameData(a, b)
}

// SplitFrames splits concatenated whole frames, checking each one's CRC and
// structure. The frames alias buf.
func SplitFrames(buf []byte) ([][]byte, error) {
	var out [][]byte
	for p := 0; p < len(buf); {
		size, err := batch.FrameSize(buf[p:])
		if err != nil {
			return nil, err
		}
		if size > len(buf)-p {
			return nil, fmt.Errorf("%w: frame at byte %d runs past the buffer", batch.ErrShort, p)
		}
		if _, err := batch.Validate(buf[p : p+size]); err != nil {
			return nil, err
		}
		out = append(out, buf[p:p+size:p+size])
		p += size
	}
	return out, nil
}

// FrameReader reads a log's frames with Source.ReadFrames's contract
// (endOffset bounds by BaseOffset; the first frame always comes whole).
type FrameReader interface {
	ReadFrames(from uint64, maxBytes int, endOffset uint64) ([]byte, error)
}

// ReadOverlap reads what a mirror stores where a batch of frameBytes bytes
// from first overlaps it, below end (the lesser of its applied end and the
// batch's end): the stored frames a comparison (overlapSuffix) needs. The
// read is sized for an identical overlap, whose frames have the batch's
// sizes. Where the mirror's frame differs (another home's divergent frame)
// and is larger than the batch's frame at that offset, that read stops
// before it, and the comparison would find no frame there instead of the
// frame to fork off (sim seed 3501631): so the frame at the read's end is
// read too, whole, if it starts below end.
func ReadOverlap(r FrameReader, first uint64, frameBytes int, end uint64) ([]byte, error) {
	stored, err := r.ReadFrames(first, frameBytes, end)
	if err != nil || len(stored) == 0 {
		return stored, err
	}
	next := first
	for p := 0; p < len(stored); {
		size, err := batch.FrameSize(stored[p:])
		if err != nil || size > len(stored)-p {
			return stored, nil // the comparison reports the unreadable frame
		}
		next = frameNext(stored[p : p+size])
		p += size
	}
	if next >= end {
		return stored, nil
	}
	more, err := r.ReadFrames(next, 1, end)
	if err != nil {
		return stored, nil // the comparison reports what is missing
	}
	return append(stored, more...), nil
}
