package segment

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/geolog/geolog/batch"
)

// TruncateSuffix drops every frame with BaseOffset >= offset: the records
// from offset on and the control frames among and just before them. offset
// must be the first offset of a batch or NextOffset() (which drops only
// control frames at the tail, if any) within [StartOffset(), NextOffset()];
// otherwise it returns ErrOutOfRange or ErrNotBoundary and changes nothing.
// It removes later segments entirely and truncates the one holding the
// first dropped frame, with its index files, and returns once all of that
// is durable. Frames with Raft indexes go with their frames: LastIndex
// falls accordingly.
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
	// The first frame at or past offset is in the first segment that ends
	// at or after offset (control frames at offset may close it), or it
	// starts the next segment.
	i := sort.Search(len(s.segs), func(i int) bool { return s.segs[i].nextOffset >= offset })
	c, err := s.cutAtOffset(i, offset)
	if err != nil {
		return err
	}
	if last := len(s.segs) - 1; c.seg == last && c.pos == s.segs[last].size {
		return nil // nothing at or past offset
	}
	return s.truncate(c, "offset", offset)
}

// cut is where a truncation goes: the frames of segment seg from position
// pos on, and every later segment, are dropped, and NextOffset becomes
// nextOffset. The other fields describe what remains of segment seg: its
// newest append time (math.MinInt64 if nothing) and its last Raft index
// and that frame's term (0 if none).
type cut struct {
	seg                 int
	pos                 int64
	nextOffset          uint64
	lastTime            int64
	lastIndex, lastTerm uint64
}

func newCut(seg int) cut { return cut{seg: seg, lastTime: math.MinInt64} }

// after notes frame h, which stays.
func (c *cut) after(h batch.Header) {
	c.lastTime = max(c.lastTime, h.AppendTimeUnixNanos)
	if h.Index != 0 {
		c.lastIndex, c.lastTerm = h.Index, h.Term
	}
}

// cutAtOffset finds the first frame of segment i with BaseOffset >= offset
// (or the start of the next segment, or the end of the log), walking from
// the index entry before offset. Only the appender calls it, so the
// segments do not change meanwhile.
func (s *Store) cutAtOffset(i int, offset uint64) (cut, error) {
	g := s.segs[i]
	// Start strictly before offset so the walk sees the frame just before
	// the cut, whose time and index become the segment's newest.
	var e indexEntry
	if offset > g.baseOffset {
		e = floorEntry(g.entries, offset-g.baseOffset-1)
	}
	q, c := entrySeq(g, e), newCut(i)
	w, buf := s.walker(g.f, int64(e.position), g.size)
	defer s.releaseWalker(&w, buf)
	for {
		_, h, err := w.next()
		framePos := w.at
		if err == io.EOF {
			// g ends at offset: the cut starts the next segment, if any.
			if i+1 < len(s.segs) {
				return cut{seg: i + 1, nextOffset: s.segs[i+1].baseOffset, lastTime: math.MinInt64}, nil
			}
			c.pos, c.nextOffset = g.size, g.nextOffset
			return c, nil
		}
		if err == nil {
			err = q.check(h)
		}
		if err != nil {
			return cut{}, s.readError(g, framePos, q.offset, err)
		}
		switch {
		case h.BaseOffset == offset:
			c.pos, c.nextOffset = framePos, offset
			return c, nil
		case h.BaseOffset > offset || h.NextOffset() > offset:
			return cut{}, fmt.Errorf("%w: offset %d is inside the batch [%d, %d)", ErrNotBoundary, offset, h.BaseOffset, h.NextOffset())
		}
		c.after(h)
		q.advance(h)
	}
}

