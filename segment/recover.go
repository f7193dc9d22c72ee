package segment

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/geolog/geolog/atrest"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
)

const (
	// scanStepBytes is how many candidate positions the torn-tail check
	// examines per pread.
	scanStepBytes = 1 << 20
	// holeBytes is the block of the hole rule (see the package
	// documentation): the page size in which the kernel writes file data
	// back, and in which vfs.Mem's crashes keep or lose it.
	holeBytes = 4096
)

// recoveryPlan collects what recovery will change on disk. Nothing is
// changed until every segment has been verified, so an Open that fails on
// corruption leaves the directory exactly as it found it.
type recoveryPlan struct {
	tornAt       int64 // position to truncate the last segment at, or -1
	tornBytes    int64 // bytes dropped with it
	padding      bool  // the bytes at tornAt are zero-ahead's zeros, not a torn frame
	indexRewrite map[*segment]string
	orphans      []string // index files without a log
	// keyRewrite holds the sealed segments whose key index file must be
	// rebuilt, and why; keyStale the active segment if a key index file
	// (stale: the active segment keeps its index in memory) lies beside it.
	keyRewrite map[*segment]string
	keyStale   []*segment
}

// recover completes an interrupted install (see Install), verifies the log
// in one pass over all segments in order, calls OnRecover for each retained
// batch, and then applies the plan: truncate a torn tail, rewrite index
// files that do not match the log, remove orphan index files. It leaves s
// with its segments open and its offsets set.
func (s *Store) recover() error {
	rec, err := s.loadStartRecord()
	if err != nil {
		return err
	}
	s.startRec = rec
	if err := s.finishInstall(); err != nil {
		return err
	}
	if err := s.removeCleanLeftovers(); err != nil {
		return err
	}
	segs, err := s.loadSegments(s.cfg.OnRecover)
	if err != nil {
		return err
	}
	s.segs = segs
	last := segs[len(segs)-1]
	s.nextOffset.Store(last.nextOffset)
	s.publishBoundsLocked()
	s.refreshLastTerm()
	size := s.refreshTotals(segs)
	// A crashed predecessor may have left written but unsynced data in the
	// page cache; sync it so that DurableOffset tells the truth.
	if s.cfg.Fsync == FsyncAlways {
		if err := s.fdatasync(last.f); err != nil {
			for _, g := range segs {
				g.f.Close()
			}
			return fmt.Errorf("segment: sync recovered log: %w", err)
		}
	}
	s.durable.Store(last.nextOffset)
	// Record where the log starts if no record says so yet (a new log, or
	// one older than the record), or lower it to the first segment (a
	// crash between a save and the deletion it announced).
	if first := segs[0].baseOffset; !s.startRec.ok || first < s.startRec.start {
		if err := s.saveStartRecord(first); err != nil {
			s.log.Warn("could not record the log's start; a lost first segment will not be told from retention until it is", "error", err)
		}
	}
	s.log.Info("opened log", "segments", len(segs), "start_offset", segs[0].baseOffset,
		"next_offset", last.nextOffset, "first_index", s.firstIndex.Load(), "last_index", s.lastIndex.Load(), "bytes", size)
	return nil
}

// refreshTotals sets the size and the newest append time from segs and
// returns the size. The caller is the appender (or Open), holding mu if
// readers may run.
func (s *Store) refreshTotals(segs []*segment) int64 {
	var size int64
	s.lastAppendTimeUnixNanos = math.MinInt64
	for _, g := range segs {
		size += g.size
		if g.size > 0 {
			s.lastAppendTimeUnixNanos = g.maxAppendTimeUnixNanos
		}
	}
	s.sizeBytes.Store(size)
	return size
}

