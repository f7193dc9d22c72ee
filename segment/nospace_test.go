package segment

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
)

// readAll reads the whole log from StartOffset to end and returns the
// headers of its frames, checking every record.
func readAll(t *testing.T, s *Store, end uint64) []batch.Header {
	t.Helper()
	var hs []batch.Header
	for off := s.StartOffset(); off < end; {
		frames, err := s.ReadFrames(off, ReadBytesMax, end)
		if err != nil {
			t.Fatalf("ReadFrames(%d): %v", off, err)
		}
		got := checkFrames(t, frames)
		if len(got) == 0 {
			t.Fatalf("ReadFrames(%d) returned nothing below %d", off, end)
		}
		hs = append(hs, got...)
		off = got[len(got)-1].NextOffset()
	}
	return hs
}

// TestAppendNoSpace fills the device mid-append (a frame lands in part,
// and later a roll cannot create the next segment): the appends are
// refused with ErrNoSpace, the store does not fail, what was written
// before stays readable and Sync makes it durable; once space is freed the
// next append succeeds, and after a crash the log is exactly the frames
// that were accepted, with no torn frame anywhere.
func TestAppendNoSpace(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		e := memEnv(seed)
		s := mustOpen(t, smallConfig(t, e))
		var m model
		appendBatches(t, s, &m, 30, 100)
		used := e.mem.UsedBytes()
		// Leave room for part of the next frame only, or (every other
		// seed) for a whole segment's worth less a few bytes, so that the
		// refusals come from a partial write and from a roll.
		room := int64(seed * 7)
		if seed%2 == 0 {
			room = 2048 - int64(seed)
		}
		e.mem.SetSpaceBytes(used + room)
		refused := 0
		for i := 0; i < 200 && refused < 3; i++ {
			frame := makeFrame(s.NextOffset(), 1+int(s.NextOffset()%4), 1000)
			err := s.Append(frame)
			switch {
			case err == nil:
				m.add(t, frame)
			case errors.Is(err, ErrNoSpace):
				refused++
				if !errors.Is(s.NoSpace(), ErrNoSpace) {
					t.Fatalf("seed %d: NoSpace() = %v after a refusal", seed, s.NoSpace())
				}
			default:
				t.Fatalf("seed %d: Append: %v, want ErrNoSpace", seed, err)
			}
		}
		if refused == 0 {
			t.Fatalf("seed %d: the full device refused no append", seed)
		}
		if s.NextOffset() != m.next() {
			t.Fatalf("seed %d: NextOffset %d after refusals, model %d", seed, s.NextOffset(), m.next())
		}
		// Reads go on, and Sync makes everything accepted durable.
		if err := s.Sync(); err != nil {
			t.Fatalf("seed %d: Sync on a full device: %v", seed, err)
		}
		if got := readAll(t, s, s.DurableOffset()); len(got) != len(m.heads) {
			t.Fatalf("seed %d: read %d frames, model has %d", seed, len(got), len(m.heads))
		}

		// Space returns: appends resume without a reopen.
		e.mem.SetSpaceBytes(0)
		appendBatches(t, s, &m, 10, 2000)
		if s.NoSpace() != nil {
			t.Fatalf("seed %d: NoSpace() = %v after an append succeeded", seed, s.NoSpace())
		}

		// A crash keeps exactly the synced log, which verifies end to end.
		crashed := e.mem.Crash()
		e.fs = crashed
		s2 := mustOpen(t, smallConfig(t, env{fs: crashed, dir: e.dir}))
		got := readAll(t, s2, s2.NextOffset())
		if len(got) != len(m.heads) {
			t.Fatalf("seed %d: after a crash the log has %d frames, model %d", seed, len(got), len(m.heads))
		}
		for i, h := range got {
			if h.BaseOffset != m.heads[i].BaseOffset || h.NextOffset() != m.heads[i].NextOffset() {
				t.Fatalf("seed %d: frame %d is [%d, %d), model [%d, %d)", seed, i, h.BaseOffset, h.NextOffset(),
					m.heads[i].BaseOffset, m.heads[i].NextOffset())
			}
		}
		s2.Close()
	}
}

