package replica

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/dedup"
	"github.com/geolog/geolog/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// withOrphans gives every node an orphan store in its range directory.
func withOrphans(c *cluster) {
	prev := c.repCfg
	c.repCfg = func(id uint64, cfg *Config) {
		if prev != nil {
			prev(id, cfg)
		}
		o, err := OpenOrphans(vfs.OS(), filepath.Join(c.dirs[id], OrphanDirName), cfg.Logger)
		if err != nil {
			c.t.Fatal(err)
		}
		cfg.Orphans = o
	}
}

// opts applies each of fs.
func opts(fs ...func(*cluster)) func(*cluster) {
	return func(c *cluster) {
		for _, f := range fs {
			f(c)
		}
	}
}

// forkCluster is a 3-node group with orphan stores whose leader, node 1,
// appended 10 batches of 3 records from producer 7 (sequences 0..29,
// offsets 0..29, values a000-0..a009-2) that every node has applied.
func forkCluster(t *testing.T, more ...func(*cluster)) *cluster {
	c := newClusterOpts(t, 3, 3, opts(append(more, withOrphans)...))
	c.elect(1)
	c.proposeN(7, 0, 10, "a")
	c.tick(2)
	return c
}

// proposeFork proposes a fork at the leader and settles; it returns what
// the proposer heard (exactly one answer).
func (c *cluster) proposeFork(at, epoch uint64) ForkResult {
	c.t.Helper()
	var res []ForkResult
	c.replicas[c.leader()].ProposeFork(at, epoch, func(r ForkResult) { res = append(res, r) })
	c.settle()
	if len(res) != 1 {
		c.t.Fatalf("%d answers to a fork", len(res))
	}
	return res[0]
}

// mirrorOp builds a frame of n records at base in epoch, as another
// region's home leader would have, for ProposeVerbatim.
func mirrorOp(base, epoch uint64, n int, tag string, results *[]Result) *Op {
	recs := make([]batch.Record, n)
	for i := range recs {
		recs[i] = batch.Record{Key: []byte("k"), Value: []byte(fmt.Sprintf("%s-%d", tag, i))}
	}
	h := batch.Header{BaseOffset: base, Epoch: epoch, AppendTimeUnixNanos: time.Now().UnixNano()}
	return &Op{RecordCount: uint32(n), Frame: batch.Encode(nil, h, recs), Reply: func(r Result) { *results = append(*results, r) }}
}

// frames returns node id's frames from index from to its last, as stored.
func (c *cluster) frames(id, from uint64) []byte {
	c.t.Helper()
	st := c.logs[id]
	var out []byte
	for lo := from; lo <= st.LastIndex(); {
		b, err := st.ReadFramesByIndex(lo, st.LastIndex()+1, 1<<20)
		if err != nil {
			c.t.Fatalf("node %d: read from index %d: %v", id, lo, err)
		}
		out = append(out, b...)
		for len(b) > 0 {
			n, _ := batch.FrameSize(b)
			h, err := batch.DecodeHeader(b[:n])
			if err != nil {
				c.t.Fatal(err)
			}
			lo, b = h.Index+1, b[n:]
		}
	}
	return out
}

// orphanFiles returns the files of node id's orphan store.
func (c *cluster) orphanFiles(id uint64) map[string][]byte {
	c.t.Helper()
	dir := filepath.Join(c.dirs[id], OrphanDirName)
	ents, err := os.ReadDir(dir)
	if err != nil {
		c.t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			c.t.Fatal(err)
		}
		out[e.Name()] = b
	}
	return out
}

// identical checks that every live member holds the same log (every
// frame, byte for byte, from the first index all hold) and the same orphan
// store.
func (c *cluster) identical() {
	c.t.Helper()
	conf := c.replicas[c.leader()].Conf()
	live := func(id uint64) bool {
		return c.replicas[id] != nil && (slices.Contains(conf.GetVoters(), id) || slices.Contains(conf.GetLearners(), id))
	}
	var from uint64
	for _, id := range c.ids {
		if live(id) {
			from = max(from, c.logs[id].FirstIndex())
		}
	}
	ref := uint64(0)
	for _, id := range c.ids {
		if !live(id) {
			continue
		}
		if ref == 0 {
			ref = id
			continue
		}
		if a, b := c.frames(ref, from), c.frames(id, from); !bytes.Equal(a, b) {
			c.t.Fatalf("nodes %d and %d hold different logs from index %d (%d and %d bytes)", ref, id, from, len(a), len(b))
		}
		if a, b := c.orphanFiles(ref), c.orphanFiles(id); fmt.Sprint(a) != fmt.Sprint(b) {
			c.t.Fatalf("nodes %d and %d hold different orphan stores: %d and %d files", ref, id, len(a), len(b))
		}
		if a, b := c.replicas[ref].Committed(), c.replicas[id].Committed(); a != b {
			c.t.Fatalf("nodes %d and %d committed %d and %d", ref, id, a, b)
		}
	}
}

