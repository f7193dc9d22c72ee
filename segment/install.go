package segment

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
)

// Installing a log received from elsewhere (a Raft snapshot is the leader's
// segments) replaces the whole log in two phases, so that a crash at any
// point leaves either the old log or the new one:
//
//  1. Stage (BeginStaging, Staging.Append, Staging.Finish). The frames are
//     validated as Append validates them and written, as segments, to files
//     named "_snap.<segment file name>" in the store's directory, which Open
//     and every reader ignore. Finish fsyncs them and the directory.
//  2. Install, on the appender goroutine:
//     a. commit: write the manifest (the staged segments' base offsets and a
//     CRC-32C) to "_snap.manifest.tmp", fsync it, rename it to
//     "_snap.manifest", fsync the directory. Before the rename the old log
//     is untouched; from it on the new log is the log.
//     b. roll forward: rename every staged file to its segment name
//     (replacing an old segment of the same name), fsync the directory;
//     remove every other segment file and every index file (they are
//     rebuilt), fsync; remove leftover "_snap." files and last the
//     manifest, fsync.
//     c. reload the segments from the directory as Open does and publish
//     them.
//
// Open runs 2b first whenever it finds a manifest (an install that crashed
// after its commit point), and removes "_snap." files without a manifest
// (a staging that never committed). Step 2b is idempotent: a file the
// manifest names is either still staged or already in place.

const (
	// stagePrefix starts the names of staged segment files.
	stagePrefix = "_snap."
	// manifestName is the commit record of an install.
	manifestName = stagePrefix + "manifest"
	// manifestTmpName is the manifest before its commit rename.
	manifestTmpName = manifestName + ".tmp"
	// manifestMagic starts a manifest.
	manifestMagic = "GLIM"
	// manifestSegmentsMax bounds the segments one manifest names (a
	// manifest of 1 GiB segments naming this many is a 1 PiB log).
	manifestSegmentsMax = 1 << 20
)

var (
	// ErrStagingBusy reports a BeginStaging while another staging of the
	// same store is open (staged, not yet installed or aborted).
	ErrStagingBusy = errors.New("segment: another log is being staged")
	// ErrStagingDone reports use of a Staging after Finish (for appends),
	// Abort or Install, or an Install of a staging that is not finished or
	// belongs to another store.
	ErrStagingDone = errors.New("segment: staging is finished or closed")
)

// Staging is a replacement log being written beside a store's log (see
// Install). One goroutine uses it; it may be any goroutine, concurrently
// with the store's appender and readers, since it touches only its own
// files. Abort it unless Install took it.
type Staging struct {
	s        *Store
	segs     []*stagedSegment
	q        seq
	lastTime int64
	first    uint64 // Raft index of the first frame carrying one; 0 if none
	frames   uint64
	finished bool
	closed   bool
	sealBuf  []byte // Append's scratch for sealed units
}

// stagedSegment is one staged segment file.
type stagedSegment struct {
	base       uint64
	f          vfs.File
	size       int64
	nextOffset uint64
	synced     bool
}

func (g *stagedSegment) hasRecords() bool { return g.nextOffset > g.base }

func stagedName(base uint64) string { return stagePrefix + segmentName(base, logSuffix) }

// BeginStaging starts a replacement log whose first frame has BaseOffset
// startOffset and, if firstIndex is not 0, Raft index firstIndex. One
// staging per store at a time: another gets ErrStagingBusy until this one is
// installed or aborted.
func (s *Store) BeginStaging(startOffset, firstIndex uint64) (*Staging, error) {
	if !s.staging.CompareAndSwap(false, true) {
		return nil, ErrStagingBusy
	}
	s.mu.RLock()
	closed := s.closed
	s.mu.RUnlock()
	if closed {
		s.staging.Store(false)
		return nil, ErrClosed
	}
	st := &Staging{s: s, q: seq{offset: startOffset, nextIndex: firstIndex}, lastTime: math.MinInt64}
	if err := st.newSegment(startOffset); err != nil {
		st.Abort()
		return nil, err
	}
	return st, nil
}

