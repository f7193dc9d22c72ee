package replica

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
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

// commitFileName holds the commit mark's record (SaveCommit, WriteCommit),
// rewritten in place.
const commitFileName = "_commit"

// The commit mark's record, little-endian, at offset 0 (never straddling a
// sector: a write is whole, or detected by its CRC):
//
//   - the current one, commitRecordBytes: the index (u64), the digest of
//     the boot it was written in (commitBootBytes), flags (u32:
//     commitFlagSynced), a magic (u32) and a CRC32C of the 28 bytes
//     before (u32);
//   - the one before boots were recorded, commitRecordV1Bytes: the index
//     (u64), a magic (u32) and a CRC32C of both (u32). It was always
//     fdatasynced, as a synced record is.
//
// A record written without a Datasync (WriteCommit) is trusted only by a
// reader of the same boot (vfs.FS.BootID): a process's crash keeps it in
// the page cache, a machine's may lose it or tear it. A synced one
// (SaveCommit with clean) is trusted in any boot.
const (
	commitRecordBytes   = 32
	commitRecordV1Bytes = 16
	commitBootBytes     = 12
	commitMagic         = 0x4b4d4347 // "GCMK", the first record's
	commitMagicV2       = 0x324d4347 // "GCM2"
	commitFlagSynced    = 1
)

// termVoteFileName holds Raft's term and vote when they change alone
// (SaveTermVote): two slots of termVoteSlotBytes, rewritten in place, so
// that an election needs no new disk space (a full disk must not stop a
// replica at its next term; see docs/disk-faults.md). A slot is (term
// u64, vote u64, magic u32, CRC32C of the 20 bytes before u32),
// little-endian; a save overwrites the older (or invalid) slot, so the
// newest record is never written over and a torn write leaves it. Load
// takes the newest of the slots and the state file's own term and vote.
const (
	termVoteFileName  = "_termvote"
	termVoteSlotBytes = 24
	termVoteMagic     = 0x56544c47 // "GLTV"
)

