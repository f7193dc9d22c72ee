package e2e

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/vectors.json from the sealer's output")

// vector is one interoperability test vector: a record, a key and a salt,
// and the record as sealed. docs/e2e-encryption.md refers to the file.
type vector struct {
	Name                  string         `json:"name"`
	SecretHex             string         `json:"secret_hex"`
	KeyID                 string         `json:"key_id"`
	SaltHex               string         `json:"salt_hex"`
	Stream                string         `json:"stream"`
	KeyHex                string         `json:"record_key_hex"`
	ProducerTimeUnixNanos int64          `json:"producer_time_unix_nanos"`
	Headers               []vectorHeader `json:"headers"`
	SealedHeaderNames     []string       `json:"sealed_header_names"`
	ValueHex              string         `json:"value_hex"`
	// What is sent: the headers (clear ones, then the marker) and the
	// envelope.
	WireHeaders   []vectorHeader `json:"wire_headers"`
	EnvelopeHex   string         `json:"envelope_hex"`
	AssocDataHex  string         `json:"associated_data_hex"`
	PayloadHex    string         `json:"payload_hex"`
	DerivedKeyHex string         `json:"derived_key_nonce_commitment_hex"`
}

type vectorHeader struct {
	Name     string `json:"name"`
	ValueHex string `json:"value_hex"`
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func seq(from, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(from + i)
	}
	return b
}

// vectorInputs are the records of testdata/vectors.json.
func vectorInputs() []vector {
	h := func(name, value string) vectorHeader {
		return vectorHeader{name, hex.EncodeToString([]byte(value))}
	}
	return []vector{
		{Name: "value only", SecretHex: hex.EncodeToString(seq(0, 32)), KeyID: "room-1/1", SaltHex: hex.EncodeToString(seq(0x40, 24)),
			Stream: "chat", KeyHex: hex.EncodeToString([]byte("room-1")), ProducerTimeUnixNanos: 1_700_000_000_123_456_789,
			ValueHex: hex.EncodeToString([]byte("hello"))},
		{Name: "sealed and clear headers", SecretHex: hex.EncodeToString(seq(0x80, 32)), KeyID: "room-1/2", SaltHex: hex.EncodeToString(seq(0xa0, 24)),
			Stream: "chat", KeyHex: hex.EncodeToString([]byte("room-1")), ProducerTimeUnixNanos: 1_700_000_001_000_000_000,
			Headers:           []vectorHeader{h("sender", "alice"), h("trace", "t-1"), h("sent-at", "12:00")},
			SealedHeaderNames: []string{"sender", "sent-at"}, ValueHex: hex.EncodeToString([]byte("meet at noon"))},
		{Name: "keyless, empty value, no producer time", SecretHex: hex.EncodeToString(seq(0xe0, 32)), KeyID: "chat/all", SaltHex: hex.EncodeToString(seq(0x10, 24)),
			Stream: "chat"},
	}
}

func (v *vector) record(t *testing.T) *Record {
	r := &Record{Stream: v.Stream, Key: unhex(t, v.KeyHex), Value: unhex(t, v.ValueHex), ProducerTimeUnixNanos: v.ProducerTimeUnixNanos}
	for _, h := range v.Headers {
		r.Headers = append(r.Headers, Header{h.Name, unhex(t, h.ValueHex)})
	}
	return r
}

func (v *vector) keys(t *testing.T) anyKeys {
	return anyKeys{Key{ID: v.KeyID, Secret: unhex(t, v.SecretHex)}}
}

