package segment

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
)

// crashGen makes the frames of a Raft log: data frames of up to a few KiB
// (so that they cross pages) and control frames, every one with the next
// index.
type crashGen struct {
	rng  *rand.Rand
	tm   int64
	term uint64
}

func (g *crashGen) frame(next, index uint64) []byte {
	g.tm += g.rng.Int64N(5)
	if g.rng.IntN(10) == 0 {
		g.term++
	}
	if g.rng.IntN(5) == 0 {
		payload := make([]byte, g.rng.IntN(300))
		for i := range payload {
			payload[i] = byte(g.rng.Uint32())
		}
		return controlFrame(batch.TypeNoop+batch.Type(g.rng.IntN(2)), next, g.tm, g.term, index, payload)
	}
	recs := make([]batch.Record, 1+g.rng.IntN(4))
	for i := range recs {
		v := make([]byte, g.rng.IntN(1500))
		for j := range v {
			v[j] = byte(g.rng.Uint32() | 1) // no zero runs: holes are the crash's
		}
		recs[i] = batch.Record{Key: fmt.Appendf(nil, "k%d", (next+uint64(i))%5), Value: v}
	}
	return batch.Encode(nil, batch.Header{BaseOffset: next, Epoch: 1, AppendTimeUnixNanos: g.tm, Term: g.term, Index: index}, recs)
}

// countingWriter counts log lines holding a phrase.
type countingWriter struct {
	phrase string
	n      *atomic.Int64
}

func (w countingWriter) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(w.phrase)) {
		w.n.Add(1)
	}
	return len(p), nil
}

// TestCrashRecovery appends and syncs frames on vfs.Mem, truncates and
// deletes some, appends more without syncing (sometimes failing a write or
// an fdatasync), crashes the file system and reopens. Open must succeed (a
// crash leaves torn tails, never corruption), keep every synced frame, and
// hold a prefix of what was appended, with every sealed segment's key
// index file matching its log and key reads agreeing with it. Then it
// appends and syncs more,
// crashes again and checks that those survive too. A failure names its
// seed.
func TestCrashRecovery(t *testing.T) {
	seeds := 200
	if testing.Short() || raceEnabled {
		seeds = 60
	}
	st := map[string]int{}
	var outOfOrder, keyRebuilds atomic.Int64
	logger := hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: io.MultiWriter(
		countingWriter{phrase: "torn tail written out of order", n: &outOfOrder},
		countingWriter{phrase: "rebuilt key index", n: &keyRebuilds})})
	for seed := range uint64(seeds) {
		if err := runCrash(seed, logger, st); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
	st["torn tails written out of order"] = int(outOfOrder.Load())
	st["key indexes rebuilt"] = int(keyRebuilds.Load())
	t.Logf("%d seeds: %v", seeds, st)
	for _, k := range []string{"lost unsynced frames", "kept unsynced frames", "torn tails written out of order", "failed fdatasync", "failed write",
		"key indexes rebuilt"} {
		if st[k] == 0 {
			t.Errorf("no crash had %q", k)
		}
	}
}

