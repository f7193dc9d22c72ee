package batch

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
)

// A reader's frame form (the frames of a read sent as they are stored)
// needs, at the edges of a read, a frame holding only some of a stored
// frame's records: those at or past the read's first offset, below its end
// (the committed tail, a fence), and no more than the read may return.
// AppendSlice builds it from the stored bytes: the records kept are a
// contiguous run of the frame, so their bytes are copied as they are and
// only the header changes.

// SliceResult says what AppendSlice kept of a frame.
type SliceResult struct {
	// Kept is the number of records kept.
	Kept int
	// Next is the offset after the last record kept (0 when none was).
	Next uint64
	// Cut reports that a record of the frame at or past hi, or one past
	// maxRecords, was left out (a record below lo is not a cut).
	Cut bool
}

// AppendSlice appends to dst a frame holding the records of the data frame
// at the start of frame whose offsets are in [lo, hi), at most maxRecords
// of them (the first ones), and returns the extended slice. The frame must
// have been verified (Decode, Validate or a segment read); its records are
// walked again, so a malformed one is still an ErrCorrupt, and on an error
// dst is returned unchanged. Keeping every record appends frame's bytes as
// they are; keeping none appends nothing. Otherwise the new frame is the
// stored one with its header rewritten: a frame that is not compacted gets
// BaseOffset (and, with a producer, BaseSequence) of its first record
// kept, a compacted one keeps BaseOffset and OffsetSpan (its records carry
// their offsets); RecordCount and the CRC are set for the records kept.
// Only when the records kept hold no tombstone of a frame that has some
// are they decoded and encoded again (the flag and the attribute bytes
// must go). Header fields the reader does not use (Term, Index, HLC,
// ProducerID) are left as stored.
func AppendSlice(dst, frame []byte, lo, hi uint64, maxRecords int) ([]byte, SliceResult, error) {
	h, err := PeekHeader(frame)
	if err != nil {
		return dst, SliceResult{}, err
	}
	if h.Type != TypeData {
		return dst, SliceResult{}, ErrNotData
	}
	size := int(binary.LittleEndian.Uint32(frame[posLength:])) + 4
	run, err := findRun(frame[HeaderSize:size], h, lo, hi, maxRecords)
	if err != nil {
		return dst, SliceResult{}, err
	}
	res := SliceResult{Kept: run.count, Cut: run.cut}
	switch {
	case run.count == 0:
		return dst, res, nil
	case run.count == int(h.RecordCount):
		res.Next = h.BaseOffset + uint64(run.lastDelta) + 1
		return append(dst, frame[:size]...), res, nil
	}
	res.Next = h.BaseOffset + uint64(run.lastDelta) + 1
	if h.Flags&FlagTombstones != 0 && !run.tombstone {
		out, err := reencodeRun(dst, frame, h, run)
		if err != nil {
			return dst, SliceResult{}, err
		}
		return out, res, nil
	}
	start := len(dst)
	dst = append(dst, frame[:HeaderSize]...)
	dst = append(dst, frame[HeaderSize+run.start:HeaderSize+run.end]...)
	out := dst[start:]
	le := binary.LittleEndian
	le.PutUint32(out[posLength:], uint32(len(out)-4))
	le.PutUint32(out[posRecordCount:], uint32(run.count))
	if h.Flags&FlagCompacted == 0 {
		le.PutUint64(out[posBaseOffset:], h.BaseOffset+uint64(run.firstDelta))
		if h.ProducerID != 0 {
			le.PutUint64(out[posBaseSequence:], h.BaseSequence+uint64(run.firstDelta))
		}
	}
	le.PutUint32(out[posCRC:], crc32.Checksum(out[crcStart:], castagnoli))
	return dst, res, nil
}

// ErrNotData reports a frame given to AppendSlice that is not a data frame.
var ErrNotData = errors.New("batch: not a data frame")

// recordRun is the contiguous run of a frame's records that AppendSlice
// keeps: their byte range in the body, count, first and last offset
// deltas, and whether one of them is a tombstone.
type recordRun struct {
	start, end            int
	count                 int
	firstDelta, lastDelta uint32
	tombstone             bool
	cut                   bool
}

// findRun walks the records of body (of a frame with header h) and finds
// those with offsets in [lo, hi), at most maxRecords of them.
func findRun(body []byte, h Header, lo, hi uint64, maxRecords int) (recordRun, error) {
	var run recordRun
	p, f := 0, newRecordFormat(h)
	for range h.RecordCount {
		n, _, err := readRecord(body[p:], &f, nil, nil)
		if err != nil {
			return recordRun{}, err
		}
		delta := uint32(f.next - 1)
		off := h.BaseOffset + uint64(delta)
		switch {
		case off < lo:
			p += n
			continue
		case off >= hi || run.count >= maxRecords:
			run.cut = true
			return run, nil
		}
		if run.count == 0 {
			run.start, run.firstDelta = p, delta
		}
		run.count++
		run.lastDelta = delta
		run.tombstone = run.tombstone || f.tombstone
		p += n
		run.end = p
	}
	return run, nil
}

// reencodeRun appends the frame of run's records decoded and encoded
// again: for a run without a tombstone out of a frame with some, whose
// records must lose their attribute bytes. Decode checks the CRC, which
// the walk did not.
func reencodeRun(dst, frame []byte, h Header, run recordRun) ([]byte, error) {
	_, recs, err := Decode(frame)
	if err != nil {
		return dst, err
	}
	first := 0
	for recs[first].OffsetDelta != run.firstDelta {
		first++
	}
	recs = recs[first : first+run.count]
	if h.Flags&FlagCompacted == 0 {
		h.BaseOffset += uint64(run.firstDelta)
		if h.ProducerID != 0 {
			h.BaseSequence += uint64(run.firstDelta)
		}
	}
	return Encode(dst, h, recs), nil
}
