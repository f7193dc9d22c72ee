package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// mustKey returns a key with a fresh secret.
func mustKey(t testing.TB, id string) Key {
	t.Helper()
	k, err := NewKey(id)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// fixture is a keyring with one key for conversation "room-1" of "chat",
// and a sealer and opener over it sealing the header "sender".
type fixture struct {
	ring   *Keyring
	key    Key
	sealer *Sealer
	opener *Opener
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	f := &fixture{ring: NewKeyring(), key: mustKey(t, "room-1/1")}
	if err := f.ring.Add("chat", []byte("room-1"), f.key); err != nil {
		t.Fatal(err)
	}
	var err error
	if f.sealer, err = NewSealer(f.ring, "sender"); err != nil {
		t.Fatal(err)
	}
	if f.opener, err = NewOpener(f.ring); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) seal(t testing.TB, r *Record) *Record {
	t.Helper()
	s, err := f.sealer.Seal(r)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func chatRecord(value string, headers ...Header) *Record {
	return &Record{Stream: "chat", Key: []byte("room-1"), Value: []byte(value), Headers: headers, ProducerTimeUnixNanos: 1_700_000_000_123_456_789}
}

// copyRecord deep-copies r so a test can alter a sealed record.
func copyRecord(r *Record) *Record {
	c := *r
	c.Key = bytes.Clone(r.Key)
	c.Value = bytes.Clone(r.Value)
	c.Headers = nil
	for _, h := range r.Headers {
		c.Headers = append(c.Headers, Header{Key: h.Key, Value: bytes.Clone(h.Value)})
	}
	return &c
}

func TestSealOpenRoundTrip(t *testing.T) {
	f := newFixture(t)
	big := strings.Repeat("0123456789abcdef", 4096)
	for _, tc := range []struct {
		name string
		rec  *Record
	}{
		{"value only", chatRecord("hello PLAINTEXT-MARKER")},
		{"empty value", chatRecord("")},
		{"64 KiB value", chatRecord(big)},
		{"clear header", chatRecord("hi", Header{"trace", []byte("abc")})},
		{"sealed header", chatRecord("hi", Header{"sender", []byte("alice")})},
		{"mixed headers, sealed first, middle and last", chatRecord("hi",
			Header{"sender", []byte("alice")}, Header{"trace", []byte("t1")}, Header{"sender", []byte("bob")},
			Header{"lang", nil}, Header{"sender", []byte("")})},
		{"keyless", &Record{Stream: "chat", Value: []byte("no conversation")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ring := f.ring
			if len(tc.rec.Key) == 0 {
				// The keyless conversation takes the stream-wide key.
				ring = NewKeyring()
				if err := ring.AddStream("chat", mustKey(t, "chat/all")); err != nil {
					t.Fatal(err)
				}
			}
			sealer, _ := NewSealer(ring, "sender")
			opener, _ := NewOpener(ring)
			orig := copyRecord(tc.rec)
			sealed, err := sealer.Seal(tc.rec)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(tc.rec, orig) {
				t.Fatal("Seal modified its input")
			}
			checkCiphertextOnly(t, tc.rec, sealed)
			opened, err := opener.Open(sealed)
			if err != nil {
				t.Fatal(err)
			}
			want := copyRecord(tc.rec)
			if len(want.Headers) == 0 {
				want.Headers = nil
			}
			if !bytes.Equal(opened.Value, want.Value) || !headersEqual(opened.Headers, want.Headers) ||
				!bytes.Equal(opened.Key, want.Key) || opened.ProducerTimeUnixNanos != want.ProducerTimeUnixNanos {
				t.Fatalf("opened %+v, want %+v", opened, want)
			}
		})
	}
}

// headersEqual compares header lists as the wire does: a nil value
// equals an empty one.
func headersEqual(a, b []Header) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || !bytes.Equal(a[i].Value, b[i].Value) {
			return false
		}
	}
	return true
}

