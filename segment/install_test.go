package segment

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
)

// raftLog appends frames with Raft indexes [firstIndex, firstIndex+n) at
// the store's tail (every fifth a noop control frame) and returns them.
func raftLog(t testing.TB, s *Store, firstIndex uint64, n int, term uint64, appendTime int64) [][]byte {
	t.Helper()
	var out [][]byte
	for i := range n {
		index := firstIndex + uint64(i)
		var f []byte
		if index%5 == 0 {
			f = controlFrame(batch.TypeNoop, s.NextOffset(), appendTime, term, index, nil)
		} else {
			f = dataFrame(s.NextOffset(), 1+int(index%3), appendTime, term, index)
		}
		if err := s.Append(f); err != nil {
			t.Fatalf("append index %d: %v", index, err)
		}
		out = append(out, f)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	return out
}

// stagedFrames builds n frames from (base, firstIndex) as a leader's log
// would hold them, without a store.
func stagedFrames(base, firstIndex uint64, n int, term uint64, appendTime int64) [][]byte {
	var out [][]byte
	for i := range n {
		index := firstIndex + uint64(i)
		var f []byte
		if index%5 == 0 {
			f = controlFrame(batch.TypeNoop, base, appendTime, term, index, nil)
		} else {
			f = dataFrame(base, 1+int(index%3), appendTime, term, index)
		}
		h, _ := batch.DecodeHeader(f)
		base = h.NextOffset()
		out = append(out, f)
	}
	return out
}

// readAllByIndex reads [first, last] of s by index.
func readAllByIndex(t testing.TB, s *Store) []byte {
	t.Helper()
	var all []byte
	for lo := s.FirstIndex(); lo != 0 && lo <= s.LastIndex(); {
		b, err := s.ReadFramesByIndex(lo, s.LastIndex()+1, 4096)
		if err != nil {
			t.Fatalf("ReadFramesByIndex(%d): %v", lo, err)
		}
		for rest := b; len(rest) > 0; {
			n, _ := batch.FrameSize(rest)
			lo++
			rest = rest[n:]
		}
		all = append(all, b...)
	}
	return all
}

func stagedNames(t testing.TB, cfg Config) []string {
	t.Helper()
	var out []string
	for name := range dirImage(t, cfg) {
		if strings.HasPrefix(name, stagePrefix) {
			out = append(out, name)
		}
	}
	return out
}

func TestInstallReplacesLog(t *testing.T) { forEachFS(t, testInstallReplacesLog) }

func testInstallReplacesLog(t *testing.T, e env) {
	cfg := smallConfig(t, e)
	s := mustOpen(t, cfg)
	raftLog(t, s, 1, 60, 1, 10)

	frames := stagedFrames(5000, 400, 80, 3, 20)
	st, err := s.BeginStaging(5000, 400)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.BeginStaging(0, 0); !errors.Is(err, ErrStagingBusy) {
		t.Fatalf("second staging: %v", err)
	}
	for _, f := range frames {
		if _, err := st.Append(f); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Install(st); !errors.Is(err, ErrStagingDone) {
		t.Fatalf("install of an unfinished staging: %v", err)
	}
	if err := st.Finish(); err != nil {
		t.Fatal(err)
	}
	if st.FirstIndex() != 400 || st.LastIndex() != 479 || st.LastTerm() != 3 || st.Frames() != 80 {
		t.Fatalf("staging: indexes [%d, %d] term %d frames %d", st.FirstIndex(), st.LastIndex(), st.LastTerm(), st.Frames())
	}
	// Until the install the old log is the log.
	if s.LastIndex() != 60 || s.StartOffset() != 0 {
		t.Fatalf("before install: last %d start %d", s.LastIndex(), s.StartOffset())
	}
	if err := s.Install(st); err != nil {
		t.Fatal(err)
	}
	want := bytes.Join(frames, nil)
	check := func(s *Store, when string) {
		t.Helper()
		if s.StartOffset() != 5000 || s.NextOffset() != st.NextOffset() || s.FirstIndex() != 400 || s.LastIndex() != 479 {
			t.Fatalf("%s: start %d next %d (want %d) indexes [%d, %d]", when, s.StartOffset(), s.NextOffset(), st.NextOffset(), s.FirstIndex(), s.LastIndex())
		}
		if got := readAllByIndex(t, s); !bytes.Equal(got, want) {
			t.Fatalf("%s: the log holds %d bytes, not the %d staged", when, len(got), len(want))
		}
		if n := stagedNames(t, cfg); len(n) != 0 {
			t.Fatalf("%s: staged files left: %v", when, n)
		}
		if _, err := s.ReadFrames(0, 100, 10); !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("%s: read of the old log: %v", when, err)
		}
		// The receiver ends with valid key indexes: a file for every
		// sealed segment, built from its log, and reads that agree.
		checkKeyIndexFiles(t, cfg)
		checkKeyReads(t, s, 10)
	}
	check(s, "after install")
	if len(logFiles(t, cfg)) < 2 {
		t.Fatalf("staged log should span segments: %v", logFiles(t, cfg))
	}
	// Raft continues after the installed log.
	next := s.NextOffset()
	if err := s.Append(dataFrame(next, 2, 30, 3, 480)); err != nil {
		t.Fatal(err)
	}
	want = append(want, dataFrame(next, 2, 30, 3, 480)...)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, cfg)
	defer s.Close()
	if s.LastIndex() != 480 || s.StartOffset() != 5000 {
		t.Fatalf("reopened: last %d start %d", s.LastIndex(), s.StartOffset())
	}
	if got := readAllByIndex(t, s); !bytes.Equal(got, want) {
		t.Fatal("reopened log differs")
	}
}

