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
}

// encodeState frames the state as a CRC32C (4 bytes) followed by JSON.
func encodeState(h HardState) ([]byte, error) {
	body, err := json.Marshal(stateDisk{
		Term: h.Raft.GetTerm(), Vote: h.Raft.GetVote(), Commit: h.Raft.GetCommit(),
		Voters: h.Conf.GetVoters(), Learners: h.Conf.GetLearners(),
		VotersOut: h.Conf.GetVotersOutgoing(), LearnersNext: h.Conf.GetLearnersNext(),
		AutoLeave: h.Conf.GetAutoLeave(), ConfIndex: h.ConfIndex,
		SnapshotIndex: h.SnapshotIndex, SnapshotTerm: h.SnapshotTerm,
	})
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
	return HardState{
		Raft: &raftpb.HardState{Term: proto.Uint64(d.Term), Vote: proto.Uint64(d.Vote), Commit: proto.Uint64(d.Commit)},
		Conf: &raftpb.ConfState{Voters: d.Voters, Learners: d.Learners, VotersOutgoing: d.VotersOut,
			LearnersNext: d.LearnersNext, AutoLeave: proto.Bool(d.AutoLeave)},
		ConfIndex: d.ConfIndex, SnapshotIndex: d.SnapshotIndex, SnapshotTerm: d.SnapshotTerm,
	}, nil
}

// stateFileBytesMax bounds the hard state file (it holds a few numbers and
// the configuration).
const stateFileBytesMax = 1 << 20

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
	w, err := f.FS.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
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
