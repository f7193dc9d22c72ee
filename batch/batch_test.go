package batch

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"testing"
)

// sampleHeader returns a header with every field set to something distinct.
func sampleHeader() Header {
	return Header{
		Type:                TypeData,
		BaseOffset:          1000,
		Epoch:               7,
		Term:                3,
		Index:               99,
		AppendTimeUnixNanos: 1_700_000_000_000_000_000,
		HLC:                 42,
		ProducerID:          5,
		BaseSequence:        17,
	}
}

// recordsEqual compares records the way the wire format does: nil and empty
// byte slices are the same.
func recordsEqual(a, b []Record) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if !bytes.Equal(x.Key, y.Key) || !bytes.Equal(x.Value, y.Value) || x.Tombstone != y.Tombstone ||
			x.ProducerTimeUnixNanos != y.ProducerTimeUnixNanos || len(x.Headers) != len(y.Headers) {
			return false
		}
		for j := range x.Headers {
			if x.Headers[j].Key != y.Headers[j].Key || !bytes.Equal(x.Headers[j].Value, y.Headers[j].Value) {
				return false
			}
		}
	}
	return true
}

func TestRoundTripTable(t *testing.T) {
	big := bytes.Repeat([]byte{0xab}, 200_000)
	tests := []struct {
		name string
		h    Header
		recs []Record
	}{
		{name: "no records", h: Header{Type: TypeNoop}},
		{name: "empty record", h: sampleHeader(), recs: []Record{{}}},
		{name: "key and value", h: sampleHeader(), recs: []Record{{Key: []byte("k"), Value: []byte("v")}}},
		{name: "negative producer time", h: sampleHeader(), recs: []Record{{ProducerTimeUnixNanos: -12345}}},
		{name: "extreme producer times", h: sampleHeader(), recs: []Record{
			{ProducerTimeUnixNanos: math.MinInt64}, {ProducerTimeUnixNanos: math.MaxInt64},
		}},
		{name: "headers", h: sampleHeader(), recs: []Record{{
			Key: []byte("user-1"), Value: []byte("hello"),
			Headers: []RecordHeader{{Key: "a", Value: []byte("1")}, {Key: "", Value: nil}, {Key: "c", Value: []byte{}}},
		}}},
		{name: "large value", h: sampleHeader(), recs: []Record{{Key: []byte("big"), Value: big}}},
		{name: "config type", h: Header{Type: TypeConfig, BaseOffset: math.MaxUint64 - 2}, recs: []Record{{}, {}}},
		{name: "max fields", h: Header{
			Type: TypeData, BaseOffset: 1, Epoch: math.MaxUint64, Term: math.MaxUint64, Index: math.MaxUint64,
			AppendTimeUnixNanos: math.MinInt64, HLC: math.MaxUint64, ProducerID: math.MaxUint64, BaseSequence: math.MaxUint64,
		}, recs: []Record{{Value: []byte("x")}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			frame := Encode(nil, tt.h, tt.recs)
			size, err := FrameSize(frame)
			if err != nil || size != len(frame) {
				t.Fatalf("FrameSize = %d, %v; want %d", size, err, len(frame))
			}
			wantSize := HeaderSize
			for _, r := range tt.recs {
				wantSize += EncodedRecordSize(r)
			}
			if len(frame) != wantSize {
				t.Fatalf("frame is %d bytes, EncodedRecordSize sums to %d", len(frame), wantSize)
			}
			want := tt.h
			want.RecordCount = uint32(len(tt.recs))
			h, recs, err := Decode(frame)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if h != want {
				t.Fatalf("header = %+v, want %+v", h, want)
			}
			if h.NextOffset() != want.BaseOffset+uint64(len(tt.recs)) {
				t.Fatalf("NextOffset = %d", h.NextOffset())
			}
			if !recordsEqual(recs, tt.recs) {
				t.Fatalf("records = %v, want %v", recs, tt.recs)
			}
			if h2, err := DecodeHeader(frame); err != nil || h2 != want {
				t.Fatalf("DecodeHeader = %+v, %v", h2, err)
			}
			if h2, err := Validate(frame); err != nil || h2 != want {
				t.Fatalf("Validate = %+v, %v", h2, err)
			}
			if again := Encode(nil, h, recs); !bytes.Equal(again, frame) {
				t.Fatal("re-encoding the decoded frame changed it")
			}
		})
	}
}

