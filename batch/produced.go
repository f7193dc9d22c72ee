package batch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// A produced frame is a data frame as a producer builds it for an append
// (AppendRequest.batch): the records in the log's own encoding, so that the
// leader checks them in place and writes the frame as it came instead of
// decoding them into messages and encoding them again. The producer sets
// the header's ProducerID and BaseSequence; the fields only the leader may
// set (BaseOffset, Epoch, Term, Index, AppendTimeUnixNanos, HLC) are zero,
// and the leader stamps them (Patch, PatchRaft) as it appends.

// ErrNotProduced reports a frame that is well formed but is not what a
// producer may append: not a data frame, compacted, with records and
// bytes after the frame, or with a field set that only the leader sets.
var ErrNotProduced = errors.New("batch: not a producer's frame")

var (
	errProducedType    = fmt.Errorf("%w: not a data frame", ErrNotProduced)
	errProducedCompact = fmt.Errorf("%w: compacted", ErrNotProduced)
	errProducedLeader  = fmt.Errorf("%w: a field only the leader sets is not zero", ErrNotProduced)
	errProducedTrail   = fmt.Errorf("%w: bytes after the frame", ErrNotProduced)
)

// RecordView is one record of a frame as ValidateProduced shows it, without
// decoding it: Key aliases the frame (nil when empty); PayloadBytes counts
// the bytes of its key, value and header keys and values (not the
// encoding's lengths); HeaderCount is its number of headers.
type RecordView struct {
	Key          []byte
	HeaderCount  int
	PayloadBytes int
	Tombstone    bool
}

// ValidateProduced checks that frame is exactly one produced frame (see
// above): its length field covers all of frame, its CRC is right, its
// header is a producer's and its records are well formed (Validate's
// checks). It shows visit each record, in order, once the record is
// checked and before the next is read, so that the caller applies its own
// rules (a key's range, sizes) and refuses the frame with the first error
// visit returns, which ValidateProduced returns as is. Any other error
// wraps ErrShort, ErrCorrupt or ErrNotProduced. ValidateProduced does
// not allocate, reads frame without changing it, and never panics,
// whatever its input.
func ValidateProduced(frame []byte, visit func(i int, r RecordView) error) (Header, error) {
	size, err := FrameSize(frame)
	if err != nil {
		return Header{}, err
	}
	if len(frame) > size {
		return Header{}, errProducedTrail
	}
	h, err := DecodeHeader(frame)
	if err != nil {
		return Header{}, err
	}
	switch {
	case h.Type != TypeData:
		return Header{}, errProducedType
	case h.Flags&FlagCompacted != 0:
		return Header{}, errProducedCompact
	case h.BaseOffset != 0 || h.Epoch != 0 || h.Term != 0 || h.Index != 0 || h.AppendTimeUnixNanos != 0 || h.HLC != 0:
		return Header{}, errProducedLeader
	}
	if _, err := walkRecords(frame[HeaderSize:size], h, visit); err != nil {
		return Header{}, err
	}
	return h, nil
}

// EncodeProduced appends a produced frame holding recs to dst, under
// producerID from baseSequence (both 0: not idempotent), and returns the
// extended slice. It panics as Encode does; records a producer cannot
// encode (a tombstone with a value, a frame over FrameBytesMax) are the
// caller's to refuse first (ProducedBytes).
func EncodeProduced(dst []byte, producerID, baseSequence uint64, recs []Record) []byte {
	return Encode(dst, Header{Type: TypeData, ProducerID: producerID, BaseSequence: baseSequence}, recs)
}

// ProducedBytes returns the size of the produced frame holding recs, and
// false if EncodeProduced would panic on them: a tombstone with a value,
// or a frame over FrameBytesMax.
func ProducedBytes(recs []Record) (int, bool) {
	f := recordFormat{}
	for i := range recs {
		if recs[i].Tombstone {
			if len(recs[i].Value) > 0 {
				return 0, false
			}
			f.attributes = true
		}
	}
	size := HeaderSize
	for i := range recs {
		if size += f.recordSize(&recs[i]); size > FrameBytesMax {
			return 0, false
		}
	}
	return size, true
}

// PatchProducer rewrites ProducerID and BaseSequence of frame and
// recomputes its CRC, under Patch's contract: a producer renumbering a
// batch it has built.
func PatchProducer(frame []byte, producerID, baseSequence uint64) {
	f := patchable(frame)
	binary.LittleEndian.PutUint64(f[posProducerID:], producerID)
	binary.LittleEndian.PutUint64(f[posBaseSequence:], baseSequence)
	binary.LittleEndian.PutUint32(f[posCRC:], crc32.Checksum(f[crcStart:], castagnoli))
}