// orphanValues reads every record of node id's fork at index back, with
// the offset and epoch it had.
func (c *cluster) orphanValues(id, index uint64) []string {
	c.t.Helper()
	var out []string
	rec, ok := c.replicas[id].cfg.Orphans.Fork(index)
	if !ok {
		c.t.Fatalf("node %d holds no fork at %d", id, index)
	}
	for off := rec.FirstOffset; off < rec.NextOffset; {
		b, err := c.replicas[id].ReadOrphans(index, off, 100)
		if err != nil {
			c.t.Fatalf("node %d: read orphans at %d: %v", id, off, err)
		}
		for len(b) > 0 {
			n, _ := batch.FrameSize(b)
			h, recs, err := batch.Decode(b[:n])
			if err != nil {
				c.t.Fatal(err)
			}
			for i, r := range recs {
				out = append(out, fmt.Sprintf("%d:e%d:p%d:%s", h.Offset(&recs[i]), h.Epoch, h.ProducerID, r.Value))
			}
			off, b = h.NextOffset(), b[n:]
		}
	}
	return out
}

// TestFork: a fork in the middle of the log moves the tail into every
// replica's orphan log, with its offsets, epoch, producer and records,
// truncates every log to the fork offset, and the log continues there at
// the new epoch; all replicas end identical.
func TestFork(t *testing.T) {
	c := forkCluster(t)
	k := c.logs[1].LastIndex() + 1
	res := c.proposeFork(15, 2)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	want := ForkRecord{Index: k, Term: res.Term, PrevIndex: res.PrevIndex, At: 15, Epoch: 2, TimeUnixNanos: res.TimeUnixNanos,
		Records: 15, Frames: 5, Bytes: res.Bytes, FirstOffset: 15, NextOffset: 30}
	if res.ForkRecord != want || res.PrevIndex == 0 || res.Bytes == 0 {
		t.Fatalf("fork: %+v", res.ForkRecord)
	}
	c.tick(2)
	for _, id := range c.ids {
		r := c.replicas[id]
		if c.logs[id].NextOffset() != 15 || r.Committed() != 15 || r.HighestEpoch() != 2 {
			t.Fatalf("node %d: next offset %d, committed %d, highest epoch %d", id, c.logs[id].NextOffset(), r.Committed(), r.HighestEpoch())
		}
		if got := r.Orphans(); len(got) != 1 || got[0] != res.ForkRecord {
			t.Fatalf("node %d orphans: %+v", id, got)
		}
		if got := c.logValues(id); len(got) != 15 || got[14] != "a004-2" {
			t.Fatalf("node %d log: %v", id, got)
		}
		orphans := c.orphanValues(id, k)
		if len(orphans) != 15 || orphans[0] != "15:e1:p7:a005-0" || orphans[14] != "29:e1:p7:a009-2" {
			t.Fatalf("node %d orphaned %v", id, orphans)
		}
		// Raft sees the log start after the fork entry; the gap before the
		// fork frame is described by the frame itself.
		if r.state.SnapshotIndex != k || r.state.SnapshotNextOffset != 15 {
			t.Fatalf("node %d compaction point %d at offset %d", id, r.state.SnapshotIndex, r.state.SnapshotNextOffset)
		}
		if _, err := c.logs[id].TermAt(k - 1); err == nil {
			t.Fatalf("node %d holds entry %d, in the fork's gap", id, k-1)
		}
	}
	c.identical()

	// The log continues at the fork offset, with the new home's frames.
	var mres []Result
	c.replicas[1].ProposeVerbatim(mirrorOp(15, 2, 2, "m", &mres))
	c.replicas[1].ProposeVerbatim(mirrorOp(17, 2, 3, "n", &mres))
	c.settle()
	c.tick(2)
	if len(mres) != 2 || mres[0].Err != nil || mres[0].BaseOffset != 15 || mres[1].BaseOffset != 17 || mres[1].Epoch != 2 {
		t.Fatalf("mirrored after the fork: %+v", mres)
	}
	for _, id := range c.ids {
		if got := c.logValues(id); len(got) != 20 || got[15] != "m-0" || got[19] != "n-2" {
			t.Fatalf("node %d log: %v", id, got)
		}
	}
	c.identical()
	// A fork at the tail orphans nothing and raises the epoch; repeated,
	// it is answered with the same record and records nothing new.
	res2 := c.proposeFork(20, 3)
	if res2.Err != nil || res2.Records != 0 || res2.At != 20 || res2.Epoch != 3 {
		t.Fatalf("fork at the tail: %+v %v", res2.ForkRecord, res2.Err)
	}
	if again := c.proposeFork(20, 3); again.Err != nil || again.ForkRecord != res2.ForkRecord {
		t.Fatalf("repeated fork: %+v %v", again.ForkRecord, again.Err)
	}
	c.tick(2)
	for _, id := range c.ids {
		if n := len(c.replicas[id].Orphans()); n != 2 || c.replicas[id].HighestEpoch() != 3 || c.logs[id].NextOffset() != 20 {
			t.Fatalf("node %d: %d forks, epoch %d, next offset %d", id, n, c.replicas[id].HighestEpoch(), c.logs[id].NextOffset())
		}
	}
	c.replicas[1].ProposeVerbatim(mirrorOp(20, 3, 1, "o", &mres))
	c.settle()
	if len(mres) != 3 || mres[2].Err != nil || mres[2].BaseOffset != 20 {
		t.Fatalf("mirrored after the second fork: %+v", mres)
	}
	c.tick(2)
	c.identical()
}