// loadSegments verifies the segments in the directory (see recover), calls
// onRecover (if set) for every retained frame, applies the recovery plan
// and returns the segments, open, oldest first: an empty one at offset 0 if
// there were none. On error nothing is left open.
func (s *Store) loadSegments(onRecover func(batch.Header) error) (segs []*segment, err error) {
	segs, plan, err := s.scanSegments(onRecover)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			for _, g := range segs {
				g.f.Close()
			}
			segs = nil
		}
	}()
	if err := s.applyPlan(segs, plan); err != nil {
		return segs, err
	}
	if len(segs) == 0 {
		g, err := s.createSegment(0)
		if err != nil {
			return segs, err
		}
		segs = append(segs, g)
	}
	return segs, nil
}

// scanSegments is the verifying pass of loadSegments: it lists the
// directory, checks the segments against the start record and each other,
// verifies every segment (recoverSegment) and returns them, open, with
// the plan of what recovery would change, having changed nothing. On
// error nothing is left open. Verify runs it alone.
func (s *Store) scanSegments(onRecover func(batch.Header) error) (segs []*segment, plan *recoveryPlan, err error) {
	dirents, err := s.fs.ReadDir(s.cfg.Dir)
	if err != nil {
		return nil, nil, fmt.Errorf("segment: list %s: %w", s.cfg.Dir, err)
	}
	var bases []uint64
	indexes := map[uint64][]string{}
	for _, de := range dirents {
		base, suffix, ok := parseSegmentName(de.Name())
		switch {
		case de.Name() == vfs.LockFileName, strings.HasPrefix(de.Name(), "_"):
			// Names starting with "_" belong to the range's other
			// components (the Raft hard state) or are the store's own
			// (the start record, staging).
		case !ok || !de.Type().IsRegular():
			s.log.Warn("ignoring unexpected file", "name", de.Name())
		case suffix == logSuffix:
			bases = append(bases, base)
		default:
			indexes[base] = append(indexes[base], de.Name())
		}
	}
	slices.Sort(bases)
	if err := checkStart(s.startRec, bases); err != nil {
		s.log.Error("log lost records", "error", err)
		return nil, nil, err
	}

	plan = &recoveryPlan{tornAt: -1, indexRewrite: map[*segment]string{}, keyRewrite: map[*segment]string{}}
	defer func() {
		if err != nil {
			for _, g := range segs {
				g.f.Close()
			}
			segs = nil
		}
	}()
	var q seq // carried across segments: indexes continue from one to the next
	for i, base := range bases {
		delete(indexes, base)
		g, err := s.recoverSegment(base, i == len(bases)-1, segs, &q, plan, onRecover)
		if g != nil {
			segs = append(segs, g)
		}
		if err != nil {
			return segs, nil, err
		}
	}
	for _, names := range indexes {
		plan.orphans = append(plan.orphans, names...)
	}
	slices.Sort(plan.orphans)
	return segs, plan, nil
}

