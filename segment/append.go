package segment

import (
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
)

// Append writes one frame at the tail of the log with a single write.
// Otherwise it returns ErrInvalidFrame and writes nothing. The frame must be
// exactly one valid frame (CRC and record structure are checked) with
//
//   - BaseOffset == NextOffset(), or above it for a compacted frame (a
//     mirror applying frames a compacted home shipped: the offsets in
//     between were compacted away);
//   - at least one record, unless it is a control frame (batch.TypeNoop or
//     batch.TypeConfig without records), which takes no offset: NextOffset
//     does not move, or a compacted frame;
//   - an append time no earlier than the previous frame's;
//   - Raft Index 0 and any Term while the log holds no frame with an index
//     (LastIndex() == 0), or else Index == LastIndex()+1, except that a
//     fork frame (batch.TypeFork) whose payload names LastIndex() as the
//     frame before it may skip indexes; a frame with an index also needs a
//     Term no lower than the previous indexed frame's.
//     The first indexed frame may have any index, so a log can start after
//     a Raft snapshot; from then on every frame carries the next one.
//
// The frame is not durable until Sync returns. Append does not retain
// frame.
//
// Append is for the range's one appender goroutine. A failed write makes
// the store refuse further appends (ErrFailed).
func (s *Store) Append(frame []byte) error {
	return s.append(frame, batch.Validate)
}

// AppendChecked is Append for a frame whose CRC and records the caller
// has just checked (batch.Validate) or computed (this process encoded the
// frame, or patched it with batch.PatchRaft after validating it): it
// checks the header and every rule of Append, but does not pass over the
// frame's bytes a second time to recompute the CRC and walk the records.
// A replica writes Raft entries it validated a moment before with it.
func (s *Store) AppendChecked(frame []byte) error {
	return s.append(frame, batch.PeekHeader)
}

// append is Append with the frame checked by check.
func (s *Store) append(frame []byte, check func([]byte) (batch.Header, error)) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.usableLocked(); err != nil {
		return err
	}
	// Check the data before it reaches the disk, as readers check it after.
	h, err := check(frame)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidFrame, err)
	}
	if size, _ := batch.FrameSize(frame); size != len(frame) {
		return fmt.Errorf("%w: %d bytes hold a frame of %d and more", ErrInvalidFrame, len(frame), size)
	}
	next, last := s.nextOffset.Load(), s.lastIndex.Load()
	switch {
	case h.BaseOffset != next && !(h.Compacted() && h.BaseOffset > next):
		return fmt.Errorf("%w: base offset %d, want %d", ErrInvalidFrame, h.BaseOffset, next)
	case h.RecordCount == 0 && !h.IsControl() && !h.Compacted():
		return fmt.Errorf("%w: data frame at offset %d has no records", ErrInvalidFrame, next)
	case h.AppendTimeUnixNanos < s.lastAppendTimeUnixNanos:
		return fmt.Errorf("%w: append time %d precedes the previous frame's %d", ErrInvalidFrame,
			h.AppendTimeUnixNanos, s.lastAppendTimeUnixNanos)
	case last != 0 && forkFollows(frame, h, last) != nil:
		return fmt.Errorf("%w: %w", ErrInvalidFrame, forkFollows(frame, h, last))
	case h.Index != 0 && h.Term < s.lastTerm:
		return fmt.Errorf("%w: raft term %d below the previous frame's %d", ErrInvalidFrame, h.Term, s.lastTerm)
	case h.Index == math.MaxUint64:
		return fmt.Errorf("%w: raft index %d leaves no successor", ErrInvalidFrame, h.Index)
	}

	g := s.active()
	unit := sealFrame(s.cfg.Keyring, &s.sealBuf, frame)
	// A segment without records is never sealed (see hasRecords): control
	// frames alone make it grow past SegmentBytesMax until a record comes.
	if g.hasRecords() && s.overflows(g.size, g.baseOffset, len(unit), h) {
		if err := s.roll(); err != nil {
			return err
		}
		g = s.active()
	}
	pos := g.size
	if pos+int64(len(unit)) > segmentFileBytesMax {
		return fmt.Errorf("%w: segment %s of %d bytes cannot take %d more", ErrInvalidFrame, g.name(), pos, len(unit))
	}
	if err := s.zeroAheadFor(g, len(unit)); err != nil {
		s.fail(err)
		return s.failed()
	}
	if _, err := g.f.WriteAt(unit, pos); err != nil {
		if vfs.IsNoSpace(err) {
			return s.outOfSpace(g, pos, err)
		}
		// Part of the frame may be on disk; only recovery can tell.
		s.fail(err)
		return s.failed()
	}
	if s.noSpace.Load() != nil {
		s.noSpace.Store(nil)
		s.log.Info("log device has space again: appends resumed", "segment", g.name())
	}
	if cap(s.sealBuf) > sealBufBytesMax {
		s.sealBuf = nil // a rare large frame: do not keep its buffer
	}

	s.keyHashes = frameKeyHashes(s.keyHashes, frame)
	s.mu.Lock()
	appendKeys(g, h, pos, s.keyHashes)
	if needsIndexEntry(g.entries, pos, s.cfg.IndexIntervalBytes) {
		g.entries = append(g.entries, indexEntry{
			relOffset:           relOffset(g, h.BaseOffset),
			position:            uint32(pos),
			appendTimeUnixNanos: h.AppendTimeUnixNanos,
			index:               h.Index,
		})
	}
	g.size += int64(len(unit))
	g.padded = max(0, g.padded-int64(len(unit)))
	g.nextOffset = h.NextOffset()
	g.maxAppendTimeUnixNanos = h.AppendTimeUnixNanos
	if h.Index != 0 {
		if g.firstIndex == 0 {
			g.firstIndex = h.Index
		}
		g.lastIndex, g.lastTerm = h.Index, h.Term
		if s.firstIndex.Load() == 0 {
			s.firstIndex.Store(h.Index)
		}
		s.lastIndex.Store(h.Index)
	}
	s.sizeBytes.Add(int64(len(unit)))
	s.appendedBytes.Add(int64(len(unit)))
	s.nextOffset.Store(g.nextOffset)
	s.appends.Add(1)
	s.mu.Unlock()

	s.lastAppendTimeUnixNanos = h.AppendTimeUnixNanos
	if h.Index != 0 {
		s.lastTerm = h.Term
	}
	if cap(s.keyHashes) > keyHashesKeepMax {
		s.keyHashes = nil // a huge batch: do not keep its scratch
	}
	return nil
}

