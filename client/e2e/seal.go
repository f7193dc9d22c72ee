package e2e

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"io"
)

// Header is one record header.
type Header struct {
	Key   string
	Value []byte
}

// Record is the part of a record that sealing protects: Value and the
// sealed headers are encrypted; Stream, Key (the conversation),
// ProducerTimeUnixNanos and the clear headers stay readable and are
// authenticated.
type Record struct {
	Stream                string
	Key                   []byte
	Headers               []Header
	Value                 []byte
	ProducerTimeUnixNanos int64
}

// derivation is HKDF's info for suite 1 of version 1: these ASCII bytes,
// then the version and suite bytes.
const derivationLabel = "geolog-e2e"

// derivedBytes is what HKDF yields per record: the AES-256 key, the GCM
// nonce and the key commitment.
const derivedBytes = 32 + 12 + CommitmentBytes

// recordKeys are one record's keys, derived from the conversation key and
// the envelope's salt.
type recordKeys struct {
	aead       cipher.AEAD
	nonce      []byte
	commitment []byte
}

// derive computes a record's keys: HKDF-SHA256 with the conversation key's
// secret as input keying material, the salt as salt, and info
// "geolog-e2e" || version || suite, expanded to 76 bytes: AES-256 key
// [0:32], GCM nonce [32:44], commitment [44:76]. Every record has its own
// AES key (the salt is random), so the nonce is never reused under a key.
func derive(secret, salt []byte) (recordKeys, error) {
	info := derivationLabel + string([]byte{Version, SuiteAES256GCM})
	okm, err := hkdf.Key(sha256.New, secret, salt, info, derivedBytes)
	if err != nil {
		return recordKeys{}, err
	}
	block, err := aes.NewCipher(okm[:32])
	if err != nil {
		return recordKeys{}, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return recordKeys{}, err
	}
	return recordKeys{aead: aead, nonce: okm[32:44], commitment: okm[44:]}, nil
}

// Sealer seals records under their conversation's current key. It is safe
// for concurrent use.
type Sealer struct {
	keys   KeyProvider
	sealed map[string]bool // header names sealed with the value
	rand   io.Reader       // salts; crypto/rand outside tests
}

// NewSealer returns a sealer taking keys from keys that seals each record's
// value and its headers named in sealedHeaders; other headers stay in
// clear (authenticated).
func NewSealer(keys KeyProvider, sealedHeaders ...string) (*Sealer, error) {
	if keys == nil {
		return nil, fmt.Errorf("e2e: nil KeyProvider")
	}
	s := &Sealer{keys: keys, sealed: map[string]bool{}, rand: rand.Reader}
	for _, h := range sealedHeaders {
		if h == HeaderName {
			return nil, fmt.Errorf("%w: it cannot be sealed", ErrReservedHeader)
		}
		s.sealed[h] = true
	}
	return s, nil
}

// Seal returns r as it is sent: Value replaced by the envelope, sealed
// headers removed, the marker header appended after the clear ones. r is
// not modified; the result shares r's clear header values and key.
func (s *Sealer) Seal(r *Record) (*Record, error) {
	k, err := s.keys.CurrentKey(r.Stream, r.Key)
	if err != nil {
		return nil, sealErr("", err)
	}
	if err := k.validate(); err != nil {
		return nil, sealErr(k.ID, err)
	}
	var clear []Header
	var sealed []sealedHeader
	for i, h := range r.Headers {
		switch {
		case h.Key == HeaderName:
			return nil, sealErr(k.ID, ErrReservedHeader)
		case s.sealed[h.Key]:
			sealed = append(sealed, sealedHeader{index: i, h: h})
		default:
			clear = append(clear, h)
		}
	}
	env := Envelope{Version: Version, Suite: SuiteAES256GCM, KeyID: []byte(k.ID), Salt: make([]byte, SaltBytes)}
	if _, err := io.ReadFull(s.rand, env.Salt); err != nil {
		return nil, sealErr(k.ID, fmt.Errorf("salt: %w", err))
	}
	rk, err := derive(k.Secret, env.Salt)
	if err != nil {
		return nil, sealErr(k.ID, err)
	}
	env.Commitment = rk.commitment
	prefix := env.prefix()
	n := len(prefix) + SaltBytes + CommitmentBytes + payloadBytes(sealed, r.Value) + TagBytes
	out := env.Append(make([]byte, 0, n))
	// Seal in place after the envelope's fields: the payload is written
	// there, then encrypted over itself.
	head := len(out)
	out = appendPayload(out, sealed, r.Value)
	out = rk.aead.Seal(out[:head], rk.nonce, out[head:], associatedData(prefix, r, clear))
	return &Record{
		Stream:                r.Stream,
		Key:                   r.Key,
		Headers:               append(clear, Header{Key: HeaderName, Value: []byte(HeaderValue)}),
		Value:                 out,
		ProducerTimeUnixNanos: r.ProducerTimeUnixNanos,
	}, nil
}

