package segment

import (
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/geolog/geolog/atrest"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
)

const (
	// DefaultSegmentBytesMax is the default roll threshold.
	DefaultSegmentBytesMax = 64 << 20
	// SegmentBytesMaxLimit bounds Config.SegmentBytesMax from above.
	SegmentBytesMaxLimit = 1 << 30
	// SegmentBytesMaxMin bounds Config.SegmentBytesMax from below.
	SegmentBytesMaxMin = 1 << 10
	// DefaultIndexIntervalBytes is the default sparse index spacing.
	DefaultIndexIntervalBytes = 4 << 10
	// IndexIntervalBytesLimit bounds Config.IndexIntervalBytes from above.
	IndexIntervalBytesLimit = 16 << 20
	// DefaultSegmentRecordsMax is the default bound on a segment's records.
	DefaultSegmentRecordsMax = 1 << 19
	// ReadBytesMax bounds the maxBytes argument of ReadFrames and
	// ReadFramesByIndex; larger values are clamped to it. (One frame
	// larger than maxBytes is still returned whole, and frames are at most
	// batch.FrameBytesMax.)
	ReadBytesMax = batch.FrameBytesMax

	// readChunkBytes is the size of the pooled buffers that seeks and scans
	// read through.
	readChunkBytes = 64 << 10
	// firstReadBytes is the least ReadFrames reads for its first frame.
	firstReadBytes = 4 << 10
	// recoverChunkBytes is how much recovery reads with one pread.
	recoverChunkBytes = 1 << 20
)

// FsyncPolicy says whether Sync reaches the disk.
type FsyncPolicy int

const (
	// FsyncAlways makes Sync fdatasync the log: the default, and the only
	// policy under which an acknowledged record survives a power failure.
	FsyncAlways FsyncPolicy = iota
	// FsyncNever skips the fdatasyncs of Sync, roll, Open and Close (the
	// rare repairs, TruncateSuffix and torn-tail truncation, still sync).
	// For benchmarks only: after a machine crash the log may lose
	// acknowledged records, or hold a torn sealed segment that Open
	// reports as corrupt.
	FsyncNever
)

// Config configures a Store. Zero values select the documented defaults.
type Config struct {
	// Dir is the range's directory, created if missing. One Store per
	// directory at a time: Open locks it (see ErrLocked).
	Dir string
	// FS is the file system the store works in. Default vfs.OS(); tests
	// and the simulator pass a *vfs.Mem.
	FS vfs.FS
	// SegmentBytesMax is the size at which the active segment is rolled:
	// a frame that would take it past this starts a new segment (a frame
	// larger than this gets a segment of its own), once the active segment
	// holds a record (see the package documentation). Default 64 MiB,
	// bounds [SegmentBytesMaxMin, SegmentBytesMaxLimit].
	SegmentBytesMax int64
	// SegmentRecordsMax bounds the records of a segment: a frame that
	// would take the active segment past it starts a new segment, once the
	// active one holds a record (a frame with more records than this gets
	// a segment of its own). It bounds the memory of the active segment's
	// key index (16 bytes per record plus a map slot per distinct key
	// hash: 17 MiB at the default with every key distinct), whatever the
	// record size. Default 512 Ki records, bounds [1, math.MaxUint32].
	SegmentRecordsMax int64
	// IndexIntervalBytes is the spacing of the sparse index entries: a
	// read, or a lookup by offset, Raft index or time, scans at most about
	// this many bytes past an entry. Default 4 KiB, bounds
	// [1, IndexIntervalBytesLimit].
	IndexIntervalBytes int
	// Fsync is the fsync policy. Default FsyncAlways.
	Fsync FsyncPolicy
	// RetentionAge makes ApplyRetention delete segments whose newest batch
	// was appended longer ago than this. Default 0: keep forever.
	RetentionAge time.Duration
	// RetentionBytes makes ApplyRetention delete oldest segments while the
	// log is larger than this. Default 0: no bound.
	RetentionBytes int64
	// Logger receives the store's logs. Default hclog.NewNullLogger().
	Logger hclog.Logger
	// Now is the clock for retention. Default time.Now.
	Now func() time.Time
	// OnRecover, if set, is called by Open for every retained frame,
	// control frames included, in log order, while the log is verified (it
	// rebuilds idempotence and Raft configuration state). An error from it
	// fails Open. If Open fails for any reason, whatever OnRecover built
	// must be discarded.
	OnRecover func(h batch.Header) error
	// Keyring, if set, turns on encryption at rest: every frame written
	// is sealed under its active data key, and units sealed under any key
	// it holds are opened (seal.go). Without it, frames are written in
	// the clear and a sealed unit is an error (atrest.ErrKeyUnavailable)
	// that Open and reads return. Default nil.
	Keyring *atrest.Keyring

	// SyncGroup, if set, is the node's sync point that the log's
	// fdatasyncs join (vfs.SyncGroup: one flush round in flight for all
	// the stores sharing it, callers arriving meanwhile batched into the
	// next). Default nil: each store fdatasyncs its files itself.
	SyncGroup *vfs.SyncGroup

	// ZeroAheadBytes, if positive, makes the active segment keep up to
	// this many bytes of zeros written past its last frame, so that
	// appends overwrite blocks the file has rather than grow it and an
	// fdatasync flushes data alone (zeroahead.go). At most
	// ZeroAheadBytesMax; ignored unless Fsync is FsyncAlways. Default 0:
	// off.
	ZeroAheadBytes int64

	// testHooks lets this package's tests observe and fail fdatasync.
	testHooks testHooks
}

