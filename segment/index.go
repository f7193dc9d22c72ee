package segment

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"

	"github.com/geolog/geolog/vfs"
)

const (
	// offsetEntryBytes is the size of one offset index entry:
	// relOffset u32, filePos u32.
	offsetEntryBytes = 8
	// timeEntryBytes is the size of one time index entry:
	// appendTime i64, relOffset u32.
	timeEntryBytes = 12
	// indexFileBytesMax bounds how much of an index file recovery reads
	// before judging it; a larger file is rebuilt unread.
	indexFileBytesMax = 64 << 20
)

// errIndexInvalid marks an index file that fails validation.
var errIndexInvalid = errors.New("segment: invalid index file")

// indexEntry is one sparse index point of a segment: the frame that starts
// at position has BaseOffset baseOffset+relOffset and Raft index index (0
// if it carries none), and appendTimeUnixNanos is the largest append time of
// the segment's frames up to and including it. The offset index and the
// time index files hold the same points, less those fileEntries leaves out
// and without the Raft index, which lives in memory only.
type indexEntry struct {
	relOffset           uint32
	position            uint32
	appendTimeUnixNanos int64
	index               uint64
}

// needsIndexEntry reports whether the frame starting at pos gets an index
// entry: when at least intervalBytes have been written since the last
// entry (or the segment start, which needs no entry). Append and recovery
// both apply this rule, to every frame, so recovery recomputes exactly the
// entries Append made and can compare them with the files.
func needsIndexEntry(entries []indexEntry, pos int64, intervalBytes int) bool {
	var last int64
	if len(entries) > 0 {
		last = int64(entries[len(entries)-1].position)
	}
	return pos-last >= int64(intervalBytes)
}

// floorEntry returns the last entry whose relOffset <= rel, or the segment
// start (zero entry) if there is none.
func floorEntry(entries []indexEntry, rel uint64) indexEntry {
	i := sort.Search(len(entries), func(i int) bool { return uint64(entries[i].relOffset) > rel })
	if i == 0 {
		return indexEntry{}
	}
	return entries[i-1]
}

// floorIndexEntry returns the last entry whose Raft index is <= index, or
// the segment start (zero entry) if there is none. An entry without an
// index sorts first: frames carrying indexes are a suffix of the log.
func floorIndexEntry(entries []indexEntry, index uint64) indexEntry {
	i := sort.Search(len(entries), func(i int) bool { return entries[i].index > index })
	if i == 0 {
		return indexEntry{}
	}
	return entries[i-1]
}

// fileEntries returns the entries of a segment holding recordCount records
// that go into its index files. The file format (see decodeOffsetIndex)
// wants relative offsets strictly increasing from above 0 and below
// recordCount, so an entry at a control frame that shares its offset with
// an earlier entry or sits past the last record, or at a first record
// preceded by control frames, stays in memory only. It returns entries
// itself when all qualify.
func fileEntries(entries []indexEntry, recordCount uint64) []indexEntry {
	ok := func(e indexEntry, prevRel uint32) bool {
		return e.relOffset > prevRel && uint64(e.relOffset) < recordCount
	}
	var prev uint32
	for i, e := range entries {
		if ok(e, prev) {
			prev = e.relOffset
			continue
		}
		out := append(make([]indexEntry, 0, len(entries)), entries[:i]...)
		for _, e := range entries[i:] {
			if ok(e, prev) {
				out = append(out, e)
				prev = e.relOffset
			}
		}
		return out
	}
	return entries
}

// appendOffsetIndex appends the offset index file image of entries to dst.
func appendOffsetIndex(dst []byte, entries []indexEntry) []byte {
	for _, e := range entries {
		dst = binary.LittleEndian.AppendUint32(dst, e.relOffset)
		dst = binary.LittleEndian.AppendUint32(dst, e.position)
	}
	return dst
}

// appendTimeIndex appends the time index file image of entries to dst.
func appendTimeIndex(dst []byte, entries []indexEntry) []byte {
	for _, e := range entries {
		dst = binary.LittleEndian.AppendUint64(dst, uint64(e.appendTimeUnixNanos))
		dst = binary.LittleEndian.AppendUint32(dst, e.relOffset)
	}
	return dst
}

// offsetEntry is one decoded offset index entry.
type offsetEntry struct {
	relOffset uint32
	position  uint32
}

// timeEntry is one decoded time index entry.
type timeEntry struct {
	appendTimeUnixNanos int64
	relOffset           uint32
}

