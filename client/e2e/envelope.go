package e2e

import (
	"encoding/binary"
	"fmt"
)

// The envelope format, version 1 (docs/e2e-encryption.md has it byte by
// byte). A sealed record's value is
//
//	version(1) suite(1) keyIDLen(1) keyID(keyIDLen) salt(24) commitment(32) ciphertext(payload+16)
//
// and it carries the header HeaderName with the value HeaderValue.
const (
	// Version is the envelope version this package writes.
	Version = 1
	// SuiteAES256GCM is suite 1: per-record keys from HKDF-SHA256 over the
	// conversation key and a random salt, AES-256-GCM, a 32-byte key
	// commitment.
	SuiteAES256GCM = 1
	// HeaderName is the reserved header that marks a sealed record.
	HeaderName = "geolog-e2e"
	// HeaderValue is the marker header's value for envelopes of Version.
	HeaderValue = "1"

	// KeyIDBytesMax bounds a key id; ids are 1 to 255 bytes.
	KeyIDBytesMax = 255
	// SecretBytes is the size of a key's secret.
	SecretBytes = 32
	// SaltBytes is the size of an envelope's random salt.
	SaltBytes = 24
	// CommitmentBytes is the size of an envelope's key commitment.
	CommitmentBytes = 32
	// TagBytes is the size of the AES-GCM authentication tag.
	TagBytes = 16

	prefixFixedBytes = 3 // version, suite, key id length
)

// OverheadBytes returns how many bytes sealing adds to a value under a key
// id of keyIDBytes, with no sealed headers: the envelope's fixed fields,
// the tag and the payload's header count. The marker header comes on top.
func OverheadBytes(keyIDBytes int) int {
	return prefixFixedBytes + keyIDBytes + SaltBytes + CommitmentBytes + TagBytes + 1
}

// Envelope is a parsed sealed value. Its slices alias the bytes it was
// parsed from.
type Envelope struct {
	Version    byte
	Suite      byte
	KeyID      []byte
	Salt       []byte
	Commitment []byte
	// Ciphertext is the AES-GCM output: the sealed payload and its tag.
	Ciphertext []byte
}

// ParseEnvelope parses b without copying. It checks sizes only; nothing is
// authenticated until the envelope is opened. Errors wrap ErrMalformed or
// ErrUnsupported.
func ParseEnvelope(b []byte) (Envelope, error) {
	var e Envelope
	if len(b) < prefixFixedBytes {
		return e, fmt.Errorf("%w: %d bytes, shorter than the envelope prefix", ErrMalformed, len(b))
	}
	e.Version, e.Suite = b[0], b[1]
	if e.Version != Version {
		return e, fmt.Errorf("%w: envelope version %d", ErrUnsupported, e.Version)
	}
	if e.Suite != SuiteAES256GCM {
		return e, fmt.Errorf("%w: suite %d", ErrUnsupported, e.Suite)
	}
	idLen := int(b[2])
	if idLen == 0 {
		return e, fmt.Errorf("%w: empty key id", ErrMalformed)
	}
	rest := b[prefixFixedBytes:]
	if len(rest) < idLen+SaltBytes+CommitmentBytes+TagBytes {
		return e, fmt.Errorf("%w: %d bytes, too short for key id of %d bytes, salt, commitment and tag", ErrMalformed, len(b), idLen)
	}
	e.KeyID, rest = rest[:idLen], rest[idLen:]
	e.Salt, rest = rest[:SaltBytes], rest[SaltBytes:]
	e.Commitment, rest = rest[:CommitmentBytes], rest[CommitmentBytes:]
	e.Ciphertext = rest
	return e, nil
}

// prefix returns the envelope's first fields (version to key id), which
// the associated data begins with.
func (e *Envelope) prefix() []byte {
	out := make([]byte, 0, prefixFixedBytes+len(e.KeyID))
	return e.appendPrefix(out)
}

func (e *Envelope) appendPrefix(b []byte) []byte {
	b = append(b, e.Version, e.Suite, byte(len(e.KeyID)))
	return append(b, e.KeyID...)
}

// Append appends the encoded envelope to b. The caller keeps KeyID within
// 1 to KeyIDBytesMax bytes and Salt and Commitment at their sizes.
func (e *Envelope) Append(b []byte) []byte {
	b = e.appendPrefix(b)
	b = append(b, e.Salt...)
	b = append(b, e.Commitment...)
	return append(b, e.Ciphertext...)
}

// sealedHeader is a header carried inside the ciphertext with its index in
// the record's header list.
type sealedHeader struct {
	index int
	h     Header
}