type testHooks struct {
	// fdatasync, when set, replaces the fdatasync of log files.
	fdatasync func(f vfs.File) error
}

// ErrCorrupt reports mid-log corruption: a log that cannot be repaired by
// dropping a torn tail. The range must not be served. Errors carrying it
// are *CorruptionError values naming the place.
var ErrCorrupt = errors.New("segment: log is corrupt")

// ErrOutOfRange reports an offset below StartOffset or above NextOffset, or
// a Raft index outside [FirstIndex, LastIndex] (LastIndex+1 where a bound
// is exclusive).
var ErrOutOfRange = errors.New("segment: offset or index out of range")

// ErrLocked reports a directory that another Store (in this process or
// another) has open. Errors carrying it also carry vfs.ErrLocked.
var ErrLocked = errors.New("segment: directory is in use by another store")

// ErrClosed reports use of a closed Store.
var ErrClosed = errors.New("segment: store is closed")

// ErrInvalidFrame reports a frame given to Append that fails validation
// (CRC, structure, base offset, a data frame without records, decreasing
// append time, Raft index or term out of sequence). Nothing was written.
var ErrInvalidFrame = errors.New("segment: invalid frame")

// ErrFailed reports that an earlier write or fsync of the log failed. The
// store refuses appends from then on; whether the failed data reached the
// disk is unknown, so the only way forward is Close and Open, whose
// recovery keeps exactly what is on disk.
var ErrFailed = errors.New("segment: store failed")

// ErrNoSpace reports an Append refused because the log's device is out of
// space (or the writer's quota is spent: ENOSPC, EDQUOT). Unlike ErrFailed
// it does not fail the store: whatever part of the frame reached the file
// was cut off again, the log is as it was before the call, earlier frames
// stay readable and Sync still makes them durable, and a later Append
// (the next one is the probe) succeeds once space is freed. Errors
// carrying it also carry the system's error.
var ErrNoSpace = errors.New("segment: no space left for the log")

// ErrNotBoundary reports a TruncateSuffix offset inside a batch: neither
// the first offset of one nor NextOffset.
var ErrNotBoundary = errors.New("segment: offset is not a batch boundary")

// ErrInvalidConfig reports a Config that Open rejects.
var ErrInvalidConfig = errors.New("segment: invalid config")

// CorruptionError locates corruption. errors.Is(err, ErrCorrupt) holds for
// it, and Unwrap returns the specific cause.
type CorruptionError struct {
	Segment  string // log file name
	Position int64  // byte position of the bad frame in the file
	Offset   uint64 // offset the bad frame should start at
	Err      error  // what is wrong
}