// newSegment starts a staged segment at base. A leftover file of the same
// name (from a staging whose Abort could not remove it) is overwritten.
func (st *Staging) newSegment(base uint64) error {
	s := st.s
	f, err := s.fs.OpenFile(filepath.Join(s.cfg.Dir, stagedName(base)), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("segment: create staged segment: %w", err)
	}
	st.segs = append(st.segs, &stagedSegment{base: base, f: f, nextOffset: base})
	return nil
}

// Append validates one frame as Store.Append does (CRC and structure, dense
// offsets from the start offset, a data frame holds records, append times
// non-decreasing, Raft indexes dense from the first index with terms
// non-decreasing) and writes it, returning its header; a frame failing
// that returns ErrInvalidFrame and is not written. Segments roll as the
// store's do.
func (st *Staging) Append(frame []byte) (batch.Header, error) {
	h, err := st.append(frame)
	if err != nil {
		return batch.Header{}, err
	}
	return h, nil
}

func (st *Staging) append(frame []byte) (batch.Header, error) {
	if st.finished || st.closed {
		return batch.Header{}, ErrStagingDone
	}
	h, err := batch.Validate(frame)
	if err != nil {
		return h, fmt.Errorf("%w: %w", ErrInvalidFrame, err)
	}
	if size, _ := batch.FrameSize(frame); size != len(frame) {
		return h, fmt.Errorf("%w: %d bytes hold a frame of %d and more", ErrInvalidFrame, len(frame), size)
	}
	if err := st.checkFrame(frame, h); err != nil {
		return h, fmt.Errorf("%w: %w", ErrInvalidFrame, err)
	}
	switch {
	case h.AppendTimeUnixNanos < st.lastTime:
		return h, fmt.Errorf("%w: append time %d precedes the previous frame's %d", ErrInvalidFrame, h.AppendTimeUnixNanos, st.lastTime)
	case h.Index == math.MaxUint64:
		return h, fmt.Errorf("%w: raft index %d leaves no successor", ErrInvalidFrame, h.Index)
	}
	g := st.segs[len(st.segs)-1]
	// A received frame is sealed under this node's own active key: regions
	// and nodes share no key (see package atrest).
	unit := sealFrame(st.s.cfg.Keyring, &st.sealBuf, frame)
	if g.hasRecords() && st.s.overflows(g.size, g.base, len(unit), h) {
		if err := st.seal(g); err != nil {
			return h, err
		}
		if err := st.newSegment(g.nextOffset); err != nil {
			return h, err
		}
		g = st.segs[len(st.segs)-1]
	}
	if g.size+int64(len(unit)) > segmentFileBytesMax {
		return h, fmt.Errorf("%w: staged segment at %d of %d bytes cannot take %d more", ErrInvalidFrame, g.base, g.size, len(unit))
	}
	if _, err := g.f.WriteAt(unit, g.size); err != nil {
		return h, fmt.Errorf("segment: write staged segment: %w", err)
	}
	g.size += int64(len(unit))
	g.nextOffset = h.NextOffset()
	st.q.advance(h)
	st.lastTime = h.AppendTimeUnixNanos
	if h.Index != 0 && st.first == 0 {
		st.first = h.Index
	}
	st.frames++
	return h, nil
}

// checkFrame is seq.checkFrame, but for the staged log's first indexed
// frame: the frame before it, at the first index - 1, lies below the staged
// log, not in it. A fork frame there, at the first index, may name any
// index below its own as the frame before it: the gap it ends lies before
// the log's start. (A fork cuts a log whose retention had already deleted
// the entries it keeps to the fork frame alone, see replica's completeFork,
// and a snapshot of that log starts with the frame.) Everything else is
// checked as for any frame: the first index, the offset, a fork frame
// skipping indexes past the first index, the CRC over the named index.
func (st *Staging) checkFrame(frame []byte, h batch.Header) error {
	q := st.q
	if st.first != 0 || q.nextIndex == 0 || h.Type != batch.TypeFork || h.Index != q.nextIndex {
		return q.checkFrame(frame, h)
	}
	if err := q.check(h); err != nil {
		return err
	}
	named, err := batch.ForkPrevIndex(frame)
	switch {
	case err != nil:
		return fmt.Errorf("%w: fork frame at index %d: %w", errIndexSequence, h.Index, err)
	case named >= h.Index:
		return fmt.Errorf("%w: fork frame at index %d names %d as the frame before it", errIndexSequence, h.Index, named)
	}
	return nil
}

