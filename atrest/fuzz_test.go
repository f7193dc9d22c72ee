package atrest

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
)

// FuzzOpenUnit opens arbitrary bytes as a sealed unit: no panic, an error
// that is corruption, shortness or a missing key, and the only units that
// open are the ones the keyring sealed, returning their frame.
func FuzzOpenUnit(f *testing.F) {
	k := mustRing(f, vfs.NewMem(nil), "/keys", mustMemKEK(f))
	frame := testFrame(2)
	sealed := k.Seal(nil, frame)
	f.Add(bytes.Clone(sealed))
	f.Add(bytes.Clone(sealed[:len(sealed)-1]))
	f.Add(frame)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		in := bytes.Clone(b)
		got, err := k.OpenInPlace(b)
		switch {
		case err == nil:
			if !bytes.Equal(in, sealed) || !bytes.Equal(got, frame) {
				t.Fatalf("opened a unit the keyring did not seal")
			}
		case !errors.Is(err, batch.ErrCorrupt) && !errors.Is(err, batch.ErrShort) && !errors.Is(err, ErrKeyUnavailable):
			t.Fatalf("error %v is of no known kind", err)
		}
		if _, err := OpenInPlace(nil, bytes.Clone(in)); err == nil {
			t.Fatal("opened without a keyring")
		}
	})
}

// FuzzKeyringFile decodes arbitrary bytes as a keyring file: no panic,
// errors wrap ErrKeyringCorrupt, and what decodes encodes to a file that
// decodes the same.
func FuzzKeyringFile(f *testing.F) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	f.Add(encodeKeyring([]wrappedKey{{id: 1, created: now, kekID: "k", wrapped: []byte{1, 2}}}, 1))
	f.Add([]byte(`{"version":1,"active":"00000001","keys":[]}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, b []byte) {
		keys, active, err := decodeKeyring(b)
		if err != nil {
			if !errors.Is(err, ErrKeyringCorrupt) {
				t.Fatalf("%v does not wrap ErrKeyringCorrupt", err)
			}
			return
		}
		again, active2, err := decodeKeyring(encodeKeyring(keys, keys[active].id))
		if err != nil || active2 != active || len(again) != len(keys) {
			t.Fatalf("round trip: %v", err)
		}
		for i := range keys {
			if again[i].id != keys[i].id || again[i].kekID != keys[i].kekID || !bytes.Equal(again[i].wrapped, keys[i].wrapped) ||
				!again[i].created.Equal(keys[i].created) {
				t.Fatalf("key %d differs after a round trip", i)
			}
		}
	})
}
