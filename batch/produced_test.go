package batch

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
)

// randomProduced returns random records a producer may append (some
// tombstones, some headers) and their produced frame.
func randomProduced(rng *rand.Rand) ([]Record, []byte) {
	_, recs := randomBatch(rng)
	if len(recs) == 0 {
		recs = []Record{{Value: []byte("v")}}
	}
	for i := range recs {
		if rng.IntN(8) == 0 {
			recs[i].Value, recs[i].Tombstone = nil, true
		}
	}
	pid := uint64(0)
	seq := uint64(0)
	if rng.IntN(2) == 0 {
		pid, seq = rng.Uint64(), rng.Uint64()>>2
	}
	return recs, EncodeProduced(nil, pid, seq, recs)
}

// payloadBytes is what RecordView.PayloadBytes must say of r.
func payloadBytes(r Record) int {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// TestProducedRoundTrip: a produced frame passes ValidateProduced, which
// shows each record's key, headers, size and tombstone as they were
// built, and decodes to the records it was built from.
func TestProducedRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 500 {
		recs, frame := randomProduced(rng)
		size, ok := ProducedBytes(recs)
		if !ok || size != len(frame) {
			t.Fatalf("case %d: ProducedBytes = %d, %v; frame is %d bytes", i, size, ok, len(frame))
		}
		seen := 0
		h, err := ValidateProduced(frame, func(j int, v RecordView) error {
			r := recs[j]
			if j != seen || !bytes.Equal(v.Key, r.Key) || v.HeaderCount != len(r.Headers) || v.PayloadBytes != payloadBytes(r) || v.Tombstone != r.Tombstone {
				t.Fatalf("case %d record %d: view %+v, record %+v", i, j, v, r)
			}
			seen++
			return nil
		})
		if err != nil || seen != len(recs) || h.RecordCount != uint32(len(recs)) {
			t.Fatalf("case %d: ValidateProduced saw %d of %d records: %v", i, seen, len(recs), err)
		}
		_, got, err := Decode(frame)
		if err != nil || !recordsEqual(got, recs) {
			t.Fatalf("case %d: decode: %v", i, err)
		}
	}
}

// TestProducedRefusesEveryDamage: every one-byte change and every
// truncation or extension of a produced frame is refused with a typed
// error (the CRC covers all but the length and CRC fields, whose damage
// the length and CRC checks catch).
func TestProducedRefusesEveryDamage(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range 20 {
		_, frame := randomProduced(rng)
		for p := range frame {
			bad := bytes.Clone(frame)
			bad[p] ^= byte(1 + rng.IntN(255))
			wantTyped(t, bad, "byte %d of case %d changed", p, i)
		}
		for n := range len(frame) {
			wantTyped(t, frame[:n], "case %d cut to %d bytes", i, n)
		}
		wantTyped(t, append(bytes.Clone(frame), 0), "case %d with a byte after it", i)
	}
}

// wantTyped asserts that ValidateProduced refuses frame with an error
// wrapping one of the package's sentinels.
func wantTyped(t *testing.T, frame []byte, format string, args ...any) {
	t.Helper()
	_, err := ValidateProduced(frame, nil)
	if err == nil || !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrShort) && !errors.Is(err, ErrNotProduced) {
		t.Fatalf(format+": ValidateProduced = %v, want a typed refusal", append(args, err)...)
	}
}

