package segment

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/geolog/geolog/batch"
)

func TestAppendReadRestart(t *testing.T) { forEachFS(t, testAppendReadRestart) }

func testAppendReadRestart(t *testing.T, e env) {
	var recovered []batch.Header
	cfg := smallConfig(t, e)
	cfg.OnRecover = func(h batch.Header) error { recovered = append(recovered, h); return nil }

	s := mustOpen(t, cfg)
	if s.NextOffset() != 0 || s.StartOffset() != 0 || s.Size() != 0 {
		t.Fatalf("new store: next %d start %d size %d", s.NextOffset(), s.StartOffset(), s.Size())
	}
	var m model
	tm := appendBatches(t, s, &m, 300, 1000)
	if got := len(logFiles(t, cfg)); got < 20 {
		t.Fatalf("only %d segments; the test wants many", got)
	}
	if s.DurableOffset() != s.NextOffset() {
		t.Fatalf("DurableOffset %d after Sync, NextOffset %d", s.DurableOffset(), s.NextOffset())
	}
	var size int64
	for _, f := range m.frames {
		size += int64(len(f))
	}
	if s.Size() != size {
		t.Fatalf("Size %d, want %d", s.Size(), size)
	}
	checkLog(t, s, &m)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	for round := range 3 {
		recovered = nil
		s = mustOpen(t, cfg)
		if len(recovered) != len(m.heads) {
			t.Fatalf("round %d: OnRecover saw %d batches, want %d", round, len(recovered), len(m.heads))
		}
		for i := range recovered {
			if recovered[i] != m.heads[i] {
				t.Fatalf("round %d: OnRecover batch %d = %+v, want %+v", round, i, recovered[i], m.heads[i])
			}
		}
		if s.DurableOffset() != m.next() || s.Size() != size {
			t.Fatalf("round %d: durable %d size %d", round, s.DurableOffset(), s.Size())
		}
		checkLog(t, s, &m)
		tm = appendBatches(t, s, &m, 50, tm)
		for _, f := range m.frames[len(m.frames)-50:] {
			size += int64(len(f))
		}
		checkLog(t, s, &m)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReopenWithoutClose(t *testing.T) { forEachFS(t, testReopenWithoutClose) }

func testReopenWithoutClose(t *testing.T, e env) {
	// A crash after Sync: the active segment's index files were never
	// written, and the next Open must rebuild them and read everything.
	cfg := smallConfig(t, e)
	s := mustOpen(t, cfg)
	var m model
	appendBatches(t, s, &m, 120, 0)
	img := dirImage(t, cfg)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	writeDirImage(t, cfg, img)
	s = mustOpen(t, cfg)
	defer s.Close()
	checkLog(t, s, &m)
}

func TestReadFramesBounds(t *testing.T) { forEachFS(t, testReadFramesBounds) }

func testReadFramesBounds(t *testing.T, e env) {
	s := mustOpen(t, smallConfig(t, e))
	defer s.Close()
	if got, err := s.ReadFrames(0, 100, math.MaxUint64); got != nil || err != nil {
		t.Fatalf("read of empty log = %v, %v", got, err)
	}
	var m model
	appendBatches(t, s, &m, 100, 0)
	next := s.NextOffset()
	if _, err := s.ReadFrames(next+1, 100, math.MaxUint64); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("read past next: %v", err)
	}
	if got, err := s.ReadFrames(next, 100, math.MaxUint64); got != nil || err != nil {
		t.Fatalf("read at next = %v, %v", got, err)
	}
	if err := s.DeletePrefix(m.heads[40].BaseOffset); err != nil {
		t.Fatal(err)
	}
	start := s.StartOffset()
	if start == 0 || start > m.heads[40].BaseOffset {
		t.Fatalf("StartOffset %d after DeletePrefix(%d)", start, m.heads[40].BaseOffset)
	}
	_, err := s.ReadFrames(start-1, 100, math.MaxUint64)
	if !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("read below start: %v", err)
	}
	t.Logf("out of range error reads: %v", err)

	// endOffset: nothing whose BaseOffset >= endOffset.
	i := m.find(start) + 5
	h := m.heads[i]
	if got, err := s.ReadFrames(h.BaseOffset, 1<<20, h.BaseOffset); got != nil || err != nil {
		t.Fatalf("endOffset at the batch: %d bytes, %v", len(got), err)
	}
	got, err := s.ReadFrames(h.BaseOffset, 1<<20, h.BaseOffset+1)
	if err != nil || !bytes.Equal(got, m.frames[i]) {
		t.Fatalf("endOffset just past the batch's base: %d bytes, %v", len(got), err)
	}
	got, err = s.ReadFrames(h.NextOffset()-1, 1<<20, m.heads[i+3].BaseOffset)
	if err != nil || !bytes.Equal(got, bytes.Join(m.frames[i:i+3], nil)) {
		t.Fatalf("read of three batches: %d bytes, %v", len(got), err)
	}
	// maxBytes smaller than one frame still returns that frame, and only it.
	got, err = s.ReadFrames(h.BaseOffset, 1, math.MaxUint64)
	if err != nil || !bytes.Equal(got, m.frames[i]) {
		t.Fatalf("maxBytes 1: %d bytes, %v", len(got), err)
	}
	// maxBytes exactly two frames.
	two := len(m.frames[i]) + len(m.frames[i+1])
	got, err = s.ReadFrames(h.BaseOffset, two, math.MaxUint64)
	if err != nil || !bytes.Equal(got, bytes.Join(m.frames[i:i+2], nil)) {
		t.Fatalf("maxBytes of two frames: %d bytes, %v", len(got), err)
	}
	got, err = s.ReadFrames(h.BaseOffset, two-1, math.MaxUint64)
	if err != nil || !bytes.Equal(got, m.frames[i]) {
		t.Fatalf("maxBytes of two frames less one: %d bytes, %v", len(got), err)
	}
	// Negative and huge maxBytes are clamped.
	if got, err = s.ReadFrames(h.BaseOffset, -5, math.MaxUint64); err != nil || !bytes.Equal(got, m.frames[i]) {
		t.Fatalf("maxBytes -5: %d bytes, %v", len(got), err)
	}
	if got, err = s.ReadFrames(start, math.MaxInt, math.MaxUint64); err != nil || !bytes.Equal(got, bytes.Join(m.frames[m.find(start):], nil)) {
		t.Fatalf("maxBytes MaxInt: %d bytes, %v", len(got), err)
	}
}

