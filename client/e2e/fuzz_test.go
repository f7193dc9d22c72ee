package e2e

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// fuzzKeys is the one key the fuzz targets open with.
var fuzzKeys = anyKeys{Key{ID: "room-1/1", Secret: seq(7, 32)}}

// openErrors are the reasons Open may give for bytes from the network.
var openErrors = []error{ErrNotSealed, ErrMalformed, ErrUnsupported, ErrUnknownKey, ErrWrongKey, ErrTampered}

// FuzzOpen opens arbitrary values and marker headers: Open never panics,
// fails only with a typed reason, and whatever opens seals back, under its
// salt, to the very same bytes.
func FuzzOpen(f *testing.F) {
	s, _ := NewSealer(fuzzKeys, "sender")
	for _, r := range []*Record{
		chatRecord("hello"),
		chatRecord("", Header{"sender", []byte("alice")}),
		chatRecord("x", Header{"trace", []byte("t")}, Header{"sender", []byte("bob")}),
	} {
		sealed, err := s.Seal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(sealed.Value, []byte(HeaderValue), len(r.Headers) > 1)
		f.Add(sealed.Value[:len(sealed.Value)/2], []byte(HeaderValue), false)
	}
	f.Add([]byte{1, 1, 0}, []byte("1"), false)
	f.Add([]byte{2, 1, 1, 'k'}, []byte("2"), true)
	o, _ := NewOpener(fuzzKeys)
	f.Fuzz(func(t *testing.T, value, marker []byte, traceHeader bool) {
		r := &Record{Stream: "chat", Key: []byte("room-1"), Value: value, ProducerTimeUnixNanos: 1_700_000_000_123_456_789}
		if traceHeader {
			r.Headers = append(r.Headers, Header{"trace", []byte("t")})
		}
		r.Headers = append(r.Headers, Header{HeaderName, marker})
		opened, err := o.Open(r)
		if err != nil {
			if opened != nil {
				t.Fatal("Open returned a record with an error")
			}
			for _, want := range openErrors {
				if errors.Is(err, want) {
					return
				}
			}
			t.Fatalf("untyped error: %v", err)
		}
		env, err := ParseEnvelope(value)
		if err != nil {
			t.Fatalf("opened a value that does not parse: %v", err)
		}
		reseal := &Sealer{keys: fuzzKeys, sealed: map[string]bool{"sender": true}, rand: bytes.NewReader(env.Salt)}
		again, err := reseal.Seal(opened)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again.Value, value) || !reflect.DeepEqual(again.Headers, r.Headers) {
			t.Fatalf("opened and sealed again under the same salt: %x %v, want %x %v", again.Value, again.Headers, value, r.Headers)
		}
	})
}

// FuzzDecodePayload decodes arbitrary payloads (what a key holder could
// seal): no panic, memory bounded by the input, and what decodes encodes
// to a payload that decodes the same.
func FuzzDecodePayload(f *testing.F) {
	f.Add(appendPayload(nil, nil, []byte("v")))
	f.Add(appendPayload(nil, []sealedHeader{{0, Header{"sender", []byte("a")}}, {2, Header{"x", nil}}}, []byte("value")))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		sealed, value, err := decodePayload(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("untyped error: %v", err)
			}
			return
		}
		again := appendPayload(nil, sealed, value)
		sealed2, value2, err := decodePayload(again)
		if err != nil || !bytes.Equal(value, value2) || len(sealed) != len(sealed2) {
			t.Fatalf("re-encoded payload: %v", err)
		}
		for i := range sealed {
			if sealed[i].index != sealed2[i].index || sealed[i].h.Key != sealed2[i].h.Key || !bytes.Equal(sealed[i].h.Value, sealed2[i].h.Value) {
				t.Fatalf("sealed header %d: %+v, then %+v", i, sealed[i], sealed2[i])
			}
		}
		if len(again) > len(b) {
			t.Fatalf("canonical encoding of %d bytes is longer than the input's %d", len(again), len(b))
		}
		if _, err := mergeHeaders(nil, sealed); err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("merge: %v", err)
		}
	})
}