// checkCiphertextOnly checks what a server sees of a sealed record: no
// value bytes or sealed header in clear, the clear headers and the marker.
func checkCiphertextOnly(t *testing.T, orig, sealed *Record) {
	t.Helper()
	if len(orig.Value) >= 8 && bytes.Contains(sealed.Value, orig.Value) {
		t.Fatal("the sealed value holds the plaintext")
	}
	var clear []Header
	for _, h := range orig.Headers {
		if h.Key == "sender" {
			if len(h.Value) > 0 && bytes.Contains(sealed.Value, h.Value) {
				t.Fatalf("sealed header %q in clear in the value", h.Value)
			}
			continue
		}
		clear = append(clear, h)
	}
	want := append(clear, Header{HeaderName, []byte(HeaderValue)})
	if !reflect.DeepEqual(sealed.Headers, want) {
		t.Fatalf("sealed headers %+v, want %+v", sealed.Headers, want)
	}
	if got, want := len(sealed.Value), len(orig.Value)+OverheadBytes(len("room-1/1")); len(orig.Headers) == 0 && len(orig.Key) > 0 && got != want {
		t.Fatalf("sealed value of %d bytes, want %d", got, want)
	}
	if !bytes.Equal(sealed.Key, orig.Key) || sealed.ProducerTimeUnixNanos != orig.ProducerTimeUnixNanos || sealed.Stream != orig.Stream {
		t.Fatal("sealing changed the key, stream or producer time")
	}
}

func TestSealsDifferentlyEachTime(t *testing.T) {
	f := newFixture(t)
	a, b := f.seal(t, chatRecord("same")), f.seal(t, chatRecord("same"))
	if bytes.Equal(a.Value, b.Value) {
		t.Fatal("two seals of one record are identical: the salt is not fresh")
	}
}

// TestRotation: a new current key seals new records; records sealed under
// the old one still open, each under its own key.
func TestRotation(t *testing.T) {
	f := newFixture(t)
	old := f.seal(t, chatRecord("before rotation"))
	k2 := mustKey(t, "room-1/2")
	if err := f.ring.Add("chat", []byte("room-1"), k2); err != nil {
		t.Fatal(err)
	}
	fresh := f.seal(t, chatRecord("after rotation"))
	for _, tc := range []struct {
		rec   *Record
		id    string
		value string
	}{{old, "room-1/1", "before rotation"}, {fresh, "room-1/2", "after rotation"}} {
		env, err := ParseEnvelope(tc.rec.Value)
		if err != nil {
			t.Fatal(err)
		}
		if string(env.KeyID) != tc.id {
			t.Fatalf("sealed under %q, want %q", env.KeyID, tc.id)
		}
		got, err := f.opener.Open(tc.rec)
		if err != nil || string(got.Value) != tc.value {
			t.Fatalf("open %s: %v, %+v", tc.id, err, got)
		}
	}
	// A reader that has only the new key cannot open the old record.
	newOnly := NewKeyring()
	newOnly.Add("chat", []byte("room-1"), k2)
	o, _ := NewOpener(newOnly)
	if _, err := o.Open(old); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("old record with only the new key: %v, want ErrUnknownKey", err)
	}
}

func TestWrongKey(t *testing.T) {
	f := newFixture(t)
	sealed := f.seal(t, chatRecord("secret"))
	// Same id, another secret: the commitment tells.
	impostor := NewKeyring()
	impostor.Add("chat", []byte("room-1"), mustKey(t, "room-1/1"))
	o, _ := NewOpener(impostor)
	got, err := o.Open(sealed)
	var e *Error
	if !errors.Is(err, ErrWrongKey) || !errors.As(err, &e) || e.KeyID != "room-1/1" || e.Op != "open" || got != nil {
		t.Fatalf("wrong secret: %v (%#v), want ErrWrongKey for room-1/1", err, got)
	}
	// An id the provider does not have.
	other := NewKeyring()
	other.Add("chat", []byte("room-1"), mustKey(t, "room-1/9"))
	o, _ = NewOpener(other)
	if _, err := o.Open(sealed); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("unknown id: %v, want ErrUnknownKey", err)
	}
}

// anyKeys gives one key to every conversation of every stream, so that a
// moved record reaches the AEAD check.
type anyKeys struct{ k Key }

func (a anyKeys) CurrentKey(string, []byte) (Key, error) { return a.k, nil }
func (a anyKeys) Key(_ string, _ []byte, id string) (Key, error) {
	if id != a.k.ID {
		return Key{}, ErrUnknownKey
	}
	return a.k, nil
}

