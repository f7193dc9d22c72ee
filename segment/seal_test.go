package segment

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/geolog/geolog/atrest"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
)

// sealAll turns encryption at rest on in every test config built by
// smallConfig (GEOLOG_SEGMENT_ATREST=1 go test ./segment/), so that the
// whole suite runs on sealed logs.
var sealAll = os.Getenv("GEOLOG_SEGMENT_ATREST") != ""

var (
	sharedKeyringOnce sync.Once
	sharedKeyring     *atrest.Keyring
)

// testKeyring is one keyring shared by every test of the package that
// needs one and does not care which (a store reopened with it opens what
// it sealed before).
func testKeyring() *atrest.Keyring {
	sharedKeyringOnce.Do(func() {
		sharedKeyring = newKeyring(7)
	})
	return sharedKeyring
}

// newKeyring makes a keyring on its own in-memory file system, under an
// in-memory KEK drawn from seed.
func newKeyring(seed byte) *atrest.Keyring {
	secret := make([]byte, 32)
	r := rand.NewChaCha8([32]byte{seed})
	r.Read(secret)
	kek, err := atrest.NewMemKEK(fmt.Sprintf("test-kek-%d", seed), secret)
	if err != nil {
		panic(err)
	}
	k, err := atrest.Open(context.Background(), atrest.Config{Dir: "/keys", FS: vfs.NewMem(rand.New(rand.NewPCG(uint64(seed), 1))),
		KEK: kek, Create: true, Rand: chachaReader{rand.NewChaCha8([32]byte{seed, 1})}})
	if err != nil {
		panic(err)
	}
	return k
}

type chachaReader struct{ r *rand.ChaCha8 }

func (c chachaReader) Read(p []byte) (int, error) { return c.r.Read(p) }

// sealedConfig is smallConfig with encryption at rest on.
func sealedConfig(t testing.TB, e env) Config {
	cfg := smallConfig(t, e)
	cfg.Keyring = testKeyring()
	return cfg
}

// marker is a record value that must never be found on disk in the clear.
var marker = []byte("MARKER-4111-1111-1111-1111-at-rest")

func markerFrame(base uint64, appendTime int64) []byte {
	recs := []batch.Record{{Key: []byte("card"), Value: append(bytes.Clone(marker), fmt.Appendf(nil, "-%d", base)...)},
		{Key: fmt.Appendf(nil, "k%d", base+1), Value: bytes.Repeat(marker, 3)}}
	return batch.Encode(nil, batch.Header{BaseOffset: base, Epoch: 1, AppendTimeUnixNanos: appendTime}, recs)
}

// grepDir fails t if any file under dir holds needle.
func grepDir(t testing.TB, fsys vfs.FS, dir string, needle []byte) {
	t.Helper()
	ents, err := fsys.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if e.IsDir() {
			grepDir(t, fsys, p, needle)
			continue
		}
		if b := readTestFile(t, fsys, p); bytes.Contains(b, needle) {
			t.Fatalf("%s holds the plaintext %q", p, needle)
		}
	}
}

