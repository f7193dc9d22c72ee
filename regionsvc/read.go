package regionsvc

import (
	"errors"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/segment"
)

// Read bounds and defaults.
const (
	readRecordsDefault = 1000
	readRecordsMax     = 100_000
	readBytesDefault   = 1 << 20
	readBytesMax       = 32 << 20
)

func clampRead(maxRecords, maxBytes uint32) (int, int) {
	r, b := int(maxRecords), int(maxBytes)
	if r == 0 {
		r = readRecordsDefault
	}
	if r > readRecordsMax {
		r = readRecordsMax
	}
	if b == 0 {
		b = readBytesDefault
	}
	if b > readBytesMax {
		b = readBytesMax
	}
	return r, b
}

// outOfRange builds the typed error for an offset outside [start, tail].
func outOfRange(from, start, tail uint64) error {
	e := apierr.New(apierr.OffsetOutOfRange, "offset %d is outside [%d, %d]", from, start, tail)
	e.StartOffset, e.TailOffset = start, tail
	return e
}

// readScanBytesMax bounds the bytes of frames one read walks without
// finding a record: a compacted part of a log may hold many empty batch
// headers (see package compact). Past it the read returns what it has, its
// next offset past what it walked.
const readScanBytesMax = 8 << 20

// pastTail builds the retriable OFFSET_PAST_LOCAL_TAIL for a read at from
// past end, what this node serves now (servableEnd), saying why.
func (d *rangeDriver) pastTail(from, end uint64) *apierr.Error {
	var e *apierr.Error
	switch f := d.fenceNow(); {
	case f.known() && from > f.offset:
		e = apierr.New(apierr.PastLocalTail, "stream %s range %d: offset %d: this node's copy holds from offset %d records of epoch %d or older, which the range's epoch %d replaced (a divergent tail, moved to the orphan log when the new home's next batch arrives); a reader that read them must read again from offset %d",
			d.cfg.stream, d.cfg.rangeID, from, f.offset, f.logEpoch, f.epoch, f.offset)
	case f != nil:
		e = apierr.New(apierr.PastLocalTail, "stream %s range %d: offset %d: this node serves only below offset %d until it learns where the range's current homing epoch starts; retry",
			d.cfg.stream, d.cfg.rangeID, from, end)
	default:
		e = apierr.New(apierr.PastLocalTail, "stream %s range %d: offset %d is past this node's committed tail %d, which the range may hold (this copy lags, or restarted and catches up): retry later or at another node",
			d.cfg.stream, d.cfg.rangeID, from, end)
	}
	e.StartOffset, e.TailOffset = d.store.StartOffset(), end
	return e
}

// readRecords returns committed records from offset from on, at most
// maxRecords of them and, past the first, at most maxBytes of keys and
// values, below readBounds' end, and the offset to read next. Offsets may
// have holes (compaction by key, compaction markers): the next offset then
// jumps over them, also when no record is returned. It runs on the
// caller's goroutine, concurrently with the driver.
func (d *rangeDriver) readRecords(from uint64, maxRecords, maxBytes int) ([]*geologv1.StoredRecord, uint64, error) {
	end, err := d.readBounds(from)
	if err != nil {
		return nil, from, err
	}
	rd := recordReader{from: from, next: from, end: end, maxRecords: maxRecords, maxBytes: maxBytes,
		out: make([]*geologv1.StoredRecord, 0, 64)}
	for scanned := 0; rd.next < end && len(rd.out) == 0 && scanned < readScanBytesMax; {
		frames, err := d.store.ReadFrames(rd.next, maxBytes, end)
		if err != nil {
			return nil, from, d.readError(rd.next, err)
		}
		if len(frames) == 0 {
			break
		}
		scanned += len(frames)
		full, err := rd.frames(frames)
		if err != nil {
			return nil, from, d.readError(from, err)
		}
		if full {
			break
		}
	}
	if len(rd.out) == 0 && rd.split != nil {
		return nil, from, rd.split.ended(d.cfg.stream, d.cfg.rangeID, from, d.store.StartOffset())
	}
	return rd.out, rd.next, nil
}

// recordReader collects the records of a read (readRecords).
type recordReader struct {
	from, next, end      uint64
	maxRecords, maxBytes int
	bytes                int
	out                  []*geologv1.StoredRecord
	// split is the range's end, if the read met its split marker.
	split *splitEnd
}

