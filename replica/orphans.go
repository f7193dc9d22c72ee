package replica

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/geolog/geolog/atrest"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
	"github.com/hashicorp/go-hclog"
)

// A range's orphan log: the records a fork moved out of the range's log
// (see fork.go), kept with their original offsets, epochs, producers and
// records, one file per fork, so that operators can list and re-publish
// them. Nothing in it is ever compacted or rewritten.
//
// On-disk layout, in the directory OrphanDirName of the range's directory
// (the segment store leaves names starting with "_" alone):
//
//	<fork index, 20 digits>.fork    one fork: its record (forkRecordBytes,
//	                                below), then the orphaned frames as they
//	                                lay in the log, back to back, dense in
//	                                offset from FirstOffset to NextOffset
//	<fork index, 20 digits>.fork.tmp  a fork being written; removed on open
//
// A fork's file is written whole under its temporary name, fsynced, renamed
// into place and the directory fsynced: a fork is in the store exactly when
// its file is, complete. Its record, little-endian:
//
//	off size field
//	0   4    magic "GLOR"
//	4   1    version: 1, or 2 on disk for a sealed fork (below)
//	5   8    Index          raft index of the fork entry
//	13  8    Term           its raft term
//	21  8    PrevIndex      the last entry the fork kept (0 if none, or for
//	                        a fork that orphaned nothing)
//	29  8    At             the fork offset: the log continues here
//	37  8    Epoch          the epoch the fork raised the range to
//	45  8    TimeUnixNanos  the last kept record's append time
//	53  8    Records        orphaned records: NextOffset - FirstOffset
//	61  8    Frames         orphaned frames
//	69  8    Bytes          bytes of the frames after the record
//	77  8    FirstOffset    first orphaned offset (NextOffset if none)
//	85  8    NextOffset     the log's tail before the fork
//	93  4    CRC-32C of bytes [0, 93)
//
// Encryption at rest: an orphan store opened with a keyring (WithKeyring)
// writes every fork sealed, version 2: the same record (metadata only:
// indexes, offsets, counts, as the segment store's index files hold), then
// one sealed unit per frame in place of the frame, in the segment store's
// unit format (package atrest; segment/seal.go), under the keyring's
// active data key. Bytes still counts the frames' own bytes, so the file
// holds Frames*atrest.Overhead bytes more. A unit that fails
// authentication is corruption (ErrOrphansCorrupt); a unit under a data
// key the keyring lacks, or a sealed fork without a keyring, is an
// atrest.ErrKeyUnavailable error, found when the store opens. A store
// reads forks of both versions; a fork's version never changes. Snapshots
// carry forks in the clear, version 1 (openFork presents a sealed fork
// so), over the TLS connection, and the receiver seals what it stores
// under its own key.
// OrphanDirName is the orphan store's directory inside a range's directory.
const OrphanDirName = "_orphans"

var (
	// ErrOrphansCorrupt reports an orphan store file that fails its checks:
	// the range must stop, as for a corrupt log.
	ErrOrphansCorrupt = errors.New("replica: orphan store is corrupt")
	// ErrForkNotFound reports a fork the orphan store does not hold.
	ErrForkNotFound = errors.New("replica: no such fork in the orphan store")
	// ErrOrphanRange reports an offset outside a fork's orphaned offsets.
	ErrOrphanRange = errors.New("replica: offset outside the fork's orphaned offsets")
)

const (
	forkRecordMagic   = "GLOR"
	forkRecordVersion = 1
	// forkRecordSealed is the version of a sealed fork's record on disk.
	forkRecordSealed = 2
	forkRecordBytes  = len(forkRecordMagic) + 1 + 11*8 + 4
	forkFileSuffix   = ".fork"
	forkTmpSuffix    = ".tmp"
	// orphanSparseBytes is the spacing of the in-memory positions a read
	// of a fork's frames seeks from.
	orphanSparseBytes = 64 << 10
)

// ForkRecord describes one fork: where the range's log forked and what it
// moved into the orphan log. The divergent tail was [At, NextOffset);
// Records of it, [FirstOffset, NextOffset), are in the orphan log. Records
// < NextOffset-At only where retention had deleted part of the tail on this
// replica before the fork.
type ForkRecord struct {
	// Index and Term are the fork entry's Raft index and term.
	Index uint64 `json:"index"`
	Term  uint64 `json:"term"`
	// PrevIndex is the last entry the fork kept: the log's entries between
	// it and Index were the divergent tail (and the Raft entries among it).
	// 0 if the fork kept none or orphaned nothing.
	PrevIndex uint64 `json:"prev_index"`
	// At is the fork offset, where the log continues.
	At uint64 `json:"at"`
	// Epoch is the epoch the fork raised the range to.
	Epoch uint64 `json:"epoch"`
	// TimeUnixNanos is the append time of the last record kept before the
	// fork (the fork frame's: the log's newest append time after it).
	TimeUnixNanos int64 `json:"time_unix_nanos"`
	// Records, Frames and Bytes count what was orphaned.
	Records uint64 `json:"records"`
	Frames  uint64 `json:"frames"`
	Bytes   uint64 `json:"bytes"`
	// FirstOffset and NextOffset bound the orphaned records: the last one
	// is NextOffset-1. Both are the log's tail before the fork when
	// nothing was orphaned.
	FirstOffset uint64 `json:"first_offset"`
	NextOffset  uint64 `json:"next_offset"`
}