// appendMarkers appends count marker frames to s and m.
func appendMarkers(t testing.TB, s *Store, m *model, count int) {
	t.Helper()
	for range count {
		f := markerFrame(s.NextOffset(), 100)
		if err := s.Append(f); err != nil {
			t.Fatal(err)
		}
		m.add(t, f)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestSealedNoPlaintext writes marker records through every write path of
// the store (appends across rolls, a rewrite by compaction, a staged
// install, a reseal) with encryption at rest on: the marker is nowhere in
// the directory, files are 0600, and the log reads back exactly.
func TestSealedNoPlaintext(t *testing.T) {
	forEachFS(t, func(t *testing.T, e env) {
		cfg := sealedConfig(t, e)
		s := mustOpen(t, cfg)
		var m model
		appendMarkers(t, s, &m, 40)
		checkModel(t, s, &m)
		grepDir(t, e.fs, e.dir, marker)

		// Compaction by key: drop the second record of every frame of the
		// oldest segment.
		seg := s.Sealed()[0]
		if _, err := s.RewriteSegment(seg.BaseOffset, nil, func(dst, frame []byte, h batch.Header, last bool) ([]byte, error) {
			return append(dst, frame...), nil
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Reseal(s.Sealed()[1].BaseOffset, nil); err != nil {
			t.Fatal(err)
		}
		checkModel(t, s, &m)
		grepDir(t, e.fs, e.dir, marker)

		// A staged install (a Raft snapshot) of the same frames.
		st, err := s.BeginStaging(0, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m.frames {
			if _, err := st.Append(f); err != nil {
				t.Fatal(err)
			}
		}
		if err := st.Finish(); err != nil {
			t.Fatal(err)
		}
		grepDir(t, e.fs, e.dir, marker)
		if err := s.Install(st); err != nil {
			t.Fatal(err)
		}
		checkModel(t, s, &m)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		grepDir(t, e.fs, e.dir, marker)
		if e.mem == nil {
			ents, _ := os.ReadDir(e.dir)
			for _, de := range ents {
				if fi, err := de.Info(); err == nil && de.Type().IsRegular() && fi.Mode().Perm() != 0o600 {
					t.Errorf("%s is mode %v, want 0600", de.Name(), fi.Mode().Perm())
				}
			}
		}
		s = mustOpen(t, cfg)
		defer s.Close()
		checkModel(t, s, &m)
	})
}

// TestSealedWrongOrMissingKey: a sealed log opened with another keyring,
// or with none, is refused with an error naming the key (never
// corruption, never a torn tail), and nothing on disk changes.
func TestSealedWrongOrMissingKey(t *testing.T) {
	e := memEnv(3)
	cfg := sealedConfig(t, e)
	s := mustOpen(t, cfg)
	var m model
	appendBatches(t, s, &m, 30, 1)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	before := dirImage(t, cfg)
	for _, k := range []*atrest.Keyring{newKeyring(99), nil} {
		c := cfg
		c.Keyring = k
		_, err := Open(c)
		var ke *atrest.KeyError
		if !errors.As(err, &ke) || errors.Is(err, ErrCorrupt) || ke.NoKeyring != (k == nil) {
			t.Fatalf("keyring %v: Open = %v, want a key error", k != nil, err)
		}
		t.Logf("keyring %v: %v", k != nil, err)
		if !equalImages(before, dirImage(t, cfg)) {
			t.Fatal("a refused Open changed the directory")
		}
	}
	s = mustOpen(t, cfg)
	defer s.Close()
	checkLog(t, s, &m)
}

// TestSealedBitFlip flips one bit in a sealed unit: in a segment but the
// last, or in the last one with a valid unit after it, Open reports
// corruption; in the last unit of the log it is a torn tail, truncated.
// A read of a flipped unit in an open store is corruption too.
func TestSealedBitFlip(t *testing.T) {
	e := memEnv(4)
	cfg := sealedConfig(t, e)
	s := mustOpen(t, cfg)
	var m model
	appendBatches(t, s, &m, 60, 1)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	files := logFiles(t, cfg)
	if len(files) < 3 {
		t.Fatalf("%d segments", len(files))
	}
	image := dirImage(t, cfg)
	flip := func(name string, pos int) {
		img := cloneImage(image)
		b := bytes.Clone(img[name])
		b[pos] ^= 0x10
		img[name] = b
		writeDirImage(t, cfg, img)
	}
	first, last := files[0], files[len(files)-1]
	lastBytes := image[last]
	size, err := atrest.UnitSize(lastBytes)
	if err != nil || size >= len(lastBytes) {
		t.Fatalf("last segment: first unit of %d bytes in %d: %v", size, len(lastBytes), err)
	}
	for _, tc := range []struct {
		name    string
		file    string
		pos     int
		corrupt bool
	}{
		{"sealed segment, ciphertext", first, atrest.HeaderBytes + 30, true},
		{"sealed segment, nonce", first, 15, true},
		{"sealed segment, tag", first, len(image[first]) - 1, true},
		{"last segment, first unit of several", last, atrest.HeaderBytes + 5, true},
		{"last segment, last unit", last, len(lastBytes) - 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flip(tc.file, tc.pos)
			s, err := Open(cfg)
			if tc.corrupt {
				if !errors.Is(err, ErrCorrupt) || !errors.Is(err, atrest.ErrAuth) && tc.pos >= atrest.HeaderBytes {
					t.Fatalf("Open = %v, want corruption", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open = %v, want a torn tail", err)
			}
			defer s.Close()
			if s.NextOffset() >= m.next() {
				t.Fatalf("torn unit kept: NextOffset %d", s.NextOffset())
			}
		})
	}

	// In an open store: a read meets the flipped unit.
	writeDirImage(t, cfg, image)
	s = mustOpen(t, cfg)
	defer s.Close()
	b := bytes.Clone(image[first])
	b[atrest.HeaderBytes+30] ^= 1
	f, err := e.fs.OpenFile(filepath.Join(cfg.Dir, first), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := s.ReadFrames(s.StartOffset(), math.MaxInt, math.MaxUint64); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("read of a flipped unit: %v", err)
	}
}

// TestSealedRotationWhileAppending rotates the data key while an appender
// and readers run: every frame stays readable, the log holds units under
// several keys, a reopen reads them all, and resealing every sealed
// segment leaves only the newest key in them.
func TestSealedRotationWhileAppending(t *testing.T) {
	e := osEnv(t)
	cfg := smallConfig(t, e)
	cfg.Keyring = newKeyring(11)
	s := mustOpen(t, cfg)
	var m model
	var stop atomic.Bool
	var wg sync.WaitGroup
	var readErr atomic.Pointer[error]
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			if next := s.NextOffset(); next > 0 {
				if _, err := s.ReadFrames(0, 1<<20, next); err != nil {
					readErr.Store(&err)
					return
				}
			}
		}
	}()
	for i := range 6 {
		appendBatches(t, s, &m, 25, int64(i*1000))
		if _, err := cfg.Keyring.Rotate(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if p := readErr.Load(); p != nil {
		t.Fatalf("concurrent read: %v", *p)
	}
	checkLog(t, s, &m)
	if n := len(unitKeys(t, cfg)); n < 5 {
		t.Fatalf("units under %d keys, want one per rotation", n)
	}
	for _, seg := range s.Sealed() {
		if _, err := s.Reseal(seg.BaseOffset, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	keys := unitKeys(t, cfg)
	delete(keys, cfg.Keyring.Active())
	// Only the active segment may still hold units under older keys.
	for id, files := range keys {
		if len(files) > 1 || files[0] != logFiles(t, cfg)[len(logFiles(t, cfg))-1] {
			t.Fatalf("key %v still seals %v after reseal", id, files)
		}
	}
	s = mustOpen(t, cfg)
	defer s.Close()
	checkLog(t, s, &m)
}

// unitKeys maps each data key to the log files holding units under it.
func unitKeys(t testing.TB, cfg Config) map[atrest.KeyID][]string {
	t.Helper()
	out := map[atrest.KeyID][]string{}
	for _, p := range logFiles(t, cfg) {
		b := readTestFile(t, cfg.FS, filepath.Join(cfg.Dir, p))
		seen := map[atrest.KeyID]bool{}
		for len(b) > 0 {
			size, id, err := atrest.CheckHeader(b)
			if err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			if !seen[id] {
				seen[id] = true
				out[id] = append(out[id], p)
			}
			b = b[size:]
		}
	}
	return out
}

// TestSealedMixedWithPlain: a log written in the clear and then with
// encryption on reads whole; without the keyring it is refused.
func TestSealedMixedWithPlain(t *testing.T) {
	forEachFS(t, func(t *testing.T, e env) {
		plain := smallConfig(t, e)
		plain.Keyring = nil
		s := mustOpen(t, plain)
		var m model
		tm := appendBatches(t, s, &m, 20, 1)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		sealed := plain
		sealed.Keyring = testKeyring()
		s = mustOpen(t, sealed)
		appendBatches(t, s, &m, 20, tm)
		checkLog(t, s, &m)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(plain); !errors.Is(err, atrest.ErrKeyUnavailable) {
			t.Fatalf("Open without the keyring: %v", err)
		}
		s = mustOpen(t, sealed)
		defer s.Close()
		checkLog(t, s, &m)
	})
}

// checkModel checks that the log reads back as the model, whole and from
// every frame's offset, whatever the records hold.
func checkModel(t testing.TB, s *Store, m *model) {
	t.Helper()
	all, err := s.ReadFrames(s.StartOffset(), math.MaxInt, math.MaxUint64)
	if err != nil || !bytes.Equal(all, bytes.Join(m.frames, nil)) {
		t.Fatalf("ReadFrames of the whole log: %d bytes, %v; want %d", len(all), err, len(bytes.Join(m.frames, nil)))
	}
	for i, h := range m.heads {
		got, err := s.ReadFrames(h.BaseOffset, 0, math.MaxUint64)
		if err != nil || !bytes.Equal(got, m.frames[i]) {
			t.Fatalf("ReadFrames(%d): %v", h.BaseOffset, err)
		}
	}
}
