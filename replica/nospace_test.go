package replica

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/segment"
	"github.com/geolog/geolog/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// newMemDiskCluster is a cluster of three whose nodes keep their logs on
// in-memory file systems of their own (fsynced), so that a test can fill
// one node's disk.
func newMemDiskCluster(t *testing.T) (*cluster, map[uint64]*vfs.Mem) {
	mems := map[uint64]*vfs.Mem{}
	c := newClusterOpts(t, 3, 3, func(c *cluster) {
		c.storeCfg = func(id uint64, cfg *segment.Config) {
			if mems[id] == nil {
				mems[id] = vfs.NewMem(rand.New(rand.NewPCG(id, 11)))
			}
			cfg.FS, cfg.Dir, cfg.Fsync = mems[id], fmt.Sprintf("/node%d", id), segment.FsyncAlways
			cfg.SegmentBytesMax = segment.SegmentBytesMaxMin
		}
		// The hard state lives on the same disk.
		c.repCfg = func(id uint64, cfg *Config) {
			cfg.State = FileState{FS: mems[id], Dir: fmt.Sprintf("/node%d", id)}
		}
	})
	return c, mems
}

// proposeN proposes n appends of producer 9 from sequence seq on the
// leader and settles.
func proposeN(c *cluster, leader uint64, seq *uint64, n int, res *[]Result) {
	for i := 0; i < n; i++ {
		c.replicas[leader].Propose(op(9, *seq, 2, fmt.Sprintf("v%d", *seq), res))
		*seq += 2
	}
	c.settle()
}

// checkAcks fails unless res holds want results, all successful.
func checkAcks(t *testing.T, res []Result, want int) {
	t.Helper()
	if len(res) != want {
		t.Fatalf("%d answers, want %d", len(res), want)
	}
	for _, r := range res {
		if r.Err != nil {
			t.Fatalf("append answered %v", r.Err)
		}
	}
}

// sameLogs fails unless every node's log holds the same frames.
func sameLogs(t *testing.T, c *cluster) {
	t.Helper()
	var first []byte
	for _, id := range c.ids {
		st := c.logs[id]
		b, err := st.ReadFrames(0, segment.ReadBytesMax, st.NextOffset())
		if err != nil {
			t.Fatalf("node %d: read: %v", id, err)
		}
		if first == nil {
			first = b
		} else if !bytes.Equal(first, b) {
			t.Fatalf("node %d's log differs from node %d's", id, c.ids[0])
		}
	}
}

// TestFollowerDiskFull: a follower whose disk fills does not ack the
// leader's appends (the quorum of the other two commits them), does not
// fail, keeps serving what it had committed, and catches up on its own
// once space returns, with the same log as the others.
func TestFollowerDiskFull(t *testing.T) {
	c, mems := newMemDiskCluster(t)
	c.elect(1)
	var res []Result
	var seq uint64
	proposeN(c, 1, &seq, 5, &res)
	checkAcks(t, res, 5)
	before := c.replicas[3].Committed()

	mems[3].SetSpaceBytes(mems[3].UsedBytes())
	proposeN(c, 1, &seq, 5, &res)
	checkAcks(t, res, 10)
	if c.replicas[3].DiskFull() == nil || c.replicas[3].Failure() != nil {
		t.Fatalf("node 3: disk full %v, failure %v", c.replicas[3].DiskFull(), c.replicas[3].Failure())
	}
	last := c.logs[1].LastIndex()
	if m := c.replicas[1].Status().Progress[3].Match; m >= last {
		t.Fatalf("node 3 acked index %d, its disk is full (leader at %d)", m, last)
	}
	if got := c.replicas[3].Committed(); got != before {
		t.Fatalf("node 3 publishes %d, had %d and wrote nothing since", got, before)
	}
	if _, err := c.logs[3].ReadFrames(0, segment.ReadBytesMax, before); err != nil {
		t.Fatalf("node 3: read of its committed prefix: %v", err)
	}
	// A new term while the disk is full: node 3 records it in place and
	// serves on (a full disk must not stop it at the next election).
	c.transfer(2)
	proposeN(c, 2, &seq, 3, &res)
	checkAcks(t, res, 13)
	if f := c.replicas[3].Failure(); f != nil {
		t.Fatalf("node 3 stopped at a new term on a full disk: %v", f)
	}

	mems[3].SetSpaceBytes(0)
	c.tick(3)
	if c.replicas[3].DiskFull() != nil {
		t.Fatalf("node 3 still disk full: %v", c.replicas[3].DiskFull())
	}
	if m := c.replicas[2].Status().Progress[3].Match; m != c.logs[2].LastIndex() {
		t.Fatalf("node 3 matches %d after space returned, leader at %d", m, c.logs[2].LastIndex())
	}
	if c.replicas[3].Committed() != c.replicas[2].Committed() {
		t.Fatalf("committed: node 3 %d, leader %d", c.replicas[3].Committed(), c.replicas[2].Committed())
	}
	sameLogs(t, c)

	// Node 3 restarts on what its disk holds: the term it saved in place.
	term := c.replicas[2].Status().GetTerm()
	c.stop(3)
	c.start(3)
	if got := c.replicas[3].Status().GetTerm(); got != term {
		t.Fatalf("node 3 restarted at term %d, want %d", got, term)
	}
}

