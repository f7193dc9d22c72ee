package segment

import (
	"errors"
	"fmt"

	"github.com/geolog/geolog/atrest"
	"github.com/geolog/geolog/batch"
)

// Encryption at rest (package atrest) lives here and nowhere else in the
// store: every frame written to a log file goes through sealFrame, and
// every unit read back through openUnit. With Config.Keyring set, a log
// file holds sealed units (one per frame, see atrest's unit format) in
// place of frames; positions, sizes and index entries count the units'
// bytes, so the rest of the store is unchanged. A log may mix plain frames
// (written before encryption was on) and units sealed under several data
// keys; a rewrite (RewriteSegment, and so compaction and re-encryption)
// seals every frame it writes under the active key.
//
// What the errors mean (see also the package documentation's recovery
// rules): a unit that fails authentication carries batch.ErrCorrupt and is
// judged as a frame failing its CRC (a torn tail, or corruption); a unit
// under a key the keyring lacks, or with no keyring at all, is an
// atrest.ErrKeyUnavailable error, never corruption and never a torn tail,
// so Open refuses to start rather than truncate.

// sealBufBytesMax is the largest seal scratch buffer the appender keeps
// between appends.
const sealBufBytesMax = 1 << 20

// errSealedFrameSize marks an authenticated unit whose plaintext is not
// exactly one frame: only a bug (or a forger holding the key) makes one.
var errSealedFrameSize = fmt.Errorf("%w: sealed unit does not hold exactly one frame", batch.ErrCorrupt)

// sealFrame returns the bytes to write for frame: frame itself when at-rest
// encryption is off, else its sealed unit, built in *scratch (which the
// caller keeps for reuse and must not share between goroutines).
func sealFrame(k *atrest.Keyring, scratch *[]byte, frame []byte) []byte {
	if k == nil {
		return frame
	}
	*scratch = k.Seal((*scratch)[:0], frame)
	return *scratch
}

// unitBytes is the size on disk of a frame of n bytes.
func unitBytes(k *atrest.Keyring, n int) int {
	if k == nil {
		return n
	}
	return n + atrest.Overhead
}

// unitSize returns the size of the unit (plain frame or sealed) that b
// starts with, from its length field (b needs 4 bytes). Sealed units are
// recognised without a keyring so that a store without one reports them
// as a missing key, not as a frame too long.
func unitSize(b []byte) (int, error) { return atrest.UnitSize(b) }

// openUnit verifies the whole unit and returns its frame and header. A
// plain frame is returned as it is; a sealed one is decrypted in place (the
// frame aliases unit, whose bytes are overwritten, on failure too).
func openUnit(k *atrest.Keyring, unit []byte) ([]byte, batch.Header, error) {
	if !atrest.Sealed(unit) {
		h, err := batch.DecodeHeader(unit)
		return unit, h, err
	}
	frame, err := atrest.OpenInPlace(k, unit)
	if err != nil {
		return nil, batch.Header{}, err
	}
	h, err := batch.DecodeHeader(frame)
	if err == nil {
		if size, _ := batch.FrameSize(frame); size != len(frame) {
			err = errSealedFrameSize
		}
	}
	return frame, h, err
}

// isKeyError reports a unit this node cannot open for want of a key.
func isKeyError(err error) bool { return errors.Is(err, atrest.ErrKeyUnavailable) }

// ErrNoKeyring reports Reseal on a store without a keyring.
var ErrNoKeyring = errors.New("segment: encryption at rest is off (no keyring)")

// Reseal rewrites the sealed segment at base with the same frames, each
// sealed under the keyring's active data key: re-encryption after a data
// key rotation, so that older keys can be retired. It is RewriteSegment
// with a rewrite that keeps every frame, and so crash-safe and bounded by
// throttle in the same way (see rewrite.go), and a segment that changed
// meanwhile returns ErrRewriteAbandoned.
func (s *Store) Reseal(base uint64, throttle func(bytes int)) (RewriteStats, error) {
	if s.cfg.Keyring == nil {
		return RewriteStats{}, ErrNoKeyring
	}
	return s.RewriteSegment(base, throttle, func(dst, frame []byte, _ batch.Header, _ bool) ([]byte, error) {
		return append(dst, frame...), nil
	})
}