// TestForkRefused: a fork off the log's bounds, inside a batch, at a stale
// epoch, on a follower, or while another is in progress is refused with a
// typed error and changes nothing; appends wait for a fork in progress.
func TestForkRefused(t *testing.T) {
	c := forkCluster(t)
	check := func(name string, res ForkResult, code apierr.Code) {
		t.Helper()
		if apierr.CodeOf(res.Err) != code {
			t.Fatalf("%s: %v, want %v", name, res.Err, code)
		}
	}
	check("above the tail", c.proposeFork(31, 2), apierr.OffsetOutOfRange)
	check("inside a batch", c.proposeFork(16, 2), apierr.InvalidArgument)
	check("epoch 0", c.proposeFork(15, 0), apierr.InvalidArgument)
	check("same epoch with records to orphan", c.proposeFork(15, 1), apierr.StaleEpoch)
	var res []ForkResult
	c.replicas[2].ProposeFork(15, 2, func(r ForkResult) { res = append(res, r) })
	if len(res) != 1 || apierr.CodeOf(res[0].Err) != apierr.NotLeader || !apierr.IsRetriable(res[0].Err) {
		t.Fatalf("on a follower: %+v", res)
	}
	// Appends in flight hold a fork back; a fork in progress holds appends
	// and other forks back.
	var ares []Result
	c.replicas[1].Propose(op(7, 30, 3, "b", &ares))
	c.replicas[1].ProposeFork(15, 2, func(r ForkResult) { res = append(res, r) })
	if len(res) != 2 || apierr.CodeOf(res[1].Err) != apierr.Unavailable || !apierr.IsRetriable(res[1].Err) {
		t.Fatalf("with appends in flight: %+v", res[1:])
	}
	c.settle()
	c.replicas[1].ProposeFork(15, 2, func(r ForkResult) { res = append(res, r) })
	c.replicas[1].ProposeFork(12, 2, func(r ForkResult) { res = append(res, r) })
	c.replicas[1].Propose(op(7, 33, 3, "c", &ares))
	c.replicas[1].ProposeVerbatim(mirrorOp(33, 2, 1, "m", &ares))
	if len(res) != 3 || apierr.CodeOf(res[2].Err) != apierr.Unavailable {
		t.Fatalf("a second fork: %+v", res[2:])
	}
	if len(ares) != 3 || apierr.CodeOf(ares[1].Err) != apierr.Unavailable || !apierr.IsRetriable(ares[1].Err) ||
		apierr.CodeOf(ares[2].Err) != apierr.Unavailable {
		t.Fatalf("appends during a fork: %+v", ares)
	}
	for _, id := range c.ids {
		if len(c.replicas[id].Orphans()) != 0 || c.logs[id].NextOffset() != 33 {
			t.Fatalf("node %d changed before the fork applied", id)
		}
	}
	c.settle()
	if len(res) != 4 || res[3].Err != nil || res[3].Records != 18 {
		t.Fatalf("the fork: %+v", res[3:])
	}
	c.replicas[1].ProposeVerbatim(mirrorOp(15, 2, 1, "m", &ares))
	c.settle()
	if len(ares) != 4 || ares[3].Err != nil || ares[3].BaseOffset != 15 {
		t.Fatalf("append after the fork: %+v", ares[3:])
	}
	check("stale epoch", c.proposeFork(16, 1), apierr.StaleEpoch)
	c.tick(2)
	c.identical()
}