func runCrash(seed uint64, logger hclog.Logger, st map[string]int) error {
	rng := rand.New(rand.NewPCG(seed, 0xc4a5))
	e := memEnv(seed)
	cfg := Config{Dir: e.dir, FS: e.fs, Logger: logger,
		SegmentBytesMax:    []int64{SegmentBytesMaxMin, 8 << 10, 64 << 10}[rng.IntN(3)],
		IndexIntervalBytes: []int{1, 500, 4096}[rng.IntN(3)]}
	if sealAll || seed%2 == 1 {
		// Half the seeds run with encryption at rest on.
		cfg.Keyring = testKeyring()
	}
	if seed%4 >= 2 {
		// Half of each half with zero-ahead (zeroahead.go): crashes leave
		// zeros past the last frame, synced or not, under a torn frame or
		// a lost one. No draw from rng: the other seeds run as before.
		cfg.ZeroAheadBytes = zeroAheadMinBytes
	}
	s, err := Open(cfg)
	if err != nil {
		return err
	}
	g := &crashGen{rng: rng, term: 1}
	var frames [][]byte // the log as appended, truncations applied
	start, synced := 0, 0
	firstIndex := 1 + rng.Uint64N(1000)
	appendOne := func() error {
		index := firstIndex
		if last := s.LastIndex(); last != 0 {
			index = last + 1
		}
		f := g.frame(s.NextOffset(), index)
		if err := s.Append(f); err != nil {
			return err
		}
		frames = append(frames, f)
		return nil
	}

	// Phase 1: appends, syncs, truncations and deletions, all durable
	// at the last Sync.
	for range 20 + rng.IntN(60) {
		switch r := rng.IntN(20); {
		case r < 16:
			if err := appendOne(); err != nil {
				return err
			}
		case r < 18:
			if err := s.Sync(); err != nil {
				return err
			}
			synced = len(frames)
		case r < 19:
			if first, last := s.FirstIndex(), s.LastIndex(); last != 0 {
				index := first + rng.Uint64N(last-first+1)
				if err := s.TruncateSuffixAtIndex(index); err != nil {
					return err
				}
				frames = frames[:start+int(index-first)]
				synced = len(frames) // a truncation syncs what remains
			}
		default:
			if err := s.DeletePrefix(s.StartOffset() + rng.Uint64N(s.NextOffset()-s.StartOffset()+1)); err != nil {
				return err
			}
			if first := s.FirstIndex(); first != 0 {
				// Indexes restart after a truncation drops them all, so
				// look among the retained frames only.
				start += indexOf(frames[start:], first)
			} else {
				start = len(frames)
			}
			synced = max(synced, start)
		}
	}
	if err := s.Sync(); err != nil {
		return err
	}
	synced = len(frames)

	// Phase 2: appends without Sync (rolls still fsync sealed segments),
	// and sometimes a failure.
	for range rng.IntN(30) {
		if err := appendOne(); err != nil {
			return err
		}
	}
	switch rng.IntN(6) {
	case 0:
		if err := appendOne(); err != nil { // something for the fdatasync to cover
			return err
		}
		e.mem.FailDatasyncs(1)
		if err := s.Sync(); !errors.Is(err, ErrFailed) || !errors.Is(err, syscall.EIO) {
			return fmt.Errorf("Sync with a failing fdatasync: %v", err)
		}
		if err := appendOne(); !errors.Is(err, ErrFailed) {
			return fmt.Errorf("Append after a failed Sync: %v", err)
		}
		st["failed fdatasync"]++
	case 1:
		// The failure may hit an index file written by a roll, which the
		// store shrugs off; fail writes until one hits the log.
		for {
			e.mem.FailWrites(1)
			err := appendOne()
			if errors.Is(err, ErrFailed) {
				break
			}
			if err != nil {
				return fmt.Errorf("Append with a failing write: %v", err)
			}
		}
		st["failed write"]++
	}

	for round := range 4 {
		crashed := e.mem.Crash()
		_ = s.Close() // the old store writes only to the old file system now
		e = env{fs: crashed, dir: e.dir, mem: crashed}
		cfg.FS = crashed
		if s, err = Open(cfg); err != nil {
			return fmt.Errorf("round %d: Open after a crash: %w", round, err)
		}
		var got []byte
		if s.LastIndex() != 0 {
			if got, err = s.ReadFramesByIndex(s.FirstIndex(), s.LastIndex()+1, math.MaxInt); err != nil {
				return fmt.Errorf("round %d: read back: %w", round, err)
			}
		}
		n := 0
		for len(got) > 0 {
			size, _ := batch.FrameSize(got)
			if start+n >= len(frames) || !bytes.Equal(got[:size], frames[start+n]) {
				return fmt.Errorf("round %d: recovered frame %d is not the one appended", round, n)
			}
			got, n = got[size:], n+1
		}
		if start+n < synced {
			return fmt.Errorf("round %d: recovered %d frames, %d were synced", round, n, synced-start)
		}
		wantNext := uint64(0)
		if start+n > 0 {
			h, _ := batch.DecodeHeader(frames[start+n-1])
			wantNext = h.NextOffset()
		}
		if start+n > 0 && s.NextOffset() != wantNext {
			return fmt.Errorf("round %d: NextOffset %d, want %d", round, s.NextOffset(), wantNext)
		}
		// Key indexes, after one of the seed's crashes (all four cost
		// minutes under -race): every sealed segment's file matches its
		// log, and key reads agree with the log.
		if round == int(seed%4) {
			if err := verifyKeyIndexFiles(cfg); err != nil {
				return fmt.Errorf("round %d: %w", round, err)
			}
			if err := verifyKeyReads(s, 6, false); err != nil {
				return fmt.Errorf("round %d: %w", round, err)
			}
		}
		st["crashes"]++
		if start+n < len(frames) {
			st["lost unsynced frames"]++
		} else if len(frames) > synced {
			st["kept unsynced frames"]++
		}
		frames = frames[:start+n]

		// The recovered log takes appends where it ends, and what is synced
		// survives the next crash; what is not may or may not.
		for range 1 + rng.IntN(10) {
			if err := appendOne(); err != nil {
				return fmt.Errorf("round %d: append after recovery: %w", round, err)
			}
		}
		if err := s.Sync(); err != nil {
			return err
		}
		synced = len(frames)
		for range rng.IntN(30) {
			if err := appendOne(); err != nil {
				return fmt.Errorf("round %d: append after recovery: %w", round, err)
			}
		}
	}
	return s.Close()
}

