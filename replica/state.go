package replica

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/geolog/geolog/vfs"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// stateFileName is the hard state file inside a range's directory (the
// segment store leaves names starting with "_" alone).
const stateFileName = "_raftstate"

// ErrStateCorrupt reports a hard state file that fails its checksum.
var ErrStateCorrupt = errors.New("replica: hard state file is corrupt")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// stateDisk is the JSON body of the hard state file.
type stateDisk struct {
	Term          uint64   `json:"term"`
	Vote          uint64   `json:"vote"`
	Commit        uint64   `json:"commit"`
	Voters        []uint64 `json:"voters"`
	Learners      []uint64 `json:"learners,omitempty"`
	VotersOut     []uint64 `json:"voters_outgoing,omitempty"`
	LearnersNext  []uint64 `json:"learners_next,omitempty"`
	AutoLeave     bool     `json:"auto_leave,omitempty"`
	ConfIndex     uint64   `json:"conf_index"`
	SnapshotIndex uint64   `json:"snapshot_index"`
	SnapshotTerm  uint64   `json:"snapshot_term"`
	// Added with log compaction; absent (zero) in older files.
	SnapshotNextOffset      uint64          `json:"snapshot_next_offset,omitempty"`
	SnapshotAppendUnixNanos int64           `json:"snapshot_append_unix_nanos,omitempty"`
	Producers               []byte          `json:"producers,omitempty"`
	Installing              *installingDisk `json:"installing,omitempty"`
	// Added with forks; absent in older files.
	Forking *forkingDisk `json:"forking,omitempty"`
}

// forkingDisk is HardState.Forking on disk.
type forkingDisk struct {
	Record    ForkRecord `json:"record"`
	Reset     bool       `json:"reset,omitempty"`
	Producers []byte     `json:"producers,omitempty"`
	Tail      [][]byte   `json:"tail"`
}

// installingDisk is HardState.Installing on disk.
type installingDisk struct {
	Index           uint64   `json:"index"`
	Term            uint64   `json:"term"`
	NextOffset      uint64   `json:"next_offset"`
	AppendUnixNanos int64    `json:"append_unix_nanos"`
	Voters          []uint64 `json:"voters"`
	Learners        []uint64 `json:"learners,omitempty"`
	VotersOut       []uint64 `json:"voters_outgoing,omitempty"`
	LearnersNext    []uint64 `json:"learners_next,omitempty"`
	AutoLeave       bool     `json:"auto_leave,omitempty"`
	Producers       []byte   `json:"producers,omitempty"`
}

// encodeState frames the state as a CRC32C (4 bytes) followed by JSON.
func encodeState(h HardState) ([]byte, error) {
	d := stateDisk{
		Term: h.Raft.GetTerm(), Vote: h.Raft.GetVote(), Commit: h.Raft.GetCommit(),
		Voters: h.Conf.GetVoters(), Learners: h.Conf.GetLearners(),
		VotersOut: h.Conf.GetVotersOutgoing(), LearnersNext: h.Conf.GetLearnersNext(),
		AutoLeave: h.Conf.GetAutoLeave(), ConfIndex: h.ConfIndex,
		SnapshotIndex: h.SnapshotIndex, SnapshotTerm: h.SnapshotTerm,
		SnapshotNextOffset: h.SnapshotNextOffset, SnapshotAppendUnixNanos: h.SnapshotAppendUnixNanos,
		Producers: h.Producers,
	}
	if m := h.Forking; m != nil {
		d.Forking = &forkingDisk{Record: m.Record, Reset: m.Reset, Producers: m.Producers, Tail: m.Tail}
	}
	if m := h.Installing; m != nil {
		d.Installing = &installingDisk{Index: m.Index, Term: m.Term, NextOffset: m.NextOffset, AppendUnixNanos: m.AppendUnixNanos,
			Producers: m.Producers,
			Voters:    m.Conf.GetVoters(), Learners: m.Conf.GetLearners(), VotersOut: m.Conf.GetVotersOutgoing(),
			LearnersNext: m.Conf.GetLearnersNext(), AutoLeave: m.Conf.GetAutoLeave()}
	}
	body, err := json.Marshal(d)
	if err != nil {
		return nil, err
	}
	out := binary.LittleEndian.AppendUint32(nil, crc32.Checksum(body, castagnoli))
	return append(out, body...), nil
}