func (e *CorruptionError) Error() string {
	return fmt.Sprintf("segment: corrupt log in %s at position %d (offset %d): %v", e.Segment, e.Position, e.Offset, e.Err)
}

// Is makes errors.Is(err, ErrCorrupt) true.
func (e *CorruptionError) Is(target error) bool { return target == ErrCorrupt }

// Unwrap returns the cause.
func (e *CorruptionError) Unwrap() error { return e.Err }

// Store is one range's append-only log. See the package documentation for
// the contract between the store, its one appender and its readers.
type Store struct {
	cfg       Config
	fs        vfs.FS
	log       hclog.Logger
	lock      io.Closer // the directory lock, released by Close
	fdatasync func(f vfs.File) error

	// wmu serialises the mutators (Append, TruncateSuffix,
	// TruncateSuffixAtIndex, DeletePrefix, ApplyRetention, Close). The
	// contract has one appender goroutine; the lock makes a second one safe
	// rather than a silent corruption. lastAppendTimeUnixNanos, lastTerm
	// and closing are guarded by it.
	wmu                     sync.Mutex
	lastAppendTimeUnixNanos int64
	// openMark is the newest commit mark recovery found (OpenMark).
	openMark uint64
	lastTerm uint64 // Term of the frame at LastIndex, 0 if none
	closing  bool
	sealBuf  []byte // Append's scratch for sealed units
	// keyHashes is the appender's scratch for the key hashes and offset
	// deltas of a frame's records.
	keyHashes []keyEntry

	// truncMu excludes readers while bytes they may be reading change
	// (TruncateSuffix, Close). Appends and deletes need not take it: appends
	// only add bytes past every reader's snapshot, and deleted segments stay
	// open while referenced.
	truncMu sync.RWMutex

	// mu guards segs, closed and the appender-owned fields of each segment
	// (see segment). The appender holds it only to publish; readers hold
	// the read lock only to snapshot.
	mu     sync.RWMutex
	segs   []*segment // by base offset; the last is the active segment
	closed bool

	nextOffset  atomic.Uint64 // written under mu with the segment fields
	startOffset atomic.Uint64 // written under mu
	sizeBytes   atomic.Int64  // written under mu
	firstIndex  atomic.Uint64 // written under mu; 0 when no frame has an index
	lastIndex   atomic.Uint64 // written under mu
	// appends counts the frames ever appended (written under mu): Sync
	// waits for a count, not an offset, since control frames take none.
	appends atomic.Uint64
	// appendedBytes counts the bytes ever appended (written under mu);
	// syncBytes is the moving average of what one Sync round's
	// fdatasync covered, which zero-ahead goes by (zeroahead.go), and
	// syncedBytes appendedBytes at the last round (both the round
	// leader's, under syncing).
	appendedBytes atomic.Int64
	syncBytes     atomic.Int64
	syncedBytes   int64

	// Group commit; see Sync. durableAppends is the append count the last
	// fdatasync covered; durable the offset it covered.
	syncMu         sync.Mutex
	syncCond       *sync.Cond
	syncing        bool // a leader (or an exclusive mutator) owns the fdatasync
	durable        atomic.Uint64
	durableAppends atomic.Uint64
	syncEnded      bool // Close finished; guarded by syncMu
	// syncWaiters counts Sync callers waiting for a round; guarded by
	// syncMu. Tests read it to line up group commit rounds.
	syncWaiters int

	failure atomic.Pointer[error] // first write or fsync failure
	// noSpace is the error of the last Append refused for space (see
	// ErrNoSpace), cleared by the next Append that writes; set by the
	// appender, read by anyone.
	noSpace atomic.Pointer[error]

	// startRec is the start record as last loaded or saved
	// (startrecord.go); the appender's (or Open's).
	startRec startRecord

	// staging is set while a Staging of this store is open (see Install).
	staging atomic.Bool
}

