package segment

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"

	"github.com/geolog/geolog/atrest"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
)

var (
	// errFrameCrossesEnd marks a frame whose length runs past the bytes the
	// reader may read.
	errFrameCrossesEnd = fmt.Errorf("%w: frame runs past the end of the segment", batch.ErrShort)
	// errFileShrunk marks a segment file shorter than the bytes the store
	// wrote to it.
	errFileShrunk = errors.New("segment file is shorter than the store wrote")
)

// ReadFrames returns whole, CRC-verified data frames in offset order,
// starting with the frame that holds offset from and stopping before any
// frame with BaseOffset >= endOffset, at the end of the log, or before the
// frame that would take the result past maxBytes (clamped to [0,
// ReadBytesMax]). The first qualifying frame is returned even if it alone
// exceeds maxBytes, so a reader always progresses. The caller owns the
// returned slice.
//
// Control frames (batch.Header.IsControl) are never returned: they hold no
// offset, and belong to the range's Raft group rather than to its readers
// or mirrors (ReadFramesByIndex returns them). The frames returned by
// successive reads, each from the previous one's last NextOffset, are thus
// the data frames of the log, each once, with every offset once and no gap.
//
// from == NextOffset() returns nil, nil. from below StartOffset or above
// NextOffset returns ErrOutOfRange. A frame failing verification returns a
// *CorruptionError (errors.Is ErrCorrupt).
//
// Safe from any number of goroutines, concurrently with the appender. It
// may return frames that are not durable yet: callers bound endOffset by
// what they may expose (the commit index). A segment deleted by retention
// during the call is read to the end of the call from the unlinked file.
func (s *Store) ReadFrames(from uint64, maxBytes int, endOffset uint64) ([]byte, error) {
	maxBytes = clampRead(maxBytes)
	s.truncMu.RLock()
	defer s.truncMu.RUnlock()

	v, err := s.viewContaining(from)
	if err != nil || v.seg == nil {
		return nil, err
	}
	pos, q, err := s.seek(v, from)
	if err != nil {
		s.releaseView(v)
		return nil, err
	}
	return s.readFrom(v, pos, q, readSpec{end: endOffset}, maxBytes)
}

// readSpec says which frames a read returns and where it stops.
type readSpec struct {
	// byIndex reads every frame, by Raft index; otherwise data frames only,
	// by offset.
	byIndex bool
	// end is where the read stops: before a frame with BaseOffset >= end,
	// or (byIndex) with Index >= end.
	end uint64
}

// stopAt reports whether the frame that q expects next is past the end,
// so the read stops without looking at it.
func (rs readSpec) stopAt(q seq) bool {
	if rs.byIndex {
		return q.nextIndex != 0 && q.nextIndex >= rs.end
	}
	return q.offset >= rs.end
}

// stopBefore reports whether the read stops before frame h.
func (rs readSpec) stopBefore(h batch.Header) bool {
	if rs.byIndex {
		return h.Index >= rs.end
	}
	return h.BaseOffset >= rs.end
}

// keep reports whether frame h is part of the result: never a commit
// mark, which is the log's own bookkeeping (AppendMark).
func (rs readSpec) keep(h batch.Header) bool {
	return h.Type != batch.TypeMark && (rs.byIndex || !h.IsControl())
}

// readFrom collects frames from pos of v, where q is what the frame there
// continues, across segments, until rs or maxBytes stops it or the log
// ends. It releases v.
func (s *Store) readFrom(v segView, pos int64, q seq, rs readSpec, maxBytes int) ([]byte, error) {
	defer func() { s.releaseView(v) }()
	var out []byte
	var err error
	for {
		if out == nil {
			out = make([]byte, 0, min(int64(max(maxBytes, firstReadBytes)), v.size-pos))
		}
		var stop bool
		out, pos, q, stop, err = s.collect(out, v, pos, q, rs, maxBytes)
		if err != nil || stop {
			break
		}
		// The snapshot of this segment is used up. Continue with more of
		// the same segment or the next one, if there is any.
		nv, ok := s.viewAfter(v, pos)
		if !ok {
			break
		}
		if nv.seg != v.seg {
			pos = 0
		}
		s.releaseView(v)
		v = nv
	}
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// viewContaining snapshots the segment holding off, checking off against
// [StartOffset, NextOffset]. For off == NextOffset it returns the empty
// view (and nil error): nothing to read.
func (s *Store) viewContaining(off uint64) (segView, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return segView{}, ErrClosed
	}
	start, next := s.startOffset.Load(), s.nextOffset.Load()
	if off < start || off > next {
		return segView{}, fmt.Errorf("%w: offset %d not in [%d, %d]", ErrOutOfRange, off, start, next)
	}
	if off == next {
		return segView{}, nil
	}
	i := sort.Search(len(s.segs), func(i int) bool { return s.segs[i].baseOffset > off }) - 1
	return viewLocked(s.segs[i]), nil
}

