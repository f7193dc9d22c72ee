package atrest

import (
	"context"
	"errors"
	"testing"

	"github.com/geolog/geolog/vfs"
)

// TestKeyringRetire: a retired key is gone from the keyring and from its
// file (a unit under it no longer opens, with ErrKeyUnavailable), the
// other keys stay; the active key and an unknown one are refused.
func TestKeyringRetire(t *testing.T) {
	dir, kekPath := t.TempDir(), kekFileFor(t)
	kek := openKEK(t, kekPath)
	k := mustRing(t, vfs.OS(), dir, kek)
	first := k.Active()
	u1 := k.Seal(nil, testFrame(1))
	if _, err := k.Rotate(context.Background()); err != nil {
		t.Fatal(err)
	}
	second := k.Active()
	u2 := k.Seal(nil, testFrame(2))
	if err := k.Retire(second); !errors.Is(err, ErrKeyActive) {
		t.Fatalf("retire the active key: %v, want ErrKeyActive", err)
	}
	if err := k.Retire(KeyID(12345)); !errors.Is(err, ErrKeyUnavailable) {
		t.Fatalf("retire an unknown key: %v, want ErrKeyUnavailable", err)
	}
	if err := k.Retire(first); err != nil {
		t.Fatal(err)
	}
	if k.Has(first) || !k.Has(second) || len(k.Keys()) != 1 {
		t.Fatalf("after retiring %v: keys %+v", first, k.Keys())
	}
	k.Close()
	k = mustRing(t, vfs.OS(), dir, kek)
	defer k.Close()
	if k.Has(first) || k.Active() != second {
		t.Fatalf("reopened: keys %+v", k.Keys())
	}
	if _, err := k.OpenInPlace(u1); !errors.Is(err, ErrKeyUnavailable) {
		t.Fatalf("a unit under the retired key: %v, want ErrKeyUnavailable", err)
	}
	if _, err := k.OpenInPlace(u2); err != nil {
		t.Fatalf("a unit under the active key: %v", err)
	}
}
