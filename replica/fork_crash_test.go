package replica

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/segment"
	"github.com/geolog/geolog/vfs"
	"github.com/hashicorp/go-hclog"
	"go.etcd.io/raft/v3/raftpb"
)

// memNode is a one-replica group whose log, hard state and orphan store
// live on a vfs.Mem, so that a crash loses what was not synced.
type memNode struct {
	t  *testing.T
	fs *vfs.Mem
	st *segment.Store
	r  *Replica
}

const memNodeDir = "/range"

func openMemNode(t *testing.T, fs *vfs.Mem) (*memNode, error) {
	logger := hclog.New(&hclog.LoggerOptions{Level: hclog.Error, Output: testWriter{t}})
	var headers []batch.Header
	st, err := segment.Open(segment.Config{Dir: memNodeDir, FS: fs, SegmentBytesMax: segment.SegmentBytesMaxMin, Logger: logger,
		OnRecover: func(h batch.Header) error { headers = append(headers, h); return nil }})
	if err != nil {
		return nil, err
	}
	o, err := OpenOrphans(fs, filepath.Join(memNodeDir, OrphanDirName), logger)
	if err != nil {
		st.Close()
		return nil, err
	}
	r, err := New(Config{NodeID: 1, Stream: "c", Peers: []uint64{1}, Log: st, State: FileState{FS: fs, Dir: memNodeDir},
		Orphans: o, Send: func([]*raftpb.Message) {}, Logger: logger}, headers)
	if err != nil {
		st.Close()
		return nil, err
	}
	n := &memNode{t: t, fs: fs, st: st, r: r}
	if err := r.Campaign(); err != nil {
		return nil, err
	}
	return n, n.run()
}

// run runs Ready cycles and log writes until nothing moves.
func (n *memNode) run() error {
	for i := 0; i < 1000; i++ {
		moved := false
		if n.r.HasReady() {
			if err := n.r.ProcessReady(); err != nil {
				return err
			}
			moved = true
		}
		if n.r.HasLogWrites() {
			if err := n.r.WriteLog(); err != nil {
				return err
			}
			moved = true
		}
		if f := n.r.Failure(); f != nil {
			return f
		}
		if !moved {
			return nil
		}
	}
	return errors.New("did not settle")
}

// mutating reports whether a file system operation may change the disk.
func mutating(op vfs.Op) bool {
	switch op {
	case vfs.OpRead, vfs.OpReadDir, vfs.OpStat, vfs.OpLock:
		return false
	}
	return true
}

// TestForkCrash crashes a replica at every step of applying a fork (every
// operation that may change its disk, from the fork's proposal on: the
// fork entry's own write, the orphan log, the state, the truncation, the
// appends after it) and reopens it on what the crash left. Each time the
// replica must hold either the pre-fork log and no fork (and then fork
// when asked again) or the post-fork log with exactly one fork holding
// the original frames, and a producer retrying an orphaned batch must get
// it appended again at the fork offset.
func TestForkCrash(t *testing.T) {
	// A clean run counts the operations.
	ops := 0
	n, _ := forkCrashSetup(t, 1)
	n.fs.SetHook(func(op vfs.Op, _ string) error {
		if mutating(op) {
			ops++
		}
		return nil
	})
	if res := n.fork(t); res.Err != nil || res.Records != 15 {
		t.Fatalf("clean fork: %+v %v", res.ForkRecord, res.Err)
	}
	n.fs.SetHook(nil)
	if ops < 10 {
		t.Fatalf("a fork took %d operations", ops)
	}
	seeds := 2
	if testing.Short() {
		seeds = 1
	}
	stats := map[string]int{}
	for crashAt := 1; crashAt <= ops+1; crashAt++ {
		for seed := range uint64(seeds) {
			name := fmt.Sprintf("crash before operation %d of %d, seed %d", crashAt, ops, seed)
			n, orig := forkCrashSetup(t, 100+seed)
			count := 0
			injected := errors.New("injected: the machine lost power")
			n.fs.SetHook(func(op vfs.Op, _ string) error {
				if mutating(op) {
					if count++; count >= crashAt {
						return injected
					}
				}
				return nil
			})
			n.fork(t) // fails, or succeeds before crashAt
			n.fs.SetHook(nil)
			stats[checkForkCrash(t, name, n.fs.Crash(), orig)]++
		}
	}
	t.Logf("%d crash points: %v", ops+1, stats)
	if stats["pre-fork"] == 0 || stats["post-fork"] == 0 || stats["post-fork, completed on opening"] == 0 {
		t.Fatalf("every crash ended the same way: %v", stats)
	}
}

