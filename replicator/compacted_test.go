package replicator

import (
	"testing"
	"time"

	"github.com/geolog/geolog/batch"
)

// compactFrame returns frame f as compaction by key leaves it: only its
// records at even offsets, the batch's span and every header field kept.
func compactFrame(t testing.TB, f []byte) []byte {
	t.Helper()
	h, recs, err := batch.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	kept := recs[:0]
	for i := range recs {
		if h.Offset(&recs[i])%2 == 0 {
			kept = append(kept, recs[i])
		}
	}
	h.OffsetSpan = h.Span()
	return batch.Encode(nil, h, kept)
}

// compactedLog is a home log of 60 frames as compaction leaves it below
// frame 40: frames compacted, frames 20 to 29 gone (a hole), then a
// compaction marker and the dense rest. dense is the log before it.
func compactedLog(t testing.TB) (compacted, dense [][]byte) {
	g := newLogGen(9, 200)
	for range 60 {
		dense = append(dense, g.frame(1+g.rng.IntN(4)))
	}
	for i, f := range dense[:40] {
		if i < 20 || i >= 30 {
			compacted = append(compacted, compactFrame(t, f))
		}
	}
	h, _ := batch.DecodeHeader(dense[39])
	marker := batch.EncodeCompaction(nil, batch.Header{BaseOffset: h.NextOffset(), Epoch: 1, Term: 2, Index: 1000,
		AppendTimeUnixNanos: h.AppendTimeUnixNanos}, batch.Compaction{Point: h.BaseOffset})
	compacted = append(compacted, marker)
	// The dense rest follows the marker's offset.
	for _, f := range dense[40:] {
		f = append([]byte(nil), f...)
		fh, _ := batch.DecodeHeader(f)
		batch.Patch(f, fh.BaseOffset+1, fh.Epoch, fh.AppendTimeUnixNanos)
		compacted = append(compacted, f)
	}
	return compacted, dense
}

// TestShipsCompactedLog: a mirror whose applied end lies in a hole of its
// home's compacted log resumes there: the batch covers the hole, the
// mirror takes compacted frames past its end and the marker, and ends up
// with the home's frames.
func TestShipsCompactedLog(t *testing.T) {
	compacted, dense := compactedLog(t)
	src := NewMemSource(0)
	for _, f := range compacted {
		if err := src.AppendCommitted(f); err != nil {
			t.Fatalf("source append: %v", err)
		}
	}
	node := startMirror(t, NewMemMirrorStore(), nil)
	m := node.store.Range(testStream, testRange)
	if err := m.Seed(dense[:25]...); err != nil { // applied end: inside the hole
		t.Fatal(err)
	}
	startTask(t, taskConfig(t, src, newDialer(t), node.addr))
	waitFor(t, 10*time.Second, "the mirror to catch up", func() bool { return m.AppliedEnd() == src.CommittedEnd() })
	got := m.Frames()[25:]
	want := compacted[20:] // the frames past the hole
	if len(got) != len(want) {
		t.Fatalf("mirror took %d frames past its end, want %d", len(got), len(want))
	}
	for i := range want {
		if !SameData(got[i], want[i]) {
			t.Fatalf("frame %d past the hole differs", i)
		}
	}
	if !batch.IsCompaction(got[10]) {
		t.Fatal("the marker did not arrive")
	}
	if s := node.srv.Stats(); s.Refusals != 0 {
		t.Fatalf("server refused %d times", s.Refusals)
	}
}

// TestOverlapOfCompactedFrames: a resend below the mirror's applied end
// whose frames compaction rewrote (or the mirror's) is not a divergence;
// the part past the applied end is applied.
func TestOverlapOfCompactedFrames(t *testing.T) {
	compacted, dense := compactedLog(t)
	var frames []byte
	for _, f := range compacted[:25] {
		frames = append(frames, f...)
	}
	h, _ := batch.DecodeHeader(dense[19])
	applied := h.NextOffset() // the mirror holds dense[:20]
	var stored []byte
	for _, f := range dense[:20] {
		stored = append(stored, f...)
	}
	d := decodedBatch{first: 0, end: frameNext(compacted[24]), frameCount: 25, frames: frames}
	p, err := overlapSuffix(d, applied, stored)
	if err != nil {
		t.Fatal(err)
	}
	if fh, _ := batch.DecodeHeader(frames[p:]); fh.BaseOffset != frameBase(compacted[20]) || fh.BaseOffset <= applied {
		t.Fatalf("suffix starts at %d, want the frame after the hole at %d", fh.BaseOffset, frameBase(compacted[20]))
	}
	if err := checkFrames(frames, 0, d.end, 25, 1); err != nil {
		t.Fatalf("a compacted batch with a hole is refused: %v", err)
	}
}
