package segment

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/geolog/geolog/batch"
)

// Rewriting a sealed segment (compaction by key, package compact) replaces
// its file with a smaller one holding the same frames, some with fewer
// records and some dropped, so that a crash at any point leaves the old
// segment or the new one, never neither:
//
//  1. Write the new frames to "_clean.<segment file name>" (names starting
//     with "_" are not segments; Open removes leftovers of this prefix),
//     validating each as recovery would, and fdatasync it whatever the
//     fsync policy: a rename must never publish unsynced data.
//  2. On the appender's lock, check that the segment is still the one read
//     (retention, a truncation or an install may have replaced it: then
//     the new file is dropped), rename the new file over the segment's
//     (atomic), fsync the directory, and publish the new segment; readers
//     of the old one finish on the unlinked file.
//     The new key index, built from the new frames while they were
//     written and saved as "_clean.<segment>.keyindex", is renamed over
//     the old one before the new segment is published, so that readers of
//     the new segment never see the old index; readers of the old segment
//     keep the old index file open (opened before the renames).
//  3. Write the new segment's offset and time index files. They are a
//     cache: a crash before they are written leaves stale ones, which Open
//     rebuilds (as it rebuilds a key index that does not match its log).
//
// What the new file must keep, so that the log around it still joins up:
// its frames continue each other as compacted frames may (see seq.check),
// from the segment's base offset; its last frame is the old last frame's
// (same NextOffset, Raft index, term and append time), so that the next
// segment follows it as before and the segment's bounds do not move.

// cleanPrefix starts the names of segments being rewritten.
const cleanPrefix = "_clean."

// ErrRewriteAbandoned reports a rewrite whose segment changed while it ran
// (deleted by retention, truncated, replaced by an install, or the store
// closed): nothing was replaced. Try again with the current segments.
var ErrRewriteAbandoned = errors.New("segment: segment changed during its rewrite")

// RewriteFunc returns what replaces one frame of a segment being
// rewritten: the frame itself, another frame appended to dst (returned),
// or dst unchanged to drop it. frame aliases a read window valid until the
// call returns; last says it is the segment's last frame, which must be
// kept (with its offsets, index, term and append time).
type RewriteFunc func(dst, frame []byte, h batch.Header, last bool) ([]byte, error)

// RewriteStats describes one rewrite.
type RewriteStats struct {
	BytesBefore, BytesAfter   int64
	FramesBefore, FramesAfter int
}

// Sealed returns the sealed segments (every one but the active segment),
// oldest first. Safe from any goroutine.
func (s *Store) Sealed() []SegmentInfo {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed || len(s.segs) < 2 {
		return nil
	}
	out := make([]SegmentInfo, 0, len(s.segs)-1)
	for _, g := range s.segs[:len(s.segs)-1] {
		out = append(out, infoOf(g))
	}
	return out
}

// SealBefore rolls the active segment if it holds a record below offset,
// so that every offset below offset lies in a sealed segment (which
// WalkSegment and RewriteSegment take). For the appender goroutine.
func (s *Store) SealBefore(offset uint64) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.usableLocked(); err != nil {
		return err
	}
	if g := s.active(); g.hasRecords() && g.baseOffset < offset {
		return s.roll()
	}
	return nil
}

// sealedView snapshots the sealed segment at base, or fails with
// ErrRewriteAbandoned when there is none (it was deleted, or is active).
func (s *Store) sealedView(base uint64) (segView, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return segView{}, ErrClosed
	}
	for _, g := range s.segs[:len(s.segs)-1] {
		if g.baseOffset == base {
			return viewLocked(g), nil
		}
	}
	return segView{}, fmt.Errorf("%w: no sealed segment at %d", ErrRewriteAbandoned, base)
}

// WalkSegment calls fn with every frame of the sealed segment at base, in
// order, each verified (CRC, sequence) as readers verify them; frame
// aliases a read window valid until fn returns, and last says it is the
// segment's last frame. throttle, if not nil, is called with the bytes of
// each read before it is made (the caller bounds its I/O there). An error
// from fn stops the walk and is returned. Safe from any goroutine,
// concurrently with the appender.
func (s *Store) WalkSegment(base uint64, throttle func(bytes int), fn func(frame []byte, h batch.Header, last bool) error) error {
	v, err := s.sealedView(base)
	if err != nil {
		return err
	}
	defer s.releaseView(v)
	_, err = s.walkView(v, throttle, fn)
	return err
}