// seal fsyncs a finished staged segment, whatever the store's policy: an
// install must never leave a torn segment but the last.
func (st *Staging) seal(g *stagedSegment) error {
	if g.synced {
		return nil
	}
	if err := g.f.Datasync(); err != nil {
		return fmt.Errorf("segment: sync staged segment: %w", err)
	}
	g.synced = true
	return nil
}

// Finish makes the staged log durable (every file and the directory). No
// Append after it.
func (st *Staging) Finish() error {
	if st.finished || st.closed {
		return ErrStagingDone
	}
	for _, g := range st.segs {
		if err := st.seal(g); err != nil {
			return err
		}
	}
	if err := st.s.fs.SyncDir(st.s.cfg.Dir); err != nil {
		return fmt.Errorf("segment: sync directory: %w", err)
	}
	st.finished = true
	return nil
}

// NextOffset is the offset after the last staged record.
func (st *Staging) NextOffset() uint64 { return st.q.offset }

// FirstIndex and LastIndex bound the Raft indexes staged (0 if none);
// LastTerm is the term of the frame at LastIndex.
func (st *Staging) FirstIndex() uint64 { return st.first }

// LastIndex is the Raft index of the last staged frame, 0 if none.
func (st *Staging) LastIndex() uint64 {
	if st.first == 0 {
		return 0
	}
	return st.q.nextIndex - 1
}

// LastTerm is the Raft term of the last indexed frame staged, 0 if none.
func (st *Staging) LastTerm() uint64 { return st.q.term }

// Frames is the number of frames staged.
func (st *Staging) Frames() uint64 { return st.frames }

// LastAppendTimeUnixNanos is the append time of the last staged frame,
// math.MinInt64 if none.
func (st *Staging) LastAppendTimeUnixNanos() int64 { return st.lastTime }

// Abort discards the staging: its files are closed and removed. It may be
// called more than once, and after Install (a no-op then).
func (st *Staging) Abort() {
	if st.closed {
		return
	}
	st.closed = true
	s := st.s
	for _, g := range st.segs {
		g.f.Close()
		if err := s.fs.Remove(filepath.Join(s.cfg.Dir, stagedName(g.base))); err != nil && !errors.Is(err, fs.ErrNotExist) {
			// Open removes what is left; nothing else reads these files.
			s.log.Warn("could not remove staged segment", "segment", stagedName(g.base), "error", err)
		}
	}
	if err := s.fs.SyncDir(s.cfg.Dir); err != nil {
		s.log.Warn("sync directory after abort of staging", "error", err)
	}
	s.staging.Store(false)
}