// TestStagingRefusesBadFrames: frames that do not continue the staged log
// are refused with ErrInvalidFrame, and an aborted staging leaves the log
// and the directory as they were.
func TestStagingRefusesBadFrames(t *testing.T) {
	e := memEnv(3)
	cfg := smallConfig(t, e)
	s := mustOpen(t, cfg)
	defer s.Close()
	raftLog(t, s, 1, 20, 1, 10)
	before := dirImage(t, cfg)

	good := stagedFrames(100, 50, 3, 2, 20)
	corrupt := bytes.Clone(good[1])
	corrupt[len(corrupt)-1] ^= 1
	cases := map[string][][]byte{
		"wrong first offset": {dataFrame(99, 1, 20, 2, 50)},
		"wrong first index":  {dataFrame(100, 1, 20, 2, 51)},
		"index gap":          {good[0], dataFrame(101, 1, 20, 2, 52)},
		"term decreases":     {good[0], dataFrame(101, 1, 20, 1, 51)},
		"time decreases":     {good[0], dataFrame(101, 1, 19, 2, 51)},
		"corrupt":            {good[0], corrupt},
		"two frames in one":  {append(bytes.Clone(good[0]), good[1]...)},
		"no index":           {good[0], makeFrame(101, 1, 20)},
	}
	for name, frames := range cases {
		st, err := s.BeginStaging(100, 50)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var last error
		for _, f := range frames {
			if _, last = st.Append(f); last != nil {
				break
			}
		}
		if !errors.Is(last, ErrInvalidFrame) {
			t.Fatalf("%s: %v, want ErrInvalidFrame", name, last)
		}
		st.Abort()
		st.Abort() // twice is fine
		if _, err := st.Append(good[0]); !errors.Is(err, ErrStagingDone) {
			t.Fatalf("%s: append after abort: %v", name, err)
		}
		if got := dirImage(t, cfg); !equalImages(got, before) {
			t.Fatalf("%s: the directory changed", name)
		}
	}
	if s.LastIndex() != 20 || s.StartOffset() != 0 {
		t.Fatalf("log changed: last %d", s.LastIndex())
	}
}

