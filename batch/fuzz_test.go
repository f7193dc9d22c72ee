package batch

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"testing"
)

// seedFrames returns valid frames used to seed both fuzz targets.
func seedFrames() [][]byte {
	return [][]byte{
		Encode(nil, Header{Type: TypeNoop}, nil),
		Encode(nil, sampleHeader(), []Record{{}}),
		Encode(nil, sampleHeader(), []Record{{Key: []byte("k"), Value: []byte("v"), ProducerTimeUnixNanos: -3}}),
		Encode(nil, sampleHeader(), []Record{
			{Key: []byte("a"), Value: []byte("1"), Headers: []RecordHeader{{Key: "h", Value: []byte("x")}, {Key: "g"}}},
			{Key: []byte("b"), Value: bytes.Repeat([]byte{7}, 300)},
		}),
		EncodeControl(nil, Header{Type: TypeNoop, BaseOffset: 12, Term: 3, Index: 40}, nil),
		EncodeControl(nil, Header{Type: TypeConfig, BaseOffset: 12, Term: 3, Index: 41}, []byte{2, 0x08, 0x01, 0x10, 0x02}),
		EncodeControl(nil, Header{Type: TypeFork, BaseOffset: 12, Epoch: 2, Term: 3, Index: 90}, []byte{41, 0, 0, 0, 0, 0, 0, 0, 'x'}),
		// A payload that looks like records must stay a payload.
		EncodeControl(nil, Header{Type: TypeConfig, Index: 7}, Encode(nil, sampleHeader(), []Record{{Key: []byte("k")}})[HeaderSize:]),
		Encode(nil, sampleHeader(), []Record{{Key: []byte("k"), Tombstone: true}, {Key: []byte("j"), Value: []byte("v")}}),
		Encode(nil, compactedHeader(9), []Record{{Key: []byte("a"), OffsetDelta: 2}, {Key: []byte("b"), Tombstone: true, OffsetDelta: 8}}),
		Encode(nil, compactedHeader(3), nil),
		EncodeCompaction(nil, Header{BaseOffset: 40, Epoch: 2, Term: 3, Index: 9}, Compaction{Point: 30, TombstoneCutoffUnixNanos: -1, ProducerCutoffUnixNanos: 5}),
		EncodeSplit(nil, Header{BaseOffset: 41, Epoch: 2, Term: 3, Index: 10}, sampleSplit()),
	}
}

// compactedHeader returns sampleHeader as compaction leaves it, spanning
// span offsets.
func compactedHeader(span uint32) Header {
	h := sampleHeader()
	h.OffsetSpan = span
	return h
}

// FuzzDecode feeds arbitrary bytes to every decoder. None may panic; when
// Decode succeeds, encoding its result must reproduce the frame exactly, and
// the other decoders must agree with it.
func FuzzDecode(f *testing.F) {
	for _, frame := range seedFrames() {
		f.Add(frame)
		f.Add(frame[:len(frame)/2])
	}
	f.Add([]byte{})
	f.Add([]byte{0x54, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecoders(t, b)
		// The CRC stops almost every mutation at the door; also try the
		// input with its length and CRC made right, so that the fuzzer
		// reaches the header and record parsers.
		if fixed, ok := withLengthAndCRC(b); ok {
			checkDecoders(t, fixed)
		}
	})
}

// withLengthAndCRC returns a copy of b with its length field and CRC made
// right for its bytes, so that a fuzzer reaches past them; ok is false
// when b cannot be a frame (shorter than a header or over FrameBytesMax).
func withLengthAndCRC(b []byte) (fixed []byte, ok bool) {
	if len(b) < HeaderSize || len(b) > FrameBytesMax {
		return nil, false
	}
	fixed = bytes.Clone(b)
	binary.LittleEndian.PutUint32(fixed[posLength:], uint32(len(fixed)-4))
	binary.LittleEndian.PutUint32(fixed[posCRC:], crc32.Checksum(fixed[crcStart:], castagnoli))
	return fixed, true
}