// TestLeaderDiskFull: a leader whose disk fills does not count itself
// toward the quorum of the append it could not write: with one follower
// cut off the append is not answered; it refuses new appends with a
// retriable UNAVAILABLE; once space returns it writes what it held,
// answers it and takes appends again. No acknowledged record is lost and
// no torn frame stays.
func TestLeaderDiskFull(t *testing.T) {
	c, mems := newMemDiskCluster(t)
	c.elect(1)
	var res []Result
	var seq uint64
	proposeN(c, 1, &seq, 5, &res)
	checkAcks(t, res, 5)

	c.cut[3] = true
	// Room for a part of the next frame: the write lands in part.
	mems[1].SetSpaceBytes(mems[1].UsedBytes() + 10)
	proposeN(c, 1, &seq, 1, &res)
	if len(res) != 5 {
		t.Fatalf("leader answered an append only one of three disks holds: %+v", res[5:])
	}
	if c.replicas[1].DiskFull() == nil || c.replicas[1].Failure() != nil {
		t.Fatalf("leader: disk full %v, failure %v", c.replicas[1].DiskFull(), c.replicas[1].Failure())
	}
	if m, last := c.replicas[1].Status().Progress[1].Match, c.logs[2].LastIndex(); m >= last {
		t.Fatalf("leader counts itself at index %d, node 2 holds %d and the leader's disk is full", m, last)
	}
	var refused []Result
	c.replicas[1].Propose(op(9, seq, 2, "refused", &refused))
	if len(refused) != 1 || refused[0].Err == nil {
		t.Fatalf("proposal on a full leader answered %+v, want an error", refused)
	}
	if e := apierr.As(refused[0].Err); e.Code != apierr.Unavailable || !e.Retriable {
		t.Fatalf("proposal on a full leader: %v, want a retriable UNAVAILABLE", refused[0].Err)
	}

	mems[1].SetSpaceBytes(0)
	c.tick(3)
	checkAcks(t, res, 6)
	c.cut[3] = false
	c.tick(3)
	if c.replicas[1].DiskFull() != nil {
		t.Fatalf("leader still disk full: %v", c.replicas[1].DiskFull())
	}
	proposeN(c, 1, &seq, 3, &res)
	checkAcks(t, res, 9)
	sameLogs(t, c)

	// What is on the leader's disk verifies from end to end after a crash.
	c.replicas[1].Close()
	c.logs[1].Close()
	crashed := mems[1].Crash()
	st, err := segment.Open(segment.Config{FS: crashed, Dir: "/node1"})
	if err != nil {
		t.Fatalf("reopen after crash: %v", err)
	}
	defer st.Close()
	if st.NextOffset() != c.logs[2].NextOffset() {
		t.Fatalf("leader's log ends at %d after a crash, node 2's at %d", st.NextOffset(), c.logs[2].NextOffset())
	}
	c.logs[1], c.replicas[1] = nil, nil
}

