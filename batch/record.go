package batch

import (
	"encoding/binary"
	"math/bits"
)

// RecordHeader is one application header of a record.
type RecordHeader struct {
	Key   string
	Value []byte
}

// Record is one producer record. Its offset is its frame's BaseOffset plus
// OffsetDelta (Header.Offset): record i of a frame as appended has
// OffsetDelta i; in a frame compaction rewrote, the records kept keep
// their offsets and the deltas have holes.
type Record struct {
	Key                   []byte
	Value                 []byte
	Headers               []RecordHeader
	ProducerTimeUnixNanos int64
	// Tombstone marks a deletion of Key: the record has no value (not an
	// empty one), and compaction by key eventually removes the key.
	Tombstone bool
	// OffsetDelta is the record's offset minus its frame's BaseOffset, as
	// decoded; Encode reads it only for a compacted frame.
	OffsetDelta uint32
}

// Record attributes (the byte a record carries in a frame with
// FlagTombstones).
const (
	attrTombstone = 1 << 0
	attrsKnown    = attrTombstone
)

// EncodedRecordSize returns the number of bytes r takes inside a frame as
// appended (not compacted), counting an attributes byte if r is a
// tombstone. In a frame holding a tombstone every record carries that
// byte, so a batch of both kinds takes up to one byte per record more.
func EncodedRecordSize(r Record) int {
	f := recordFormat{attributes: r.Tombstone}
	return f.recordSize(&r)
}

// recordFormat is how the records of one frame are laid out (from its
// header) and, while a frame is walked, what the walk has seen.
type recordFormat struct {
	compacted  bool   // each record starts with its offset delta
	attributes bool   // each record carries an attributes byte
	span       uint32 // a compacted frame's OffsetSpan
	// next is the lowest offset delta the next record may have (a dense
	// frame's next record has exactly that one).
	next       uint64
	tombstones int
	// key, payloadBytes and tombstone describe the last record read: its
	// key (aliasing the frame), the bytes of its key, value and header
	// keys and values, and whether it is a tombstone.
	key          []byte
	payloadBytes int
	tombstone    bool
}

func newRecordFormat(h Header) recordFormat {
	return recordFormat{compacted: h.Flags&FlagCompacted != 0, attributes: h.Flags&FlagTombstones != 0, span: h.OffsetSpan}
}

// recordSize returns the bytes r takes in a frame of format f.
func (f *recordFormat) recordSize(r *Record) int {
	body := f.bodySize(r)
	return uvarintSize(uint64(body)) + body
}

// bodySize returns the bytes of r after its bodyLen prefix.
func (f *recordFormat) bodySize(r *Record) int {
	n := uvarintSize(zigzag(r.ProducerTimeUnixNanos)) +
		fieldSize(len(r.Key)) + fieldSize(len(r.Value)) +
		uvarintSize(uint64(len(r.Headers)))
	if f.compacted {
		n += uvarintSize(uint64(r.OffsetDelta))
	}
	if f.attributes {
		n++
	}
	for i := range r.Headers {
		n += fieldSize(len(r.Headers[i].Key)) + fieldSize(len(r.Headers[i].Value))
	}
	return n
}

// putRecord encodes r into b at p, which Encode has sized, and returns the
// position after it.
func (f *recordFormat) putRecord(b []byte, p int, r *Record) int {
	p += binary.PutUvarint(b[p:], uint64(f.bodySize(r)))
	if f.compacted {
		p += binary.PutUvarint(b[p:], uint64(r.OffsetDelta))
	}
	if f.attributes {
		var a byte
		if r.Tombstone {
			a |= attrTombstone
		}
		b[p] = a
		p++
	}
	p += binary.PutUvarint(b[p:], zigzag(r.ProducerTimeUnixNanos))
	p = putField(b, p, r.Key)
	p = putField(b, p, r.Value)
	p += binary.PutUvarint(b[p:], uint64(len(r.Headers)))
	for i := range r.Headers {
		p += binary.PutUvarint(b[p:], uint64(len(r.Headers[i].Key)))
		p += copy(b[p:], r.Headers[i].Key)
		p = putField(b, p, r.Headers[i].Value)
	}
	return p
}

func putField(f []byte, p int, b []byte) int {
	p += binary.PutUvarint(f[p:], uint64(len(b)))
	return p + copy(f[p:], b)
}