// encode: see the layout above; version 1, as snapshots carry it.
func (f ForkRecord) encode() []byte { return f.encodeVersion(forkRecordVersion) }

func (f ForkRecord) encodeVersion(version byte) []byte {
	b := make([]byte, 0, forkRecordBytes)
	b = append(b, forkRecordMagic...)
	b = append(b, version)
	for _, v := range []uint64{f.Index, f.Term, f.PrevIndex, f.At, f.Epoch, uint64(f.TimeUnixNanos),
		f.Records, f.Frames, f.Bytes, f.FirstOffset, f.NextOffset} {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// decodeForkRecord decodes and checks a fork record of version 1 (as a
// snapshot carries it); errors wrap ErrOrphansCorrupt.
func decodeForkRecord(b []byte) (ForkRecord, error) {
	f, sealed, err := decodeForkFileRecord(b)
	if err == nil && sealed {
		err = fmt.Errorf("%w: a sealed fork's record (version %d) where a clear one belongs", ErrOrphansCorrupt, forkRecordSealed)
	}
	return f, err
}

// decodeForkFileRecord decodes and checks a fork record as a fork's file
// holds it: version 1, or 2 for a sealed fork (sealed true).
func decodeForkFileRecord(b []byte) (ForkRecord, bool, error) {
	f, v, err := decodeForkRecordVersion(b)
	return f, v == forkRecordSealed, err
}

func decodeForkRecordVersion(b []byte) (ForkRecord, byte, error) {
	if len(b) != forkRecordBytes || string(b[:len(forkRecordMagic)]) != forkRecordMagic {
		return ForkRecord{}, 0, fmt.Errorf("%w: fork record of %d bytes is not one", ErrOrphansCorrupt, len(b))
	}
	if binary.LittleEndian.Uint32(b[len(b)-4:]) != crc32.Checksum(b[:len(b)-4], castagnoli) {
		return ForkRecord{}, 0, fmt.Errorf("%w: fork record fails its checksum", ErrOrphansCorrupt)
	}
	v := b[len(forkRecordMagic)]
	if v != forkRecordVersion && v != forkRecordSealed {
		return ForkRecord{}, 0, fmt.Errorf("%w: fork record version %d, want %d or %d", ErrOrphansCorrupt, v, forkRecordVersion, forkRecordSealed)
	}
	u := func(i int) uint64 { return binary.LittleEndian.Uint64(b[len(forkRecordMagic)+1+8*i:]) }
	f := ForkRecord{Index: u(0), Term: u(1), PrevIndex: u(2), At: u(3), Epoch: u(4), TimeUnixNanos: int64(u(5)),
		Records: u(6), Frames: u(7), Bytes: u(8), FirstOffset: u(9), NextOffset: u(10)}
	if err := f.check(); err != nil {
		return ForkRecord{}, 0, err
	}
	return f, v, nil
}

// fileBytes is the size of the fork's file: its record and its frames,
// each as a sealed unit if sealed.
func (f ForkRecord) fileBytes(sealed bool) int64 {
	n := int64(forkRecordBytes) + int64(f.Bytes)
	if sealed {
		n += int64(f.Frames) * atrest.Overhead
	}
	return n
}

// check holds the record's fields against each other.
func (f ForkRecord) check() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: fork record at index %d: "+format, append([]any{ErrOrphansCorrupt, f.Index}, args...)...)
	}
	switch {
	case f.Index == 0 || f.Epoch == 0:
		return bad("epoch %d", f.Epoch)
	case f.PrevIndex >= f.Index:
		return bad("kept index %d", f.PrevIndex)
	case f.At > f.FirstOffset || f.FirstOffset > f.NextOffset || f.Records != f.NextOffset-f.FirstOffset:
		return bad("%d records in [%d, %d) after offset %d", f.Records, f.FirstOffset, f.NextOffset, f.At)
	case (f.Records == 0) != (f.Frames == 0) || (f.Frames == 0) != (f.Bytes == 0) || f.Frames > f.Records:
		return bad("%d records in %d frames of %d bytes", f.Records, f.Frames, f.Bytes)
	case f.Bytes/batch.HeaderSize < f.Frames || f.Bytes > 1<<62:
		return bad("%d frames in %d bytes", f.Frames, f.Bytes)
	}
	return nil
}

// OrphanStore is a range's orphan log (see above). It is safe for use from
// any goroutines: the range's driver writes the forks it applies, the
// transport's goroutine those a snapshot brings, and readers list and read
// them.
type OrphanStore struct {
	fs     vfs.FS
	dir    string
	logger hclog.Logger
	// keyring seals the forks written and opens sealed ones; nil: forks
	// are written in the clear (see the layout above).
	keyring *atrest.Keyring

	// writeMu serialises writers: a fork is written by one at a time, and
	// a second writer of the same fork finds it written.
	writeMu sync.Mutex

	mu    sync.RWMutex // guards the fields below
	forks []ForkRecord // by index
	// epochMax is the highest epoch of the forks (maxEpoch: read on
	// every append, without the lock); forks are only ever added.
	epochMax atomic.Uint64
	sealed   map[uint64]bool // the forks whose files are sealed, by index
	// keys holds the data key of each fork's first unit (0: a fork in
	// the clear, or without frames); gens counts the replacements of each
	// fork's file (Reseal), so that positions read from one file are never
	// used on another.
	keys   map[uint64]atrest.KeyID
	gens   map[uint64]uint64
	sparse map[uint64]sparsePos
}

