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
// values, below servableEnd (the committed end, or a timeline fence). An
// offset past that end gets OFFSET_PAST_LOCAL_TAIL (the callers decide
// whether to wait, ask the home, or answer it). It runs on the caller's
// goroutine, concurrently with the driver.
func (d *rangeDriver) readRecords(from uint64, maxRecords, maxBytes int) ([]*geologv1.StoredRecord, uint64, error) {
	if f := d.failure.Load(); f != nil {
		return nil, from, f
	}
	end := d.servableEnd()
	start := d.store.StartOffset()
	switch {
	case from < start:
		return nil, from, outOfRange(from, start, end)
	case from > end:
		return nil, from, d.pastTail(from, end)
	case from == end:
		return nil, from, nil
	}
	frames, err := d.store.ReadFrames(from, maxBytes, end)
	if err != nil {
		return nil, from, d.readError(from, err)
	}
	return d.decodeRecords(frames, from, end, maxRecords, maxBytes)
}

// decodeRecords turns frames read from offset from into records below end.
func (d *rangeDriver) decodeRecords(frames []byte, from, end uint64, maxRecords, maxBytes int) ([]*geologv1.StoredRecord, uint64, error) {
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
			if off >= end || len(out) >= maxRecords {
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

// storedRecord is record r of the frame with header h, at offset off.
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
		return outOfRange(from, d.store.StartOffset(), d.servableEnd())
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
	if c := d.servableEnd(); off > c {
		off = c
	}
	return off, nil
}