// Open opens the log in cfg.Dir, creating the directory and an empty log at
// offset 0 if there is none, locks the directory (a second Open of it, from
// this process or another, fails with ErrLocked until Close), and recovers
// the log: see the package documentation for what recovery verifies,
// repairs and refuses. On error nothing on disk has been changed except that
// a missing directory may have been created.
func Open(cfg Config) (*Store, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := vfs.EnsureDir(cfg.FS, cfg.Dir); err != nil {
		return nil, fmt.Errorf("segment: create %s: %w", cfg.Dir, err)
	}
	lock, err := cfg.FS.Lock(cfg.Dir)
	if errors.Is(err, vfs.ErrLocked) {
		return nil, fmt.Errorf("%w: %w", ErrLocked, err)
	}
	if err != nil {
		return nil, fmt.Errorf("segment: lock %s: %w", cfg.Dir, err)
	}
	s := &Store{cfg: cfg, fs: cfg.FS, log: cfg.Logger, lock: lock,
		fdatasync: func(f vfs.File) error { return f.Datasync() }}
	s.syncCond = sync.NewCond(&s.syncMu)
	if cfg.SyncGroup != nil {
		s.fdatasync = cfg.SyncGroup.Datasync
	}
	if cfg.testHooks.fdatasync != nil {
		s.fdatasync = cfg.testHooks.fdatasync
	}
	if err := s.recover(); err != nil {
		lock.Close()
		return nil, err
	}
	return s, nil
}