// sparsePos are the positions of one file of a fork (generation gen).
type sparsePos struct {
	gen uint64
	ps  []orphanPos
}

// OrphanOption configures OpenOrphans.
type OrphanOption func(*OrphanStore)

// WithKeyring seals the forks the store writes under k's active data key
// and opens sealed forks with k (encryption at rest). Default nil: forks
// are written in the clear, and a sealed fork refuses to open.
func WithKeyring(k *atrest.Keyring) OrphanOption {
	return func(o *OrphanStore) { o.keyring = k }
}

// orphanPos is a frame of a fork's file: its base offset and position (of
// its unit, in a sealed fork).
type orphanPos struct {
	offset uint64
	pos    int64
}

// OpenOrphans opens the orphan store in dir (created, durably, if missing):
// it removes forks whose writing a crash interrupted and checks every
// fork's record and file size. The frames themselves are verified (CRC and
// sequence, and authentication of sealed ones) as they are read; a sealed
// fork's first unit must name a data key the keyring holds, or OpenOrphans
// fails with an error wrapping atrest.ErrKeyUnavailable. Errors about the
// files wrap ErrOrphansCorrupt.
func OpenOrphans(fsys vfs.FS, dir string, logger hclog.Logger, opts ...OrphanOption) (*OrphanStore, error) {
	if fsys == nil {
		fsys = vfs.OS()
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	o := &OrphanStore{fs: fsys, dir: dir, logger: logger.Named("orphans").With("dir", dir),
		sealed: map[uint64]bool{}, keys: map[uint64]atrest.KeyID{}, gens: map[uint64]uint64{}, sparse: map[uint64]sparsePos{}}
	for _, opt := range opts {
		opt(o)
	}
	if err := vfs.EnsureDir(fsys, dir); err != nil {
		return nil, fmt.Errorf("replica: create orphan store %s: %w", dir, err)
	}
	ents, err := fsys.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("replica: list orphan store: %w", err)
	}
	removed := 0
	for _, de := range ents {
		name := de.Name()
		switch {
		case strings.HasSuffix(name, forkTmpSuffix):
			if err := fsys.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("replica: remove unfinished fork %s: %w", name, err)
			}
			removed++
		case strings.HasSuffix(name, forkFileSuffix):
			rec, sealed, key, err := o.load(name)
			if err != nil {
				return nil, err
			}
			o.forks = append(o.forks, rec)
			o.noteEpoch(rec.Epoch)
			o.sealed[rec.Index], o.keys[rec.Index] = sealed, key
		default:
			o.logger.Warn("ignoring unexpected file", "name", name)
		}
	}
	if removed > 0 {
		if err := fsys.SyncDir(dir); err != nil {
			return nil, fmt.Errorf("replica: sync orphan store: %w", err)
		}
		o.logger.Info("removed unfinished forks", "files", removed)
	}
	slices.SortFunc(o.forks, func(a, b ForkRecord) int { return cmpUint64(a.Index, b.Index) })
	return o, nil
}

func cmpUint64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func forkFileName(index uint64) string { return fmt.Sprintf("%020d%s", index, forkFileSuffix) }

// load reads and checks the record of the fork file name, and for a
// sealed fork the key of its first unit.
func (o *OrphanStore) load(name string) (ForkRecord, bool, atrest.KeyID, error) {
	f, err := o.fs.OpenFile(filepath.Join(o.dir, name), os.O_RDONLY, 0)
	if err != nil {
		return ForkRecord{}, false, 0, fmt.Errorf("replica: open %s: %w", name, err)
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return ForkRecord{}, false, 0, fmt.Errorf("replica: stat %s: %w", name, err)
	}
	b := make([]byte, forkRecordBytes)
	if size < int64(len(b)) {
		return ForkRecord{}, false, 0, fmt.Errorf("%w: %s holds %d bytes", ErrOrphansCorrupt, name, size)
	}
	if _, err := f.ReadAt(b, 0); err != nil {
		return ForkRecord{}, false, 0, fmt.Errorf("replica: read %s: %w", name, err)
	}
	rec, sealed, err := decodeForkFileRecord(b)
	if err != nil {
		return ForkRecord{}, false, 0, fmt.Errorf("%s: %w", name, err)
	}
	if name != forkFileName(rec.Index) {
		return ForkRecord{}, false, 0, fmt.Errorf("%w: %s holds the fork at index %d", ErrOrphansCorrupt, name, rec.Index)
	}
	if size != rec.fileBytes(sealed) {
		return ForkRecord{}, false, 0, fmt.Errorf("%w: %s holds %d bytes, its record says %d", ErrOrphansCorrupt, name, size, rec.fileBytes(sealed))
	}
	var key atrest.KeyID
	if sealed && rec.Frames > 0 {
		if key, err = o.checkFirstKey(f, name); err != nil {
			return ForkRecord{}, false, 0, err
		}
	}
	return rec, sealed, key, nil
}

