package segment

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
)

// waitFor polls cond until it holds, for up to a minute: slack for a busy
// machine (it returns as soon as cond holds), not a bound being tested.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestGroupCommitSharesOneFsync(t *testing.T) { forEachFS(t, testGroupCommitSharesOneFsync) }

func testGroupCommitSharesOneFsync(t *testing.T, e env) {
	c := &syncCounter{}
	cfg := smallConfig(t, e)
	cfg.SegmentBytesMax = 1 << 20
	cfg.testHooks.fdatasync = c.fdatasync
	s := mustOpen(t, cfg)
	defer s.Close()
	hold := make(chan struct{})
	c.mu.Lock()
	c.calls, c.hold = 0, hold // forget recovery's fdatasync
	c.mu.Unlock()

	// A leader starts a round for batch 0 and is held in fdatasync.
	if err := s.Append(makeFrame(0, 1, 0)); err != nil {
		t.Fatal(err)
	}
	leader := make(chan error, 1)
	go func() { leader <- s.Sync() }()
	waitFor(t, "the leader's fdatasync", func() bool { return c.count() == 1 })

	// Batch 1 misses that round. Eight callers wait for the next one.
	if err := s.Append(makeFrame(1, 1, 0)); err != nil {
		t.Fatal(err)
	}
	const followers = 8
	errs := make(chan error, followers)
	for range followers {
		go func() { errs <- s.Sync() }()
	}
	waitFor(t, "followers to wait", func() bool {
		s.syncMu.Lock()
		defer s.syncMu.Unlock()
		return s.syncWaiters == followers
	})
	c.mu.Lock()
	c.hold = nil
	c.mu.Unlock()
	close(hold)

	if err := <-leader; err != nil {
		t.Fatal(err)
	}
	for range followers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := c.count(); got != 2 {
		t.Fatalf("%d fdatasyncs for %d Sync calls, want 2", got, followers+1)
	}
	if s.DurableOffset() != 2 {
		t.Fatalf("DurableOffset %d, want 2", s.DurableOffset())
	}
	// Nothing new: Sync returns without an fdatasync.
	if err := s.Sync(); err != nil || c.count() != 2 {
		t.Fatalf("idle Sync: %v, %d fdatasyncs", err, c.count())
	}
}

func TestGroupCommitConcurrent(t *testing.T) { forEachFS(t, testGroupCommitConcurrent) }

