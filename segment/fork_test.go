package segment

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/geolog/geolog/batch"
)

// forkFrame is a fork frame at base and index whose payload names prev as
// the frame before it.
func forkFrame(base uint64, appendTime int64, term, index, prev uint64) []byte {
	return controlFrame(batch.TypeFork, base, appendTime, term, index, binary.LittleEndian.AppendUint64(nil, prev))
}

func TestForkGap(t *testing.T) { forEachFS(t, testForkGap) }

// testForkGap: a fork frame may skip Raft indexes when its payload names
// the frame before it, and only then; reads by index see the gap as out of
// range, not as corruption; recovery, truncation into the gap and staging
// accept it.
func testForkGap(t *testing.T, e env) {
	cfg := smallConfig(t, e)
	s := mustOpen(t, cfg)
	// Indexes 1..prev (10 records each, so segments roll; at least 12, and
	// as many more as make the fork frame start a segment), then a fork at
	// 40 that follows prev: the offsets from prev*10 on would have been
	// the divergent tail.
	next, prev := uint64(0), uint64(0)
	forkBytes := int64(len(forkFrame(0, 0, 0, 0, 0)))
	for prev < 12 {
		prev++
		if err := s.Append(dataFrame(next, 10, int64(prev), 1, prev)); err != nil {
			t.Fatal(err)
		}
		next += 10
	}
	for s.active().size+forkBytes <= cfg.SegmentBytesMax {
		prev++
		if err := s.Append(controlFrame(batch.TypeNoop, next, int64(prev), 1, prev, nil)); err != nil {
			t.Fatal(err)
		}
	}
	if prev >= 35 {
		t.Fatalf("%d frames before the fork", prev)
	}
	for name, f := range map[string][]byte{
		"noop skipping indexes":   controlFrame(batch.TypeNoop, next, 100, 2, 40, nil),
		"fork naming another":     forkFrame(next, 100, 2, 40, prev-1),
		"fork naming nothing":     forkFrame(next, 100, 2, 40, 0),
		"fork going back":         forkFrame(next, 100, 2, prev, prev-1),
		"dense fork naming wrong": forkFrame(next, 100, 2, 13, 7),
		"fork without payload":    controlFrame(batch.TypeFork, next, 100, 2, 40, nil),
	} {
		if err := s.Append(f); !errors.Is(err, ErrInvalidFrame) {
			t.Errorf("%s: Append err = %v, want ErrInvalidFrame", name, err)
		}
	}
	if err := s.Append(forkFrame(next, 100, 2, 40, prev)); err != nil {
		t.Fatalf("fork frame after a gap: %v", err)
	}
	for i := uint64(41); i <= 50; i++ {
		if err := s.Append(dataFrame(next, 10, 100, 2, i)); err != nil {
			t.Fatal(err)
		}
		next += 10
	}
	check := func(s *Store) {
		t.Helper()
		if s.FirstIndex() != 1 || s.LastIndex() != 50 || s.NextOffset() != next {
			t.Fatalf("indexes [%d, %d], next offset %d", s.FirstIndex(), s.LastIndex(), s.NextOffset())
		}
		frames, err := s.ReadFramesByIndex(10, 45, ReadBytesMax)
		if err != nil {
			t.Fatal(err)
		}
		var got []uint64
		for _, h := range checkFrames(t, frames) {
			got = append(got, h.Index)
		}
		var want []uint64
		for i := uint64(10); i < 45; i++ {
			if i <= prev || i >= 40 {
				want = append(want, i)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("indexes read %v, want %v", got, want)
		}
		for _, index := range []uint64{prev + 1, 30, 39} {
			frames, err := s.ReadFramesByIndex(index, 45, ReadBytesMax)
			if err != nil {
				t.Fatalf("read at %d, in the gap: %v", index, err)
			}
			if hs := checkFrames(t, frames); hs[0].Index != 40 || len(hs) != 5 {
				t.Fatalf("read at %d, in the gap: from index %d, %d frames", index, hs[0].Index, len(hs))
			}
			if _, err := s.TermAt(index); !errors.Is(err, ErrOutOfRange) {
				t.Fatalf("term at %d, in the gap: %v", index, err)
			}
		}
		if term, err := s.TermAt(40); err != nil || term != 2 {
			t.Fatalf("term at the fork frame: %d, %v", term, err)
		}
		// Readers by offset see the records, dense, and no fork frame.
		all, err := s.ReadFrames(0, ReadBytesMax, next)
		if err != nil {
			t.Fatal(err)
		}
		if hs := checkFrames(t, all); len(hs) != 22 || hs[12].BaseOffset != 120 || hs[12].Index != 41 {
			t.Fatalf("%d data frames, the one after the gap %+v", len(hs), hs[12])
		}
	}
	check(s)
	// The gap crosses a segment boundary: the fork frame starts a segment
	// (lookups by index must find their way across).
	starts := false
	for _, g := range s.segs {
		starts = starts || g.firstIndex == 40
	}
	if !starts {
		t.Fatal("no segment starts with the fork frame")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, cfg)
	check(s)

	// Truncating at an index in the gap drops the fork frame and what
	// follows; the log then continues densely after prev again.
	if err := s.TruncateSuffixAtIndex(prev + 2); err != nil {
		t.Fatal(err)
	}
	if s.LastIndex() != prev || s.NextOffset() != 120 {
		t.Fatalf("after truncating into the gap: last index %d, next offset %d", s.LastIndex(), s.NextOffset())
	}
	if err := s.Append(dataFrame(120, 10, 100, 3, prev+1)); err != nil {
		t.Fatal(err)
	}

	// A staged log may hold the gap too, described the same way.
	st, err := s.BeginStaging(0, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 3; i++ {
		if _, err := st.Append(dataFrame((i-1)*10, 10, 1, 1, i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.Append(controlFrame(batch.TypeNoop, 30, 1, 1, 9, nil)); !errors.Is(err, ErrInvalidFrame) {
		t.Fatalf("staged noop skipping indexes: %v", err)
	}
	if _, err := st.Append(forkFrame(30, 1, 1, 9, 2)); !errors.Is(err, ErrInvalidFrame) {
		t.Fatalf("staged fork naming the wrong frame: %v", err)
	}
	if _, err := st.Append(forkFrame(30, 1, 1, 9, 3)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Append(dataFrame(30, 10, 1, 1, 10)); err != nil {
		t.Fatal(err)
	}
	if err := st.Finish(); err != nil {
		t.Fatal(err)
	}
	if err := s.Install(st); err != nil {
		t.Fatal(err)
	}
	if s.FirstIndex() != 1 || s.LastIndex() != 10 || s.NextOffset() != 40 {
		t.Fatalf("installed: indexes [%d, %d], next %d", s.FirstIndex(), s.LastIndex(), s.NextOffset())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, cfg)
	defer s.Close()
	if s.LastIndex() != 10 {
		t.Fatalf("reopened: last index %d", s.LastIndex())
	}
}

// TestForkGapCorruption: recovery accepts a gap only before a fork frame
// that describes it; a non-fork frame skipping indexes, or a fork frame
// naming another predecessor, is mid-log corruption.
func TestForkGapCorruption(t *testing.T) {
	for name, bad := range map[string][]byte{
		"noop skipping indexes": controlFrame(batch.TypeNoop, 30, 1, 1, 9, nil),
		"fork naming another":   forkFrame(30, 1, 1, 9, 2),
	} {
		t.Run(name, func(t *testing.T) {
			e := memEnv(3)
			cfg := Config{Dir: e.dir, FS: e.fs, Logger: testLogger(t)}
			s := mustOpen(t, cfg)
			for i := uint64(1); i <= 3; i++ {
				if err := s.Append(dataFrame((i-1)*10, 10, 1, 1, i)); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			// Write the bad frame and a good one after it behind the
			// store's back, as a disk would corrupt it.
			f, err := e.fs.OpenFile(e.dir+"/"+segmentName(0, logSuffix), 2, 0)
			if err != nil {
				t.Fatal(err)
			}
			size, _ := f.Size()
			tail := append(append([]byte(nil), bad...), dataFrame(30, 1, 1, 1, 10)...)
			if _, err := f.WriteAt(tail, size); err != nil {
				t.Fatal(err)
			}
			f.Close()
			if _, err := Open(cfg); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open: %v, want ErrCorrupt", err)
			}
		})
	}
}

// TestStagingStartsWithForkFrame: a staged log whose first frame is a fork
// frame (a snapshot of a log that a fork cut where retention had deleted
// the entries it keeps) may name any index below the staged log's first
// index as the frame before it: that frame lies below the log. The staging
// still holds the first frame to the first index and to a predecessor below
// it, a later fork frame to the frame before it, and the installed log
// reopens.
func TestStagingStartsWithForkFrame(t *testing.T) {
	e := memEnv(5)
	cfg := Config{Dir: e.dir, FS: e.fs, Logger: testLogger(t)}
	s := mustOpen(t, cfg)
	for name, bad := range map[string][]byte{
		"fork past the first index naming below": forkFrame(12, 1, 1, 25, 7),
		"fork naming itself":                     forkFrame(12, 1, 1, 24, 24),
		"fork naming a later index":              forkFrame(12, 1, 1, 24, 30),
		"fork before the first index":            forkFrame(12, 1, 1, 23, 7),
		"fork at another offset":                 forkFrame(13, 1, 1, 24, 7),
		"noop skipping the first index":          controlFrame(batch.TypeNoop, 12, 1, 1, 25, nil),
	} {
		st, err := s.BeginStaging(12, 24)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Append(bad); !errors.Is(err, ErrInvalidFrame) {
			t.Errorf("%s: %v, want ErrInvalidFrame", name, err)
		}
		st.Abort()
	}
	st, err := s.BeginStaging(12, 24)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range [][]byte{forkFrame(12, 1, 1, 24, 7), controlFrame(batch.TypeNoop, 12, 1, 2, 25, nil), dataFrame(12, 3, 1, 2, 26)} {
		if _, err := st.Append(f); err != nil {
			t.Fatal(err)
		}
	}
	// Past the first frame, a fork frame names the frame before it.
	if _, err := st.Append(forkFrame(15, 1, 2, 30, 7)); !errors.Is(err, ErrInvalidFrame) {
		t.Fatalf("second fork naming below the log: %v", err)
	}
	if _, err := st.Append(forkFrame(15, 1, 2, 30, 26)); err != nil {
		t.Fatal(err)
	}
	if err := st.Finish(); err != nil {
		t.Fatal(err)
	}
	if err := s.Install(st); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, cfg)
	defer s.Close()
	if s.FirstIndex() != 24 || s.LastIndex() != 30 || s.StartOffset() != 12 || s.NextOffset() != 15 {
		t.Fatalf("reopened: indexes [%d, %d], offsets [%d, %d)", s.FirstIndex(), s.LastIndex(), s.StartOffset(), s.NextOffset())
	}
}
