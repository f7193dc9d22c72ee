package segment

import (
	"bytes"
	"fmt"
	"sync"

	"github.com/geolog/geolog/vfs"
)

// Zero-ahead (Config.ZeroAheadBytes): the active segment keeps zeros
// written past its last frame, so that the frames after them overwrite
// blocks the file already has instead of growing it.
//
// Why: an fdatasync after a write that grew the file must also commit
// the file's new size and block map (a journal commit on ext4 and XFS);
// after an overwrite of written blocks it flushes the data alone. On the
// machine the issue-15 figures come from, a 4 KiB write and fdatasync
// took 141-176 us at the median and 86-105 us of CPU when it appended,
// 80-86 us and 40-46 us when it overwrote zeros written before
// (notes/zeroahead.md). Blocks reserved by fallocate do not do it: their
// first write still changes the block map (131-135 us, 71-77 us of CPU).
// PostgreSQL fills each WAL segment with zeros before use for the same
// reason.
//
// How:
//
//   - An append whose frame would end past the zeros first writes the next
//     stretch of zeros past the frame's end: a quarter of the segment's
//     size so far, at least zeroAheadMinBytes and at most ZeroAheadBytes,
//     so that a range that writes little keeps little padding. The next
//     Sync's fdatasync then commits the new size once for the stretch.
//   - The padding never holds data, so readers (bounded by the segment's
//     size) never see it. Roll and Close cut it off before their
//     fdatasync: a sealed segment ends at its last frame, as without
//     zero-ahead, and a clean restart finds no padding.
//   - After a crash the last segment may end in zeros (any part of them,
//     or none, may have reached the disk). Recovery takes a tail that is
//     zeros to the end of the file as padding and cuts it off, as it
//     would a torn tail, without taking it for one.
//   - A full device refuses zeros, not frames: a stretch refused for space
//     is cut off again, and the segment appends without zero-ahead until
//     the next roll.
//   - Only while Sync rounds are small (zeroAheadSyncBytesMax): where they
//     are large, writing every byte twice costs more than the commits
//     save.
//   - Only with FsyncAlways: without fdatasyncs there is nothing to save,
//     and roll's cut would not be durable before the next segment exists.
//
// A truncation of the log (Raft's, a fork's, or a write refused for
// space) cuts the padding off with the frames past the cut.

// zeroAheadSyncBytesMax turns zero-ahead off while Sync rounds cover more
// than this on average. Each byte of a padded file is written twice,
// zeros first, and the fdatasync after a stretch flushes the zeros: that
// costs per byte, what it saves (the commit of the file's size and block
// map) per fdatasync. Where rounds are large, at full speed, the bytes
// cost more than the commits: on the machine of notes/zeroahead.md a 1 MiB
// stretch flushed in about 3 ms while a commit saved 60-80 us, so the two
// break even at some 20-60 KiB per round, and zero-ahead with no such
// bound cost full speed 5-6% of its records/s.
const zeroAheadSyncBytesMax = 32 << 10

// noteSyncRound folds a Sync round that covered the log up to appended
// bytes into the moving average zero-ahead goes by (an eighth per round).
// The round's leader calls it.
func (s *Store) noteSyncRound(appended int64) {
	n := appended - s.syncedBytes
	s.syncedBytes = appended
	avg := s.syncBytes.Load()
	s.syncBytes.Store(avg + (n-avg)/8)
}

// zeroAheadMinBytes is the least stretch of zeros written at once.
const zeroAheadMinBytes = 64 << 10

// ZeroAheadBytesMax bounds Config.ZeroAheadBytes.
const ZeroAheadBytesMax = 16 << 20

// zeroTailBytesMax is the most of a last segment's tail that recovery
// reads to find it all zeros: a stretch of padding (zeroahead.go) and a
// frame's worth (a frame not yet written over it, whose write was lost).
const zeroTailBytesMax = ZeroAheadBytesMax + zeroAheadAlign + 1<<20

// zeroAheadAlign aligns the end of the zeros to whole pages.
const zeroAheadAlign = 4 << 10

// zeroBlock is a read-only block of zeros that every store writes from.
var zeroBlock = sync.OnceValue(func() []byte { return make([]byte, 1<<20) })

// zeroAheadFor writes the zeros a frame of n bytes at the tail of the
// active segment g needs written past it, if zero-ahead is on and the
// frame would end past the padding g has. A stretch refused for space is
// cut off and turns zero-ahead off for g; any other failed write is
// returned, and the caller fails the store. The caller holds wmu.
func (s *Store) zeroAheadFor(g *segment, n int) error {
	pos := g.size
	end := pos + int64(n)
	if s.cfg.ZeroAheadBytes == 0 || g.noZeroAhead || end <= pos+g.padded || s.syncBytes.Load() > zeroAheadSyncBytesMax {
		return nil
	}
	stretch := min(s.cfg.ZeroAheadBytes, max(zeroAheadMinBytes, g.size/4))
	zend := (end + stretch + zeroAheadAlign - 1) &^ (zeroAheadAlign - 1)
	zeros := zeroBlock()
	for at := end; at < zend; {
		k := min(int64(len(zeros)), zend-at)
		if _, err := g.f.WriteAt(zeros[:k], at); err != nil {
			if !vfs.IsNoSpace(err) {
				return err
			}
			// Put the file back as it was; shrinking needs no space.
			if terr := g.f.Truncate(pos + g.padded); terr != nil {
				return fmt.Errorf("%w (and the zeros could not be cut off: %w)", err, terr)
			}
			g.noZeroAhead = true
			s.log.Debug("no space for zero-ahead: appending without it until the next segment", "segment", g.name(), "error", err)
			return nil
		}
		at += k
	}
	g.padded = zend - pos
	return nil
}

// trimPadding cuts the zero padding off g's file, which then ends at its
// last frame. The caller holds wmu and makes the cut durable.
func (g *segment) trimPadding() error {
	if g.padded == 0 {
		return nil
	}
	if err := g.f.Truncate(g.size); err != nil {
		return fmt.Errorf("segment: cut the zero padding off %s: %w", g.name(), err)
	}
	g.padded = 0
	return nil
}

// zeroTail reports whether f holds nothing but zeros from pos to size,
// reading at most bytesMax of it (false past that).
func zeroTail(f vfs.File, pos, size, bytesMax int64) (bool, error) {
	if size-pos > bytesMax {
		return false, nil
	}
	buf := make([]byte, min(size-pos, 1<<20))
	for at := pos; at < size; {
		b := buf[:min(int64(len(buf)), size-at)]
		if err := readFull(f, b, at); err != nil {
			return false, err
		}
		if !allZero(b) {
			return false, nil
		}
		at += int64(len(b))
	}
	return true, nil
}

// allZero reports whether b holds only zero bytes.
func allZero(b []byte) bool {
	zeros := zeroBlock()
	for len(b) > 0 {
		k := min(len(b), len(zeros))
		if !bytes.Equal(b[:k], zeros[:k]) {
			return false
		}
		b = b[k:]
	}
	return true
}
