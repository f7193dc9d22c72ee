package segment

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/geolog/geolog/batch"
)

// dataFrame is makeFrame carrying a Raft term and index.
func dataFrame(base uint64, n int, appendTime int64, term, index uint64) []byte {
	f := makeFrame(base, n, appendTime)
	batch.PatchRaft(f, term, index)
	return f
}

// controlFrame is a noop or config frame at base.
func controlFrame(typ batch.Type, base uint64, appendTime int64, term, index uint64, payload []byte) []byte {
	return batch.EncodeControl(nil, batch.Header{Type: typ, BaseOffset: base, Epoch: 1,
		AppendTimeUnixNanos: appendTime, Term: term, Index: index}, payload)
}

func sameErr(got, want error) bool {
	if want == nil {
		return got == nil
	}
	return errors.Is(got, want)
}

func TestControlFrames(t *testing.T) { forEachFS(t, testControlFrames) }

func testControlFrames(t *testing.T, e env) {
	cfg := smallConfig(t, e)
	c := &syncCounter{}
	cfg.testHooks.fdatasync = c.fdatasync
	s := mustOpen(t, cfg)
	m := newLogModel(cfg.SegmentBytesMax, 0)
	add := func(frame []byte) {
		t.Helper()
		if err := s.Append(frame); err != nil {
			t.Fatalf("Append: %v", err)
		}
		m.add(frame)
	}
	// A log that starts with control frames: they take no offset.
	add(controlFrame(batch.TypeNoop, 0, 1, 1, 1, nil))
	add(controlFrame(batch.TypeConfig, 0, 1, 1, 2, []byte("conf")))
	if s.NextOffset() != 0 || s.StartOffset() != 0 || s.FirstIndex() != 1 || s.LastIndex() != 2 {
		t.Fatalf("next %d start %d indexes [%d, %d]", s.NextOffset(), s.StartOffset(), s.FirstIndex(), s.LastIndex())
	}
	if got, err := s.ReadFrames(0, 1<<20, math.MaxUint64); got != nil || err != nil {
		t.Fatalf("ReadFrames of control frames only: %d bytes, %v", len(got), err)
	}
	// Appending a control frame needs a Sync like anything else.
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	index := uint64(3)
	for i := range 60 {
		term := uint64(1 + i/20)
		add(dataFrame(s.NextOffset(), 1+i%3, int64(2+i), term, index))
		index++
		if i%4 == 0 {
			add(controlFrame(batch.TypeNoop, s.NextOffset(), int64(2+i), term, index, nil))
			index++
		}
	}
	if err := m.checkStore(s, true); err != nil {
		t.Fatal(err)
	}
	// A control frame takes no offset, yet Sync must fdatasync it.
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	syncs := c.count()
	add(controlFrame(batch.TypeConfig, s.NextOffset(), 100, 3, index, []byte{2, 1}))
	index++
	if s.DurableOffset() != s.NextOffset() {
		t.Fatalf("DurableOffset %d, NextOffset %d", s.DurableOffset(), s.NextOffset())
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if c.count() != syncs+1 {
		t.Fatalf("Sync after a control frame ran %d fdatasyncs", c.count()-syncs)
	}
	if err := s.Sync(); err != nil || c.count() != syncs+1 {
		t.Fatalf("idle Sync: %v, %d fdatasyncs", err, c.count()-syncs)
	}
	for _, reopen := range []bool{false, true} {
		if reopen {
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			var recovered int
			cfg.OnRecover = func(batch.Header) error { recovered++; return nil }
			s = mustOpen(t, cfg)
			if recovered != len(m.all()) {
				t.Fatalf("OnRecover saw %d frames, want %d", recovered, len(m.all()))
			}
		}
		if err := m.checkStore(s, true); err != nil {
			t.Fatalf("reopen %v: %v", reopen, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestAppendChecksRaftIndexes(t *testing.T) { forEachFS(t, testAppendChecksRaftIndexes) }

func testAppendChecksRaftIndexes(t *testing.T, e env) {
	s := mustOpen(t, smallConfig(t, e))
	defer s.Close()
	// Unindexed frames, then the first indexed frame at any index.
	for _, f := range [][]byte{makeFrame(0, 2, 0), controlFrame(batch.TypeNoop, 2, 0, 0, 0, nil)} {
		if err := s.Append(f); err != nil {
			t.Fatal(err)
		}
	}
	if s.FirstIndex() != 0 || s.LastIndex() != 0 {
		t.Fatalf("indexes [%d, %d] on an unindexed log", s.FirstIndex(), s.LastIndex())
	}
	if _, err := s.TermAt(1); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("TermAt on an unindexed log: %v", err)
	}
	if err := s.TruncateSuffixAtIndex(5); err != nil {
		t.Fatalf("TruncateSuffixAtIndex on an unindexed log: %v", err)
	}
	if err := s.Append(dataFrame(2, 1, 0, 4, 500)); err != nil {
		t.Fatalf("first indexed frame: %v", err)
	}
	if s.FirstIndex() != 500 || s.LastIndex() != 500 {
		t.Fatalf("indexes [%d, %d]", s.FirstIndex(), s.LastIndex())
	}
	for name, f := range map[string][]byte{
		"index gap":          dataFrame(3, 1, 0, 4, 502),
		"index repeated":     dataFrame(3, 1, 0, 4, 500),
		"index 0 after":      makeFrame(3, 1, 0),
		"term decreases":     dataFrame(3, 1, 0, 3, 501),
		"control index gap":  controlFrame(batch.TypeNoop, 3, 0, 4, 503, nil),
		"control wrong base": controlFrame(batch.TypeConfig, 2, 0, 4, 501, []byte("x")),
		"empty data frame":   batch.Encode(nil, batch.Header{BaseOffset: 3}, nil),
		"max index":          dataFrame(3, 1, 0, 4, math.MaxUint64),
	} {
		if err := s.Append(f); !errors.Is(err, ErrInvalidFrame) {
			t.Errorf("%s: Append err = %v, want ErrInvalidFrame", name, err)
		}
	}
	if err := s.Append(dataFrame(3, 1, 0, 9, 501)); err != nil {
		t.Fatalf("next index, higher term: %v", err)
	}
	if term, err := s.TermAt(500); err != nil || term != 4 {
		t.Fatalf("TermAt(500) = %d, %v", term, err)
	}
	if term, err := s.TermAt(501); err != nil || term != 9 {
		t.Fatalf("TermAt(501) = %d, %v", term, err)
	}
	// Dropping every indexed frame leaves an unindexed log that takes any
	// index again, with any term.
	if err := s.TruncateSuffixAtIndex(499); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("truncate below FirstIndex: %v", err)
	}
	if err := s.TruncateSuffixAtIndex(500); err != nil {
		t.Fatal(err)
	}
	if s.NextOffset() != 2 || s.FirstIndex() != 0 || s.LastIndex() != 0 {
		t.Fatalf("after dropping the indexed suffix: next %d indexes [%d, %d]", s.NextOffset(), s.FirstIndex(), s.LastIndex())
	}
	if err := s.Append(dataFrame(2, 1, 0, 1, 7)); err != nil {
		t.Fatalf("new indexed suffix: %v", err)
	}
}

func TestReadFramesByIndexBudget(t *testing.T) { forEachFS(t, testReadFramesByIndexBudget) }

func testReadFramesByIndexBudget(t *testing.T, e env) {
	// Frames larger than a read chunk and than maxBytes, by index, with
	// control frames between them.
	s := mustOpen(t, smallConfig(t, e))
	defer s.Close()
	var frames [][]byte
	index := uint64(10)
	for i, n := range []int{1, 3000, 2, 5000, 1} {
		f := dataFrame(s.NextOffset(), n, int64(i), 1, index)
		big := controlFrame(batch.TypeConfig, s.NextOffset()+uint64(n), int64(i), 1, index+1, bytes.Repeat([]byte{byte(i)}, 70<<10))
		for _, fr := range [][]byte{f, big} {
			if err := s.Append(fr); err != nil {
				t.Fatal(err)
			}
			frames = append(frames, fr)
		}
		index += 2
	}
	for lo := range len(frames) {
		for _, maxBytes := range []int{0, 1, len(frames[lo]), len(frames[lo]) + 100, 200 << 10, math.MaxInt} {
			got, err := s.ReadFramesByIndex(uint64(10+lo), index, maxBytes)
			if err != nil {
				t.Fatal(err)
			}
			want := frames[lo]
			for k := lo + 1; k < len(frames) && len(want)+len(frames[k]) <= clampRead(maxBytes); k++ {
				want = append(bytes.Clone(want), frames[k]...)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("ReadFramesByIndex(%d, %d, %d): %d bytes, want %d", 10+lo, index, maxBytes, len(got), len(want))
			}
		}
	}
	// By offset the large control frames are skipped, even first.
	for off := uint64(0); off < s.NextOffset(); off += 1 + off%61 {
		got, err := s.ReadFrames(off, 1, math.MaxUint64)
		if err != nil {
			t.Fatal(err)
		}
		h, err := batch.DecodeHeader(got)
		if err != nil || h.IsControl() || off < h.BaseOffset || off >= h.NextOffset() {
			t.Fatalf("ReadFrames(%d): %+v, %v", off, h, err)
		}
		if size, _ := batch.FrameSize(got); size != len(got) {
			t.Fatalf("ReadFrames(%d, 1) returned more than the first frame", off)
		}
	}
}

func TestControlOnlySegmentIsNotRolled(t *testing.T) { forEachFS(t, testControlOnlySegmentIsNotRolled) }

func testControlOnlySegmentIsNotRolled(t *testing.T, e env) {
	// Control frames alone never seal a segment (its successor would have
	// the same name); the first record after them rolls.
	cfg := smallConfig(t, e)
	s := mustOpen(t, cfg)
	m := newLogModel(cfg.SegmentBytesMax, 0)
	add := func(f []byte) {
		t.Helper()
		if err := s.Append(f); err != nil {
			t.Fatal(err)
		}
		m.add(f)
	}
	index := uint64(1)
	add(dataFrame(0, 1, 0, 1, index))
	index++
	for range 40 { // far more than SegmentBytesMax
		add(controlFrame(batch.TypeConfig, 1, 0, 1, index, make([]byte, 100)))
		index++
	}
	if err := s.DeletePrefix(1); err != nil { // rolls: the segment holds a record
		t.Fatal(err)
	}
	if err := m.deletePrefix(1); err != nil {
		t.Fatal(err)
	}
	for range 40 {
		add(controlFrame(batch.TypeNoop, 1, 0, 1, index, nil))
		index++
	}
	if files := logFiles(t, cfg); len(files) != 1 || s.Size() < 40*batch.HeaderSize {
		t.Fatalf("files %v, size %d", files, s.Size())
	}
	// Neither DeletePrefix nor retention can roll it either.
	if err := s.DeletePrefix(1); err != nil {
		t.Fatal(err)
	}
	if err := m.deletePrefix(1); err != nil {
		t.Fatal(err)
	}
	add(dataFrame(1, 2, 0, 1, index))
	index++
	add(dataFrame(3, 2, 0, 1, index))
	if err := m.checkStore(s, true); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, cfg)
	defer s.Close()
	if err := m.checkStore(s, true); err != nil {
		t.Fatal(err)
	}
}

func TestTruncateSuffixDropsControlFramesAtOffset(t *testing.T) {
	forEachFS(t, func(t *testing.T, e env) {
		cfg := smallConfig(t, e)
		s := mustOpen(t, cfg)
		defer s.Close()
		frames := [][]byte{
			dataFrame(0, 2, 0, 1, 1),
			controlFrame(batch.TypeNoop, 2, 0, 2, 2, nil),
			dataFrame(2, 2, 0, 2, 3),
			controlFrame(batch.TypeConfig, 4, 0, 2, 4, []byte("c")),
		}
		for _, f := range frames {
			if err := s.Append(f); err != nil {
				t.Fatal(err)
			}
		}
		// At NextOffset: only the trailing control frame goes.
		if err := s.TruncateSuffix(4); err != nil {
			t.Fatal(err)
		}
		if s.NextOffset() != 4 || s.LastIndex() != 3 {
			t.Fatalf("next %d last index %d", s.NextOffset(), s.LastIndex())
		}
		if err := s.TruncateSuffix(3); !errors.Is(err, ErrNotBoundary) {
			t.Fatalf("inside a batch: %v", err)
		}
		// At a batch: the control frame before it goes too.
		if err := s.TruncateSuffix(2); err != nil {
			t.Fatal(err)
		}
		if s.NextOffset() != 2 || s.LastIndex() != 1 || s.Size() != int64(len(frames[0])) {
			t.Fatalf("next %d last index %d size %d", s.NextOffset(), s.LastIndex(), s.Size())
		}
		if term, err := s.TermAt(1); err != nil || term != 1 {
			t.Fatalf("TermAt(1) = %d, %v", term, err)
		}
		// The term of what remains bounds the next frame's.
		if err := s.Append(dataFrame(2, 1, 0, 1, 2)); err != nil {
			t.Fatal(err)
		}
	})
}

// TestIndexProperty runs random sequences of appends (data and control
// frames, valid and not), truncations by index and by offset, prefix
// deletions, retention, syncs and reopens against a store on vfs.Mem and
// the dumb model, checking after every step that bounds and segment files
// agree, and at intervals that every lookup (by offset, index and time, and
// TermAt) agrees. A failure names its seed; the sequence replays exactly.
func TestIndexProperty(t *testing.T) {
	sequences := 500
	if testing.Short() || raceEnabled {
		// The sequences run on one goroutine: the race detector has
		// nothing to find in them, only time to spend.
		sequences = 100
	}
	st := map[string]int{}
	for seed := range uint64(sequences) {
		if err := runIndexSequence(seed, st); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
	t.Logf("%d sequences: %v", sequences, st)
	for _, k := range []string{"refused", "truncated by index", "truncated by offset", "deleted", "retention deleted", "reopen", "mixed"} {
		if st[k] == 0 {
			t.Errorf("no sequence exercised %q", k)
		}
	}
}

// runIndexSequence runs the sequence of seed, counting what happened in st.
func runIndexSequence(seed uint64, st map[string]int) (err error) {
	rng := rand.New(rand.NewPCG(seed, 0xab))
	e := memEnv(seed)
	var now int64
	cfg := Config{Dir: e.dir, FS: e.fs, SegmentBytesMax: SegmentBytesMaxMin,
		IndexIntervalBytes: []int{1, 60, 200, 1000}[rng.IntN(4)],
		Now:                func() time.Time { return time.Unix(0, now) }}
	if rng.IntN(2) == 0 {
		cfg.RetentionBytes = 2000 + rng.Int64N(4000)
	}
	if rng.IntN(2) == 0 {
		cfg.RetentionAge = time.Duration(40 + rng.IntN(40))
	}
	s, err := Open(cfg)
	if err != nil {
		return err
	}
	defer func() {
		if s != nil {
			if cerr := s.Close(); err == nil {
				err = cerr
			}
		}
	}()
	m := newLogModel(cfg.SegmentBytesMax, 0)

	indexed := rng.IntN(4) != 0 // else the log starts without indexes and may gain them
	if !indexed {
		st["mixed"]++
	}
	var tm int64
	term, freshIndex := uint64(1), 1+rng.Uint64N(50)
	nextFrame := func() (index, frameTerm uint64) {
		_, last, lastTerm := m.indexBounds()
		if last != 0 && !indexed {
			// An invalid-append step wrote the log's first index.
			indexed, term = true, max(term, lastTerm)
		}
		if !indexed {
			return 0, 0
		}
		if rng.IntN(10) == 0 {
			term++
		}
		if last == 0 {
			return freshIndex, term
		}
		return last + 1, term
	}
	var trace []string
	defer func() {
		if err != nil && len(trace) > 0 {
			err = fmt.Errorf("%w\nafter: %v", err, trace[max(0, len(trace)-8):])
		}
	}()

	steps := 50 + rng.IntN(150)
	for step := range steps {
		full := false
		var op string
		var got, want error
		switch r := rng.IntN(100); {
		case r < 56:
			tm += rng.Int64N(3)
			index, term := nextFrame()
			f := dataFrame(m.next(), 1+rng.IntN(3), tm, term, index)
			op = fmt.Sprintf("append data at %d index %d term %d", m.next(), index, term)
			got = s.Append(f)
			if got == nil {
				m.add(f)
			}
		case r < 70:
			tm += rng.Int64N(3)
			index, term := nextFrame()
			typ := batch.TypeNoop + batch.Type(rng.IntN(2))
			payload := make([]byte, rng.IntN(60))
			f := controlFrame(typ, m.next(), tm, term, index, payload)
			op = fmt.Sprintf("append %v at %d index %d term %d", typ, m.next(), index, term)
			got = s.Append(f)
			if got == nil {
				m.add(f)
			}
		case r < 74:
			_, last, lastTerm := m.indexBounds()
			h := batch.Header{BaseOffset: m.next(), AppendTimeUnixNanos: tm, Term: lastTerm, Index: last + 1}
			if last == 0 {
				h.Term, h.Index = 0, 0
			}
			recs := []batch.Record{{Key: []byte("k")}}
			switch rng.IntN(6) {
			case 0:
				h.BaseOffset++
			case 1:
				recs = nil
			case 2:
				if len(m.all()) == 0 {
					continue
				}
				h.AppendTimeUnixNanos = m.lastTime() - 1
			case 3:
				h.Index += 1 + rng.Uint64N(2)
			case 4:
				h.Index = 0
			case 5:
				if h.Term == 0 {
					continue
				}
				h.Term--
			}
			f := batch.Encode(nil, h, recs)
			op = fmt.Sprintf("append %+v", h)
			lastTime := m.lastTime()
			want = m.appendErr(func() batch.Header { h, _ := batch.DecodeHeader(f); return h }(), lastTime)
			got = s.Append(f)
			if got == nil && want == nil {
				m.add(f)
			}
		case r < 78:
			first, last, _ := m.indexBounds()
			index := first + rng.Uint64N(last-first+3)
			if index > 0 && rng.IntN(8) == 0 {
				index--
			}
			op = fmt.Sprintf("truncate at index %d", index)
			before := len(m.all())
			got, want, full = s.TruncateSuffixAtIndex(index), m.truncateIndex(index), true
			if len(m.all()) < before {
				st["truncated by index"]++
			}
		case r < 81:
			var off uint64
			if all := m.all(); len(all) > 0 && rng.IntN(4) != 0 {
				off = all[rng.IntN(len(all))].h.BaseOffset
			} else {
				off = m.start() + rng.Uint64N(m.next()-m.start()+2)
				if off > 0 && rng.IntN(6) == 0 {
					off--
				}
			}
			op = fmt.Sprintf("truncate at offset %d", off)
			before := len(m.all())
			got, want, full = s.TruncateSuffix(off), m.truncateOffset(off), true
			if len(m.all()) < before {
				st["truncated by offset"]++
			}
		case r < 83:
			off := m.start() + rng.Uint64N(m.next()-m.start()+2)
			op = fmt.Sprintf("delete prefix below %d", off)
			before := len(m.all())
			got, want, full = s.DeletePrefix(off), m.deletePrefix(off), true
			if len(m.all()) < before {
				st["deleted"]++
			}
		case r < 86:
			now = tm + rng.Int64N(100)
			cutoff := int64(math.MinInt64)
			if cfg.RetentionAge > 0 {
				cutoff = now - int64(cfg.RetentionAge)
			}
			op = fmt.Sprintf("retention at %d", now)
			var n int
			n, got = s.ApplyRetention()
			m.applyRetention(cutoff, cfg.RetentionBytes)
			st["retention deleted"] += n
			full = true
		case r < 92:
			op = "sync"
			got = s.Sync()
		case r < 96:
			op = "reopen"
			st["reopen"]++
			if got = s.Close(); got == nil {
				s, got = Open(cfg)
			}
			if got != nil {
				s = nil
			}
			full = true
		default:
			op = "start indexing"
			indexed = true
			continue
		}
		trace = append(trace, op)
		if !sameErr(got, want) {
			return fmt.Errorf("step %d, %s: err = %v, want %v", step, op, got, want)
		}
		st["steps"]++
		if full || step%10 == 0 {
			st["full checks"]++
		}
		if got != nil {
			st["refused"]++
		}
		st["max segments"] = max(st["max segments"], len(m.segs))
		st["max frames"] = max(st["max frames"], len(m.all()))
		if s == nil {
			return fmt.Errorf("step %d: %s failed", step, op)
		}
		if err := m.checkStore(s, full || step%10 == 0); err != nil {
			return fmt.Errorf("step %d, %s: %w", step, op, err)
		}
	}
	if err := s.Close(); err != nil {
		return err
	}
	if s, err = Open(cfg); err != nil {
		return fmt.Errorf("final reopen: %w", err)
	}
	return m.checkStore(s, true)
}

func TestHeadersByIndex(t *testing.T) { forEachFS(t, testHeadersByIndex) }

// testHeadersByIndex: HeadersByIndex yields, for any [lo, hi), the headers
// of exactly the frames ReadFramesByIndex returns, across segments and
// around frames larger than a read window.
func testHeadersByIndex(t *testing.T, e env) {
	s := mustOpen(t, smallConfig(t, e))
	defer s.Close()
	index := uint64(5)
	for i := range 40 {
		var f []byte
		switch {
		case i%7 == 3:
			f = controlFrame(batch.TypeConfig, s.NextOffset(), int64(i), 1, index, bytes.Repeat([]byte{byte(i)}, 5000))
		default:
			f = dataFrame(s.NextOffset(), 1+i%4, int64(i), 1, index)
		}
		if err := s.Append(f); err != nil {
			t.Fatal(err)
		}
		index++
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	first, last := s.FirstIndex(), s.LastIndex()
	for lo := first; lo <= last+1; lo += 3 {
		for _, hi := range []uint64{lo, min(lo+1, last+1), min(lo+9, last+1), last + 1} {
			var got []batch.Header
			if err := s.HeadersByIndex(lo, hi, func(h batch.Header) { got = append(got, h) }); err != nil {
				t.Fatalf("HeadersByIndex(%d, %d): %v", lo, hi, err)
			}
			var want []batch.Header
			if lo < hi {
				frames, err := s.ReadFramesByIndex(lo, hi, math.MaxInt)
				if err != nil {
					t.Fatal(err)
				}
				for len(frames) > 0 {
					h, err := batch.DecodeHeader(frames)
					if err != nil {
						t.Fatal(err)
					}
					want = append(want, h)
					n, _ := batch.FrameSize(frames)
					frames = frames[n:]
				}
			}
			if len(got) != len(want) {
				t.Fatalf("HeadersByIndex(%d, %d): %d headers, want %d", lo, hi, len(got), len(want))
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("HeadersByIndex(%d, %d): header %d is %+v, want %+v", lo, hi, i, got[i], want[i])
				}
			}
		}
	}
}
