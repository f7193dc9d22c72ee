package segment

import (
	"bytes"
	"errors"
	"io"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/geolog/geolog/batch"
)

// zeroAheadConfig is smallConfig with zero-ahead on and segments large
// enough for several appends within one stretch of zeros.
func zeroAheadConfig(t testing.TB, e env) Config {
	cfg := smallConfig(t, e)
	cfg.SegmentBytesMax = 256 << 10
	cfg.ZeroAheadBytes = 128 << 10
	return cfg
}

// fileSizes returns the size of every .log file in cfg's directory.
func fileSizes(t testing.TB, cfg Config) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, name := range logFiles(t, cfg) {
		fi, err := cfg.FS.Stat(filepath.Join(cfg.Dir, name))
		if err != nil {
			t.Fatal(err)
		}
		out[name] = fi.Size()
	}
	return out
}

// TestZeroAheadPadsAndTrims checks the mechanism: appends land within
// zeros written before them (the active file's size moves once per
// stretch, not per append, and ends past the data on a page boundary);
// reads never see the padding; a roll leaves the sealed segment ending at
// its last frame; Close cuts the padding off; and the log reopens whole.
func TestZeroAheadPadsAndTrims(t *testing.T) {
	forEachFS(t, func(t *testing.T, e env) {
		cfg := zeroAheadConfig(t, e)
		s := mustOpen(t, cfg)
		var m model
		grew, prev, tm := 0, int64(-1), int64(100)
		for range 60 {
			tm = appendBatches(t, s, &m, 1, tm)
			sizes := fileSizes(t, cfg)
			active := sizes[logFiles(t, cfg)[len(sizes)-1]]
			if active != prev {
				grew++
				prev = active
			}
			data := s.active().size
			if active <= data || active%zeroAheadAlign != 0 {
				t.Fatalf("active file of %d bytes for %d bytes of frames: want zeros past them to a page boundary", active, data)
			}
		}
		if grew > 3 {
			t.Fatalf("the active file grew %d times in 60 appends: zero-ahead should take them in one or two stretches", grew)
		}
		checkLog(t, s, &m)

		// Appends until a roll: the sealed segment ends at its last frame.
		for len(logFiles(t, cfg)) < 2 {
			tm = appendBatches(t, s, &m, 20, tm)
		}
		sizes := fileSizes(t, cfg)
		names := logFiles(t, cfg)
		if sealed := s.segs[0]; sizes[names[0]] != sealed.size {
			t.Fatalf("sealed segment file of %d bytes, %d bytes of frames: the padding stayed", sizes[names[0]], sealed.size)
		}
		checkLog(t, s, &m)

		data := s.active().size
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		sizes = fileSizes(t, cfg)
		if got := sizes[names[len(names)-1]]; got != data {
			t.Fatalf("after Close the active file is %d bytes, %d bytes of frames", got, data)
		}
		s = mustOpen(t, cfg)
		defer s.Close()
		checkLog(t, s, &m)
		appendBatches(t, s, &m, 5, tm)
		checkLog(t, s, &m)
	})
}