// walkView walks every frame of v (see WalkSegment), telling fn which one
// is the last, and returns the newest commit mark it stepped over.
func (s *Store) walkView(v segView, throttle func(int), fn func(frame []byte, h batch.Header, last bool) error) (uint64, error) {
	w, buf := s.walker(v.seg.f, 0, v.size)
	defer s.releaseWalker(&w, buf)
	w.chunk = readChunkBytes
	w.throttle = throttle
	q := seq{offset: v.seg.baseOffset}
	for {
		frame, h, err := w.next()
		framePos := w.at
		if err == io.EOF {
			return w.mark, nil
		}
		if err == nil {
			err = q.check(h)
		}
		if err != nil {
			return 0, s.readError(v.seg, framePos, q.offset, err)
		}
		q.advance(h)
		// Commit marks (AppendMark) may follow a Raft log's last frame,
		// the one at the segment's last index.
		last := w.pos == v.size || (h.Index != 0 && h.Index == v.lastIndex)
		if err := fn(frame, h, last); err != nil {
			return 0, err
		}
	}
}

// RewriteSegment replaces the sealed segment at base with the frames
// rewrite returns for its frames (see the steps above and RewriteFunc),
// and returns what it saved. The new frames are validated as recovery
// validates a log, and must end with the old last frame's offsets, index,
// term and append time; a rewrite that breaks that replaces nothing and
// returns ErrInvalidFrame. throttle is WalkSegment's, and is also called
// with the bytes of each write. A segment that changed meanwhile returns
// ErrRewriteAbandoned. Safe from any goroutine, concurrently with the
// appender and readers (it takes the appender's lock only to swap); one
// rewrite of a store at a time.
func (s *Store) RewriteSegment(base uint64, throttle func(bytes int), rewrite RewriteFunc) (RewriteStats, error) {
	v, err := s.sealedView(base)
	if err != nil {
		return RewriteStats{}, err
	}
	defer s.releaseView(v)
	tmp := filepath.Join(s.cfg.Dir, cleanPrefix+segmentName(base, logSuffix))
	out, err := s.writeRewrite(v, tmp, throttle, rewrite)
	if err != nil {
		s.removeRewriteFiles(tmp, "")
		return RewriteStats{}, err
	}
	keys := s.writeRewrittenKeys(out)
	st := RewriteStats{BytesBefore: v.size, BytesAfter: out.g.size, FramesBefore: out.framesBefore, FramesAfter: out.framesAfter}
	if err := s.swapRewritten(v, tmp, out.g, keys); err != nil {
		out.g.f.Close()
		s.removeRewriteFiles(tmp, keys.tmp)
		return RewriteStats{}, err
	}
	s.log.Debug("rewrote segment", "segment", v.seg.name(), "bytes_before", st.BytesBefore, "bytes_after", st.BytesAfter,
		"frames_before", st.FramesBefore, "frames_after", st.FramesAfter)
	return st, nil
}

// rewritten is a segment file written by writeRewrite, open, with its
// in-memory fields computed, not yet published.
type rewritten struct {
	g                         *segment
	framesBefore, framesAfter int
	// keys holds the key index entries of the new frames: 12 bytes per
	// record kept, fewer than the segment had.
	keys *KeyIndexBuilder
}

// rewrittenKeys is the key index of a rewritten segment, written to tmp
// ("" if it could not be written: the new segment is then scanned by key
// reads until Open rebuilds its index).
type rewrittenKeys struct {
	tmp    string
	sealed *sealedKeys
}

// writeRewrittenKeys writes the key index of the rewritten segment to its
// temporary file. A failure is logged, not returned: the index is a cache.
func (s *Store) writeRewrittenKeys(out rewritten) rewrittenKeys {
	g := out.g
	tmp := filepath.Join(s.cfg.Dir, cleanPrefix+segmentName(g.baseOffset, keyIndexSuffix))
	ents := out.keys.sorted()
	if err := writeFile(s.fs, tmp, appendKeyIndexFile(nil, g.baseOffset, g.size, ents), s.cfg.Fsync == FsyncAlways); err != nil {
		s.log.Warn("could not write the key index of a rewritten segment; it will be scanned", "segment", g.name(), "error", err)
		s.removeRewriteFiles(tmp)
		return rewrittenKeys{}
	}
	return rewrittenKeys{tmp: tmp, sealed: &sealedKeys{fence: fenceOf(ents), count: uint64(len(ents))}}
}

// removeRewriteFiles removes the temporary files of an abandoned rewrite
// (either name may be "").
func (s *Store) removeRewriteFiles(names ...string) {
	for _, name := range names {
		if name == "" {
			continue
		}
		if err := s.fs.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("remove abandoned rewrite", "file", name, "error", err)
		}
	}
}