// viewAfter snapshots what follows position pos of the segment of v: the
// same segment if it has grown past pos, else the next segment. It reports
// false at the end of the log, and when v's segment has been deleted.
func (s *Store) viewAfter(v segView, pos int64) (segView, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return segView{}, false
	}
	i := sort.Search(len(s.segs), func(i int) bool { return s.segs[i].baseOffset >= v.seg.baseOffset })
	switch {
	case i == len(s.segs) || s.segs[i] != v.seg:
		return segView{}, false
	case v.seg.size > pos:
		return viewLocked(v.seg), true
	case i+1 < len(s.segs):
		return viewLocked(s.segs[i+1]), true
	}
	return segView{}, false
}

func (s *Store) releaseView(v segView) {
	if v.seg == nil {
		return
	}
	if err := v.seg.release(); err != nil {
		s.log.Warn("close segment file", "segment", v.seg.name(), "error", err)
	}
}

// seek returns the position of a frame of v at or before the data frame
// holding from, with no data frame in between (so skipping control frames
// from there reaches it), and what that frame continues. The sparse index
// gives the nearest earlier frame, and a verifying walk covers the rest
// (about IndexIntervalBytes).
func (s *Store) seek(v segView, from uint64) (int64, seq, error) {
	e := floorEntry(v.entries, from-v.seg.baseOffset)
	pos, q := int64(e.position), entrySeq(v.seg, e)
	if q.offset == from {
		return pos, q, nil
	}
	w, buf := s.walker(v.seg.f, pos, v.size)
	defer s.releaseWalker(&w, buf)
	for {
		_, h, err := w.next()
		framePos := w.at
		if err != nil {
			if err == io.EOF {
				err = fmt.Errorf("offset %d not found before the end of the segment", from)
			}
			return 0, seq{}, s.readError(v.seg, framePos, q.offset, err)
		}
		if err := q.check(h); err != nil {
			return 0, seq{}, s.corruption(v.seg, framePos, q.offset, err)
		}
		if from < h.NextOffset() {
			return framePos, q, nil
		}
		q.advance(h)
	}
}

// walker returns a frameWalker over f from pos to end reading through a
// pooled buffer; hand both to releaseWalker when done.
func (s *Store) walker(f vfs.File, pos, end int64) (frameWalker, *[]byte) {
	buf := s.getBuf()
	return frameWalker{f: f, keys: s.cfg.Keyring, buf: (*buf)[:0], pos: pos, end: end,
		chunk: min(s.cfg.IndexIntervalBytes+batch.HeaderSize, readChunkBytes)}, buf
}

// releaseWalker returns the buffer of w (which may have grown) to the pool.
func (s *Store) releaseWalker(w *frameWalker, buf *[]byte) {
	*buf = w.buf
	s.putBuf(buf)
}