// Opener opens sealed records with keys from a KeyProvider. It is safe for
// concurrent use.
type Opener struct {
	keys KeyProvider
}

// NewOpener returns an opener taking keys from keys.
func NewOpener(keys KeyProvider) (*Opener, error) {
	if keys == nil {
		return nil, fmt.Errorf("e2e: nil KeyProvider")
	}
	return &Opener{keys: keys}, nil
}

// Open returns the record r was sealed from: the plaintext value, and the
// headers in their original order with the marker removed. It never returns
// unauthenticated bytes: on any error the result is nil. Errors are *Error
// wrapping ErrNotSealed, ErrMalformed, ErrUnsupported, ErrUnknownKey (or
// the provider's own error), ErrWrongKey or ErrTampered. r is not modified.
func (o *Opener) Open(r *Record) (*Record, error) {
	clear, err := clearHeaders(r.Headers)
	if err != nil {
		return nil, openErr("", err)
	}
	env, err := ParseEnvelope(r.Value)
	if err != nil {
		return nil, openErr("", err)
	}
	id := string(env.KeyID)
	k, err := o.keys.Key(r.Stream, r.Key, id)
	if err != nil {
		return nil, openErr(id, err)
	}
	if len(k.Secret) != SecretBytes {
		return nil, openErr(id, fmt.Errorf("%w: provider returned a secret of %d bytes", ErrInvalidKey, len(k.Secret)))
	}
	rk, err := derive(k.Secret, env.Salt)
	if err != nil {
		return nil, openErr(id, err)
	}
	if subtle.ConstantTimeCompare(rk.commitment, env.Commitment) != 1 {
		return nil, openErr(id, ErrWrongKey)
	}
	payload, err := rk.aead.Open(nil, rk.nonce, env.Ciphertext, associatedData(env.prefix(), r, clear))
	if err != nil {
		return nil, openErr(id, ErrTampered)
	}
	sealed, value, err := decodePayload(payload)
	if err != nil {
		return nil, openErr(id, err)
	}
	headers, err := mergeHeaders(clear, sealed)
	if err != nil {
		return nil, openErr(id, err)
	}
	return &Record{Stream: r.Stream, Key: r.Key, Headers: headers, Value: value, ProducerTimeUnixNanos: r.ProducerTimeUnixNanos}, nil
}

// clearHeaders returns hs without the marker, which must appear exactly
// once with HeaderValue.
func clearHeaders(hs []Header) ([]Header, error) {
	marker := -1
	for i, h := range hs {
		if h.Key != HeaderName {
			continue
		}
		if marker >= 0 {
			return nil, fmt.Errorf("%w: header %s appears twice", ErrMalformed, HeaderName)
		}
		marker = i
	}
	switch {
	case marker < 0:
		return nil, ErrNotSealed
	case string(hs[marker].Value) != HeaderValue:
		return nil, fmt.Errorf("%w: header %s is %q", ErrUnsupported, HeaderName, hs[marker].Value)
	}
	clear := make([]Header, 0, len(hs)-1)
	clear = append(clear, hs[:marker]...)
	return append(clear, hs[marker+1:]...), nil
}

// mergeHeaders puts the sealed headers back at their indexes among the
// clear ones, which keep their order.
func mergeHeaders(clear []Header, sealed []sealedHeader) ([]Header, error) {
	if len(sealed) == 0 {
		if len(clear) == 0 {
			return nil, nil
		}
		return clear, nil
	}
	total := len(clear) + len(sealed)
	out := make([]Header, 0, total)
	for _, s := range sealed {
		// Indexes increase (decodePayload checks), so the gap is never
		// negative; clear headers fill it, if there are enough.
		gap := s.index - len(out)
		if gap > len(clear) {
			return nil, fmt.Errorf("%w: sealed header index %d of %d headers", ErrMalformed, s.index, total)
		}
		out = append(out, clear[:gap]...)
		clear = clear[gap:]
		out = append(out, s.h)
	}
	return append(out, clear...), nil
}
