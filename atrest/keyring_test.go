package atrest

import (
	"bytes"
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
)

// kekFileFor writes a fresh KEK file in a temporary directory.
func kekFileFor(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kek.json")
	if _, err := AddKEK(path); err != nil {
		t.Fatal(err)
	}
	return path
}

func openKEK(t testing.TB, path string) *FileKEK {
	t.Helper()
	k, err := OpenKEKFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// seededRand is a deterministic io.Reader for keys and nonces.
type seededRand struct{ r *rand.ChaCha8 }

func (s seededRand) Read(p []byte) (int, error) { return s.r.Read(p) }

func newRand(seed byte) seededRand { return seededRand{rand.NewChaCha8([32]byte{seed})} }

func openRing(t testing.TB, fsys vfs.FS, dir string, kek KEKProvider, create bool) (*Keyring, error) {
	t.Helper()
	return Open(context.Background(), Config{Dir: dir, FS: fsys, KEK: kek, Create: create})
}

func mustRing(t testing.TB, fsys vfs.FS, dir string, kek KEKProvider) *Keyring {
	t.Helper()
	k, err := openRing(t, fsys, dir, kek, true)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func testFrame(n int) []byte {
	recs := []batch.Record{{Key: []byte("card"), Value: bytes.Repeat([]byte("4111-1111-1111-1111 "), n)}}
	return batch.Encode(nil, batch.Header{BaseOffset: 7, Epoch: 1, Term: 2, Index: 3}, recs)
}

func TestSealOpenRoundTrip(t *testing.T) {
	k := mustRing(t, vfs.OS(), t.TempDir(), openKEK(t, kekFileFor(t)))
	defer k.Close()
	for _, n := range []int{0, 1, 100, 5000} {
		frame := testFrame(n)
		unit := k.Seal([]byte("prefix"), frame)
		unit = unit[len("prefix"):]
		if len(unit) != len(frame)+Overhead {
			t.Fatalf("unit of %d bytes for a frame of %d", len(unit), len(frame))
		}
		if bytes.Contains(unit, []byte("4111-1111")) && n > 0 {
			t.Fatal("the unit holds the plaintext")
		}
		size, id, err := CheckHeader(unit)
		if err != nil || size != len(unit) || id != k.Active() || !Sealed(unit) || UnitKey(unit) != id {
			t.Fatalf("CheckHeader = %d, %v, %v; Sealed %v", size, id, err, Sealed(unit))
		}
		if s, err := UnitSize(unit[:4]); err != nil || s != len(unit) {
			t.Fatalf("UnitSize = %d, %v", s, err)
		}
		got, err := k.OpenInPlace(unit)
		if err != nil || !bytes.Equal(got, frame) {
			t.Fatalf("OpenInPlace: %v", err)
		}
	}
	// A plain frame is a unit too, of kind plain.
	frame := testFrame(3)
	if size, id, err := CheckHeader(frame); err != nil || size != len(frame) || id != 0 || Sealed(frame) {
		t.Fatalf("plain frame: CheckHeader = %d, %v, %v", size, id, err)
	}
}

// TestTamperEveryByte flips each bit of a sealed unit in turn: every
// change is refused, as corruption (never as a missing key), except in
// the key id, where a change names a key the keyring lacks.
func TestTamperEveryByte(t *testing.T) {
	k := mustRing(t, vfs.OS(), t.TempDir(), openKEK(t, kekFileFor(t)))
	defer k.Close()
	frame := testFrame(4)
	sealed := k.Seal(nil, frame)
	for i := range sealed {
		for bit := range 8 {
			u := bytes.Clone(sealed)
			u[i] ^= 1 << bit
			_, err := k.OpenInPlace(u)
			switch {
			case err == nil:
				t.Fatalf("byte %d bit %d: opened", i, bit)
			case i >= posKeyID && i < posKind:
				if !errors.Is(err, ErrKeyUnavailable) && !errors.Is(err, batch.ErrCorrupt) {
					t.Fatalf("byte %d bit %d: %v", i, bit, err)
				}
			case errors.Is(err, ErrKeyUnavailable):
				t.Fatalf("byte %d bit %d: taken for a missing key: %v", i, bit, err)
			case !errors.Is(err, batch.ErrCorrupt):
				t.Fatalf("byte %d bit %d: %v is not corruption", i, bit, err)
			}
		}
	}
	// Cut short: short or corrupt, never a key problem.
	for n := range len(sealed) {
		_, err := k.OpenInPlace(bytes.Clone(sealed[:n]))
		if err == nil || errors.Is(err, ErrKeyUnavailable) {
			t.Fatalf("%d bytes: %v", n, err)
		}
	}
}

func TestKeyringReopenRotateRewrap(t *testing.T) {
	dir, kekPath := t.TempDir(), kekFileFor(t)
	kek := openKEK(t, kekPath)
	k := mustRing(t, vfs.OS(), dir, kek)
	first := k.Active()
	u1 := k.Seal(nil, testFrame(1))
	info, err := k.Rotate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.ID == first || k.Active() != info.ID || !info.Active {
		t.Fatalf("rotate: %+v, active %v, first %v", info, k.Active(), first)
	}
	u2 := k.Seal(nil, testFrame(2))
	if UnitKey(u1) != first || UnitKey(u2) != info.ID {
		t.Fatalf("units under %v and %v", UnitKey(u1), UnitKey(u2))
	}
	// A second keyring on the same directory is refused while this one
	// is open.
	if _, err := openRing(t, vfs.OS(), dir, kek, false); !errors.Is(err, vfs.ErrLocked) {
		t.Fatalf("second open: %v", err)
	}
	k.Close()

	// KEK rotation: a new KEK in the file, then Rewrap.
	k = mustRing(t, vfs.OS(), dir, kek)
	oldKEK, _ := kek.CurrentKEK(context.Background())
	newKEK, err := AddKEK(kekPath)
	if err != nil {
		t.Fatal(err)
	}
	cur, n, err := k.Rewrap(context.Background())
	if err != nil || cur != newKEK || n != 2 {
		t.Fatalf("Rewrap = %q, %d, %v; want %q, 2", cur, n, err, newKEK)
	}
	for _, ki := range k.Keys() {
		if ki.KEK != newKEK {
			t.Fatalf("key %v still under %q", ki.ID, ki.KEK)
		}
	}
	k.Close()
	if err := RemoveKEK(kekPath, oldKEK); err != nil {
		t.Fatal(err)
	}

	// Reopened with only the new KEK: both keys open old units.
	k, err = openRing(t, vfs.OS(), dir, openKEK(t, kekPath), false)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if k.Active() != info.ID || len(k.Keys()) != 2 {
		t.Fatalf("reopened: active %v, keys %v", k.Active(), k.Keys())
	}
	for i, u := range [][]byte{u1, u2} {
		if got, err := k.OpenInPlace(bytes.Clone(u)); err != nil || !bytes.Equal(got, testFrame(i+1)) {
			t.Fatalf("unit %d: %v", i, err)
		}
	}
}

// TestWrongOrMissingKEK: a keyring opened with another KEK file, with a
// KEK file lacking its KEK, or without a keyring, fails with an error
// that says so, never with keys that would read garbage.
func TestWrongOrMissingKEK(t *testing.T) {
	dir := t.TempDir()
	k := mustRing(t, vfs.OS(), dir, openKEK(t, kekFileFor(t)))
	k.Close()

	// Another file, another KEK id: unavailable.
	if _, err := openRing(t, vfs.OS(), dir, openKEK(t, kekFileFor(t)), false); !errors.Is(err, ErrKEKUnavailable) {
		t.Fatalf("other KEK file: %v", err)
	}
	// Same id, other secret: wrong.
	path := kekFileFor(t)
	b, _ := os.ReadFile(path)
	orig := openKEK(t, path)
	id, _ := orig.CurrentKEK(context.Background())
	dir2 := t.TempDir()
	k = mustRing(t, vfs.OS(), dir2, orig)
	k.Close()
	forged := filepath.Join(t.TempDir(), "kek.json")
	if _, err := AddKEK(forged); err != nil {
		t.Fatal(err)
	}
	fb, _ := os.ReadFile(forged)
	other := openKEK(t, forged)
	otherID, _ := other.CurrentKEK(context.Background())
	if err := os.WriteFile(forged, bytes.ReplaceAll(fb, []byte(otherID), []byte(id)), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := openRing(t, vfs.OS(), dir2, openKEK(t, forged), false)
	if !errors.Is(err, ErrWrongKEK) || !strings.Contains(err.Error(), "does not open") {
		t.Fatalf("same id, other secret: %v", err)
	}
	_ = b
	// No keyring, no Create.
	if _, err := openRing(t, vfs.OS(), t.TempDir(), orig, false); !errors.Is(err, ErrNoKeyring) {
		t.Fatalf("no keyring: %v", err)
	}
	// Open of a unit with no keyring at all.
	k = mustRing(t, vfs.OS(), t.TempDir(), orig)
	defer k.Close()
	if _, err := OpenInPlace(nil, k.Seal(nil, testFrame(1))); !errors.Is(err, ErrKeyUnavailable) {
		t.Fatalf("nil keyring: %v", err)
	}
}

func TestKEKFilePermissions(t *testing.T) {
	path := kekFileFor(t)
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenKEKFile(path); !errors.Is(err, ErrKEKFile) {
		t.Fatalf("mode 0640: %v", err)
	}
	for _, body := range []string{``, `{}`, `{"version":1,"keks":[]}`, `{"version":2,"keks":[{"id":"a","secret":"AAAA"}]}`,
		`{"version":1,"keks":[{"id":"a b","secret":"` + strings.Repeat("A", 44) + `"}]}`,
		`{"version":1,"keks":[{"id":"a","secret":"AAAA"}]}`} {
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenKEKFile(path); !errors.Is(err, ErrKEKFile) {
			t.Fatalf("%q: %v", body, err)
		}
	}
}

// TestNonceSessions: nonces never repeat within a key, across a session
// running out, and sessions of two processes differ.
func TestNonceSessions(t *testing.T) {
	k := mustRing(t, vfs.OS(), t.TempDir(), openKEK(t, kekFileFor(t)))
	defer k.Close()
	key := k.set.Load().active
	seen := map[[nonceSize]byte]bool{}
	take := func() {
		n := key.nextNonce()
		if seen[n] {
			t.Fatalf("nonce %x repeated", n)
		}
		seen[n] = true
	}
	for range 100 {
		take()
	}
	s := key.sess.Load()
	s.counter.Store(math.MaxUint32 - 2)
	for range 10 {
		take()
	}
	if key.sess.Load() == s {
		t.Fatal("the session did not change when its counter ran out")
	}
}

func TestKeyringCrashSafe(t *testing.T) {
	// A rotation interrupted by a crash leaves the old keyring or the new
	// one, and a unit is never sealed under a key the file lacks.
	kek := openKEK(t, kekFileFor(t))
	for seed := range uint64(20) {
		m := vfs.NewMem(rand.New(rand.NewPCG(seed, 1)))
		k := mustRing(t, m, "/keys", kek)
		u := k.Seal(nil, testFrame(1))
		failAt := int(seed % 6) // the nth operation of the rotation fails
		ops := 0
		m.SetHook(func(op vfs.Op, path string) error {
			ops++
			if ops == failAt {
				return errors.New("injected")
			}
			return nil
		})
		_, rerr := k.Rotate(context.Background())
		u2 := k.Seal(nil, testFrame(2))
		m.SetHook(nil)
		after := m.Crash()
		k2, err := openRing(t, after, "/keys", kek, false)
		if err != nil {
			t.Fatalf("seed %d: reopen after crash: %v", seed, err)
		}
		if _, err := k2.OpenInPlace(bytes.Clone(u)); err != nil {
			t.Fatalf("seed %d: old unit: %v", seed, err)
		}
		if _, err := k2.OpenInPlace(bytes.Clone(u2)); err != nil && rerr == nil {
			t.Fatalf("seed %d: rotation returned nil but its key is lost: %v", seed, err)
		}
		k2.Close()
	}
}