// forkCrashSetup opens a memNode (seeded) holding 10 batches of 3 records
// from producer 7 and returns it with its frames from offset 15 on.
func forkCrashSetup(t *testing.T, seed uint64) (*memNode, []byte) {
	t.Helper()
	n, err := openMemNode(t, vfs.NewMem(rand.New(rand.NewPCG(seed, 0xf0))))
	if err != nil {
		t.Fatal(err)
	}
	var res []Result
	for i := 0; i < 10; i++ {
		n.r.Propose(op(7, uint64(3*i), 3, fmt.Sprintf("a%03d", i), &res))
	}
	if err := n.run(); err != nil || len(res) != 10 || n.r.Committed() != 30 {
		t.Fatalf("setup: %v, %d replies, committed %d", err, len(res), n.r.Committed())
	}
	orig, err := n.st.ReadFrames(15, 1<<20, 30)
	if err != nil {
		t.Fatal(err)
	}
	return n, orig
}

// fork proposes the fork at 15, epoch 2, and runs until it is answered or
// the replica fails.
func (n *memNode) fork(t *testing.T) ForkResult {
	var res []ForkResult
	n.r.ProposeFork(15, 2, func(r ForkResult) { res = append(res, r) })
	if err := n.run(); err != nil && len(res) == 0 {
		return ForkResult{Err: err}
	}
	if len(res) != 1 {
		t.Fatalf("%d answers to a fork", len(res))
	}
	return res[0]
}

// checkForkCrash reopens a crashed node and checks it holds the pre-fork or
// the post-fork state, completing the fork in the first case; it returns
// which.
func checkForkCrash(t *testing.T, name string, fs *vfs.Mem, orig []byte) string {
	t.Helper()
	n, err := openMemNode(t, fs)
	if err != nil {
		t.Fatalf("%s: reopen: %v", name, err)
	}
	defer n.st.Close()
	outcome := "post-fork"
	if n.r.fork.recovered {
		outcome = "post-fork, completed on opening"
	}
	switch forks := n.r.Orphans(); len(forks) {
	case 0:
		outcome = "pre-fork"
		if n.st.NextOffset() != 30 || n.r.Committed() != 30 {
			t.Fatalf("%s: no fork, but the log ends at %d, committed %d", name, n.st.NextOffset(), n.r.Committed())
		}
		if got, err := n.st.ReadFrames(15, 1<<20, 30); err != nil || !bytes.Equal(got, orig) {
			t.Fatalf("%s: no fork, and the records from 15 differ: %v", name, err)
		}
		if res := n.fork(t); res.Err != nil {
			t.Fatalf("%s: the fork again: %v", name, res.Err)
		}
	case 1:
	default:
		t.Fatalf("%s: %d forks: %+v", name, len(forks), forks)
	}
	forks := n.r.Orphans()
	if len(forks) != 1 || forks[0].Records != 15 || forks[0].At != 15 || forks[0].Epoch != 2 {
		t.Fatalf("%s: forks %+v", name, forks)
	}
	if n.st.NextOffset() != 15 || n.r.Committed() != 15 || n.r.HighestEpoch() != 2 || n.r.state.SnapshotIndex != forks[0].Index ||
		n.r.state.Forking != nil {
		t.Fatalf("%s: after the fork the log ends at %d, committed %d, epoch %d, compaction point %d", name,
			n.st.NextOffset(), n.r.Committed(), n.r.HighestEpoch(), n.r.state.SnapshotIndex)
	}
	if got, err := n.r.ReadOrphans(forks[0].Index, 15, 1<<20); err != nil || !bytes.Equal(got, orig) {
		t.Fatalf("%s: the orphaned frames differ from the originals: %v", name, err)
	}
	var res []Result
	retry := op(7, 15, 3, "retry", &res)
	retry.Epoch = 2 // the new home's epoch: epoch 1 is fenced by the fork
	n.r.Propose(retry)
	if err := n.run(); err != nil || len(res) != 1 || res[0].Err != nil || res[0].Duplicate || res[0].BaseOffset != 15 {
		t.Fatalf("%s: retry of an orphaned batch: %v %+v", name, err, res)
	}
	return outcome
}