// TestVectors seals each vector's record with its key and salt and checks
// the bytes against testdata/vectors.json (-rewrite regenerates it), then
// opens the stored envelope twice: with Opener, and with specOpen, written
// from docs/e2e-encryption.md alone, as a client in another language would.
func TestVectors(t *testing.T) {
	got := vectorInputs()
	for i := range got {
		v := &got[i]
		s, err := NewSealer(v.keys(t), v.SealedHeaderNames...)
		if err != nil {
			t.Fatal(err)
		}
		s.rand = bytes.NewReader(unhex(t, v.SaltHex))
		sealed, err := s.Seal(v.record(t))
		if err != nil {
			t.Fatal(err)
		}
		v.EnvelopeHex = hex.EncodeToString(sealed.Value)
		for _, h := range sealed.Headers {
			v.WireHeaders = append(v.WireHeaders, vectorHeader{h.Key, hex.EncodeToString(h.Value)})
		}
	}
	const path = "testdata/vectors.json"
	if *rewrite {
		for i := range got {
			specFill(t, &got[i])
		}
		b, _ := json.MarshalIndent(got, "", "  ")
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var want []vector
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	if len(want) != len(got) {
		t.Fatalf("%d vectors in %s, %d made", len(want), path, len(got))
	}
	for i, w := range want {
		g := got[i]
		if g.EnvelopeHex != w.EnvelopeHex || !equalJSON(g.WireHeaders, w.WireHeaders) {
			t.Errorf("%s: sealed to\n%s %v\nwant\n%s %v", w.Name, g.EnvelopeHex, g.WireHeaders, w.EnvelopeHex, w.WireHeaders)
		}
		wire := w.record(t)
		wire.Value, wire.Headers = unhex(t, w.EnvelopeHex), nil
		for _, h := range w.WireHeaders {
			wire.Headers = append(wire.Headers, Header{h.Name, unhex(t, h.ValueHex)})
		}
		o, _ := NewOpener(w.keys(t))
		opened, err := o.Open(wire)
		if err != nil || !bytes.Equal(opened.Value, unhex(t, w.ValueHex)) || !headersEqual(opened.Headers, w.record(t).Headers) {
			t.Errorf("%s: Opener: %v %+v", w.Name, err, opened)
		}
		specCheck(t, &w)
	}
}

func equalJSON(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// specDerive, specAAD and specOpen follow docs/e2e-encryption.md step by
// step and share no code with the package.
func specDerive(t *testing.T, secret, salt []byte) []byte {
	okm, err := hkdf.Key(sha256.New, secret, salt, "geolog-e2e\x01\x01", 76)
	if err != nil {
		t.Fatal(err)
	}
	return okm
}

func specAAD(env []byte, stream string, key []byte, ptime int64, clear []vectorHeader, t *testing.T) []byte {
	idLen := int(env[2])
	aad := append([]byte(nil), env[:3+idLen]...)
	aad = binary.AppendUvarint(aad, uint64(len(stream)))
	aad = append(aad, stream...)
	aad = binary.AppendUvarint(aad, uint64(len(key)))
	aad = append(aad, key...)
	aad = binary.BigEndian.AppendUint64(aad, uint64(ptime))
	aad = binary.AppendUvarint(aad, uint64(len(clear)))
	for _, h := range clear {
		v := unhex(t, h.ValueHex)
		aad = binary.AppendUvarint(aad, uint64(len(h.Name)))
		aad = append(aad, h.Name...)
		aad = binary.AppendUvarint(aad, uint64(len(v)))
		aad = append(aad, v...)
	}
	return aad
}

// specOpen returns the payload of a vector's envelope.
func specOpen(t *testing.T, v *vector) (payload, aad, okm []byte) {
	env := unhex(t, v.EnvelopeHex)
	if env[0] != 1 || env[1] != 1 {
		t.Fatalf("%s: version %d suite %d", v.Name, env[0], env[1])
	}
	idLen := int(env[2])
	if string(env[3:3+idLen]) != v.KeyID {
		t.Fatalf("%s: key id %q", v.Name, env[3:3+idLen])
	}
	salt := env[3+idLen : 3+idLen+24]
	commitment := env[3+idLen+24 : 3+idLen+56]
	okm = specDerive(t, unhex(t, v.SecretHex), salt)
	if !bytes.Equal(okm[44:76], commitment) {
		t.Fatalf("%s: commitment differs", v.Name)
	}
	var clear []vectorHeader
	for _, h := range v.WireHeaders {
		if h.Name != "geolog-e2e" {
			clear = append(clear, h)
		}
	}
	aad = specAAD(env, v.Stream, unhex(t, v.KeyHex), v.ProducerTimeUnixNanos, clear, t)
	block, _ := aes.NewCipher(okm[:32])
	gcm, _ := cipher.NewGCM(block)
	payload, err := gcm.Open(nil, okm[32:44], env[3+idLen+56:], aad)
	if err != nil {
		t.Fatalf("%s: spec open: %v", v.Name, err)
	}
	return payload, aad, okm
}

// specFill records a vector's intermediate values for the file.
func specFill(t *testing.T, v *vector) {
	payload, aad, okm := specOpen(t, v)
	v.PayloadHex, v.AssocDataHex, v.DerivedKeyHex = hex.EncodeToString(payload), hex.EncodeToString(aad), hex.EncodeToString(okm)
}

// specCheck opens a stored vector by the spec and checks its intermediate
// values and the payload: sealed headers with their indexes, then the
// value.
func specCheck(t *testing.T, v *vector) {
	payload, aad, okm := specOpen(t, v)
	if hex.EncodeToString(aad) != v.AssocDataHex || hex.EncodeToString(okm) != v.DerivedKeyHex || hex.EncodeToString(payload) != v.PayloadHex {
		t.Errorf("%s: intermediate values differ from the file", v.Name)
	}
	count, n := binary.Uvarint(payload)
	p := payload[n:]
	var sealed []string
	for range count {
		idx, n := binary.Uvarint(p)
		p = p[n:]
		nameLen, n := binary.Uvarint(p)
		name := string(p[n : n+int(nameLen)])
		p = p[n+int(nameLen):]
		valueLen, n := binary.Uvarint(p)
		value := p[n : n+int(valueLen)]
		p = p[n+int(valueLen):]
		in := v.Headers[idx]
		if in.Name != name || in.ValueHex != hex.EncodeToString(value) {
			t.Errorf("%s: sealed header %d is %s=%x, want %s=%s", v.Name, idx, name, value, in.Name, in.ValueHex)
		}
		sealed = append(sealed, name)
	}
	if !equalJSON(nonNil(sealed), nonNil(v.sealedNamesInOrder())) {
		t.Errorf("%s: sealed headers %v", v.Name, sealed)
	}
	if hex.EncodeToString(p) != v.ValueHex {
		t.Errorf("%s: spec value %x, want %s", v.Name, p, v.ValueHex)
	}
}

func (v *vector) sealedNamesInOrder() []string {
	var out []string
	for _, h := range v.Headers {
		for _, s := range v.SealedHeaderNames {
			if h.Name == s {
				out = append(out, h.Name)
			}
		}
	}
	return out
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