// TestReadFramesLargeFrames runs on the real file system only: it reads
// every offset of a large log, which costs time under the race detector,
// and TestReadFramesByIndexBudget covers large frames on both.
func TestReadFramesLargeFrames(t *testing.T) { testReadFramesLargeFrames(t, osEnv(t)) }

func testReadFramesLargeFrames(t *testing.T, e env) {
	// Frames larger than the segment size, the read chunk and maxBytes.
	cfg := smallConfig(t, e)
	s := mustOpen(t, cfg)
	defer s.Close()
	var m model
	for i, n := range []int{1, 3000, 2, 5000, 1, 1} {
		base := s.NextOffset()
		recs := make([]batch.Record, n)
		for j := range recs {
			off := base + uint64(j)
			recs[j] = batch.Record{Key: fmt.Appendf(nil, "k%d", off), Value: recordValue(off, 8+int(off%37))}
		}
		value := batch.Encode(nil, batch.Header{BaseOffset: base, AppendTimeUnixNanos: int64(i)}, recs)
		if err := s.Append(value); err != nil {
			t.Fatal(err)
		}
		m.add(t, value)
	}
	if len(m.frames[3]) <= readChunkBytes {
		t.Fatalf("frame of %d bytes is not larger than a read chunk", len(m.frames[3]))
	}
	checkLog(t, s, &m)
}

func TestSparseIndexSeeks(t *testing.T) { forEachFS(t, testSparseIndexSeeks) }