// frames takes the records of concatenated frames; full reports that the
// read is complete (a bound reached).
func (rd *recordReader) frames(frames []byte) (full bool, err error) {
	for len(frames) > 0 {
		if len(rd.out) >= rd.maxRecords {
			return true, nil
		}
		n, err := batch.FrameSize(frames)
		if err != nil || n > len(frames) {
			return false, &segment.CorruptionError{Offset: rd.next, Err: errors.Join(segment.ErrCorrupt, err)}
		}
		h, recs, err := batch.Decode(frames[:n])
		if err != nil {
			return false, &segment.CorruptionError{Offset: rd.next, Err: errors.Join(segment.ErrCorrupt, err)}
		}
		if h.Type == batch.TypeSplit {
			// The range's end: never past it (split_read.go).
			rd.split, err = splitEndOf(frames[:n])
			return true, err
		}
		frames = frames[n:]
		if h.Type == batch.TypeData {
			for i := range recs {
				off := h.Offset(&recs[i])
				if off < rd.from {
					continue
				}
				if off >= rd.end || len(rd.out) >= rd.maxRecords {
					return true, nil
				}
				size := len(recs[i].Key) + len(recs[i].Value)
				if len(rd.out) > 0 && rd.bytes+size > rd.maxBytes {
					return true, nil
				}
				rd.bytes += size
				rd.out = append(rd.out, storedRecord(h, off, &recs[i]))
				rd.next = off + 1
			}
		}
		// The frame is done: past its holes (and a marker's offset).
		rd.next = max(rd.next, min(h.NextOffset(), rd.end))
	}
	return false, nil
}

// readBounds returns the offset that bounds a read from offset from, what
// this node serves now (servableEnd: the committed end, or a timeline
// fence), or the typed error of a range that does not serve, of an offset
// below the start (OFFSET_OUT_OF_RANGE) or past that end (the retriable
// OFFSET_PAST_LOCAL_TAIL: the callers decide whether to wait, ask the
// home, or answer it).
func (d *rangeDriver) readBounds(from uint64) (uint64, error) {
	if f := d.readFailure(); f != nil {
		return 0, f
	}
	end := d.servableEnd()
	start := d.store.StartOffset()
	switch {
	case from < start:
		return 0, outOfRange(from, start, end)
	case from > end:
		if s := d.splitEnd.Load(); s != nil && from >= s.offset {
			return 0, s.ended(d.cfg.stream, d.cfg.rangeID, from, start)
		}
		return 0, d.pastTail(from, end)
	}
	return d.boundBySplit(from, end)
}

// readFailure returns the failure that stops reads of the range, or nil.
// A range stopped by a failed write or fsync (EIO), or by its replica,
// still serves its committed prefix: that was durable before the failure
// (fsynced, and under Raft on a quorum and under the commit mark), the
// store stays open until the node stops, and every frame read is checked
// against its CRC, so a read that meets bad bytes stops the range as
// corruption. Only corruption, a store that never opened and a closing
// range refuse reads. (A full disk is no failure at all: see
// segment.ErrNoSpace.)
func (d *rangeDriver) readFailure() *apierr.Error {
	f := d.failure.Load()
	if f == nil || d.store == nil || f.Code == apierr.Corruption || f.Code == apierr.ShuttingDown {
		return f
	}
	return nil
}

// storedRecord is the API form of record r at offset off of frame h.
func storedRecord(h batch.Header, off uint64, r *batch.Record) *geologv1.StoredRecord {
	sr := &geologv1.StoredRecord{
		Offset:                off,
		Key:                   r.Key,
		Value:                 r.Value,
		ProducerTimeUnixNanos: r.ProducerTimeUnixNanos,
		AppendTimeUnixNanos:   h.AppendTimeUnixNanos,
		Epoch:                 h.Epoch,
		Tombstone:             r.Tombstone,
	}
	if len(r.Headers) > 0 {
		sr.Headers = make([]*geologv1.Header, len(r.Headers))
		for j, hd := range r.Headers {
			sr.Headers[j] = &geologv1.Header{Key: hd.Key, Value: hd.Value}
		}
	}
	return sr
}

// readError classifies a store read error. Corruption stops the range.
func (d *rangeDriver) readError(from uint64, err error) error {
	switch {
	case errors.Is(err, segment.ErrOutOfRange):
		// Retention moved the start past from since we checked.
		return outOfRange(from, d.store.StartOffset(), d.servableEnd())
	case errors.Is(err, segment.ErrCorrupt):
		e := apierr.Wrap(apierr.Corruption, err, "stream %s range %d is not served", d.cfg.stream, d.cfg.rangeID)
		if d.failure.CompareAndSwap(nil, e) {
			d.logger.Error("corruption found on read; range no longer served", "offset", from, "error", err)
			d.notify()
		}
		return e
	case errors.Is(err, segment.ErrClosed):
		return apierr.New(apierr.ShuttingDown, "range is closing")
	default:
		return apierr.Wrap(apierr.Internal, err, "read")
	}
}

// offsetForTime returns the first committed offset appended at or after t.
func (d *rangeDriver) offsetForTime(tUnixNanos int64) (uint64, error) {
	if f := d.readFailure(); f != nil {
		return 0, f
	}
	off, err := d.store.OffsetForTime(tUnixNanos)
	if err != nil {
		return 0, d.readError(0, err)
	}
	if c := d.servableEnd(); off > c {
		off = c
	}
	return off, nil
}