// Install replaces the store's whole log with the staged one, which must be
// finished (see the steps above): afterwards StartOffset is the staging's
// start offset, NextOffset, FirstIndex and LastIndex those of the staged
// frames, and everything is durable. Readers in flight finish on the old
// log first; later reads see the new one. An error before the commit point
// changes nothing (the caller still owns st and aborts it); an error after
// it fails the store (ErrFailed): Close and Open again, which completes the
// install. For the appender goroutine.
func (s *Store) Install(st *Staging) error {
	if st.s != s || !st.finished || st.closed {
		return ErrStagingDone
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.usableLocked(); err != nil {
		return err
	}
	bases := make([]uint64, len(st.segs))
	for i, g := range st.segs {
		bases[i] = g.base
	}
	committed, err := s.commitManifest(bases)
	if !committed {
		return err
	}
	// The files are the install's now.
	st.closed = true
	for _, g := range st.segs {
		g.f.Close()
	}
	defer s.staging.Store(false)
	if err != nil {
		s.fail(err)
		return s.failed()
	}

	// No fdatasync may run while files change under it, and no reader may
	// read them.
	s.beginExclusiveSync()
	defer s.endExclusiveSync()
	s.truncMu.Lock()
	defer s.truncMu.Unlock()
	prevStart, prevNext := s.startOffset.Load(), s.nextOffset.Load()
	if err := s.rollForward(bases); err != nil {
		s.fail(err)
		return s.failed()
	}
	segs, err := s.loadSegments(nil)
	if err != nil {
		s.fail(fmt.Errorf("segment: load installed log: %w", err))
		return s.failed()
	}

	s.mu.Lock()
	old := s.segs
	s.segs = segs
	s.nextOffset.Store(segs[len(segs)-1].nextOffset)
	s.publishBoundsLocked()
	size := s.refreshTotals(segs)
	s.mu.Unlock()
	s.refreshLastTerm()
	// Everything installed was fsynced while staging, and nothing else
	// writes while we own the sync.
	s.durable.Store(s.nextOffset.Load())
	s.durableAppends.Store(s.appends.Load())
	for _, g := range old {
		if err := g.release(); err != nil {
			s.log.Warn("close segment file", "segment", g.name(), "error", err)
		}
	}
	s.log.Info("installed log", "segments", len(segs), "start_offset", s.startOffset.Load(), "next_offset", s.nextOffset.Load(),
		"first_index", s.firstIndex.Load(), "last_index", s.lastIndex.Load(), "bytes", size,
		"previous_start_offset", prevStart, "previous_next_offset", prevNext)
	return nil
}

// commitManifest writes the manifest naming bases and renames it into
// place: the commit point of an install. committed reports whether the
// rename happened (then a non-nil err means its durability is unknown).
func (s *Store) commitManifest(bases []uint64) (committed bool, err error) {
	tmp := filepath.Join(s.cfg.Dir, manifestTmpName)
	if err := writeFile(s.fs, tmp, encodeManifest(bases), true); err != nil {
		return false, fmt.Errorf("segment: write install manifest: %w", err)
	}
	if err := s.fs.Rename(tmp, filepath.Join(s.cfg.Dir, manifestName)); err != nil {
		return false, fmt.Errorf("segment: commit install manifest: %w", err)
	}
	if err := s.fs.SyncDir(s.cfg.Dir); err != nil {
		return true, fmt.Errorf("segment: sync directory after install commit: %w", err)
	}
	return true, nil
}

// encodeManifest: magic, segment count (u32), base offsets (u64 each),
// CRC-32C of everything before (u32), little-endian.
func encodeManifest(bases []uint64) []byte {
	b := make([]byte, 0, len(manifestMagic)+4+8*len(bases)+4)
	b = append(b, manifestMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(bases)))
	for _, base := range bases {
		b = binary.LittleEndian.AppendUint64(b, base)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// castagnoli is the CRC-32C table of the manifest.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errManifest marks a manifest that fails its checks.
var errManifest = errors.New("install manifest is malformed")

func decodeManifest(b []byte) ([]uint64, error) {
	const fixed = len(manifestMagic) + 4 + 4
	if len(b) < fixed || string(b[:len(manifestMagic)]) != manifestMagic {
		return nil, errManifest
	}
	body := b[:len(b)-4]
	if binary.LittleEndian.Uint32(b[len(b)-4:]) != crc32.Checksum(body, castagnoli) {
		return nil, fmt.Errorf("%w: crc mismatch", errManifest)
	}
	n := binary.LittleEndian.Uint32(b[len(manifestMagic):])
	if n == 0 || n > manifestSegmentsMax || len(b) != fixed+8*int(n) {
		return nil, fmt.Errorf("%w: %d segments in %d bytes", errManifest, n, len(b))
	}
	bases := make([]uint64, n)
	for i := range bases {
		bases[i] = binary.LittleEndian.Uint64(b[len(manifestMagic)+4+8*i:])
		if i > 0 && bases[i] <= bases[i-1] {
			return nil, fmt.Errorf("%w: base offsets do not increase", errManifest)
		}
	}
	return bases, nil
}

// finishInstall, run by Open before recovery, rolls forward an install that
// committed (its manifest exists) and removes staged files of one that did
// not.
func (s *Store) finishInstall() error {
	b, err := vfs.ReadFile(s.fs, filepath.Join(s.cfg.Dir, manifestName), int64(len(manifestMagic)+8+8*manifestSegmentsMax))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return s.removeStaged()
	case err != nil:
		return fmt.Errorf("segment: read install manifest: %w", err)
	}
	bases, err := decodeManifest(b)
	if err != nil {
		// Written and fsynced before its rename: only the disk can have
		// damaged it. Whether the new log is complete cannot be told.
		return &CorruptionError{Segment: manifestName, Err: err}
	}
	s.log.Warn("completing an interrupted install", "segments", len(bases), "start_offset", bases[0])
	return s.rollForward(bases)
}

// rollForward is step 2b of an install: the segments at bases become the
// log. It is idempotent, so a crash anywhere in it is repaired by running
// it again.
func (s *Store) rollForward(bases []uint64) error {
	dir := s.cfg.Dir
	// The new log's start, recorded before its segments replace the old
	// ones (and again if a crash makes Open roll forward).
	if err := s.saveStartRecord(bases[0]); err != nil {
		return err
	}
	for _, base := range bases {
		err := s.fs.Rename(filepath.Join(dir, stagedName(base)), filepath.Join(dir, segmentName(base, logSuffix)))
		if errors.Is(err, fs.ErrNotExist) {
			// Moved by an earlier, interrupted roll forward.
			if _, serr := s.fs.Stat(filepath.Join(dir, segmentName(base, logSuffix))); serr != nil {
				return &CorruptionError{Segment: segmentName(base, logSuffix),
					Err: fmt.Errorf("the install manifest names a segment that is neither staged nor in place: %w", serr)}
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("segment: install %s: %w", stagedName(base), err)
		}
	}
	if err := s.fs.SyncDir(dir); err != nil {
		return fmt.Errorf("segment: sync directory: %w", err)
	}
	dirents, err := s.fs.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("segment: list %s: %w", dir, err)
	}
	for _, de := range dirents {
		base, suffix, ok := parseSegmentName(de.Name())
		if !ok || (suffix == logSuffix && slices.Contains(bases, base)) {
			continue
		}
		// Old segments, and every index file: an old one may sit beside a
		// new segment of the same name. Recovery rebuilds them.
		if err := s.fs.Remove(filepath.Join(dir, de.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("segment: remove replaced %s: %w", de.Name(), err)
		}
	}
	if err := s.fs.SyncDir(dir); err != nil {
		return fmt.Errorf("segment: sync directory: %w", err)
	}
	if err := s.removeStaged(); err != nil {
		return err
	}
	if err := s.fs.Remove(filepath.Join(dir, manifestName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("segment: remove install manifest: %w", err)
	}
	return s.fs.SyncDir(dir)
}

// removeStaged removes staged files other than the manifest (an abandoned
// staging, or leftovers), and syncs the directory if it removed any.
func (s *Store) removeStaged() error {
	dirents, err := s.fs.ReadDir(s.cfg.Dir)
	if err != nil {
		return fmt.Errorf("segment: list %s: %w", s.cfg.Dir, err)
	}
	removed := 0
	for _, de := range dirents {
		name := de.Name()
		if !strings.HasPrefix(name, stagePrefix) || name == manifestName {
			continue
		}
		if err := s.fs.Remove(filepath.Join(s.cfg.Dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("segment: remove abandoned %s: %w", name, err)
		}
		removed++
	}
	if removed == 0 {
		return nil
	}
	s.log.Info("removed abandoned staged files", "files", removed)
	return s.fs.SyncDir(s.cfg.Dir)
}