func TestControlFrames(t *testing.T) {
	payload := []byte{2, 0x08, 0x01}
	for _, tt := range []struct {
		name    string
		h       Header
		payload []byte
	}{
		{"noop", Header{Type: TypeNoop, BaseOffset: 10, Epoch: 2, Term: 5, Index: 77, AppendTimeUnixNanos: 9}, nil},
		{"config", Header{Type: TypeConfig, BaseOffset: 10, Term: 5, Index: 78}, payload},
		{"noop with payload", Header{Type: TypeNoop, BaseOffset: math.MaxUint64}, []byte("marker")},
		{"empty config", Header{Type: TypeConfig}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.h.RecordCount = 9 // ignored
			frame := EncodeControl([]byte("pre"), tt.h, tt.payload)[3:]
			want := tt.h
			want.RecordCount = 0
			if len(frame) != HeaderSize+len(tt.payload) {
				t.Fatalf("frame of %d bytes", len(frame))
			}
			h, got, err := DecodeControl(frame)
			if err != nil || h != want || !bytes.Equal(got, tt.payload) || (got == nil) != (len(tt.payload) == 0) {
				t.Fatalf("DecodeControl = %+v, %q, %v", h, got, err)
			}
			if !h.IsControl() || h.NextOffset() != h.BaseOffset {
				t.Fatalf("IsControl %v, NextOffset %d", h.IsControl(), h.NextOffset())
			}
			if len(got) > 0 {
				_ = append(got, 'X')
				if _, err := Validate(frame); err != nil {
					t.Fatal("appending to the payload wrote into the frame")
				}
			}
			if h2, recs, err := Decode(frame); err != nil || h2 != want || recs != nil {
				t.Fatalf("Decode = %+v, %v, %v", h2, recs, err)
			}
			if h2, err := Validate(frame); err != nil || h2 != want {
				t.Fatalf("Validate = %+v, %v", h2, err)
			}
			if !bytes.Equal(EncodeControl(nil, h, got), frame) {
				t.Fatal("re-encoding changed the frame")
			}
			if len(tt.payload) == 0 && !bytes.Equal(Encode(nil, tt.h, nil), frame) {
				t.Fatal("Encode without records differs from EncodeControl without payload")
			}
			if _, _, err := DecodeControl(frame[:len(frame)-1]); len(tt.payload) > 0 && !errors.Is(err, ErrShort) {
				t.Fatalf("cut control frame: %v", err)
			}
		})
	}
	// Frames with records, and data frames, are not control frames.
	for _, frame := range [][]byte{
		Encode(nil, sampleHeader(), []Record{{}}),
		Encode(nil, Header{Type: TypeConfig}, []Record{{Key: []byte("k")}}),
		Encode(nil, Header{Type: TypeData}, nil),
	} {
		if _, _, err := DecodeControl(frame); !errors.Is(err, ErrNotControl) {
			t.Errorf("DecodeControl of a frame that is not a control frame: %v", err)
		}
	}
	// A data frame without records still may not carry a body.
	bad := corruptFrame(EncodeControl(nil, Header{Type: TypeNoop}, []byte("xyz")), true, func(f []byte) []byte {
		f[posType] = byte(TypeData)
		return f
	})
	if _, err := Validate(bad); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("data frame with a payload: %v", err)
	}
	for name, fn := range map[string]func(){
		"data":      func() { EncodeControl(nil, Header{Type: TypeData}, nil) },
		"unknown":   func() { EncodeControl(nil, Header{Type: typeMax + 1}, nil) },
		"flags":     func() { EncodeControl(nil, Header{Type: TypeNoop, Flags: 1}, nil) },
		"too large": func() { EncodeControl(nil, Header{Type: TypeConfig}, make([]byte, FrameBytesMax-HeaderSize+1)) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("EncodeControl %s: no panic", name)
				}
			}()
			fn()
		}()
	}
}

func TestEncodeAppendsAndDecodeIgnoresTrailingBytes(t *testing.T) {
	prefix := []byte("prefix")
	f1 := Encode(append([]byte(nil), prefix...), sampleHeader(), []Record{{Key: []byte("a")}})
	if !bytes.Equal(f1[:len(prefix)], prefix) {
		t.Fatal("Encode clobbered dst")
	}
	h2 := sampleHeader()
	h2.BaseOffset = 1001
	both := Encode(f1, h2, []Record{{Key: []byte("b")}})
	first := both[len(prefix):]
	h, recs, err := Decode(first)
	if err != nil || h.BaseOffset != 1000 || string(recs[0].Key) != "a" {
		t.Fatalf("Decode(first) = %+v, %v, %v", h, recs, err)
	}
	size, _ := FrameSize(first)
	h, recs, err = Decode(first[size:])
	if err != nil || h.BaseOffset != 1001 || string(recs[0].Key) != "b" {
		t.Fatalf("Decode(second) = %+v, %v, %v", h, recs, err)
	}
}