// collect appends to out the frames of v from pos (a frame boundary where
// q holds) that rs keeps, until rs, maxBytes or the end of the snapshot
// stops it, reading straight into out's spare capacity with as few preads
// as the budget allows, verifying each frame and moving the kept ones
// together over the skipped ones. stop reports that rs or maxBytes ended
// the read. Skipped frames count against maxBytes when deciding whether
// to stop after a kept one, so a read may return less than maxBytes.
func (s *Store) collect(out []byte, v segView, pos int64, q seq, rs readSpec, maxBytes int) (
	_ []byte, _ int64, _ seq, stop bool, _ error,
) {
	need := 0 // bytes of a frame that did not fit the previous chunk
	for pos < v.size {
		budget := maxBytes - len(out)
		if (len(out) > 0 && budget < batch.HeaderSize) || rs.stopAt(q) {
			return out, pos, q, true, nil
		}
		want := max(budget, batch.HeaderSize, need)
		if len(out) == 0 {
			// The first frame is returned whatever the budget: read enough
			// to hold a typical one in this same pread.
			want = max(want, firstReadBytes)
		}
		want = int(min(int64(want), v.size-pos))
		out = slices.Grow(out, want)
		chunk := out[len(out) : len(out)+want]
		if err := readFull(v.seg.f, chunk, pos); err != nil {
			return out, pos, q, false, s.readError(v.seg, pos, q.offset, err)
		}
		need = 0
		p, w := 0, 0 // chunk bytes walked, and bytes kept (at the chunk's front)
		for p < want {
			if rs.stopAt(q) {
				stop = true
				break
			}
			size, err := unitSize(chunk[p:])
			if errors.Is(err, batch.ErrShort) && pos+int64(p)+4 <= v.size {
				break // the length field straddles the chunk: read on from p
			}
			if err == nil && pos+int64(p+size) > v.size {
				err = errFrameCrossesEnd
			}
			if err != nil {
				return out, pos, q, false, s.corruption(v.seg, pos+int64(p), q.offset, err)
			}
			if kept := len(out) + w; kept > 0 && kept+size > maxBytes {
				stop = true
				break
			}
			if p+size > want {
				need = size // read on from p, with room for the whole frame
				break
			}
			// Opening a sealed unit decrypts it in place: the frame lies
			// inside the unit, at or after w, so moving it down is safe.
			frame, h, err := openUnit(s.cfg.Keyring, chunk[p:p+size])
			if err == nil {
				err = q.check(h)
			}
			if err != nil {
				return out, pos, q, false, s.readError(v.seg, pos+int64(p), q.offset, err)
			}
			if rs.stopBefore(h) {
				stop = true
				break
			}
			if rs.keep(h) {
				copy(chunk[w:], frame)
				w += len(frame)
			}
			q.advance(h)
			p += size
		}
		out = out[:len(out)+w]
		pos += int64(p)
		if stop {
			return out, pos, q, true, nil
		}
	}
	return out, pos, q, false, nil
}

// readError turns a failed read of a frame into the error to return: a
// CorruptionError if the bytes are bad or missing, the I/O error otherwise.
func (s *Store) readError(g *segment, pos int64, offset uint64, err error) error {
	if errors.Is(err, batch.ErrCorrupt) || errors.Is(err, batch.ErrShort) || errors.Is(err, errFileShrunk) ||
		errors.Is(err, errOutOfSequence) || errors.Is(err, errEmptyBatch) ||
		errors.Is(err, errIndexSequence) || errors.Is(err, errTermDecreases) {
		return s.corruption(g, pos, offset, err)
	}
	return fmt.Errorf("segment: read %s at position %d: %w", g.name(), pos, err)
}

// readFull fills b from f at pos; a file ending early is errFileShrunk.
func readFull(f vfs.File, b []byte, pos int64) error {
	n, err := f.ReadAt(b, pos)
	if n == len(b) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = fmt.Errorf("%w: %d of %d bytes at position %d", errFileShrunk, n, len(b), pos)
	}
	return err
}

// OffsetForTime returns the first offset whose batch was appended at or
// after tUnixNanos, or NextOffset() if there is none. Control frames count
// as the records after them: one appended at or after tUnixNanos yields its
// BaseOffset. It uses the time
// index, then scans (verifying) at most about IndexIntervalBytes. Safe
// concurrently with the appender.
func (s *Store) OffsetForTime(tUnixNanos int64) (uint64, error) {
	s.truncMu.RLock()
	defer s.truncMu.RUnlock()

	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return 0, ErrClosed
	}
	// Append times are non-decreasing, so segments are sorted by their
	// newest one; only the active segment can be empty.
	n := len(s.segs)
	if s.segs[n-1].size == 0 {
		n--
	}
	i := sort.Search(n, func(i int) bool { return s.segs[i].maxAppendTimeUnixNanos >= tUnixNanos })
	if i == n {
		next := s.nextOffset.Load()
		s.mu.RUnlock()
		return next, nil
	}
	v := viewLocked(s.segs[i])
	s.mu.RUnlock()
	defer s.releaseView(v)

	k := sort.Search(len(v.entries), func(k int) bool { return v.entries[k].appendTimeUnixNanos >= tUnixNanos })
	var e indexEntry
	if k > 0 {
		e = v.entries[k-1] // every frame up to it is older than t
	}
	w, buf := s.walker(v.seg.f, int64(e.position), v.size)
	defer s.releaseWalker(&w, buf)
	q := entrySeq(v.seg, e)
	for {
		_, h, err := w.next()
		framePos := w.at
		if err == io.EOF {
			err = fmt.Errorf("no frame at or after time %d although the segment's newest is %d", tUnixNanos, v.maxAppendTimeUnixNanos)
		}
		if err == nil {
			err = q.check(h)
		}
		if err != nil {
			return 0, s.readError(v.seg, framePos, q.offset, err)
		}
		// A control frame's BaseOffset is the offset of the next record,
		// which is no older than it.
		if h.AppendTimeUnixNanos >= tUnixNanos {
			return h.BaseOffset, nil
		}
		q.advance(h)
	}
}