// appendPayload appends the plaintext that is sealed: the sealed headers
// (count, then index, name and value of each, as uvarints and bytes) and
// then the value.
func appendPayload(b []byte, sealed []sealedHeader, value []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(sealed)))
	for _, s := range sealed {
		b = binary.AppendUvarint(b, uint64(s.index))
		b = appendBytes(b, []byte(s.h.Key))
		b = appendBytes(b, s.h.Value)
	}
	return append(b, value...)
}

// payloadBytes is the size appendPayload adds.
func payloadBytes(sealed []sealedHeader, value []byte) int {
	n := uvarintBytes(uint64(len(sealed))) + len(value)
	for _, s := range sealed {
		n += uvarintBytes(uint64(s.index)) + uvarintBytes(uint64(len(s.h.Key))) + len(s.h.Key) +
			uvarintBytes(uint64(len(s.h.Value))) + len(s.h.Value)
	}
	return n
}

// decodePayload reverses appendPayload. Indexes must increase strictly.
// Memory is bounded by len(b): the count is checked against the bytes left
// before anything is allocated. The value aliases b; header values are
// copied out.
func decodePayload(b []byte) ([]sealedHeader, []byte, error) {
	count, n := uvarint(b)
	if n <= 0 {
		return nil, nil, fmt.Errorf("%w: payload header count", ErrMalformed)
	}
	b = b[n:]
	// Each sealed header takes at least three bytes (index, name length,
	// value length).
	if count > uint64(len(b)/3) {
		return nil, nil, fmt.Errorf("%w: %d sealed headers in %d bytes", ErrMalformed, count, len(b))
	}
	var out []sealedHeader
	if count > 0 {
		out = make([]sealedHeader, count)
	}
	for i := range out {
		var s sealedHeader
		var err error
		if s, b, err = decodeSealedHeader(b); err != nil {
			return nil, nil, err
		}
		if i > 0 && s.index <= out[i-1].index {
			return nil, nil, fmt.Errorf("%w: sealed header indexes not increasing (%d after %d)", ErrMalformed, s.index, out[i-1].index)
		}
		out[i] = s
	}
	return out, b, nil
}

func decodeSealedHeader(b []byte) (sealedHeader, []byte, error) {
	var s sealedHeader
	index, n := uvarint(b)
	// An index is at most the header count, which len(b) bounds (a record
	// of the wire cannot hold more headers than bytes).
	if n <= 0 || index > uint64(len(b)) {
		return s, nil, fmt.Errorf("%w: sealed header index", ErrMalformed)
	}
	b = b[n:]
	name, b, err := readBytes(b)
	if err != nil {
		return s, nil, err
	}
	value, b, err := readBytes(b)
	if err != nil {
		return s, nil, err
	}
	s.index = int(index)
	s.h = Header{Key: string(name), Value: append([]byte(nil), value...)}
	return s, b, nil
}

func appendBytes(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

func readBytes(b []byte) (v, rest []byte, err error) {
	n, k := uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return nil, nil, fmt.Errorf("%w: length-prefixed field", ErrMalformed)
	}
	b = b[k:]
	return b[:n], b[n:], nil
}

// uvarint is binary.Uvarint that accepts only the shortest encoding (k <= 0
// otherwise): a payload decodes only from its canonical bytes, so one that
// decodes encodes again to the same bytes, and the bounds checked against
// the bytes left hold for the re-encoding too.
func uvarint(b []byte) (v uint64, k int) {
	v, k = binary.Uvarint(b)
	if k > 0 && k != uvarintBytes(v) {
		return 0, -k
	}
	return v, k
}

func uvarintBytes(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// associatedData is what the ciphertext is bound to besides itself: the
// envelope prefix (version, suite, key id), then the stream, the record key
// (the conversation), the producer time and the clear headers (the marker
// excluded), in the record's order:
//
//	prefix
//	uvarint len(stream)   stream
//	uvarint len(key)      key
//	8 bytes               producer time, Unix ns, big-endian two's complement
//	uvarint count         clear headers, each: uvarint len(name) name uvarint len(value) value
func associatedData(prefix []byte, r *Record, clear []Header) []byte {
	n := len(prefix) + 3*binary.MaxVarintLen64 + len(r.Stream) + len(r.Key) + 8
	for _, h := range clear {
		n += 2*binary.MaxVarintLen64 + len(h.Key) + len(h.Value)
	}
	b := make([]byte, 0, n)
	b = append(b, prefix...)
	b = appendBytes(b, []byte(r.Stream))
	b = appendBytes(b, r.Key)
	b = binary.BigEndian.AppendUint64(b, uint64(r.ProducerTimeUnixNanos))
	b = binary.AppendUvarint(b, uint64(len(clear)))
	for _, h := range clear {
		b = appendBytes(b, []byte(h.Key))
		b = appendBytes(b, h.Value)
	}
	return b
}
