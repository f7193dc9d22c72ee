package segment

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/geolog/geolog/atrest"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
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

// ResealContext is Reseal that gives up, with ctx's error and nothing
// replaced, at the first frame after ctx ends (a node closing).
func (s *Store) ResealContext(ctx context.Context, base uint64, throttle func(bytes int)) (RewriteStats, error) {
	if s.cfg.Keyring == nil {
		return RewriteStats{}, ErrNoKeyring
	}
	return s.RewriteSegment(base, throttle, func(dst, frame []byte, _ batch.Header, _ bool) ([]byte, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return append(dst, frame...), nil
	})
}

// ResealPending returns the sealed segments (never the active one) that
// hold a frame not sealed under the keyring's active data key, oldest
// first: those whose first unit is a plain frame or names another key. The
// first unit speaks for the segment because keys only move forward: a
// frame is sealed under the key active when it is written, a rotation
// makes a new key active, and a rewrite (Reseal, compaction) seals every
// frame under the active key, so a segment whose first unit is under the
// active key holds nothing older. It reads one unit header per sealed
// segment. nil without a keyring. Safe from any goroutine.
func (s *Store) ResealPending() ([]SegmentInfo, error) {
	if s.cfg.Keyring == nil {
		return nil, nil
	}
	active := s.cfg.Keyring.Active()
	var out []SegmentInfo
	for _, g := range s.Sealed() {
		id, err := s.firstUnitKey(g.BaseOffset)
		switch {
		case errors.Is(err, ErrRewriteAbandoned):
			continue // deleted or replaced meanwhile
		case err != nil:
			return nil, err
		case id != active:
			out = append(out, g)
		}
	}
	return out, nil
}

// firstUnitKey returns the data key of the first unit of the sealed
// segment at base (0: a plain frame, or an empty segment has none: then
// the active key).
func (s *Store) firstUnitKey(base uint64) (atrest.KeyID, error) {
	v, err := s.sealedView(base)
	if err != nil {
		return 0, err
	}
	defer s.releaseView(v)
	if v.size == 0 {
		return s.cfg.Keyring.Active(), nil
	}
	h := make([]byte, min(int64(atrest.HeaderBytes), v.size))
	if _, err := v.seg.f.ReadAt(h, 0); err != nil {
		return 0, fmt.Errorf("segment: read %s: %w", v.seg.name(), err)
	}
	return atrest.UnitKey(h), nil
}

// RollStale rolls the active segment if its first unit is not sealed under
// the keyring's active data key (a plain frame, or an older key), so that
// ResealPending finds it once closed: an idle range would otherwise keep
// frames under a retired key in its active segment for good. A segment
// without records is left alone (Store.SealBefore's rule). It reports
// whether it rolled. Safe from any goroutine: it takes the appender's lock.
func (s *Store) RollStale() (bool, error) {
	if s.cfg.Keyring == nil {
		return false, nil
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.usableLocked(); err != nil {
		return false, err
	}
	g := s.active()
	if !g.hasRecords() || g.size == 0 {
		return false, nil
	}
	h := make([]byte, min(int64(atrest.HeaderBytes), g.size))
	if _, err := g.f.ReadAt(h, 0); err != nil {
		return false, fmt.Errorf("segment: read %s: %w", g.name(), err)
	}
	if atrest.UnitKey(h) == s.cfg.Keyring.Active() {
		return false, nil
	}
	return true, s.roll()
}

// FileUnitKeys counts the units of the log file at path by data key (0:
// plain frames), reading it whole in chunks: what an offline tool checks
// before a data key is retired. A unit cut short at the end (a torn
// write, which recovery truncates) or zero-ahead's zeros end the count; a length no unit can
// have is an error wrapping batch.ErrCorrupt.
func FileUnitKeys(fsys vfs.FS, path string) (map[atrest.KeyID]int, error) {
	f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return nil, err
	}
	out := map[atrest.KeyID]int{}
	h := make([]byte, atrest.HeaderBytes)
	for pos := int64(0); pos+4 <= size; {
		n, err := f.ReadAt(h[:min(int64(len(h)), size-pos)], pos)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("segment: read %s: %w", path, err)
		}
		if allZero(h[:n]) {
			break // zero-ahead's padding (zeroahead.go): no unit starts with zeros
		}
		unit, err := atrest.UnitSize(h[:n])
		if err != nil {
			return nil, fmt.Errorf("segment: %s at %d: %w", path, pos, err)
		}
		if pos+int64(unit) > size {
			break
		}
		out[atrest.UnitKey(h[:n])]++
		pos += int64(unit)
	}
	return out, nil
}
