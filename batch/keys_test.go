package batch

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
)

// checkRecordKeys runs RecordKeys on b and holds it to the other decoders:
// it never panics, and on a frame whose header verifies it succeeds exactly
// when Validate does, giving the keys Decode gives.
func checkRecordKeys(t *testing.T, b []byte) {
	t.Helper()
	var keys [][]byte
	var deltas []uint32
	err := RecordKeys(b, func(delta uint32, key []byte) {
		if len(deltas) > 0 && delta <= deltas[len(deltas)-1] {
			t.Fatalf("RecordKeys gave delta %d after %d", delta, deltas[len(deltas)-1])
		}
		keys, deltas = append(keys, key), append(deltas, delta)
	})
	if err != nil && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrShort) {
		t.Fatalf("RecordKeys error %v is neither ErrCorrupt nor ErrShort", err)
	}
	hh, herr := DecodeHeader(b)
	if herr != nil {
		return // RecordKeys trusts a header check it does not make
	}
	if hh.Type != TypeData {
		// Readers see no record of another frame: neither does RecordKeys,
		// whatever the frame's payload.
		if err != nil || len(keys) > 0 {
			t.Fatalf("RecordKeys of a %v frame: %d keys, %v", hh.Type, len(keys), err)
		}
		return
	}
	_, verr := Validate(b)
	if (err == nil) != (verr == nil) {
		t.Fatalf("RecordKeys error %v, Validate error %v", err, verr)
	}
	if err != nil {
		return
	}
	_, recs, derr := Decode(b)
	if derr != nil {
		t.Fatalf("Decode of a valid frame: %v", derr)
	}
	if len(keys) != len(recs) {
		t.Fatalf("RecordKeys gave %d keys, Decode %d records", len(keys), len(recs))
	}
	for i := range recs {
		if !bytes.Equal(keys[i], recs[i].Key) || (keys[i] == nil) != (recs[i].Key == nil) || deltas[i] != recs[i].OffsetDelta {
			t.Fatalf("record %d: RecordKeys key %q delta %d, Decode key %q delta %d", i, keys[i], deltas[i], recs[i].Key, recs[i].OffsetDelta)
		}
	}
	// EachRecord and RawRecord.Decode give the records Decode gives.
	n := 0
	if err := EachRecord(b, func(raw RawRecord) bool {
		r, err := raw.Decode()
		if err != nil || raw.Delta != recs[n].OffsetDelta || !reflect.DeepEqual(r, recs[n]) {
			t.Fatalf("record %d (delta %d): Decode %+v, %v; frame's Decode %+v", n, raw.Delta, r, err, recs[n])
		}
		n++
		return true
	}); err != nil || n != len(recs) {
		t.Fatalf("EachRecord: %d records, %v", n, err)
	}
}

// checkEachRecord runs EachRecord and RawRecord.Decode on any input: they
// never panic, and fail only with ErrCorrupt or ErrShort.
func checkEachRecord(t *testing.T, b []byte) {
	t.Helper()
	i := 0
	err := EachRecord(b, func(raw RawRecord) bool {
		if _, err := raw.Decode(); err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("RawRecord.Decode error %v is not ErrCorrupt", err)
		}
		i++
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
	if err := RecordKeys(frame, func(_ uint32, key []byte) { got = append(got, string(key)) }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0] != "a" || got[1] != "" || got[2] != "ccc" {
		t.Fatalf("keys %q", got)
	}
	// A compacted frame gives its records' deltas; a compaction marker
	// gives nothing (readers never see its record).
	compacted := Encode(nil, compactedHeader(9), []Record{{Key: []byte("a"), OffsetDelta: 2}, {Key: []byte("b"), Tombstone: true, OffsetDelta: 8}})
	var deltas []uint32
	if err := RecordKeys(compacted, func(d uint32, key []byte) { deltas = append(deltas, d) }); err != nil || !reflect.DeepEqual(deltas, []uint32{2, 8}) {
		t.Fatalf("compacted deltas %v, %v", deltas, err)
	}
	marker := EncodeCompaction(nil, Header{BaseOffset: 40}, Compaction{Point: 30})
	if err := RecordKeys(marker, func(uint32, []byte) { t.Fatal("a marker has a key") }); err != nil {
		t.Fatal(err)
	}
	// A torn frame, and a record count the body cannot hold.
	if err := RecordKeys(frame[:len(frame)-1], func(uint32, []byte) {}); !errors.Is(err, ErrShort) {
		t.Fatalf("torn frame: %v", err)
	}
	bad := bytes.Clone(frame)
	binary.LittleEndian.PutUint32(bad[posRecordCount:], 4)
	if err := RecordKeys(bad, func(uint32, []byte) {}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("too many records: %v", err)
	}
}

// FuzzRecordKeys feeds arbitrary bytes, and the same bytes with a valid
// length and CRC, to RecordKeys, EachRecord and RawRecord.Decode (see
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
		if fixed, ok := withLengthAndCRC(b); ok {
			checkRecordKeys(t, fixed)
			checkEachRecord(t, fixed)
		}
	})
}