// keyHashesKeepMax bounds the key hash scratch the appender keeps between
// appends.
const keyHashesKeepMax = 1 << 12

// overflows reports whether a frame of frameBytes bytes with header h
// would take a segment based at base, holding size bytes, past
// SegmentBytesMax or SegmentRecordsMax: it must start a new segment if the
// segment holds a record. Append and Staging roll by it.
func (s *Store) overflows(size int64, base uint64, frameBytes int, h batch.Header) bool {
	return size+int64(frameBytes) > s.cfg.SegmentBytesMax || h.NextOffset()-base > uint64(s.cfg.SegmentRecordsMax)
}

// roll seals the active segment and starts a new, empty one at NextOffset:
// fsync the finished log and write and fsync its index files, then create
// the new file and fsync the directory, and only then publish it. Syncers
// rely on that order: every segment but the active one is durable. The
// caller holds wmu and the active segment holds records.
func (s *Store) roll() error {
	old := s.active()
	if !old.hasRecords() {
		panic(fmt.Sprintf("segment: roll of segment %s, which holds no record", old.name()))
	}
	// A sealed segment ends at its last frame: the fdatasync below makes
	// the cut durable before the next segment exists.
	if err := old.trimPadding(); err != nil {
		s.fail(err)
		return s.failed()
	}
	if s.cfg.Fsync == FsyncAlways {
		// The caller holds wmu, so every append counted so far is in old.
		appends := s.appends.Load()
		if err := s.fdatasync(old.f); err != nil {
			s.fail(err)
			return s.failed()
		}
		s.advanceDurable(old.nextOffset, appends)
	}
	if err := s.writeIndexFiles(old); err != nil {
		// Index files are a cache that recovery verifies and rebuilds.
		s.log.Warn("could not write index files", "segment", old.name(), "error", err)
	}
	// Create the next segment before sealing this one's keys: a create
	// refused for space (ErrNoSpace) leaves this segment the active one,
	// and appends that fit it after all must still be indexed.
	g, err := s.createSegment(old.nextOffset)
	if err != nil {
		return err
	}
	s.sealKeys(old)
	s.mu.Lock()
	s.segs = append(s.segs, g)
	s.mu.Unlock()
	s.log.Debug("rolled segment", "sealed", old.name(), "bytes", old.size, "next_offset", old.nextOffset)
	return nil
}

