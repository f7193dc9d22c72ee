package segment

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

const (
	logSuffix       = ".log"
	indexSuffix     = ".index"
	timeIndexSuffix = ".timeindex"

	// baseDigits is the width of the zero-padded base offset in file names.
	baseDigits = 20

	// segmentFileBytesMax bounds a segment file: index positions are u32.
	segmentFileBytesMax = math.MaxUint32

	// fdatasyncEINTRMax bounds retries of an fdatasync interrupted before it
	// started (EINTR is not a write-back failure, so retrying it is not the
	// fsyncgate mistake).
	fdatasyncEINTRMax = 16
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
	if suffix != logSuffix && suffix != indexSuffix && suffix != timeIndexSuffix {
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
	f          *os.File
	refs       atomic.Int32

	size                   int64  // bytes of whole, validated frames
	nextOffset             uint64 // offset after the last frame
	maxAppendTimeUnixNanos int64  // meaningful when size > 0
	entries                []indexEntry
}

func newSegment(dir string, base uint64, f *os.File) *segment {
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
	entries                []indexEntry
}

// viewLocked snapshots g and takes a reference; the caller holds Store.mu.
func viewLocked(g *segment) segView {
	g.acquire()
	return segView{seg: g, size: g.size, nextOffset: g.nextOffset,
		maxAppendTimeUnixNanos: g.maxAppendTimeUnixNanos, entries: g.entries}
}

// fdatasync flushes f's data and the metadata needed to read it back.
func fdatasync(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	cerr := rc.Control(func(fd uintptr) {
		for range fdatasyncEINTRMax {
			if serr = unix.Fdatasync(int(fd)); serr != unix.EINTR {
				return
			}
		}
	})
	if cerr != nil {
		return cerr
	}
	if serr != nil {
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: serr}
	}
	return nil
}

// syncDir fsyncs the directory at path, making creates, renames and
// unlinks in it durable.
func syncDir(path string) error {
	d, err := os.Open(path)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
