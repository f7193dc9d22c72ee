package atrest

import (
	"crypto/cipher"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/geolog/geolog/batch"
)

// The sealed unit, format 1 (little-endian), as it lies in a log file in
// place of one frame (see the package documentation):
//
//	off   size  field
//	0     4     Length   u32: bytes after this field (unit size - 4), as a frame's
//	4     4     KeyID    u32: the data key that sealed it, never 0
//	8     1     Kind     u8 = 0xA1 (a plain frame holds its version, 1, here)
//	9     3     reserved 0
//	12    12    Nonce    the key's nonce session (8 bytes) and counter (4)
//	24    n     the frame, encrypted with AES-256-GCM
//	24+n  16    the GCM tag
//
// The associated data is bytes [0, 12): length, key id and kind.
const (
	// HeaderBytes is the size of a sealed unit's clear header.
	HeaderBytes = 24
	// TagBytes is the size of the GCM tag that ends a sealed unit.
	TagBytes = 16
	// Overhead is what sealing adds to a frame: a sealed unit of a frame of
	// n bytes takes n + Overhead bytes.
	Overhead = HeaderBytes + TagBytes

	// KindSealed is byte 8 of a sealed unit. Byte 8 of a plain frame is
	// its version (batch's frame format 1), so the two never meet.
	KindSealed byte = 0xA1
	// kindPlain is byte 8 of a plain frame: batch's frame version.
	kindPlain byte = 1

	posKeyID  = 4
	posKind   = 8
	posNonce  = 12
	adBytes   = 12
	nonceSize = 12

	// UnitBytesMax is the largest unit: a sealed frame of
	// batch.FrameBytesMax bytes.
	UnitBytesMax = batch.FrameBytesMax + Overhead
	// unitBytesMin is the smallest unit: a plain frame's header.
	unitBytesMin = batch.HeaderSize
)

var (
	// ErrKeyUnavailable reports a sealed unit whose data key this node does
	// not hold: its keyring lacks the key id, or there is no keyring at
	// all. It is never taken for corruption or a torn write: the bytes may
	// be intact. Errors carrying it are *KeyError values.
	ErrKeyUnavailable = errors.New("atrest: sealed under a data key this node does not hold")
	// ErrAuth reports a sealed unit that fails authentication: a bit
	// changed, or the unit was cut short by a torn write. Errors carrying
	// it also carry batch.ErrCorrupt, so storage code judges them as it
	// judges a frame that fails its CRC.
	ErrAuth = errors.New("atrest: sealed frame fails authentication")
)

// The decoders' failures are static so that scanning garbage for a unit
// costs no allocation per position.
var (
	errShortLength = fmt.Errorf("%w: fewer than 4 bytes for a unit's length field", batch.ErrShort)
	errShortUnit   = fmt.Errorf("%w: fewer bytes than the unit's length field announces", batch.ErrShort)
	errUnitSmall   = fmt.Errorf("%w: unit length smaller than a frame header", batch.ErrCorrupt)
	errUnitLarge   = fmt.Errorf("%w: unit length larger than the largest sealed frame", batch.ErrCorrupt)
	errKind        = fmt.Errorf("%w: unknown unit kind", batch.ErrCorrupt)
	errReserved    = fmt.Errorf("%w: sealed unit's reserved bytes are not zero", batch.ErrCorrupt)
	errKeyZero     = fmt.Errorf("%w: sealed unit names key 0", batch.ErrCorrupt)
	errSealedSmall = fmt.Errorf("%w: sealed unit too small to hold a frame", batch.ErrCorrupt)
	errLengthUnit  = fmt.Errorf("%w: unit length does not match the bytes given", batch.ErrCorrupt)
	errAuth        = fmt.Errorf("%w: %w", batch.ErrCorrupt, ErrAuth)
)

// KeyError names the data key a sealed unit needs and this node lacks.
// errors.Is(err, ErrKeyUnavailable) holds for it.
type KeyError struct {
	ID KeyID
	// NoKeyring says that the node has no keyring at all (at-rest
	// encryption is off), rather than one that lacks the key.
	NoKeyring bool
}

func (e *KeyError) Error() string {
	if e.NoKeyring {
		return fmt.Sprintf("atrest: frame sealed under data key %v, but encryption at rest is not configured (no --kek-file)", e.ID)
	}
	return fmt.Sprintf("atrest: frame sealed under data key %v, which this node's keyring does not hold (wrong keyring for this data directory?)", e.ID)
}