// recoverSegment verifies one segment file: every frame's CRC and that it
// continues q, the previous frame (across segments too): offsets dense,
// Raft indexes dense and terms non-decreasing once frames carry them. It
// computes the index entries and decides about a bad frame (see the
// package documentation). It returns the segment, open, even with an
// error, so the caller can close it.
func (s *Store) recoverSegment(base uint64, last bool, prev []*segment, q *seq, plan *recoveryPlan,
	onRecover func(batch.Header) error) (*segment, error) {
	f, err := s.fs.OpenFile(filepath.Join(s.cfg.Dir, segmentName(base, logSuffix)), os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("segment: open: %w", err)
	}
	g := newSegment(s.cfg.Dir, base, f)
	if len(prev) > 0 {
		if p := prev[len(prev)-1]; p.nextOffset < base {
			return g, s.corruption(g, 0, p.nextOffset, &MissingError{FromOffset: p.nextOffset, ToOffset: base,
				Where: fmt.Sprintf("between segments %s and %s", p.name(), g.name())})
		} else if p.nextOffset != base {
			return g, s.corruption(g, 0, p.nextOffset, fmt.Errorf(
				"segment base offset %d does not follow the previous segment, which ends at offset %d", base, p.nextOffset))
		}
	}
	q.offset = base
	fileSize, err := f.Size()
	if err != nil {
		return g, fmt.Errorf("segment: stat %s: %w", g.name(), err)
	}
	if fileSize > segmentFileBytesMax {
		return g, s.corruption(g, 0, base, fmt.Errorf("file of %d bytes exceeds %d", fileSize, int64(segmentFileBytesMax)))
	}

	w := frameWalker{f: f, keys: s.cfg.Keyring, end: fileSize, chunk: recoverChunkBytes}
	var keys keyPass
	if last {
		keys.active = newActiveKeys()
	}
	for {
		frame, h, err := w.next()
		framePos := w.at
		if err == io.EOF {
			break
		}
		if err == nil {
			if err = q.checkFrame(frame, h); err != nil {
				// A frame with a valid CRC is never torn: it is misplaced.
				return g, s.corruption(g, framePos, q.offset, err)
			}
		}
		if err != nil {
			if last {
				// Zeros to the end of the file are zero-ahead's padding
				// (zeroahead.go): cut off as a torn tail would be, but
				// not one. (Were they not, no valid frame would follow
				// them either: the torn-tail rule would cut them too.)
				pad, zerr := zeroTail(f, framePos, fileSize, zeroTailBytesMax)
				if zerr != nil {
					return g, fmt.Errorf("segment: read %s at position %d: %w", g.name(), framePos, zerr)
				}
				if pad {
					plan.tornAt, plan.tornBytes, plan.padding = framePos, fileSize-framePos, true
					break
				}
			}
			if isKeyError(err) {
				// Never a torn tail: the bytes may be fine, the key is not here.
				return g, fmt.Errorf("segment: open %s at position %d (offset %d): %w", g.name(), framePos, q.offset, err)
			}
			if !errors.Is(err, batch.ErrShort) && !errors.Is(err, batch.ErrCorrupt) {
				return g, fmt.Errorf("segment: read %s at position %d: %w", g.name(), framePos, err)
			}
			if !last {
				return g, s.corruption(g, framePos, q.offset, err)
			}
			if err := s.judgeBadTail(g, framePos, fileSize, q.offset, err, plan); err != nil {
				return g, err
			}
			break
		}
		if err := frameKeyEntries(frame, h, base, framePos, keys.add); err != nil {
			// A frame with a valid CRC whose records do not parse was
			// never written by Append: corruption, not a torn write.
			return g, s.corruption(g, framePos, q.offset, err)
		}
		if needsIndexEntry(g.entries, framePos, s.cfg.IndexIntervalBytes) {
			g.entries = append(g.entries, indexEntry{
				relOffset:           relOffset(g, h.BaseOffset),
				position:            uint32(framePos),
				appendTimeUnixNanos: max(h.AppendTimeUnixNanos, g.maxAppendTimeUnixNanos),
				index:               h.Index,
			})
		}
		g.maxAppendTimeUnixNanos = max(h.AppendTimeUnixNanos, g.maxAppendTimeUnixNanos)
		if h.Index != 0 {
			if g.firstIndex == 0 {
				g.firstIndex = h.Index
			}
			g.lastIndex, g.lastTerm = h.Index, h.Term
		}
		if onRecover != nil {
			if err := onRecover(h); err != nil {
				return g, fmt.Errorf("segment: OnRecover at offset %d: %w", h.BaseOffset, err)
			}
		}
		q.advance(h)
		g.nextOffset = q.offset
	}
	g.size, s.openMark = w.at, max(s.openMark, w.mark) // trailing marks (AppendMark) stay
	if reason, err := s.indexProblem(g); err != nil {
		return g, fmt.Errorf("segment: check index files of %s: %w", g.name(), err)
	} else if reason != "" {
		plan.indexRewrite[g] = reason
	}
	return g, s.finishKeys(g, last, &keys, plan)
}