// TestForkRestart: after a fork, replicas restart into the forked log and
// orphan store, and a new leader continues at the fork offset; the
// idempotence table is as of the fork offset: a retry of an orphaned
// batch is appended again (not answered with the offset another record
// now holds), a retry of a kept one is a duplicate.
func TestForkRestart(t *testing.T) {
	epoch := uint64(1)
	c := forkCluster(t, func(c *cluster) {
		c.repCfg = func(_ uint64, cfg *Config) { cfg.Epoch = epoch }
	})
	k := c.logs[1].LastIndex() + 1
	if res := c.proposeFork(15, 2); res.Err != nil {
		t.Fatal(res.Err)
	}
	c.tick(2)
	epoch = 2 // the range's new home: this region appends at epoch 2 now
	for _, id := range c.ids {
		c.stop(id)
	}
	for _, id := range c.ids {
		c.start(id)
		r := c.replicas[id]
		if c.logs[id].NextOffset() != 15 || r.Committed() != 15 || r.HighestEpoch() != 2 || len(r.Orphans()) != 1 {
			t.Fatalf("node %d reopened: next offset %d, committed %d, epoch %d, %d forks",
				id, c.logs[id].NextOffset(), r.Committed(), r.HighestEpoch(), len(r.Orphans()))
		}
		if got := c.orphanValues(id, k); len(got) != 15 {
			t.Fatalf("node %d: %d orphaned records after restart", id, len(got))
		}
	}
	c.elect(2)
	var retry, dup, gap []Result
	c.replicas[2].Propose(op(7, 15, 3, "retry", &retry)) // orphaned: appended again
	c.replicas[2].Propose(op(7, 12, 3, "a004", &dup))    // kept: a duplicate
	c.replicas[2].Propose(op(7, 24, 3, "gap", &gap))     // the producer is at 18 now
	c.settle()
	c.tick(2)
	if len(retry) != 1 || retry[0].Err != nil || retry[0].BaseOffset != 15 || retry[0].Duplicate || retry[0].Epoch != 2 ||
		len(dup) != 1 || !dup[0].Duplicate || dup[0].BaseOffset != 12 || len(gap) != 1 || apierr.CodeOf(gap[0].Err) != apierr.SequenceGap {
		t.Fatalf("replies: retry %+v, duplicate %+v, gap %+v", retry, dup, gap)
	}
	for _, id := range c.ids {
		if got := c.logValues(id); len(got) != 18 || got[15] != "retry-0" {
			t.Fatalf("node %d log: %v", id, got)
		}
		v, orig, _ := c.replicas[id].dedup.Check(7, 15, 3, 0)
		if v != dedup.Duplicate || orig.BaseOffset != 15 || orig.Epoch != 2 {
			t.Fatalf("node %d: sequence 15 is %v at %d", id, v, orig.BaseOffset)
		}
	}
	c.identical()
}

// TestForkFollowerBehind: a follower cut off before a fork is caught up by
// a snapshot that carries the retained prefix, the fork's gap and the
// orphan log; it ends identical to the others.
func TestForkFollowerBehind(t *testing.T) {
	c := newClusterOpts(t, 4, 3, withOrphans) // node 4 joins later
	c.elect(1)
	c.proposeN(7, 0, 10, "a")
	c.tick(2)
	c.cut[3] = true
	c.proposeN(7, 30, 5, "b") // node 3 lacks these: part of the divergent tail
	res := c.proposeFork(21, 2)
	if res.Err != nil || res.Records != 24 {
		t.Fatalf("fork: %+v %v", res.ForkRecord, res.Err)
	}
	var mres []Result
	c.replicas[1].ProposeVerbatim(mirrorOp(21, 2, 4, "m", &mres))
	c.settle()
	delete(c.cut, 3)
	c.tick(5)
	if len(mres) != 1 || mres[0].BaseOffset != 21 {
		t.Fatalf("mirrored: %+v", mres)
	}
	if got := c.replicas[3].Stats().SnapshotsInstalled; got != 1 {
		t.Fatalf("node 3 installed %d snapshots, want 1", got)
	}
	if got := c.replicas[3].Orphans(); len(got) != 1 || got[0] != res.ForkRecord {
		t.Fatalf("node 3 orphans: %+v", got)
	}
	if got := c.orphanValues(3, res.Index); len(got) != 24 || got[23] != "44:e1:p7:b004-2" {
		t.Fatalf("node 3 orphaned %v", got)
	}
	if c.logs[3].FirstIndex() != c.logs[1].FirstIndex() || c.replicas[3].HighestEpoch() != 2 {
		t.Fatalf("node 3's log starts at index %d, the leader's at %d", c.logs[3].FirstIndex(), c.logs[1].FirstIndex())
	}
	c.identical()
	// Node 3 can lead and serve a snapshot with the gap itself, to a new
	// member.
	c.transfer(3)
	var done []error
	cc := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddLearnerNode.Enum(), NodeId: proto.Uint64(4)}}}
	c.replicas[3].ProposeConfChange(cc, func(_ *raftpb.ConfState, err error) { done = append(done, err) })
	c.settle()
	c.tick(5)
	if len(done) != 1 || done[0] != nil {
		t.Fatalf("add learner: %v", done)
	}
	if got := c.replicas[4].Stats().SnapshotsInstalled; got != 1 {
		t.Fatalf("node 4 installed %d snapshots", got)
	}
	if got := c.replicas[4].Orphans(); len(got) != 1 || got[0] != res.ForkRecord {
		t.Fatalf("node 4 orphans: %+v", got)
	}
	c.identical()
}