// checkFirstKey checks that the keyring holds the data key of the sealed
// fork's first unit: a node never serves a fork it cannot open (the
// segment store refuses to open a log so, too).
func (o *OrphanStore) checkFirstKey(f vfs.File, name string) (atrest.KeyID, error) {
	h := make([]byte, atrest.HeaderBytes)
	if _, err := f.ReadAt(h, int64(forkRecordBytes)); err != nil {
		return 0, fmt.Errorf("replica: read %s: %w", name, err)
	}
	_, id, err := atrest.CheckHeader(h)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%w: %s: first unit: %w", ErrOrphansCorrupt, name, err)
	case id == 0:
		return 0, fmt.Errorf("%w: %s: a sealed fork's first unit is a plain frame", ErrOrphansCorrupt, name)
	case o.keyring == nil:
		return 0, fmt.Errorf("replica: orphan fork %s: %w", name, &atrest.KeyError{ID: id, NoKeyring: true})
	case !o.keyring.Has(id):
		return 0, fmt.Errorf("replica: orphan fork %s: %w", name, &atrest.KeyError{ID: id})
	}
	return id, nil
}

// ForkFileKeys counts the frames of the fork file at path by the data key
// that seals them (0: in the clear), from the record and the units'
// headers: what an offline tool checks before a data key is retired.
// Errors about the file wrap ErrOrphansCorrupt.
func ForkFileKeys(fsys vfs.FS, path string) (map[atrest.KeyID]int, error) {
	f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, forkRecordBytes)
	if _, err := f.ReadAt(b, 0); err != nil {
		return nil, fmt.Errorf("%w: %s: record: %w", ErrOrphansCorrupt, path, err)
	}
	rec, sealed, err := decodeForkFileRecord(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := map[atrest.KeyID]int{}
	if !sealed {
		if rec.Frames > 0 {
			out[0] = int(rec.Frames)
		}
		return out, nil
	}
	h := make([]byte, atrest.HeaderBytes)
	pos := int64(forkRecordBytes)
	for i := uint64(0); i < rec.Frames; i++ {
		if _, err := f.ReadAt(h, pos); err != nil {
			return nil, fmt.Errorf("%w: %s: unit %d: %w", ErrOrphansCorrupt, path, i, err)
		}
		n, id, err := atrest.CheckHeader(h)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: unit %d: %w", ErrOrphansCorrupt, path, i, err)
		}
		out[id]++
		pos += int64(n)
	}
	return out, nil
}

// Forks returns the forks held, oldest first. The caller owns the slice.
func (o *OrphanStore) Forks() []ForkRecord {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return slices.Clone(o.forks)
}

// Fork returns the fork at Raft index index, if held.
func (o *OrphanStore) Fork(index uint64) (ForkRecord, bool) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	i, ok := slices.BinarySearchFunc(o.forks, index, func(f ForkRecord, index uint64) int { return cmpUint64(f.Index, index) })
	if !ok {
		return ForkRecord{}, false
	}
	return o.forks[i], true
}

// maxEpoch is the highest epoch a fork raised the range to, 0 if none.
func (o *OrphanStore) maxEpoch() uint64 { return o.epochMax.Load() }

// MaxEpoch is the highest epoch of the forks the store holds, 0 if none:
// no fork of Forks is of a higher one. Safe from any goroutine.
func (o *OrphanStore) MaxEpoch() uint64 { return o.maxEpoch() }

// noteEpoch raises epochMax to a fork's epoch e (under mu).
func (o *OrphanStore) noteEpoch(e uint64) {
	if e > o.epochMax.Load() {
		o.epochMax.Store(e)
	}
}

// frameSource hands the frames of a fork being written to emit, in order;
// an error from emit must be returned.
type frameSource func(emit func(frame []byte) error) error

// writeFork stores the fork rec with the frames src yields (nil: none) and
// returns its record, counts filled in, and true; if the store holds the
// fork at rec.Index already, it returns that one and false, and reads
// nothing. Each frame is verified (CRC and structure, a data frame, dense
// offsets from rec.FirstOffset) before it is written, and with want set
// the record must come out as *want; the fork is durable when writeFork
// returns.
func (o *OrphanStore) writeFork(rec ForkRecord, src frameSource, want *ForkRecord) (ForkRecord, bool, error) {
	o.writeMu.Lock()
	defer o.writeMu.Unlock()
	if held, ok := o.Fork(rec.Index); ok {
		return held, false, nil
	}
	p, err := o.stage(rec, src, want, forkTmpSuffix)
	if err != nil {
		return ForkRecord{}, false, err
	}
	if err := o.commitLocked(p); err != nil {
		return ForkRecord{}, false, err
	}
	return p.rec, true, nil
}

// pendingFork is a fork written, whole and durable, under a temporary
// name: not in the store until committed.
type pendingFork struct {
	rec    ForkRecord
	tmp    string
	sealed bool
	key    atrest.KeyID // of its first unit
}

// snapTmpSuffix names the forks a snapshot brings until it is received
// whole (one snapshot is received at a time; the driver's writes use
// forkTmpSuffix).
const snapTmpSuffix = ".snap" + forkTmpSuffix

