package replica

import (
	"fmt"

	"github.com/geolog/geolog/batch"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// logStorage is raft.Storage over a FrameLog. It is read by raft from the
// driver goroutine only, while WriteLog may be appending on another: with
// AsyncStorageWrites Raft reads from Storage only entries it knows are
// durable (below its unstable log), which no append touches, and
// LastIndex only when nothing it handed out is still being written.
// Truncations and installs, which change what it reads, run on the driver
// (logwriter.go).
//
// Raft sees the log start after the compaction point (state.SnapshotIndex):
// frames at or below it may still be on disk (a snapshot's body, or
// segments compaction has yet to delete) and are served to readers, never
// to Raft.
type logStorage struct {
	log   FrameLog
	state *HardState
	// cache answers reads of the newest entries from memory.
	cache entryCache
	// snapshot builds the snapshot a leader sends (see Replica.snapshot).
	snapshot func() (*raftpb.Snapshot, error)
}

func (s *logStorage) InitialState() (*raftpb.HardState, *raftpb.ConfState, error) {
	hs := proto.Clone(s.state.Raft).(*raftpb.HardState)
	cs := proto.Clone(s.state.Conf).(*raftpb.ConfState)
	return hs, cs, nil
}

// FirstIndex is the first index held past the compaction point, or the
// compaction point + 1 for a log that holds none.
func (s *logStorage) FirstIndex() (uint64, error) {
	return max(s.log.FirstIndex(), s.state.SnapshotIndex+1), nil
}

// LastIndex is the last index held, or the compaction point.
func (s *logStorage) LastIndex() (uint64, error) {
	return max(s.log.LastIndex(), s.state.SnapshotIndex), nil
}

func (s *logStorage) Term(i uint64) (uint64, error) {
	if i == s.state.SnapshotIndex {
		return s.state.SnapshotTerm, nil
	}
	first, _ := s.FirstIndex()
	if i < first {
		return 0, raft.ErrCompacted
	}
	last, _ := s.LastIndex()
	if i > last {
		return 0, raft.ErrUnavailable
	}
	if t, ok := s.cache.term(i); ok {
		return t, nil
	}
	return s.log.TermAt(i)
}

func (s *logStorage) Entries(lo, hi, maxSize uint64) ([]*raftpb.Entry, error) {
	first, _ := s.FirstIndex()
	if lo < first {
		return nil, raft.ErrCompacted
	}
	last, _ := s.LastIndex()
	if hi > last+1 {
		return nil, fmt.Errorf("replica: entries [%d, %d) past last index %d", lo, hi, last)
	}
	if lo >= hi {
		return nil, nil
	}
	if ents, ok := s.cache.entries(lo, hi, maxSize); ok {
		return ents, nil
	}
	bytesMax := int(min(maxSize, 64<<20))
	frames, err := s.log.ReadFramesByIndex(lo, hi, max(bytesMax, 1))
	if err != nil {
		return nil, err
	}
	var out []*raftpb.Entry
	var size uint64
	for len(frames) > 0 {
		n, err := batch.FrameSize(frames)
		if err != nil || n > len(frames) {
			return nil, fmt.Errorf("replica: reading entries at %d: %w", lo+uint64(len(out)), err)
		}
		e, err := frameEntry(frames[:n])
		if err != nil {
			return nil, err
		}
		if e.GetIndex() != lo+uint64(len(out)) {
			panic(fmt.Sprintf("replica: log returned index %d where %d was expected", e.GetIndex(), lo+uint64(len(out))))
		}
		size += uint64(len(e.Data)) + 24
		if len(out) > 0 && size > maxSize {
			break
		}
		out = append(out, e)
		frames = frames[n:]
		if e.GetIndex()+1 >= hi {
			break
		}
	}
	return out, nil
}

// Snapshot returns what a leader sends a follower behind its first index:
// see Replica.snapshot.
func (s *logStorage) Snapshot() (*raftpb.Snapshot, error) {
	return s.snapshot()
}