// TestForkFollowerHoldsBack: a follower that holds the fork entry but has
// not applied it when the leader's next appends (at the fork offset)
// arrive holds them back until it applies the fork, and catches up by
// appends, not a snapshot.
func TestForkFollowerHoldsBack(t *testing.T) {
	c := forkCluster(t)
	k := c.logs[1].LastIndex() + 1
	// Node 3 gets the fork entry, and then nothing that would tell it the
	// entry committed.
	c.drop = func(m *raftpb.Message) bool {
		return m.GetTo() == 3 && c.logs[3].LastIndex() >= k &&
			(m.GetType() == raftpb.MsgApp || m.GetType() == raftpb.MsgHeartbeat)
	}
	if res := c.proposeFork(15, 2); res.Err != nil {
		t.Fatal(res.Err)
	}
	var mres []Result
	c.replicas[1].ProposeVerbatim(mirrorOp(15, 2, 2, "m", &mres))
	c.settle()
	if len(mres) != 1 || mres[0].BaseOffset != 15 {
		t.Fatalf("mirrored: %+v", mres)
	}
	if c.logs[3].LastIndex() != k || len(c.replicas[3].Orphans()) != 0 || c.logs[3].NextOffset() != 30 {
		t.Fatalf("node 3: last index %d (fork at %d), %d forks", c.logs[3].LastIndex(), k, len(c.replicas[3].Orphans()))
	}
	// Appends reach node 3 again, heartbeats (which would carry the commit
	// index alone) do not: the first append it gets holds the mirrored
	// entries after the fork, with a commit index that covers the fork.
	c.drop = func(m *raftpb.Message) bool { return m.GetTo() == 3 && m.GetType() == raftpb.MsgHeartbeat }
	c.replicas[1].ProposeVerbatim(mirrorOp(17, 2, 1, "n", &mres))
	c.settle()
	if len(mres) != 2 || mres[1].BaseOffset != 17 {
		t.Fatalf("mirrored: %+v", mres)
	}
	c.drop = nil
	c.tick(6)
	if c.replicas[3].Stats().SnapshotsInstalled != 0 || len(c.replicas[3].Orphans()) != 1 {
		t.Fatalf("node 3: %d snapshots, %d forks", c.replicas[3].Stats().SnapshotsInstalled, len(c.replicas[3].Orphans()))
	}
	if got := c.logValues(3); len(got) != 18 || got[15] != "m-0" || got[17] != "n-0" {
		t.Fatalf("node 3 log: %v", got)
	}
	c.identical()
}

// TestForkAfterCompaction: a fork at the compaction point keeps nothing
// after it; a follower that compacted past the fork offset (retention
// deleted part of the divergent tail there) replaces its log with the
// fork's and orphans what it still held. Nothing else differs.
func TestForkAfterCompaction(t *testing.T) {
	c := newClusterOpts(t, 3, 3, opts(withOrphans, withCompaction(3000)))
	c.elect(1)
	c.proposeN(7, 0, 60, "a")
	c.tick(2)
	// Only node 2 compacts: the leader and node 3 retain everything. The
	// leader tells node 2 it has no floor (without which node 2 would
	// compact nothing: floor.go), without compacting itself.
	c.replicas[1].shareFloor()
	c.settle()
	if c.compact(2) == 0 {
		t.Fatal("node 2 compacted nothing")
	}
	floor2 := c.replicas[2].state.SnapshotNextOffset
	at := uint64(30)
	if floor2 <= at+3 {
		t.Fatalf("node 2 compacted only to %d", floor2)
	}
	res := c.proposeFork(at, 2)
	if res.Err != nil || res.Records != 180-at {
		t.Fatalf("fork: %+v %v", res.ForkRecord, res.Err)
	}
	c.tick(2)
	// Node 2 orphaned what it still held: [its start offset, 180).
	got := c.replicas[2].Orphans()
	if len(got) != 1 || got[0].At != at || got[0].NextOffset != 180 || got[0].FirstOffset <= at || got[0].Records != 180-got[0].FirstOffset {
		t.Fatalf("node 2's fork: %+v", got)
	}
	if v := c.orphanValues(2, got[0].Index); uint64(len(v)) != got[0].Records || v[len(v)-1] != "179:e1:p7:a059-2" {
		t.Fatalf("node 2 orphaned %d records, last %q", len(v), v[len(v)-1])
	}
	for _, id := range c.ids {
		if c.logs[id].NextOffset() != at || c.replicas[id].Committed() != at {
			t.Fatalf("node %d: next offset %d committed %d", id, c.logs[id].NextOffset(), c.replicas[id].Committed())
		}
	}
	if c.logs[2].StartOffset() != at {
		t.Fatalf("node 2 starts at %d", c.logs[2].StartOffset())
	}
	var mres []Result
	c.replicas[1].ProposeVerbatim(mirrorOp(at, 2, 3, "m", &mres))
	c.settle()
	c.tick(2)
	if len(mres) != 1 || mres[0].Err != nil {
		t.Fatalf("mirrored: %+v", mres)
	}
	for _, id := range c.ids {
		if g := c.retained(id); g[at] != "m-0" || len(g) == 0 {
			t.Fatalf("node %d retained %v", id, g)
		}
	}
	c.agree()
	// The producer state is as of the fork: producer 7 appended sequences
	// 0..179, and 30.. are orphaned. Node 3 knows that exactly; node 2
	// had compacted its knowledge of sequences below 30 away, and forgets
	// the producer (a retry is refused, never taken for a duplicate).
	for id, want := range map[uint64][2]dedup.Verdict{1: {dedup.Duplicate, dedup.Append}, 3: {dedup.Duplicate, dedup.Append},
		2: {dedup.Reject, dedup.Reject}} {
		v27, orig, _ := c.replicas[id].dedup.Check(7, 27, 3, 0)
		v30, _, _ := c.replicas[id].dedup.Check(7, 30, 3, 0)
		if v27 != want[0] || v30 != want[1] || (v27 == dedup.Duplicate && orig.BaseOffset != 27) {
			t.Fatalf("node %d: sequence 27 is %v (at %d), 30 is %v", id, v27, orig.BaseOffset, v30)
		}
	}
}