// TestNoSpaceStaysOutOfFailure checks that a full device is not a failed
// store: Sync and reads work while appends are refused, and an I/O error
// (EIO) still fails the store for good.
func TestNoSpaceStaysOutOfFailure(t *testing.T) {
	e := memEnv(3)
	s := mustOpen(t, smallConfig(t, e))
	defer s.Close()
	var m model
	appendBatches(t, s, &m, 5, 100)
	e.mem.SetSpaceBytes(e.mem.UsedBytes())
	if err := s.Append(makeFrame(s.NextOffset(), 2, 1000)); !errors.Is(err, ErrNoSpace) || errors.Is(err, ErrFailed) {
		t.Fatalf("Append on a full device: %v, want ErrNoSpace alone", err)
	}
	if err := s.Sync(); err != nil {
		t.Fatalf("Sync after a refusal: %v", err)
	}
	e.mem.SetSpaceBytes(0)
	e.mem.FailWrites(1)
	if err := s.Append(makeFrame(s.NextOffset(), 2, 1000)); !errors.Is(err, ErrFailed) {
		t.Fatalf("Append after EIO: %v, want ErrFailed", err)
	}
	if err := s.Append(makeFrame(s.NextOffset(), 2, 1000)); !errors.Is(err, ErrFailed) {
		t.Fatalf("second Append after EIO: %v, want ErrFailed", err)
	}
	if got := readAll(t, s, s.DurableOffset()); len(got) != len(m.heads) {
		t.Fatalf("reads after EIO: %d frames, want %d", len(got), len(m.heads))
	}
}

// TestMissingSegmentIsDataLoss: after retention deleted the oldest
// segments, the log reopens at its new start; a segment file removed
// behind the store's back (the oldest one, or one in the middle) makes
// Open refuse the log with a MissingError naming the lost offsets.
func TestMissingSegmentIsDataLoss(t *testing.T) {
	for _, victim := range []string{"oldest", "middle"} {
		t.Run(victim, func(t *testing.T) {
			e := memEnv(5)
			cfg := smallConfig(t, e)
			cfg.RetentionBytes = 10000
			s := mustOpen(t, cfg)
			var m model
			appendBatches(t, s, &m, 200, 100)
			if n, err := s.ApplyRetention(); err != nil || n == 0 {
				t.Fatalf("ApplyRetention = %d, %v; want deletions", n, err)
			}
			start := s.StartOffset()
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = mustOpen(t, cfg)
			if s.StartOffset() != start {
				t.Fatalf("reopened at start %d, retention left %d", s.StartOffset(), start)
			}
			segs := s.Sealed()
			s.Close()
			if len(segs) < 3 {
				t.Fatalf("%d segments, want 3 or more", len(segs))
			}
			i := 0
			if victim == "middle" {
				i = 1
			}
			lost := segs[i]
			if err := e.fs.Remove(e.dir + "/" + segmentName(lost.BaseOffset, logSuffix)); err != nil {
				t.Fatal(err)
			}
			_, err := Open(cfg)
			var me *MissingError
			if !errors.Is(err, ErrDataLoss) || !errors.Is(err, ErrCorrupt) || !errors.As(err, &me) {
				t.Fatalf("Open after losing the %s segment: %v, want a MissingError", victim, err)
			}
			if me.FromOffset != lost.BaseOffset || me.ToOffset != lost.NextOffset {
				t.Fatalf("MissingError names [%d, %d), lost [%d, %d)", me.FromOffset, me.ToOffset, lost.BaseOffset, lost.NextOffset)
			}
		})
	}
}

// TestRetentionInterruptedAfterRecord: a crash after retention recorded
// the new start but before it unlinked the segment leaves a segment below
// the record, which is no loss: Open keeps it and lowers the record.
func TestRetentionInterruptedAfterRecord(t *testing.T) {
	e := memEnv(6)
	cfg := smallConfig(t, e)
	cfg.RetentionBytes = 6000
	s := mustOpen(t, cfg)
	var m model
	appendBatches(t, s, &m, 200, 100)
	e.mem.SetHook(func(op vfs.Op, name string) error {
		if op == vfs.OpRemove {
			return errors.New("injected: remove fails")
		}
		return nil
	})
	if _, err := s.ApplyRetention(); err == nil {
		t.Fatal("ApplyRetention succeeded with removes failing")
	}
	e.mem.SetHook(nil)
	s.Close()
	s = mustOpen(t, cfg)
	if s.StartOffset() != 0 {
		t.Fatalf("start %d, want 0 (nothing was unlinked)", s.StartOffset())
	}
	s.Close()
	// The record followed the log down: losing segment 0 now is told.
	if err := e.fs.Remove(e.dir + "/" + segmentName(0, logSuffix)); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(cfg); !errors.Is(err, ErrDataLoss) {
		t.Fatalf("Open without segment 0: %v, want ErrDataLoss", err)
	}
}

