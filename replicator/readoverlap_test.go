package replicator

import "testing"

// framesReader is a log of frames read with Source.ReadFrames's contract.
type framesReader [][]byte

func (l framesReader) ReadFrames(from uint64, maxBytes int, endOffset uint64) ([]byte, error) {
	var out []byte
	for _, f := range l {
		if frameNext(f) <= from {
			continue
		}
		if frameBase(f) >= endOffset || (len(out) > 0 && len(out)+len(f) > maxBytes) {
			break
		}
		out = append(out, f...)
	}
	return out, nil
}

// TestReadOverlapReadsTheLargerFrame: a mirror holds a small frame, then a
// large one; a read sized for an identical overlap of the small frame and
// a smaller frame where the large one starts stops before the large one.
// ReadOverlap returns it too, whole, so the comparison sees the frame to
// fork off (sim seed 3501631); it reads nothing past the overlap's end.
func TestReadOverlapReadsTheLargerFrame(t *testing.T) {
	g := newLogGen(1, 200)
	small, large, after := g.frame(2), g.frame(6), g.frame(1)
	m := framesReader{small, large, after}
	first, end := frameBase(small), frameNext(large) // the overlap: up to the applied end of a mirror at large's end
	size := len(small) + len(large) - 1              // a batch whose frame at large's offset is smaller
	plain, err := m.ReadFrames(first, size, end)
	if err != nil {
		t.Fatal(err)
	}
	if len(plain) != len(small) {
		t.Fatalf("the sized read returned %d bytes, want only the small frame's %d: the test no longer sets the case up", len(plain), len(small))
	}
	got, err := ReadOverlap(m, first, size, end)
	if err != nil {
		t.Fatal(err)
	}
	if want := append(append([]byte(nil), small...), large...); string(got) != string(want) {
		t.Fatalf("ReadOverlap returned %d bytes, want the small and the large frame (%d)", len(got), len(want))
	}
	// Nothing at or past the overlap's end is read.
	got, err = ReadOverlap(m, first, len(small), frameBase(large))
	if err != nil || string(got) != string(small) {
		t.Fatalf("ReadOverlap up to the large frame's start = %d bytes, %v; want the small frame alone", len(got), err)
	}
}