// TestForkBelowCompactionPointResets: a fork proposed below the leader's
// compaction point (a mirror whose retained frames are all of an older
// epoch than a new home's batch from that point, notes/simgaps.md P1)
// resets every replica's log to an empty one at the fork point: the
// leader orphans all it retains, a follower that retains more orphans
// what it holds from the fork point on and drops what lies below it, and
// the log continues at the fork point on every replica, also after a
// restart.
func TestForkBelowCompactionPointResets(t *testing.T) {
	c := newClusterOpts(t, 3, 3, opts(withOrphans, withCompaction(3000)))
	c.elect(1)
	c.proposeN(7, 0, 60, "a")
	c.tick(2)
	// Only the leader compacts: followers retain everything.
	if c.compact(1) == 0 {
		t.Fatal("the leader compacted nothing")
	}
	floor := c.replicas[1].state.SnapshotNextOffset
	at := floor - 15 // a batch boundary: batches are of 3 records
	if floor < 30 || c.logs[2].StartOffset() != 0 {
		t.Fatalf("leader compacted to %d, node 2 starts at %d", floor, c.logs[2].StartOffset())
	}
	res := c.proposeFork(at, 2)
	if res.Err != nil || res.At != at || res.NextOffset != 180 {
		t.Fatalf("fork below the compaction point %d: %+v %v", floor, res.ForkRecord, res.Err)
	}
	c.tick(2)
	for _, id := range c.ids {
		got := c.replicas[id].Orphans()
		wantFirst := at
		if id == 1 {
			wantFirst = floor // retention deleted [at, floor) on the leader
		}
		if len(got) != 1 || got[0].At != at || got[0].FirstOffset != wantFirst || got[0].Records != 180-wantFirst {
			t.Fatalf("node %d's fork: %+v", id, got)
		}
		if v := c.orphanValues(id, got[0].Index); v[0] != fmt.Sprintf("%d:e1:p7:a%03d-0", wantFirst, wantFirst/3) {
			t.Fatalf("node %d orphaned from %q", id, v[0])
		}
		if st := c.logs[id]; st.StartOffset() != at || st.NextOffset() != at || c.replicas[id].Committed() != at {
			t.Fatalf("node %d: log [%d, %d), committed %d, want empty at %d", id, st.StartOffset(), st.NextOffset(), c.replicas[id].Committed(), at)
		}
		if e := c.replicas[id].HighestEpoch(); e != 2 {
			t.Fatalf("node %d: highest epoch %d", id, e)
		}
	}
	var mres []Result
	c.replicas[1].ProposeVerbatim(mirrorOp(at, 2, 3, "m", &mres))
	c.settle()
	c.tick(2)
	if len(mres) != 1 || mres[0].Err != nil || mres[0].BaseOffset != at {
		t.Fatalf("mirrored after the reset: %+v", mres)
	}
	for _, id := range c.ids {
		c.stop(id)
	}
	for _, id := range c.ids {
		c.start(id)
	}
	c.elect(2)
	c.tick(2)
	for _, id := range c.ids {
		if g := c.retained(id); len(g) != 3 || g[at] != "m-0" || c.replicas[id].Committed() != at+3 {
			t.Fatalf("node %d after restart: retained %v, committed %d", id, g, c.replicas[id].Committed())
		}
	}
}