// truncate drops everything from c on (see cut) and makes the result
// durable; what and at name the request, for the log. The caller holds
// wmu.
func (s *Store) truncate(c cut, what string, at uint64) error {
	g := s.segs[c.seg]
	prevNext, prevLast := s.nextOffset.Load(), s.lastIndex.Load()

	// No fdatasync may run while files shrink under it, and no reader may
	// read them; both wait for us.
	s.beginExclusiveSync()
	defer s.endExclusiveSync()
	s.truncMu.Lock()
	defer s.truncMu.Unlock()

	removed := slices.Clone(s.segs[c.seg+1:])
	for j := len(removed) - 1; j >= 0; j-- {
		if err := s.unlinkSegment(removed[j]); err != nil {
			s.fail(err)
			return s.failed()
		}
	}
	if len(removed) > 0 {
		if err := s.fs.SyncDir(s.cfg.Dir); err != nil {
			s.fail(err)
			return s.failed()
		}
	}
	if err := g.f.Truncate(c.pos); err != nil {
		s.fail(err)
		return s.failed()
	}
	g.padded = 0 // cut off with the frames (zeroahead.go)
	// Sync whatever the policy: Raft must not see the dropped suffix again.
	if err := s.fdatasync(g.f); err != nil {
		s.fail(err)
		return s.failed()
	}

	keep := sort.Search(len(g.entries), func(k int) bool { return int64(g.entries[k].position) >= c.pos })
	cutKeys, staleKeys := s.cutKeys(g, c.pos)
	s.mu.Lock()
	cutKeys()
	var dropped int64
	for _, r := range removed {
		dropped += r.size
	}
	dropped += g.size - c.pos
	g.entries = g.entries[:keep:keep] // the next append reallocates rather than overwriting a reader's snapshot
	g.size = c.pos
	g.truncations++
	g.nextOffset = c.nextOffset
	g.maxAppendTimeUnixNanos = c.lastTime
	g.lastIndex, g.lastTerm = c.lastIndex, c.lastTerm
	if c.lastIndex == 0 {
		g.firstIndex = 0
	}
	s.segs = s.segs[:c.seg+1]
	s.sizeBytes.Add(-dropped)
	// The truncation is fsynced and nothing else writes durable while we
	// own the sync; lower it first so DurableOffset <= NextOffset holds
	// at every instant. Every frame appended so far is durable or gone.
	s.durable.Store(c.nextOffset)
	s.durableAppends.Store(s.appends.Load())
	s.nextOffset.Store(c.nextOffset)
	s.publishBoundsLocked()
	s.mu.Unlock()

	if err := s.writeIndexFiles(g); err != nil {
		s.log.Warn("could not write index files", "segment", g.name(), "error", err)
	}
	if staleKeys {
		s.removeKeyIndexFile(g)
	}
	for _, r := range removed {
		if err := r.release(); err != nil {
			s.log.Warn("close segment file", "segment", r.name(), "error", err)
		}
	}
	s.lastAppendTimeUnixNanos = math.MinInt64
	if t := s.tail(); t != nil {
		s.lastAppendTimeUnixNanos = t.maxAppendTimeUnixNanos
	}
	s.refreshLastTerm()
	s.log.Info("truncated log suffix", "at_"+what, at, "next_offset", c.nextOffset, "previous_next_offset", prevNext,
		"last_index", s.lastIndex.Load(), "previous_last_index", prevLast,
		"segments_removed", len(removed), "bytes_dropped", dropped)
	return nil
}

// tail returns the newest segment holding a frame, or nil. Only the empty
// active segment can precede it from the end. The caller is the appender or
// holds mu.
func (s *Store) tail() *segment {
	for i := len(s.segs) - 1; i >= 0; i-- {
		if s.segs[i].size > 0 {
			return s.segs[i]
		}
	}
	return nil
}

// refreshLastTerm sets lastTerm from the newest indexed frame, or to 0 if
// none is retained. The caller holds wmu.
func (s *Store) refreshLastTerm() {
	s.lastTerm = 0
	if t := s.tail(); t != nil && t.lastIndex != 0 {
		s.lastTerm = t.lastTerm
	}
}