// judgeBadTail decides about the bad frame at pos of the last segment g
// (bad: why it failed; expect: the offset it should start at): a torn tail,
// noted in plan, or mid-log corruption, returned. See the torn tail and
// hole rules in the package documentation.
func (s *Store) judgeBadTail(g *segment, pos, fileSize int64, expect uint64, bad error, plan *recoveryPlan) error {
	at, found, err := findValidFrameAfter(s.cfg.Keyring, g.f, pos, fileSize, expect)
	if err != nil {
		return fmt.Errorf("segment: scan %s after position %d: %w", g.name(), pos, err)
	}
	if found {
		hole, err := findHole(g.f, pos, at, fileSize)
		if err != nil {
			return fmt.Errorf("segment: scan %s after position %d: %w", g.name(), pos, err)
		}
		if hole < 0 {
			return s.corruption(g, pos, expect, fmt.Errorf("%w; a valid frame follows at position %d", bad, at))
		}
		// Writes after the last fdatasync reached the disk out of order:
		// nothing from the hole on was synced.
		s.log.Warn("found torn tail written out of order", "segment", g.name(), "position", pos,
			"hole_at", hole, "valid_frame_at", at)
	}
	plan.tornAt, plan.tornBytes = pos, fileSize-pos
	s.log.Warn("found torn tail", "segment", g.name(), "position", pos, "offset", expect,
		"bytes", fileSize-pos, "reason", bad)
	return nil
}

// findHole returns the position of a hole between the bad frame at bad and
// the valid frame at end: a holeBytes-aligned block starting before end
// whose bytes from max(bad, block start) to the block's end (or the
// file's) are all zero. It returns -1 if there is none.
func findHole(f vfs.File, bad, end, fileSize int64) (int64, error) {
	buf := make([]byte, holeBytes)
	for blk := bad &^ (holeBytes - 1); blk < end; blk += holeBytes {
		lo, hi := max(bad, blk), min(blk+holeBytes, fileSize)
		b := buf[:hi-lo]
		if err := readFull(f, b, lo); err != nil {
			return 0, err
		}
		if !slices.ContainsFunc(b, func(c byte) bool { return c != 0 }) {
			return lo, nil
		}
	}
	return -1, nil
}

// indexProblem returns why g's index files must be rebuilt, or "".
func (s *Store) indexProblem(g *segment) (string, error) {
	records := g.nextOffset - g.baseOffset
	entries := fileEntries(g.entries, records)
	reason, err := indexFileProblem(s.fs, g.path(indexSuffix), appendOffsetIndex(nil, entries), func(b []byte) error {
		_, err := decodeOffsetIndex(b, g.size, records)
		return err
	})
	if err != nil || reason != "" {
		return "offset index: " + reason, err
	}
	reason, err = indexFileProblem(s.fs, g.path(timeIndexSuffix), appendTimeIndex(nil, entries), func(b []byte) error {
		_, err := decodeTimeIndex(b, records)
		return err
	})
	if reason != "" {
		reason = "time index: " + reason
	}
	return reason, err
}

