package regionsvc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/replicamove"
	"github.com/geolog/geolog/internal/rpcerr"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/raftnet"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// strayScene is a 4-node region at R3 with one range "sh" of count
// records, idle and quiesced: voters, their leader, x (a follower that
// will be removed) and y (the node outside).
type strayScene struct {
	tr        *testRegion
	leader    uint64
	x, y      uint64
	voters    []uint64
	sub       *subWatch
	appended  int
	producers uint64
}

const strayHintStream = "sh"

func newStrayScene(t *testing.T, ctx context.Context, mut func(*Config)) *strayScene {
	tr := newTestRegionWith(t, 4, 3, mut)
	tr.createStream(ctx, strayHintStream, 1)
	s := &strayScene{tr: tr, producers: 41}
	s.appendN(t, ctx, 20)
	s.voters = tr.voters(ctx, strayHintStream, 1)[0]
	s.leader = tr.leaderOf(ctx, strayHintStream, 0)
	for id := uint64(1); id <= 4; id++ {
		switch {
		case !slices.Contains(s.voters, id):
			s.y = id
		case id != s.leader && s.x == 0:
			s.x = id
		}
	}
	if s.x == 0 || s.y == 0 {
		t.Fatalf("voters %v, leader %d: no follower and outsider", s.voters, s.leader)
	}
	d := tr.nodes[s.x].localRange(strayHintStream, 0)
	waitUntil(t, ctx, time.Minute, "x holds the records and is quiesced", func() bool {
		return d.committed.Load() == uint64(s.appended) && d.quiesced.Load()
	})
	s.sub = watchSubscription(t, ctx, tr.clients[s.x], strayHintStream)
	waitUntil(t, ctx, time.Minute, "the subscription at x reads the records", func() bool { return s.sub.count() == s.appended })
	return s
}

// appendN appends count records through whichever node takes them,
// never through x (an append there would wake its replica: the scene
// wants it quiesced).
func (s *strayScene) appendN(t *testing.T, ctx context.Context, count int) {
	t.Helper()
	for i := 0; i < count; i++ {
		seq := uint64(s.appended)
		var last error
		for done := false; !done; time.Sleep(20 * time.Millisecond) {
			if ctx.Err() != nil {
				t.Fatalf("append %d: %v", seq, last)
			}
			for id, c := range s.tr.clients {
				if id == s.x {
					continue
				}
				cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, last = c.Append(cctx, &geologv1.AppendRequest{Stream: strayHintStream, ProducerId: s.producers, BaseSequence: seq,
					Records: []*geologv1.Record{{Value: []byte(fmt.Sprintf("v%d", seq))}}})
				cancel()
				if done = last == nil; done {
					break
				}
			}
		}
		s.appended++
	}
}

// cut cuts x off from every other node (both ways), or heals the cut.
func (s *strayScene) cut(on bool, except ...uint64) {
	for id, n := range s.tr.nodes {
		if !on {
			n.testBlockPeer.Store(nil)
			continue
		}
		var f func(uint64) bool
		if id == s.x {
			f = func(p uint64) bool { return !slices.Contains(except, p) }
		} else if !slices.Contains(except, id) {
			f = func(p uint64) bool { return p == s.x }
		} else {
			n.testBlockPeer.Store(nil)
			continue
		}
		n.testBlockPeer.Store(&f)
	}
}

// moveOffX replaces x by y, run from the leader's node.
func (s *strayScene) moveOffX(t *testing.T, ctx context.Context) {
	rr := &rangeRouter{n: s.tr.nodes[s.leader], stream: strayHintStream, r: 0}
	if err := replicamove.Replace(ctx, rr, s.x, s.y, replicamove.Config{}); err != nil {
		t.Fatalf("move %d -> %d: %v", s.x, s.y, err)
	}
}

// subWatch follows a raw subscription from offset 0.
type subWatch struct {
	recs chan int
	done chan error
	n    int
}

func watchSubscription(t *testing.T, ctx context.Context, c geologv1.LogClient, stream string) *subWatch {
	sub, err := c.Subscribe(ctx, &geologv1.SubscribeRequest{Stream: stream, Start: &geologv1.SubscribeRequest_FromOffset{FromOffset: 0}})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	w := &subWatch{recs: make(chan int, 1024), done: make(chan error, 1)}
	go func() {
		for {
			m, err := sub.Recv()
			if err != nil {
				w.done <- err
				return
			}
			w.recs <- len(m.GetRecords())
		}
	}()
	return w
}

// count is the records received so far.
func (w *subWatch) count() int {
	for {
		select {
		case k := <-w.recs:
			w.n += k
		default:
			return w.n
		}
	}
}

