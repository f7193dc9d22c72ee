package segment

import (
	"fmt"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
)

// Commit marks: a replica records how far its log is committed in the log
// itself (package replica's commitmark.go), so that the record is durable
// with the fdatasync that makes its entries durable, instead of needing
// one of its own. A mark is a small control frame (batch.TypeMark: a Raft
// index, no offset, no Raft index of its own) that AppendMark writes after
// the frames it covers. It is the log's own bookkeeping: every reader
// steps over it (ReadFrames, ReadFramesByIndex, HeadersByIndex, TermAt,
// the key index, compaction by key, which drops it), it is never shipped
// (snapshots and mirrors read frames) and it takes no index entry.
// Recovery verifies it like any frame (CRC, header, payload length and
// magic, offset): a torn mark at the tail is a torn tail, a damaged one
// mid-log is corruption. OpenMark returns the newest mark recovery kept.

// AppendMark writes a commit mark saying that the log is committed up to
// Raft index index, durable after Sync like an Append. It writes only
// after a frame with a Raft index in the active segment (never into a
// segment that holds none, whose indexes readers look up otherwise), and
// reports false, writing nothing, when there is none; index must not pass
// LastIndex (ErrInvalidFrame). A full device returns ErrNoSpace, as Append
// does. For the appender goroutine.
func (s *Store) AppendMark(index uint64) (bool, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.usableLocked(); err != nil {
		return false, err
	}
	if last := s.lastIndex.Load(); index > last {
		return false, fmt.Errorf("%w: commit mark at raft index %d past the last index %d", ErrInvalidFrame, index, last)
	}
	g := s.active()
	if g.lastIndex == 0 {
		return false, nil
	}
	frame := batch.EncodeMark(nil, index, s.nextOffset.Load(), s.lastAppendTimeUnixNanos)
	unit := sealFrame(s.cfg.Keyring, &s.sealBuf, frame)
	pos := g.size
	if pos+int64(len(unit)) > segmentFileBytesMax {
		return false, nil // the next frame rolls the segment
	}
	if _, err := g.f.WriteAt(unit, pos); err != nil {
		if vfs.IsNoSpace(err) {
			return false, s.outOfSpace(g, pos, err)
		}
		s.fail(err)
		return false, s.failed()
	}
	s.mu.Lock()
	g.size += int64(len(unit))
	s.sizeBytes.Add(int64(len(unit)))
	s.appends.Add(1)
	s.mu.Unlock()
	return true, nil
}

// OpenMark returns the newest commit mark Open found in the log (0: none).
// A truncation or an install since may have removed it: the caller
// clamps it to the log, as it clamps any commit index it recovers.
func (s *Store) OpenMark() uint64 {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.openMark
}