func TestDecodedSlicesAreCapped(t *testing.T) {
	frame := Encode(nil, sampleHeader(), []Record{{Key: []byte("k"), Value: []byte("v")}, {Key: []byte("z")}})
	_, recs, err := Decode(frame)
	if err != nil {
		t.Fatal(err)
	}
	_ = append(recs[0].Key, 'X')
	_ = append(recs[0].Value, 'Y')
	if _, err := DecodeHeader(frame); err != nil {
		t.Fatalf("appending to decoded slices changed the frame: %v", err)
	}
}

// corruptFrame returns a copy of frame with mutate applied and, if fixCRC,
// the CRC recomputed so that only the structural check can catch it.
func corruptFrame(frame []byte, fixCRC bool, mutate func(f []byte) []byte) []byte {
	f := mutate(append([]byte(nil), frame...))
	if fixCRC && len(f) >= HeaderSize {
		binary.LittleEndian.PutUint32(f[posLength:], uint32(len(f)-4))
		binary.LittleEndian.PutUint32(f[posCRC:], crc32.Checksum(f[crcStart:], castagnoli))
	}
	return f
}

func TestDecodeErrors(t *testing.T) {
	frame := Encode(nil, sampleHeader(), []Record{{Key: []byte("key"), Value: []byte("value"),
		Headers: []RecordHeader{{Key: "h", Value: []byte("v")}}}})
	le := binary.LittleEndian
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, ErrShort},
		{"three bytes", frame[:3], ErrShort},
		{"header cut", frame[:HeaderSize-1], ErrShort},
		{"body cut", frame[:len(frame)-1], ErrShort},
		{"length too small", corruptFrame(frame, false, func(f []byte) []byte { le.PutUint32(f, HeaderSize-5); return f }), ErrCorrupt},
		{"length too large", corruptFrame(frame, false, func(f []byte) []byte { le.PutUint32(f, FrameBytesMax); return f }), ErrCorrupt},
		{"crc", corruptFrame(frame, false, func(f []byte) []byte { f[len(f)-1] ^= 1; return f }), ErrCorrupt},
		{"version", corruptFrame(frame, true, func(f []byte) []byte { f[posVersion] = 2; return f }), ErrCorrupt},
		{"type", corruptFrame(frame, true, func(f []byte) []byte { f[posType] = byte(typeMax) + 1; return f }), ErrCorrupt},
		{"flags", corruptFrame(frame, true, func(f []byte) []byte { f[posFlags] = 1; return f }), ErrCorrupt},
		{"reserved", corruptFrame(frame, true, func(f []byte) []byte { f[posReserved+7] = 1; return f }), ErrCorrupt},
		{"record count too large", corruptFrame(frame, true, func(f []byte) []byte { le.PutUint32(f[posRecordCount:], 1<<31); return f }), ErrCorrupt},
		{"record count one more", corruptFrame(frame, true, func(f []byte) []byte { le.PutUint32(f[posRecordCount:], 2); return f }), ErrCorrupt},
		{"record count zero with body", corruptFrame(frame, true, func(f []byte) []byte { le.PutUint32(f[posRecordCount:], 0); return f }), ErrCorrupt},
		{"offset overflow", corruptFrame(frame, true, func(f []byte) []byte { le.PutUint64(f[posBaseOffset:], math.MaxUint64); return f }), ErrCorrupt},
		{"trailing byte in frame", corruptFrame(frame, true, func(f []byte) []byte { return append(f, 0) }), ErrCorrupt},
		{"body length too large", corruptFrame(frame, true, func(f []byte) []byte { f[HeaderSize] = 0x7f; return f }), ErrCorrupt},
		{"non-minimal varint", corruptFrame(frame, true, func(f []byte) []byte {
			// Re-encode the producer time (0) as 0x80 0x00 and grow bodyLen.
			out := append([]byte(nil), f[:HeaderSize]...)
			out = append(out, f[HeaderSize]+1, 0x80, 0x00)
			return append(out, f[HeaderSize+2:]...)
		}), ErrCorrupt},
		{"header count too large", corruptFrame(frame, true, func(f []byte) []byte {
			// key "key" and value "value" put the header count at body offset 1+1+4+6.
			f[HeaderSize+1+1+4+6] = 0x7f
			return f
		}), ErrCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, _, err := Decode(tt.in); !errors.Is(err, tt.want) {
				t.Fatalf("Decode err = %v, want %v", err, tt.want)
			}
			if _, err := Validate(tt.in); !errors.Is(err, tt.want) {
				t.Fatalf("Validate err = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestDecodeHeaderJudgesHeaderBeforeLength(t *testing.T) {
	frame := Encode(nil, sampleHeader(), []Record{{Value: make([]byte, 1000)}})
	if _, err := DecodeHeader(frame[:HeaderSize]); !errors.Is(err, ErrShort) {
		t.Fatalf("valid header, cut frame: err = %v, want ErrShort", err)
	}
	bad := append([]byte(nil), frame[:HeaderSize]...)
	bad[posVersion] = 9
	if _, err := DecodeHeader(bad); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("bad header, cut frame: err = %v, want ErrCorrupt", err)
	}
}

func TestFrameSize(t *testing.T) {
	le := binary.LittleEndian
	b := make([]byte, 4)
	for _, tt := range []struct {
		length uint32
		size   int
		want   error
	}{
		{HeaderSize - 4, HeaderSize, nil},
		{HeaderSize - 5, 0, ErrCorrupt},
		{0, 0, ErrCorrupt},
		{FrameBytesMax - 4, FrameBytesMax, nil},
		{FrameBytesMax - 3, 0, ErrCorrupt},
		{math.MaxUint32, 0, ErrCorrupt},
	} {
		le.PutUint32(b, tt.length)
		size, err := FrameSize(b)
		if size != tt.size || !errors.Is(err, tt.want) || (tt.want == nil && err != nil) {
			t.Errorf("FrameSize(length %d) = %d, %v; want %d, %v", tt.length, size, err, tt.size, tt.want)
		}
	}
	if _, err := FrameSize(b[:3]); !errors.Is(err, ErrShort) {
		t.Errorf("FrameSize(3 bytes) err = %v", err)
	}
}

func TestPatch(t *testing.T) {
	recs := []Record{{Key: []byte("k"), Value: []byte("v")}, {Key: []byte("k2")}}
	frame := Encode(nil, sampleHeader(), recs)
	Patch(frame, 5000, 9, 123)
	PatchRaft(frame, 4, 77)
	h, got, err := Decode(frame)
	if err != nil {
		t.Fatal(err)
	}
	want := sampleHeader()
	want.RecordCount = 2
	want.BaseOffset, want.Epoch, want.AppendTimeUnixNanos, want.Term, want.Index = 5000, 9, 123, 4, 77
	if h != want || !recordsEqual(got, recs) {
		t.Fatalf("patched = %+v %v, want %+v", h, got, want)
	}
}

func TestEncodePanics(t *testing.T) {
	for name, fn := range map[string]func(){
		"unknown type":    func() { Encode(nil, Header{Type: typeMax + 1}, nil) },
		"flags":           func() { Encode(nil, Header{Flags: 1}, nil) },
		"offset overflow": func() { Encode(nil, Header{BaseOffset: math.MaxUint64}, []Record{{}}) },
		"too large":       func() { Encode(nil, Header{}, []Record{{Value: make([]byte, FrameBytesMax)}}) },
		"patch short":     func() { Patch(make([]byte, 10), 0, 0, 0) },
		"patch overflow": func() {
			Patch(Encode(nil, Header{}, []Record{{}}), math.MaxUint64, 0, 0)
		},
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

func TestRandomRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 500 {
		h, recs := randomBatch(rng)
		frame := Encode(nil, h, recs)
		got, gotRecs, err := Decode(frame)
		h.RecordCount = uint32(len(recs))
		if err != nil || got != h || !recordsEqual(gotRecs, recs) {
			t.Fatalf("case %d: round trip failed: %v", i, err)
		}
	}
}

// randomBatch returns a random valid header and records.
func randomBatch(rng *rand.Rand) (Header, []Record) {
	h := Header{
		Type:                Type(rng.IntN(3)),
		BaseOffset:          rng.Uint64() >> 1,
		Epoch:               rng.Uint64(),
		Term:                rng.Uint64(),
		Index:               rng.Uint64(),
		AppendTimeUnixNanos: rng.Int64(),
		HLC:                 rng.Uint64(),
		ProducerID:          rng.Uint64(),
		BaseSequence:        rng.Uint64(),
	}
	recs := make([]Record, rng.IntN(20))
	bytesOf := func(n int) []byte {
		if n == 0 {
			return nil
		}
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	for i := range recs {
		recs[i] = Record{Key: bytesOf(rng.IntN(40)), Value: bytesOf(rng.IntN(300)), ProducerTimeUnixNanos: rng.Int64() - math.MaxInt64/2}
		for range rng.IntN(4) {
			recs[i].Headers = append(recs[i].Headers, RecordHeader{Key: string(bytesOf(rng.IntN(10))), Value: bytesOf(rng.IntN(10))})
		}
	}
	return h, recs
}

func TestDecodeAllocations(t *testing.T) {
	recs := make([]Record, 64)
	for i := range recs {
		recs[i] = Record{Key: []byte("key"), Value: make([]byte, 1024)}
	}
	frame := Encode(nil, sampleHeader(), recs)
	if n := testing.AllocsPerRun(100, func() { _, _, _ = Decode(frame) }); n > 1 {
		t.Errorf("Decode of 64 header-less records allocates %v times, want 1", n)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = Validate(frame) }); n != 0 {
		t.Errorf("Validate allocates %v times", n)
	}
	dst := make([]byte, 0, len(frame))
	if n := testing.AllocsPerRun(100, func() { _ = Encode(dst[:0], sampleHeader(), recs) }); n != 0 {
		t.Errorf("Encode into a large enough dst allocates %v times", n)
	}
}

// TestForkFrame: a fork frame is a control frame that names the index
// before it; one claiming records is corrupt, and ForkPrevIndex refuses
// what is not a fork frame.
func TestForkFrame(t *testing.T) {
	payload := binary.LittleEndian.AppendUint64(nil, 41)
	f := EncodeControl(nil, Header{Type: TypeFork, BaseOffset: 7, Epoch: 3, Term: 2, Index: 50}, append(payload, "rest"...))
	h, err := Validate(f)
	if err != nil || !h.IsControl() || h.Type != TypeFork || !IsFork(f) || IsData(f) {
		t.Fatalf("fork frame: %+v %v", h, err)
	}
	if prev, err := ForkPrevIndex(f); err != nil || prev != 41 {
		t.Fatalf("ForkPrevIndex = %d, %v", prev, err)
	}
	if _, err := ForkPrevIndex(EncodeControl(nil, Header{Type: TypeFork}, []byte{1, 2})); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("short fork payload: %v", err)
	}
	if _, err := ForkPrevIndex(EncodeControl(nil, Header{Type: TypeNoop}, payload)); !errors.Is(err, ErrNotControl) {
		t.Fatalf("noop frame: %v", err)
	}
	if _, err := ForkPrevIndex(f[:20]); err == nil {
		t.Fatal("a torn fork frame passed")
	}
	withRecords := corruptFrame(Encode(nil, Header{}, []Record{{Key: []byte("k")}}), true, func(b []byte) []byte {
		b[posType] = byte(TypeFork)
		return b
	})
	if _, err := DecodeHeader(withRecords); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("fork frame with records: %v", err)
	}
}

