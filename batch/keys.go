package batch

import (
	"encoding/binary"
	"fmt"
)

// RecordKeys calls fn with the position i and the key of every record of
// the frame at the start of frame, in order, without allocating: record i
// has offset BaseOffset+i, and key aliases frame (nil when empty). It
// checks the structure of every record as Validate does and returns an
// error wrapping ErrCorrupt or ErrShort for a frame that fails (fn may have
// seen the records before the bad one), but it does not verify the CRC:
// the caller has run DecodeHeader or Validate on the frame already, as the
// segment store has for every frame it writes or recovers, and builds its
// key index this way. A control frame has no records: RecordKeys returns
// nil without calling fn. Whatever its input, RecordKeys never panics.
func RecordKeys(frame []byte, fn func(i int, key []byte)) error {
	body, count, err := recordsOf(frame)
	if err != nil {
		return err
	}
	if count == 0 && len(body) == 0 {
		return nil
	}
	p := 0
	for i := range int(count) {
		n, _, err := readRecord(body[p:], nil, nil)
		if err != nil {
			return err
		}
		fn(i, recordKey(body[p:p+n]))
		p += n
	}
	if p != len(body) {
		return errFrameTrail
	}
	return nil
}

// recordKey returns the key of the record b, which readRecord validated.
func recordKey(b []byte) []byte {
	_, m := readUvarint(b)
	_, t := readUvarint(b[m:])
	key, _, _ := readField(b, m+t)
	return key
}

// EachRecord calls fn with the position i and the encoding of every record
// of the data frame at the start of frame, in order, until fn returns
// false. It steps from record to record by their length prefixes alone,
// each bounded by the frame, so it costs a varint per record; DecodeRecord
// parses and checks the records wanted. Like RecordKeys it does not verify
// the CRC, and a control frame has no records. It returns an error
// wrapping ErrCorrupt or ErrShort for a length that runs past the frame or
// a count the frame cannot hold, and never panics.
func EachRecord(frame []byte, fn func(i int, rec []byte) bool) error {
	body, count, err := recordsOf(frame)
	if err != nil || count == 0 {
		return err
	}
	p := 0
	for i := range int(count) {
		bodyLen, m := readUvarint(body[p:])
		if m <= 0 {
			return errVarint
		}
		if bodyLen > uint64(len(body)-p-m) {
			return errRecordLength
		}
		n := m + int(bodyLen)
		if !fn(i, body[p:p+n:p+n]) {
			return nil
		}
		p += n
	}
	return nil
}

// DecodeRecord parses one record encoding (as EachRecord gives it), checked
// as Decode checks it: the length prefix must span rec exactly. Key, value
// and header values alias rec; header keys are copied.
func DecodeRecord(rec []byte) (Record, error) {
	n, headerCount, err := readRecord(rec, nil, nil)
	if err != nil {
		return Record{}, err
	}
	if n != len(rec) {
		return Record{}, errRecordTrail
	}
	var r Record
	var hdrs []RecordHeader
	if headerCount > 0 {
		hdrs = make([]RecordHeader, headerCount)
	}
	if _, _, err := readRecord(rec, &r, hdrs); err != nil {
		panic(fmt.Sprintf("batch: record failed the second pass after passing the first: %v", err))
	}
	return r, nil
}

// recordsOf returns the record bytes and count of the frame at the start
// of frame (none for a control frame), checking only lengths.
func recordsOf(frame []byte) ([]byte, uint32, error) {
	size, err := FrameSize(frame)
	if err != nil {
		return nil, 0, err
	}
	if len(frame) < HeaderSize {
		return nil, 0, errShortHeader
	}
	if len(frame) < size {
		return nil, 0, errShortFrame
	}
	count := binary.LittleEndian.Uint32(frame[posRecordCount:])
	if count == 0 && Type(frame[posType]) != TypeData {
		return nil, 0, nil
	}
	if uint64(count) > uint64(size-HeaderSize)/recordBytesMin {
		return nil, 0, errRecordCount
	}
	return frame[HeaderSize:size], count, nil
}
