package segment

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/geolog/geolog/batch"
)

// logModel is the dumb model of a store: its segments, each a list of
// frames, following the store's documented rules for rolling, truncating
// and deleting.
type logModel struct {
	segmentBytesMax int64
	segs            []modelSegment
}

type modelSegment struct {
	base   uint64
	frames []modelFrame
}

type modelFrame struct {
	b []byte
	h batch.Header
}

func newLogModel(segmentBytesMax int64, base uint64) *logModel {
	return &logModel{segmentBytesMax: segmentBytesMax, segs: []modelSegment{{base: base}}}
}

func (g modelSegment) next() uint64 {
	if len(g.frames) == 0 {
		return g.base
	}
	return g.frames[len(g.frames)-1].h.NextOffset()
}

func (g modelSegment) size() int64 {
	var n int64
	for _, f := range g.frames {
		n += int64(len(f.b))
	}
	return n
}

func (g modelSegment) hasRecords() bool { return g.next() > g.base }

// all returns every frame, oldest first.
func (m *logModel) all() []modelFrame {
	var out []modelFrame
	for _, g := range m.segs {
		out = append(out, g.frames...)
	}
	return out
}

func (m *logModel) active() *modelSegment { return &m.segs[len(m.segs)-1] }
func (m *logModel) start() uint64         { return m.segs[0].base }
func (m *logModel) next() uint64          { return m.active().next() }

func (m *logModel) size() int64 {
	var n int64
	for _, g := range m.segs {
		n += g.size()
	}
	return n
}

// indexBounds returns the first and last Raft index held (0, 0 if none)
// and the term at the last.
func (m *logModel) indexBounds() (first, last, lastTerm uint64) {
	for _, f := range m.all() {
		if f.h.Index != 0 {
			if first == 0 {
				first = f.h.Index
			}
			last, lastTerm = f.h.Index, f.h.Term
		}
	}
	return first, last, lastTerm
}

// lastTime returns the newest append time held, or math.MinInt64.
func (m *logModel) lastTime() int64 {
	t := int64(math.MinInt64)
	for _, f := range m.all() {
		t = f.h.AppendTimeUnixNanos
	}
	return t
}

// appendErr says whether the store must refuse frame h (nil if it must
// take it), under Append's documented rules.
func (m *logModel) appendErr(h batch.Header, lastTime int64) error {
	_, last, lastTerm := m.indexBounds()
	switch {
	case h.BaseOffset != m.next(),
		h.RecordCount == 0 && !h.IsControl(),
		h.AppendTimeUnixNanos < lastTime,
		last != 0 && h.Index != last+1,
		last != 0 && h.Term < lastTerm:
		return ErrInvalidFrame
	}
	return nil
}

// add appends a frame the store took, rolling as the store does.
func (m *logModel) add(b []byte) {
	h, err := batch.DecodeHeader(b)
	if err != nil {
		panic(err)
	}
	if a := m.active(); a.hasRecords() && a.size()+int64(len(b)) > m.segmentBytesMax {
		m.segs = append(m.segs, modelSegment{base: m.next()})
	}
	a := m.active()
	a.frames = append(a.frames, modelFrame{b: b, h: h})
}

// cutAt drops segment i's frames from j on and every later segment.
func (m *logModel) cutAt(i, j int) {
	m.segs = m.segs[:i+1]
	m.segs[i].frames = slices.Clone(m.segs[i].frames[:j])
}

// truncateOffset mirrors TruncateSuffix.
func (m *logModel) truncateOffset(off uint64) error {
	if off < m.start() || off > m.next() {
		return ErrOutOfRange
	}
	for _, f := range m.all() {
		if f.h.BaseOffset < off && off < f.h.NextOffset() {
			return ErrNotBoundary
		}
	}
	i := slices.IndexFunc(m.segs, func(g modelSegment) bool { return g.next() >= off })
	if j := slices.IndexFunc(m.segs[i].frames, func(f modelFrame) bool { return f.h.BaseOffset >= off }); j >= 0 {
		m.cutAt(i, j)
	} else if i+1 < len(m.segs) {
		m.cutAt(i+1, 0)
	}
	return nil
}

// truncateIndex mirrors TruncateSuffixAtIndex.
func (m *logModel) truncateIndex(index uint64) error {
	first, last, _ := m.indexBounds()
	switch {
	case index == 0:
		return ErrOutOfRange
	case first == 0 || index > last:
		return nil
	case index < first:
		return ErrOutOfRange
	}
	for i, g := range m.segs {
		for j, f := range g.frames {
			if f.h.Index == index {
				m.cutAt(i, j)
				return nil
			}
		}
	}
	panic("index not found")
}

