package batch

import (
	"encoding/binary"
	"fmt"
)

// ForkPrevIndexBytes is the size of the prefix every fork frame's payload
// starts with: the Raft index of the frame before it (u64, little-endian).
// The rest of the payload belongs to whoever wrote the frame.
const ForkPrevIndexBytes = 8

// ForkPrevIndex returns the Raft index of the frame before the fork frame
// at the start of frame, as its payload names it: 0 when the fork frame
// follows its predecessor densely (its Index is the previous frame's + 1)
// or has none; otherwise the frames with indexes between the two were
// moved out of the log, and the fork frame is where the gap is described.
// frame must have passed DecodeHeader as a fork frame; anything else
// returns ErrNotControl or ErrCorrupt, never a panic.
func ForkPrevIndex(frame []byte) (uint64, error) {
	h, payload, err := DecodeControl(frame)
	if err != nil {
		return 0, err
	}
	if h.Type != TypeFork {
		return 0, fmt.Errorf("%w: a %v frame is not a fork frame", ErrNotControl, h.Type)
	}
	if len(payload) < ForkPrevIndexBytes {
		return 0, fmt.Errorf("%w: fork payload of %d bytes", ErrCorrupt, len(payload))
	}
	return binary.LittleEndian.Uint64(payload), nil
}

// IsFork reports whether frame starts with a header of type TypeFork,
// without verifying anything else: a cheap filter for hot paths, to be
// followed by DecodeHeader.
func IsFork(frame []byte) bool {
	return len(frame) >= HeaderSize && Type(frame[posType]) == TypeFork
}

// IsData reports, like IsFork, whether frame starts with a header of type
// TypeData.
func IsData(frame []byte) bool {
	return len(frame) >= HeaderSize && Type(frame[posType]) == TypeData
}