func encodeTermVote(term, vote uint64) []byte {
	b := binary.LittleEndian.AppendUint64(make([]byte, 0, termVoteSlotBytes), term)
	b = binary.LittleEndian.AppendUint64(b, vote)
	b = binary.LittleEndian.AppendUint32(b, termVoteMagic)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// decodeTermVote returns the newest valid slot of b (ok false: none) and
// the index of the slot to overwrite next: the other one.
func decodeTermVote(b []byte) (term, vote uint64, ok bool, next int) {
	for i := 0; i+termVoteSlotBytes <= len(b) && i < 2*termVoteSlotBytes; i += termVoteSlotBytes {
		s := b[i : i+termVoteSlotBytes]
		if binary.LittleEndian.Uint32(s[16:]) != termVoteMagic || binary.LittleEndian.Uint32(s[20:]) != crc32.Checksum(s[:20], castagnoli) {
			continue
		}
		t, v := binary.LittleEndian.Uint64(s), binary.LittleEndian.Uint64(s[8:])
		if !ok || newerTermVote(t, v, term, vote) {
			term, vote, ok, next = t, v, true, 1-i/termVoteSlotBytes
		}
	}
	return term, vote, ok, next
}

// newerTermVote reports whether (t, v) is later than (term, vote): a
// higher term, or the same term with a vote where there was none (a vote
// is cast once per term).
func newerTermVote(t, v, term, vote uint64) bool {
	return t > term || (t == term && vote == 0 && v != 0)
}

// withTermVote raises h's term and vote to (term, vote) if that is newer.
func withTermVote(h HardState, term, vote uint64) HardState {
	if h.Raft == nil || !newerTermVote(term, vote, h.Raft.GetTerm(), h.Raft.GetVote()) {
		return h
	}
	hs := proto.Clone(h.Raft).(*raftpb.HardState)
	hs.Term, hs.Vote = proto.Uint64(term), proto.Uint64(vote)
	h.Raft = hs
	return h
}

// bootDigest is the digest of a boot ID a commit record holds (all zero
// for an unknown boot, which no reader trusts).
func bootDigest(boot string) (d [commitBootBytes]byte) {
	if boot != "" {
		sum := sha256.Sum256([]byte(boot))
		copy(d[:], sum[:])
	}
	return d
}

func encodeCommit(index uint64, boot [commitBootBytes]byte, synced bool) []byte {
	b := binary.LittleEndian.AppendUint64(make([]byte, 0, commitRecordBytes), index)
	b = append(b, boot[:]...)
	var flags uint32
	if synced {
		flags |= commitFlagSynced
	}
	b = binary.LittleEndian.AppendUint32(b, flags)
	b = binary.LittleEndian.AppendUint32(b, commitMagicV2)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// commitRecord is a decoded commit mark record.
type commitRecord struct {
	index  uint64
	boot   [commitBootBytes]byte
	synced bool
	ok     bool // false: missing, torn or damaged
}

// trusted reports whether the record covers everything published before
// it was read in boot: it was synced, or written in this boot (a
// process's crash keeps what it wrote).
func (c commitRecord) trusted(boot string) bool {
	return c.ok && (c.synced || (boot != "" && c.boot == bootDigest(boot)))
}

// decodeCommit decodes a record of either layout; ok is false for one that
// is missing, torn or damaged.
func decodeCommit(b []byte) commitRecord {
	if len(b) >= commitRecordBytes && binary.LittleEndian.Uint32(b[24:]) == commitMagicV2 &&
		binary.LittleEndian.Uint32(b[28:]) == crc32.Checksum(b[:28], castagnoli) {
		c := commitRecord{index: binary.LittleEndian.Uint64(b), ok: true}
		copy(c.boot[:], b[8:20])
		c.synced = binary.LittleEndian.Uint32(b[20:])&commitFlagSynced != 0
		return c
	}
	if len(b) >= commitRecordV1Bytes && binary.LittleEndian.Uint32(b[8:]) == commitMagic &&
		binary.LittleEndian.Uint32(b[12:]) == crc32.Checksum(b[:12], castagnoli) {
		return commitRecord{index: binary.LittleEndian.Uint64(b), synced: true, ok: true}
	}
	return commitRecord{}
}

// withCommit raises h's Raft commit index to the mark's.
func withCommit(h HardState, mark uint64) HardState {
	if h.Raft == nil || mark <= h.Raft.GetCommit() {
		return h
	}
	hs := proto.Clone(h.Raft).(*raftpb.HardState)
	hs.Commit = proto.Uint64(mark)
	h.Raft = hs
	return h
}

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
	// Added with the compacted epoch (HardState.CompactedEpoch); absent
	// (zero: unknown) in older files, which load as before.
	CompactedEpoch uint64 `json:"compacted_epoch,omitempty"`
	// Added with the shared floor (HardState.SharedFloor); absent (zero:
	// none) in older files.
	SharedFloor uint64 `json:"shared_floor,omitempty"`
}

// forkingDisk is HardState.Forking on disk.
type forkingDisk struct {
	Record    ForkRecord `json:"record"`
	Reset     bool       `json:"reset,omitempty"`
	Producers []byte     `json:"producers,omitempty"`
	Tail      [][]byte   `json:"tail"`
	// Added with skips (ForkMeta.Skip); a binary without them finds no
	// such fork in its orphan log and refuses to open.
	Skip bool `json:"skip,omitempty"`
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
	// Added with the compacted epoch; absent (zero) in older files.
	CompactedEpoch uint64 `json:"compacted_epoch,omitempty"`
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
		Producers: h.Producers, CompactedEpoch: h.CompactedEpoch, SharedFloor: h.SharedFloor,
	}
	if m := h.Forking; m != nil {
		d.Forking = &forkingDisk{Record: m.Record, Reset: m.Reset, Producers: m.Producers, Tail: m.Tail, Skip: m.Skip}
	}
	if m := h.Installing; m != nil {
		d.Installing = &installingDisk{Index: m.Index, Term: m.Term, NextOffset: m.NextOffset, AppendUnixNanos: m.AppendUnixNanos,
			Producers: m.Producers, CompactedEpoch: m.CompactedEpoch,
			Voters: m.Conf.GetVoters(), Learners: m.Conf.GetLearners(), VotersOut: m.Conf.GetVotersOutgoing(),
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
		Producers: d.Producers, CompactedEpoch: d.CompactedEpoch, SharedFloor: d.SharedFloor,
	}
	if m := d.Forking; m != nil {
		h.Forking = &ForkMeta{Record: m.Record, Reset: m.Reset, Producers: m.Producers, Tail: m.Tail, Skip: m.Skip}
	}
	if m := d.Installing; m != nil {
		h.Installing = &SnapshotMeta{Index: m.Index, Term: m.Term, NextOffset: m.NextOffset, AppendUnixNanos: m.AppendUnixNanos,
			Producers: m.Producers, CompactedEpoch: m.CompactedEpoch,
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
	// CommitNoSync skips the commit mark's fdatasync, for a log that is
	// not fsynced either (segment.FsyncNever, benchmarks only): the mark
	// then survives a process crash, not a machine's.
	CommitNoSync bool
}

// Load reads the state, its commit index raised to the commit mark's; ok
// is false when none was saved yet.
func (f FileState) Load() (HardState, bool, error) {
	b, err := vfs.ReadFile(f.FS, filepath.Join(f.Dir, stateFileName), stateFileBytesMax)
	if errors.Is(err, fs.ErrNotExist) {
		return HardState{}, false, nil
	}
	if err != nil {
		return HardState{}, false, err
	}
	h, err := decodeState(b)
	if err != nil {
		return h, false, err
	}
	rec, err := f.loadCommit()
	if err != nil {
		return h, false, err
	}
	h.MarkTrusted, h.MarkSynced = rec.trusted(f.FS.BootID()), rec.synced
	tv, err := vfs.ReadFile(f.FS, filepath.Join(f.Dir, termVoteFileName), 2*termVoteSlotBytes)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return h, false, err
	}
	if term, vote, ok, _ := decodeTermVote(tv); ok {
		h = withTermVote(h, term, vote)
	}
	return withCommit(h, rec.index), true, nil
}

// SaveTermVote durably records a new Raft term and vote, in place (see
// termVoteFileName): Load returns them (or newer ones) from then on. The
// first one creates the file with both slots and syncs the directory.
// For a change of term or vote alone; anything else goes through Save.
func (f FileState) SaveTermVote(term, vote uint64) error {
	w, created, err := f.openInPlace(termVoteFileName, os.O_RDWR)
	if err != nil {
		return err
	}
	cur := make([]byte, 2*termVoteSlotBytes)
	n, err := w.ReadAt(cur, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		w.Close()
		return err
	}
	_, _, _, slot := decodeTermVote(cur[:n])
	data, at := encodeTermVote(term, vote), int64(slot)*termVoteSlotBytes
	if created || n < len(cur) {
		// Both slots at once: later saves rewrite in place.
		both := make([]byte, 2*termVoteSlotBytes)
		copy(both[at:], data)
		data, at = both, 0
	}
	return f.writeInPlace(w, created, data, at, true)
}

// openInPlace opens name in the state's directory for a rewrite in place
// with flag (os.O_WRONLY or os.O_RDWR), creating it if it is missing
// (created: writeInPlace then syncs the directory).
func (f FileState) openInPlace(name string, flag int) (w vfs.File, created bool, err error) {
	path := filepath.Join(f.Dir, name)
	w, err = f.FS.OpenFile(path, flag, 0)
	if errors.Is(err, fs.ErrNotExist) {
		w, err = f.FS.OpenFile(path, os.O_CREATE|flag, 0o600)
		created = true
	}
	return w, created, err
}

// writeInPlace writes data at at in w, fdatasyncs it if sync, closes it
// and, if openInPlace created it, syncs the directory.
func (f FileState) writeInPlace(w vfs.File, created bool, data []byte, at int64, sync bool) error {
	if _, err := w.WriteAt(data, at); err != nil {
		w.Close()
		return err
	}
	if sync {
		if err := w.Datasync(); err != nil {
			w.Close()
			return err
		}
	}
	if err := w.Close(); err != nil {
		return err
	}
	if created {
		return f.FS.SyncDir(f.Dir)
	}
	return nil
}

// loadCommit reads the commit mark's record (not ok when there is none,
// or it is torn or damaged: the state's own commit index then stands).
func (f FileState) loadCommit() (commitRecord, error) {
	r, err := f.FS.OpenFile(filepath.Join(f.Dir, commitFileName), os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return commitRecord{}, nil
	}
	if err != nil {
		return commitRecord{}, err
	}
	defer r.Close()
	b := make([]byte, commitRecordBytes)
	n, err := r.ReadAt(b, 0)
	if n < len(b) && err != nil && !errors.Is(err, io.EOF) {
		return commitRecord{}, err
	}
	return decodeCommit(b[:n]), nil
}

// SaveCommit rewrites the commit mark's record in place, stamped with this
// boot, and fdatasyncs it (the first one creates the file and syncs the
// directory). clean marks it synced: trusted after a reboot too, so it is
// for a replica's last mark (Close) only; any later WriteCommit must come
// after a SaveCommit without clean, or a machine's crash could leave the
// clean record under newer, lost ones.
func (f FileState) SaveCommit(index uint64, clean bool) error {
	w, created, err := f.openInPlace(commitFileName, os.O_WRONLY)
	if err != nil {
		return err
	}
	return f.writeInPlace(w, created, encodeCommit(index, bootDigest(f.FS.BootID()), clean && !f.CommitNoSync), 0, !f.CommitNoSync)
}

// OpenCommitWriter opens the commit mark's file for WriteCommit, which then
// costs one write (the file is created, and its directory synced, first
// if it is missing).
func (f FileState) OpenCommitWriter() (CommitWriter, error) {
	name := filepath.Join(f.Dir, commitFileName)
	w, err := f.FS.OpenFile(name, os.O_WRONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		if err := f.ensureCommitFile(0); err != nil {
			return nil, err
		}
		w, err = f.FS.OpenFile(name, os.O_WRONLY, 0)
	}
	if err != nil {
		return nil, err
	}
	// It stays open, but costs no descriptor while idle: a node's file
	// cache may close it between writes.
	vfs.Unsynced(w)
	return &fileCommitWriter{f: w, boot: bootDigest(f.FS.BootID())}, nil
}

// fileCommitWriter is FileState's CommitWriter.
type fileCommitWriter struct {
	f    vfs.File
	boot [commitBootBytes]byte
}

func (w *fileCommitWriter) WriteCommit(index uint64) error {
	_, err := w.f.WriteAt(encodeCommit(index, w.boot, false), 0)
	return err
}

func (w *fileCommitWriter) Close() error { return w.f.Close() }

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
	if err := f.FS.SyncDir(f.Dir); err != nil {
		return err
	}
	return f.ensureCommitFile(h.Raft.GetCommit())
}

// ensureCommitFile creates the commit mark's file, holding index (the
// state's own commit index: the mark says nothing new), if there is none.
// A lone mark (SaveCommit) then only rewrites bytes in place, which needs
// no free space: a disk that fills up between an append's write and its
// mark refuses appends (segment.ErrNoSpace) but never fails the mark and
// with it the replica. Only a state's first Save creates it; later ones
// find it.
func (f FileState) ensureCommitFile(index uint64) error {
	w, err := f.FS.OpenFile(filepath.Join(f.Dir, commitFileName), os.O_RDONLY, 0)
	if err == nil {
		return w.Close()
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return f.SaveCommit(index, false)
}

// MemState is the in-memory twin of FileState.
type MemState struct {
	mu         sync.Mutex
	saved      []byte
	mark       uint64
	term, vote uint64 // SaveTermVote's
}

// SaveTermVote keeps term and vote.
func (m *MemState) SaveTermVote(term, vote uint64) error {
	m.mu.Lock()
	if newerTermVote(term, vote, m.term, m.vote) {
		m.term, m.vote = term, vote
	}
	m.mu.Unlock()
	return nil
}

// Load returns what was last saved, its commit index raised to the mark's.
func (m *MemState) Load() (HardState, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.saved == nil {
		return HardState{}, false, nil
	}
	h, err := decodeState(m.saved)
	if err != nil {
		return h, false, err
	}
	h.MarkTrusted = true
	return withCommit(withTermVote(h, m.term, m.vote), m.mark), true, nil
}

// SaveCommit keeps the mark.
func (m *MemState) SaveCommit(index uint64, clean bool) error { return m.WriteCommit(index) }

// OpenCommitWriter returns m itself.
func (m *MemState) OpenCommitWriter() (CommitWriter, error) { return memCommitWriter{m}, nil }

type memCommitWriter struct{ *MemState }

func (memCommitWriter) Close() error { return nil }

// WriteCommit keeps the mark. A MemState has no machine to crash: what it
// keeps is trusted (a restart over it is a process's).
func (m *MemState) WriteCommit(index uint64) error {
	m.mu.Lock()
	m.mark = index
	m.mu.Unlock()
	return nil
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
