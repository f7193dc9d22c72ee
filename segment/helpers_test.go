package segment

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
)

// testLogger routes the store's logs to t.Log.
func testLogger(t testing.TB) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:   t.Name(),
		Level:  hclog.Debug,
		Output: testWriter{t},
	})
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

// env is where a test's store lives: a file system and a directory in it.
type env struct {
	fs  vfs.FS
	dir string
	mem *vfs.Mem // nil on the real file system
}

// osEnv is a fresh temporary directory on the real file system.
func osEnv(t testing.TB) env { return env{fs: vfs.OS(), dir: t.TempDir()} }

// memEnv is a fresh in-memory file system seeded with seed.
func memEnv(seed uint64) env {
	m := vfs.NewMem(rand.New(rand.NewPCG(seed, 0x5e6)))
	return env{fs: m, dir: "/range", mem: m}
}

// forEachFS runs fn as the subtests "os", "mem" and "cache": the real
// file system behind a node's file cache (vfs.Cache) of two descriptors,
// so that the store's files are closed and reopened all the time.
func forEachFS(t *testing.T, fn func(t *testing.T, e env)) {
	t.Run("os", func(t *testing.T) { fn(t, osEnv(t)) })
	t.Run("mem", func(t *testing.T) { fn(t, memEnv(1)) })
	t.Run("cache", func(t *testing.T) { fn(t, env{fs: vfs.NewCache(vfs.OS(), 2), dir: t.TempDir()}) })
}

// smallConfig is a config with tiny segments and a dense index, so that a
// few hundred batches exercise rolls, index seeks and multi-segment reads.
func smallConfig(t testing.TB, e env) Config {
	cfg := Config{Dir: e.dir, FS: e.fs, SegmentBytesMax: 2048, IndexIntervalBytes: 200, Logger: testLogger(t)}
	if sealAll {
		cfg.Keyring = testKeyring()
	}
	return cfg
}

