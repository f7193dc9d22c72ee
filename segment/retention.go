package segment

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"

	"github.com/geolog/geolog/batch"
)

// TruncateSuffix drops every record at or after offset, which must be the
// first offset of a batch (or NextOffset(), a no-op) within
// [StartOffset(), NextOffset()]; otherwise it returns ErrOutOfRange or
// ErrNotBoundary and changes nothing. It removes later segments entirely
// and truncates the one holding offset, with its index files, and returns
// once all of that is durable. Raft uses it to drop a conflicting suffix.
//
// Crash safety: later segments are unlinked newest first and the directory
// is fsynced before the remaining segment is truncated, so after a crash at
// any point the log on disk is a prefix of the log before the call.
//
// TruncateSuffix waits for readers in flight and an fdatasync in flight. It
// is for the appender goroutine.
func (s *Store) TruncateSuffix(offset uint64) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.usableLocked(); err != nil {
		return err
	}
	start, next := s.startOffset.Load(), s.nextOffset.Load()
	if offset < start || offset > next {
		return fmt.Errorf("%w: truncate to %d, log holds [%d, %d]", ErrOutOfRange, offset, start, next)
	}
	if offset == next {
		return nil
	}
	i := sort.Search(len(s.segs), func(i int) bool { return s.segs[i].baseOffset > offset }) - 1
	g := s.segs[i]
	pos, lastTime, err := s.boundary(g, offset)
	if err != nil {
		return err
	}

	// No fdatasync may run while files shrink under it, and no reader may
	// read them; both wait for us.
	s.beginExclusiveSync()
	defer s.endExclusiveSync()
	s.truncMu.Lock()
	defer s.truncMu.Unlock()

	removed := slices.Clone(s.segs[i+1:])
	for j := len(removed) - 1; j >= 0; j-- {
		if err := s.unlinkSegment(removed[j]); err != nil {
			s.fail(err)
			return s.failed()
		}
	}
	if len(removed) > 0 {
		if err := syncDir(s.cfg.Dir); err != nil {
			s.fail(err)
			return s.failed()
		}
	}
	if err := g.f.Truncate(pos); err != nil {
		s.fail(err)
		return s.failed()
	}
	// Sync whatever the policy: Raft must not see the dropped suffix again.
	if err := s.fdatasync(g.f); err != nil {
		s.fail(err)
		return s.failed()
	}

	keep := sort.Search(len(g.entries), func(k int) bool { return uint64(g.entries[k].relOffset) >= offset-g.baseOffset })
	s.mu.Lock()
	var dropped int64
	for _, r := range removed {
		dropped += r.size
	}
	dropped += g.size - pos
	g.entries = g.entries[:keep:keep] // the next append reallocates rather than overwriting a reader's snapshot
	g.size = pos
	g.nextOffset = offset
	g.maxAppendTimeUnixNanos = lastTime
	s.segs = s.segs[:i+1]
	s.sizeBytes.Add(-dropped)
	// The truncation is fsynced and nothing else writes durable while we
	// own the sync; lower it first so DurableOffset <= NextOffset holds
	// at every instant.
	s.durable.Store(offset)
	s.nextOffset.Store(offset)
	s.mu.Unlock()

	if err := writeIndexFiles(g, g.entries, s.cfg.Fsync == FsyncAlways); err != nil {
		s.log.Warn("could not write index files", "segment", g.name(), "error", err)
	}
	for _, r := range removed {
		if err := r.release(); err != nil {
			s.log.Warn("close segment file", "segment", r.name(), "error", err)
		}
	}
	s.lastAppendTimeUnixNanos = math.MinInt64
	for _, r := range s.segs {
		if r.size > 0 {
			s.lastAppendTimeUnixNanos = r.maxAppendTimeUnixNanos
		}
	}
	s.log.Info("truncated log suffix", "offset", offset, "previous_next_offset", next,
		"segments_removed", len(removed), "bytes_dropped", dropped)
	return nil
}

// boundary returns the position in g of the batch starting at offset and
// the newest append time of the batches before it (math.MinInt64 if none),
// walking from the index entry before offset. Only the appender calls it,
// so g does not change meanwhile.
func (s *Store) boundary(g *segment, offset uint64) (int64, int64, error) {
	if offset == g.baseOffset {
		return 0, math.MinInt64, nil
	}
	// Start strictly before offset so the walk sees the batch just before
	// it, whose time becomes the segment's newest.
	e := floorEntry(g.entries, offset-g.baseOffset-1)
	buf := s.getBuf()
	defer s.putBuf(buf)
	w := frameWalker{f: g.f, buf: (*buf)[:0], pos: int64(e.position), end: g.size,
		chunk: min(s.cfg.IndexIntervalBytes+batch.HeaderSize, readChunkBytes)}
	defer func() { *buf = w.buf }()
	expect, lastTime := g.baseOffset+uint64(e.relOffset), int64(math.MinInt64)
	for {
		framePos := w.pos
		_, h, err := w.next()
		if err == io.EOF {
			err = fmt.Errorf("offset %d not found before the end of the segment", offset)
		}
		if err == nil {
			err = checkSequence(h, expect)
		}
		if err != nil {
			return 0, 0, s.readError(g, framePos, expect, err)
		}
		switch {
		case h.BaseOffset == offset:
			return framePos, lastTime, nil
		case h.BaseOffset > offset:
			return 0, 0, fmt.Errorf("%w: offset %d is inside the batch [%d, %d)", ErrNotBoundary, offset, expect, h.BaseOffset)
		case h.NextOffset() > offset:
			return 0, 0, fmt.Errorf("%w: offset %d is inside the batch [%d, %d)", ErrNotBoundary, offset, h.BaseOffset, h.NextOffset())
		}
		lastTime = max(lastTime, h.AppendTimeUnixNanos)
		expect = h.NextOffset()
	}
}