func testSparseIndexSeeks(t *testing.T, e env) {
	// The default 4 KiB index interval over small batches: reads seek an
	// entry and walk up to ~30 frames, and OffsetForTime scans as far.
	cfg := Config{Dir: e.dir, FS: e.fs, SegmentBytesMax: 64 << 10, Logger: testLogger(t)}
	s := mustOpen(t, cfg)
	var m model
	appendBatches(t, s, &m, 800, 0)
	checkLog(t, s, &m)
	for i := 0; i < len(m.heads); i += 7 {
		got, err := s.OffsetForTime(m.heads[i].AppendTimeUnixNanos)
		want := m.heads[i].BaseOffset
		if i%2 == 1 {
			want = m.heads[i-1].BaseOffset // pairs of batches share a time
		}
		if err != nil || got != want {
			t.Fatalf("OffsetForTime(%d) = %d, %v; want %d", m.heads[i].AppendTimeUnixNanos, got, err, want)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestOffsetForTime(t *testing.T) { forEachFS(t, testOffsetForTime) }

func testOffsetForTime(t *testing.T, e env) {
	s := mustOpen(t, smallConfig(t, e))
	if off, err := s.OffsetForTime(0); err != nil || off != 0 {
		t.Fatalf("empty log: %d, %v", off, err)
	}
	var m model
	appendBatches(t, s, &m, 200, 1000) // times 1000, 1000, 1010, 1010, ...
	check := func(s *Store) {
		t.Helper()
		last := m.heads[len(m.heads)-1].AppendTimeUnixNanos
		for tm := m.heads[0].AppendTimeUnixNanos - 20; tm <= last+20; tm++ {
			want := m.next()
			for _, h := range m.heads {
				if h.AppendTimeUnixNanos >= tm {
					want = h.BaseOffset
					break
				}
			}
			got, err := s.OffsetForTime(tm)
			if err != nil || got != want {
				t.Fatalf("OffsetForTime(%d) = %d, %v; want %d", tm, got, err, want)
			}
		}
	}
	check(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, smallConfig(t, e))
	defer s.Close()
	check(s)
}

func TestRetentionByAge(t *testing.T) { forEachFS(t, testRetentionByAge) }

func testRetentionByAge(t *testing.T, e env) {
	now := time.Unix(0, 0)
	cfg := smallConfig(t, e)
	cfg.RetentionAge = time.Hour
	cfg.Now = func() time.Time { return now }
	s := mustOpen(t, cfg)
	var m model
	// Batch i is appended at i minutes.
	for i := range 200 {
		frame := makeFrame(s.NextOffset(), 1+i%3, int64(i)*int64(time.Minute))
		if err := s.Append(frame); err != nil {
			t.Fatal(err)
		}
		m.add(t, frame)
	}
	if n, err := s.ApplyRetention(); n != 0 || err != nil {
		t.Fatalf("nothing is an hour old yet: deleted %d, %v", n, err)
	}

	now = time.Unix(0, int64(100*time.Minute)) // cutoff at 40 minutes
	n, err := s.ApplyRetention()
	if err != nil || n == 0 {
		t.Fatalf("ApplyRetention = %d, %v", n, err)
	}
	cutoff := int64(40 * time.Minute)
	start := s.StartOffset()
	i := m.find(start)
	if m.heads[i].BaseOffset != start {
		t.Fatalf("StartOffset %d is not a batch boundary", start)
	}
	if m.heads[i-1].AppendTimeUnixNanos >= cutoff {
		t.Fatalf("deleted a segment holding the batch at %v, newer than the cutoff", time.Duration(m.heads[i-1].AppendTimeUnixNanos))
	}
	// The first kept segment holds a batch at or after the cutoff.
	segEnd := m.next()
	if files := logFiles(t, cfg); len(files) > 1 {
		base, _, _ := parseSegmentName(files[1])
		segEnd = base
	}
	if m.heads[m.find(segEnd-1)].AppendTimeUnixNanos < cutoff {
		t.Fatalf("kept an expired segment")
	}
	m.dropBefore(start)
	checkLog(t, s, &m)
	if n, err := s.ApplyRetention(); n != 0 || err != nil {
		t.Fatalf("second ApplyRetention deleted %d, %v", n, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, cfg)
	checkLog(t, s, &m)

	// Everything expires: an empty segment is rolled at NextOffset and the
	// start survives a restart.
	now = time.Unix(0, int64(1000*time.Minute))
	next := s.NextOffset()
	if _, err := s.ApplyRetention(); err != nil {
		t.Fatal(err)
	}
	if s.StartOffset() != next || s.NextOffset() != next || s.Size() != 0 {
		t.Fatalf("after total expiry: start %d next %d size %d, want %d %d 0", s.StartOffset(), s.NextOffset(), s.Size(), next, next)
	}
	if _, err := s.ReadFrames(next-1, 100, math.MaxUint64); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("read of expired offset: %v", err)
	}
	if off, err := s.OffsetForTime(0); err != nil || off != next {
		t.Fatalf("OffsetForTime on an empty log = %d, %v", off, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, cfg)
	if s.StartOffset() != next || s.NextOffset() != next {
		t.Fatalf("after restart: start %d next %d, want %d", s.StartOffset(), s.NextOffset(), next)
	}
	if files := logFiles(t, cfg); len(files) != 1 || files[0] != segmentName(next, logSuffix) {
		t.Fatalf("files %v", files)
	}
	m = model{}
	frame := makeFrame(next, 2, int64(1000*time.Minute))
	if err := s.Append(frame); err != nil {
		t.Fatal(err)
	}
	m.add(t, frame)
	checkLog(t, s, &m)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestRetentionByBytes(t *testing.T) { forEachFS(t, testRetentionByBytes) }

func testRetentionByBytes(t *testing.T, e env) {
	cfg := smallConfig(t, e)
	cfg.RetentionBytes = 10_000
	s := mustOpen(t, cfg)
	defer s.Close()
	var m model
	appendBatches(t, s, &m, 300, 0)
	before := s.Size()
	n, err := s.ApplyRetention()
	if err != nil || n == 0 {
		t.Fatalf("ApplyRetention = %d, %v", n, err)
	}
	if s.Size() > cfg.RetentionBytes {
		t.Fatalf("Size %d still above %d", s.Size(), cfg.RetentionBytes)
	}
	// It deleted no more than needed: adding back the newest deleted
	// segment would exceed the bound.
	m.dropBefore(s.StartOffset())
	var kept int64
	for _, f := range m.frames {
		kept += int64(len(f))
	}
	if kept != s.Size() || before-s.Size() <= 0 {
		t.Fatalf("Size %d, model holds %d", s.Size(), kept)
	}
	if s.Size()+cfg.SegmentBytesMax+batch.FrameBytesMax < cfg.RetentionBytes {
		t.Fatal("deleted far too much")
	}
	checkLog(t, s, &m)

	// The active segment is never deleted for size.
	e2 := e
	e2.dir = filepath.Join(e.dir, "second")
	cfg2 := smallConfig(t, e2)
	cfg2.RetentionBytes = 1
	s2 := mustOpen(t, cfg2)
	defer s2.Close()
	var m2 model
	appendBatches(t, s2, &m2, 40, 0)
	if _, err := s2.ApplyRetention(); err != nil {
		t.Fatal(err)
	}
	if got := len(logFiles(t, cfg2)); got != 1 || s2.Size() == 0 {
		t.Fatalf("%d segments left, size %d: want only the non-empty active one", got, s2.Size())
	}
}

func TestTruncateSuffix(t *testing.T) { forEachFS(t, testTruncateSuffix) }

func testTruncateSuffix(t *testing.T, e env) {
	cfg := smallConfig(t, e)
	s := mustOpen(t, cfg)
	var m model
	tm := appendBatches(t, s, &m, 200, 0)
	segsBefore := len(logFiles(t, cfg))

	// Errors change nothing.
	if err := s.TruncateSuffix(s.NextOffset() + 1); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("truncate past next: %v", err)
	}
	var inside uint64
	for _, h := range m.heads {
		if h.RecordCount > 1 {
			inside = h.BaseOffset + 1
			break
		}
	}
	if err := s.TruncateSuffix(inside); !errors.Is(err, ErrNotBoundary) {
		t.Fatalf("truncate inside a batch: %v", err)
	}
	if err := s.TruncateSuffix(s.NextOffset()); err != nil {
		t.Fatalf("truncate at next: %v", err)
	}
	checkLog(t, s, &m)

	// Truncate into an older segment; later segments go.
	cut := m.heads[70].BaseOffset
	if err := s.TruncateSuffix(cut); err != nil {
		t.Fatal(err)
	}
	m.truncate(cut)
	if s.DurableOffset() != cut {
		t.Fatalf("DurableOffset %d after truncate to %d", s.DurableOffset(), cut)
	}
	if after := len(logFiles(t, cfg)); after >= segsBefore {
		t.Fatalf("%d segments before, %d after", segsBefore, after)
	}
	checkLog(t, s, &m)
	// Times restart from the truncated batch's, which is allowed.
	appendBatches(t, s, &m, 30, m.heads[len(m.heads)-1].AppendTimeUnixNanos)
	checkLog(t, s, &m)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, cfg)
	checkLog(t, s, &m)

	// Truncate exactly at a segment's base offset, then to the start.
	base, _, _ := parseSegmentName(logFiles(t, cfg)[2])
	if err := s.TruncateSuffix(base); err != nil {
		t.Fatal(err)
	}
	m.truncate(base)
	checkLog(t, s, &m)
	if err := s.TruncateSuffix(s.StartOffset()); err != nil {
		t.Fatal(err)
	}
	m.truncate(0)
	if s.NextOffset() != 0 || s.Size() != 0 || len(logFiles(t, cfg)) != 1 {
		t.Fatalf("after truncating everything: next %d size %d files %v", s.NextOffset(), s.Size(), logFiles(t, cfg))
	}
	if off, err := s.OffsetForTime(0); err != nil || off != 0 {
		t.Fatalf("OffsetForTime after truncating everything = %d, %v", off, err)
	}
	appendBatches(t, s, &m, 20, tm)
	checkLog(t, s, &m)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, cfg)
	defer s.Close()
	checkLog(t, s, &m)
}

func TestDeletePrefix(t *testing.T) { forEachFS(t, testDeletePrefix) }

func testDeletePrefix(t *testing.T, e env) {
	cfg := smallConfig(t, e)
	s := mustOpen(t, cfg)
	var m model
	appendBatches(t, s, &m, 200, 0)

	if err := s.DeletePrefix(0); err != nil || s.StartOffset() != 0 {
		t.Fatalf("DeletePrefix(0): %v, start %d", err, s.StartOffset())
	}
	if err := s.DeletePrefix(s.NextOffset() + 1); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("DeletePrefix past next: %v", err)
	}
	mid := m.heads[100].BaseOffset + 1
	if err := s.DeletePrefix(mid); err != nil {
		t.Fatal(err)
	}
	start := s.StartOffset()
	if start > mid || start == 0 {
		t.Fatalf("StartOffset %d after DeletePrefix(%d)", start, mid)
	}
	// Only whole segments below mid went: the one holding mid-1 stays.
	if i := m.find(mid - 1); m.heads[i].BaseOffset < start {
		t.Fatalf("deleted the segment holding offset %d", mid-1)
	}
	m.dropBefore(start)
	checkLog(t, s, &m)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, cfg)
	checkLog(t, s, &m)

	next := s.NextOffset()
	if err := s.DeletePrefix(next); err != nil {
		t.Fatal(err)
	}
	if s.StartOffset() != next || s.Size() != 0 {
		t.Fatalf("after deleting everything: start %d size %d", s.StartOffset(), s.Size())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, cfg)
	defer s.Close()
	if s.StartOffset() != next || s.NextOffset() != next {
		t.Fatalf("after restart: start %d next %d, want %d", s.StartOffset(), s.NextOffset(), next)
	}
	m = model{}
	frame := makeFrame(next, 1, 0)
	if err := s.Append(frame); err != nil {
		t.Fatal(err)
	}
	m.add(t, frame)
	checkLog(t, s, &m)
}

