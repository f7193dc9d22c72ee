package batch

import (
	"encoding/binary"
	"fmt"
)

// Compaction is a compaction decision, the payload of a compaction marker
// (TypeCompact). A range's home leader appends one; every copy of the
// range (its replicas, and every region's mirror, which receive the marker
// like any frame) then holds, below Point, exactly the records that
// package compact's rule keeps: the newest record of each key of [0,
// Point), less tombstones appended before TombstoneCutoffUnixNanos. So
// what a copy holds below a point is a function of the log alone, the same
// everywhere whatever its segment boundaries.
type Compaction struct {
	// Point is the offset below which the decision compacts: a frame
	// boundary at or below the committed tail when it was decided.
	Point uint64
	// TombstoneCutoffUnixNanos removes the tombstones (the newest records
	// of their keys) below Point whose batch was appended before it.
	TombstoneCutoffUnixNanos int64
	// ProducerCutoffUnixNanos: compaction keeps the headers of the latest
	// batches below Point of every producer that appended at or after it,
	// so that idempotent retries are still recognised (see package
	// compact).
	ProducerCutoffUnixNanos int64
}

// compactionVersion is the version byte that starts a marker's payload.
const compactionVersion = 1

// compactionPayloadBytes is the size of a marker's payload: version, then
// Point (u64), TombstoneCutoffUnixNanos and ProducerCutoffUnixNanos (i64),
// little-endian.
const compactionPayloadBytes = 1 + 3*8

// EncodeCompaction appends a compaction marker holding c to dst and
// returns the extended slice: a TypeCompact frame of one record whose key
// and headers are empty and whose value is c's payload. h gives the
// frame's fields (its Type, producer fields and OffsetSpan are ignored and
// set; BaseOffset, Epoch and AppendTimeUnixNanos are patched like any
// append's).
func EncodeCompaction(dst []byte, h Header, c Compaction) []byte {
	h.Type, h.ProducerID, h.BaseSequence, h.OffsetSpan, h.Flags = TypeCompact, 0, 0, 0, 0
	p := make([]byte, 0, compactionPayloadBytes)
	p = append(p, compactionVersion)
	p = binary.LittleEndian.AppendUint64(p, c.Point)
	p = binary.LittleEndian.AppendUint64(p, uint64(c.TombstoneCutoffUnixNanos))
	p = binary.LittleEndian.AppendUint64(p, uint64(c.ProducerCutoffUnixNanos))
	return Encode(dst, h, []Record{{Value: p}})
}

// DecodeCompaction parses and verifies the compaction marker at the start
// of frame and returns its header and decision. A valid frame that is not
// a marker returns ErrNotControl.
func DecodeCompaction(frame []byte) (Header, Compaction, error) {
	h, recs, err := Decode(frame)
	if err != nil {
		return Header{}, Compaction{}, err
	}
	if h.Type != TypeCompact {
		return Header{}, Compaction{}, fmt.Errorf("%w: a %v frame is not a compaction marker", ErrNotControl, h.Type)
	}
	// Decode checked the record's shape (validMarker).
	return h, compactionOf(recs[0].Value), nil
}

func compactionOf(p []byte) Compaction {
	le := binary.LittleEndian
	return Compaction{Point: le.Uint64(p[1:]), TombstoneCutoffUnixNanos: int64(le.Uint64(p[9:])),
		ProducerCutoffUnixNanos: int64(le.Uint64(p[17:]))}
}

// validMarker reports whether body, the records of a marker frame of type
// t that walkRecords found to hold exactly one well-formed record without
// record headers, holds a marker record: no key, no producer time, not a
// tombstone, a payload of the current version (and, for a split, a valid
// decision).
func validMarker(t Type, body []byte) bool {
	var rec Record
	f := recordFormat{}
	if _, _, err := readRecord(body, &f, &rec, nil); err != nil {
		return false
	}
	if rec.Key != nil || rec.Headers != nil || rec.ProducerTimeUnixNanos != 0 || rec.Tombstone {
		return false
	}
	if t == TypeSplit {
		return validSplitPayload(rec.Value)
	}
	return len(rec.Value) == compactionPayloadBytes && rec.Value[0] == compactionVersion
}

// IsCompaction reports, like IsFork, whether frame starts with a header of
// type TypeCompact.
func IsCompaction(frame []byte) bool {
	return len(frame) >= HeaderSize && Type(frame[posType]) == TypeCompact
}