// stage writes the fork rec with the frames src yields to its temporary
// file (the name's suffix) and makes it durable; see writeFork. With a
// keyring, each frame is written as its sealed unit and the record as a
// sealed fork's. On error nothing is left behind.
func (o *OrphanStore) stage(rec ForkRecord, src frameSource, want *ForkRecord, suffix string) (*pendingFork, error) {
	tmp := filepath.Join(o.dir, forkFileName(rec.Index)+suffix)
	f, err := o.fs.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("replica: create %s: %w", tmp, err)
	}
	done := false
	defer func() {
		if !done {
			f.Close()
			o.remove(tmp)
		}
	}()
	rec.Records, rec.Frames, rec.Bytes = 0, 0, 0
	next := rec.FirstOffset
	pos := int64(forkRecordBytes)
	var scratch []byte
	var firstKey atrest.KeyID
	if src != nil {
		err := src(func(frame []byte) error {
			h, err := batch.Validate(frame)
			switch {
			case err != nil:
				return fmt.Errorf("replica: orphaned frame at offset %d: %w", next, err)
			case h.Type != batch.TypeData || h.BaseOffset != next:
				return fmt.Errorf("replica: orphaned frame is a %v frame at offset %d, want a data frame at %d", h.Type, h.BaseOffset, next)
			}
			unit := frame
			if o.keyring != nil {
				scratch = o.keyring.Seal(scratch[:0], frame)
				unit = scratch
				if rec.Frames == 0 {
					firstKey = atrest.UnitKey(unit)
				}
			}
			if _, err := f.WriteAt(unit, pos); err != nil {
				return fmt.Errorf("replica: write %s: %w", tmp, err)
			}
			pos += int64(len(unit))
			next = h.NextOffset()
			rec.Frames++
			rec.Bytes += uint64(len(frame))
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	if rec.Frames == 0 {
		rec.FirstOffset = rec.NextOffset
	} else if next != rec.NextOffset {
		return nil, fmt.Errorf("replica: orphaned frames end at offset %d, the tail was at %d", next, rec.NextOffset)
	}
	rec.Records = rec.NextOffset - rec.FirstOffset
	if err := rec.check(); err != nil {
		return nil, fmt.Errorf("replica: fork to write: %w", err)
	}
	if want != nil && rec != *want {
		return nil, fmt.Errorf("replica: fork %d holds %d records in %d frames of %d bytes from offset %d, its record says %d in %d of %d from %d",
			rec.Index, rec.Records, rec.Frames, rec.Bytes, rec.FirstOffset, want.Records, want.Frames, want.Bytes, want.FirstOffset)
	}
	version := byte(forkRecordVersion)
	if o.keyring != nil {
		version = forkRecordSealed
	}
	if _, err := f.WriteAt(rec.encodeVersion(version), 0); err != nil {
		return nil, fmt.Errorf("replica: write %s: %w", tmp, err)
	}
	if err := f.Datasync(); err != nil {
		return nil, fmt.Errorf("replica: sync %s: %w", tmp, err)
	}
	done = true
	if err := f.Close(); err != nil {
		o.remove(tmp)
		return nil, fmt.Errorf("replica: close %s: %w", tmp, err)
	}
	return &pendingFork{rec: rec, tmp: tmp, sealed: o.keyring != nil, key: firstKey}, nil
}

// commitLocked moves a staged fork into the store (rename, directory
// fsync), or drops it if the store holds that fork by now. The caller
// holds writeMu.
func (o *OrphanStore) commitLocked(p *pendingFork) error {
	if _, ok := o.Fork(p.rec.Index); ok {
		o.remove(p.tmp)
		return nil
	}
	if err := o.fs.Rename(p.tmp, filepath.Join(o.dir, forkFileName(p.rec.Index))); err != nil {
		return fmt.Errorf("replica: rename %s: %w", p.tmp, err)
	}
	if err := o.fs.SyncDir(o.dir); err != nil {
		return fmt.Errorf("replica: sync orphan store: %w", err)
	}
	o.mu.Lock()
	i, _ := slices.BinarySearchFunc(o.forks, p.rec.Index, func(f ForkRecord, index uint64) int { return cmpUint64(f.Index, index) })
	o.forks = slices.Insert(o.forks, i, p.rec)
	o.noteEpoch(p.rec.Epoch)
	o.sealed[p.rec.Index], o.keys[p.rec.Index] = p.sealed, p.key
	o.mu.Unlock()
	rec := p.rec
	o.logger.Info("stored fork", "index", rec.Index, "at", rec.At, "epoch", rec.Epoch, "records", rec.Records,
		"first_offset", rec.FirstOffset, "next_offset", rec.NextOffset, "bytes", rec.Bytes, "sealed", p.sealed)
	return nil
}

// commit moves staged forks into the store; see commitLocked.
func (o *OrphanStore) commit(ps []*pendingFork) error {
	o.writeMu.Lock()
	defer o.writeMu.Unlock()
	for _, p := range ps {
		if err := o.commitLocked(p); err != nil {
			return err
		}
	}
	return nil
}

// discard removes staged forks that will not be committed.
func (o *OrphanStore) discard(ps []*pendingFork) {
	for _, p := range ps {
		o.remove(p.tmp)
	}
}

// remove removes a temporary file, best effort: opening removes leftovers.
func (o *OrphanStore) remove(tmp string) {
	if err := o.fs.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		o.logger.Warn("could not remove an unfinished fork", "name", tmp, "error", err)
	}
}

// forkFile is a fork's file as openFork presents it.
type forkFile interface {
	io.ReaderAt
	io.Closer
}

// openFork opens the fork at index for reading as a snapshot carries it,
// and returns it with its record: its record (version 1) and its frames in
// the clear, rec.Bytes after the record; a sealed fork's units are opened
// as they are read (see clearFork).
func (o *OrphanStore) openFork(index uint64) (forkFile, ForkRecord, error) {
	f, rec, sealed, _, err := o.openForkFile(index)
	if err != nil || !sealed {
		return f, rec, err
	}
	return &clearFork{o: o, f: f, rec: rec, head: rec.encode()}, rec, nil
}

// openForkFile opens the file of the fork at index for reading and returns
// it with its record, whether it is sealed and its generation. The file is
// opened under mu, so that what is returned describes the file opened
// even while Reseal replaces it (a reader keeps the file it opened).
func (o *OrphanStore) openForkFile(index uint64) (vfs.File, ForkRecord, bool, uint64, error) {
	rec, ok := o.Fork(index)
	if !ok {
		return nil, ForkRecord{}, false, 0, fmt.Errorf("%w: index %d", ErrForkNotFound, index)
	}
	o.mu.RLock()
	defer o.mu.RUnlock()
	sealed, gen := o.sealed[index], o.gens[index]
	f, err := o.fs.OpenFile(filepath.Join(o.dir, forkFileName(index)), os.O_RDONLY, 0)
	if err != nil {
		return nil, ForkRecord{}, false, 0, fmt.Errorf("replica: open fork %d: %w", index, err)
	}
	return f, rec, sealed, gen, nil
}

// clearFork presents a sealed fork's file in the clear: its record of
// version 1, then its frames, each opened from its unit when read. Reads
// are expected in order (a snapshot streams the fork through an
// io.SectionReader); a read behind the frame in hand starts over from the
// first unit. It holds one frame in memory.
type clearFork struct {
	o    *OrphanStore
	f    vfs.File
	rec  ForkRecord
	head []byte

	mu       sync.Mutex
	r        *forkReader // nil: before the first frame
	framePos int64       // the clear position of frame
	frame    []byte
}

func (c *clearFork) Close() error { return c.f.Close() }

// ReadAt implements io.ReaderAt over the clear view.
func (c *clearFork) ReadAt(p []byte, off int64) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	end := int64(forkRecordBytes) + int64(c.rec.Bytes)
	n := 0
	for n < len(p) {
		at := off + int64(n)
		switch {
		case at >= end:
			return n, io.EOF
		case at < int64(len(c.head)):
			n += copy(p[n:], c.head[at:])
			continue
		}
		if c.r == nil || at < c.framePos {
			c.r = c.o.newForkReader(io.NewSectionReader(c.f, int64(forkRecordBytes), c.rec.fileBytes(true)-int64(forkRecordBytes)), true)
			c.framePos, c.frame = int64(forkRecordBytes), nil
		}
		for at >= c.framePos+int64(len(c.frame)) {
			c.framePos += int64(len(c.frame))
			frame, _, err := c.r.next()
			if err != nil {
				c.r = nil
				return n, c.o.frameError(c.rec.Index, err)
			}
			c.frame = frame
		}
		n += copy(p[n:], c.frame[at-c.framePos:])
	}
	return n, nil
}

