package regionsvc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"go.etcd.io/raft/v3"
)

// TestStrayReplicasRemovedOnReturn: node 4 of a 4-node region holds
// replicas of a stream a producer appends to; it is stopped, found dead
// (2 s) and its ranges are repaired on nodes 1-3; it is drained while down
// (so that the rebalancer gives it nothing back) and restarted. Its
// replicas of those ranges are strays: they must go (segments and Raft
// state removed, a tombstone left), the range's replica on node 4 must
// not name node 4 in its configuration (so it never campaigns), and a
// read at node 4 must serve none of the old records; every range keeps
// three voters, and every acked record reads back in order; undrained,
// node 4 takes replicas again into the emptied copies. It
// fails with the sweep off (the old replica stays a voter of its own
// configuration, its data on disk, its records served).
func TestStrayReplicasRemovedOnReturn(t *testing.T) {
	t.Parallel()
	const ranges = 4
	tr := newTestRegionWith(t, 4, 3, func(c *Config) {
		rebalanceConfig(2)(c)
		c.Rebalance.StrayCheckInterval = 200 * time.Millisecond
	})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	tr.createStream(ctx, "stray", ranges)
	// Appends go through every node, node 4 too: a follower refuses an
	// append (NOT_LEADER), and node 4 may win a range's first election
	// (as placed here it is range 1's first campaigner). Without node 4
	// the producer stalled on that range, stopped after a minute, and no
	// copy got records. Node 4 is tried last; while it is down, its
	// calls fail and are retried like any refusal.
	p := startProducer(t, "stray", ranges, maps.Clone(tr.clients), 0)
	held := tr.waitStrayData(ctx, ranges, p) // node 4's ranges
	tr.stop(4)
	tr.waitVoters(ctx, "node 4's ranges repaired", "stray", ranges, noneOn(4))
	if _, err := tr.admins[1].SetNodeState(ctx, &geologv1.SetNodeStateRequest{NodeId: 4, State: geologv1.NodeState_NODE_STATE_DRAINING}); err != nil {
		t.Fatalf("drain node 4: %v", err)
	}
	tr.start(4)
	restarted := time.Now()
	// Sweeps every 200 ms, two in a row to suspect: seconds, not minutes.
	sctx, scancel := context.WithTimeout(ctx, 90*time.Second)
	defer scancel()
	for _, r := range held {
		tr.waitStrayGone(sctx, "stray", r)
	}
	t.Logf("node 4's strays gone %v after its restart", time.Since(restarted).Round(time.Millisecond))
	tr.checkStraysQuiet(ctx, held)
	// A removed stray is an empty passive replica: undrained, node 4 takes
	// replicas again (a learner that catches up from nothing).
	if _, err := tr.admins[1].SetNodeState(ctx, &geologv1.SetNodeStateRequest{NodeId: 4, State: geologv1.NodeState_NODE_STATE_LIVE}); err != nil {
		t.Fatalf("undrain node 4: %v", err)
	}
	var back int
	tr.waitVoters(ctx, "replicas back on node 4", "stray", ranges, func(v [][]uint64) error {
		back = -1
		for r, ids := range v {
			if slices.Contains(ids, 4) && tr.nodes[4].localRange("stray", uint32(r)).committed.Load() > 0 {
				back = r
			}
		}
		if back < 0 {
			return errors.New("no range on node 4 with records there")
		}
		return tr.rebalancerIdle()
	})
	sent := p.finish()
	tr.replicaCounts(ctx, "stray", ranges) // three distinct voters each
	tr.checkLog(ctx, "stray", sent)
	t.Logf("node 4's %d stray replicas removed; range %d moved back onto it; acked per range %v", len(held), back, sent)
}

// waitStrayData waits until node 4 is a voter of some ranges and its copy
// of each has records, so that a stray has something to remove, and
// returns those ranges. Placement is read again with the data: the
// rebalancer may still move a replica off node 4 meanwhile. A producer
// that stopped (no node acked an append in a minute) fails the test at
// once: no copy gets records after it.
func (tr *testRegion) waitStrayData(ctx context.Context, ranges uint32, p *testProducer) []uint32 {
	tr.t.Helper()
	var held []uint32
	tr.waitVoters(ctx, "node 4 holds records", "stray", ranges, func(v [][]uint64) error {
		if err := p.failed(); err != nil {
			tr.t.Fatalf("producer: %v", err)
		}
		held = held[:0]
		for r, ids := range v {
			if !slices.Contains(ids, 4) {
				continue
			}
			d := tr.nodes[4].localRange("stray", uint32(r))
			if d == nil || d.committed.Load() < 5 {
				return fmt.Errorf("node 4's copy of range %d has no records yet", r)
			}
			held = append(held, uint32(r))
		}
		if len(held) == 0 {
			return errors.New("nothing placed on node 4")
		}
		return nil
	})
	return held
}

