package batch

import (
	"encoding/binary"
	"fmt"
)

// MarkPayloadBytes is the payload of a commit mark frame (TypeMark): the
// committed Raft index (u64) and markMagic (u32), little-endian. The
// frame's CRC covers both; the magic makes a mark that is not one (a
// payload of the right length from a future format) fail loudly.
const MarkPayloadBytes = 12

const markMagic = 0x4b4d4347 // "GCMK"

// EncodeMark appends to dst a commit mark frame saying that the log it is
// appended to is committed up to Raft index index. baseOffset is the log's
// next offset (the frame takes none) and appendTimeUnixNanos its newest
// append time (a frame must not move time backwards).
func EncodeMark(dst []byte, index, baseOffset uint64, appendTimeUnixNanos int64) []byte {
	var p [MarkPayloadBytes]byte
	binary.LittleEndian.PutUint64(p[:], index)
	binary.LittleEndian.PutUint32(p[8:], markMagic)
	return EncodeControl(dst, Header{Type: TypeMark, BaseOffset: baseOffset, AppendTimeUnixNanos: appendTimeUnixNanos}, p[:])
}

// DecodeMark verifies the commit mark frame at the start of frame and
// returns the index it names. Anything else (another type, a payload of
// another length or magic, a bad CRC) returns an error wrapping ErrCorrupt,
// ErrShort or ErrNotControl, never a panic.
func DecodeMark(frame []byte) (uint64, error) {
	h, payload, err := DecodeControl(frame)
	if err != nil {
		return 0, err
	}
	if h.Type != TypeMark {
		return 0, fmt.Errorf("%w: a %v frame is not a commit mark", ErrNotControl, h.Type)
	}
	if len(payload) != MarkPayloadBytes || binary.LittleEndian.Uint32(payload[8:]) != markMagic {
		return 0, fmt.Errorf("%w: commit mark payload of %d bytes", ErrCorrupt, len(payload))
	}
	return binary.LittleEndian.Uint64(payload), nil
}

// IsMark reports, like IsFork, whether frame starts with a header of type
// TypeMark.
func IsMark(frame []byte) bool {
	return len(frame) >= HeaderSize && Type(frame[posType]) == TypeMark
}
