package batch

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"testing"
)

func sampleSplit() Split {
	return Split{MapVersion: 3, Parent: 1, HashStart: 1 << 62, HashEnd: 1<<63 - 1, At: 3 << 61, Left: 6, Right: 7}
}

// checkSplitDecoder holds DecodeSplit and IsSplit to Decode's verdict on
// b (h, err), and a decoded split to a byte-exact re-encoding.
func checkSplitDecoder(t *testing.T, b []byte, h Header, err error) {
	t.Helper()
	if IsSplit(b) && err == nil && h.Type != TypeSplit {
		t.Fatalf("IsSplit disagrees with type %v", h.Type)
	}
	sh, s, sErr := DecodeSplit(b)
	if (sErr == nil) != (err == nil && h.Type == TypeSplit) || sErr == nil && sh != h {
		t.Fatalf("DecodeSplit = %+v, %v; Decode says %+v, %v", sh, sErr, h, err)
	}
	if sErr == nil {
		if !s.Valid() {
			t.Fatalf("DecodeSplit returned an invalid decision %+v", s)
		}
		if again := EncodeSplit(nil, h, s); !bytes.Equal(again, b[:len(again)]) {
			t.Fatalf("re-encoding the split marker changed it")
		}
	}
}

// TestSplitRoundTrip: a split marker decodes to its decision, takes one
// offset, is neither a control frame nor data, and carries no producer.
func TestSplitRoundTrip(t *testing.T) {
	s := sampleSplit()
	h := Header{BaseOffset: 99, Epoch: 4, Term: 2, Index: 7, AppendTimeUnixNanos: 5, ProducerID: 9, BaseSequence: 3}
	frame := EncodeSplit(nil, h, s)
	got, gs, err := DecodeSplit(frame)
	if err != nil || gs != s {
		t.Fatalf("DecodeSplit = %+v, %+v, %v", got, gs, err)
	}
	if got.Type != TypeSplit || got.RecordCount != 1 || got.ProducerID != 0 || got.BaseSequence != 0 || got.NextOffset() != 100 || got.IsControl() {
		t.Fatalf("header %+v", got)
	}
	if _, recs, err := Decode(frame); err != nil || len(recs) != 1 || recs[0].Key != nil {
		t.Fatalf("Decode: %v %+v", err, recs)
	}
	if !IsSplit(frame) || IsCompaction(frame) || IsData(frame) {
		t.Fatal("type filters")
	}
	if _, _, err := DecodeSplit(EncodeCompaction(nil, Header{}, Compaction{Point: 3})); !errors.Is(err, ErrNotControl) {
		t.Fatalf("DecodeSplit of a compaction marker: %v", err)
	}
	// A compaction marker's payload in a split frame, and the reverse,
	// are corrupt.
	if _, err := Validate(withType(EncodeCompaction(nil, Header{}, Compaction{Point: 3}), TypeSplit)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a split frame with a compaction payload: %v", err)
	}
	if _, err := Validate(withType(frame, TypeCompact)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a compaction frame with a split payload: %v", err)
	}
}

// withType returns frame with its type byte set to typ and its CRC fixed.
func withType(frame []byte, typ Type) []byte {
	b := bytes.Clone(frame)
	b[posType] = byte(typ)
	binary.LittleEndian.PutUint32(b[posCRC:], crc32.Checksum(b[crcStart:], castagnoli))
	return b
}

// TestSplitInvalidDecisions: decisions that would leave a child empty or
// name bad children are refused by Valid, panic in EncodeSplit (a
// caller's bug), and fail decoding as corrupt when they come as bytes.
func TestSplitInvalidDecisions(t *testing.T) {
	bad := []func(*Split){
		func(s *Split) { s.At = s.HashStart },
		func(s *Split) { s.At = s.HashEnd + 1 },
		func(s *Split) { s.Right = s.Left + 2 },
		func(s *Split) { s.Left, s.Right = math.MaxUint32, 0 },
		func(s *Split) { s.Parent = s.Left },
		func(s *Split) { s.MapVersion = 0 },
	}
	good := EncodeSplit(nil, Header{BaseOffset: 5}, sampleSplit())
	for i, mutate := range bad {
		s := sampleSplit()
		mutate(&s)
		if s.Valid() {
			t.Fatalf("case %d: %+v is valid", i, s)
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Fatalf("case %d: EncodeSplit did not panic", i)
				}
			}()
			EncodeSplit(nil, Header{}, s)
		}()
		// The same decision as bytes: patch the payload of a good frame.
		b := bytes.Clone(good)
		at := bytes.Index(b, sampleSplit().payload())
		if at < 0 {
			t.Fatal("payload not found")
		}
		copy(b[at:], s.payload())
		binary.LittleEndian.PutUint32(b[posCRC:], crc32.Checksum(b[crcStart:], castagnoli))
		if _, _, err := DecodeSplit(b); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("case %d: DecodeSplit of %+v: %v", i, s, err)
		}
	}
}