// writeRewrite writes the frames rewrite returns for v's frames to a new
// file at path, validating them, and fsyncs it.
func (s *Store) writeRewrite(v segView, path string, throttle func(int), rewrite RewriteFunc) (rewritten, error) {
	f, err := s.fs.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return rewritten{}, fmt.Errorf("segment: create rewrite of %s: %w", v.seg.name(), err)
	}
	g := newSegment(s.cfg.Dir, v.seg.baseOffset, f)
	out := rewritten{g: g, keys: NewKeyIndexBuilder(v.seg.baseOffset)}
	q := seq{offset: v.seg.baseOffset}
	var last batch.Header
	var pending []byte // units not yet written
	var scratch []byte // a sealed unit being built
	flush := func() error {
		if len(pending) == 0 {
			return nil
		}
		if throttle != nil {
			throttle(len(pending))
		}
		_, err := f.WriteAt(pending, g.size-int64(len(pending)))
		pending = pending[:0]
		return err
	}
	mark, err := s.walkView(v, throttle, func(frame []byte, h batch.Header, isLast bool) error {
		out.framesBefore++
		if isLast {
			last = h
		}
		n := len(pending)
		var err error
		if pending, err = rewrite(pending, frame, h, isLast); err != nil {
			return err
		}
		if err := s.placeRewritten(g, &q, pending[n:], isLast, &out); err != nil {
			return err
		}
		if s.cfg.Keyring != nil && len(pending) > n {
			// Seal what was placed, under the active key: a rewrite is
			// also how old data keys are retired (see Reseal).
			scratch = sealFrame(s.cfg.Keyring, &scratch, pending[n:])
			pending = append(pending[:n], scratch...)
		}
		if len(pending) >= readChunkBytes {
			return flush()
		}
		return nil
	})
	if err == nil && mark != 0 {
		// The segment's newest commit mark stays, after its last frame: it
		// may be the log's newest (package replica's commitmark.go).
		m := sealFrame(s.cfg.Keyring, &scratch, batch.EncodeMark(nil, mark, g.nextOffset, g.maxAppendTimeUnixNanos))
		pending = append(pending, m...)
		g.size += int64(len(m))
	}
	if err == nil {
		err = flush()
	}
	if err == nil {
		err = checkRewrittenEnd(g, last, v)
	}
	if err == nil {
		err = f.Datasync()
	}
	if err != nil {
		f.Close()
		return rewritten{}, err
	}
	return out, nil
}

// placeRewritten validates the frames b (what rewrite returned for one old
// frame: none, or one) as continuing q, and notes them in g as Append
// would (index entries, bounds) at the end of the file being written.
func (s *Store) placeRewritten(g *segment, q *seq, b []byte, isLast bool, out *rewritten) error {
	if len(b) == 0 {
		if isLast {
			return fmt.Errorf("%w: a rewrite dropped the last frame of %s", ErrInvalidFrame, g.name())
		}
		return nil
	}
	h, err := batch.Validate(b)
	if err == nil {
		if size, _ := batch.FrameSize(b); size != len(b) {
			err = fmt.Errorf("%d bytes hold a frame of %d and more", len(b), size)
		}
	}
	if err == nil {
		err = q.checkFrame(b, h)
	}
	if err == nil {
		err = out.keys.add(b, h, g.size)
	}
	if err != nil {
		return fmt.Errorf("%w: rewrite of %s at offset %d: %w", ErrInvalidFrame, g.name(), q.offset, err)
	}
	pos := g.size
	if needsIndexEntry(g.entries, pos, s.cfg.IndexIntervalBytes) {
		g.entries = append(g.entries, indexEntry{relOffset: relOffset(g, h.BaseOffset), position: uint32(pos),
			appendTimeUnixNanos: max(h.AppendTimeUnixNanos, g.maxAppendTimeUnixNanos), index: h.Index})
	}
	g.size += int64(unitBytes(s.cfg.Keyring, len(b)))
	g.nextOffset = h.NextOffset()
	g.maxAppendTimeUnixNanos = max(h.AppendTimeUnixNanos, g.maxAppendTimeUnixNanos)
	if h.Index != 0 {
		if g.firstIndex == 0 {
			g.firstIndex = h.Index
		}
		g.lastIndex, g.lastTerm = h.Index, h.Term
	}
	q.advance(h)
	out.framesAfter++
	return nil
}