// forkReader reads a fork's frames from its file, opening sealed units.
type forkReader struct {
	fr      frameReader
	r       io.Reader
	keyring *atrest.Keyring
	sealed  bool
	buf     []byte
}

func (o *OrphanStore) newForkReader(r io.Reader, sealed bool) *forkReader {
	return &forkReader{fr: frameReader{r: r}, r: r, keyring: o.keyring, sealed: sealed}
}

// next returns the next frame, valid until the next call, and the bytes
// it took in the file. A sealed unit is authenticated and must hold
// exactly one frame; the frame's header and CRC are the caller's to check
// (batch.DecodeHeader), as for a plain one.
func (fr *forkReader) next() ([]byte, int, error) {
	if !fr.sealed {
		frame, err := fr.fr.next()
		return frame, len(frame), err
	}
	var lb [4]byte
	if _, err := io.ReadFull(fr.r, lb[:]); err != nil {
		return nil, 0, err
	}
	n, err := atrest.UnitSize(lb[:])
	if err != nil {
		return nil, 0, err
	}
	if cap(fr.buf) < n {
		fr.buf = make([]byte, n)
	}
	fr.buf = fr.buf[:n]
	copy(fr.buf, lb[:])
	if _, err := io.ReadFull(fr.r, fr.buf[4:]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, 0, err
	}
	if !atrest.Sealed(fr.buf) {
		return nil, 0, errors.New("a plain frame in a sealed fork")
	}
	frame, err := atrest.OpenInPlace(fr.keyring, fr.buf)
	if err != nil {
		return nil, 0, err
	}
	if size, err := batch.FrameSize(frame); err != nil || size != len(frame) {
		return nil, 0, fmt.Errorf("%w: a sealed unit does not hold exactly one frame", batch.ErrCorrupt)
	}
	return frame, n, nil
}

// frameError is the error of a fork's frame that could not be read: a
// missing data key is that (atrest.ErrKeyUnavailable), anything else
// corruption.
func (o *OrphanStore) frameError(index uint64, err error) error {
	if errors.Is(err, atrest.ErrKeyUnavailable) {
		return fmt.Errorf("replica: fork %d: %w", index, err)
	}
	return fmt.Errorf("%w: fork %d: %w", ErrOrphansCorrupt, index, err)
}

