package batch

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// TestCompactedFrame: a compacted frame keeps its records' offsets and the
// batch's span, so NextOffset and every header field are as appended.
func TestCompactedFrame(t *testing.T) {
	h := compactedHeader(10)
	recs := []Record{{Key: []byte("a"), Value: []byte("1"), OffsetDelta: 0}, {Key: []byte("b"), OffsetDelta: 7, Tombstone: true}}
	frame := Encode(nil, h, recs)
	got, gotRecs, err := Decode(frame)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Compacted() || got.Span() != 10 || got.NextOffset() != h.BaseOffset+10 || got.RecordCount != 2 ||
		got.Flags != FlagCompacted|FlagTombstones || got.ProducerID != h.ProducerID || got.BaseSequence != h.BaseSequence {
		t.Fatalf("header %+v", got)
	}
	if got.Offset(&gotRecs[0]) != h.BaseOffset || got.Offset(&gotRecs[1]) != h.BaseOffset+7 || !gotRecs[1].Tombstone || gotRecs[1].Value != nil {
		t.Fatalf("records %+v", gotRecs)
	}
	if again := Encode(nil, got, gotRecs); !bytes.Equal(again, frame) {
		t.Fatal("re-encoding changed the frame")
	}
	empty := Encode(nil, compactedHeader(4), nil)
	if h, recs, err := Decode(empty); err != nil || h.RecordCount != 0 || h.NextOffset() != sampleHeader().BaseOffset+4 || recs != nil || h.IsControl() {
		t.Fatalf("empty compacted frame: %+v %v %v", h, recs, err)
	}
	dense := Encode(nil, sampleHeader(), []Record{{Key: []byte("x")}, {Key: []byte("y")}})
	if _, recs, _ := Decode(dense); recs[0].OffsetDelta != 0 || recs[1].OffsetDelta != 1 {
		t.Fatalf("dense deltas %d %d", recs[0].OffsetDelta, recs[1].OffsetDelta)
	}
}

// TestTombstoneFlagIsExact: the tombstones flag is set exactly when a
// record is one, so a frame has one encoding.
func TestTombstoneFlagIsExact(t *testing.T) {
	plain := Encode(nil, sampleHeader(), []Record{{Key: []byte("k"), Value: []byte("v")}})
	if h, _ := DecodeHeader(plain); h.Flags != 0 {
		t.Fatalf("flags %#x without tombstones", h.Flags)
	}
	tomb := Encode(nil, sampleHeader(), []Record{{Key: []byte("k"), Tombstone: true}, {Key: []byte("k"), Value: nil}})
	h, recs, err := Decode(tomb)
	if err != nil || h.Flags != FlagTombstones || !recs[0].Tombstone || recs[1].Tombstone {
		t.Fatalf("%+v %+v %v", h, recs, err)
	}
}

func TestCompactionMarker(t *testing.T) {
	c := Compaction{Point: 1234, TombstoneCutoffUnixNanos: 99, ProducerCutoffUnixNanos: -7}
	frame := EncodeCompaction(nil, Header{BaseOffset: 2000, Epoch: 3, AppendTimeUnixNanos: 5, ProducerID: 9}, c)
	h, got, err := DecodeCompaction(frame)
	if err != nil || got != c || h.Type != TypeCompact || h.RecordCount != 1 || h.ProducerID != 0 || h.NextOffset() != 2001 || h.IsControl() {
		t.Fatalf("%+v %+v %v", h, got, err)
	}
	if !IsCompaction(frame) || IsData(frame) {
		t.Fatal("type filters")
	}
	if _, _, err := DecodeCompaction(Encode(nil, sampleHeader(), []Record{{}})); !errors.Is(err, ErrNotControl) {
		t.Fatalf("data frame as marker: %v", err)
	}
}