// waitEnd waits up to d for the subscription to end and returns its error.
func (w *subWatch) waitEnd(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case err := <-w.done:
		return err
	case <-time.After(d):
		t.Fatalf("the subscription at the removed replica still runs after %v (%d records)", d, w.count())
		return nil
	}
}

// checkRemoved waits up to d for node id's replica of the range to be
// gone as strayGone says (tombstone, no data, no configuration naming it).
func (s *strayScene) checkRemoved(t *testing.T, ctx context.Context, d time.Duration) {
	t.Helper()
	n := s.tr.nodes[s.x]
	var last error
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if last = strayGoneAt(ctx, n, s.tr.clients[s.x], s.x, strayHintStream, 0); last == nil {
			return
		}
	}
	t.Fatalf("node %d's replica not removed within %v: %v", s.x, d, last)
}

// strayGoneAt is strayGone for node id.
func strayGoneAt(ctx context.Context, n *Node, c geologv1.LogClient, id uint64, stream string, r uint32) error {
	d := n.localRange(stream, r)
	var conf []uint64
	if err := d.exec(ctx, func() { conf = append(d.rep.Conf().GetVoters(), d.rep.Conf().GetLearners()...) }); err != nil {
		return err
	}
	if slices.Contains(conf, id) {
		return fmt.Errorf("configuration %v names node %d", conf, id)
	}
	if sz := d.store.Size(); sz != 0 {
		return fmt.Errorf("store holds %d bytes", sz)
	}
	if _, err := os.Stat(n.strayTombstonePath(stream, r)); err != nil {
		return fmt.Errorf("no tombstone: %w", err)
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := c.Read(rctx, &geologv1.ReadRequest{Stream: stream, Range: r, FromOffset: 0, MaxRecords: 10})
	if err == nil && len(resp.Records) > 0 {
		return fmt.Errorf("served %d records", len(resp.Records))
	}
	return nil
}

// checkEveryRecord subscribes at node id and waits for every record.
func (s *strayScene) checkEveryRecord(t *testing.T, ctx context.Context, id uint64) {
	t.Helper()
	w := watchSubscription(t, ctx, s.tr.clients[id], strayHintStream)
	waitUntil(t, ctx, 30*time.Second, fmt.Sprintf("a subscription at node %d reads all %d records", id, s.appended), func() bool {
		return w.count() == s.appended
	})
}

// checkNotLeader fails unless err is a retriable NOT_LEADER.
func checkNotLeader(t *testing.T, what string, err error) {
	t.Helper()
	if rpcerr.CodeOf(err) != apierr.NotLeader || !rpcerr.IsRetriable(err) {
		t.Fatalf("%s ended with %v, want a retriable NOT_LEADER", what, err)
	}
}

// TestRemovedReplicaToldByLeader: in a 4-node region at R3, the range's
// follower x (quiesced, a subscriber at its tail) is cut off exactly
// while a move replaces it by the fourth node, then healed. x never
// hears its removal from Raft (the leader stops sending to it), and its
// stray sweep is as good as off (10 minutes): only the leader's hint can
// tell it. Its subscription must end with a retriable NOT_LEADER, and
// its replica be condemned and emptied, within 15 s of the heal (the
// hint's retries are seconds apart); a subscription at a current member
// reads every record, those appended after the move too. Without the
// hint x stays a quiesced voter of its own configuration for ever: the
// subscription waits and the old records stay served.
func TestRemovedReplicaToldByLeader(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := newStrayScene(t, ctx, func(c *Config) { c.Rebalance.StrayCheckInterval = 10 * time.Minute })
	s.cut(true)
	s.moveOffX(t, ctx)
	s.appendN(t, ctx, 10) // not for x's copy
	s.cut(false)
	healed := time.Now()
	checkNotLeader(t, "the subscription at the removed replica", s.sub.waitEnd(t, 15*time.Second))
	s.checkRemoved(t, ctx, 15*time.Second-time.Since(healed))
	t.Logf("node %d removed from voters %v (leader %d, replaced by %d): subscription ended and replica emptied %v after the heal",
		s.x, s.voters, s.leader, s.y, time.Since(healed).Round(time.Millisecond))
	s.checkEveryRecord(t, ctx, s.y)
}

// TestQuiescedStrayLeaderDies: as above, but the hint cannot reach x
// (the leader's node stays cut off from it) and the leader's node then
// dies. x, a quiesced follower of a dead leader, must not keep that
// leader for ever: node liveness wakes it, it forgets the leader, the
// stray sweep (every 500 ms here) flags it at once, so that its
// subscription ends with a retriable NOT_LEADER, and then removes it. It
// fails if a flagged suspect keeps serving its subscription (it would
// wait until the replica is stopped, and then for ever).
func TestQuiescedStrayLeaderDies(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := newStrayScene(t, ctx, func(c *Config) { c.Rebalance.StrayCheckInterval = 500 * time.Millisecond })
	s.cut(true)
	s.moveOffX(t, ctx)
	s.appendN(t, ctx, 10)
	var others []uint64
	for id := range s.tr.nodes {
		if id != s.x && id != s.leader {
			others = append(others, id)
		}
	}
	s.cut(true, others...) // x hears the others again, never the leader
	died := time.Now()     // its transport closes early in stop: x may see it down before stop returns
	s.tr.stop(s.leader)
	checkNotLeader(t, "the subscription at the removed replica", s.sub.waitEnd(t, 15*time.Second))
	s.checkRemoved(t, ctx, 20*time.Second-time.Since(died))
	t.Logf("node %d (removed, quiesced under leader %d): subscription ended and replica emptied %v after the leader died",
		s.x, s.leader, time.Since(died).Round(time.Millisecond))
	s.checkEveryRecord(t, ctx, s.y)
}

// TestForgedReplicaHint: a hint is only a hint. Told it was removed from
// a range it is a voter of, a node asks the leader, which says it is a
// member, and nothing changes: its replica is the same, unflagged, holds
// its records, stays a voter and serves reads. A hint of another region
// is INVALID_ARGUMENT; one for a stream it does not have, for another
// incarnation of the stream, or again at once for the same range starts
// no check. It fails if the hint is acted on without the leader's word.
func TestForgedReplicaHint(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := newStrayScene(t, ctx, func(c *Config) { c.Rebalance.StrayCheckInterval = 10 * time.Minute })
	n := s.tr.nodes[s.x]
	d := n.localRange(strayHintStream, 0)
	spec, _ := n.streamSpec(strayHintStream)
	conn, err := grpc.NewClient(s.tr.peers[s.x], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hints := geologinternalv1.NewReplicaHintsClient(conn)
	req := &geologinternalv1.ReplicaRemovedRequest{Region: n.cfg.Region, NodeId: s.y, Stream: strayHintStream,
		StreamMetaOffset: spec.MetaOffset, Range: 0}
	resp, err := hints.ReplicaRemoved(ctx, req)
	if err != nil || !resp.GetChecking() {
		t.Fatalf("forged hint: %v, %v; want a check started", resp, err)
	}
	if resp, err := hints.ReplicaRemoved(ctx, req); err != nil || resp.GetChecking() {
		t.Fatalf("the same hint again at once: %v, %v; want none started", resp, err)
	}
	for what, bad := range map[string]*geologinternalv1.ReplicaRemovedRequest{
		"unknown stream":  {Region: n.cfg.Region, NodeId: s.y, Stream: "nope", StreamMetaOffset: spec.MetaOffset},
		"old incarnation": {Region: n.cfg.Region, NodeId: s.y, Stream: strayHintStream, StreamMetaOffset: spec.MetaOffset + 1},
		"no such range":   {Region: n.cfg.Region, NodeId: s.y, Stream: strayHintStream, StreamMetaOffset: spec.MetaOffset, Range: 7},
	} {
		if resp, err := hints.ReplicaRemoved(ctx, bad); err != nil || resp.GetChecking() {
			t.Fatalf("%s: %v, %v; want no check", what, resp, err)
		}
	}
	// Node y holds no replica of the range (outside its configuration,
	// nothing stored): nothing to check.
	yconn, err := grpc.NewClient(s.tr.peers[s.y], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer yconn.Close()
	if resp, err := geologinternalv1.NewReplicaHintsClient(yconn).ReplicaRemoved(ctx, req); err != nil || resp.GetChecking() {
		t.Fatalf("hint to node %d, which holds no replica: %v, %v; want no check", s.y, resp, err)
	}
	_, err = hints.ReplicaRemoved(ctx, &geologinternalv1.ReplicaRemovedRequest{Region: "elsewhere", Stream: strayHintStream})
	if rpcerr.CodeOf(err) != apierr.InvalidArgument {
		t.Fatalf("hint of another region: %v", err)
	}
	// The check asks the leader, then would wait strayHintSettle: look
	// well past both.
	time.Sleep(n.strayHintSettle() + 2*time.Second)
	if n.localRange(strayHintStream, 0) != d || d.strayFlagged.Load() || d.store.Size() == 0 {
		t.Fatalf("forged hint acted on: driver replaced %v, flagged %v, store %d bytes",
			n.localRange(strayHintStream, 0) != d, d.strayFlagged.Load(), d.store.Size())
	}
	var condemned, voter bool
	if err := d.exec(ctx, func() { condemned, voter = d.condemned, d.rep.IsVoter() }); err != nil || condemned || !voter {
		t.Fatalf("after a forged hint: condemned %v, voter %v, %v", condemned, voter, err)
	}
	if _, err := os.Stat(n.strayTombstonePath(strayHintStream, 0)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("tombstone after a forged hint: %v", err)
	}
	rr, err := s.tr.clients[s.x].Read(ctx, &geologv1.ReadRequest{Stream: strayHintStream, MaxRecords: 100})
	if err != nil || len(rr.GetRecords()) != s.appended {
		t.Fatalf("read at node %d after a forged hint: %d records, %v", s.x, len(rr.GetRecords()), err)
	}
	if s.sub.count() != s.appended {
		t.Fatalf("subscription at node %d: %d records", s.x, s.sub.count())
	}
	select {
	case err := <-s.sub.done:
		t.Fatalf("subscription at node %d ended after a forged hint: %v", s.x, err)
	default:
	}
}

// TestRemovedReplicaThatHearsRefuses: a follower that applies its own
// removal (not cut off) refuses at once: its subscription ends with a
// retriable NOT_LEADER and a read there is refused, with sweeping and
// hints off (StrayCheckInterval negative), so that only the
// configuration it applied (confApplied, noReplica) can tell it. It fails
// if membership is not noted where the configuration changes.
func TestRemovedReplicaThatHearsRefuses(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := newStrayScene(t, ctx, func(c *Config) { c.Rebalance.StrayCheckInterval = -1 })
	s.moveOffX(t, ctx)
	checkNotLeader(t, "the subscription at the removed replica", s.sub.waitEnd(t, 15*time.Second))
	_, err := s.tr.clients[s.x].Read(ctx, &geologv1.ReadRequest{Stream: strayHintStream, MaxRecords: 100})
	checkNotLeader(t, "a read at the removed replica", err)
	s.appendN(t, ctx, 5)
	s.checkEveryRecord(t, ctx, s.y)
}

// TestDecommissionedPeerCountsDown: a node that leaves the region's node
// list (decommissioned: the transport forgets its peer, whose PeerDown is
// then false) is down for good. The liveness watch sees the change (so
// that a follower quiesced under a leader there wakes), and a driver's
// peerDown says down (so that the woken follower forgets that leader,
// watchLeader, and the stray sweep can suspect it). Without it a quiesced
// follower of a decommissioned leader kept it for ever.
func TestDecommissionedPeerCountsDown(t *testing.T) {
	t.Parallel()
	n := &Node{cfg: Config{NodeID: 1, Peers: map[uint64]string{1: "a:1", 2: "a:2", 3: "a:3"}}}
	tr, err := raftnet.NewGRPCTransport(raftnet.Config{NodeID: 1, Handler: (*raftRouter)(n)})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	n.region = &region{transport: tr, liveness: livenessWatch{ch: make(chan struct{})}}
	n.watchLiveness()
	ch := n.livenessChanged()
	n.watchLiveness()
	select {
	case <-ch:
		t.Fatal("liveness changed with every peer as it was")
	default:
	}
	rc := &replicationConfig{nodeID: 1, transport: tr, peerGone: func(id uint64) bool { return !n.isRegionPeer(id) }}
	d := &rangeDriver{cfg: rangeDriverConfig{repl: rc}}
	if d.peerDown(3) {
		t.Fatal("node 3 down while a member")
	}
	delete(n.cfg.Peers, 3) // decommissioned: gone from the list
	n.watchLiveness()
	select {
	case <-ch:
	default:
		t.Fatal("liveness did not change when node 3 left the region")
	}
	if !d.peerDown(3) || d.peerDown(2) {
		t.Fatalf("peerDown: node 3 (gone) %v, node 2 (member) %v", d.peerDown(3), d.peerDown(2))
	}
}

// TestHeardRemovalEmptied: a follower that hears its own removal (not
// cut off) is hinted too. Either the hint comes while the append that
// carries the removal is on its way (it forgets its leader, then learns
// it again from that append: the hinted check tries again once the
// leader stopped speaking to it), or after it applied the removal (it
// still holds its copy and knows a leader that no longer speaks to it,
// so no sweep would ever suspect it: the hint is checked all the same).
// Either way it must be emptied within 15 s, with sweeping as good as
// off. It fails with one round only, or with hints to a replica that
// applied its removal ignored.
func TestHeardRemovalEmptied(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := newStrayScene(t, ctx, func(c *Config) { c.Rebalance.StrayCheckInterval = 10 * time.Minute })
	s.moveOffX(t, ctx)
	moved := time.Now()
	checkNotLeader(t, "the subscription at the removed replica", s.sub.waitEnd(t, 15*time.Second))
	s.checkRemoved(t, ctx, 15*time.Second-time.Since(moved))
	t.Logf("node %d emptied %v after the move", s.x, time.Since(moved).Round(time.Millisecond))
	s.appendN(t, ctx, 5)
	s.checkEveryRecord(t, ctx, s.y)
}