func decodeState(b []byte) (HardState, error) {
	if len(b) < 4 || binary.LittleEndian.Uint32(b) != crc32.Checksum(b[4:], castagnoli) {
		return HardState{}, ErrStateCorrupt
	}
	var d stateDisk
	if err := json.Unmarshal(b[4:], &d); err != nil {
		return HardState{}, fmt.Errorf("%w: %w", ErrStateCorrupt, err)
	}
	h := HardState{
		Raft: &raftpb.HardState{Term: proto.Uint64(d.Term), Vote: proto.Uint64(d.Vote), Commit: proto.Uint64(d.Commit)},
		Conf: &raftpb.ConfState{Voters: d.Voters, Learners: d.Learners, VotersOutgoing: d.VotersOut,
			LearnersNext: d.LearnersNext, AutoLeave: proto.Bool(d.AutoLeave)},
		ConfIndex: d.ConfIndex, SnapshotIndex: d.SnapshotIndex, SnapshotTerm: d.SnapshotTerm,
		SnapshotNextOffset: d.SnapshotNextOffset, SnapshotAppendUnixNanos: d.SnapshotAppendUnixNanos,
		Producers: d.Producers,
	}
	if m := d.Forking; m != nil {
		h.Forking = &ForkMeta{Record: m.Record, Reset: m.Reset, Producers: m.Producers, Tail: m.Tail}
	}
	if m := d.Installing; m != nil {
		h.Installing = &SnapshotMeta{Index: m.Index, Term: m.Term, NextOffset: m.NextOffset, AppendUnixNanos: m.AppendUnixNanos,
			Producers: m.Producers,
			Conf: &raftpb.ConfState{Voters: m.Voters, Learners: m.Learners, VotersOutgoing: m.VotersOut,
				LearnersNext: m.LearnersNext, AutoLeave: proto.Bool(m.AutoLeave)}}
	}
	return h, nil
}

// stateFileBytesMax bounds the hard state file: a few numbers, the
// configuration and the producer base (bounded by producerBaseBytesMax, in
// base64 twice while an install or a fork is recorded), and while a fork
// is recorded the frames after it (forkTailBytesMax, in base64).
const stateFileBytesMax = 4*producerBaseBytesMax + 2*forkTailBytesMax + 1<<20

// FileState is a StateStore in one small file of a range's directory,
// replaced atomically: write a temporary file, fsync it, rename it over the
// old one, fsync the directory.
type FileState struct {
	FS  vfs.FS
	Dir string
}

// Load reads the state; ok is false when none was saved yet.
func (f FileState) Load() (HardState, bool, error) {
	b, err := vfs.ReadFile(f.FS, filepath.Join(f.Dir, stateFileName), stateFileBytesMax)
	if errors.Is(err, fs.ErrNotExist) {
		return HardState{}, false, nil
	}
	if err != nil {
		return HardState{}, false, err
	}
	h, err := decodeState(b)
	return h, err == nil, err
}

// Save replaces the state durably.
func (f FileState) Save(h HardState) error {
	b, err := encodeState(h)
	if err != nil {
		return err
	}
	tmp := filepath.Join(f.Dir, stateFileName+".tmp")
	w, err := f.FS.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := w.WriteAt(b, 0); err != nil {
		w.Close()
		return err
	}
	if err := w.Datasync(); err != nil {
		w.Close()
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	if err := f.FS.Rename(tmp, filepath.Join(f.Dir, stateFileName)); err != nil {
		return err
	}
	return f.FS.SyncDir(f.Dir)
}

// MemState is the in-memory twin of FileState.
type MemState struct {
	mu    sync.Mutex
	saved []byte
}

// Load returns what was last saved.
func (m *MemState) Load() (HardState, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.saved == nil {
		return HardState{}, false, nil
	}
	h, err := decodeState(m.saved)
	return h, err == nil, err
}

// Save keeps an encoded copy.
func (m *MemState) Save(h HardState) error {
	b, err := encodeState(h)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.saved = b
	m.mu.Unlock()
	return nil
}
