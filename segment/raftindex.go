package segment

import (
	"fmt"
	"io"
	"sort"

	"github.com/geolog/geolog/batch"
)

// ReadFramesByIndex returns whole, CRC-verified frames, control frames
// included, with lo <= Index < hi, in index order: the frame at lo first
// (or, for an lo in the gap before a fork frame, that fork frame), then
// each following one while the result stays within maxBytes (clamped to
// [0, ReadBytesMax]). The first frame is returned even if it alone exceeds
// maxBytes. The caller owns the returned slice.
//
// lo == hi returns nil, nil. Otherwise [lo, hi) must lie within
// [FirstIndex(), LastIndex()+1), or ErrOutOfRange is returned (Raft's
// Storage answers ErrCompacted or ErrUnavailable from FirstIndex and
// LastIndex before asking). A frame failing verification, or indexes that
// are not dense, return a *CorruptionError.
//
// Safe from any number of goroutines, concurrently with the appender; like
// ReadFrames it may return frames that are not durable yet.
func (s *Store) ReadFramesByIndex(lo, hi uint64, maxBytes int) ([]byte, error) {
	maxBytes = clampRead(maxBytes)
	s.truncMu.RLock()
	defer s.truncMu.RUnlock()

	v, err := s.viewHoldingIndex(lo, hi)
	if err != nil || v.seg == nil {
		return nil, err
	}
	pos, q, _, err := s.seekIndex(v, lo, true)
	if err != nil {
		s.releaseView(v)
		return nil, err
	}
	return s.readFrom(v, pos, q, readSpec{byIndex: true, end: hi}, maxBytes)
}

// HeadersByIndex calls fn with the header of every frame with lo <=
// index < hi (indexes checked as ReadFramesByIndex checks them), in order,
// verified as ReadFramesByIndex verifies frames, but
// without copying frames out: one pooled read window, whatever the range.
// A compaction point's producer state is built this way from the frames
// about to be deleted. Safe concurrently with the appender.
func (s *Store) HeadersByIndex(lo, hi uint64, fn func(batch.Header)) error {
	if lo >= hi {
		return nil
	}
	s.truncMu.RLock()
	defer s.truncMu.RUnlock()
	v, err := s.viewHoldingIndex(lo, hi)
	if err != nil || v.seg == nil {
		return err
	}
	pos, q, _, err := s.seekIndex(v, lo, true)
	if err != nil {
		s.releaseView(v)
		return err
	}
	rs := readSpec{byIndex: true, end: hi}
	for {
		w, buf := s.walker(v.seg.f, pos, v.size)
		for !rs.stopAt(q) {
			_, h, err := w.next()
			framePos := w.at
			if err == io.EOF {
				break
			}
			if err == nil {
				err = q.check(h)
			}
			if err != nil {
				s.releaseWalker(&w, buf)
				s.releaseView(v)
				return s.readError(v.seg, framePos, q.offset, err)
			}
			if rs.stopBefore(h) {
				s.releaseWalker(&w, buf)
				s.releaseView(v)
				return nil
			}
			fn(h)
			q.advance(h)
		}
		pos = w.pos
		s.releaseWalker(&w, buf)
		if rs.stopAt(q) {
			s.releaseView(v)
			return nil
		}
		nv, ok := s.viewAfter(v, pos)
		if !ok {
			s.releaseView(v)
			return nil
		}
		if nv.seg != v.seg {
			pos = 0
		}
		s.releaseView(v)
		v = nv
	}
}

// TermAt returns the Raft term of the frame at index, which must be within
// [FirstIndex(), LastIndex()] (else ErrOutOfRange). Safe concurrently with
// the appender.
func (s *Store) TermAt(index uint64) (uint64, error) {
	s.truncMu.RLock()
	defer s.truncMu.RUnlock()
	if index == 0 {
		return 0, fmt.Errorf("%w: raft index 0", ErrOutOfRange)
	}
	v, err := s.viewHoldingIndex(index, index+1)
	if err != nil {
		return 0, err
	}
	defer s.releaseView(v)
	if index == v.lastIndex {
		return v.lastTerm, nil // the common question: the term of the tail
	}
	_, _, h, err := s.seekIndex(v, index, false)
	return h.Term, err
}

// viewHoldingIndex snapshots the segment holding Raft index lo after
// checking [lo, hi) against the log's indexes (see ReadFramesByIndex).
// For lo == hi it returns the empty view and nil.
func (s *Store) viewHoldingIndex(lo, hi uint64) (segView, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return segView{}, ErrClosed
	}
	if lo == hi {
		return segView{}, nil
	}
	first, last := s.firstIndex.Load(), s.lastIndex.Load()
	if first == 0 || lo < first || lo > hi || hi > last+1 {
		return segView{}, fmt.Errorf("%w: raft indexes [%d, %d) not within [%d, %d]", ErrOutOfRange, lo, hi, first, last)
	}
	i := s.segmentOfIndexLocked(lo)
	return viewLocked(s.segs[i]), nil
}

