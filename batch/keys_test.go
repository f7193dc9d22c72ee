package batch

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"reflect"
	"testing"
)

// checkRecordKeys runs RecordKeys on b and holds it to the other decoders:
// it never panics, and on a frame whose header verifies it succeeds exactly
// when Validate does, giving the keys Decode gives.
func checkRecordKeys(t *testing.T, b []byte) {
	t.Helper()
	var keys [][]byte
	err := RecordKeys(b, func(i int, key []byte) {
		if i != len(keys) {
			t.Fatalf("RecordKeys gave record %d after %d records", i, len(keys))
		}
		keys = append(keys, key)
	})
	if err != nil && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrShort) {
		t.Fatalf("RecordKeys error %v is neither ErrCorrupt nor ErrShort", err)
	}
	if _, herr := DecodeHeader(b); herr != nil {
		return // RecordKeys trusts a header check it does not make
	}
	_, verr := Validate(b)
	if (err == nil) != (verr == nil) {
		t.Fatalf("RecordKeys error %v, Validate error %v", err, verr)
	}
	if err != nil {
		return
	}
	h, recs, derr := Decode(b)
	if derr != nil {
		t.Fatalf("Decode of a valid frame: %v", derr)
	}
	if h.IsControl() {
		recs = nil
	}
	if len(keys) != len(recs) {
		t.Fatalf("RecordKeys gave %d keys, Decode %d records", len(keys), len(recs))
	}
	for i := range recs {
		if !bytes.Equal(keys[i], recs[i].Key) || (keys[i] == nil) != (recs[i].Key == nil) {
			t.Fatalf("record %d: RecordKeys key %q, Decode key %q", i, keys[i], recs[i].Key)
		}
	}
	// EachRecord and DecodeRecord give the records Decode gives.
	n := 0
	if err := EachRecord(b, func(i int, rec []byte) bool {
		r, err := DecodeRecord(rec)
		if err != nil || i != n || !reflect.DeepEqual(r, recs[i]) {
			t.Fatalf("record %d (%d): DecodeRecord %+v, %v; Decode %+v", i, n, r, err, recs[i])
		}
		n++
		return true
	}); err != nil || n != len(recs) {
		t.Fatalf("EachRecord: %d records, %v", n, err)
	}
}

// checkEachRecord runs EachRecord and DecodeRecord on any input: they
// never panic, and fail only with ErrCorrupt or ErrShort.
func checkEachRecord(t *testing.T, b []byte) {
	t.Helper()
	err := EachRecord(b, func(i int, rec []byte) bool {
		if _, err := DecodeRecord(rec); err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("DecodeRecord error %v is not ErrCorrupt", err)
		}
		return i < 1000
	})
	if err != nil && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrShort) {
		t.Fatalf("EachRecord error %v is neither ErrCorrupt nor ErrShort", err)
	}
}

func TestRecordKeys(t *testing.T) {
	for _, frame := range seedFrames() {
		checkRecordKeys(t, frame)
	}
	frame := Encode(nil, sampleHeader(), []Record{{Key: []byte("a")}, {}, {Key: []byte("ccc"), Value: []byte("v")}})
	var got []string
	if err := RecordKeys(frame, func(i int, key []byte) { got = append(got, string(key)) }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0] != "a" || got[1] != "" || got[2] != "ccc" {
		t.Fatalf("keys %q", got)
	}
	// A torn frame, and a record count the body cannot hold.
	if err := RecordKeys(frame[:len(frame)-1], func(int, []byte) {}); !errors.Is(err, ErrShort) {
		t.Fatalf("torn frame: %v", err)
	}
	bad := bytes.Clone(frame)
	binary.LittleEndian.PutUint32(bad[posRecordCount:], 4)
	if err := RecordKeys(bad, func(int, []byte) {}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("too many records: %v", err)
	}
}

// FuzzRecordKeys feeds arbitrary bytes, and the same bytes with a valid
// length and CRC, to RecordKeys, EachRecord and DecodeRecord (see
// checkRecordKeys and checkEachRecord).
func FuzzRecordKeys(f *testing.F) {
	for _, frame := range seedFrames() {
		f.Add(frame)
		f.Add(frame[:len(frame)-1])
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		checkRecordKeys(t, b)
		checkEachRecord(t, b)
		if len(b) >= HeaderSize && len(b) <= FrameBytesMax {
			fixed := bytes.Clone(b)
			binary.LittleEndian.PutUint32(fixed[posLength:], uint32(len(fixed)-4))
			binary.LittleEndian.PutUint32(fixed[posCRC:], crc32.Checksum(fixed[crcStart:], castagnoli))
			checkRecordKeys(t, fixed)
			checkEachRecord(t, fixed)
		}
	})
}
