package segment

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
)

const (
	logSuffix       = ".log"
	indexSuffix     = ".index"
	timeIndexSuffix = ".timeindex"
	keyIndexSuffix  = ".keyindex"

	// baseDigits is the width of the zero-padded base offset in file names.
	baseDigits = 20

	// segmentFileBytesMax bounds a segment file: index positions are u32.
	segmentFileBytesMax = math.MaxUint32
)

// segmentName returns the file name of the segment at base with suffix.
func segmentName(base uint64, suffix string) string {
	return fmt.Sprintf("%0*d%s", baseDigits, base, suffix)
}

// parseSegmentName splits a segment file name into base offset and suffix.
func parseSegmentName(name string) (base uint64, suffix string, ok bool) {
	if len(name) <= baseDigits {
		return 0, "", false
	}
	digits, suffix := name[:baseDigits], name[baseDigits:]
	if suffix != logSuffix && suffix != indexSuffix && suffix != timeIndexSuffix && suffix != keyIndexSuffix {
		return 0, "", false
	}
	if strings.IndexFunc(digits, func(r rune) bool { return r < '0' || r > '9' }) >= 0 {
		return 0, "", false
	}
	base, err := strconv.ParseUint(digits, 10, 64)
	if err != nil {
		return 0, "", false
	}
	return base, suffix, true
}

// segment is one log file and its in-memory sparse index.
//
// baseOffset, dir and f never change. The fields below them are owned by the
// appender, which changes them only while holding Store.mu; readers read them
// under Store.mu.RLock (see segView). refs counts the store's list plus every
// reader or syncer using f; f is closed when it drops to zero, so a reader
// of a deleted segment keeps reading the unlinked file.
type segment struct {
	baseOffset uint64
	dir        string
	f          vfs.File
	refs       atomic.Int32

	size                   int64  // bytes of whole, validated frames
	nextOffset             uint64 // offset after the last record
	maxAppendTimeUnixNanos int64  // meaningful when size > 0
	firstIndex, lastIndex  uint64 // Raft indexes of its first and last frames carrying one; 0 if none
	lastTerm               uint64 // Term of the frame at lastIndex
	entries                []indexEntry
	// truncations counts the truncations that cut into this segment, so
	// that a rewrite notices one however the segment grew back.
	truncations uint32
	// keys is the active segment's key index (nil once sealed).
	keys *activeKeys
	// sealed is a sealed segment's key index, nil while it is active or
	// when its file could not be written (then readers scan it). It is
	// set by the appender (roll, recovery, a rewrite's swap) and closed
	// with the last reference.
	sealed atomic.Pointer[sealedKeys]
	// padded is the zeros written past size on the active segment
	// (zeroahead.go): its file ends at size+padded. noZeroAhead turns
	// zero-ahead off for the segment (the device refused zeros for space).
	// The appender's (wmu).
	padded      int64
	noZeroAhead bool
}

// hasRecords reports whether g holds a record. Only such a segment may be
// sealed: its successor is named by g.nextOffset, which must differ from
// g.baseOffset (a segment of control frames alone would share its name).
func (g *segment) hasRecords() bool { return g.nextOffset > g.baseOffset }

func newSegment(dir string, base uint64, f vfs.File) *segment {
	g := &segment{baseOffset: base, dir: dir, f: f, nextOffset: base, maxAppendTimeUnixNanos: math.MinInt64}
	g.refs.Store(1)
	return g
}

// path returns the path of the segment's file with suffix.
func (g *segment) path(suffix string) string {
	return filepath.Join(g.dir, segmentName(g.baseOffset, suffix))
}

// name returns the log file name, for errors and logs.
func (g *segment) name() string { return segmentName(g.baseOffset, logSuffix) }

// acquire takes a reference. The caller must already hold one, or hold
// Store.mu while g is in the store's list (which holds one).
func (g *segment) acquire() {
	if g.refs.Add(1) <= 1 {
		panic(fmt.Sprintf("segment: acquire of released segment %s", g.name()))
	}
}

// release drops a reference and closes the file with the last one. The
// file's data was fsynced (or FsyncNever chose not to) before the store let
// go of it, so a close error carries nothing to act on; it is returned for
// logging.
func (g *segment) release() error {
	switch n := g.refs.Add(-1); {
	case n == 0:
		if k := g.sealed.Load(); k != nil {
			k.close() // a read-only file: nothing to lose
		}
		return g.f.Close()
	case n < 0:
		panic(fmt.Sprintf("segment: release of released segment %s", g.name()))
	}
	return nil
}

// segView is a reader's snapshot of a segment, taken under Store.mu.RLock
// together with a reference. Bytes [0, size) of the file are whole frames
// that no appender will touch while the reader holds Store.truncMu.RLock.
type segView struct {
	seg                    *segment
	size                   int64
	nextOffset             uint64
	maxAppendTimeUnixNanos int64
	firstIndex, lastIndex  uint64
	lastTerm               uint64
	entries                []indexEntry
	truncations            uint32
}