// TestSaveTermVoteInPlace: a term and vote saved in place are loaded over
// the state file's older ones, a torn slot falls back to the other, and a
// later full Save wins.
func TestSaveTermVoteInPlace(t *testing.T) {
	mem := vfs.NewMem(rand.New(rand.NewPCG(4, 4)))
	if err := mem.MkdirAll("/r", 0o700); err != nil {
		t.Fatal(err)
	}
	fsState := FileState{FS: mem, Dir: "/r"}
	h := HardState{Raft: &raftpb.HardState{Term: proto.Uint64(3), Vote: proto.Uint64(1)}, Conf: &raftpb.ConfState{Voters: []uint64{1, 2, 3}}}
	if err := fsState.Save(h); err != nil {
		t.Fatal(err)
	}
	load := func() (uint64, uint64) {
		t.Helper()
		got, ok, err := fsState.Load()
		if err != nil || !ok {
			t.Fatalf("Load: %v %v", ok, err)
		}
		return got.Raft.GetTerm(), got.Raft.GetVote()
	}
	if err := fsState.SaveTermVote(5, 2); err != nil {
		t.Fatal(err)
	}
	if term, vote := load(); term != 5 || vote != 2 {
		t.Fatalf("loaded term %d vote %d, want 5 2", term, vote)
	}
	if err := fsState.SaveTermVote(6, 0); err != nil {
		t.Fatal(err)
	}
	if term, vote := load(); term != 6 || vote != 0 {
		t.Fatalf("loaded term %d vote %d, want 6 0", term, vote)
	}
	// Tear term 6's slot (the second: each save takes the older slot):
	// term 5's stands.
	w, err := mem.OpenFile("/r/"+termVoteFileName, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt([]byte{0xff}, termVoteSlotBytes+3); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if term, vote := load(); term != 5 || vote != 2 {
		t.Fatalf("with a torn slot: term %d vote %d, want 5 2", term, vote)
	}
	h.Raft = &raftpb.HardState{Term: proto.Uint64(9), Vote: proto.Uint64(3)}
	if err := fsState.Save(h); err != nil {
		t.Fatal(err)
	}
	if term, vote := load(); term != 9 || vote != 3 {
		t.Fatalf("after a full Save: term %d vote %d, want 9 3", term, vote)
	}
}

// TestFollowerDiskFullAcksWhatFits: of several writes a follower's writer
// takes at once, those the disk takes whole are made durable and acked;
// the rest wait for space.
func TestFollowerDiskFullAcksWhatFits(t *testing.T) {
	c, mems := newMemDiskCluster(t)
	c.elect(1)
	var res []Result
	var seq uint64
	proposeN(c, 1, &seq, 2, &res)
	before := c.replicas[1].Status().Progress[3].Match
	c.holdWrites[3] = true // three appends queue up on node 3
	for i := 0; i < 3; i++ {
		proposeN(c, 1, &seq, 1, &res)
	}
	frame, err := c.logs[1].ReadFramesByIndex(c.logs[1].LastIndex(), c.logs[1].LastIndex()+1, 1<<20)
	if err != nil || len(frame) == 0 {
		t.Fatalf("leader's last frame: %v", err)
	}
	// Room for one of the three frames and a part of the next.
	mems[3].SetSpaceBytes(mems[3].UsedBytes() + int64(len(frame)) + int64(len(frame))/2)
	c.holdWrites[3] = false
	c.settle()
	if c.replicas[3].DiskFull() == nil {
		t.Fatal("node 3 wrote three frames into the room of one and a half")
	}
	if m := c.replicas[1].Status().Progress[3].Match; m != before+1 {
		t.Fatalf("node 3 matches %d, want %d (the one append that fitted)", m, before+1)
	}
	mems[3].SetSpaceBytes(0)
	c.tick(3)
	if m, last := c.replicas[1].Status().Progress[3].Match, c.logs[1].LastIndex(); m != last {
		t.Fatalf("node 3 matches %d after space returned, leader at %d", m, last)
	}
	checkAcks(t, res, 5)
	sameLogs(t, c)
}

// FuzzTermVote: any bytes in the term and vote file decode without a
// panic; a slot that decodes re-encodes to its bytes; Load either refuses
// the file (too large) or returns a term and vote no older than the state
// file's.
func FuzzTermVote(f *testing.F) {
	f.Add(encodeTermVote(3, 1))
	f.Add(append(encodeTermVote(3, 1), encodeTermVote(4, 0)...))
	f.Add(append(make([]byte, termVoteSlotBytes), encodeTermVote(9, 2)[:20]...))
	f.Add([]byte("GLTV"))
	f.Fuzz(func(t *testing.T, b []byte) {
		term, vote, ok, next := decodeTermVote(b)
		if next != 0 && next != 1 {
			t.Fatalf("next slot %d", next)
		}
		if ok {
			found := false
			for i := 0; i+termVoteSlotBytes <= len(b) && i < 2*termVoteSlotBytes; i += termVoteSlotBytes {
				found = found || string(b[i:i+termVoteSlotBytes]) == string(encodeTermVote(term, vote))
			}
			if !found {
				t.Fatal("the decoded record is in no slot")
			}
		}
		mem := vfs.NewMem(rand.New(rand.NewPCG(5, 5)))
		if err := mem.MkdirAll("/r", 0o700); err != nil {
			t.Fatal(err)
		}
		st := FileState{FS: mem, Dir: "/r"}
		hs := HardState{Raft: &raftpb.HardState{Term: proto.Uint64(2), Vote: proto.Uint64(1)}, Conf: &raftpb.ConfState{Voters: []uint64{1}}}
		if err := st.Save(hs); err != nil {
			t.Fatal(err)
		}
		w, err := mem.OpenFile("/r/"+termVoteFileName, os.O_WRONLY|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		w.WriteAt(b, 0)
		w.Close()
		got, loaded, err := st.Load()
		if err != nil {
			if len(b) <= 2*termVoteSlotBytes {
				t.Fatalf("Load of a file of %d bytes: %v", len(b), err)
			}
			return
		}
		if !loaded || got.Raft.GetTerm() < 2 || (got.Raft.GetTerm() == 2 && got.Raft.GetVote() != 1) {
			t.Fatalf("Load: term %d vote %d, the state file says 2 1", got.Raft.GetTerm(), got.Raft.GetVote())
		}
		// A save after it lands, and is what Load returns.
		if err := st.SaveTermVote(got.Raft.GetTerm()+1, 3); err != nil {
			t.Fatal(err)
		}
		if again, _, err := st.Load(); err != nil || again.Raft.GetTerm() != got.Raft.GetTerm()+1 || again.Raft.GetVote() != 3 {
			t.Fatalf("after SaveTermVote(%d, 3): %v, %v", got.Raft.GetTerm()+1, again.Raft, err)
		}
	})
}