// checkDecoders runs every decoder on b and checks that they agree and that
// a successful decode re-encodes to the same frame.
func checkDecoders(t *testing.T, b []byte) {
	t.Helper()
	_, sizeErr := FrameSize(b)
	hh, hErr := DecodeHeader(b)
	vh, vErr := Validate(b)
	h, recs, err := Decode(b)
	prev, fErr := ForkPrevIndex(b)
	if fErr == nil && (err != nil || h.Type != TypeFork || binary.LittleEndian.Uint64(b[HeaderSize:]) != prev) {
		t.Fatalf("ForkPrevIndex accepted a frame Decode did not take for a fork: %v", err)
	}
	if IsFork(b) && err == nil && h.Type != TypeFork || IsData(b) && err == nil && h.Type != TypeData ||
		IsCompaction(b) && err == nil && h.Type != TypeCompact {
		t.Fatalf("IsFork, IsData or IsCompaction disagree with type %v", h.Type)
	}
	mh, c, mErr := DecodeCompaction(b)
	if (mErr == nil) != (err == nil && h.Type == TypeCompact) || mErr == nil && mh != h {
		t.Fatalf("DecodeCompaction = %+v, %v; Decode says %+v, %v", mh, mErr, h, err)
	}
	if mErr == nil {
		if again := EncodeCompaction(nil, h, c); !bytes.Equal(again, b[:len(again)]) {
			t.Fatalf("re-encoding the compaction marker changed it")
		}
	}
	checkSplitDecoder(t, b, h, err)
	if err != nil {
		if !errors.Is(err, ErrShort) && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Decode error %v is neither ErrShort nor ErrCorrupt", err)
		}
		if vErr == nil {
			t.Fatalf("Validate accepted what Decode rejected: %v", err)
		}
		return
	}
	if sizeErr != nil || hErr != nil || vErr != nil || hh != h || vh != h {
		t.Fatalf("decoders disagree: FrameSize %v, DecodeHeader %+v %v, Validate %+v %v, Decode %+v",
			sizeErr, hh, hErr, vh, vErr, h)
	}
	size, _ := FrameSize(b)
	if int(h.RecordCount) != len(recs) {
		t.Fatalf("RecordCount %d, decoded %d records", h.RecordCount, len(recs))
	}
	for i := range recs {
		if i > 0 && recs[i].OffsetDelta <= recs[i-1].OffsetDelta || recs[i].OffsetDelta >= h.Span() ||
			!h.Compacted() && recs[i].OffsetDelta != uint32(i) || recs[i].Tombstone && recs[i].Value != nil {
			t.Fatalf("record %d of a frame spanning %d: delta %d, tombstone %v with %d value bytes",
				i, h.Span(), recs[i].OffsetDelta, recs[i].Tombstone, len(recs[i].Value))
		}
	}
	ch, payload, cErr := DecodeControl(b)
	if !h.IsControl() {
		if !errors.Is(cErr, ErrNotControl) {
			t.Fatalf("DecodeControl of a %v frame with %d records: %v", h.Type, h.RecordCount, cErr)
		}
		if again := Encode(nil, h, recs); !bytes.Equal(again, b[:size]) {
			t.Fatalf("re-encoding changed the frame:\n in  %x\n out %x", b[:size], again)
		}
		return
	}
	if cErr != nil || ch != h {
		t.Fatalf("DecodeControl = %+v, %v; Decode says %+v", ch, cErr, h)
	}
	if len(payload) != size-HeaderSize || (len(payload) == 0) != (payload == nil) {
		t.Fatalf("payload of %d bytes in a frame of %d", len(payload), size)
	}
	if again := EncodeControl(nil, h, payload); !bytes.Equal(again, b[:size]) {
		t.Fatalf("re-encoding the control frame changed it:\n in  %x\n out %x", b[:size], again)
	}
}