// indexOf returns the position in frames of the frame with Raft index
// index.
func indexOf(frames [][]byte, index uint64) int {
	for i, f := range frames {
		if h, _ := batch.DecodeHeader(f); h.Index == index {
			return i
		}
	}
	panic(fmt.Sprintf("index %d not among the frames", index))
}

// TestHoleRule builds a last segment with a zeroed page followed by valid
// frames, as a crash that wrote pages out of order leaves it: Open
// truncates at the first bad frame. The same zeroes inside one frame,
// without a whole zero page, remain corruption.
func TestHoleRule(t *testing.T) { forEachFS(t, testHoleRule) }

func testHoleRule(t *testing.T, e env) {
	cfg := smallConfig(t, e)
	cfg.SegmentBytesMax = 64 << 10
	s := mustOpen(t, cfg)
	g := &crashGen{rng: rand.New(rand.NewPCG(1, 1)), term: 1}
	var frames [][]byte
	var ends []int64
	var size int64
	for size < 5*holeBytes {
		f := g.frame(s.NextOffset(), uint64(len(frames)+1))
		if err := s.Append(f); err != nil {
			t.Fatal(err)
		}
		frames = append(frames, f)
		size += int64(unitBytes(cfg.Keyring, len(f)))
		ends = append(ends, size)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	img := dirImage(t, cfg)
	name := segmentName(0, logSuffix)

	// Zero the third page: the frame holding its start is torn, and the
	// frames after the page are valid.
	page := int64(2 * holeBytes)
	bad := 0
	for ends[bad] <= page {
		bad++
	}
	holed := cloneImage(img)
	clear(holed[name][page : page+holeBytes])
	writeDirImage(t, cfg, holed)
	s = mustOpen(t, cfg)
	if s.LastIndex() != uint64(bad) {
		t.Fatalf("LastIndex %d after a hole in frame %d", s.LastIndex(), bad+1)
	}
	got, err := s.ReadFramesByIndex(1, s.LastIndex()+1, math.MaxInt)
	if err != nil || !bytes.Equal(got, bytes.Join(frames[:bad], nil)) {
		t.Fatalf("read back %d bytes, %v", len(got), err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// A zeroed run that leaves a byte of the page written is no hole.
	partial := cloneImage(img)
	keep := page + holeBytes - 1
	for partial[name][keep] == 0 {
		keep--
	}
	clear(partial[name][page:keep])
	clear(partial[name][keep+1 : page+holeBytes])
	writeDirImage(t, cfg, partial)
	if _, err := Open(cfg); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open of a partly zeroed page: %v", err)
	}
}

// TestSecondOpenIsLocked checks that a directory takes one store at a time.
func TestSecondOpenIsLocked(t *testing.T) { forEachFS(t, testSecondOpenIsLocked) }

func testSecondOpenIsLocked(t *testing.T, e env) {
	cfg := smallConfig(t, e)
	s := mustOpen(t, cfg)
	_, err := Open(cfg)
	if !errors.Is(err, ErrLocked) || !errors.Is(err, vfs.ErrLocked) {
		t.Fatalf("second Open: %v", err)
	}
	t.Logf("second Open: %v", err)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, cfg)
	// A failed Open releases the lock.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	stray := filepath.Join(cfg.Dir, segmentName(7, logSuffix)) // does not join segment 0
	writeTestFile(t, cfg.FS, stray, nil)
	if _, err := Open(cfg); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open of a corrupt log: %v", err)
	}
	if err := cfg.FS.Remove(stray); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, cfg)
	s.Close()
}