// TestBinding: a ciphertext moved to another conversation, stream or
// producer time, or with its clear headers changed, does not open, even
// under a key that opens both places.
func TestBinding(t *testing.T) {
	keys := anyKeys{mustKey(t, "shared")}
	s, _ := NewSealer(keys, "sender")
	o, _ := NewOpener(keys)
	orig := chatRecord("move me", Header{"trace", []byte("t1")}, Header{"sender", []byte("alice")})
	sealed, err := s.Seal(orig)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.Open(sealed); err != nil {
		t.Fatalf("unmoved: %v", err)
	}
	for name, move := range map[string]func(r *Record){
		"another conversation": func(r *Record) { r.Key = []byte("room-2") },
		"no conversation":      func(r *Record) { r.Key = nil },
		"another stream":       func(r *Record) { r.Stream = "chat-archive" },
		"producer time":        func(r *Record) { r.ProducerTimeUnixNanos++ },
		"clear header value":   func(r *Record) { r.Headers[0].Value = []byte("t2") },
		"clear header name":    func(r *Record) { r.Headers[0].Key = "tracE" },
		"clear header dropped": func(r *Record) { r.Headers = r.Headers[1:] },
		"clear header added":   func(r *Record) { r.Headers = append([]Header{{"x", nil}}, r.Headers...) },
		"headers reordered": func(r *Record) {
			r.Headers = append(r.Headers, Header{"z", nil})
			r.Headers[0], r.Headers[2] = r.Headers[2], r.Headers[0]
		},
	} {
		moved := copyRecord(sealed)
		move(moved)
		got, err := o.Open(moved)
		if !errors.Is(err, ErrTampered) || got != nil {
			t.Errorf("%s: %v, want ErrTampered", name, err)
		}
	}
	// With a key per conversation, as Keyring keeps them, the other
	// conversation does not even know the key id.
	f := newFixture(t)
	f.ring.Add("chat", []byte("room-2"), mustKey(t, "room-2/1"))
	moved := f.seal(t, chatRecord("for room 1"))
	moved.Key = []byte("room-2")
	if _, err := f.opener.Open(moved); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("moved to room-2: %v, want ErrUnknownKey", err)
	}
}

// TestTamperEveryByte flips each byte of an envelope in turn: no flip
// opens, and each fails for the reason its field gives.
func TestTamperEveryByte(t *testing.T) {
	f := newFixture(t)
	sealed := f.seal(t, chatRecord("tamper with me", Header{"sender", []byte("alice")}))
	idLen := len(f.key.ID)
	saltAt := prefixFixedBytes + idLen
	commitAt := saltAt + SaltBytes
	ctAt := commitAt + CommitmentBytes
	for i := range sealed.Value {
		r := copyRecord(sealed)
		r.Value[i] ^= 0x01
		got, err := f.opener.Open(r)
		if got != nil || err == nil {
			t.Fatalf("byte %d flipped: opened", i)
		}
		var want error
		switch {
		case i < 2:
			want = ErrUnsupported
		case i == 2:
			want = ErrMalformed // the key id length: 9 bytes leave the salt short, 7 misplace every field
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrUnknownKey) {
				t.Fatalf("byte %d (key id length): %v", i, err)
			}
			continue
		case i < saltAt:
			want = ErrUnknownKey
		case i < ctAt:
			want = ErrWrongKey // salt or commitment: the commitment no longer matches
		default:
			want = ErrTampered
		}
		if !errors.Is(err, want) {
			t.Fatalf("byte %d flipped: %v, want %v", i, err, want)
		}
	}
	for n := range len(sealed.Value) {
		r := copyRecord(sealed)
		r.Value = r.Value[:n]
		if got, err := f.opener.Open(r); got != nil || err == nil {
			t.Fatalf("truncated to %d bytes: opened", n)
		}
	}
}

