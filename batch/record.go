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

// Record is one producer record. Record i of a batch has offset
// BaseOffset+i.
type Record struct {
	Key                   []byte
	Value                 []byte
	Headers               []RecordHeader
	ProducerTimeUnixNanos int64
}

// EncodedRecordSize returns the number of bytes r takes inside a frame.
func EncodedRecordSize(r Record) int {
	body := recordBodySize(&r)
	return uvarintSize(uint64(body)) + body
}

// recordBodySize returns the bytes of r after its bodyLen prefix.
func recordBodySize(r *Record) int {
	n := uvarintSize(zigzag(r.ProducerTimeUnixNanos)) +
		fieldSize(len(r.Key)) + fieldSize(len(r.Value)) +
		uvarintSize(uint64(len(r.Headers)))
	for i := range r.Headers {
		n += fieldSize(len(r.Headers[i].Key)) + fieldSize(len(r.Headers[i].Value))
	}
	return n
}

// putRecord encodes r into f at p, which Encode has sized, and returns the
// position after it.
func putRecord(f []byte, p int, r *Record) int {
	p += binary.PutUvarint(f[p:], uint64(recordBodySize(r)))
	p += binary.PutUvarint(f[p:], zigzag(r.ProducerTimeUnixNanos))
	p = putField(f, p, r.Key)
	p = putField(f, p, r.Value)
	p += binary.PutUvarint(f[p:], uint64(len(r.Headers)))
	for i := range r.Headers {
		p += binary.PutUvarint(f[p:], uint64(len(r.Headers[i].Key)))
		p += copy(f[p:], r.Headers[i].Key)
		p = putField(f, p, r.Headers[i].Value)
	}
	return p
}

func putField(f []byte, p int, b []byte) int {
	p += binary.PutUvarint(f[p:], uint64(len(b)))
	return p + copy(f[p:], b)
}

// readRecord parses the record at the start of b and returns its encoded
// size and number of headers. With rec == nil it only validates. Otherwise
// it fills *rec, storing the record's headers in hdrs, which must have room
// for them (the validating pass counted them).
func readRecord(b []byte, rec *Record, hdrs []RecordHeader) (n, headerCount int, err error) {
	bodyLen, m := readUvarint(b)
	if m <= 0 {
		return 0, 0, errVarint
	}
	if bodyLen > uint64(len(b)-m) {
		return 0, 0, errRecordLength
	}
	body := b[m : m+int(bodyLen)]
	n = m + int(bodyLen)

	ts, p := readUvarint(body)
	if p <= 0 {
		return 0, 0, errVarint
	}
	key, p, err := readField(body, p)
	if err != nil {
		return 0, 0, err
	}
	value, p, err := readField(body, p)
	if err != nil {
		return 0, 0, err
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
	if rec != nil {
		rec.Key, rec.Value, rec.Headers = key, value, nil
		rec.ProducerTimeUnixNanos = unzigzag(ts)
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
		if rec != nil {
			hdrs[i] = RecordHeader{Key: string(k), Value: v}
		}
	}
	if p != len(body) {
		return 0, 0, errRecordTrail
	}
	return n, headerCount, nil
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