func TestAppendRejectsInvalidFrames(t *testing.T) { forEachFS(t, testAppendRejectsInvalidFrames) }

func testAppendRejectsInvalidFrames(t *testing.T, e env) {
	s := mustOpen(t, smallConfig(t, e))
	defer s.Close()
	if err := s.Append(makeFrame(0, 2, 100)); err != nil {
		t.Fatal(err)
	}
	good := makeFrame(2, 1, 100)
	flipped := bytes.Clone(good)
	flipped[len(flipped)-1] ^= 1
	empty := batch.Encode(nil, batch.Header{BaseOffset: 2, AppendTimeUnixNanos: 100}, nil)
	for name, frame := range map[string][]byte{
		"wrong base offset": makeFrame(3, 1, 100),
		"base offset below": makeFrame(1, 1, 100),
		"bad crc":           flipped,
		"short":             good[:len(good)-1],
		"trailing bytes":    append(bytes.Clone(good), 0),
		"two frames":        append(bytes.Clone(good), makeFrame(3, 1, 100)...),
		"no records":        empty,
		"time goes back":    makeFrame(2, 1, 99),
		"nil":               nil,
	} {
		if err := s.Append(frame); !errors.Is(err, ErrInvalidFrame) {
			t.Errorf("%s: Append err = %v, want ErrInvalidFrame", name, err)
		}
	}
	if s.NextOffset() != 2 || s.Size() != int64(len(makeFrame(0, 2, 100))) {
		t.Fatalf("rejected frames changed the log: next %d size %d", s.NextOffset(), s.Size())
	}
	if err := s.Append(good); err != nil {
		t.Fatal(err)
	}
}