func testGroupCommitConcurrent(t *testing.T, e env) {
	c := &syncCounter{}
	cfg := smallConfig(t, e)
	cfg.SegmentBytesMax = 1 << 30 // no rolls: every fdatasync is a Sync's
	cfg.testHooks.fdatasync = func(f vfs.File) error {
		time.Sleep(200 * time.Microsecond) // a disk no faster than the target's
		return c.fdatasync(f)
	}
	s := mustOpen(t, cfg)
	const goroutines, perGoroutine = 8, 100
	var appendMu sync.Mutex // the range driver serialises appends
	var syncs atomic.Int64
	var wg sync.WaitGroup
	var m model
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perGoroutine {
				appendMu.Lock()
				frame := makeFrame(s.NextOffset(), 1, 0)
				err := s.Append(frame)
				if err == nil {
					m.add(t, frame)
				}
				mine := s.NextOffset()
				appendMu.Unlock()
				if err != nil {
					t.Error(err)
					return
				}
				syncs.Add(1)
				if err := s.Sync(); err != nil {
					t.Error(err)
					return
				}
				if d := s.DurableOffset(); d < mine {
					t.Errorf("Sync returned with DurableOffset %d below %d", d, mine)
					return
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d Sync calls, %d fdatasyncs", syncs.Load(), c.count())
	if int64(c.count()) >= syncs.Load() {
		t.Fatalf("%d fdatasyncs for %d Sync calls: no group commit", c.count(), syncs.Load())
	}
	if s.DurableOffset() != goroutines*perGoroutine {
		t.Fatalf("DurableOffset %d", s.DurableOffset())
	}
	img := dirImage(t, cfg) // what a crash right now would leave
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	writeDirImage(t, cfg, img)
	cfg.testHooks = testHooks{}
	s = mustOpen(t, cfg)
	defer s.Close()
	checkLog(t, s, &m)
}

func TestFsyncFailureIsSticky(t *testing.T) { forEachFS(t, testFsyncFailureIsSticky) }

func testFsyncFailureIsSticky(t *testing.T, e env) {
	c := &syncCounter{failN: 2, err: syscall.EIO}
	cfg := smallConfig(t, e)
	cfg.testHooks.fdatasync = c.fdatasync
	s := mustOpen(t, cfg) // fdatasync 1: recovery
	if err := s.Append(makeFrame(0, 1, 0)); err != nil {
		t.Fatal(err)
	}
	err := s.Sync() // fdatasync 2 fails
	if !errors.Is(err, ErrFailed) || !errors.Is(err, syscall.EIO) {
		t.Fatalf("Sync err = %v, want ErrFailed wrapping EIO", err)
	}
	if s.DurableOffset() != 0 {
		t.Fatalf("DurableOffset %d after a failed Sync", s.DurableOffset())
	}
	calls := c.count()
	for name, err := range map[string]error{
		"Sync":           s.Sync(),
		"Append":         s.Append(makeFrame(1, 1, 0)),
		"TruncateSuffix": s.TruncateSuffix(0),
		"DeletePrefix":   s.DeletePrefix(0),
	} {
		if !errors.Is(err, ErrFailed) {
			t.Errorf("%s after a failed fsync: %v", name, err)
		}
	}
	if c.count() != calls {
		t.Fatalf("the store retried fdatasync: %d calls, then %d", calls, c.count())
	}
	// Reads still work: the bytes are there, only their durability is unknown.
	if got, err := s.ReadFrames(0, 100, math.MaxUint64); err != nil || len(got) == 0 {
		t.Fatalf("ReadFrames on a failed store: %v", err)
	}
	if err := s.Close(); !errors.Is(err, ErrFailed) {
		t.Fatalf("Close of a failed store: %v", err)
	}
	if c.count() != calls {
		t.Fatal("Close retried fdatasync")
	}
	cfg.testHooks = testHooks{}
	s = mustOpen(t, cfg)
	defer s.Close()
	if s.NextOffset() != 1 {
		t.Fatalf("reopened at %d", s.NextOffset())
	}
}

func TestRollFsyncFailure(t *testing.T) { forEachFS(t, testRollFsyncFailure) }

func testRollFsyncFailure(t *testing.T, e env) {
	c := &syncCounter{failN: 2, err: syscall.EIO} // 1 is recovery, 2 the first roll
	cfg := smallConfig(t, e)
	cfg.testHooks.fdatasync = c.fdatasync
	s := mustOpen(t, cfg)
	defer s.Close()
	var err error
	for i := 0; err == nil && i < 1000; i++ {
		err = s.Append(makeFrame(s.NextOffset(), 2, 0))
	}
	if !errors.Is(err, ErrFailed) || !errors.Is(err, syscall.EIO) {
		t.Fatalf("Append across a failing roll: %v", err)
	}
	if err := s.Sync(); !errors.Is(err, ErrFailed) {
		t.Fatalf("Sync after a failed roll: %v", err)
	}
}

func TestReaderOfDeletedSegment(t *testing.T) { forEachFS(t, testReaderOfDeletedSegment) }

func testReaderOfDeletedSegment(t *testing.T, e env) {
	s := mustOpen(t, smallConfig(t, e))
	defer s.Close()
	var m model
	appendBatches(t, s, &m, 100, 0)
	v, err := s.viewContaining(0) // a reader in the middle of a read
	if err != nil || v.seg == nil {
		t.Fatal(err)
	}
	if err := s.DeletePrefix(s.NextOffset()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReadFrames(0, 100, math.MaxUint64); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("new read of a deleted offset: %v", err)
	}
	// The reader holding the segment still reads its frames, intact.
	out, _, _, _, err := s.collect(nil, v, 0, seq{}, readSpec{end: math.MaxUint64}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	hs := checkFrames(t, out)
	if len(hs) == 0 || hs[0].BaseOffset != 0 || hs[len(hs)-1].NextOffset() != v.nextOffset {
		t.Fatalf("read %d frames of the deleted segment", len(hs))
	}
	s.releaseView(v)
	if err := v.seg.f.Close(); err == nil {
		t.Fatal("the last release did not close the file")
	}
}

// checkRead verifies a concurrent ReadFrames result without t.Fatal.
func checkRead(from uint64, got []byte) error {
	expect := uint64(0)
	for i := 0; len(got) > 0; i++ {
		h, recs, err := batch.Decode(got)
		if err != nil {
			return fmt.Errorf("read from %d: frame %d: %w", from, i, err)
		}
		if i == 0 && (h.BaseOffset > from || h.NextOffset() <= from) {
			return fmt.Errorf("read from %d began with batch [%d, %d)", from, h.BaseOffset, h.NextOffset())
		}
		if i > 0 && h.BaseOffset != expect {
			return fmt.Errorf("read from %d: frame %d at %d, want %d", from, i, h.BaseOffset, expect)
		}
		for j, r := range recs {
			off := h.BaseOffset + uint64(j)
			if string(r.Key) != fmt.Sprintf("k%d", off) || string(r.Value) != string(recordValue(off, 8+int(off%37))) {
				return fmt.Errorf("read from %d: wrong record at %d", from, off)
			}
		}
		expect = h.NextOffset()
		size, _ := batch.FrameSize(got)
		got = got[size:]
	}
	return nil
}

func TestConcurrentReadersDuringAppendRetentionTruncate(t *testing.T) {
	forEachFS(t, testConcurrentReadersDuringAppendRetentionTruncate)
}

func testConcurrentReadersDuringAppendRetentionTruncate(t *testing.T, e env) {
	cfg := smallConfig(t, e)
	cfg.Logger = nil
	cfg.RetentionBytes = 16 << 10
	s := mustOpen(t, cfg)
	const appends = 1500
	var done atomic.Bool
	var wg sync.WaitGroup
	var reads, outOfRange atomic.Int64

	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 1))
			for !done.Load() {
				start, next := s.StartOffset(), s.NextOffset()
				from := start + rng.Uint64N(next-start+1)
				got, err := s.ReadFrames(from, rng.IntN(4000), math.MaxUint64)
				switch {
				case errors.Is(err, ErrOutOfRange):
					outOfRange.Add(1)
				case err != nil:
					t.Errorf("ReadFrames(%d): %v", from, err)
					return
				default:
					if err := checkRead(from, got); err != nil {
						t.Error(err)
						return
					}
					reads.Add(1)
				}
				if err := checkKeyRead(s, rng); err != nil {
					t.Error(err)
					return
				}
				if _, err := s.OffsetForTime(rng.Int64N(appends)); err != nil {
					t.Errorf("OffsetForTime: %v", err)
					return
				}
				_, _ = s.Size(), s.DurableOffset()
			}
		}()
	}
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done.Load() {
				if err := s.Sync(); err != nil {
					t.Errorf("Sync: %v", err)
					return
				}
			}
		}()
	}

	var bases []uint64
	for i := range appends {
		base := s.NextOffset()
		if err := s.Append(makeFrame(base, 1+i%4, int64(i))); err != nil {
			t.Fatal(err)
		}
		bases = append(bases, base)
		if i%10 == 9 {
			if _, err := s.ApplyRetention(); err != nil {
				t.Fatal(err)
			}
		}
		if i == 149 {
			// On one core an in-memory store's appends never block: let
			// the readers in before the log is cut, so that they read
			// while it changes (GOMAXPROCS=1 ran every append first).
			waitFor(t, "a reader to complete a read", func() bool { return reads.Load() > 0 || t.Failed() })
		}
		if i%150 == 149 {
			cut := bases[len(bases)-5]
			if err := s.TruncateSuffix(cut); err != nil {
				t.Fatal(err)
			}
			bases = bases[:len(bases)-5]
		}
	}
	done.Store(true)
	wg.Wait()
	t.Logf("%d reads checked, %d out of range", reads.Load(), outOfRange.Load())
	if reads.Load() == 0 {
		t.Fatal("no read completed")
	}
	start, next := s.StartOffset(), s.NextOffset()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, cfg)
	defer s.Close()
	if s.StartOffset() != start || s.NextOffset() != next {
		t.Fatalf("reopened as [%d, %d), was [%d, %d)", s.StartOffset(), s.NextOffset(), start, next)
	}
	got, err := s.ReadFrames(start, math.MaxInt, math.MaxUint64)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkRead(start, got); err != nil {
		t.Fatal(err)
	}
}