// TestForkConfigured: without an orphan store a replica refuses to
// propose a fork, and a follower without one stops rather than drop what
// the fork orphans.
func TestForkConfigured(t *testing.T) {
	// Node 1 has an orphan store; the others have none.
	c := newClusterOpts(t, 3, 3, withOrphans)
	for _, id := range []uint64{2, 3} {
		c.replicas[id].cfg.Orphans = nil
	}
	c.elect(2)
	c.proposeN(7, 0, 3, "a")
	if res := c.proposeFork(3, 2); apierr.CodeOf(res.Err) != apierr.Internal {
		t.Fatalf("fork without an orphan store: %v", res.Err)
	}
	c.transfer(1)
	var res []ForkResult
	c.replicas[1].ProposeFork(3, 2, func(r ForkResult) { res = append(res, r) })
	for i := 0; i < 20; i++ {
		for _, id := range c.ids {
			if r := c.replicas[id]; r.HasReady() {
				if err := r.ProcessReady(); err != nil && id == 1 {
					t.Fatalf("node 1: %v", err)
				}
			}
			if r := c.replicas[id]; r.HasLogWrites() {
				r.WriteLog()
			}
		}
		q := c.queue
		c.queue = nil
		for _, m := range q {
			c.replicas[m.GetTo()].Step(m)
		}
	}
	for _, id := range []uint64{2, 3} {
		if f := c.replicas[id].Failure(); f == nil {
			t.Fatalf("node %d applied a fork without an orphan store", id)
		}
		if c.logs[id].NextOffset() != 9 {
			t.Fatalf("node %d dropped records", id)
		}
	}
}