func TestClosedStore(t *testing.T) { forEachFS(t, testClosedStore) }

func testClosedStore(t *testing.T, e env) {
	s := mustOpen(t, smallConfig(t, e))
	if err := s.Append(makeFrame(0, 1, 0)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s.DurableOffset() != 1 {
		t.Fatalf("Close did not make the log durable: %d", s.DurableOffset())
	}
	checks := map[string]error{
		"Close":          s.Close(),
		"Append":         s.Append(makeFrame(1, 1, 0)),
		"TruncateSuffix": s.TruncateSuffix(0),
		"DeletePrefix":   s.DeletePrefix(0),
	}
	// Close made everything durable, so Sync has nothing to report.
	if err := s.Sync(); err != nil {
		t.Errorf("Sync after Close: %v", err)
	}
	_, checks["ReadFrames"] = s.ReadFrames(0, 10, 10)
	_, checks["OffsetForTime"] = s.OffsetForTime(0)
	_, checks["ApplyRetention"] = s.ApplyRetention()
	for name, err := range checks {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v", name, err)
		}
	}
}

func TestInvalidConfig(t *testing.T) { forEachFS(t, testInvalidConfig) }

func testInvalidConfig(t *testing.T, e env) {
	dir := e.dir
	for name, cfg := range map[string]Config{
		"no dir":             {FS: e.fs},
		"tiny segments":      {Dir: dir, FS: e.fs, SegmentBytesMax: 100},
		"huge segments":      {Dir: dir, FS: e.fs, SegmentBytesMax: 2 << 30},
		"negative interval":  {Dir: dir, FS: e.fs, IndexIntervalBytes: -1},
		"huge interval":      {Dir: dir, FS: e.fs, IndexIntervalBytes: 1 << 30},
		"bad policy":         {Dir: dir, FS: e.fs, Fsync: 7},
		"negative retention": {Dir: dir, FS: e.fs, RetentionAge: -time.Second},
	} {
		if _, err := Open(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: Open err = %v", name, err)
		}
	}
	file := filepath.Join(dir, "file")
	if err := e.fs.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeTestFile(t, e.fs, file, nil)
	if _, err := Open(Config{Dir: file, FS: e.fs}); err == nil {
		t.Error("Open of a regular file succeeded")
	}
}

