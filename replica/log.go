package replica

import (
	"errors"
	"fmt"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/segment"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// FrameLog is the part of a range's segment store a replica writes and
// reads: the Raft log is the message log, one frame per Raft entry
// (segment.Store implements it; so does its in-memory twin).
//
// Frames appended through a replica carry the Raft term and index of their
// entry. Data frames take offsets; control frames (a leader's empty entry, a
// configuration change) take none.
type FrameLog interface {
	// Append writes one frame at the tail; durable after Sync.
	Append(frame []byte) error
	// AppendChecked is Append for a frame whose CRC and records were
	// checked or computed a moment before (entryFrame): the log checks
	// its header and place, not its bytes again.
	AppendChecked(frame []byte) error
	// Sync makes everything appended durable (group commit).
	Sync() error
	// AppendMark writes a commit mark, durable after Sync, saying that
	// the log is committed up to index (at most LastIndex); it reports
	// false, writing nothing, where the log cannot hold one (see
	// segment.Store.AppendMark). OpenMark is the newest mark the log held
	// when it was opened. commitmark.go.
	AppendMark(index uint64) (bool, error)
	OpenMark() uint64
	// NextOffset is the offset the next data record gets.
	NextOffset() uint64
	// FirstIndex and LastIndex bound the Raft indexes held; both are 0 when
	// the log holds no frame with an index.
	FirstIndex() uint64
	LastIndex() uint64
	// TermAt returns the Raft term of the frame at index.
	TermAt(index uint64) (uint64, error)
	// ReadFramesByIndex returns whole frames with lo <= index < hi, at least
	// one if any, about maxBytes in all.
	ReadFramesByIndex(lo, hi uint64, maxBytes int) ([]byte, error)
	// HeadersByIndex calls fn with the header of every frame with lo <=
	// index < hi, in order, without copying the frames out.
	HeadersByIndex(lo, hi uint64, fn func(batch.Header)) error
	// TruncateSuffixAtIndex drops every frame with an index >= index.
	TruncateSuffixAtIndex(index uint64) error
	// StartOffset is the first offset retained.
	StartOffset() uint64
	// ReadFrames returns the data frames from the one holding offset from,
	// before endOffset, about maxBytes in all.
	ReadFrames(from uint64, maxBytes int, endOffset uint64) ([]byte, error)

	// Log compaction (see Replica.Compact): the oldest segments retention
	// would delete, and their deletion.
	RetentionCandidates() ([]segment.SegmentInfo, error)
	DeletePrefix(offset uint64) error
	// Compaction by key (see Replica.PrepareRewrite): seal what lies
	// below an offset, and list the sealed segments.
	SealBefore(offset uint64) error
	Sealed() []segment.SegmentInfo

	// Snapshot installation (see Replica.ReceiveSnapshot): a replacement
	// log written beside this one, then swapped in. BeginStaging and the
	// Staging's methods are safe on any goroutine; Install is the
	// appender's.
	BeginStaging(startOffset, firstIndex uint64) (*segment.Staging, error)
	Install(st *segment.Staging) error
}

// HardState is what a replica persists besides its log: Raft's term and
// vote, the configuration, and the point the log was compacted to.
type HardState struct {
	Raft *raftpb.HardState
	Conf *raftpb.ConfState
	// ConfIndex is the index of the configuration change Conf reflects.
	ConfIndex uint64
	// SnapshotIndex and SnapshotTerm name the compaction point: the last
	// entry compacted away, or the index of the snapshot installed last.
	// Raft sees the log start at SnapshotIndex+1, even where older frames
	// are still on disk (they are kept for readers, never used by Raft).
	SnapshotIndex uint64
	SnapshotTerm  uint64
	// SnapshotNextOffset is the offset after the entry at SnapshotIndex,
	// and SnapshotAppendUnixNanos the newest append time up to it: what a
	// log that retains nothing after the compaction point continues from.
	SnapshotNextOffset      uint64
	SnapshotAppendUnixNanos int64
	// CompactedEpoch is the highest homing epoch of a data frame that
	// compaction deleted, or that an installed snapshot's body held (at
	// or below the compaction point, compaction deletes those without
	// reading them) (0: none, or a state saved before it was kept).
	// A log that retention deleted whole still knows its epoch after a
	// restart (HighestEpoch, the mirror's log epoch): without it a
	// restarted mirror would report no log epoch, and a new home would not
	// resend to it from its epoch change (notes/simgaps.md, P2).
	CompactedEpoch uint64
	// SharedFloor is 1 + the compaction floor this replica last learned
	// from a leader and kept, or, while it led, its own (0: none;
	// floor.go): a restarted follower holds to it until its leader's next
	// floor message. Never above the floor learned or held since (a lower
	// one is saved as it arrives).
	SharedFloor uint64
	// MarkTrusted (from Load, never saved) says the commit index covers
	// everything the replica published before it stopped: the commit
	// mark's record was synced, or written in this boot. MarkSynced says
	// the record was synced (SaveCommit with clean): a WriteCommit must
	// not land over it unsynced.
	MarkTrusted, MarkSynced bool
	// Producers is the idempotence state as of SnapshotIndex (the producer
	// base, see producers.go), encoded; nil when empty.
	Producers []byte
	// Installing is set, with the snapshot's description, only while a
	// snapshot's log is being swapped in (see installSnapshot): a replica
	// that finds it on opening tells from its log whether the swap
	// happened.
	Installing *SnapshotMeta
	// Forking is set only while a fork's truncation of the log is under
	// way (see applyFork): a replica that finds it on opening completes it.
	Forking *ForkMeta
}

// SnapshotMeta describes a snapshot being installed.
type SnapshotMeta struct {
	Index, Term     uint64
	NextOffset      uint64
	AppendUnixNanos int64
	Conf            *raftpb.ConfState
	Producers       []byte
	// CompactedEpoch is the higher of the sender's compacted epoch
	// (snapshotDesc) and the body's data frames' highest: the install
	// raises HardState.CompactedEpoch to it.
	CompactedEpoch uint64
}

// AppliedConfIndex is the index a restarted replica has applied for sure:
// entries after it are delivered again and re-applied (idempotently), so a
// configuration change is never applied twice.
func (h HardState) AppliedConfIndex() uint64 {
	return min(max(h.ConfIndex, h.SnapshotIndex), h.Raft.GetCommit())
}

// StateStore persists a replica's HardState atomically and durably, and
// its commit mark where the log cannot hold it (commitmark.go).
type StateStore interface {
	// Load returns the state last saved; its Raft commit index is the
	// higher of the one saved with it and the last commit mark.
	Load() (HardState, bool, error)
	Save(HardState) error
	// OpenCommitWriter opens the commit mark's record for WriteCommit,
	// which records that the log's entries up to index are
	// committed (and held here), without an fdatasync: a few bytes
	// rewritten in place, stamped with the machine's boot. Load returns at
	// least index as the commit index from then on, with MarkTrusted,
	// across the process's crash; after the machine's, Load may return
	// less, and MarkTrusted false (commitmark.go: the replica relearns
	// what it published). A torn record is detected and ignored.
	//
	// The writer keeps what it needs open (a descriptor) until Close:
	// publication writes the record at every commit no log mark covers.
	OpenCommitWriter() (CommitWriter, error)
	// SaveCommit is a CommitWriter's WriteCommit made durable (one fdatasync). clean makes
	// the record trusted in a later boot too: a replica's last mark, on
	// Close, after which nothing is published.
	SaveCommit(index uint64, clean bool) error
}

// CommitWriter rewrites a StateStore's commit mark record in place, without
// an fdatasync (StateStore.OpenCommitWriter).
type CommitWriter interface {
	WriteCommit(index uint64) error
	Close() error
}

// Configuration-change payloads start with a byte saying which kind of
// ConfChange follows, so the entry type survives the round trip through a
// control frame.
const (
	confChangeV1 byte = 1
	confChangeV2 byte = 2
)

// errBadEntry reports an entry that cannot be turned into a frame.
var errBadEntry = errors.New("replica: malformed raft entry")

// entryFrame encodes the entry as the frame to store and returns its header.
// nextOffset is the log's next offset and appendTimeUnixNanos its newest
// append time, which control frames carry (they take no offset and must not
// move time backwards). Data entries already hold a frame (built by the
// leader); it is validated once here, and a copy gets the entry's term and
// index, so what raft holds is never mutated.
func entryFrame(e *raftpb.Entry, nextOffset, epoch uint64, appendTimeUnixNanos int64) ([]byte, batch.Header, error) {
	h := batch.Header{BaseOffset: nextOffset, Epoch: epoch, Term: e.GetTerm(), Index: e.GetIndex(), AppendTimeUnixNanos: appendTimeUnixNanos}
	switch e.GetType() {
	case raftpb.EntryNormal:
		if len(e.Data) == 0 {
			h.Type = batch.TypeNoop
			return batch.EncodeControl(nil, h, nil), h, nil
		}
		dh, err := batch.Validate(e.Data)
		if err != nil {
			return nil, batch.Header{}, fmt.Errorf("%w: entry %d: %w", errBadEntry, e.GetIndex(), err)
		}
		frame := append([]byte(nil), e.Data...)
		batch.PatchRaft(frame, e.GetTerm(), e.GetIndex())
		dh.Term, dh.Index = e.GetTerm(), e.GetIndex()
		return frame, dh, nil
	case raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
		kind := confChangeV1
		if e.GetType() == raftpb.EntryConfChangeV2 {
			kind = confChangeV2
		}
		h.Type = batch.TypeConfig
		return batch.EncodeControl(nil, h, append([]byte{kind}, e.Data...)), h, nil
	default:
		return nil, batch.Header{}, fmt.Errorf("%w: entry %d has type %v", errBadEntry, e.GetIndex(), e.GetType())
	}
}

// frameEntry decodes one stored frame back into the raft entry it holds.
func frameEntry(frame []byte) (*raftpb.Entry, error) {
	h, err := batch.DecodeHeader(frame)
	if err != nil {
		return nil, err
	}
	e := &raftpb.Entry{Term: proto.Uint64(h.Term), Index: proto.Uint64(h.Index), Type: raftpb.EntryNormal.Enum()}
	switch h.Type {
	case batch.TypeData, batch.TypeFork, batch.TypeCompact, batch.TypeSplit:
		// A fork entry's and a marker's data is its frame, as a data
		// entry's (fork.go, compact.go, split.go).
		e.Data = frame
	case batch.TypeNoop:
	case batch.TypeConfig:
		_, payload, err := batch.DecodeControl(frame)
		if err != nil {
			return nil, err
		}
		if len(payload) == 0 {
			return nil, fmt.Errorf("%w: config frame at index %d has no payload", errBadEntry, h.Index)
		}
		switch payload[0] {
		case confChangeV1:
			e.Type = raftpb.EntryConfChange.Enum()
		case confChangeV2:
			e.Type = raftpb.EntryConfChangeV2.Enum()
		default:
			return nil, fmt.Errorf("%w: config frame at index %d has kind %d", errBadEntry, h.Index, payload[0])
		}
		e.Data = payload[1:]
	default:
		return nil, fmt.Errorf("%w: frame type %v", errBadEntry, h.Type)
	}
	return e, nil
}
