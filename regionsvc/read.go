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

// readRecords returns committed records from offset from on, at most
// maxRecords of them and, past the first, at most maxBytes of keys and
// values. It runs on the caller's goroutine, concurrently with the driver.
func (d *rangeDriver) readRecords(from uint64, maxRecords, maxBytes int) ([]*geologv1.StoredRecord, uint64, error) {
	committed, err := d.readBounds(from)
	if err != nil {
		return nil, from, err
	}
	if from == committed {
		return nil, from, nil
	}
	frames, err := d.store.ReadFrames(from, maxBytes, committed)
	if err != nil {
		return nil, from, d.readError(from, err)
	}
	out := make([]*geologv1.StoredRecord, 0, 64)
	next := from
	bytes := 0
	for len(frames) > 0 && len(out) < maxRecords {
		n, err := batch.FrameSize(frames)
		if err != nil || n > len(frames) {
			return nil, from, d.readError(from, &segment.CorruptionError{Offset: next, Err: errors.Join(segment.ErrCorrupt, err)})
		}
		h, recs, err := batch.Decode(frames[:n])
		if err != nil {
			return nil, from, d.readError(from, &segment.CorruptionError{Offset: next, Err: errors.Join(segment.ErrCorrupt, err)})
		}
		frames = frames[n:]
		for i := range recs {
			off := h.BaseOffset + uint64(i)
			if off < from {
				continue
			}
			if off >= committed || len(out) >= maxRecords {
				break
			}
			r := &recs[i]
			size := len(r.Key) + len(r.Value)
			if len(out) > 0 && bytes+size > maxBytes {
				return out, next, nil
			}
			bytes += size
			out = append(out, storedRecord(off, h, r))
			next = off + 1
		}
	}
	return out, next, nil
}

// readBounds returns the committed offset that bounds a read from offset
// from, or the typed error of a range that does not serve or of an offset
// outside [start, committed].
func (d *rangeDriver) readBounds(from uint64) (uint64, error) {
	if f := d.failure.Load(); f != nil {
		return 0, f
	}
	committed := d.committed.Load()
	start := d.store.StartOffset()
	if from < start || from > committed {
		return 0, outOfRange(from, start, committed)
	}
	return committed, nil
}

// storedRecord is the API form of record r at offset off of the batch
// with header h; it aliases r's bytes.
func storedRecord(off uint64, h batch.Header, r *batch.Record) *geologv1.StoredRecord {
	sr := &geologv1.StoredRecord{
		Offset:                off,
		Key:                   r.Key,
		Value:                 r.Value,
		ProducerTimeUnixNanos: r.ProducerTimeUnixNanos,
		AppendTimeUnixNanos:   h.AppendTimeUnixNanos,
		Epoch:                 h.Epoch,
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
		return outOfRange(from, d.store.StartOffset(), d.committed.Load())
	case errors.Is(err, segment.ErrCorrupt):
		e := apierr.New(apierr.Corruption, "stream %s range %d is not served: %v", d.cfg.stream, d.cfg.rangeID, err)
		if d.failure.CompareAndSwap(nil, e) {
			d.logger.Error("corruption found on read; range no longer served", "offset", from, "error", err)
			d.notify()
		}
		return e
	case errors.Is(err, segment.ErrClosed):
		return apierr.New(apierr.ShuttingDown, "range is closing")
	default:
		return apierr.New(apierr.Internal, "read: %v", err)
	}
}

// offsetForTime returns the first committed offset appended at or after t.
func (d *rangeDriver) offsetForTime(tUnixNanos int64) (uint64, error) {
	if f := d.failure.Load(); f != nil {
		return 0, f
	}
	off, err := d.store.OffsetForTime(tUnixNanos)
	if err != nil {
		return 0, d.readError(0, err)
	}
	if c := d.committed.Load(); off > c {
		off = c
	}
	return off, nil
}
