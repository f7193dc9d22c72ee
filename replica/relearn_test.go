package replica

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/geolog/geolog/segment"
	"github.com/geolog/geolog/vfs"
	"go.etcd.io/raft/v3/raftpb"
)

// memNodeCluster is a cluster whose node id keeps its log and its state
// (FileState) on an in-memory disk that models durability (vfs.Mem), so
// that a test can crash the machine (Mem.Crash) or only the process.
func memNodeCluster(t *testing.T, n int, id uint64) (*cluster, **vfs.Mem) {
	t.Helper()
	disk := vfs.NewMem(rand.New(rand.NewPCG(uint64(n), id)))
	if err := disk.MkdirAll("/node", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := disk.SyncDir("/"); err != nil {
		t.Fatal(err)
	}
	c := newClusterOpts(t, n, n, func(c *cluster) {
		c.storeCfg = func(nid uint64, cfg *segment.Config) {
			if nid == id {
				cfg.FS, cfg.Dir, cfg.Fsync = disk, "/node", segment.FsyncAlways
			}
		}
		c.repCfg = func(nid uint64, cfg *Config) {
			if nid == id {
				cfg.State = FileState{FS: disk, Dir: "/node"}
			}
		}
	})
	return c, &disk
}

// TestRelearnAfterMachineCrash (DESIGN.md invariant 8): a follower
// publishes applied entries without an fdatasync of a lone mark. Killed
// (its process only), it restarts trusting its mark record and publishes
// what it published before at once. After its machine's crash it may know
// less: it restarts relearning (no reader may read from it), stays so
// while it cannot reach the leader, and ends once a read index from the
// leader is applied, publishing at least what it published before; it
// then trusts its record again across a process's crash. A mark saved
// clean on a graceful stop is trusted across the machine's restart.
func TestRelearnAfterMachineCrash(t *testing.T) {
	c, disk := memNodeCluster(t, 3, 2)
	c.elect(1)
	var res []Result
	for i := range 10 {
		c.replicas[1].Propose(op(7, uint64(2*i), 2, fmt.Sprint(i), &res))
		c.settle()
	}
	c.tick(2) // the followers learn the last commit
	before := c.replicas[2].Committed()
	if before != 20 {
		t.Fatalf("follower published %d, want 20", before)
	}
	mem := *disk
	// The process's crash: the page cache keeps the unsynced record.
	c.stop(2)
	c.start(2)
	if r := c.replicas[2]; r.Relearning() || r.Committed() < before {
		t.Fatalf("after a process's crash: relearning %v, published %d (was %d)", r.Relearning(), r.Committed(), before)
	}
	// The machine's crash, cut off from the others: no relearning yet.
	relearned := 0
	for seed := range 8 {
		c.stop(2)
		*disk = mem.Crash()
		c.cut[2] = true
		c.start(2)
		r := c.replicas[2]
		if !r.Relearning() {
			t.Fatalf("image %d: not relearning after the machine's crash (published %d)", seed, r.Committed())
		}
		c.tick(30)
		if !r.Relearning() {
			t.Fatalf("image %d: relearned while cut off from the leader", seed)
		}
		c.cut[2] = false
		c.tick(15)
		if r.Relearning() {
			t.Fatalf("image %d: still relearning with the leader reachable", seed)
		}
		if got := r.Committed(); got < before {
			t.Fatalf("image %d: published %d after relearning, below the %d it published before", seed, got, before)
		}
		relearned++
		// Relearned, it stamps its record with this boot: a process's
		// crash now restarts trusted.
		c.stop(2)
		c.start(2)
		if r := c.replicas[2]; r.Relearning() || r.Committed() < before {
			t.Fatalf("image %d: after relearning and a process's crash: relearning %v, published %d", seed, r.Relearning(), r.Committed())
		}
		mem = *disk
	}
	// A graceful stop saves a clean mark: the machine's restart trusts it.
	if err := c.replicas[2].SaveCleanMark(); err != nil {
		t.Fatal(err)
	}
	c.stop(2)
	*disk = mem.Crash()
	c.cut[2] = true
	c.start(2)
	if r := c.replicas[2]; r.Relearning() || r.Committed() < before {
		t.Fatalf("after a clean stop and the machine's restart: relearning %v, published %d (was %d)", r.Relearning(), r.Committed(), before)
	}
	// ... until it publishes unsynced again: the clean record was
	// overwritten durably on open, so the next machine crash relearns.
	c.cut[2] = false
	c.replicas[1].Propose(op(7, 20, 2, "x", &res))
	c.settle()
	c.tick(2)
	mem = *disk
	c.stop(2)
	*disk = mem.Crash()
	c.start(2)
	if !c.replicas[2].Relearning() {
		t.Fatal("after a clean restart, new publications and the machine's crash: not relearning")
	}
}

// TestRelearnGroupOfOne: a group of one relearns from its own election,
// whose entry commits with its own write.
func TestRelearnGroupOfOne(t *testing.T) {
	c, disk := memNodeCluster(t, 1, 1)
	c.elect(1)
	var res []Result
	for i := range 5 {
		c.replicas[1].Propose(op(7, uint64(i), 1, fmt.Sprint(i), &res))
		c.settle()
	}
	before := c.replicas[1].Committed()
	if before != 5 {
		t.Fatalf("published %d, want 5", before)
	}
	c.stop(1)
	*disk = (*disk).Crash()
	c.start(1)
	r := c.replicas[1]
	if !r.Relearning() {
		t.Fatal("not relearning after the machine's crash")
	}
	c.tick(30) // it campaigns on its own
	if r.Relearning() || !r.IsLeader() || r.Committed() < before {
		t.Fatalf("after its election: relearning %v, leader %v, published %d (was %d)", r.Relearning(), r.IsLeader(), r.Committed(), before)
	}
}

// TestRelearnRequestShape: a forwarded read index and its answer carry
// one small context entry; anything else is refused.
func TestRelearnRequestShape(t *testing.T) {
	ok := &raftpb.Message{Type: raftpb.MsgReadIndex.Enum(), From: ptr(uint64(2)), To: ptr(uint64(1)),
		Entries: []*raftpb.Entry{{Data: relearnContext(1)}}}
	if err := checkShape(ok); err != nil {
		t.Fatalf("a relearn request refused: %v", err)
	}
	for name, m := range map[string]*raftpb.Message{
		"no entry":    {Type: raftpb.MsgReadIndex.Enum(), From: ptr(uint64(2)), To: ptr(uint64(1))},
		"two entries": {Type: raftpb.MsgReadIndex.Enum(), From: ptr(uint64(2)), To: ptr(uint64(1)), Entries: []*raftpb.Entry{{Data: []byte("a")}, {Data: []byte("b")}}},
		"large":       {Type: raftpb.MsgReadIndex.Enum(), From: ptr(uint64(2)), To: ptr(uint64(1)), Entries: []*raftpb.Entry{{Data: make([]byte, readContextBytesMax+1)}}},
		"indexed":     {Type: raftpb.MsgReadIndexResp.Enum(), Term: ptr(uint64(1)), From: ptr(uint64(1)), To: ptr(uint64(2)), Entries: []*raftpb.Entry{{Index: ptr(uint64(3)), Data: []byte("a")}}},
	} {
		if err := checkShape(m); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if !isRelearnContext(relearnContext(7)) || isRelearnContext(relearnContext(7)[:8]) || isRelearnContext(quiesceContext) {
		t.Fatal("relearn contexts misread")
	}
}

// TestRelearnSoleVoterWaitsForItsTerm: etcd raft answers a sole voter's
// ReadIndex at once with its commit index, before its own election's entry
// commits: a replica that held a longer log than its durable marks say
// (here the leader of three, whose last commit no log mark covered), then
// restarted after its machine's crash as the only voter of its group,
// must not end relearning on that stale index. At every step, a replica
// that no longer relearns publishes at least what it published before.
func TestRelearnSoleVoterWaitsForItsTerm(t *testing.T) {
	c, disk := memNodeCluster(t, 3, 1)
	c.elect(1)
	var res []Result
	for i := range 6 {
		c.replicas[1].Propose(op(7, uint64(2*i), 2, fmt.Sprint(i), &res))
		c.settle()
	}
	before := c.replicas[1].Committed()
	if before != 12 {
		t.Fatalf("leader published %d, want 12", before)
	}
	found := false
	c.stop(1)
	base := *disk
	for seed := range 16 {
		img := base.Crash()
		// The image's group is node 1 alone (as after a forced recovery,
		// or a stray restarted as its own group).
		fst := FileState{FS: img, Dir: "/node"}
		st, ok, err := fst.Load()
		if !ok || err != nil {
			t.Fatalf("image %d: load the state: %v %v", seed, ok, err)
		}
		st.Conf = &raftpb.ConfState{Voters: []uint64{1}}
		if err := fst.Save(st); err != nil {
			t.Fatal(err)
		}
		*disk = img
		c.cut[1] = true
		c.start(1)
		r := c.replicas[1]
		if !r.Relearning() {
			t.Fatalf("image %d: not relearning after the machine's crash", seed)
		}
		found = found || r.Committed() < before
		check := func(when string) {
			t.Helper()
			if !r.Relearning() && r.Committed() < before {
				t.Fatalf("image %d, %s: relearned, publishing %d, below the %d it published before", seed, when, r.Committed(), before)
			}
		}
		for tick := 0; tick < 40 && (r.Relearning() || !r.IsLeader()); tick++ {
			r.Tick()
			check("after a tick")
			for r.HasReady() || r.HasLogWrites() {
				for r.HasReady() { // Ready cycles run ahead of a slow disk
					if err := r.ProcessReady(); err != nil {
						t.Fatal(err)
					}
					check("after a Ready cycle")
				}
				if err := r.WriteLog(); err != nil {
					t.Fatal(err)
				}
				check("after a log write")
			}
		}
		if r.Relearning() || !r.IsLeader() {
			t.Fatalf("image %d: relearning %v, leader %v after 40 ticks alone", seed, r.Relearning(), r.IsLeader())
		}
		c.stop(1)
	}
	if !found {
		t.Fatal("no image restarted below what was published: the test shows nothing")
	}
}