func TestOpenCreatesDirectory(t *testing.T) { forEachFS(t, testOpenCreatesDirectory) }

func testOpenCreatesDirectory(t *testing.T, e env) {
	cfg := Config{Dir: filepath.Join(e.dir, "a", "b"), FS: e.fs}
	s := mustOpen(t, cfg)
	defer s.Close()
	if files := logFiles(t, cfg); len(files) != 1 || files[0] != segmentName(0, logSuffix) {
		t.Fatalf("files %v", files)
	}
}

func TestEmptyTrailingSegment(t *testing.T) { forEachFS(t, testEmptyTrailingSegment) }

func testEmptyTrailingSegment(t *testing.T, e env) {
	// A crash right after a roll created the new file leaves it empty.
	cfg := smallConfig(t, e)
	s := mustOpen(t, cfg)
	var m model
	appendBatches(t, s, &m, 30, 0)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	writeTestFile(t, cfg.FS, filepath.Join(cfg.Dir, segmentName(m.next(), logSuffix)), nil)
	s = mustOpen(t, cfg)
	defer s.Close()
	checkLog(t, s, &m)
	appendBatches(t, s, &m, 30, 1000)
	checkLog(t, s, &m)
}

func TestUnknownFilesAreIgnored(t *testing.T) { forEachFS(t, testUnknownFilesAreIgnored) }