// createSegment creates the empty log file of a segment at base and makes
// it durable in the directory. A failed create leaves the store as it was;
// a failed directory fsync fails the store.
func (s *Store) createSegment(base uint64) (*segment, error) {
	path := filepath.Join(s.cfg.Dir, segmentName(base, logSuffix))
	f, err := s.fs.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if vfs.IsNoSpace(err) {
			e := fmt.Errorf("%w: create segment: %w", ErrNoSpace, err)
			if s.noSpace.Swap(&e) == nil {
				s.log.Warn("log device is full: refusing appends until space is freed", "segment", path, "error", err)
			}
			return nil, e
		}
		return nil, fmt.Errorf("segment: create segment: %w", err)
	}
	if err := s.fs.SyncDir(s.cfg.Dir); err != nil {
		f.Close()
		s.fail(err)
		return nil, s.failed()
	}
	g := newSegment(s.cfg.Dir, base, f)
	g.keys = newActiveKeys()
	return g, nil
}

// Sync makes every frame appended before the call durable (or truncated
// away) and returns nil, or returns the error that prevented it. It is safe
// from any number of goroutines, concurrently with Append.
//
// Group commit: a caller that finds nothing in flight becomes the leader
// and fdatasyncs the active segment for everything written so far; callers
// arriving meanwhile wait for that round and return if it covered them, or
// elect the next leader for all that was written in between. One fdatasync
// thus serves every caller waiting on it.
//
// A failed fdatasync is never retried (the kernel may have dropped the
// dirty pages and would report the retry as a success): it fails the store,
// and this and every later Sync and Append return ErrFailed. Under
// FsyncNever Sync returns at once. After Close, Sync returns nil if Close
// made everything durable and ErrClosed otherwise.
func (s *Store) Sync() error {
	// Count frames rather than offsets: control frames take none. A
	// truncation syncs what remains and counts every frame up to it as
	// durable, so a frame it dropped is never waited for.
	need := s.appends.Load()
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	for {
		if err := s.failed(); err != nil {
			return err
		}
		if s.durableAppends.Load() >= need {
			return nil
		}
		if s.syncEnded {
			return ErrClosed
		}
		if !s.syncing {
			break
		}
		s.syncWaiters++
		s.syncCond.Wait()
		s.syncWaiters--
	}
	if s.cfg.Fsync == FsyncNever {
		s.durable.Store(max(s.durable.Load(), s.nextOffset.Load()))
		s.durableAppends.Store(max(s.durableAppends.Load(), s.appends.Load()))
		return nil
	}

	s.syncing = true
	s.syncMu.Unlock()
	// Read the active segment and the written offset together: every
	// segment before the active one was fsynced when it was rolled, so
	// syncing the active one makes everything below target durable. The
	// reference keeps the file open should retention delete it meanwhile.
	s.mu.RLock()
	if s.closed {
		// Close is exclusive with a leader, so this cannot happen. Relock
		// so that the deferred unlock does not mask the panic.
		s.mu.RUnlock()
		s.syncMu.Lock()
		panic("segment: sync leader found the store closed")
	}
	g := s.segs[len(s.segs)-1]
	g.acquire()
	target, targetAppends := s.nextOffset.Load(), s.appends.Load()
	appended := s.appendedBytes.Load()
	s.mu.RUnlock()

	err := s.fdatasync(g.f)
	if err == nil {
		s.noteSyncRound(appended)
	}
	if rerr := g.release(); rerr != nil {
		s.log.Warn("close segment file", "segment", g.name(), "error", rerr)
	}

	s.syncMu.Lock()
	s.syncing = false
	s.syncCond.Broadcast()
	if err != nil {
		s.fail(err)
		return s.failed()
	}
	if target > s.durable.Load() {
		s.durable.Store(target)
	}
	if targetAppends > s.durableAppends.Load() {
		s.durableAppends.Store(targetAppends)
	}
	return nil
}

// advanceDurable raises the durable offset to off and the durable append
// count to appends after a successful fsync outside Sync, and wakes waiting
// syncers.
func (s *Store) advanceDurable(off, appends uint64) {
	s.syncMu.Lock()
	if off > s.durable.Load() {
		s.durable.Store(off)
	}
	if appends > s.durableAppends.Load() {
		s.durableAppends.Store(appends)
	}
	s.syncCond.Broadcast()
	s.syncMu.Unlock()
}

// beginExclusiveSync waits for the leader of the current group commit round
// (if any) and takes its place, so that no fdatasync runs until
// endExclusiveSync. Mutators that move the durable offset down use it.
func (s *Store) beginExclusiveSync() {
	s.syncMu.Lock()
	for s.syncing {
		s.syncCond.Wait()
	}
	s.syncing = true
	s.syncMu.Unlock()
}

// endExclusiveSync ends beginExclusiveSync and wakes waiting syncers. In
// between, the owner may store the durable offset directly.
func (s *Store) endExclusiveSync() {
	s.syncMu.Lock()
	s.syncing = false
	s.syncCond.Broadcast()
	s.syncMu.Unlock()
}