// frameWalker reads the consecutive frames of a segment file from a frame
// boundary, through a window refilled by pread, verifying each frame's
// header and CRC.
type frameWalker struct {
	f      vfs.File
	keys   *atrest.Keyring // opens sealed units; nil: none can be opened
	buf    []byte          // window: file bytes [bufPos, bufPos+len(buf))
	bufPos int64
	// staleEnd: window bytes before it were decrypted in place and are
	// not the file's any more.
	staleEnd int64
	pos      int64 // position of the next frame
	at       int64 // position of the frame next returned last (or failed at)
	end      int64 // bytes of the file that may be read
	// mark is the newest index of the commit marks next stepped over.
	mark  uint64
	chunk int // bytes to read at once (more for a larger frame)
	// throttle, if set, is called with the size of each read before it is
	// made (rewrites bound their I/O with it).
	throttle func(bytes int)
}

// next returns the frame at w.pos and advances past it, opening a sealed
// unit (its size counts in w.pos); w.at is then the frame's position. It
// steps over commit mark frames (batch.TypeMark, see AppendMark), which
// no reader sees, noting the newest index they name in w.mark. The frame
// aliases the window until the next call. It returns io.EOF at w.end, an
// error wrapping batch.ErrShort or batch.ErrCorrupt for a bad frame
// (without advancing past it: w.at and w.pos are its position), and
// other errors for failed reads.
func (w *frameWalker) next() ([]byte, batch.Header, error) {
	for {
		w.at = w.pos
		frame, h, err := w.unit()
		if err != nil || h.Type != batch.TypeMark {
			return frame, h, err
		}
		index, err := batch.DecodeMark(frame)
		if err != nil {
			w.pos = w.at
			return nil, batch.Header{}, err
		}
		w.mark = max(w.mark, index)
	}
}

// unit returns the frame at w.pos and advances past it, as next does, mark
// frames included.
func (w *frameWalker) unit() ([]byte, batch.Header, error) {
	rem := w.end - w.pos
	if rem <= 0 {
		return nil, batch.Header{}, io.EOF
	}
	b, err := w.window(w.pos, int(min(rem, 4)))
	if err != nil {
		return nil, batch.Header{}, err
	}
	size, err := unitSize(b)
	if err != nil {
		return nil, batch.Header{}, err
	}
	if int64(size) > rem {
		return nil, batch.Header{}, errFrameCrossesEnd
	}
	if b, err = w.window(w.pos, size); err != nil {
		return nil, batch.Header{}, err
	}
	frame, h, err := openUnit(w.keys, b)
	if atrest.Sealed(b) {
		// A sealed unit is decrypted in place (and cleared if that fails):
		// the window no longer holds the file's bytes up to its end, which
		// a walker moved back (w.pos set by its user) must read again.
		w.staleEnd = w.pos + int64(size)
	}
	if err != nil {
		return nil, batch.Header{}, err
	}
	w.pos += int64(size)
	return frame, h, nil
}

// window returns file bytes [pos, pos+n), n <= w.end-pos, reading a new
// window of max(n, w.chunk) bytes (within w.end) if the current one does
// not hold them.
func (w *frameWalker) window(pos int64, n int) ([]byte, error) {
	if pos >= w.bufPos && pos >= w.staleEnd && pos+int64(n) <= w.bufPos+int64(len(w.buf)) {
		off := int(pos - w.bufPos)
		return w.buf[off : off+n], nil
	}
	want := int(min(int64(max(n, w.chunk)), w.end-pos))
	if cap(w.buf) < want {
		w.buf = make([]byte, want)
	}
	w.buf = w.buf[:want]
	if w.throttle != nil {
		w.throttle(want)
	}
	if err := readFull(w.f, w.buf, pos); err != nil {
		w.buf = w.buf[:0]
		return nil, err
	}
	w.bufPos, w.staleEnd = pos, 0
	return w.buf[:n], nil
}