// deletePrefix mirrors DeletePrefix.
func (m *logModel) deletePrefix(off uint64) error {
	if off > m.next() {
		return ErrOutOfRange
	}
	if off == m.next() && m.active().hasRecords() {
		m.segs = append(m.segs, modelSegment{base: off})
	}
	for len(m.segs) > 1 && m.segs[0].next() <= off {
		m.segs = m.segs[1:]
	}
	return nil
}

// applyRetention mirrors ApplyRetention with the given cutoff (append
// times below it have expired; math.MinInt64 for none) and byte bound.
func (m *logModel) applyRetention(cutoff int64, retentionBytes int64) {
	expired := func(g modelSegment) bool {
		return len(g.frames) > 0 && g.frames[len(g.frames)-1].h.AppendTimeUnixNanos < cutoff
	}
	if cutoff != math.MinInt64 {
		if a := *m.active(); expired(a) && a.hasRecords() {
			m.segs = append(m.segs, modelSegment{base: m.next()})
		}
		for len(m.segs) > 1 && expired(m.segs[0]) {
			m.segs = m.segs[1:]
		}
	}
	if retentionBytes > 0 {
		for len(m.segs) > 1 && m.size() > retentionBytes {
			m.segs = m.segs[1:]
		}
	}
}

// checkStore compares every query of s with the model. Unless full, only
// the bounds and the segment files.
func (m *logModel) checkStore(s *Store, full bool) error {
	first, last, _ := m.indexBounds()
	if got, want := [5]uint64{s.StartOffset(), s.NextOffset(), s.FirstIndex(), s.LastIndex(), uint64(s.Size())},
		[5]uint64{m.start(), m.next(), first, last, uint64(m.size())}; got != want {
		return fmt.Errorf("start, next, first index, last index, size = %v, want %v", got, want)
	}
	var bases []uint64
	for _, g := range m.segs {
		bases = append(bases, g.base)
	}
	ents, err := s.fs.ReadDir(s.cfg.Dir)
	if err != nil {
		return err
	}
	var files []uint64
	for _, e := range ents {
		if base, suffix, ok := parseSegmentName(e.Name()); ok && suffix == logSuffix {
			files = append(files, base)
		}
	}
	if !slices.Equal(files, bases) {
		return fmt.Errorf("segment files %v, want %v", files, bases)
	}
	if !full {
		return nil
	}
	return m.checkReads(s)
}