// FuzzRoundTrip builds a batch from structured input, encodes it and checks
// that decoding returns the same header and records.
//
// nrec's high bits vary the frame beyond its records: bit 5 makes the
// records with an odd length byte tombstones, bit 6 makes the frame
// compacted (spanning more offsets than it holds, with deltas carved from
// data), bit 7 turns it into a compaction marker.
func FuzzRoundTrip(f *testing.F) {
	f.Add(uint8(0), uint64(0), uint64(1), int64(2), uint64(3), uint64(4), int64(-5), uint8(3), []byte("key=value;hdr"))
	f.Add(uint8(0), uint64(5), uint64(1), int64(2), uint64(3), uint64(4), int64(-5), uint8(3|32|64), []byte("key=value;hdr;more"))
	f.Add(uint8(0), uint64(5), uint64(1), int64(2), uint64(3), uint64(4), int64(-5), uint8(128), []byte("marker"))
	f.Add(uint8(1), uint64(1<<62), uint64(0), int64(-1), uint64(0), uint64(0), int64(0), uint8(0), []byte{})
	f.Add(uint8(2), uint64(7), uint64(1<<63), int64(1<<62), uint64(9), uint64(10), int64(1<<40), uint8(40), bytes.Repeat([]byte{0xff, 0, 1}, 100))
	f.Add(uint8(2), uint64(7), uint64(3), int64(5), uint64(0), uint64(0), int64(0), uint8(0), []byte{1, 0x08, 0x01, 0x10, 0x02})
	f.Add(uint8(1), uint64(math.MaxUint64), uint64(3), int64(5), uint64(0), uint64(0), int64(0), uint8(64), []byte("noop payload"))
	f.Fuzz(func(t *testing.T, typ uint8, baseOffset, epoch uint64, appendTime int64,
		producerID, baseSequence uint64, producerTime int64, nrec uint8, data []byte) {
		if nrec&128 != 0 {
			roundTripMarker(t, baseOffset>>1, epoch, appendTime, data)
			return
		}
		h := Header{
			Type:                Type(typ % 3),
			BaseOffset:          baseOffset >> 1, // leave room for the record count
			Epoch:               epoch,
			Term:                epoch ^ 0x5555,
			Index:               baseOffset,
			AppendTimeUnixNanos: appendTime,
			HLC:                 uint64(appendTime),
			ProducerID:          producerID,
			BaseSequence:        baseSequence,
		}
		tombstones, compacted := nrec&32 != 0, nrec&64 != 0
		if compacted || tombstones {
			h.Type = TypeData
		}
		if nrec%32 == 0 && h.Type != TypeData {
			// A control frame: data is its payload.
			frame := EncodeControl(nil, h, data)
			got, payload, err := DecodeControl(frame)
			if err != nil || got != h || !bytes.Equal(payload, data) {
				t.Fatalf("DecodeControl = %+v, %x, %v; want %+v, %x", got, payload, err, h, data)
			}
			if got, recs, err := Decode(frame); err != nil || got != h || recs != nil {
				t.Fatalf("Decode of a control frame = %+v, %d records, %v", got, len(recs), err)
			}
			if got.NextOffset() != h.BaseOffset {
				t.Fatalf("control frame takes offsets: NextOffset %d, BaseOffset %d", got.NextOffset(), h.BaseOffset)
			}
			return
		}
		recs := make([]Record, int(nrec)%32)
		// Carve keys, values and headers out of data deterministically.
		rest := data
		take := func(n int) []byte {
			n = min(n, len(rest))
			out := rest[:n:n]
			rest = rest[n:]
			if n == 0 {
				return nil
			}
			return out
		}
		for i := range recs {
			var l byte
			if len(rest) > 0 {
				l = rest[0]
			}
			recs[i] = Record{
				Key:                   take(int(l % 17)),
				Value:                 take(int(l)),
				ProducerTimeUnixNanos: producerTime + int64(i)*int64(l) - int64(i),
			}
			for j := range int(l % 4) {
				recs[i].Headers = append(recs[i].Headers, RecordHeader{Key: string(take(j + 1)), Value: take(int(l % 5))})
			}
			if tombstones && l%2 == 1 {
				recs[i].Value, recs[i].Tombstone = nil, true
			}
			if compacted {
				recs[i].OffsetDelta = uint32(i)*3 + uint32(l%3)
			}
		}
		if compacted {
			h.OffsetSpan = uint32(len(recs))*3 + 1
		}
		frame := Encode(nil, h, recs)
		got, gotRecs, err := Decode(frame)
		if err != nil {
			t.Fatalf("Decode of an encoded frame: %v", err)
		}
		h.RecordCount = uint32(len(recs))
		h.Flags = 0
		if compacted {
			h.Flags |= FlagCompacted
		}
		for _, r := range recs {
			if r.Tombstone {
				h.Flags |= FlagTombstones
			}
		}
		if got != h {
			t.Fatalf("header = %+v, want %+v", got, h)
		}
		if !recordsEqual(gotRecs, recs) {
			t.Fatalf("records = %v, want %v", gotRecs, recs)
		}
		for i := range gotRecs {
			if want := uint32(i); compacted && gotRecs[i].OffsetDelta != recs[i].OffsetDelta || !compacted && gotRecs[i].OffsetDelta != want {
				t.Fatalf("record %d: offset delta %d", i, gotRecs[i].OffsetDelta)
			}
		}
		if got.NextOffset() != h.BaseOffset+uint64(h.Span()) {
			t.Fatalf("NextOffset %d", got.NextOffset())
		}
	})
}

// roundTripMarker checks that a compaction marker built from fuzz input
// decodes to its decision.
func roundTripMarker(t *testing.T, baseOffset, epoch uint64, appendTime int64, data []byte) {
	t.Helper()
	var c Compaction
	if len(data) >= 8 {
		c.Point = binary.LittleEndian.Uint64(data)
	}
	c.TombstoneCutoffUnixNanos, c.ProducerCutoffUnixNanos = appendTime, -appendTime
	h := Header{BaseOffset: baseOffset, Epoch: epoch, AppendTimeUnixNanos: appendTime}
	frame := EncodeCompaction(nil, h, c)
	got, gc, err := DecodeCompaction(frame)
	h.Type, h.RecordCount = TypeCompact, 1
	if err != nil || got != h || gc != c || got.NextOffset() != baseOffset+1 {
		t.Fatalf("DecodeCompaction = %+v %+v %v, want %+v %+v", got, gc, err, h, c)
	}
}