func TestCompactionDecodeErrors(t *testing.T) {
	le := binary.LittleEndian
	compacted := Encode(nil, compactedHeader(10), []Record{{Key: []byte("a"), OffsetDelta: 2}, {Key: []byte("b"), OffsetDelta: 5}})
	tomb := Encode(nil, sampleHeader(), []Record{{Key: []byte("k"), Tombstone: true}})
	marker := EncodeCompaction(nil, Header{BaseOffset: 5}, Compaction{Point: 3})
	// Body positions: a record's bodyLen, then (compacted) its delta, or
	// (tombstones) its attributes byte.
	first := HeaderSize + 1
	tests := []struct {
		name string
		in   []byte
	}{
		{"span below count", corruptFrame(compacted, true, func(f []byte) []byte { le.PutUint32(f[posReserved:], 1); return f })},
		{"span zero", corruptFrame(compacted, true, func(f []byte) []byte { le.PutUint32(f[posReserved:], 0); return f })},
		{"span without flag", corruptFrame(compacted, true, func(f []byte) []byte { le.PutUint16(f[posFlags:], 0); return f })},
		{"reserved high bytes", corruptFrame(compacted, true, func(f []byte) []byte { f[posReserved+5] = 1; return f })},
		{"delta past span", corruptFrame(compacted, true, func(f []byte) []byte { le.PutUint32(f[posReserved:], 5); return f })},
		{"deltas out of order", corruptFrame(compacted, true, func(f []byte) []byte { f[first] = 6; return f })},
		{"tombstone flag without one", corruptFrame(tomb, true, func(f []byte) []byte { f[first] = 0; return f })},
		{"unknown attribute", corruptFrame(tomb, true, func(f []byte) []byte { f[first] = 3; return f })},
		{"flags on a control frame", corruptFrame(EncodeControl(nil, Header{Type: TypeNoop}, nil), true, func(f []byte) []byte {
			le.PutUint16(f[posFlags:], FlagTombstones)
			return f
		})},
		{"marker with a producer", corruptFrame(marker, true, func(f []byte) []byte { le.PutUint64(f[posProducerID:], 1); return f })},
		{"marker with flags", corruptFrame(marker, true, func(f []byte) []byte { le.PutUint16(f[posFlags:], FlagCompacted); return f })},
		{"marker payload version", corruptFrame(marker, true, func(f []byte) []byte { f[len(f)-1-compactionPayloadBytes] = 9; return f })},
		{"data frame typed as marker", corruptFrame(Encode(nil, Header{}, []Record{{Key: []byte("k")}}), true, func(f []byte) []byte {
			f[posType] = byte(TypeCompact)
			return f
		})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, _, err := Decode(tt.in); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Decode err = %v, want ErrCorrupt", err)
			}
			if _, err := Validate(tt.in); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Validate err = %v, want ErrCorrupt", err)
			}
		})
	}
	// A tombstone with a value, built by hand: attributes 1 and a value.
	withValue := Encode(nil, sampleHeader(), []Record{{Key: []byte("k"), Value: []byte("v"), Tombstone: false}, {Tombstone: true}})
	bad := corruptFrame(withValue, true, func(f []byte) []byte { f[first] = 1; return f })
	if _, _, err := Decode(bad); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("tombstone with a value: %v", err)
	}
}

func TestEncodeCompactionPanics(t *testing.T) {
	for name, fn := range map[string]func(){
		"tombstone with value": func() { Encode(nil, sampleHeader(), []Record{{Value: []byte("v"), Tombstone: true}}) },
		"delta past span":      func() { Encode(nil, compactedHeader(2), []Record{{OffsetDelta: 2}}) },
		"deltas repeat":        func() { Encode(nil, compactedHeader(5), []Record{{OffsetDelta: 1}, {OffsetDelta: 1}}) },
		"span below count":     func() { Encode(nil, compactedHeader(1), []Record{{}, {OffsetDelta: 1}}) },
		"compacted noop":       func() { Encode(nil, Header{Type: TypeNoop, OffsetSpan: 3}, nil) },
		"two-record marker":    func() { Encode(nil, Header{Type: TypeCompact}, []Record{{}, {}}) },
		"control marker":       func() { EncodeControl(nil, Header{Type: TypeCompact}, nil) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			fn()
		})
	}
}
