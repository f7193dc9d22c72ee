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
