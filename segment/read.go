package segment

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"

	"github.com/geolog/geolog/batch"
)

var (
	// errFrameCrossesEnd marks a frame whose length runs past the bytes the
	// reader may read.
	errFrameCrossesEnd = fmt.Errorf("%w: frame runs past the end of the segment", batch.ErrShort)
	// errFileShrunk marks a segment file shorter than the bytes the store
	// wrote to it.
	errFileShrunk = errors.New("segment file is shorter than the store wrote")
	// errOutOfSequence marks a CRC-valid frame at the wrong offset.
	errOutOfSequence = errors.New("frame is out of sequence")
	// errEmptyBatch marks a CRC-valid frame without records, which Append
	// never writes.
	errEmptyBatch = errors.New("frame holds no records")
)

// ReadFrames returns whole, CRC-verified frames in offset order, starting
// with the frame that holds offset from and stopping before any frame with
// BaseOffset >= endOffset, at the end of the log, or before the frame that
// would take the result past maxBytes (clamped to [0, ReadBytesMax]).
// The first qualifying frame is returned even if it alone exceeds maxBytes,
// so a reader always progresses. The caller owns the returned slice.
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
	defer func() { s.releaseView(v) }()

	pos, expect, err := s.seek(v, from)
	if err != nil {
		return nil, err
	}
	var out []byte
	for {
		if out == nil {
			out = make([]byte, 0, min(int64(max(maxBytes, firstReadBytes)), v.size-pos))
		}
		var stop bool
		out, pos, expect, stop, err = s.collect(out, v, pos, expect, maxBytes, endOffset)
		if err != nil || stop {
			break
		}
		// The snapshot of this segment is used up. Continue with whatever
		// now holds expect: more of the same segment, the next one after a
		// roll, or nothing (end of log, or this segment deleted).
		nv, verr := s.viewContaining(expect)
		if verr != nil || nv.seg == nil {
			break
		}
		switch {
		case nv.seg == v.seg && nv.size > pos:
		case nv.seg != v.seg && nv.seg.baseOffset == expect:
			pos = 0
		default:
			s.releaseView(nv)
			nv = segView{}
		}
		if nv.seg == nil {
			break
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

func (s *Store) releaseView(v segView) {
	if v.seg == nil {
		return
	}
	if err := v.seg.release(); err != nil {
		s.log.Warn("close segment file", "segment", v.seg.name(), "error", err)
	}
}

// seek returns the position and base offset of the frame of v that holds
// from: the sparse index gives the nearest earlier frame, and a verifying
// walk covers the rest (about IndexIntervalBytes).
func (s *Store) seek(v segView, from uint64) (int64, uint64, error) {
	e := floorEntry(v.entries, from-v.seg.baseOffset)
	pos, expect := int64(e.position), v.seg.baseOffset+uint64(e.relOffset)
	if expect == from {
		return pos, expect, nil
	}
	buf := s.getBuf()
	defer s.putBuf(buf)
	w := frameWalker{f: v.seg.f, buf: (*buf)[:0], pos: pos, end: v.size,
		chunk: min(s.cfg.IndexIntervalBytes+batch.HeaderSize, readChunkBytes)}
	defer func() { *buf = w.buf }()
	for {
		framePos := w.pos
		_, h, err := w.next()
		if err != nil {
			if err == io.EOF {
				err = fmt.Errorf("offset %d not found before the end of the segment", from)
			}
			return 0, 0, s.readError(v.seg, framePos, expect, err)
		}
		if err := checkSequence(h, expect); err != nil {
			return 0, 0, s.corruption(v.seg, framePos, expect, err)
		}
		if from < h.NextOffset() {
			return framePos, h.BaseOffset, nil
		}
		expect = h.NextOffset()
	}
}

// collect appends to out the frames of v from pos (a frame boundary holding
// offset expect) until endOffset, maxBytes or the end of the snapshot,
// reading straight into out's spare capacity with as few preads as the
// budget allows and verifying each frame. stop reports that endOffset or
// maxBytes ended the read.
func (s *Store) collect(out []byte, v segView, pos int64, expect uint64, maxBytes int, endOffset uint64) (
	_ []byte, _ int64, _ uint64, stop bool, _ error,
) {
	need := 0 // bytes of a first frame larger than the budget
	for pos < v.size {
		budget := maxBytes - len(out)
		if len(out) > 0 && budget < batch.HeaderSize {
			return out, pos, expect, true, nil
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
			return out, pos, expect, false, s.readError(v.seg, pos, expect, err)
		}
		q := 0
		for q < want {
			if expect >= endOffset {
				stop = true
				break
			}
			size, err := batch.FrameSize(chunk[q:])
			if errors.Is(err, batch.ErrShort) && pos+int64(q)+4 <= v.size {
				break // the length field straddles the chunk: read on from q
			}
			if err == nil && pos+int64(q+size) > v.size {
				err = errFrameCrossesEnd
			}
			if err != nil {
				return out, pos, expect, false, s.corruption(v.seg, pos+int64(q), expect, err)
			}
			if len(out)+q > 0 && len(out)+q+size > maxBytes {
				stop = true
				break
			}
			if q+size > want {
				// Only the first frame of the result can outgrow the
				// budget; read exactly it next.
				if len(out)+q != 0 {
					panic(fmt.Sprintf("segment: frame of %d bytes at %d outgrew a chunk of %d within budget", size, q, want))
				}
				need = size
				break
			}
			h, err := batch.DecodeHeader(chunk[q : q+size])
			if err == nil {
				err = checkSequence(h, expect)
			}
			if err != nil {
				return out, pos, expect, false, s.corruption(v.seg, pos+int64(q), expect, err)
			}
			q += size
			expect = h.NextOffset()
		}
		out = out[:len(out)+q]
		pos += int64(q)
		if stop {
			return out, pos, expect, true, nil
		}
	}
	return out, pos, expect, false, nil
}

// checkSequence checks a CRC-valid frame against the offset it must start
// at.
func checkSequence(h batch.Header, expect uint64) error {
	if h.BaseOffset != expect {
		return fmt.Errorf("%w: base offset %d", errOutOfSequence, h.BaseOffset)
	}
	if h.RecordCount == 0 {
		return errEmptyBatch
	}
	return nil
}

// readError turns a failed read of a frame into the error to return: a
// CorruptionError if the bytes are bad or missing, the I/O error otherwise.
func (s *Store) readError(g *segment, pos int64, offset uint64, err error) error {
	if errors.Is(err, batch.ErrCorrupt) || errors.Is(err, batch.ErrShort) || errors.Is(err, errFileShrunk) ||
		errors.Is(err, errOutOfSequence) || errors.Is(err, errEmptyBatch) {
		return s.corruption(g, pos, offset, err)
	}
	return fmt.Errorf("segment: read %s at position %d: %w", g.name(), pos, err)
}

// readFull fills b from f at pos; a file ending early is errFileShrunk.
func readFull(f *os.File, b []byte, pos int64) error {
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
// after tUnixNanos, or NextOffset() if there is none. It uses the time
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
	buf := s.getBuf()
	defer s.putBuf(buf)
	w := frameWalker{f: v.seg.f, buf: (*buf)[:0], pos: int64(e.position), end: v.size,
		chunk: min(s.cfg.IndexIntervalBytes+batch.HeaderSize, readChunkBytes)}
	defer func() { *buf = w.buf }()
	expect := v.seg.baseOffset + uint64(e.relOffset)
	for {
		framePos := w.pos
		_, h, err := w.next()
		if err == io.EOF {
			err = fmt.Errorf("no batch at or after time %d although the segment's newest is %d", tUnixNanos, v.maxAppendTimeUnixNanos)
		}
		if err == nil {
			err = checkSequence(h, expect)
		}
		if err != nil {
			return 0, s.readError(v.seg, framePos, expect, err)
		}
		if h.AppendTimeUnixNanos >= tUnixNanos {
			return h.BaseOffset, nil
		}
		expect = h.NextOffset()
	}
}

// frameWalker reads the consecutive frames of a segment file from a frame
// boundary, through a window refilled by pread, verifying each frame's
// header and CRC.
type frameWalker struct {
	f      *os.File
	buf    []byte // window: file bytes [bufPos, bufPos+len(buf))
	bufPos int64
	pos    int64 // position of the next frame
	end    int64 // bytes of the file that may be read
	chunk  int   // bytes to read at once (more for a larger frame)
}

// next returns the frame at w.pos and advances past it. The frame aliases
// the window until the next call. It returns io.EOF at w.end, an error
// wrapping batch.ErrShort or batch.ErrCorrupt for a bad frame (without
// advancing), and other errors for failed reads.
func (w *frameWalker) next() ([]byte, batch.Header, error) {
	rem := w.end - w.pos
	if rem <= 0 {
		return nil, batch.Header{}, io.EOF
	}
	b, err := w.window(w.pos, int(min(rem, 4)))
	if err != nil {
		return nil, batch.Header{}, err
	}
	size, err := batch.FrameSize(b)
	if err != nil {
		return nil, batch.Header{}, err
	}
	if int64(size) > rem {
		return nil, batch.Header{}, errFrameCrossesEnd
	}
	if b, err = w.window(w.pos, size); err != nil {
		return nil, batch.Header{}, err
	}
	h, err := batch.DecodeHeader(b)
	if err != nil {
		return nil, batch.Header{}, err
	}
	w.pos += int64(size)
	return b, h, nil
}

// window returns file bytes [pos, pos+n), n <= w.end-pos, reading a new
// window of max(n, w.chunk) bytes (within w.end) if the current one does
// not hold them.
func (w *frameWalker) window(pos int64, n int) ([]byte, error) {
	if pos >= w.bufPos && pos+int64(n) <= w.bufPos+int64(len(w.buf)) {
		off := int(pos - w.bufPos)
		return w.buf[off : off+n], nil
	}
	want := int(min(int64(max(n, w.chunk)), w.end-pos))
	if cap(w.buf) < want {
		w.buf = make([]byte, want)
	}
	w.buf = w.buf[:want]
	if err := readFull(w.f, w.buf, pos); err != nil {
		w.buf = w.buf[:0]
		return nil, err
	}
	w.bufPos = pos
	return w.buf[:n], nil
}