// TestProducedRefusesLeaderFields: a well-formed frame that is not a
// producer's (a field only the leader sets, another type, compacted) is
// refused with ErrNotProduced, and an error from visit stops the walk.
func TestProducedRefusesLeaderFields(t *testing.T) {
	recs := []Record{{Key: []byte("a"), Value: []byte("1")}, {Key: []byte("b")}}
	for name, h := range map[string]Header{
		"base offset": {BaseOffset: 1},
		"epoch":       {Epoch: 1},
		"term":        {Term: 1},
		"index":       {Index: 1},
		"append time": {AppendTimeUnixNanos: 1},
		"hlc":         {HLC: 1},
		"compacted":   {OffsetSpan: 5},
		"noop":        {Type: TypeNoop},
	} {
		var frame []byte
		switch {
		case h.Type == TypeNoop:
			frame = EncodeControl(nil, h, nil)
		case h.OffsetSpan != 0:
			frame = Encode(nil, h, []Record{{Key: []byte("a"), OffsetDelta: 1}, {Key: []byte("b"), OffsetDelta: 3}})
		default:
			frame = Encode(nil, h, recs)
		}
		if _, err := Validate(frame); err != nil {
			t.Fatalf("%s: the frame itself is invalid: %v", name, err)
		}
		if _, err := ValidateProduced(frame, nil); !errors.Is(err, ErrNotProduced) {
			t.Fatalf("%s: ValidateProduced = %v, want ErrNotProduced", name, err)
		}
	}
	stop := errors.New("stop")
	visits := 0
	_, err := ValidateProduced(EncodeProduced(nil, 0, 0, recs), func(i int, _ RecordView) error {
		visits++
		return stop
	})
	if err != stop || visits != 1 {
		t.Fatalf("visit's error: got %v after %d visits", err, visits)
	}
}

func TestPatchProducer(t *testing.T) {
	recs := []Record{{Key: []byte("a"), Value: []byte("1")}}
	frame := EncodeProduced(nil, 1, 2, recs)
	PatchProducer(frame, 7, 40)
	if !bytes.Equal(frame, EncodeProduced(nil, 7, 40, recs)) {
		t.Fatal("PatchProducer differs from encoding under the new numbers")
	}
}

func TestProducedBytesRefusesWhatEncodePanicsOn(t *testing.T) {
	if _, ok := ProducedBytes([]Record{{Key: []byte("k"), Value: []byte("v"), Tombstone: true}}); ok {
		t.Fatal("a tombstone with a value was judged encodable")
	}
	if _, ok := ProducedBytes([]Record{{Value: make([]byte, FrameBytesMax)}}); ok {
		t.Fatal("a frame over FrameBytesMax was judged encodable")
	}
}

func TestValidateProducedAllocations(t *testing.T) {
	frame := EncodeProduced(nil, 1, 0, benchRecords(64))
	visit := func(int, RecordView) error { return nil }
	if n := testing.AllocsPerRun(100, func() {
		if _, err := ValidateProduced(frame, visit); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("ValidateProduced allocates %v times", n)
	}
}

// FuzzValidateProduced: whatever its input, ValidateProduced never panics
// and either refuses it with a typed error or accepts a frame that
// decodes, is a producer's, and re-encodes to the same bytes.
func FuzzValidateProduced(f *testing.F) {
	rng := rand.New(rand.NewPCG(7, 8))
	for range 8 {
		_, frame := randomProduced(rng)
		f.Add(frame)
		f.Add(frame[:len(frame)/2])
	}
	for _, frame := range seedFrames() {
		f.Add(frame)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkProduced(t, b)
		if fixed, ok := withLengthAndCRC(b); ok {
			checkProduced(t, fixed)
		}
	})
}

func checkProduced(t *testing.T, b []byte) {
	t.Helper()
	views := 0
	h, err := ValidateProduced(b, func(int, RecordView) error { views++; return nil })
	if err != nil {
		if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrShort) && !errors.Is(err, ErrNotProduced) {
			t.Fatalf("untyped refusal: %v", err)
		}
		return
	}
	dh, recs, derr := Decode(b)
	if derr != nil || dh != h || views != len(recs) {
		t.Fatalf("accepted a frame Decode refuses or disagrees on: %v (%d views, %d records)", derr, views, len(recs))
	}
	if again := EncodeProduced(nil, h.ProducerID, h.BaseSequence, recs); !bytes.Equal(again, b) {
		t.Fatal("accepted frame does not re-encode to itself")
	}
}
