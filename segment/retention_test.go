package segment

import (
	"testing"
	"time"
)

// TestSetRetention: a retention set at run time governs the next
// ApplyRetention: a store without one keeps every segment; with a size
// bound set, the oldest go; the bound read back is the one set.
func TestSetRetention(t *testing.T) {
	cfg := smallConfig(t, memEnv(1))
	s := mustOpen(t, cfg)
	raftLog(t, s, 1, 160, 1, int64(time.Second))
	if n, err := s.ApplyRetention(); err != nil || n != 0 {
		t.Fatalf("no retention: deleted %d (%v)", n, err)
	}
	size := s.Size()
	if err := s.SetRetention(0, size/2); err != nil {
		t.Fatal(err)
	}
	if age, b := s.Retention(); age != 0 || b != size/2 {
		t.Fatalf("Retention() = %v, %d", age, b)
	}
	if n, err := s.ApplyRetention(); err != nil || n == 0 {
		t.Fatalf("with a size bound: deleted %d (%v)", n, err)
	}
	if s.Size() > size/2+cfg.SegmentBytesMax {
		t.Fatalf("size %d after retention to %d", s.Size(), size/2)
	}
	if err := s.SetRetention(-time.Second, 0); err == nil {
		t.Fatal("a negative retention was accepted")
	}
}

// TestSizeFrom: the bytes from an offset count the segments holding it or
// later offsets, the whole log from its start or below, nothing from the
// end; and retention deleting a prefix lowers them only for offsets in it.
func TestSizeFrom(t *testing.T) {
	cfg := smallConfig(t, memEnv(1))
	s := mustOpen(t, cfg)
	raftLog(t, s, 1, 160, 1, int64(time.Second))
	start, next, size := s.StartOffset(), s.NextOffset(), s.Size()
	if got := s.SizeFrom(start); got != size {
		t.Fatalf("SizeFrom(start %d) = %d, want the whole log's %d", start, got, size)
	}
	if got := s.SizeFrom(next); got != 0 {
		t.Fatalf("SizeFrom(end %d) = %d, want 0", next, got)
	}
	mid := start + (next-start)/2
	got := s.SizeFrom(mid)
	if got <= 0 || got >= size {
		t.Fatalf("SizeFrom(%d) = %d, want within (0, %d)", mid, got, size)
	}
	// Monotonic: a later offset never counts more.
	prev := size
	for off := start; off <= next; off++ {
		b := s.SizeFrom(off)
		if b > prev {
			t.Fatalf("SizeFrom(%d) = %d > SizeFrom(%d) = %d", off, b, off-1, prev)
		}
		prev = b
	}
	if err := s.SetRetention(0, size/2); err != nil {
		t.Fatal(err)
	}
	if n, err := s.ApplyRetention(); err != nil || n == 0 {
		t.Fatalf("retention deleted %d (%v)", n, err)
	}
	if got := s.SizeFrom(0); got != s.Size() {
		t.Fatalf("SizeFrom(0) below the start %d = %d, want the log's %d", s.StartOffset(), got, s.Size())
	}
}
