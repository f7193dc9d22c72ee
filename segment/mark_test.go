package segment

import (
	"errors"
	"math"
	"path/filepath"
	"testing"

	"github.com/geolog/geolog/batch"
)

// markedLog appends data frames at indexes 1..n (2 records each) to s, a
// commit mark naming index i-1 before each frame i > 1 and one naming n
// at the end, and returns the frames appended.
func markedLog(t *testing.T, s *Store, n int) []byte {
	t.Helper()
	var frames []byte
	for i := 1; i <= n; i++ {
		if i > 1 {
			if ok, err := s.AppendMark(uint64(i - 1)); !ok || err != nil {
				t.Fatalf("AppendMark(%d): %v %v", i-1, ok, err)
			}
		}
		f := dataFrame(s.NextOffset(), 2, int64(i), 1, uint64(i))
		if err := s.Append(f); err != nil {
			t.Fatalf("Append %d: %v", i, err)
		}
		frames = append(frames, f...)
	}
	if ok, err := s.AppendMark(uint64(n)); !ok || err != nil {
		t.Fatalf("AppendMark(%d): %v %v", n, ok, err)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	return frames
}

// TestMarksAreInvisible: commit marks are read by no reader (by offset, by
// index, headers, terms, the key index), survive a reopen (OpenMark is the
// newest), and a truncation keeps the marks before its cut, drops those
// after.
func TestMarksAreInvisible(t *testing.T) { forEachFS(t, testMarksAreInvisible) }

func testMarksAreInvisible(t *testing.T, e env) {
	cfg := smallConfig(t, e)
	s := mustOpen(t, cfg)
	if ok, err := s.AppendMark(0); ok || err != nil {
		t.Fatalf("AppendMark on a log without indexes: %v %v, want false, nil", ok, err)
	}
	want := markedLog(t, s, 40)
	if ok, err := s.AppendMark(41); ok || !errors.Is(err, ErrInvalidFrame) {
		t.Fatalf("AppendMark past the last index: %v %v", ok, err)
	}
	check := func(s *Store, n int) {
		t.Helper()
		all, err := s.ReadFrames(0, math.MaxInt, math.MaxUint64)
		if err != nil || string(all) != string(want[:len(all)]) || len(checkFrames(t, all)) != n {
			t.Fatalf("ReadFrames: %d bytes, %v", len(all), err)
		}
		byIndex, err := s.ReadFramesByIndex(1, uint64(n)+1, math.MaxInt)
		if err != nil || string(byIndex) != string(all) {
			t.Fatalf("ReadFramesByIndex: %d bytes, %v", len(byIndex), err)
		}
		for lo := uint64(1); lo <= uint64(n); lo += 7 {
			one, err := s.ReadFramesByIndex(lo, lo+1, 1)
			if h, herr := batch.DecodeHeader(one); err != nil || herr != nil || h.Index != lo || h.Type != batch.TypeData {
				t.Fatalf("ReadFramesByIndex(%d): %v %v %+v", lo, err, herr, h)
			}
			if term, err := s.TermAt(lo); err != nil || term != 1 {
				t.Fatalf("TermAt(%d): %d %v", lo, term, err)
			}
		}
		var idx []uint64
		if err := s.HeadersByIndex(1, uint64(n)+1, func(h batch.Header) { idx = append(idx, h.Index) }); err != nil || len(idx) != n {
			t.Fatalf("HeadersByIndex: %v %v", idx, err)
		}
		if err := verifyKeyReads(s, 5, true); err != nil {
			t.Fatalf("key reads: %v", err)
		}
	}
	check(s, 40)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, cfg)
	if got := s.OpenMark(); got != 40 {
		t.Fatalf("OpenMark %d, want 40", got)
	}
	check(s, 40)
	// The mark naming 29 precedes frame 30: a cut at 30 keeps it.
	if err := s.TruncateSuffixAtIndex(30); err != nil {
		t.Fatal(err)
	}
	check(s, 29)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, cfg)
	defer s.Close()
	if got := s.OpenMark(); got != 29 {
		t.Fatalf("OpenMark after a cut at 30: %d, want 29", got)
	}
	check(s, 29)
	if err := s.Append(dataFrame(s.NextOffset(), 2, 30, 2, 30)); err != nil {
		t.Fatalf("Append after marks: %v", err)
	}
}

// TestMarkDamaged: a commit mark at the tail that is torn or damaged is a
// torn tail (cut off; the mark before it stands); one damaged mid-log is
// corruption, as for any frame; and a frame of the right type whose
// payload is not a mark's is refused.
func TestMarkDamaged(t *testing.T) { forEachFS(t, testMarkDamaged) }

func testMarkDamaged(t *testing.T, e env) {
	cfg := smallConfig(t, e)
	cfg.SegmentBytesMax = 1 << 20 // one segment
	s := mustOpen(t, cfg)
	markedLog(t, s, 5)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(cfg.Dir, segmentName(0, logSuffix))
	good := readTestFile(t, e.fs, name)
	markBytes := len(batch.EncodeMark(nil, 1, 0, 0))
	if cfg.Keyring != nil {
		markBytes = unitBytes(cfg.Keyring, markBytes)
	}
	for _, c := range []struct {
		name    string
		damage  func(b []byte) []byte
		corrupt bool
		mark    uint64
	}{
		{"torn tail mark", func(b []byte) []byte { return b[:len(b)-3] }, false, 4},
		{"damaged tail mark", func(b []byte) []byte { b[len(b)-2] ^= 0x40; return b }, false, 4},
		{"damaged mid-log mark", func(b []byte) []byte {
			size, _ := unitSize(b) // the first mark follows the first frame
			b[size+markBytes-2] ^= 0x40
			return b
		}, true, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			writeTestFile(t, e.fs, name, c.damage(append([]byte(nil), good...)))
			s, err := Open(cfg)
			if c.corrupt {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("Open: %v, want corruption", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer s.Close()
			if got := s.OpenMark(); got != c.mark {
				t.Fatalf("OpenMark %d, want %d", got, c.mark)
			}
			if s.LastIndex() != 5 {
				t.Fatalf("LastIndex %d after a torn mark, want 5", s.LastIndex())
			}
		})
	}
	// A mark frame whose payload is not a mark's: corruption, never trusted.
	bad := batch.EncodeControl(nil, batch.Header{Type: batch.TypeMark, BaseOffset: 10, AppendTimeUnixNanos: 5}, []byte{1, 2, 3})
	if _, err := batch.DecodeMark(bad); !errors.Is(err, batch.ErrCorrupt) {
		t.Fatalf("DecodeMark of a short payload: %v", err)
	}
}