// TestZeroAheadCrash crashes with padding on disk, synced and not: the
// reopened log holds every synced frame, ends at its last frame, and its
// recovery reports no torn tail (the padding is not one). A frame whose
// write was lost over the zeros is cut off as the torn tail it is.
func TestZeroAheadCrash(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		var torn atomic.Int64
		e := memEnv(seed)
		cfg := zeroAheadConfig(t, e)
		cfg.Logger = hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: io.MultiWriter(
			countingWriter{phrase: "torn tail", n: &torn})})
		s := mustOpen(t, cfg)
		var m model
		tm := appendBatches(t, s, &m, 40, 100) // synced: the stretch is on disk
		crashed := e.mem.Crash()
		_ = s.Close()
		cfg.FS = crashed
		// Offline, Verify tells the padding from a torn tail.
		rep, err := Verify(cfg)
		if err != nil || rep.PaddingBytes == 0 || rep.TornTailBytes != 0 {
			t.Fatalf("seed %d: Verify after the crash: %+v, %v; want padding and no torn tail", seed, rep, err)
		}
		s = mustOpen(t, cfg)
		checkLog(t, s, &m)
		if n := torn.Load(); n != 0 {
			t.Fatalf("seed %d: recovery logged %d torn tails after a crash that tore nothing", seed, n)
		}
		if sizes := fileSizes(t, cfg); sizes[logFiles(t, cfg)[0]] != s.active().size {
			t.Fatalf("seed %d: after recovery the file is %d bytes, %d bytes of frames", seed, sizes[logFiles(t, cfg)[0]], s.active().size)
		}

		// Unsynced appends over the zeros: whatever of them the crash
		// kept is a prefix, the synced frames all stay.
		tm = appendBatches(t, s, &m, 5, tm)
		synced := len(m.heads)
		for range 10 {
			f := makeFrame(s.NextOffset(), 3, tm)
			if err := s.Append(f); err != nil {
				t.Fatal(err)
			}
			m.add(t, f)
		}
		crashed2 := crashed.Crash()
		_ = s.Close()
		cfg.FS = crashed2
		s = mustOpen(t, cfg)
		got := readAll(t, s, s.NextOffset())
		if len(got) < synced || len(got) > len(m.heads) {
			t.Fatalf("seed %d: recovered %d frames, %d synced and %d appended", seed, len(got), synced, len(m.heads))
		}
		for i, h := range got {
			if h.BaseOffset != m.heads[i].BaseOffset {
				t.Fatalf("seed %d: frame %d at %d, appended at %d", seed, i, h.BaseOffset, m.heads[i].BaseOffset)
			}
		}
		s.Close()
	}
}

// TestZeroAheadTruncate cuts the log inside the active segment: the
// padding goes with the cut frames, and appends go on from the cut.
func TestZeroAheadTruncate(t *testing.T) {
	forEachFS(t, func(t *testing.T, e env) {
		cfg := zeroAheadConfig(t, e)
		s := mustOpen(t, cfg)
		defer s.Close()
		var m model
		tm := appendBatches(t, s, &m, 30, 100)
		cut := m.heads[20].BaseOffset
		if err := s.TruncateSuffix(cut); err != nil {
			t.Fatal(err)
		}
		m.truncate(cut)
		if got, want := fileSizes(t, cfg)[logFiles(t, cfg)[0]], s.active().size; got != want {
			t.Fatalf("after the truncation the file is %d bytes, %d bytes of frames", got, want)
		}
		appendBatches(t, s, &m, 10, tm)
		checkLog(t, s, &m)
		if got := fileSizes(t, cfg)[logFiles(t, cfg)[0]]; got <= s.active().size {
			t.Fatalf("no zeros past the frames appended after a truncation (file %d bytes)", got)
		}
	})
}

// TestZeroAheadNeedsFsync: without fdatasyncs there is nothing to save
// and the files hold frames only.
func TestZeroAheadNeedsFsync(t *testing.T) {
	e := memEnv(1)
	cfg := zeroAheadConfig(t, e)
	cfg.Fsync = FsyncNever
	s := mustOpen(t, cfg)
	defer s.Close()
	var m model
	appendBatches(t, s, &m, 10, 100)
	if got, want := fileSizes(t, cfg)[logFiles(t, cfg)[0]], s.active().size; got != want {
		t.Fatalf("FsyncNever: file of %d bytes for %d bytes of frames", got, want)
	}
}

// TestZeroAheadConfig refuses a bound outside [0, ZeroAheadBytesMax].
func TestZeroAheadConfig(t *testing.T) {
	for _, n := range []int64{-1, ZeroAheadBytesMax + 1} {
		cfg := zeroAheadConfig(t, memEnv(1))
		cfg.ZeroAheadBytes = n
		if _, err := Open(cfg); err == nil {
			t.Fatalf("ZeroAheadBytes %d accepted", n)
		}
	}
}