// waitStrayGone waits until node 4's replica of range r is no stray: its
// tombstone written, its configuration without node 4, its store and its
// directory's segments empty, and a read there serves no record.
func (tr *testRegion) waitStrayGone(ctx context.Context, stream string, r uint32) {
	tr.t.Helper()
	n := tr.nodes[4]
	var last error
	for ctx.Err() == nil {
		if last = tr.strayGone(ctx, n, stream, r); last == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	tr.t.Fatalf("node 4's replica of range %d: %v", r, last)
}

func (tr *testRegion) strayGone(ctx context.Context, n *Node, stream string, r uint32) error {
	d := n.localRange(stream, r)
	var conf []uint64
	if err := d.exec(ctx, func() { conf = append(d.rep.Conf().GetVoters(), d.rep.Conf().GetLearners()...) }); err != nil {
		return err
	}
	if slices.Contains(conf, 4) {
		return fmt.Errorf("configuration %v names node 4", conf)
	}
	if sz := d.store.Size(); sz != 0 {
		return fmt.Errorf("store holds %d bytes", sz)
	}
	if b := dirBytes(n.rangeDir(stream, r)); b > 64<<10 {
		return fmt.Errorf("directory holds %d bytes", b)
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := tr.clients[4].Read(rctx, &geologv1.ReadRequest{Stream: stream, Range: r, FromOffset: 0, MaxRecords: 10})
	if err == nil && len(resp.Records) > 0 {
		return fmt.Errorf("node 4 served %d records", len(resp.Records))
	}
	if _, err := os.Stat(n.strayTombstonePath(stream, r)); err != nil {
		return fmt.Errorf("no tombstone: %w", err)
	}
	return nil
}

// checkStraysQuiet checks for a second that no replica of held on node 4
// campaigns or leads.
func (tr *testRegion) checkStraysQuiet(ctx context.Context, held []uint32) {
	tr.t.Helper()
	n := tr.nodes[4]
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		for _, r := range held {
			d := n.localRange("stray", r)
			var st raft.StateType
			if err := d.exec(ctx, func() { st = d.rep.Status().RaftState }); err != nil {
				tr.t.Fatal(err)
			}
			if st != raft.StateFollower {
				tr.t.Fatalf("node 4's replica of range %d is %v", r, st)
			}
		}
	}
}

// dirBytes sums the sizes of the files under dir.
func dirBytes(dir string) int64 {
	var total int64
	filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			if info, err := e.Info(); err == nil {
				total += info.Size()
			}
		}
		return nil
	})
	return total
}

// TestStraySweepSparesMembers: the sweep's questions and its last check
// keep members. In a 4-node region (no rebalancer, no background sweep),
// every voter of a range is told it is no stray; node 4, added to a range
// as a learner, is told it is no stray either, and a removal attempted on
// its replica anyway (voters that leave it out, as an answer from before
// the addition would) does nothing: its replica hears the leader, so it
// is not condemned, its data and driver stay and no tombstone is written.
// It fails if a member is taken for a stray or if the removal goes ahead
// (the leader check of step 3 undone).
func TestStraySweepSparesMembers(t *testing.T) {
	t.Parallel()
	tr := newTestRegionWith(t, 4, 3, func(c *Config) { c.Rebalance.StrayCheckInterval = -1 })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ranges = 2
	tr.createStream(ctx, "spare", ranges)
	v := tr.voters(ctx, "spare", ranges)
	for r, ids := range v {
		for _, id := range ids {
			if _, stray := tr.nodes[id].askStray(ctx, strayKey{"spare", uint32(r)}); stray {
				t.Fatalf("range %d: voter %d taken for a stray", r, id)
			}
		}
	}
	r := -1
	for i, ids := range v {
		if !slices.Contains(ids, 4) {
			r = i
		}
	}
	if r < 0 {
		t.Skip("every range has a voter on node 4") // placement spreads 2 ranges over 4 nodes: not seen
	}
	key := strayKey{"spare", uint32(r)}
	tr.retry(ctx, "append", func(ctx context.Context, c geologv1.LogClient) error {
		_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "spare", Range: uint32(r), Records: []*geologv1.Record{{Value: []byte("x")}}})
		return err
	})
	if _, err := (&rangeRouter{n: tr.nodes[1], stream: "spare", r: uint32(r)}).Change(ctx, geologv1.ReplicaChange_REPLICA_CHANGE_ADD_LEARNER, 4, nil); err != nil {
		t.Fatalf("add learner 4: %v", err)
	}
	d := tr.nodes[4].localRange("spare", uint32(r))
	waitUntil(t, ctx, 30*time.Second, "learner 4 has the record", func() bool { return d.committed.Load() > 0 })
	if _, stray := tr.nodes[4].askStray(ctx, key); stray {
		t.Fatal("learner 4 taken for a stray")
	}
	if err := tr.nodes[4].removeStray(ctx, key, d, v[r]); err != nil {
		t.Fatalf("removeStray: %v", err)
	}
	if tr.nodes[4].localRange("spare", uint32(r)) != d || d.store.Size() == 0 {
		t.Fatal("learner 4's replica was removed")
	}
	if _, err := os.Stat(tr.nodes[4].strayTombstonePath("spare", uint32(r))); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("tombstone of a learner: %v", err)
	}
	var learners []uint64
	if err := d.exec(ctx, func() { learners = d.rep.Conf().GetLearners() }); err != nil || !slices.Contains(learners, 4) {
		t.Fatalf("learner 4's conf %v, %v", learners, err)
	}
}
