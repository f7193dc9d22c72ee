package regionsvc

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/replica"
	"github.com/geolog/geolog/segment"
	"github.com/geolog/geolog/vfs"
	"go.etcd.io/raft/v3/raftpb"
)

// relearningRange opens a range of one replica on an in-memory disk,
// elects it and writes its log, crashes the machine (vfs.Mem.Crash: a new
// boot) and reopens it: the replica relearns its commit index (replica's
// relearn.go) until it leads again.
func relearningRange(t *testing.T) *rangeDriver {
	t.Helper()
	mem := vfs.NewMem(rand.New(rand.NewPCG(5, 5)))
	open := func(fs vfs.FS) (*segment.Store, *replica.Replica) {
		t.Helper()
		st, err := segment.Open(segment.Config{Dir: "/r", FS: fs, Fsync: segment.FsyncAlways})
		if err != nil {
			t.Fatal(err)
		}
		var headers []batch.Header
		rep, err := replica.New(replica.Config{NodeID: 1, Stream: "s", Peers: []uint64{1}, Log: st,
			State: replica.FileState{FS: fs, Dir: "/r"}, Send: func([]*raftpb.Message) {}}, headers)
		if err != nil {
			t.Fatal(err)
		}
		return st, rep
	}
	run := func(rep *replica.Replica) {
		for rep.HasReady() || rep.HasLogWrites() {
			if err := rep.ProcessReady(); err != nil {
				t.Fatal(err)
			}
			if err := rep.WriteLog(); err != nil {
				t.Fatal(err)
			}
		}
	}
	st, rep := open(mem)
	if err := rep.Campaign(); err != nil {
		t.Fatal(err)
	}
	run(rep)
	if !rep.IsLeader() || rep.Relearning() {
		t.Fatalf("a new group: leader %v, relearning %v", rep.IsLeader(), rep.Relearning())
	}
	crashed := mem.Crash()
	rep.Close()
	st.Close()
	st, rep = open(crashed)
	t.Cleanup(func() { rep.Close(); st.Close() })
	if !rep.Relearning() {
		t.Fatal("not relearning after the machine's crash")
	}
	return &rangeDriver{rep: rep, store: st}
}

// TestRelearningCopyServesNoReader: while a copy relearns its commit index
// after the machine's crash, every read path that answers from this
// node's copy refuses with a retriable NOT_LEADER (the SDK reads at
// another replica), it is no takeover candidate, and a reset of a group's
// cursors "to latest" is refused rather than resolved below what was
// served; once it relearned (its own election, a group of one) it serves.
func TestRelearningCopyServesNoReader(t *testing.T) {
	d := relearningRange(t)
	for name, err := range map[string]error{
		"readable":   d.readable(),
		"relearning": d.relearning(),
	} {
		e := apierr.As(err)
		if e == nil || e.Code != apierr.NotLeader || !strings.Contains(e.Message, "relearning") {
			t.Errorf("%s: %v, want a retriable NOT_LEADER naming the relearning", name, err)
		}
	}
	if tail, ok := candidateTail(d); ok {
		t.Errorf("a relearning copy offers itself to take its range over at %d", tail)
	}
	req := &geologv1.ResetGroupRequest{To: &geologv1.ResetGroupRequest_ToLatest{ToLatest: true}}
	if off, err := resetTarget(context.Background(), d, req); apierr.As(err) == nil || apierr.As(err).Code != apierr.NotLeader {
		t.Errorf("reset to latest on a relearning copy: %d, %v", off, err)
	}
	// Relearned: served again.
	tickRange(t, d, 50)
	if d.rep.Relearning() {
		t.Fatal("a group of one still relearning after 50 ticks")
	}
	if err := d.readable(); err != nil {
		t.Errorf("relearned, reads refused: %v", err)
	}
	if _, ok := candidateTail(d); !ok {
		t.Error("relearned, no takeover candidate")
	}
}

// TestHeardEpochIsNoCandidate: a copy that heard, from a replicator's
// heartbeat, of an epoch newer than both its log's and its directory's
// (its start unknown, so nothing fences a divergent tail past it) offers
// no takeover tail until the directory names that epoch.
func TestHeardEpochIsNoCandidate(t *testing.T) {
	d := relearningRange(t)
	tickRange(t, d, 50)
	d.roleP.Store(&rangeRole{region: "eu", epoch: 2, start: 10})
	if _, ok := candidateTail(d); !ok {
		t.Fatal("a relearned copy with nothing heard is no candidate")
	}
	d.raiseEpoch(2)
	if _, ok := candidateTail(d); !ok {
		t.Fatal("a copy that heard the directory's own epoch is no candidate")
	}
	d.raiseEpoch(3)
	if tail, ok := candidateTail(d); ok {
		t.Fatalf("a copy that heard epoch 3 (the directory says 2) offers itself at %d", tail)
	}
	d.roleP.Store(&rangeRole{region: "ap", epoch: 3, start: 10})
	if _, ok := candidateTail(d); !ok {
		t.Fatal("the directory names epoch 3: still no candidate")
	}
}

// tickRange ticks d's replica n times, running its Ready cycles and log
// writes after each (a group of one relearns and leads within 50).
func tickRange(t *testing.T, d *rangeDriver, n int) {
	t.Helper()
	for range n {
		d.rep.Tick()
		for d.rep.HasReady() || d.rep.HasLogWrites() {
			if err := d.rep.ProcessReady(); err != nil {
				t.Fatal(err)
			}
			if err := d.rep.WriteLog(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// candidateTail is d's copy's tail if it is a takeover candidate.
func candidateTail(d *rangeDriver) (uint64, bool) {
	c := d.candidate()
	if c.relearning || c.barred {
		return 0, false
	}
	return c.tail, true
}