// viewLocked snapshots g and takes a reference; the caller holds Store.mu.
func viewLocked(g *segment) segView {
	g.acquire()
	return segView{seg: g, size: g.size, nextOffset: g.nextOffset,
		maxAppendTimeUnixNanos: g.maxAppendTimeUnixNanos,
		firstIndex:             g.firstIndex, lastIndex: g.lastIndex, lastTerm: g.lastTerm, entries: g.entries,
		truncations: g.truncations}
}

var (
	// errOutOfSequence marks a CRC-valid frame at the wrong offset.
	errOutOfSequence = errors.New("frame is out of sequence")
	// errEmptyBatch marks a CRC-valid data frame without records, which
	// Append never writes.
	errEmptyBatch = errors.New("data frame holds no records")
	// errIndexSequence marks a CRC-valid frame whose Raft index does not
	// follow the previous frame's.
	errIndexSequence = errors.New("frame's raft index is out of sequence")
	// errTermDecreases marks a CRC-valid frame whose Raft term is below the
	// previous indexed frame's.
	errTermDecreases = errors.New("frame's raft term decreases")
)

// seq is what the next frame of the log must continue. Every frame the
// store reads is checked against it: data frames take offsets densely,
// control frames take none, and Raft indexes, once a frame carries one, are
// dense with terms non-decreasing.
type seq struct {
	offset    uint64 // BaseOffset the next frame must have
	nextIndex uint64 // Index the next frame must have; 0 if unknown (any passes)
	term      uint64 // lowest Term the next indexed frame may have
}

// check returns why h cannot be the next frame, or nil. A fork frame may
// skip indexes (see forkFollows); check trusts its header, which a CRC
// covers: checkFrame, for the paths that hold the frame and have not
// verified it before (appends, staging, recovery), also checks that its
// payload describes the gap.
//
// A compacted frame (batch.Header.Compacted) may start past q: compaction
// by key removed the frames in between, with their offsets and Raft
// indexes (see the package documentation), and it may hold no record.
//
// A commit mark (batch.TypeMark, see AppendMark) takes no offset and no
// index: it must start at q's offset, and leaves q as it was.
func (q seq) check(h batch.Header) error {
	switch {
	case h.Type == batch.TypeMark:
		if h.BaseOffset != q.offset {
			return fmt.Errorf("%w: commit mark at base offset %d", errOutOfSequence, h.BaseOffset)
		}
		return nil
	case h.BaseOffset != q.offset && !(h.Compacted() && h.BaseOffset > q.offset):
		return fmt.Errorf("%w: base offset %d", errOutOfSequence, h.BaseOffset)
	case h.RecordCount == 0 && h.Type == batch.TypeData && !h.Compacted():
		return errEmptyBatch
	case q.nextIndex != 0 && h.Index != q.nextIndex && !((h.Type == batch.TypeFork || h.Compacted()) && h.Index > q.nextIndex):
		return fmt.Errorf("%w: index %d, want %d", errIndexSequence, h.Index, q.nextIndex)
	case h.Index != 0 && h.Term < q.term:
		return fmt.Errorf("%w: term %d after %d", errTermDecreases, h.Term, q.term)
	}
	return nil
}

// checkFrame is check, and for a fork frame that the previous indexed
// frame is the one its payload names.
func (q seq) checkFrame(frame []byte, h batch.Header) error {
	if err := q.check(h); err != nil {
		return err
	}
	if q.nextIndex != 0 && h.Type != batch.TypeMark {
		return forkFollows(frame, h, q.nextIndex-1)
	}
	return nil
}

// forkFollows checks the Raft index of frame (header h) against prev, the
// index of the indexed frame before it: a frame continues at prev+1, but a
// fork frame (batch.TypeFork) may skip indexes if its payload names prev
// as the frame before it, so that the gap it ends is recorded where it is
// and nowhere else. A fork frame at prev+1 names prev or 0.
func forkFollows(frame []byte, h batch.Header, prev uint64) error {
	if h.Type != batch.TypeFork {
		if h.Index != prev+1 && !(h.Compacted() && h.Index > prev) {
			return fmt.Errorf("%w: index %d, want %d", errIndexSequence, h.Index, prev+1)
		}
		return nil
	}
	named, err := batch.ForkPrevIndex(frame)
	if err != nil {
		return fmt.Errorf("%w: fork frame at index %d: %w", errIndexSequence, h.Index, err)
	}
	switch {
	case h.Index <= prev:
		return fmt.Errorf("%w: fork frame at index %d after %d", errIndexSequence, h.Index, prev)
	case h.Index == prev+1 && named != 0 && named != prev:
		return fmt.Errorf("%w: fork frame at index %d names %d as the frame before it", errIndexSequence, h.Index, named)
	case h.Index > prev+1 && named != prev:
		return fmt.Errorf("%w: fork frame at index %d follows %d but names %d: indexes are missing", errIndexSequence, h.Index, prev, named)
	}
	return nil
}

// advance moves q past h, which passed check.
func (q *seq) advance(h batch.Header) {
	q.offset = h.NextOffset()
	if h.Index != 0 {
		q.nextIndex, q.term = h.Index+1, h.Term
	}
}

// entrySeq is what the frame at index entry e of g continues: its offset
// and, if known, its index.
func entrySeq(g *segment, e indexEntry) seq {
	return seq{offset: g.baseOffset + uint64(e.relOffset), nextIndex: e.index}
}
