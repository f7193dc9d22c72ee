package batch

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Split is a split decision, the payload of a split marker (TypeSplit): a
// range's home leader appends one to split the range in two at a hash
// boundary (docs/split.md). The marker's offset is the range's split
// offset: the range's records are those below it, and every copy of the
// range (its replicas, and every region's mirror, which receive the
// marker like any frame) refuses appends once its log holds the marker.
// The fields mirror keyspace.RangeMap.Split, which this package does not
// import.
type Split struct {
	// MapVersion is the version of the stream's range map after the
	// split (at least 1).
	MapVersion uint64
	// Parent is the range that splits (the range whose log holds the
	// marker); HashStart and HashEnd bound its hashes, inclusive.
	Parent             uint32
	HashStart, HashEnd uint64
	// At is the boundary: Left owns [HashStart, At-1], Right [At,
	// HashEnd]; HashStart < At <= HashEnd.
	At uint64
	// Left and Right are the children's range ids; Right is Left+1.
	Left, Right uint32
}

// splitVersion is the version byte that starts a split marker's payload.
const splitVersion = 1

// splitPayloadBytes is the size of a split marker's payload: version,
// then MapVersion, HashStart, HashEnd, At (u64), Parent, Left, Right
// (u32), little-endian.
const splitPayloadBytes = 1 + 4*8 + 3*4

// Valid reports whether s is a decision a split marker may carry: the
// boundary leaves neither child empty, the children are two consecutive
// ids other than the parent's and math.MaxUint32, and the version is
// positive.
func (s Split) Valid() bool {
	return s.MapVersion > 0 && s.HashStart < s.At && s.At <= s.HashEnd &&
		s.Left != math.MaxUint32 && s.Right == s.Left+1 && s.Parent != s.Left && s.Parent != s.Right
}

func (s Split) payload() []byte {
	p := make([]byte, 0, splitPayloadBytes)
	p = append(p, splitVersion)
	le := binary.LittleEndian
	p = le.AppendUint64(p, s.MapVersion)
	p = le.AppendUint64(p, s.HashStart)
	p = le.AppendUint64(p, s.HashEnd)
	p = le.AppendUint64(p, s.At)
	p = le.AppendUint32(p, s.Parent)
	p = le.AppendUint32(p, s.Left)
	return le.AppendUint32(p, s.Right)
}

func splitOf(p []byte) Split {
	le := binary.LittleEndian
	return Split{MapVersion: le.Uint64(p[1:]), HashStart: le.Uint64(p[9:]), HashEnd: le.Uint64(p[17:]), At: le.Uint64(p[25:]),
		Parent: le.Uint32(p[33:]), Left: le.Uint32(p[37:]), Right: le.Uint32(p[41:])}
}

// validSplitPayload reports whether p is a split marker's payload of the
// current version holding a valid decision.
func validSplitPayload(p []byte) bool {
	return len(p) == splitPayloadBytes && p[0] == splitVersion && splitOf(p).Valid()
}

// EncodeSplit appends a split marker holding s to dst and returns the
// extended slice: a TypeSplit frame of one record whose key and headers
// are empty and whose value is s's payload. h gives the frame's fields
// (its Type, producer fields and OffsetSpan are ignored and set;
// BaseOffset, Epoch and AppendTimeUnixNanos are patched like any
// append's). It panics if s is not Valid (a caller's broken invariant).
func EncodeSplit(dst []byte, h Header, s Split) []byte {
	if !s.Valid() {
		panic(fmt.Sprintf("batch: encode of an invalid split %+v", s))
	}
	h.Type, h.ProducerID, h.BaseSequence, h.OffsetSpan, h.Flags = TypeSplit, 0, 0, 0, 0
	return Encode(dst, h, []Record{{Value: s.payload()}})
}

// DecodeSplit parses and verifies the split marker at the start of frame
// and returns its header and decision. A valid frame that is not a split
// marker returns ErrNotControl; anything else that is not a valid split
// marker returns ErrCorrupt or ErrShort, never a panic.
func DecodeSplit(frame []byte) (Header, Split, error) {
	h, recs, err := Decode(frame)
	if err != nil {
		return Header{}, Split{}, err
	}
	if h.Type != TypeSplit {
		return Header{}, Split{}, fmt.Errorf("%w: a %v frame is not a split marker", ErrNotControl, h.Type)
	}
	// Decode checked the record's shape and payload (validMarker).
	return h, splitOf(recs[0].Value), nil
}

// IsSplit reports, like IsFork, whether frame starts with a header of type
// TypeSplit.
func IsSplit(frame []byte) bool {
	return len(frame) >= HeaderSize && Type(frame[posType]) == TypeSplit
}