// TestRollNoSpace: a roll whose new segment cannot be created (the
// directory's device is full) leaves the segment active and its key index
// live: a smaller frame that still fits is appended to it and found by
// key, and the roll happens once space returns.
func TestRollNoSpace(t *testing.T) {
	e := memEnv(9)
	cfg := smallConfig(t, e)
	s := mustOpen(t, cfg)
	defer s.Close()
	var m model
	// Fill the active segment close to SegmentBytesMax (2048).
	for s.Size() < 1700 {
		appendBatches(t, s, &m, 1, 100)
	}
	segsBefore := len(s.Sealed())
	// The next segment's file cannot be created (its directory's blocks
	// are full; the index files beside it still fit).
	e.mem.SetHook(func(op vfs.Op, name string) error {
		if op == vfs.OpOpen && strings.HasSuffix(name, ".log") {
			return &fs.PathError{Op: "open", Path: name, Err: syscall.ENOSPC}
		}
		return nil
	})
	big := makeFrame(s.NextOffset(), 30, 200)
	if err := s.Append(big); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Append needing a roll on a full device: %v, want ErrNoSpace", err)
	}
	if len(s.Sealed()) != segsBefore {
		t.Fatalf("a roll that could not create its segment sealed one")
	}
	small := makeFrame(s.NextOffset(), 1, 200)
	if err := s.Append(small); err != nil {
		t.Fatalf("Append of a frame that fits: %v", err)
	}
	m.add(t, small)
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	key := fmt.Appendf(nil, "k%d", m.heads[len(m.heads)-1].BaseOffset)
	recs, _, err := s.ReadKey(key, 0, s.NextOffset(), 10, 1<<20)
	if err != nil || len(recs) != 1 {
		t.Fatalf("ReadKey(%s) after the refused roll: %d records, %v", key, len(recs), err)
	}
	e.mem.SetHook(nil)
	big = makeFrame(s.NextOffset(), 30, 300)
	if err := s.Append(big); err != nil {
		t.Fatalf("Append once space returned: %v", err)
	}
	if len(s.Sealed()) != segsBefore+1 {
		t.Fatalf("%d sealed segments after the roll, want %d", len(s.Sealed()), segsBefore+1)
	}
}

// snapshotDir returns every file of dir in fs with its content.
func snapshotDir(t *testing.T, e env) map[string]string {
	t.Helper()
	des, err := e.fs.ReadDir(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, de := range des {
		if de.IsDir() {
			continue
		}
		b, err := vfs.ReadFile(e.fs, e.dir+"/"+de.Name(), 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		out[de.Name()] = string(b)
	}
	return out
}

// TestVerify: Verify reports a sound log, a torn tail (a repair, not a
// problem), a damaged key index (a problem) and a lost segment (an error),
// and changes nothing on disk.
func TestVerify(t *testing.T) {
	e := memEnv(12)
	cfg := smallConfig(t, e)
	s := mustOpen(t, cfg)
	var m model
	appendBatches(t, s, &m, 120, 100)
	segs := s.Sealed()
	next := s.NextOffset()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(cfg)
	if err != nil || rep.Segments != len(segs)+1 || rep.NextOffset != next || !rep.RecordedStartOK || len(rep.Damaged) != 0 || rep.TornTailBytes != 0 {
		t.Fatalf("Verify of a sound log: %+v, %v", rep, err)
	}
	// A store holding the directory makes Verify refuse it.
	s = mustOpen(t, cfg)
	if _, err := Verify(cfg); !errors.Is(err, ErrLocked) {
		t.Fatalf("Verify of an open log: %v, want ErrLocked", err)
	}
	s.Close()

	// A torn tail: half a frame past the end of the active segment.
	last := e.dir + "/" + segmentName(segs[len(segs)-1].NextOffset, logSuffix)
	f, err := e.fs.OpenFile(last, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	size, _ := f.Size()
	frame := makeFrame(next, 3, 500)
	if _, err := f.WriteAt(frame[:len(frame)/2], size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// A damaged key index of a sealed segment.
	ki := e.dir + "/" + segmentName(segs[0].BaseOffset, keyIndexSuffix)
	b, err := vfs.ReadFile(e.fs, ki, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 0xff
	if err := vfs.WriteFileAtomic(e.fs, ki, b, 0o600); err != nil {
		t.Fatal(err)
	}
	before := snapshotDir(t, e)
	rep, err = Verify(cfg)
	if err != nil || rep.TornTailBytes != int64(len(frame)/2) || len(rep.Damaged) != 1 || !strings.Contains(rep.Damaged[0], "key index") {
		t.Fatalf("Verify of a torn tail and a damaged key index: %+v, %v", rep, err)
	}
	if after := snapshotDir(t, e); len(after) != len(before) {
		t.Fatalf("Verify changed the directory: %d files before, %d after", len(before), len(after))
	} else {
		for name, content := range before {
			if after[name] != content {
				t.Fatalf("Verify changed %s", name)
			}
		}
	}

	// A lost segment in the middle.
	if err := e.fs.Remove(e.dir + "/" + segmentName(segs[1].BaseOffset, logSuffix)); err != nil {
		t.Fatal(err)
	}
	var me *MissingError
	if _, err := Verify(cfg); !errors.As(err, &me) || me.FromOffset != segs[1].BaseOffset || me.ToOffset != segs[1].NextOffset {
		t.Fatalf("Verify after losing a segment: %v", err)
	}
}