// applyPlan makes the changes recovery decided on, once the whole log has
// been verified.
func (s *Store) applyPlan(segs []*segment, plan *recoveryPlan) error {
	if plan.tornAt >= 0 {
		g := segs[len(segs)-1]
		if err := g.f.Truncate(plan.tornAt); err != nil {
			return fmt.Errorf("segment: truncate torn tail of %s: %w", g.name(), err)
		}
		// Always sync a repair, whatever the policy: a torn tail that came
		// back after a crash would sit under appended frames as corruption.
		if err := g.f.Datasync(); err != nil {
			return fmt.Errorf("segment: sync truncated %s: %w", g.name(), err)
		}
		if plan.padding {
			s.log.Debug("cut off zero padding", "segment", g.name(), "position", plan.tornAt, "bytes", plan.tornBytes)
		} else {
			s.log.Warn("truncated torn tail", "segment", g.name(), "position", plan.tornAt,
				"offset", g.nextOffset, "bytes", plan.tornBytes)
		}
	}
	for _, g := range segs {
		reason, ok := plan.indexRewrite[g]
		if !ok {
			continue
		}
		if err := s.writeIndexFiles(g); err != nil {
			s.log.Warn("could not rebuild index files", "segment", g.name(), "error", err)
			continue
		}
		s.log.Info("rebuilt index files", "segment", g.name(), "reason", reason)
	}
	s.applyKeyPlan(segs, plan)
	for _, name := range plan.orphans {
		if err := s.fs.Remove(filepath.Join(s.cfg.Dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("segment: remove orphan index file: %w", err)
		}
		s.log.Info("removed orphan index file", "name", name)
	}
	if len(plan.orphans) > 0 {
		if err := s.fs.SyncDir(s.cfg.Dir); err != nil {
			return fmt.Errorf("segment: sync directory: %w", err)
		}
	}
	return nil
}

// findValidFrameAfter reports whether a valid frame (CRC-valid, with
// BaseOffset >= expect), or a sealed unit that k opens holding one, starts
// anywhere in f after the bad frame at bad: first where the bad frame's
// length field points, if plausible, then at every byte position up to
// fileSize. Positions whose header is implausible in itself are rejected
// without reading further, so garbage costs a few comparisons per byte;
// a sealed unit's header must name a key k holds before it is opened.
func findValidFrameAfter(k *atrest.Keyring, f vfs.File, bad, fileSize int64, expect uint64) (int64, bool, error) {
	var tmp []byte
	validAt := func(pos int64) (bool, error) {
		var lb [4]byte
		if pos+int64(len(lb)) > fileSize {
			return false, nil
		}
		if err := readFull(f, lb[:], pos); err != nil {
			return false, err
		}
		size, err := unitSize(lb[:])
		if err != nil || pos+int64(size) > fileSize {
			return false, nil
		}
		if cap(tmp) < size {
			tmp = make([]byte, size)
		}
		tmp = tmp[:size]
		if err := readFull(f, tmp, pos); err != nil {
			return false, err
		}
		_, h, err := openUnit(k, tmp)
		return err == nil && h.BaseOffset >= expect, nil
	}

	// Follow the length field.
	var lb [4]byte
	if bad+4 <= fileSize {
		if err := readFull(f, lb[:], bad); err != nil {
			return 0, false, err
		}
		if size, err := unitSize(lb[:]); err == nil {
			if ok, err := validAt(bad + int64(size)); err != nil || ok {
				return bad + int64(size), ok, err
			}
		}
	}

	// Scan every later position.
	win := make([]byte, 0, scanStepBytes+batch.HeaderSize)
	for ws := bad + 1; ws+atrest.HeaderBytes <= fileSize; ws += scanStepBytes {
		n := min(int64(scanStepBytes+batch.HeaderSize-1), fileSize-ws)
		win = win[:n]
		if err := readFull(f, win, ws); err != nil {
			return 0, false, err
		}
		for q := 0; q < scanStepBytes && int64(q)+atrest.HeaderBytes <= n; q++ {
			if at, ok, err := validFrameAt(k, win[q:], ws+int64(q), expect, validAt); err != nil || ok {
				return at, ok, err
			}
		}
	}
	return 0, false, nil
}

// validFrameAt judges the candidate position pos whose bytes start b (at
// least atrest.HeaderBytes of them): a plain frame's header is decoded
// from b when it holds the whole frame, a sealed unit (whose key k holds)
// or a longer frame is judged whole by validAt.
func validFrameAt(k *atrest.Keyring, b []byte, pos int64, expect uint64, validAt func(int64) (bool, error)) (int64, bool, error) {
	if atrest.Sealed(b) {
		if _, id, err := atrest.CheckHeader(b); err != nil || k == nil || !k.Has(id) {
			return 0, false, nil
		}
		ok, err := validAt(pos)
		return pos, ok, err
	}
	if len(b) < batch.HeaderSize {
		return 0, false, nil
	}
	h, err := batch.DecodeHeader(b)
	switch {
	case err == nil:
		if h.BaseOffset >= expect {
			return pos, true, nil
		}
	case errors.Is(err, batch.ErrShort):
		// The header is plausible and the frame runs past the window:
		// judge it on the whole frame.
		ok, err := validAt(pos)
		return pos, ok, err
	}
	return 0, false, nil
}