// TestZeroAheadNoSpace fills the device: zeros refused for space are cut
// off, frames go on landing while they fit (zero-ahead off for the
// segment), a frame that does not fit is refused with ErrNoSpace as
// without zero-ahead, and the store never fails.
func TestZeroAheadNoSpace(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		e := memEnv(seed)
		cfg := zeroAheadConfig(t, e)
		s := mustOpen(t, cfg)
		var m model
		appendBatches(t, s, &m, 5, 100)
		// Room for the frames in the padding and a few more, not for
		// another stretch of zeros.
		e.mem.SetSpaceBytes(e.mem.UsedBytes() + int64(seed*500))
		refused := 0
		for i := 0; i < 4000 && refused < 3; i++ {
			f := makeFrame(s.NextOffset(), 8, 1000)
			switch err := s.Append(f); {
			case err == nil:
				m.add(t, f)
			case errors.Is(err, ErrNoSpace):
				refused++
			default:
				t.Fatalf("seed %d: Append: %v", seed, err)
			}
		}
		if refused == 0 {
			t.Fatalf("seed %d: the full device refused nothing", seed)
		}
		if !s.active().noZeroAhead {
			t.Fatalf("seed %d: zero-ahead still on after the device refused zeros", seed)
		}
		if err := s.Sync(); err != nil {
			t.Fatalf("seed %d: Sync: %v", seed, err)
		}
		checkLog(t, s, &m)
		e.mem.SetSpaceBytes(0)
		appendBatches(t, s, &m, 5, 2000)
		crashed := e.mem.Crash()
		_ = s.Close()
		cfg.FS = crashed
		s = mustOpen(t, cfg)
		checkLog(t, s, &m)
		s.Close()
	}
}

// TestZeroAheadUnitKeys: FileUnitKeys counts a padded file's units and
// stops at the zeros.
func TestZeroAheadUnitKeys(t *testing.T) {
	e := memEnv(1)
	cfg := zeroAheadConfig(t, e)
	cfg.Keyring = testKeyring()
	s := mustOpen(t, cfg)
	defer s.Close()
	var m model
	appendBatches(t, s, &m, 12, 100)
	path := filepath.Join(cfg.Dir, logFiles(t, cfg)[0])
	if raw := readTestFile(t, cfg.FS, path); !bytes.Equal(raw[len(raw)-16:], make([]byte, 16)) {
		t.Fatal("the active file does not end in zeros")
	}
	keys, err := FileUnitKeys(cfg.FS, path)
	if err != nil {
		t.Fatalf("FileUnitKeys of a padded file: %v", err)
	}
	n := 0
	for _, c := range keys {
		n += c
	}
	if n != len(m.heads) {
		t.Fatalf("FileUnitKeys counted %d units, %d frames appended", n, len(m.heads))
	}
}

// TestZeroAheadOffForLargeRounds: where Sync rounds cover more than
// zeroAheadSyncBytesMax, writing every byte twice costs more than the
// commits save, and the file grows with its frames alone.
func TestZeroAheadOffForLargeRounds(t *testing.T) {
	e := memEnv(1)
	cfg := zeroAheadConfig(t, e)
	cfg.SegmentBytesMax = 64 << 20
	s := mustOpen(t, cfg)
	defer s.Close()
	value := bytes.Repeat([]byte{7}, 60<<10)
	for i := range 40 {
		next := s.NextOffset()
		f := batch.Encode(nil, batch.Header{BaseOffset: next, Epoch: 1, AppendTimeUnixNanos: int64(i)},
			[]batch.Record{{Key: []byte("k"), Value: value}})
		if err := s.Append(f); err != nil {
			t.Fatal(err)
		}
		if err := s.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if avg := s.syncBytes.Load(); avg <= zeroAheadSyncBytesMax {
		t.Fatalf("rounds of 60 KiB average %d bytes", avg)
	}
	if got, want := fileSizes(t, cfg)[logFiles(t, cfg)[0]], s.active().size; got != want {
		t.Fatalf("after 40 rounds of 60 KiB the file is %d bytes, %d bytes of frames: zero-ahead stayed on", got, want)
	}
}