// decodeOffsetIndex parses an offset index file of a segment whose log holds
// logBytes bytes and relative offsets [0, recordCount). It accepts only what
// Append could have written: whole entries, relOffset and position strictly
// increasing from above (0, 0) (the first frame is never indexed), every
// relOffset below recordCount and every position inside the log.
func decodeOffsetIndex(b []byte, logBytes int64, recordCount uint64) ([]offsetEntry, error) {
	if len(b)%offsetEntryBytes != 0 {
		return nil, fmt.Errorf("%w: %d bytes is not a multiple of %d", errIndexInvalid, len(b), offsetEntryBytes)
	}
	entries := make([]offsetEntry, len(b)/offsetEntryBytes)
	var prev offsetEntry
	for i := range entries {
		e := offsetEntry{
			relOffset: binary.LittleEndian.Uint32(b[i*offsetEntryBytes:]),
			position:  binary.LittleEndian.Uint32(b[i*offsetEntryBytes+4:]),
		}
		switch {
		case e.relOffset <= prev.relOffset || e.position <= prev.position:
			return nil, fmt.Errorf("%w: entry %d (%d, %d) does not increase", errIndexInvalid, i, e.relOffset, e.position)
		case uint64(e.relOffset) >= recordCount:
			return nil, fmt.Errorf("%w: entry %d offset %d past the segment's %d records", errIndexInvalid, i, e.relOffset, recordCount)
		case int64(e.position) >= logBytes:
			return nil, fmt.Errorf("%w: entry %d position %d past the log's %d bytes", errIndexInvalid, i, e.position, logBytes)
		}
		entries[i], prev = e, e
	}
	return entries, nil
}

// decodeTimeIndex parses a time index file of a segment holding relative
// offsets [0, recordCount): whole entries, append times non-decreasing,
// relOffsets strictly increasing from above 0 and below recordCount.
func decodeTimeIndex(b []byte, recordCount uint64) ([]timeEntry, error) {
	if len(b)%timeEntryBytes != 0 {
		return nil, fmt.Errorf("%w: %d bytes is not a multiple of %d", errIndexInvalid, len(b), timeEntryBytes)
	}
	entries := make([]timeEntry, len(b)/timeEntryBytes)
	for i := range entries {
		e := timeEntry{
			appendTimeUnixNanos: int64(binary.LittleEndian.Uint64(b[i*timeEntryBytes:])),
			relOffset:           binary.LittleEndian.Uint32(b[i*timeEntryBytes+8:]),
		}
		switch {
		case i > 0 && e.appendTimeUnixNanos < entries[i-1].appendTimeUnixNanos:
			return nil, fmt.Errorf("%w: entry %d time %d decreases", errIndexInvalid, i, e.appendTimeUnixNanos)
		case e.relOffset == 0 || (i > 0 && e.relOffset <= entries[i-1].relOffset):
			return nil, fmt.Errorf("%w: entry %d offset %d does not increase", errIndexInvalid, i, e.relOffset)
		case uint64(e.relOffset) >= recordCount:
			return nil, fmt.Errorf("%w: entry %d offset %d past the segment's %d records", errIndexInvalid, i, e.relOffset, recordCount)
		}
		entries[i] = e
	}
	return entries, nil
}

// indexFileProblem compares an index file with the image recovery computed
// from the log and returns why it must be rebuilt, or "" if it matches.
// decode explains what is wrong with a file of plausible size.
func indexFileProblem(fsys vfs.FS, path string, want []byte, decode func([]byte) error) (string, error) {
	f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return "missing", nil
	}
	if err != nil {
		return "", err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return "", err
	}
	if size > indexFileBytesMax {
		return fmt.Sprintf("%d bytes, more than %d", size, indexFileBytesMax), nil
	}
	got := make([]byte, size)
	if err := readFull(f, got, 0); err != nil {
		return "", err
	}
	if err := decode(got); err != nil {
		return err.Error(), nil
	}
	if string(got) != string(want) {
		return fmt.Sprintf("stale: %d bytes, want %d", len(got), len(want)), nil
	}
	return "", nil
}

// writeIndexFiles replaces both index files of g with the images of its
// entries, fsyncing them under FsyncAlways. Index files are a cache that
// recovery verifies against the log, so a crash in the middle of this is
// harmless. The caller is the appender, so g does not change meanwhile.
func (s *Store) writeIndexFiles(g *segment) error {
	entries := fileEntries(g.entries, g.nextOffset-g.baseOffset)
	sync := s.cfg.Fsync == FsyncAlways
	images := [2]struct {
		suffix string
		data   []byte
	}{
		{indexSuffix, appendOffsetIndex(make([]byte, 0, len(entries)*offsetEntryBytes), entries)},
		{timeIndexSuffix, appendTimeIndex(make([]byte, 0, len(entries)*timeEntryBytes), entries)},
	}
	for _, im := range images {
		if err := writeFile(s.fs, g.path(im.suffix), im.data, sync); err != nil {
			return err
		}
	}
	return nil
}

// writeFile replaces the file at path with data. Its fdatasync bypasses the
// store's test hook: the hook counts and fails syncs of the log only.
func writeFile(fsys vfs.FS, path string, data []byte, sync bool) error {
	f, err := fsys.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if len(data) > 0 {
		if _, err := f.WriteAt(data, 0); err != nil {
			f.Close()
			return err
		}
	}
	if sync {
		if err := f.Datasync(); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}
