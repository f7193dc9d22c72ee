package regionsvc

import (
	"errors"

	"github.com/geolog/geolog/batch"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/segment"
)

// The frame form of a read (ReadRequest.want_frames, and the same flag on
// Subscribe and Fetch; docs/api.md "The frame form"): the reply carries
// the records as the log stores them, the frames the segment store reads
// (CRC-checked, and opened when sealed at rest) back to back, instead of
// one message per record. The node decodes no record and encodes none: a
// frame wholly inside the read goes out as the bytes read. Only a frame
// the read cuts (at its first offset, at the servable end, at max_records)
// is re-framed, from its stored bytes, to hold just the records the
// records form would return (batch.AppendSlice); compaction markers and
// frames compaction emptied are left out. So a reader is given exactly
// the records the records form gives it, at the same offsets, and the
// same next offset.
//
// The bounds differ in one way: max_bytes counts the frames' bytes (the
// reply's size) rather than keys and values, and a read stops before the
// frame that would pass it (but for the first), instead of before a record.
// The quota charges those bytes.

// readLimits bounds one read and picks its form.
type readLimits struct {
	maxRecords, maxBytes int
	// frames asks for the frame form; a read by key answers records.
	frames bool
}

// readOut is what a read found, in one of the two forms.
type readOut struct {
	recs   []*geologv1.StoredRecord // the records form
	frames []byte                   // the frame form
	count  int                      // records held, in either form
}

// quotaBytes is what the read charges its principal's quota: the keys and
// values of the records form, the bytes of the frame form.
func (o readOut) quotaBytes() int64 {
	if o.frames != nil {
		return int64(len(o.frames))
	}
	return recordBytes(o.recs)
}

// readFrames is readRecords in the frame form: the same records (see the
// top of this file) and the same next offset, as frames.
func (d *rangeDriver) readFrames(from uint64, maxRecords, maxBytes int) (readOut, uint64, error) {
	end, err := d.readBounds(from)
	if err != nil {
		return readOut{}, from, err
	}
	fr := frameCollector{from: from, next: from, end: end, maxRecords: maxRecords, maxBytes: maxBytes}
	for scanned := 0; fr.next < end && fr.count == 0 && scanned < readScanBytesMax; {
		frames, err := d.store.ReadFrames(fr.next, maxBytes, end)
		if err != nil {
			return readOut{}, from, d.readError(fr.next, err)
		}
		if len(frames) == 0 {
			break
		}
		scanned += len(frames)
		full, err := fr.take(frames)
		if err != nil {
			return readOut{}, from, d.readError(from, err)
		}
		if full {
			break
		}
	}
	if fr.count == 0 && fr.split != nil {
		return readOut{}, from, fr.split.ended(d.cfg.stream, d.cfg.rangeID, from, d.store.StartOffset())
	}
	return readOut{frames: fr.out, count: fr.count}, fr.next, nil
}

// frameCollector collects the frames of a read in the frame form.
type frameCollector struct {
	from, next, end      uint64
	maxRecords, maxBytes int
	count                int
	out                  []byte
	// split is the range's end, if the read met its split marker.
	split *splitEnd
}

// take collects what a read wants of concatenated frames, as
// recordReader.frames does with records; full reports that a bound ended
// the read. The frames are kept in place (out aliases frames, which the
// store read made for the caller): only skipped and re-framed frames move
// the rest down. A read takes a second store read only when it kept
// nothing from the first.
func (fr *frameCollector) take(frames []byte) (full bool, err error) {
	fr.out = frames[:0]
	for len(frames) > 0 {
		if fr.count >= fr.maxRecords {
			return true, nil
		}
		n, err := batch.FrameSize(frames)
		if err != nil || n > len(frames) {
			return false, fr.corrupt(err)
		}
		h, err := batch.PeekHeader(frames)
		if err != nil {
			return false, fr.corrupt(err)
		}
		frame := frames[:n]
		frames = frames[n:]
		if h.Type == batch.TypeSplit {
			// The range's end: never past it (split_read.go).
			fr.split, err = splitEndOf(frame)
			if err != nil {
				return false, fr.corrupt(err)
			}
			return true, nil
		}
		if h.Type != batch.TypeData || h.RecordCount == 0 {
			// A compaction marker, or a frame compaction emptied.
			fr.next = max(fr.next, min(h.NextOffset(), fr.end))
			continue
		}
		if fr.count > 0 && len(fr.out)+n > fr.maxBytes {
			return true, nil
		}
		if full, err := fr.frame(h, frame); full || err != nil {
			return full, err
		}
	}
	return false, nil
}

// frame takes one data frame holding records: as it is when the read
// wants all of it, else re-framed to the records it wants.
func (fr *frameCollector) frame(h batch.Header, frame []byte) (full bool, err error) {
	if h.BaseOffset >= fr.from && h.NextOffset() <= fr.end && fr.count+int(h.RecordCount) <= fr.maxRecords {
		fr.keep(frame)
		fr.count += int(h.RecordCount)
		fr.next = max(fr.next, h.NextOffset())
		return false, nil
	}
	// The frame re-framed is built apart, then moved down into its place:
	// it is never longer than the stored frame, so it does not reach the
	// frames after it.
	piece, res, err := batch.AppendSlice(nil, frame, fr.from, fr.end, fr.maxRecords-fr.count)
	if err != nil {
		return false, fr.corrupt(err)
	}
	if len(piece) > len(frame) {
		fr.out = append(make([]byte, 0, len(fr.out)+len(piece)), fr.out...)
	}
	fr.out = append(fr.out, piece...)
	fr.count += res.Kept
	if res.Kept > 0 {
		fr.next = max(fr.next, res.Next)
	}
	if res.Cut {
		return true, nil
	}
	fr.next = max(fr.next, min(h.NextOffset(), fr.end))
	return false, nil
}

// keep appends frame to out: nothing to copy when it lies right there
// (no frame before it was left out), else a move down.
func (fr *frameCollector) keep(frame []byte) {
	l := len(fr.out)
	if cap(fr.out)-l >= len(frame) && len(frame) > 0 && &fr.out[l : l+1][0] == &frame[0] {
		fr.out = fr.out[:l+len(frame)]
		return
	}
	fr.out = append(fr.out, frame...)
}

// corrupt is the error of frames from the store that do not parse.
func (fr *frameCollector) corrupt(err error) error {
	return &segment.CorruptionError{Offset: fr.next, Err: errors.Join(segment.ErrCorrupt, err)}
}