// TestOpenRemovesAbandonedStaging: staged files of a staging that never
// committed are removed by Open; the log is the old one.
func TestOpenRemovesAbandonedStaging(t *testing.T) {
	e := memEnv(4)
	cfg := smallConfig(t, e)
	s := mustOpen(t, cfg)
	raftLog(t, s, 1, 20, 1, 10)
	st, err := s.BeginStaging(100, 50)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range stagedFrames(100, 50, 40, 2, 20) {
		if _, err := st.Append(f); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Finish(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if len(stagedNames(t, cfg)) == 0 {
		t.Fatal("no staged files to abandon")
	}
	s = mustOpen(t, cfg)
	defer s.Close()
	if n := stagedNames(t, cfg); len(n) != 0 {
		t.Fatalf("staged files left: %v", n)
	}
	if s.LastIndex() != 20 || s.FirstIndex() != 1 {
		t.Fatalf("log: [%d, %d]", s.FirstIndex(), s.LastIndex())
	}
}

// TestInstallCrashAtEveryStep crashes the disk before every file system
// operation of a staging and its install: the log that Open recovers is
// always exactly the old one or exactly the new one, and both happen.
func TestInstallCrashAtEveryStep(t *testing.T) {
	outcomes := map[string]int{}
	for k := 1; ; k++ {
		m := vfs.NewMem(rand.New(rand.NewPCG(uint64(k), 7)))
		e := env{fs: m, dir: "/range", mem: m}
		cfg := smallConfig(t, e)
		cfg.Logger = nil
		s := mustOpen(t, cfg)
		old := raftLog(t, s, 1, 30, 1, 10)
		// The new log starts inside the old one's offsets, so that segment
		// names are shared and replaced.
		frames := stagedFrames(20, 300, 60, 2, 20)
		var crashed *vfs.Mem
		ops := 0
		m.SetHook(func(op vfs.Op, name string) error {
			ops++
			if ops == k {
				crashed = m.Crash()
			}
			return nil
		})
		st, err := s.BeginStaging(20, 300)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range frames {
			if _, err := st.Append(f); err != nil {
				t.Fatal(err)
			}
		}
		if err := st.Finish(); err != nil {
			t.Fatal(err)
		}
		if err := s.Install(st); err != nil {
			t.Fatal(err)
		}
		m.SetHook(nil)
		s.Close()
		if crashed == nil {
			break // k is past the last operation
		}
		cfg.FS = crashed
		r, err := Open(cfg)
		if err != nil {
			t.Fatalf("crash before operation %d: open: %v", k, err)
		}
		got := readAllByIndex(t, r)
		switch {
		case bytes.Equal(got, bytes.Join(old, nil)) && r.StartOffset() == 0:
			outcomes["old"]++
		case bytes.Equal(got, bytes.Join(frames, nil)) && r.StartOffset() == 20:
			outcomes["new"]++
		default:
			t.Fatalf("crash before operation %d: recovered a log of %d bytes, start %d, indexes [%d, %d]: neither old nor new",
				k, len(got), r.StartOffset(), r.FirstIndex(), r.LastIndex())
		}
		if n := stagedNames(t, Config{FS: crashed, Dir: cfg.Dir}); len(n) != 0 {
			t.Fatalf("crash before operation %d: staged files left after open: %v", k, n)
		}
		if k%3 == 0 { // a third of the crash points: all of them cost seconds under -race
			checkKeyIndexFiles(t, Config{FS: crashed, Dir: cfg.Dir})
			if err := verifyKeyReads(r, 4, false); err != nil {
				t.Fatalf("crash before operation %d: %v", k, err)
			}
		}
		r.Close()
	}
	if outcomes["old"] == 0 || outcomes["new"] == 0 {
		t.Fatalf("outcomes %v: both old and new should occur", outcomes)
	}
	t.Logf("outcomes: %v", outcomes)
}

// TestRetentionCandidatesMatchApplyRetention: deleting the candidates is
// what ApplyRetention deletes, by size and by age.
func TestRetentionCandidatesMatchApplyRetention(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bytes int64
		age   time.Duration
	}{{"size", 5000, 0}, {"age", 0, time.Second}, {"both", 9000, time.Second}} {
		t.Run(tc.name, func(t *testing.T) {
			now := int64(0)
			build := func(seed uint64) (*Store, Config) {
				e := memEnv(seed)
				cfg := smallConfig(t, e)
				cfg.Logger = nil
				cfg.RetentionBytes, cfg.RetentionAge = tc.bytes, tc.age
				cfg.Now = func() time.Time { return time.Unix(0, now) }
				s := mustOpen(t, cfg)
				raftLog(t, s, 1, 80, 1, int64(time.Second))
				raftLog(t, s, 81, 80, 1, int64(3*time.Second))
				return s, cfg
			}
			now = int64(2500 * time.Millisecond)
			for round := 0; round < 2; round++ {
				a, _ := build(1)
				b, _ := build(1)
				cands, err := a.RetentionCandidates()
				if err != nil {
					t.Fatal(err)
				}
				if len(cands) > 0 {
					last := cands[len(cands)-1]
					if err := a.DeletePrefix(last.NextOffset); err != nil {
						t.Fatal(err)
					}
					if f := a.FirstIndex(); f != 0 && f != last.LastIndex+1 {
						t.Fatalf("first index %d after deleting through %d", a.FirstIndex(), last.LastIndex)
					}
				}
				n, err := b.ApplyRetention()
				if err != nil {
					t.Fatal(err)
				}
				if n != len(cands) || a.StartOffset() != b.StartOffset() || a.Size() != b.Size() {
					t.Fatalf("round %d: %d candidates, retention deleted %d; start %d vs %d", round, len(cands), n, a.StartOffset(), b.StartOffset())
				}
				if tc.name != "size" && round == 1 && a.StartOffset() != a.NextOffset() {
					t.Fatalf("everything expired, yet the log starts at %d of %d", a.StartOffset(), a.NextOffset())
				}
				a.Close()
				b.Close()
				now = int64(10 * time.Second) // everything expires
			}
		})
	}
}

// FuzzManifest: any bytes decode to base offsets or an error, never a
// panic; decoded offsets re-encode to the same bytes.
func FuzzManifest(f *testing.F) {
	f.Add(encodeManifest([]uint64{0, 100, 250}))
	f.Add([]byte(manifestMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		bases, err := decodeManifest(b)
		if err != nil {
			return
		}
		if !bytes.Equal(encodeManifest(bases), b) {
			t.Fatal("round trip changed the bytes")
		}
	})
}
