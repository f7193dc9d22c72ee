package replica

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/geolog/geolog/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

func TestFileStateRoundTripAndCrash(t *testing.T) {
	mem := vfs.NewMem(rand.New(rand.NewPCG(1, 1)))
	if err := mem.MkdirAll("/r", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := mem.SyncDir("/"); err != nil { // the directory itself must be durable
		t.Fatal(err)
	}
	fsState := FileState{FS: mem, Dir: "/r"}
	if _, ok, err := fsState.Load(); ok || err != nil {
		t.Fatalf("empty: %v %v", ok, err)
	}
	want := HardState{
		Raft:      &raftpb.HardState{Term: proto.Uint64(5), Vote: proto.Uint64(2), Commit: proto.Uint64(40)},
		Conf:      &raftpb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}, AutoLeave: proto.Bool(false)},
		ConfIndex: 12, SnapshotIndex: 3, SnapshotTerm: 1,
	}
	if err := fsState.Save(want); err != nil {
		t.Fatal(err)
	}
	for seed := int64(0); seed < 20; seed++ {
		crashed := mem.Crash()
		got, ok, err := FileState{FS: crashed, Dir: "/r"}.Load()
		if !ok || err != nil || got.Raft.GetTerm() != 5 || got.Raft.GetVote() != 2 || got.ConfIndex != 12 ||
			len(got.Conf.GetVoters()) != 3 || got.Conf.GetLearners()[0] != 4 {
			t.Fatalf("after crash: %+v %v %v", got, ok, err)
		}
	}
	// A damaged file is a typed error, not a silently empty state.
	w, _ := mem.OpenFile("/r/_raftstate", 2, 0)
	w.WriteAt([]byte{0xff}, 10)
	w.Close()
	if _, _, err := fsState.Load(); !errors.Is(err, ErrStateCorrupt) {
		t.Fatalf("corrupt file: %v", err)
	}
}

// A state's first Save creates the commit mark's file, so that a lone mark
// written once the disk is full rewrites it in place and succeeds.
func TestCommitMarkSavedOnAFullDisk(t *testing.T) {
	mem := vfs.NewMem(rand.New(rand.NewPCG(1, 1)))
	if err := mem.MkdirAll("/r", 0o755); err != nil {
		t.Fatal(err)
	}
	st := FileState{FS: mem, Dir: "/r"}
	h := HardState{Raft: &raftpb.HardState{Term: proto.Uint64(1), Commit: proto.Uint64(3)}, Conf: &raftpb.ConfState{Voters: []uint64{1}}}
	if err := st.Save(h); err != nil {
		t.Fatal(err)
	}
	if got, err := st.loadCommit(); err != nil || got.index != 3 {
		t.Fatalf("commit mark after the first Save: %d, %v; want the state's 3", got.index, err)
	}
	mem.SetSpaceBytes(mem.UsedBytes()) // not a byte free
	if err := st.SaveCommit(9, false); err != nil {
		t.Fatalf("a lone mark on a full disk: %v", err)
	}
	got, ok, err := st.Load()
	if !ok || err != nil || got.Raft.GetCommit() != 9 {
		t.Fatalf("state after the mark: commit %d, %v, %v", got.Raft.GetCommit(), ok, err)
	}
}