func (c Config) withDefaults() (Config, error) {
	bad := func(format string, args ...any) (Config, error) {
		return Config{}, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	if c.Dir == "" {
		return bad("empty Dir")
	}
	if c.SegmentBytesMax == 0 {
		c.SegmentBytesMax = DefaultSegmentBytesMax
	}
	if c.SegmentBytesMax < SegmentBytesMaxMin || c.SegmentBytesMax > SegmentBytesMaxLimit {
		return bad("SegmentBytesMax %d outside [%d, %d]", c.SegmentBytesMax, SegmentBytesMaxMin, SegmentBytesMaxLimit)
	}
	if c.SegmentRecordsMax == 0 {
		c.SegmentRecordsMax = DefaultSegmentRecordsMax
	}
	if c.SegmentRecordsMax < 1 || c.SegmentRecordsMax > math.MaxUint32 {
		return bad("SegmentRecordsMax %d outside [1, %d]", c.SegmentRecordsMax, uint64(math.MaxUint32))
	}
	if c.IndexIntervalBytes == 0 {
		c.IndexIntervalBytes = DefaultIndexIntervalBytes
	}
	if c.IndexIntervalBytes < 1 || c.IndexIntervalBytes > IndexIntervalBytesLimit {
		return bad("IndexIntervalBytes %d outside [1, %d]", c.IndexIntervalBytes, IndexIntervalBytesLimit)
	}
	if c.Fsync != FsyncAlways && c.Fsync != FsyncNever {
		return bad("unknown Fsync policy %d", c.Fsync)
	}
	if c.ZeroAheadBytes < 0 || c.ZeroAheadBytes > ZeroAheadBytesMax {
		return bad("ZeroAheadBytes %d outside [0, %d]", c.ZeroAheadBytes, ZeroAheadBytesMax)
	}
	if c.Fsync != FsyncAlways {
		c.ZeroAheadBytes = 0
	}
	if c.RetentionAge < 0 || c.RetentionBytes < 0 {
		return bad("negative retention (age %v, bytes %d)", c.RetentionAge, c.RetentionBytes)
	}
	if c.FS == nil {
		c.FS = vfs.OS()
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	c.Logger = c.Logger.Named("segment").With("dir", c.Dir)
	if c.Now == nil {
		c.Now = time.Now
	}
	return c, nil
}

// NextOffset returns the offset the next appended record will get.
func (s *Store) NextOffset() uint64 { return s.nextOffset.Load() }

// DurableOffset returns the offset below which every record is durable:
// NextOffset as of the last completed Sync (or roll, recovery,
// TruncateSuffix). Under FsyncNever it only reports what Sync pretended.
// Control frames take no offset, so their durability shows only in Sync
// returning.
func (s *Store) DurableOffset() uint64 { return s.durable.Load() }

// StartOffset returns the first retained offset: the base offset of the
// oldest segment. It equals NextOffset when nothing is retained.
func (s *Store) StartOffset() uint64 { return s.startOffset.Load() }

// Size returns the bytes of all segment log files (indexes excluded).
func (s *Store) Size() int64 { return s.sizeBytes.Load() }

// SizeFrom returns the bytes of the segment log files that begin at
// offset off or later: the log from off to its end, less the part of the
// segment holding off (under by at most one segment, so that a position
// inside the active segment counts nothing). off at or below the log's
// start counts the whole log.
func (s *Store) SizeFrom(off uint64) int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var size int64
	for i := len(s.segs) - 1; i >= 0 && s.segs[i].baseOffset >= off; i-- {
		size += s.segs[i].size
	}
	return size
}

// FirstIndex returns the Raft index of the oldest retained frame that
// carries one, or 0 if no retained frame does.
func (s *Store) FirstIndex() uint64 { return s.firstIndex.Load() }

// LastIndex returns the Raft index of the newest frame, or 0 if no retained
// frame carries one. Frames carrying an index are a suffix of the log with
// indexes [FirstIndex, LastIndex], dense.
func (s *Store) LastIndex() uint64 { return s.lastIndex.Load() }

// fail records the first write or fsync failure; appends are refused from
// then on.
func (s *Store) fail(err error) {
	if s.failure.CompareAndSwap(nil, &err) {
		s.log.Error("log write failed, refusing further appends", "error", err)
	}
}

// NoSpace returns the ErrNoSpace error of the last Append if it was
// refused for space and no Append has written since, or nil. Safe from any
// goroutine.
func (s *Store) NoSpace() error {
	if p := s.noSpace.Load(); p != nil {
		return *p
	}
	return nil
}

// outOfSpace handles a write of the active segment g at pos that failed
// with err, which vfs.IsNoSpace says is a full device: the bytes that
// landed past pos are cut off (a shrinking truncate needs no space) so
// that no torn frame stays at the tail, and ErrNoSpace is returned. If the
// cut fails the store fails. Readers never look past g.size, which the
// write had not moved. The caller holds wmu.
func (s *Store) outOfSpace(g *segment, pos int64, err error) error {
	if terr := g.f.Truncate(pos); terr != nil {
		s.fail(fmt.Errorf("%w (and the partial frame could not be cut off: %w)", err, terr))
		return s.failed()
	}
	g.padded = 0 // cut off with the partial frame
	e := fmt.Errorf("%w: %w", ErrNoSpace, err)
	if s.noSpace.Swap(&e) == nil {
		s.log.Warn("log device is full: refusing appends until space is freed", "segment", g.name(), "error", err)
	}
	return e
}

// failed returns ErrFailed wrapping the recorded failure, or nil.
func (s *Store) failed() error {
	if p := s.failure.Load(); p != nil {
		return fmt.Errorf("%w: %w", ErrFailed, *p)
	}
	return nil
}

// usableLocked returns why mutators may not proceed; the caller holds wmu.
func (s *Store) usableLocked() error {
	if s.closing {
		return ErrClosed
	}
	return s.failed()
}

// active returns the active segment. Only the appender (holding wmu) may
// call it without mu: it is the only writer of segs.
func (s *Store) active() *segment { return s.segs[len(s.segs)-1] }

// publishBoundsLocked refreshes startOffset, firstIndex and lastIndex
// from the segments; the caller holds mu.
func (s *Store) publishBoundsLocked() {
	var last uint64
	if t := s.tail(); t != nil {
		last = t.lastIndex
	}
	s.lastIndex.Store(last)
	s.startOffset.Store(s.segs[0].baseOffset)
	// Segments holding indexed frames are a suffix of the log, but for an
	// empty active segment (which holds no frame at all).
	n := len(s.segs)
	if s.segs[n-1].size == 0 {
		n--
	}
	var first uint64
	if i := sort.Search(n, func(i int) bool { return s.segs[i].lastIndex != 0 }); i < n {
		first = s.segs[i].firstIndex
	}
	s.firstIndex.Store(first)
}

// corruption builds a CorruptionError and logs it.
func (s *Store) corruption(g *segment, pos int64, offset uint64, err error) *CorruptionError {
	e := &CorruptionError{Segment: g.name(), Position: pos, Offset: offset, Err: err}
	s.log.Error("corrupt log", "segment", e.Segment, "position", pos, "offset", offset, "error", err)
	return e
}

// readBufs pools the read buffers of every Store of the process. A pool
// per Store kept a buffer per Store once it had read from disk: a node
// restarted with 3,000 idle ranges reads each one's Raft log (terms, at
// the first appends after the restart) and then held 3,000 buffers of 64
// KiB (~190 MB live, times the GC's growth factor in RSS) that a freshly
// created node, whose entries were still cached, never took
// (notes/restartmem.md). Shared, the pool holds about as many buffers as
// reads run at once.
var readBufs = sync.Pool{New: func() any { b := make([]byte, readChunkBytes); return &b }}

// getBuf returns a pooled read buffer.
func (s *Store) getBuf() *[]byte { return readBufs.Get().(*[]byte) }

// putBuf returns a buffer to the pool unless a large frame grew it.
func (s *Store) putBuf(b *[]byte) {
	if cap(*b) == readChunkBytes {
		*b = (*b)[:readChunkBytes]
		readBufs.Put(b)
	}
}

// Close makes the log durable (under FsyncAlways), writes the active
// segment's index files and closes the store. Readers still inside a call
// finish it; later calls return ErrClosed. Close returns the fsync error, or
// the recorded failure of a failed store; the files are closed either way.
func (s *Store) Close() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.closing {
		return ErrClosed
	}
	s.closing = true
	s.beginExclusiveSync()

	err := s.failed()
	g := s.active()
	if err == nil {
		// A clean restart finds no padding to judge (zeroahead.go);
		// recovery would cut it off all the same.
		if terr := g.trimPadding(); terr != nil {
			s.log.Warn("could not cut the zero padding off the log", "error", terr)
		}
	}
	if err == nil && s.cfg.Fsync == FsyncAlways {
		if serr := s.fdatasync(g.f); serr != nil {
			s.fail(serr)
			err = s.failed()
		}
	}
	if err == nil {
		if ierr := s.writeIndexFiles(g); ierr != nil {
			// Index files are rebuilt by recovery; losing them costs time, not data.
			s.log.Warn("could not write index files", "segment", g.name(), "error", ierr)
		}
	}

	s.truncMu.Lock()
	s.mu.Lock()
	s.closed = true
	segs := s.segs
	s.segs = nil
	s.mu.Unlock()
	s.truncMu.Unlock()

	s.syncMu.Lock()
	if err == nil && s.cfg.Fsync == FsyncAlways {
		s.durable.Store(s.nextOffset.Load())
		s.durableAppends.Store(s.appends.Load())
	}
	s.syncing = false
	s.syncEnded = true
	s.syncCond.Broadcast()
	s.syncMu.Unlock()

	for _, g := range segs {
		if cerr := g.release(); cerr != nil {
			s.log.Warn("close segment file", "segment", g.name(), "error", cerr)
		}
	}
	// Last: no file of ours is written after another Store may open.
	if lerr := s.lock.Close(); lerr != nil {
		s.log.Warn("release directory lock", "error", lerr)
	}
	return err
}

// clampRead bounds maxBytes to [0, ReadBytesMax].
func clampRead(maxBytes int) int {
	return max(0, min(maxBytes, ReadBytesMax))
}

// relOffset returns off - g.baseOffset as an index relative offset,
// panicking if it does not fit (Append rolls before it could).
func relOffset(g *segment, off uint64) uint32 {
	rel := off - g.baseOffset
	if off < g.baseOffset || rel > math.MaxUint32 {
		panic(fmt.Sprintf("segment: offset %d does not fit segment %s", off, g.name()))
	}
	return uint32(rel)
}