// Is makes errors.Is(err, ErrKeyUnavailable) true.
func (e *KeyError) Is(target error) bool { return target == ErrKeyUnavailable }

// KeyID names a data key. 0 names none: a plain frame.
type KeyID uint32

// String is the id as 8 hex digits, as keyring files and tools show it.
func (id KeyID) String() string { return fmt.Sprintf("%08x", uint32(id)) }

// UnitSize returns the size of the unit (a plain frame or a sealed one)
// that b starts with, from its length field alone: b needs only 4 bytes.
// A length no unit can have is an error wrapping batch.ErrCorrupt; fewer
// than 4 bytes, batch.ErrShort.
func UnitSize(b []byte) (int, error) {
	if len(b) < 4 {
		return 0, errShortLength
	}
	n := int64(binary.LittleEndian.Uint32(b)) + 4
	switch {
	case n < unitBytesMin:
		return 0, errUnitSmall
	case n > UnitBytesMax:
		return 0, errUnitLarge
	}
	return int(n), nil
}

// Sealed reports whether the unit b starts with is a sealed one (by its
// kind byte; b needs 9 bytes). A unit that is neither sealed nor a plain
// frame fails Check.
func Sealed(b []byte) bool { return len(b) > posKind && b[posKind] == KindSealed }

// UnitKey returns the key id of the sealed unit b starts with, 0 for
// anything else.
func UnitKey(b []byte) KeyID {
	if !Sealed(b) {
		return 0
	}
	return KeyID(binary.LittleEndian.Uint32(b[posKeyID:]))
}

// CheckHeader checks what can be checked of the unit b starts with
// without a key: its length, and for a sealed unit its kind, reserved
// bytes and key id. b needs HeaderBytes bytes for a sealed unit (fewer is
// batch.ErrShort); a plain frame's header is batch's to check. It returns
// the unit's size and key id (0 for a plain frame).
func CheckHeader(b []byte) (int, KeyID, error) {
	size, err := UnitSize(b)
	if err != nil {
		return 0, 0, err
	}
	if len(b) <= posKind {
		return 0, 0, errShortUnit
	}
	switch b[posKind] {
	case kindPlain:
		return size, 0, nil
	case KindSealed:
	default:
		return 0, 0, errKind
	}
	if len(b) < HeaderBytes {
		return 0, 0, errShortUnit
	}
	if b[9] != 0 || b[10] != 0 || b[11] != 0 {
		return 0, 0, errReserved
	}
	id := KeyID(binary.LittleEndian.Uint32(b[posKeyID:]))
	if id == 0 {
		return 0, 0, errKeyZero
	}
	if size < batch.HeaderSize+Overhead {
		return 0, 0, errSealedSmall
	}
	return size, id, nil
}

// FrameBytes returns how many bytes of frame a unit of size bytes holds.
func FrameBytes(size int, sealed bool) int {
	if sealed {
		return size - Overhead
	}
	return size
}

// seal appends to dst the sealed unit of frame under key id with aead and
// nonce.
func seal(dst []byte, id KeyID, aead cipher.AEAD, nonce [nonceSize]byte, frame []byte) []byte {
	var hdr [HeaderBytes]byte
	binary.LittleEndian.PutUint32(hdr[0:], uint32(len(frame)+Overhead-4))
	binary.LittleEndian.PutUint32(hdr[posKeyID:], uint32(id))
	hdr[posKind] = KindSealed
	copy(hdr[posNonce:], nonce[:])
	dst = append(dst, hdr[:]...)
	return aead.Seal(dst, nonce[:], frame, hdr[:adBytes])
}

// openInPlace decrypts the sealed unit (whole, header checked) with aead
// into its own bytes and returns the frame, which aliases unit[HeaderBytes:].
// On failure the unit's encrypted bytes are lost (GCM clears its output).
func openInPlace(aead cipher.AEAD, unit []byte) ([]byte, error) {
	var ad [adBytes]byte
	copy(ad[:], unit[:adBytes])
	body := unit[HeaderBytes:]
	frame, err := aead.Open(body[:0], unit[posNonce:posNonce+nonceSize], body, ad[:])
	if err != nil {
		return nil, errAuth
	}
	return frame, nil
}