// TestForkDescRoundTrip: a fork entry's payload decodes to what was
// encoded, and what is not one is refused.
func TestForkDescRoundTrip(t *testing.T) {
	d := forkDesc{PrevIndex: 7, At: 100, KeepIndex: 7, Proposer: 2, ProposalTerm: 9, ProposalSeq: 3}
	got, err := decodeForkDesc(d.encode())
	if err != nil || got != d {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	for name, b := range map[string][]byte{
		"empty":     nil,
		"short":     d.encode()[:20],
		"magic":     append(append([]byte(nil), d.encode()[:8]...), make([]byte, forkDescBytes-8)...),
		"prev/keep": forkDesc{PrevIndex: 3, KeepIndex: 4}.encode(),
	} {
		if _, err := decodeForkDesc(b); !errors.Is(err, ErrForkInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestForkSnapshotChecked: a snapshot across a fork is checked like any
// other: its body may skip indexes only where the fork frame says it
// does, and its orphan log must hold what its records count. Refused ones
// leave nothing behind; the intact one installs with the orphans.
func TestForkSnapshotChecked(t *testing.T) {
	c := forkCluster(t)
	c.cut[3] = true
	c.proposeN(7, 30, 5, "b")
	res := c.proposeFork(21, 2)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	c.tick(25) // node 3 is no longer recently active: it gets a snapshot
	m, body := capturedSnapshot(t, c)
	d, err := decodeSnapshotDesc(m.GetSnapshot().GetData())
	if err != nil || d.OrphansBytes == 0 {
		t.Fatalf("description %+v: %v", d, err)
	}
	if want := c.logs[1].LastIndex() - c.logs[1].FirstIndex() + 1 - (res.Index - res.PrevIndex - 1); d.Frames != want {
		t.Fatalf("%d frames described, want %d", d.Frames, want)
	}
	orphansAt := int(d.ProducersBytes)
	framesAt := orphansAt + int(d.OrphansBytes)
	// The frames, and where the fork frame is among them.
	var starts []int
	fork := -1
	for p := framesAt; p < len(body); {
		n, err := batch.FrameSize(body[p:])
		if err != nil {
			t.Fatal(err)
		}
		if batch.IsFork(body[p:]) {
			fork = len(starts)
		}
		starts = append(starts, p)
		p += n
	}
	if fork < 1 {
		t.Fatalf("no fork frame after a kept one in the body (at %d)", fork)
	}
	without := func(i int) []byte {
		end := len(body)
		if i+1 < len(starts) {
			end = starts[i+1]
		}
		return append(bytes.Clone(body[:starts[i]]), body[end:]...)
	}
	badOrphans := bytes.Clone(body)
	badOrphans[framesAt-1] ^= 1 // inside the last orphaned frame
	shortOrphans := withFrames(m, func(d *snapshotDesc) { d.OrphansBytes-- })
	r3 := c.replicas[3]
	for name, tc := range map[string]struct {
		m    *raftpb.Message
		body []byte
	}{
		"frame before the fork missing": {withFrames(m, func(d *snapshotDesc) { d.Frames-- }), without(fork - 1)},
		"fork frame missing":            {withFrames(m, func(d *snapshotDesc) { d.Frames-- }), without(fork)},
		"orphaned frame corrupt":        {m, badOrphans},
		"orphan log cut short":          {shortOrphans, body},
	} {
		if _, err := r3.ReceiveSnapshot(tc.m, bytes.NewReader(tc.body)); !errors.Is(err, ErrSnapshotInvalid) {
			t.Fatalf("%s: %v, want ErrSnapshotInvalid", name, err)
		}
		if len(r3.Orphans()) != 0 || len(stagedFiles(t, c.dirs[3])) != 0 {
			t.Fatalf("%s: left %d forks, staged files %v", name, len(r3.Orphans()), stagedFiles(t, c.dirs[3]))
		}
		if files := c.orphanFiles(3); len(files) != 0 {
			t.Fatalf("%s: left orphan files %v", name, files)
		}
	}
	st, err := r3.ReceiveSnapshot(m, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if err := r3.StepSnapshot(m, st); err != nil {
		t.Fatal(err)
	}
	c.holdSnaps = false
	c.tick(3)
	if r3.Stats().SnapshotsInstalled != 1 || len(r3.Orphans()) != 1 {
		t.Fatalf("node 3: %d snapshots, %d forks", r3.Stats().SnapshotsInstalled, len(r3.Orphans()))
	}
	c.identical()
}

// withFrames returns m with its description changed by f.
func withFrames(m *raftpb.Message, f func(d *snapshotDesc)) *raftpb.Message {
	d, _ := decodeSnapshotDesc(m.GetSnapshot().GetData())
	f(&d)
	m2 := proto.Clone(m).(*raftpb.Message)
	m2.Snapshot.Data = d.encode()
	return m2
}

// TestOrphanStore: the store refuses what is not a complete fork, drops a
// fork whose writing was interrupted, and reads frames by offset within a
// fork's bounds.
func TestOrphanStore(t *testing.T) {
	fs := vfs.NewMem(rand.New(rand.NewPCG(1, 2)))
	dir := "/r/" + OrphanDirName
	o, err := OpenOrphans(fs, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	var frames [][]byte
	for i := uint64(0); i < 40; i++ {
		recs := []batch.Record{{Key: []byte("k"), Value: bytes.Repeat([]byte{byte(i)}, 3000)}, {Value: []byte("v")}}
		frames = append(frames, batch.Encode(nil, batch.Header{BaseOffset: 10 + 2*i, Epoch: 1, ProducerID: 5, Term: 2, Index: 20 + i}, recs))
	}
	src := func(emit func([]byte) error) error {
		for _, f := range frames {
			if err := emit(f); err != nil {
				return err
			}
		}
		return nil
	}
	rec := ForkRecord{Index: 70, Term: 3, PrevIndex: 19, At: 10, Epoch: 2, FirstOffset: 10, NextOffset: 90}
	got, wrote, err := o.writeFork(rec, src, nil)
	if err != nil || !wrote || got.Records != 80 || got.Frames != 40 {
		t.Fatalf("write: %+v %v %v", got, wrote, err)
	}
	if _, wrote, _ := o.writeFork(rec, src, nil); wrote {
		t.Fatal("a fork was written twice")
	}
	// Bad frames are refused before anything is stored.
	bad := rec
	bad.Index, bad.NextOffset = 80, 92
	if _, _, err := o.writeFork(bad, src, nil); err == nil {
		t.Fatal("frames short of the tail were stored")
	}
	if len(o.Forks()) != 1 {
		t.Fatalf("forks: %+v", o.Forks())
	}
	// A crash while writing leaves a temporary file, which opening drops.
	f, err := fs.OpenFile(dir+"/"+forkFileName(90)+forkTmpSuffix, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("torn"), 0)
	f.Close()
	if o, err = OpenOrphans(fs, dir, nil); err != nil || len(o.Forks()) != 1 || o.Forks()[0] != got {
		t.Fatalf("reopen: %+v %v", o.Forks(), err)
	}
	for _, from := range []uint64{10, 11, 47, 88, 89} {
		b, err := o.ReadFrames(70, from, 1)
		h, herr := batch.DecodeHeader(b)
		if err != nil || herr != nil || h.BaseOffset > from || h.NextOffset() <= from || len(b) != len(frames[(from-10)/2]) {
			t.Fatalf("read from %d: %+v %v %v", from, h, err, herr)
		}
	}
	if b, err := o.ReadFrames(70, 10, 1<<30); err != nil || !bytes.Equal(b, bytes.Join(frames, nil)) {
		t.Fatalf("read all: %d bytes, %v", len(b), err)
	}
	if b, err := o.ReadFrames(70, 90, 1); err != nil || b != nil {
		t.Fatalf("read at the end: %v %v", b, err)
	}
	if _, err := o.ReadFrames(70, 9, 1); !errors.Is(err, ErrOrphanRange) {
		t.Fatalf("read below: %v", err)
	}
	if _, err := o.ReadFrames(71, 10, 1); !errors.Is(err, ErrForkNotFound) {
		t.Fatalf("read an unknown fork: %v", err)
	}
	// A damaged record or a file cut short is corruption.
	for name, damage := range map[string]func(f vfs.File){
		"record": func(f vfs.File) { f.WriteAt([]byte{0xff}, 10) },
		"short":  func(f vfs.File) { f.Truncate(int64(forkRecordBytes) + 100) },
	} {
		fs2 := fs.Crash()
		f, err := fs2.OpenFile(dir+"/"+forkFileName(70), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		damage(f)
		f.Close()
		if _, err := OpenOrphans(fs2, dir, nil); !errors.Is(err, ErrOrphansCorrupt) {
			t.Fatalf("%s: open: %v", name, err)
		}
	}
}