// ReadFrames returns the orphaned data frames of the fork at Raft index
// index, whole and verified (CRC, dense offsets), starting with the one
// holding offset from, about maxBytes in all but at least one: the frames
// as they lay in the log (original offsets, epochs, producers, records and
// Raft term and index). from == the fork's NextOffset returns nil, nil; an
// offset outside [FirstOffset, NextOffset] returns ErrOrphanRange, an
// unknown fork ErrForkNotFound, a frame failing verification
// ErrOrphansCorrupt. The caller owns the slice. Safe from any goroutine.
func (o *OrphanStore) ReadFrames(index, from uint64, maxBytes int) ([]byte, error) {
	f, rec, sealed, gen, err := o.openForkFile(index)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if from < rec.FirstOffset || from > rec.NextOffset {
		return nil, fmt.Errorf("%w: offset %d, fork %d orphaned [%d, %d)", ErrOrphanRange, from, index, rec.FirstOffset, rec.NextOffset)
	}
	if from == rec.NextOffset {
		return nil, nil
	}
	start, err := o.seek(f, rec, sealed, gen, from)
	if err != nil {
		return nil, err
	}
	fr := o.newForkReader(io.NewSectionReader(f, start.pos, rec.fileBytes(sealed)-start.pos), sealed)
	var out []byte
	next := start.offset
	for next < rec.NextOffset {
		frame, _, err := fr.next()
		if err != nil {
			return nil, o.frameError(index, fmt.Errorf("at offset %d: %w", next, err))
		}
		h, err := batch.DecodeHeader(frame)
		if err == nil && (h.Type != batch.TypeData || h.BaseOffset != next) {
			err = fmt.Errorf("a %v frame at offset %d", h.Type, h.BaseOffset)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: fork %d at offset %d: %w", ErrOrphansCorrupt, index, next, err)
		}
		next = h.NextOffset()
		if next <= from {
			continue
		}
		if len(out) > 0 && len(out)+len(frame) > maxBytes {
			break
		}
		out = append(out, frame...)
	}
	return out, nil
}

// seek returns a frame of the fork's file at or before the one holding
// from, from positions kept in memory every orphanSparseBytes (built by
// the first read of the fork, which verifies every frame).
func (o *OrphanStore) seek(f vfs.File, rec ForkRecord, sealed bool, gen, from uint64) (orphanPos, error) {
	o.mu.RLock()
	sp, ok := o.sparse[rec.Index]
	o.mu.RUnlock()
	ps := sp.ps
	if !ok || sp.gen != gen {
		ps = nil
		fileEnd := rec.fileBytes(sealed)
		fr := o.newForkReader(io.NewSectionReader(f, int64(forkRecordBytes), fileEnd-int64(forkRecordBytes)), sealed)
		pos, next, last := int64(forkRecordBytes), rec.FirstOffset, int64(-orphanSparseBytes)
		for i := uint64(0); i < rec.Frames; i++ {
			frame, unitBytes, err := fr.next()
			if err != nil {
				return orphanPos{}, o.frameError(rec.Index, fmt.Errorf("frame %d: %w", i, err))
			}
			h, err := batch.DecodeHeader(frame)
			if err == nil && (h.Type != batch.TypeData || h.BaseOffset != next) {
				err = fmt.Errorf("a %v frame at offset %d, want a data frame at %d", h.Type, h.BaseOffset, next)
			}
			if err != nil {
				return orphanPos{}, fmt.Errorf("%w: fork %d frame %d: %w", ErrOrphansCorrupt, rec.Index, i, err)
			}
			if pos-last >= orphanSparseBytes {
				ps = append(ps, orphanPos{offset: h.BaseOffset, pos: pos})
				last = pos
			}
			pos += int64(unitBytes)
			next = h.NextOffset()
		}
		if next != rec.NextOffset || pos != fileEnd {
			return orphanPos{}, fmt.Errorf("%w: fork %d: frames end at offset %d, position %d", ErrOrphansCorrupt, rec.Index, next, pos)
		}
		o.mu.Lock()
		if o.gens[rec.Index] == gen {
			o.sparse[rec.Index] = sparsePos{gen: gen, ps: ps}
		}
		o.mu.Unlock()
	}
	i, _ := slices.BinarySearchFunc(ps, from+1, func(p orphanPos, off uint64) int { return cmpUint64(p.offset, off) })
	if i == 0 {
		return orphanPos{offset: rec.FirstOffset, pos: int64(forkRecordBytes)}, nil
	}
	return ps[i-1], nil
}

// bytesUpTo is the size of the files of the forks at or below index, as a
// snapshot at index carries them, and the forks.
func (o *OrphanStore) bytesUpTo(index uint64) (uint64, []ForkRecord) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	var n uint64
	var out []ForkRecord
	for _, f := range o.forks {
		if f.Index <= index {
			n += uint64(forkRecordBytes) + f.Bytes
			out = append(out, f)
		}
	}
	return n, out
}