// checkKeyRead reads the key of a random offset of s (makeFrame gives the
// record at offset o the key "k<o>", before and after truncations) from
// the start and checks the answer: that record alone, or nothing if it is
// gone meanwhile (truncated, not yet appended again), or ErrOutOfRange if
// retention passed the start.
func checkKeyRead(s *Store, rng *rand.Rand) error {
	start, next := s.StartOffset(), s.NextOffset()
	if next == start {
		return nil
	}
	off := start + rng.Uint64N(next-start)
	key := fmt.Appendf(nil, "k%d", off)
	recs, n, err := s.ReadKey(key, start, math.MaxUint64, 10, math.MaxInt)
	switch {
	case errors.Is(err, ErrOutOfRange):
		return nil
	case err != nil:
		return fmt.Errorf("ReadKey(%s): %w", key, err)
	case len(recs) > 1:
		return fmt.Errorf("ReadKey(%s) returned %d records", key, len(recs))
	case len(recs) == 0 && n > off:
		return fmt.Errorf("ReadKey(%s) found nothing up to %d", key, n)
	case len(recs) == 1 && (recs[0].Offset != off || !bytes.Equal(recs[0].Record.Value, recordValue(off, 8+int(off%37)))):
		return fmt.Errorf("ReadKey(%s) returned offset %d with the wrong value", key, recs[0].Offset)
	}
	return nil
}