func testUnknownFilesAreIgnored(t *testing.T, e env) {
	cfg := smallConfig(t, e)
	s := mustOpen(t, cfg)
	var m model
	appendBatches(t, s, &m, 30, 0)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"notes.txt", "123.log", segmentName(5, ".tmp")} {
		writeTestFile(t, cfg.FS, filepath.Join(cfg.Dir, name), []byte("x"))
	}
	// An orphan index file (its log is gone) is removed.
	orphan := segmentName(1<<40, indexSuffix)
	writeTestFile(t, cfg.FS, filepath.Join(cfg.Dir, orphan), []byte("12345678"))
	s = mustOpen(t, cfg)
	defer s.Close()
	checkLog(t, s, &m)
	if _, err := cfg.FS.Stat(filepath.Join(cfg.Dir, orphan)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("orphan index file: %v", err)
	}
	if _, err := cfg.FS.Stat(filepath.Join(cfg.Dir, "notes.txt")); err != nil {
		t.Fatalf("unknown file was touched: %v", err)
	}
}

// TestAppendChecked: AppendChecked refuses every frame Append refuses for
// its header or its place in the log, writes what Append writes, and
// (its contract) does not recompute the CRC: the caller vouches for it.
func TestAppendChecked(t *testing.T) { forEachFS(t, testAppendChecked) }

func testAppendChecked(t *testing.T, e env) {
	cfgA := smallConfig(t, e)
	cfgB := cfgA
	cfgB.Dir = cfgA.Dir + "-checked"
	a, b := mustOpen(t, cfgA), mustOpen(t, cfgB)
	defer a.Close()
	defer b.Close()
	var next uint64
	for i := 0; i < 50; i++ {
		f := makeFrame(next, 1+i%4, int64(100+i))
		if err := a.Append(f); err != nil {
			t.Fatal(err)
		}
		if err := b.AppendChecked(f); err != nil {
			t.Fatal(err)
		}
		next += uint64(1 + i%4)
	}
	if err := a.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	fa, err := a.ReadFrames(0, 1<<20, next)
	if err != nil {
		t.Fatal(err)
	}
	fb, err := b.ReadFrames(0, 1<<20, next)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fa, fb) || b.NextOffset() != next || b.Size() != a.Size() {
		t.Fatalf("AppendChecked wrote %d bytes up to offset %d, Append %d bytes up to %d", b.Size(), b.NextOffset(), a.Size(), a.NextOffset())
	}
	good := makeFrame(next, 1, 200)
	badHeader := bytes.Clone(good)
	badHeader[4+4] ^= 0xff // the version byte, after the length and the CRC
	for name, frame := range map[string][]byte{
		"wrong base offset": makeFrame(next+1, 1, 200),
		"short":             good[:len(good)-1],
		"trailing bytes":    append(bytes.Clone(good), 0),
		"time goes back":    makeFrame(next, 1, 99),
		"bad header":        badHeader,
		"nil":               nil,
	} {
		if err := b.AppendChecked(frame); !errors.Is(err, ErrInvalidFrame) {
			t.Errorf("%s: AppendChecked err = %v, want ErrInvalidFrame", name, err)
		}
	}
	if b.NextOffset() != next || b.Size() != a.Size() {
		t.Fatalf("refused frames changed the log: next %d size %d", b.NextOffset(), b.Size())
	}
}