// segmentOfIndexLocked returns the position in segs of the segment holding
// Raft index index, which the caller checked against the log's bounds. The
// caller holds mu, or is the appender.
func (s *Store) segmentOfIndexLocked(index uint64) int {
	// Segments holding indexes are a suffix of the log but for an empty
	// active segment, and their ranges increase.
	n := len(s.segs)
	if s.segs[n-1].size == 0 {
		n--
	}
	i := sort.Search(n, func(i int) bool { return s.segs[i].lastIndex >= index })
	if i == n || s.segs[i].firstIndex == 0 {
		panic(fmt.Sprintf("segment: raft index %d within [%d, %d] is in no segment", index, s.firstIndex.Load(), s.lastIndex.Load()))
	}
	// A segment starting after index (firstIndex > index) begins with a
	// fork frame whose gap holds index: the walk from its start finds that.
	return i
}

// seekIndex returns the position of the frame of v at Raft index index,
// what that frame continues, and its header, walking from the nearest
// earlier index entry (about IndexIntervalBytes). An index in the gap
// before a fork frame is ErrOutOfRange, unless gapOK: then the fork frame
// is the one returned.
func (s *Store) seekIndex(v segView, index uint64, gapOK bool) (int64, seq, batch.Header, error) {
	e := floorIndexEntry(v.entries, index)
	q := entrySeq(v.seg, e)
	w, buf := s.walker(v.seg.f, int64(e.position), v.size)
	defer s.releaseWalker(&w, buf)
	for {
		_, h, err := w.next()
		framePos := w.at
		if err == nil {
			err = q.check(h)
		}
		if err == nil && h.Index > index {
			gap := h.Type == batch.TypeFork || h.Compacted()
			if gap && gapOK {
				return framePos, q, h, nil
			}
			if gap {
				// The entries of a divergent tail were moved out of the
				// log, or compaction by key removed them; the fork frame,
				// or the compacted one, ends the gap they left.
				return 0, seq{}, batch.Header{}, fmt.Errorf("%w: raft index %d lies in the gap before the %v frame at %d", ErrOutOfRange, index, h.Type, h.Index)
			}
			err = fmt.Errorf("%w: index %d follows %d", errIndexSequence, h.Index, index-1)
		}
		if err == io.EOF {
			err = fmt.Errorf("%w: index %d not found before the end of the segment", errIndexSequence, index)
		}
		if err != nil {
			return 0, seq{}, batch.Header{}, s.readError(v.seg, framePos, q.offset, err)
		}
		if h.Index == index {
			return framePos, q, h, nil
		}
		q.advance(h)
	}
}

// TruncateSuffixAtIndex drops every frame with Raft index >= index, and so
// NextOffset falls back to the BaseOffset of the frame at index: Raft
// uses it to drop a conflicting uncommitted suffix. It returns once the
// shorter log is durable, with TruncateSuffix's crash safety and waits.
// An index past LastIndex(), or any index on a log without indexes,
// drops nothing; index 0 or below FirstIndex() returns ErrOutOfRange and
// changes nothing. For the appender goroutine.
func (s *Store) TruncateSuffixAtIndex(index uint64) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.usableLocked(); err != nil {
		return err
	}
	first, last := s.firstIndex.Load(), s.lastIndex.Load()
	switch {
	case index == 0:
		return fmt.Errorf("%w: truncate at raft index 0", ErrOutOfRange)
	case first == 0 || index > last:
		return nil
	case index < first:
		return fmt.Errorf("%w: truncate at raft index %d, log holds [%d, %d]", ErrOutOfRange, index, first, last)
	}
	c, err := s.cutAtIndex(s.segmentOfIndexLocked(index), index)
	if err != nil {
		return err
	}
	return s.truncate(c, "index", index)
}

// cutAtIndex finds the frame at Raft index index in segment i.
func (s *Store) cutAtIndex(i int, index uint64) (cut, error) {
	g := s.segs[i]
	// Start strictly before the frame, so the walk sees the one before it.
	e := floorIndexEntry(g.entries, index-1)
	q := entrySeq(g, e)
	c := newCut(i)
	w, buf := s.walker(g.f, int64(e.position), g.size)
	defer s.releaseWalker(&w, buf)
	for {
		_, h, err := w.next()
		framePos := w.at
		if err == nil {
			err = q.check(h)
		}
		if err == io.EOF {
			err = fmt.Errorf("%w: index %d not found before the end of the segment", errIndexSequence, index)
		}
		if err != nil {
			return cut{}, s.readError(g, framePos, q.offset, err)
		}
		if h.Index >= index {
			// Past index only at a fork frame whose gap holds index: the
			// frames from it on are the ones at or past index.
			c.pos, c.nextOffset = framePos, h.BaseOffset
			return c, nil
		}
		c.after(h)
		q.advance(h)
	}
}
