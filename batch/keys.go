package batch

import "encoding/binary"

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
	size, err := FrameSize(frame)
	if err != nil {
		return err
	}
	if len(frame) < HeaderSize {
		return errShortHeader
	}
	if len(frame) < size {
		return errShortFrame
	}
	count := binary.LittleEndian.Uint32(frame[posRecordCount:])
	if count == 0 && Type(frame[posType]) != TypeData {
		return nil
	}
	if uint64(count) > uint64(size-HeaderSize)/recordBytesMin {
		return errRecordCount
	}
	body := frame[HeaderSize:size]
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