// receiveFork reads one fork's file, as a snapshot body carries it, from r
// and stages it (commit makes it part of the store) unless the store holds
// it already: then its frames are read and checked all the same, this
// replica's copy stays, and the pending fork is nil. The frames must be
// what the record counts, and nothing may follow them within the file. It
// returns the bytes read.
func (o *OrphanStore) receiveFork(r io.Reader) (*pendingFork, uint64, error) {
	b := make([]byte, forkRecordBytes)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, 0, fmt.Errorf("fork record: %w", err)
	}
	rec, err := decodeForkRecord(b)
	if err != nil {
		return nil, 0, err
	}
	size := uint64(forkRecordBytes) + rec.Bytes
	fr := frameReader{r: io.LimitReader(r, int64(rec.Bytes))}
	src := func(emit func([]byte) error) error {
		for i := uint64(0); i < rec.Frames; i++ {
			frame, err := fr.next()
			if err != nil {
				return fmt.Errorf("fork %d frame %d of %d: %w", rec.Index, i+1, rec.Frames, err)
			}
			if err := emit(frame); err != nil {
				return err
			}
		}
		if err := fr.end(); err != nil {
			return fmt.Errorf("fork %d: after its frames: %w", rec.Index, err)
		}
		return nil
	}
	held, ok := o.Fork(rec.Index)
	if !ok {
		p, err := o.stage(rec, src, &rec, snapTmpSuffix)
		return p, size, err
	}
	// This replica applied the fork itself: read past the sender's copy,
	// checking it.
	if err := src(func(frame []byte) error {
		_, err := batch.Validate(frame)
		return err
	}); err != nil {
		return nil, 0, err
	}
	if held.At != rec.At || held.Epoch != rec.Epoch || held.NextOffset != rec.NextOffset {
		return nil, 0, fmt.Errorf("fork %d: received at offset %d epoch %d, holds at %d epoch %d", rec.Index, rec.At, rec.Epoch, held.At, held.Epoch)
	}
	if held.Records != rec.Records {
		o.logger.Warn("kept this replica's copy of a fork that a snapshot carried too", "index", rec.Index,
			"records_held", held.Records, "records_received", rec.Records)
	}
	return nil, size, nil
}

// resealTmpSuffix names a fork being re-encrypted (Reseal) until it
// replaces the fork's file; opening removes leftovers as it removes any
// forkTmpSuffix file.
const resealTmpSuffix = ".reseal" + forkTmpSuffix

// ResealPending returns the indexes of the forks holding frames not
// sealed under the keyring's active data key (in the clear, or under an
// older key), oldest first: what Reseal rewrites after a rotation. A fork's
// units are all under one key, the one active when it was written. nil
// without a keyring. Safe from any goroutine.
func (o *OrphanStore) ResealPending() []uint64 {
	if o.keyring == nil {
		return nil
	}
	active := o.keyring.Active()
	o.mu.RLock()
	defer o.mu.RUnlock()
	var out []uint64
	for _, f := range o.forks {
		if f.Frames > 0 && (!o.sealed[f.Index] || o.keys[f.Index] != active) {
			out = append(out, f.Index)
		}
	}
	return out
}

// Reseal rewrites the fork at index with the same frames sealed under the
// keyring's active data key, so that older keys can be retired: it
// writes and fsyncs a new file under a temporary name (verifying every
// frame as writeFork does), renames it over the fork's file and fsyncs
// the directory, so that a crash leaves the old file or the new, whole.
// Readers that opened the old file finish on it. throttle, if set, is
// called with the bytes of each frame read and written before the write;
// an ended ctx stops the rewrite at the next frame with its error and
// nothing replaced. Safe from any goroutine (it takes the writers' lock).
func (o *OrphanStore) Reseal(ctx context.Context, index uint64, throttle func(bytes int)) error {
	if o.keyring == nil {
		return errors.New("replica: reseal of an orphan store without a keyring")
	}
	o.writeMu.Lock()
	defer o.writeMu.Unlock()
	f, rec, sealed, _, err := o.openForkFile(index)
	if err != nil {
		return err
	}
	defer f.Close()
	fr := o.newForkReader(io.NewSectionReader(f, int64(forkRecordBytes), rec.fileBytes(sealed)-int64(forkRecordBytes)), sealed)
	src := func(emit func([]byte) error) error {
		for i := uint64(0); i < rec.Frames; i++ {
			if err := ctx.Err(); err != nil {
				return err
			}
			frame, n, err := fr.next()
			if err != nil {
				return o.frameError(index, fmt.Errorf("frame %d: %w", i, err))
			}
			if throttle != nil {
				throttle(n + len(frame) + atrest.Overhead)
			}
			if err := emit(frame); err != nil {
				return err
			}
		}
		return nil
	}
	p, err := o.stage(rec, src, &rec, resealTmpSuffix)
	if err != nil {
		return err
	}
	// The rename and the new file's description change together under mu,
	// where openForkFile opens: a reader gets the old file with the old
	// description or the new with the new.
	o.mu.Lock()
	err = o.fs.Rename(p.tmp, filepath.Join(o.dir, forkFileName(index)))
	if err == nil {
		o.sealed[index], o.keys[index] = true, p.key
		o.gens[index]++
		delete(o.sparse, index)
	}
	o.mu.Unlock()
	if err != nil {
		o.remove(p.tmp)
		return fmt.Errorf("replica: rename %s: %w", p.tmp, err)
	}
	if err := o.fs.SyncDir(o.dir); err != nil {
		return fmt.Errorf("replica: sync orphan store: %w", err)
	}
	o.logger.Info("re-encrypted fork", "index", index, "key", p.key, "frames", rec.Frames)
	return nil
}
