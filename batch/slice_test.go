package batch

import (
	"errors"
	"math/rand/v2"
	"testing"
)

// randomSliceFrame returns a random data frame at base offset 100: dense,
// or compacted (a random subset of its span), with tombstones at random.
func randomSliceFrame(rng *rand.Rand) []byte {
	h, recs := randomBatch(rng)
	h.Type, h.BaseOffset = TypeData, 100
	if rng.IntN(3) == 0 {
		h.ProducerID = 0
	}
	for i := range recs {
		if rng.IntN(4) == 0 {
			recs[i].Tombstone, recs[i].Value = true, nil
		}
	}
	if rng.IntN(2) == 0 && len(recs) > 0 {
		span, kept := uint32(len(recs)+rng.IntN(10)), recs[:0]
		delta := uint32(0)
		for i := range recs {
			if rng.IntN(3) == 0 {
				continue
			}
			recs[i].OffsetDelta = delta + uint32(rng.IntN(int(span)-len(recs)+1))/4
			delta = recs[i].OffsetDelta + 1
			kept = append(kept, recs[i])
		}
		h.OffsetSpan, recs = max(span, delta), kept
	}
	return Encode(nil, h, recs)
}

// TestAppendSliceKeepsExactlyTheRun: for random frames and bounds, the
// slice decodes (so its CRC, count, flags and offsets are right) to
// exactly the records of the frame with offsets in [lo, hi), the first
// maxRecords of them, at the same offsets, with the frame's epoch and
// append time; Next and Cut say where it stopped; keeping all returns the
// frame's bytes.
func TestAppendSliceKeepsExactlyTheRun(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 3000 {
		frame := randomSliceFrame(rng)
		h, recs, err := Decode(frame)
		if err != nil {
			t.Fatal(err)
		}
		lo, hi := 100+uint64(rng.IntN(30)), 100+uint64(rng.IntN(40))
		maxRecords := 1 + rng.IntN(25)
		var want []Record
		var wantOffs []uint64
		cut := false
		for j := range recs {
			off := h.Offset(&recs[j])
			if off < lo {
				continue
			}
			if off >= hi || len(want) == maxRecords {
				cut = true
				break
			}
			want, wantOffs = append(want, recs[j]), append(wantOffs, off)
		}
		prefix := []byte("prefix")
		out, res, err := AppendSlice(prefix, frame, lo, hi, maxRecords)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if string(out[:len(prefix)]) != "prefix" || res.Kept != len(want) || res.Cut != cut {
			t.Fatalf("case %d: kept %d cut %v, want %d %v", i, res.Kept, res.Cut, len(want), cut)
		}
		if len(want) == 0 {
			if len(out) != len(prefix) {
				t.Fatalf("case %d: appended %d bytes for no record", i, len(out)-len(prefix))
			}
			continue
		}
		if res.Next != wantOffs[len(wantOffs)-1]+1 {
			t.Fatalf("case %d: next %d, want %d", i, res.Next, wantOffs[len(wantOffs)-1]+1)
		}
		gh, got, err := Decode(out[len(prefix):])
		if err != nil || gh.Epoch != h.Epoch || gh.AppendTimeUnixNanos != h.AppendTimeUnixNanos || !recordsEqual(got, want) {
			t.Fatalf("case %d: slice decodes to %d records (err %v), want %d", i, len(got), err, len(want))
		}
		for j := range got {
			if gh.Offset(&got[j]) != wantOffs[j] {
				t.Fatalf("case %d: record %d at offset %d, want %d", i, j, gh.Offset(&got[j]), wantOffs[j])
			}
		}
		if len(want) == len(recs) && string(out[len(prefix):]) != string(frame) {
			t.Fatalf("case %d: keeping every record changed the frame", i)
		}
	}
}

// TestAppendSliceRefuses: a control frame, a compaction marker, a
// truncated frame and one whose records are damaged are refused with a
// typed error, dst unchanged.
func TestAppendSliceRefuses(t *testing.T) {
	good := Encode(nil, sampleHeader(), []Record{{Key: []byte("a"), Value: []byte("1")}, {Key: []byte("b"), Value: []byte("2")}})
	damaged := append([]byte(nil), good...)
	damaged[HeaderSize] = 0x7f // the first record's length runs past the frame
	for name, c := range map[string]struct {
		frame []byte
		want  error
	}{
		"control":   {EncodeControl(nil, Header{Type: TypeNoop}, nil), ErrNotData},
		"marker":    {EncodeCompaction(nil, Header{BaseOffset: 4}, Compaction{Point: 3}), ErrNotData},
		"truncated": {good[:len(good)-1], ErrShort},
		"damaged":   {damaged, ErrCorrupt},
	} {
		out, _, err := AppendSlice([]byte("x"), c.frame, 0, 1<<40, 10)
		if !errors.Is(err, c.want) || string(out) != "x" {
			t.Errorf("%s: %v (dst %q), want %v", name, err, out, c.want)
		}
	}
}