// TestDecodeAppendMatchesDecode: decoding frame after frame into one
// reused slice gives what Decode gives for each, keeps what dst held
// before, and leaves no field of an earlier, longer decode behind.
func TestDecodeAppendMatchesDecode(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var dst []Record
	for i := range 500 {
		h, recs := randomBatch(rng)
		frame := Encode(nil, h, recs)
		wantH, want, wantErr := Decode(frame)
		prefix := rng.IntN(3)
		dst = dst[:min(prefix, len(dst))]
		kept := append([]Record(nil), dst...)
		gotH, got, err := DecodeAppend(dst, frame)
		if err != nil || wantErr != nil || gotH != wantH || !recordsEqual(got[len(kept):], want) || !recordsEqual(got[:len(kept)], kept) {
			t.Fatalf("case %d: DecodeAppend differs from Decode (%v, %v)", i, err, wantErr)
		}
		dst = got
		frame[len(frame)-1] ^= 0xff // a CRC failure: dst comes back as given
		if _, bad, err := DecodeAppend(dst[:1], frame); err == nil || len(bad) != 1 {
			t.Fatalf("case %d: a damaged frame gave %d records, error %v", i, len(bad), err)
		}
	}
	recs := make([]Record, 64)
	for i := range recs {
		recs[i] = Record{Key: []byte("key"), Value: make([]byte, 100)}
	}
	frame := Encode(nil, sampleHeader(), recs)
	dst = make([]Record, 0, 64)
	if n := testing.AllocsPerRun(100, func() { _, _, _ = DecodeAppend(dst[:0], frame) }); n != 0 {
		t.Errorf("DecodeAppend into a large enough slice allocates %v times", n)
	}
}