func mustOpen(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

// recordValue is the deterministic value of the record at offset off, so
// any reader can check what it got.
func recordValue(off uint64, size int) []byte {
	v := make([]byte, size)
	binary.LittleEndian.PutUint64(v, off)
	for i := 8; i < size; i++ {
		v[i] = byte(off*31 + uint64(i))
	}
	return v
}

// makeFrame encodes a batch of n records at base with the given append
// time; record sizes vary with the offset.
func makeFrame(base uint64, n int, appendTime int64) []byte {
	recs := make([]batch.Record, n)
	for i := range recs {
		off := base + uint64(i)
		recs[i] = batch.Record{
			Key:                   fmt.Appendf(nil, "k%d", off),
			Value:                 recordValue(off, 8+int(off%37)),
			ProducerTimeUnixNanos: int64(off),
		}
	}
	return batch.Encode(nil, batch.Header{BaseOffset: base, Epoch: 1, AppendTimeUnixNanos: appendTime}, recs)
}

// checkFrames decodes frames and checks every record against recordValue,
// returning the headers.
func checkFrames(t testing.TB, frames []byte) []batch.Header {
	t.Helper()
	var hs []batch.Header
	for len(frames) > 0 {
		h, recs, err := batch.Decode(frames)
		if err != nil {
			t.Fatalf("decode returned frame: %v", err)
		}
		for i, r := range recs {
			off := h.Offset(&recs[i])
			if string(r.Key) != fmt.Sprintf("k%d", off) || !bytes.Equal(r.Value, recordValue(off, 8+int(off%37))) {
				t.Fatalf("record at offset %d has key %q and the wrong value", off, r.Key)
			}
		}
		hs = append(hs, h)
		size, _ := batch.FrameSize(frames)
		frames = frames[size:]
	}
	return hs
}

// model is what a test expects the log to hold.
type model struct {
	frames [][]byte
	heads  []batch.Header
}

func (m *model) next() uint64 {
	if len(m.heads) == 0 {
		return 0
	}
	return m.heads[len(m.heads)-1].NextOffset()
}

func (m *model) add(t testing.TB, frame []byte) {
	t.Helper()
	h, err := batch.DecodeHeader(frame)
	if err != nil {
		t.Fatal(err)
	}
	m.frames = append(m.frames, frame)
	m.heads = append(m.heads, h)
}

// truncate drops batches from offset on (a boundary).
func (m *model) truncate(offset uint64) {
	i := m.find(offset)
	if i < len(m.heads) && m.heads[i].BaseOffset != offset {
		panic("not a boundary")
	}
	m.frames, m.heads = m.frames[:i], m.heads[:i]
}

// dropBefore drops batches that end at or before offset.
func (m *model) dropBefore(offset uint64) {
	i := 0
	for i < len(m.heads) && m.heads[i].NextOffset() <= offset {
		i++
	}
	m.frames, m.heads = m.frames[i:], m.heads[i:]
}

// find returns the index of the batch holding off (len if none).
func (m *model) find(off uint64) int {
	i, _ := slices.BinarySearchFunc(m.heads, off, func(h batch.Header, off uint64) int {
		switch {
		case h.NextOffset() <= off:
			return -1
		case h.BaseOffset > off:
			return 1
		}
		return 0
	})
	return i
}

// appendBatches appends count batches of 1..4 records with append times
// starting at time and rising by 10 every other batch, syncing at the end.
func appendBatches(t testing.TB, s *Store, m *model, count int, time int64) int64 {
	t.Helper()
	for i := range count {
		base := s.NextOffset()
		if base != m.next() {
			t.Fatalf("NextOffset %d, model %d", base, m.next())
		}
		frame := makeFrame(base, 1+int(base%4), time)
		if err := s.Append(frame); err != nil {
			t.Fatalf("Append at %d: %v", base, err)
		}
		m.add(t, frame)
		if i%2 == 1 {
			time += 10
		}
	}
	if err := s.Sync(); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	return time
}

// nextCheckedOffset is the offset after off whose single-frame read
// checkLog checks. Every offset of a frame takes the same path (the index
// finds the frame, the frame is read whole), so reading all 5,000 of a
// large frame's offsets reads it 5,000 times: minutes under the race
// detector on a busy machine for TestReadFramesLargeFrames, and no path
// the sampled offsets miss.
func nextCheckedOffset(m *model, off uint64) uint64 {
	h := m.heads[m.find(off)]
	base, next := h.BaseOffset, h.NextOffset()
	switch {
	case next-base <= 16 || off+1 < base+4 || off+1 >= next-4:
		return off + 1
	case off+61 < next-4:
		return off + 61
	default:
		return next - 4
	}
}

// checkLog checks the store against the model: offsets, a single-frame
// read at every offset (within a frame of more than 16 records: its first
// and last four offsets and every 61st between), and a full read in pieces
// of various sizes.
func checkLog(t testing.TB, s *Store, m *model) {
	t.Helper()
	if len(m.heads) > 0 {
		if got, want := s.StartOffset(), m.heads[0].BaseOffset; got != want {
			t.Fatalf("StartOffset %d, want %d", got, want)
		}
	}
	if got, want := s.NextOffset(), m.next(); got != want {
		t.Fatalf("NextOffset %d, want %d", got, want)
	}
	if len(m.heads) == 0 {
		return
	}
	for off := m.heads[0].BaseOffset; off < m.next(); off = nextCheckedOffset(m, off) {
		got, err := s.ReadFrames(off, 0, m.next())
		if err != nil {
			t.Fatalf("ReadFrames(%d): %v", off, err)
		}
		if want := m.frames[m.find(off)]; !bytes.Equal(got, want) {
			t.Fatalf("ReadFrames(%d, 0) returned %d bytes, want the %d-byte frame holding it", off, len(got), len(want))
		}
	}
	for _, maxBytes := range []int{1, 300, 1000, 5000, 1 << 20} {
		var all []byte
		for off := m.heads[0].BaseOffset; off < m.next(); {
			got, err := s.ReadFrames(off, maxBytes, m.next())
			if err != nil {
				t.Fatalf("ReadFrames(%d, %d): %v", off, maxBytes, err)
			}
			hs := checkFrames(t, got)
			if len(hs) == 0 {
				t.Fatalf("ReadFrames(%d, %d) returned nothing before the end", off, maxBytes)
			}
			if len(hs) > 1 && len(got) > maxBytes {
				t.Fatalf("ReadFrames(%d, %d) returned %d bytes in %d frames", off, maxBytes, len(got), len(hs))
			}
			all = append(all, got...)
			off = hs[len(hs)-1].NextOffset()
		}
		if want := bytes.Join(m.frames, nil); !bytes.Equal(all, want) {
			t.Fatalf("reading the log in %d-byte pieces returned %d bytes, want %d", maxBytes, len(all), len(want))
		}
	}
}

// dirImage returns the contents of every file in cfg's directory.
func dirImage(t testing.TB, cfg Config) map[string][]byte {
	t.Helper()
	ents, err := cfg.FS.ReadDir(cfg.Dir)
	if err != nil {
		t.Fatal(err)
	}
	img := map[string][]byte{}
	for _, e := range ents {
		img[e.Name()] = readTestFile(t, cfg.FS, filepath.Join(cfg.Dir, e.Name()))
	}
	return img
}

// writeDirImage replaces the contents of cfg's directory with img.
func writeDirImage(t testing.TB, cfg Config, img map[string][]byte) {
	t.Helper()
	ents, err := cfg.FS.ReadDir(cfg.Dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if err := cfg.FS.Remove(filepath.Join(cfg.Dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	for name, b := range img {
		writeTestFile(t, cfg.FS, filepath.Join(cfg.Dir, name), b)
	}
}

func readTestFile(t testing.TB, fsys vfs.FS, name string) []byte {
	t.Helper()
	b, err := vfs.ReadFile(fsys, name, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeTestFile replaces name with b, durably.
func writeTestFile(t testing.TB, fsys vfs.FS, name string, b []byte) {
	t.Helper()
	if err := writeFile(fsys, name, b, true); err != nil {
		t.Fatal(err)
	}
	if err := fsys.SyncDir(filepath.Dir(name)); err != nil {
		t.Fatal(err)
	}
}

func equalImages(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}

// logFiles returns the .log file names in cfg's directory, sorted.
func logFiles(t testing.TB, cfg Config) []string {
	t.Helper()
	var names []string
	for name := range dirImage(t, cfg) {
		if filepath.Ext(name) == logSuffix {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// syncCounter counts fdatasync calls of the log and can fail them.
type syncCounter struct {
	mu    sync.Mutex
	calls int
	failN int   // fail the failN-th call (1-based); 0 never
	err   error // error to fail with
	hold  chan struct{}
}

func (c *syncCounter) fdatasync(f vfs.File) error {
	c.mu.Lock()
	c.calls++
	n, hold := c.calls, c.hold
	c.mu.Unlock()
	if hold != nil {
		<-hold
	}
	if c.failN != 0 && n == c.failN {
		return c.err
	}
	return f.Datasync()
}

func (c *syncCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

func errorsAs[T error](err error) (T, bool) {
	var target T
	ok := errors.As(err, &target)
	return target, ok
}