func TestMarkerHeader(t *testing.T) {
	f := newFixture(t)
	sealed := f.seal(t, chatRecord("marked", Header{"trace", []byte("t")}))
	for _, tc := range []struct {
		name string
		edit func(r *Record)
		want error
	}{
		{"removed", func(r *Record) { r.Headers = r.Headers[:1] }, ErrNotSealed},
		{"twice", func(r *Record) { r.Headers = append(r.Headers, r.Headers[1]) }, ErrMalformed},
		{"another version", func(r *Record) { r.Headers[1].Value = []byte("2") }, ErrUnsupported},
		{"moved first", func(r *Record) { r.Headers[0], r.Headers[1] = r.Headers[1], r.Headers[0] }, nil},
	} {
		r := copyRecord(sealed)
		tc.edit(r)
		got, err := f.opener.Open(r)
		if tc.want == nil {
			// The marker's position is not bound: only its presence.
			if err != nil || string(got.Value) != "marked" {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, tc.want) || got != nil {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	plain := chatRecord("never sealed")
	if _, err := f.opener.Open(plain); !errors.Is(err, ErrNotSealed) {
		t.Fatalf("plaintext record: %v, want ErrNotSealed", err)
	}
}

func TestSealErrors(t *testing.T) {
	f := newFixture(t)
	if _, err := f.sealer.Seal(&Record{Stream: "chat", Key: []byte("room-9"), Value: []byte("x")}); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("conversation without a key: %v, want ErrUnknownKey", err)
	}
	if _, err := f.sealer.Seal(chatRecord("x", Header{HeaderName, []byte("1")})); !errors.Is(err, ErrReservedHeader) {
		t.Fatalf("reserved header: %v, want ErrReservedHeader", err)
	}
	if _, err := NewSealer(f.ring, HeaderName); !errors.Is(err, ErrReservedHeader) {
		t.Fatalf("sealing the marker: %v, want ErrReservedHeader", err)
	}
	if _, err := NewSealer(nil); err == nil {
		t.Fatal("nil provider accepted")
	}
	bad := anyKeys{Key{ID: "short", Secret: make([]byte, 16)}}
	s, _ := NewSealer(bad)
	if _, err := s.Seal(chatRecord("x")); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("16-byte secret: %v, want ErrInvalidKey", err)
	}
	o, _ := NewOpener(bad)
	if _, err := o.Open(f.seal(t, chatRecord("x"))); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("open: %v", err)
	}
	bad.k.ID = "room-1/1"
	o, _ = NewOpener(bad)
	if _, err := o.Open(f.seal(t, chatRecord("x"))); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("open with a 16-byte secret: %v, want ErrInvalidKey", err)
	}
}

// providerErr is a provider that fails, as a remote key service might.
type providerErr struct{ err error }

func (p providerErr) CurrentKey(string, []byte) (Key, error)  { return Key{}, p.err }
func (p providerErr) Key(string, []byte, string) (Key, error) { return Key{}, p.err }

func TestProviderErrorsPassThrough(t *testing.T) {
	f := newFixture(t)
	boom := fmt.Errorf("key service unreachable")
	s, _ := NewSealer(providerErr{boom})
	if _, err := s.Seal(chatRecord("x")); !errors.Is(err, boom) {
		t.Fatalf("seal: %v", err)
	}
	o, _ := NewOpener(providerErr{boom})
	if _, err := o.Open(f.seal(t, chatRecord("x"))); !errors.Is(err, boom) {
		t.Fatalf("open: %v", err)
	}
}

func TestMergeHeadersRejectsBadIndexes(t *testing.T) {
	clear := []Header{{"a", nil}}
	for _, idx := range [][]int{{2}, {5}, {2, 3}, {0, 3}} {
		var sealed []sealedHeader
		for _, i := range idx {
			sealed = append(sealed, sealedHeader{index: i, h: Header{Key: "s"}})
		}
		if _, err := mergeHeaders(clear, sealed); !errors.Is(err, ErrMalformed) {
			t.Errorf("indexes %v among 1 clear header: %v, want ErrMalformed", idx, err)
		}
	}
	got, err := mergeHeaders(clear, []sealedHeader{{0, Header{Key: "s0"}}, {2, Header{Key: "s2"}}})
	if err != nil || fmt.Sprint(got) != "[{s0 []} {a []} {s2 []}]" {
		t.Fatalf("merge: %v %v", got, err)
	}
}