// readRecord parses the record at the start of b, laid out as f says, and
// returns its encoded size and number of headers; f notes the record's
// offset delta and attributes. With rec == nil it only validates.
// Otherwise it fills *rec, storing the record's headers in hdrs, which
// must have room for them (the validating pass counted them).
func readRecord(b []byte, f *recordFormat, rec *Record, hdrs []RecordHeader) (n, headerCount int, err error) {
	bodyLen, m := readUvarint(b)
	if m <= 0 {
		return 0, 0, errVarint
	}
	if bodyLen > uint64(len(b)-m) {
		return 0, 0, errRecordLength
	}
	body := b[m : m+int(bodyLen)]
	n = m + int(bodyLen)

	delta, tombstone, p, err := f.readPrefix(body)
	if err != nil {
		return 0, 0, err
	}
	ts, q := readUvarint(body[p:])
	if q <= 0 {
		return 0, 0, errVarint
	}
	p += q
	key, p, err := readField(body, p)
	if err != nil {
		return 0, 0, err
	}
	value, p, err := readField(body, p)
	if err != nil {
		return 0, 0, err
	}
	if tombstone && len(value) > 0 {
		return 0, 0, errTombstone
	}
	count, m := readUvarint(body[p:])
	if m <= 0 {
		return 0, 0, errVarint
	}
	p += m
	// Bound the count by the bytes left before trusting it anywhere.
	if count > uint64(len(body)-p)/recordHeaderBytesMin {
		return 0, 0, errHeaderCount
	}
	headerCount = int(count)
	f.key, f.payloadBytes, f.tombstone = key, len(key)+len(value), tombstone
	if rec != nil {
		rec.Key, rec.Value, rec.Headers = key, value, nil
		rec.ProducerTimeUnixNanos = unzigzag(ts)
		rec.Tombstone, rec.OffsetDelta = tombstone, delta
		if headerCount > 0 {
			rec.Headers = hdrs[:headerCount:headerCount]
		}
	}
	for i := range headerCount {
		var k, v []byte
		if k, p, err = readField(body, p); err != nil {
			return 0, 0, err
		}
		if v, p, err = readField(body, p); err != nil {
			return 0, 0, err
		}
		f.payloadBytes += len(k) + len(v)
		if rec != nil {
			hdrs[i] = RecordHeader{Key: string(k), Value: v}
		}
	}
	if p != len(body) {
		return 0, 0, errRecordTrail
	}
	return n, headerCount, nil
}

// readPrefix parses what precedes a record's producer time in format f: its
// offset delta (a compacted frame's records carry theirs, strictly
// increasing within the span; a dense frame's record i has delta i) and
// its attributes byte. It returns the bytes of body it read.
func (f *recordFormat) readPrefix(body []byte) (delta uint32, tombstone bool, p int, err error) {
	d := f.next
	if f.compacted {
		var m int
		d, m = readUvarint(body)
		if m <= 0 {
			return 0, false, 0, errVarint
		}
		if d < f.next || d >= uint64(f.span) {
			return 0, false, 0, errDelta
		}
		p = m
	}
	f.next = d + 1
	if f.attributes {
		if p >= len(body) {
			return 0, false, 0, errRecordTrail
		}
		a := body[p]
		if a&^attrsKnown != 0 {
			return 0, false, 0, errAttributes
		}
		tombstone = a&attrTombstone != 0
		p++
	}
	if tombstone {
		f.tombstones++
	}
	return uint32(d), tombstone, p, nil
}

// readField parses a uvarint length and that many bytes of b at p. A
// zero-length field reads as nil; a non-empty one aliases b with its capacity
// capped at its length.
func readField(b []byte, p int) ([]byte, int, error) {
	l, m := readUvarint(b[p:])
	if m <= 0 {
		return nil, 0, errVarint
	}
	p += m
	if l > uint64(len(b)-p) {
		return nil, 0, errFieldLength
	}
	if l == 0 {
		return nil, p, nil
	}
	end := p + int(l)
	return b[p:end:end], end, nil
}

// readUvarint decodes a minimal uvarint from b. It returns n <= 0 when b
// holds no complete uvarint, the value overflows 64 bits, or the encoding is
// longer than necessary (which would break the canonical encoding that lets
// decode-then-encode reproduce a frame).
func readUvarint(b []byte) (uint64, int) {
	v, n := binary.Uvarint(b)
	if n > 1 && b[n-1] == 0 {
		return 0, -1
	}
	return v, n
}

func fieldSize(l int) int { return uvarintSize(uint64(l)) + l }

// uvarintSize returns the bytes binary.PutUvarint uses for v.
func uvarintSize(v uint64) int {
	return 1 + (bits.Len64(v|1)-1)/7
}

func zigzag(v int64) uint64   { return uint64(v<<1) ^ uint64(v>>63) }
func unzigzag(u uint64) int64 { return int64(u>>1) ^ -int64(u&1) }