// DeletePrefix deletes, oldest first, every whole segment whose records are
// all below offset (with the control frames among them). The active segment
// is never deleted: when offset == NextOffset() and the active segment
// holds records, an empty segment is rolled at NextOffset first, so that
// everything goes and StartOffset == NextOffset survives a restart through
// the new file's name (an active segment of control frames alone stays).
// FirstIndex and LastIndex follow what remains. An offset at or below
// StartOffset deletes nothing; one above NextOffset returns ErrOutOfRange.
// For the appender goroutine.
func (s *Store) DeletePrefix(offset uint64) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.usableLocked(); err != nil {
		return err
	}
	if next := s.nextOffset.Load(); offset > next {
		return fmt.Errorf("%w: delete below %d, log ends at %d", ErrOutOfRange, offset, next)
	} else if offset == next && s.active().hasRecords() {
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
//     frame was appended before Now()-RetentionAge; if that is every frame
//     of the log, an empty segment is rolled at NextOffset first (as in
//     DeletePrefix; not when the active segment holds control frames alone);
//   - by size (RetentionBytes > 0): oldest first while Size() >
//     RetentionBytes. The active segment is never deleted for size, so the
//     log can exceed RetentionBytes by up to one segment.
//
// For the appender goroutine.
func (s *Store) ApplyRetention() (deletedSegments int, err error) {
	return s.applyRetention()
}

// SetRetention replaces the store's retention (Config.RetentionAge and
// RetentionBytes; zero: no bound) from the next ApplyRetention or
// RetentionCandidates on: a stream's retention altered at run time. Safe
// for concurrent use.
func (s *Store) SetRetention(age time.Duration, bytes int64) error {
	if age < 0 || bytes < 0 {
		return fmt.Errorf("segment: negative retention (age %v, bytes %d)", age, bytes)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	// Read only under wmu (applyRetention, RetentionCandidates).
	s.cfg.RetentionAge, s.cfg.RetentionBytes = age, bytes
	return nil
}

// Retention returns the store's retention age and size bounds.
func (s *Store) Retention() (time.Duration, int64) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.cfg.RetentionAge, s.cfg.RetentionBytes
}

func (s *Store) applyRetention() (deletedSegments int, err error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.usableLocked(); err != nil {
		return 0, err
	}
	if s.cfg.RetentionAge > 0 {
		cutoff := s.cfg.Now().Add(-s.cfg.RetentionAge).UnixNano()
		expired := func(g *segment) bool { return g.size > 0 && g.maxAppendTimeUnixNanos < cutoff }
		if g := s.active(); expired(g) && g.hasRecords() {
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
		// Say where the log starts now before anything goes, so that Open
		// tells this deletion from a lost segment. A failed save (a full
		// disk) deletes nothing and fails nothing.
		if err := s.saveStartRecord(s.segs[1].baseOffset); err != nil {
			s.log.Warn("retention deferred: could not record the new start offset", "error", err)
			return n, err
		}
		s.mu.Lock()
		s.segs = append([]*segment(nil), s.segs[1:]...)
		s.sizeBytes.Add(-g.size)
		s.publishBoundsLocked()
		s.mu.Unlock()
		s.refreshLastTerm()

		err := s.unlinkSegment(g)
		if err == nil {
			err = s.fs.SyncDir(s.cfg.Dir)
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

// unlinkSegment removes g's index files (the key index too) and then its log, so that a crash
// in between leaves a log without index files (rebuilt) rather than index
// files without a log.
func (s *Store) unlinkSegment(g *segment) error {
	for _, suffix := range []string{indexSuffix, timeIndexSuffix, keyIndexSuffix, logSuffix} {
		if err := s.fs.Remove(g.path(suffix)); err != nil && !(suffix != logSuffix && errors.Is(err, fs.ErrNotExist)) {
			return fmt.Errorf("segment: delete %s: %w", g.path(suffix), err)
		}
	}
	return nil
}
