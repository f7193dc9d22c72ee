package batch

import (
	"encoding/binary"
	"fmt"
)

// RecordKeys calls fn with the offset delta and the key of every record of
// the data frame at the start of frame, in order, without allocating: the
// record's offset is the frame's BaseOffset plus delta (Header.Offset);
// delta is the record's position in a frame as appended and the delta it
// carries in a frame compaction rewrote. key aliases frame (nil when
// empty). It checks the structure of every record as Validate does and
// returns an error wrapping ErrCorrupt or ErrShort for a frame that fails
// (fn may have seen the records before the bad one), but it does not
// verify the CRC: the caller has run DecodeHeader or Validate on the frame
// already, as the segment store has for every frame it writes or
// recovers, and builds its key index this way. Only data frames have
// records readers see: for any other frame (control, fork, compaction
// marker) RecordKeys returns nil without calling fn. Whatever its input,
// RecordKeys never panics.
func RecordKeys(frame []byte, fn func(delta uint32, key []byte)) error {
	body, count, f, err := recordsOf(frame)
	if err != nil {
		return err
	}
	p := 0
	for range count {
		n, _, err := readRecord(body[p:], &f, nil, nil)
		if err != nil {
			return err
		}
		fn(uint32(f.next-1), f.recordKey(body[p:p+n]))
		p += n
	}
	if p != len(body) {
		return errFrameTrail
	}
	if f.attributes && f.tombstones == 0 {
		return errNoTombstone
	}
	return nil
}

// recordKey returns the key of the record b, laid out as f says, which
// readRecord validated.
func (f *recordFormat) recordKey(b []byte) []byte {
	_, p := readUvarint(b)
	if f.compacted {
		_, m := readUvarint(b[p:])
		p += m
	}
	if f.attributes {
		p++
	}
	_, t := readUvarint(b[p:])
	key, _, _ := readField(b, p+t)
	return key
}

// RawRecord is one record of a frame as EachRecord gives it: its offset
// delta and its encoding, parsed by Decode only when wanted.
type RawRecord struct {
	// Delta is the record's offset minus its frame's BaseOffset.
	Delta uint32
	b     []byte
	f     recordFormat
}

// Decode parses the record, checked as Decode checks a frame's records.
// Key, value and header values alias the frame; header keys are copied.
func (r RawRecord) Decode() (Record, error) {
	f := r.f
	f.next = uint64(r.Delta)
	n, headerCount, err := readRecord(r.b, &f, nil, nil)
	if err != nil {
		return Record{}, err
	}
	if n != len(r.b) {
		return Record{}, errRecordTrail
	}
	var rec Record
	var hdrs []RecordHeader
	if headerCount > 0 {
		hdrs = make([]RecordHeader, headerCount)
	}
	f.next = uint64(r.Delta)
	if _, _, err := readRecord(r.b, &f, &rec, hdrs); err != nil {
		panic(fmt.Sprintf("batch: record failed the second pass after passing the first: %v", err))
	}
	return rec, nil
}

// EachRecord calls fn with every record of the data frame at the start of
// frame, in order, until fn returns false. It steps from record to record
// by their length prefixes (and, in a compacted frame, reads each offset
// delta, checking that they increase within the span), each bounded by
// the frame, so it costs a varint or two per record; RawRecord.Decode
// parses and checks the records wanted. Like RecordKeys it does not
// verify the CRC, and only data frames have records. It returns an error
// wrapping ErrCorrupt or ErrShort for a length that runs past the frame, a
// count the frame cannot hold or a bad delta, and never panics.
func EachRecord(frame []byte, fn func(r RawRecord) bool) error {
	body, count, f, err := recordsOf(frame)
	if err != nil || count == 0 {
		return err
	}
	p := 0
	next := uint64(0)
	for range count {
		bodyLen, m := readUvarint(body[p:])
		if m <= 0 {
			return errVarint
		}
		if bodyLen > uint64(len(body)-p-m) {
			return errRecordLength
		}
		n := m + int(bodyLen)
		d := next
		if f.compacted {
			var k int
			if d, k = readUvarint(body[p+m : p+n]); k <= 0 {
				return errVarint
			}
			if d < next || d >= uint64(f.span) {
				return errDelta
			}
		}
		next = d + 1
		if !fn(RawRecord{Delta: uint32(d), b: body[p : p+n : p+n], f: f}) {
			return nil
		}
		p += n
	}
	return nil
}

// recordsOf returns the record bytes, count and format of the data frame
// at the start of frame (no records for any other frame), checking only
// lengths and the flags.
func recordsOf(frame []byte) ([]byte, uint32, recordFormat, error) {
	size, err := FrameSize(frame)
	if err != nil {
		return nil, 0, recordFormat{}, err
	}
	if len(frame) < HeaderSize {
		return nil, 0, recordFormat{}, errShortHeader
	}
	if len(frame) < size {
		return nil, 0, recordFormat{}, errShortFrame
	}
	if Type(frame[posType]) != TypeData {
		return nil, 0, recordFormat{}, nil
	}
	le := binary.LittleEndian
	count := le.Uint32(frame[posRecordCount:])
	if uint64(count) > uint64(size-HeaderSize)/recordBytesMin {
		return nil, 0, recordFormat{}, errRecordCount
	}
	flags := le.Uint16(frame[posFlags:])
	if flags&^flagsKnown != 0 {
		return nil, 0, recordFormat{}, errFlags
	}
	f := recordFormat{compacted: flags&FlagCompacted != 0, attributes: flags&FlagTombstones != 0}
	if f.compacted {
		if f.span = le.Uint32(frame[posReserved:]); f.span == 0 || f.span < count {
			return nil, 0, recordFormat{}, errSpan
		}
	}
	return frame[HeaderSize:size], count, f, nil
}