// DeletePrefix deletes, oldest first, every whole segment whose records are
// all below offset. The active segment is never deleted: when offset ==
// NextOffset() and the active segment holds records, an empty segment is
// rolled at NextOffset first, so that everything goes and StartOffset ==
// NextOffset survives a restart through the new file's name. An offset at
// or below StartOffset deletes nothing; one above NextOffset returns
// ErrOutOfRange. For the appender goroutine.
func (s *Store) DeletePrefix(offset uint64) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.usableLocked(); err != nil {
		return err
	}
	if next := s.nextOffset.Load(); offset > next {
		return fmt.Errorf("%w: delete below %d, log ends at %d", ErrOutOfRange, offset, next)
	} else if offset == next && s.active().size > 0 {
		if err := s.roll(); err != nil {
			return err
		}
	}
	_, err := s.deleteOldest(func(g *segment) bool { return g.nextOffset <= offset })
	return err
}

// ApplyRetention deletes the oldest segments that retention no longer
// keeps and returns how many it deleted:
//
//   - by age (RetentionAge > 0): oldest first, every segment whose newest
//     batch was appended before Now()-RetentionAge; if that is every batch
//     of the log, an empty segment is rolled at NextOffset first (as in
//     DeletePrefix);
//   - by size (RetentionBytes > 0): oldest first while Size() >
//     RetentionBytes. The active segment is never deleted for size, so the
//     log can exceed RetentionBytes by up to one segment.
//
// For the appender goroutine.
func (s *Store) ApplyRetention() (deletedSegments int, err error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.usableLocked(); err != nil {
		return 0, err
	}
	if s.cfg.RetentionAge > 0 {
		cutoff := s.cfg.Now().Add(-s.cfg.RetentionAge).UnixNano()
		expired := func(g *segment) bool { return g.size > 0 && g.maxAppendTimeUnixNanos < cutoff }
		if expired(s.active()) {
			// Append times are non-decreasing: every segment has expired.
			if err := s.roll(); err != nil {
				return 0, err
			}
		}
		n, err := s.deleteOldest(expired)
		deletedSegments += n
		if err != nil {
			return deletedSegments, err
		}
	}
	if s.cfg.RetentionBytes > 0 {
		n, err := s.deleteOldest(func(*segment) bool { return s.sizeBytes.Load() > s.cfg.RetentionBytes })
		deletedSegments += n
		if err != nil {
			return deletedSegments, err
		}
	}
	return deletedSegments, nil
}

// deleteOldest deletes segments from the oldest while del approves and the
// segment is not the active one, and returns how many it deleted. Each
// deletion is published first (StartOffset moves, new readers get
// ErrOutOfRange), then its files are unlinked and the directory fsynced, so
// a crash leaves a suffix of the log. Readers holding the segment finish
// on the unlinked file. The caller holds wmu.
func (s *Store) deleteOldest(del func(*segment) bool) (int, error) {
	n := 0
	for len(s.segs) > 1 && del(s.segs[0]) {
		g := s.segs[0]
		s.mu.Lock()
		s.segs = append([]*segment(nil), s.segs[1:]...)
		s.sizeBytes.Add(-g.size)
		s.publishStartLocked()
		s.mu.Unlock()

		err := s.unlinkSegment(g)
		if err == nil {
			err = syncDir(s.cfg.Dir)
		}
		if rerr := g.release(); rerr != nil {
			s.log.Warn("close segment file", "segment", g.name(), "error", rerr)
		}
		if err != nil {
			// The directory's state is unknown; like a failed fsync of the
			// log, that is not retried.
			s.fail(err)
			return n, s.failed()
		}
		n++
		s.log.Info("deleted segment", "segment", g.name(), "next_offset", g.nextOffset, "bytes", g.size)
	}
	return n, nil
}

// unlinkSegment removes g's index files and then its log, so that a crash
// in between leaves a log without index files (rebuilt) rather than index
// files without a log.
func (s *Store) unlinkSegment(g *segment) error {
	for _, suffix := range []string{indexSuffix, timeIndexSuffix, logSuffix} {
		if err := os.Remove(g.path(suffix)); err != nil && !(suffix != logSuffix && errors.Is(err, os.ErrNotExist)) {
			return fmt.Errorf("segment: delete %s: %w", g.path(suffix), err)
		}
	}
	return nil
}
