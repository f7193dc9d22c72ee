package replicator

import (
	"bytes"
	"errors"
	"testing"

	"github.com/geolog/geolog/batch"
)

// TestSyncSteps: BuildBatch, CheckBatch and Overlap give what the Server
// and the Task decide: a batch at the applied end applies whole; one
// past it is a gap naming the applied end; one wholly below it, identical,
// is a duplicate (nothing to apply); one straddling it applies its part
// past it; one differing below it is refused as divergent; a corrupt frame
// is malformed.
func TestSyncSteps(t *testing.T) {
	g := newLogGen(3, 16)
	var fs [][]byte
	for i := 0; i < 4; i++ {
		fs = append(fs, g.frame(2))
	}
	all := bytes.Join(fs, nil)
	check := func(frames []byte, from uint64) CheckedBatch {
		t.Helper()
		b, err := BuildBatch(frames, from)
		if err != nil {
			t.Fatal(err)
		}
		cb, err := CheckBatch(b, 1)
		if err != nil {
			t.Fatal(err)
		}
		return cb
	}
	whole := check(all, 0)
	if whole.First != 0 || whole.End != 8 || whole.FrameCount != 4 {
		t.Fatalf("batch [%d, %d) of %d frames", whole.First, whole.End, whole.FrameCount)
	}
	if out, err := whole.Overlap(0, nil); err != nil || !bytes.Equal(out, all) {
		t.Fatalf("at the applied end: %d bytes, %v", len(out), err)
	}
	tail := check(bytes.Join(fs[2:], nil), 4)
	var ref *Refusal
	if _, err := tail.Overlap(2, nil); !errors.As(err, &ref) || !errors.Is(err, ErrGap) || ref.ExpectedOffset() != 2 {
		t.Fatalf("past the applied end: %v", err)
	}
	stored := bytes.Join(fs[:2], nil)
	if out, err := check(stored, 0).Overlap(4, stored); err != nil || len(out) != 0 {
		t.Fatalf("a duplicate: %d bytes to apply, %v", len(out), err)
	}
	if out, err := whole.Overlap(4, stored); err != nil || !bytes.Equal(out, bytes.Join(fs[2:], nil)) {
		t.Fatalf("straddling: %d bytes to apply, %v", len(out), err)
	}
	h, recs, _ := batch.Decode(fs[1])
	recs[0].Value = []byte("other")
	forged := append(append([]byte(nil), fs[0]...), batch.Encode(nil, h, recs)...)
	if _, err := whole.Overlap(4, forged); !errors.Is(err, ErrDiverged) {
		t.Fatalf("differing below the applied end: %v", err)
	}
	b, _ := BuildBatch(all, 0)
	b.Payload = append([]byte(nil), all...)
	b.Payload[len(b.Payload)-1] ^= 1
	if _, err := CheckBatch(b, 1); !errors.Is(err, ErrMalformed) {
		t.Fatalf("a corrupt frame: %v", err)
	}
	if _, err := BuildBatch(all, 9); err == nil {
		t.Fatal("frames that do not cover the read's offset were taken")
	}
}