// checkRewrittenEnd checks that the rewritten segment g ends as the old
// one (v, whose last frame is last) did.
func checkRewrittenEnd(g *segment, last batch.Header, v segView) error {
	if g.nextOffset != v.nextOffset || g.lastIndex != v.lastIndex || g.lastTerm != v.lastTerm ||
		g.maxAppendTimeUnixNanos != v.maxAppendTimeUnixNanos || (v.lastIndex != 0 && g.lastIndex != last.Index) {
		return fmt.Errorf("%w: rewrite of %s ends at offset %d index %d term %d time %d, the segment at %d, %d, %d, %d",
			ErrInvalidFrame, g.name(), g.nextOffset, g.lastIndex, g.lastTerm, g.maxAppendTimeUnixNanos,
			v.nextOffset, v.lastIndex, v.lastTerm, v.maxAppendTimeUnixNanos)
	}
	return nil
}

// swapRewritten publishes the rewritten segment ng (written to tmp, its
// key index to keys.tmp) in place of v's segment, if that is still in the
// log unchanged: rename, directory fsync, key index, publish, then the
// other index files (see the steps above).
func (s *Store) swapRewritten(v segView, tmp string, ng *segment, keys rewrittenKeys) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.usableLocked(); err != nil {
		return err
	}
	i := s.indexOfLocked(v.seg)
	if i < 0 || i == len(s.segs)-1 || v.seg.size != v.size || v.seg.truncations != v.truncations {
		return fmt.Errorf("%w: %s", ErrRewriteAbandoned, v.seg.name())
	}
	holdOldKeys(s, v.seg)
	if err := s.fs.Rename(tmp, v.seg.path(logSuffix)); err != nil {
		return fmt.Errorf("segment: replace %s: %w", v.seg.name(), err)
	}
	if err := s.fs.SyncDir(s.cfg.Dir); err != nil {
		// Whether the directory holds the old file or the new one is
		// unknown; both are valid segments, but the store cannot tell
		// which it serves after a crash. Like a failed fsync, not retried.
		s.fail(err)
		return s.failed()
	}
	s.swapKeyIndex(ng, keys)
	s.mu.Lock()
	s.segs[i] = ng
	s.sizeBytes.Add(ng.size - v.seg.size)
	s.publishBoundsLocked()
	s.mu.Unlock()
	if err := v.seg.release(); err != nil {
		s.log.Warn("close segment file", "segment", v.seg.name(), "error", err)
	}
	if err := s.writeIndexFiles(ng); err != nil {
		s.log.Warn("could not write index files", "segment", ng.name(), "error", err)
	}
	return nil
}

// holdOldKeys opens the key index file of g, a segment about to be
// replaced, if it has a sealed index: its readers keep reading the file
// they verified once the new segment's index replaces it by name.
func holdOldKeys(s *Store, g *segment) {
	k := g.sealed.Load()
	if k == nil {
		return
	}
	if _, err := k.open(s.fs, g.path(keyIndexSuffix)); err != nil {
		k.broken.Store(true) // its readers scan
	}
}

// swapKeyIndex puts the rewritten segment ng's key index file in place and
// gives ng its sealed index; without one (not written, or the rename
// failed) ng is scanned by key reads and the file left beside it is
// stale, which the next Open notices and rebuilds.
func (s *Store) swapKeyIndex(ng *segment, keys rewrittenKeys) {
	if keys.tmp == "" {
		return
	}
	if err := s.fs.Rename(keys.tmp, ng.path(keyIndexSuffix)); err != nil {
		s.log.Warn("could not replace the key index of a rewritten segment; it will be scanned", "segment", ng.name(), "error", err)
		s.removeRewriteFiles(keys.tmp)
		return
	}
	ng.sealed.Store(keys.sealed)
}

// indexOfLocked returns the position of g in segs, or -1. The caller holds
// wmu or mu.
func (s *Store) indexOfLocked(g *segment) int {
	for i, x := range s.segs {
		if x == g {
			return i
		}
	}
	return -1
}

// removeCleanLeftovers removes the files of rewrites a crash interrupted
// (before their rename: the segment is the old one). Open runs it first.
func (s *Store) removeCleanLeftovers() error {
	dirents, err := s.fs.ReadDir(s.cfg.Dir)
	if err != nil {
		return fmt.Errorf("segment: list %s: %w", s.cfg.Dir, err)
	}
	removed := 0
	for _, de := range dirents {
		if !strings.HasPrefix(de.Name(), cleanPrefix) {
			continue
		}
		if err := s.fs.Remove(filepath.Join(s.cfg.Dir, de.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("segment: remove %s: %w", de.Name(), err)
		}
		removed++
	}
	if removed == 0 {
		return nil
	}
	s.log.Info("removed interrupted segment rewrites", "files", removed)
	return s.fs.SyncDir(s.cfg.Dir)
}