// checkReads checks ReadFrames, ReadFramesByIndex, TermAt and
// OffsetForTime against the model.
func (m *logModel) checkReads(s *Store) error {
	all := m.all()
	first, last, _ := m.indexBounds()
	var data, indexed []modelFrame
	for _, f := range all {
		if !f.h.IsControl() {
			data = append(data, f)
		}
		if f.h.Index != 0 {
			indexed = append(indexed, f)
		}
	}
	join := func(fs []modelFrame) []byte {
		var out []byte
		for _, f := range fs {
			out = append(out, f.b...)
		}
		return out
	}

	// By offset: the data frame holding each offset, alone with maxBytes
	// 0, and the whole log in pieces.
	for k, f := range data {
		// Its first and its last offset.
		for _, off := range []uint64{f.h.BaseOffset, f.h.NextOffset() - 1} {
			got, err := s.ReadFrames(off, 0, math.MaxUint64)
			if err != nil || !bytes.Equal(got, f.b) {
				return fmt.Errorf("ReadFrames(%d, 0): %d bytes, %v; want data frame %d (%d bytes)", off, len(got), err, k, len(f.b))
			}
		}
	}
	if got, err := s.ReadFrames(m.next(), 100, math.MaxUint64); got != nil || err != nil {
		return fmt.Errorf("ReadFrames(next) = %d bytes, %v", len(got), err)
	}
	if _, err := s.ReadFrames(m.next()+1, 100, math.MaxUint64); !errors.Is(err, ErrOutOfRange) {
		return fmt.Errorf("ReadFrames(next+1): %v", err)
	}
	if m.start() > 0 {
		if _, err := s.ReadFrames(m.start()-1, 100, math.MaxUint64); !errors.Is(err, ErrOutOfRange) {
			return fmt.Errorf("ReadFrames(start-1): %v", err)
		}
	}
	for _, maxBytes := range []int{1, 300, 1 << 20} {
		var got []byte
		for off := m.start(); off < m.next(); {
			b, err := s.ReadFrames(off, maxBytes, math.MaxUint64)
			if err != nil || len(b) == 0 {
				return fmt.Errorf("ReadFrames(%d, %d) in pieces: %d bytes, %v", off, maxBytes, len(b), err)
			}
			got = append(got, b...)
			for len(b) > 0 {
				h, _ := batch.DecodeHeader(b)
				size, _ := batch.FrameSize(b)
				off, b = h.NextOffset(), b[size:]
			}
		}
		if want := join(data); !bytes.Equal(got, want) {
			return fmt.Errorf("reading by offset in %d-byte pieces: %d bytes, want %d", maxBytes, len(got), len(want))
		}
	}
	// endOffset bounds reads, control frames at it included.
	if len(data) > 1 {
		end := data[len(data)/2].h.BaseOffset
		got, err := s.ReadFrames(m.start(), math.MaxInt, end)
		if want := join(data[:len(data)/2]); err != nil || !bytes.Equal(got, want) {
			return fmt.Errorf("ReadFrames(start, max, %d): %d bytes, %v; want %d", end, len(got), err, len(want))
		}
	}

	// By index.
	for k, f := range indexed {
		i := f.h.Index
		got, err := s.ReadFramesByIndex(i, i+1, 0)
		if err != nil || !bytes.Equal(got, f.b) {
			return fmt.Errorf("ReadFramesByIndex(%d, %d): %d bytes, %v", i, i+1, len(got), err)
		}
		if k%7 == 0 {
			got, err = s.ReadFramesByIndex(i, last+1, math.MaxInt)
			if want := join(indexed[k:]); err != nil || !bytes.Equal(got, want) {
				return fmt.Errorf("ReadFramesByIndex(%d, %d, max): %d bytes, %v; want %d", i, last+1, len(got), err, len(want))
			}
		}
		if term, err := s.TermAt(i); err != nil || term != f.h.Term {
			return fmt.Errorf("TermAt(%d) = %d, %v; want %d", i, term, err, f.h.Term)
		}
	}
	for _, maxBytes := range []int{1, 300} {
		var got []byte
		for i := first; i != 0 && i <= last; {
			b, err := s.ReadFramesByIndex(i, last+1, maxBytes)
			if err != nil || len(b) == 0 {
				return fmt.Errorf("ReadFramesByIndex(%d, %d, %d) in pieces: %d bytes, %v", i, last+1, maxBytes, len(b), err)
			}
			got = append(got, b...)
			for len(b) > 0 {
				h, _ := batch.DecodeHeader(b)
				size, _ := batch.FrameSize(b)
				i, b = h.Index+1, b[size:]
			}
		}
		if want := join(indexed); !bytes.Equal(got, want) {
			return fmt.Errorf("reading by index in %d-byte pieces: %d bytes, want %d", maxBytes, len(got), len(want))
		}
	}
	if first != 0 && last > first {
		mid := first + (last-first)/2
		got, err := s.ReadFramesByIndex(first, mid, math.MaxInt)
		if want := join(indexed[:mid-first]); err != nil || !bytes.Equal(got, want) {
			return fmt.Errorf("ReadFramesByIndex(%d, %d): %d bytes, %v", first, mid, len(got), err)
		}
	}
	bad := [][2]uint64{{last + 1, last + 2}, {first, last + 2}, {0, 1}}
	if first > 1 {
		bad = append(bad, [2]uint64{first - 1, first})
	}
	for _, r := range bad {
		if _, err := s.ReadFramesByIndex(r[0], r[1], 100); !errors.Is(err, ErrOutOfRange) {
			return fmt.Errorf("ReadFramesByIndex(%d, %d) with indexes [%d, %d]: %v", r[0], r[1], first, last, err)
		}
	}
	if got, err := s.ReadFramesByIndex(last+5, last+5, 100); got != nil || err != nil {
		return fmt.Errorf("ReadFramesByIndex(lo == hi): %d bytes, %v", len(got), err)
	}
	for _, i := range []uint64{0, last + 1, first - 1} {
		if i >= first && i <= last && i != 0 {
			continue
		}
		if _, err := s.TermAt(i); !errors.Is(err, ErrOutOfRange) {
			return fmt.Errorf("TermAt(%d) with indexes [%d, %d]: %v", i, first, last, err)
		}
	}

	// By time: the first frame (of any type) appended at or after t.
	if len(all) > 0 {
		lo, hi := all[0].h.AppendTimeUnixNanos-2, all[len(all)-1].h.AppendTimeUnixNanos+2
		for t := lo; t <= hi; t += 1 + (hi-lo)/16 {
			want := m.next()
			for _, f := range all {
				if f.h.AppendTimeUnixNanos >= t {
					want = f.h.BaseOffset
					break
				}
			}
			if got, err := s.OffsetForTime(t); err != nil || got != want {
				return fmt.Errorf("OffsetForTime(%d) = %d, %v; want %d", t, got, err, want)
			}
		}
	}
	return nil
}
