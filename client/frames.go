package client

import (
	"errors"
	"fmt"
	"time"

	logbatch "github.com/geolog/geolog/batch"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// The frame form of reads (docs/api.md "The frame form"): the client asks
// for it (want_frames on Read, Subscribe and Fetch; ReadRecordsForm turns
// that off) and a node that knows it answers the records as its log
// stores them, record-batch frames back to back, which the client checks
// (each frame's CRC32C and structure, batch.Decode) and decodes here. A
// node that predates the form ignores the flag and answers records, which
// the client takes as before: every reply is read in the form it holds.

// ErrCorruptFrames is the error of a reply whose frames do not decode (a
// bad CRC, a malformed or truncated frame, a frame that is not a data
// frame) or hold records the read did not ask for (below its offset, at or
// past the reply's next offset, out of order): the reply is refused whole.
// The error wraps batch.ErrCorrupt or batch.ErrShort where one of those is
// the cause. It is not retriable: a node's reads are checked against the
// frames' CRCs before they are sent, so a bad frame means a broken node or
// path.
var ErrCorruptFrames = errors.New("client: corrupt frames in a read reply")

// replyRecords returns the records of a read reply of range rng in the
// form it holds: recs (the records form) or frames, whose records must lie
// in [from, next) in increasing offset order (from: the read's offset,
// next: the reply's next offset).
func replyRecords(rng uint32, recs []*geologv1.StoredRecord, frames []byte, from, next uint64) ([]StoredRecord, error) {
	if len(frames) == 0 {
		out := make([]StoredRecord, len(recs))
		for i, r := range recs {
			out[i] = storedFromProto(rng, r)
		}
		return out, nil
	}
	if len(recs) > 0 {
		return nil, fmt.Errorf("%w: the reply holds both records and frames", ErrCorruptFrames)
	}
	return decodeFrames(rng, frames, from, next)
}

// decodeFrames decodes the frames of a reply (see replyRecords). Keys,
// values and header values alias frames. The result takes one allocation
// (its size from the frames' headers), and the records' headers one per
// frame that has some.
func decodeFrames(rng uint32, frames []byte, from, next uint64) ([]StoredRecord, error) {
	count, err := framesRecordCount(frames)
	if err != nil {
		return nil, err
	}
	out := make([]StoredRecord, 0, count)
	var scratch []logbatch.Record
	floor := from
	for pos := 0; pos < len(frames); {
		n, _ := logbatch.FrameSize(frames[pos:]) // framesRecordCount checked it
		h, recs, err := logbatch.DecodeAppend(scratch[:0], frames[pos:pos+n])
		switch {
		case err != nil:
			return nil, fmt.Errorf("%w: at byte %d: %w", ErrCorruptFrames, pos, err)
		case h.Type != logbatch.TypeData:
			return nil, fmt.Errorf("%w: at byte %d: a %v frame", ErrCorruptFrames, pos, h.Type)
		}
		scratch = recs
		hdrs := make([]Header, 0, headerCount(recs))
		for i := range recs {
			off := h.Offset(&recs[i])
			if off < floor || off >= next {
				return nil, fmt.Errorf("%w: a record at offset %d, outside [%d, %d)", ErrCorruptFrames, off, floor, next)
			}
			floor = off + 1
			var rec StoredRecord
			rec, hdrs = storedFromFrame(rng, h, off, &recs[i], hdrs)
			out = append(out, rec)
		}
		pos += n
	}
	return out, nil
}

// framesRecordCount returns the records the frames' headers announce,
// checking that the frames' lengths tile the reply (their records are
// checked as they are decoded). The count is bounded by the reply's
// bytes: a header announcing more records than its frame can hold is
// corrupt.
func framesRecordCount(frames []byte) (int, error) {
	count := 0
	for pos := 0; pos < len(frames); {
		h, err := logbatch.PeekHeader(frames[pos:])
		if err != nil {
			return 0, fmt.Errorf("%w: at byte %d: %w", ErrCorruptFrames, pos, err)
		}
		n, _ := logbatch.FrameSize(frames[pos:])
		count += int(h.RecordCount)
		pos += n
	}
	return count, nil
}

// headerCount is the number of headers of recs.
func headerCount(recs []logbatch.Record) int {
	n := 0
	for i := range recs {
		n += len(recs[i].Headers)
	}
	return n
}

// storedFromFrame is the record r at offset off of a frame with header h;
// its headers are appended to hdrs (which has room for them), and hdrs
// is returned past them.
func storedFromFrame(rng uint32, h logbatch.Header, off uint64, r *logbatch.Record, hdrs []Header) (StoredRecord, []Header) {
	s := StoredRecord{
		Range:     rng,
		Offset:    off,
		Key:       r.Key,
		Value:     r.Value,
		Epoch:     h.Epoch,
		Tombstone: r.Tombstone,
	}
	if r.ProducerTimeUnixNanos != 0 {
		s.ProducerTime = time.Unix(0, r.ProducerTimeUnixNanos)
	}
	if h.AppendTimeUnixNanos != 0 {
		s.AppendTime = time.Unix(0, h.AppendTimeUnixNanos)
	}
	if len(r.Headers) > 0 {
		start := len(hdrs)
		for _, hd := range r.Headers {
			hdrs = append(hdrs, Header{Key: hd.Key, Value: hd.Value})
		}
		s.Headers = hdrs[start:len(hdrs):len(hdrs)]
	}
	return s, hdrs
}
