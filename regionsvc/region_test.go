package regionsvc

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// testRegion runs n replicated nodes in this process.
type testRegion struct {
	t       *testing.T
	rf      int
	peers   map[uint64]string
	dirs    map[uint64]string
	nodes   map[uint64]*Node
	clients map[uint64]geologv1.LogClient
	admins  map[uint64]geologv1.AdminClient
	mut     func(*Config) // adjusts every node's config, if set
}

func newTestRegion(t *testing.T, size int) *testRegion {
	return newTestRegionRF(t, size, 3)
}

func newTestRegionRF(t *testing.T, size, rf int) *testRegion {
	return newTestRegionWith(t, size, rf, nil)
}

func newTestRegionWith(t *testing.T, size, rf int, mut func(*Config)) *testRegion {
	tr := &testRegion{t: t, rf: rf, peers: map[uint64]string{}, dirs: map[uint64]string{}, nodes: map[uint64]*Node{}, clients: map[uint64]geologv1.LogClient{}, admins: map[uint64]geologv1.AdminClient{}, mut: mut}
	for id := uint64(1); id <= uint64(size); id++ {
		tr.peers[id] = freeAddr(t)
		tr.dirs[id] = t.TempDir()
	}
	for id := range tr.peers {
		tr.start(id)
	}
	t.Cleanup(func() {
		for id := range tr.nodes {
			tr.stop(id)
		}
	})
	return tr
}

func (tr *testRegion) start(id uint64) {
	cfg := Config{
		DataDir: tr.dirs[id], ListenAddr: tr.peers[id], NodeID: id, Peers: tr.peers, ReplicationFactor: tr.rf,
		TickInterval: testTick(20 * time.Millisecond), Fsync: 1, // FsyncNever: the test is about replication
		Logger: hclog.New(&hclog.LoggerOptions{Output: tWriter{tr.t}, Level: hclog.Warn}),
	}
	if tr.mut != nil {
		tr.mut(&cfg)
	}
	n, err := New(cfg)
	if err != nil {
		tr.t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		tr.t.Fatal(err)
	}
	conn, err := grpc.NewClient(tr.peers[id], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tr.t.Fatal(err)
	}
	tr.t.Cleanup(func() { conn.Close() })
	tr.nodes[id], tr.clients[id] = n, geologv1.NewLogClient(conn)
	tr.admins[id] = geologv1.NewAdminClient(conn)
}

func (tr *testRegion) stop(id uint64) {
	if n := tr.nodes[id]; n != nil {
		n.Close()
		delete(tr.nodes, id)
		delete(tr.clients, id)
	}
}

// retry calls fn against every live node in turn until it succeeds.
// Each attempt is bounded (2 s), so a call stuck on one node cannot use up
// the test's whole budget.
func (tr *testRegion) retry(ctx context.Context, what string, fn func(ctx context.Context, c geologv1.LogClient) error) {
	tr.t.Helper()
	var last error
	for ctx.Err() == nil {
		for id := uint64(1); id <= uint64(len(tr.peers)); id++ {
			c, ok := tr.clients[id]
			if !ok {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			last = fn(cctx, c)
			cancel()
			if last == nil {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	tr.t.Fatalf("%s: %v", what, last)
}

func TestRegionReplicates(t *testing.T) {
	t.Parallel()
	tr := newTestRegion(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tr.retry(ctx, "create stream", func(ctx context.Context, c geologv1.LogClient) error {
		_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "r", RangeCount: 2})
		if rpcerr.CodeOf(err) == apierr.StreamExists {
			return nil
		}
		return err
	})
	// Every node learns the stream from the catalogue.
	for id, c := range tr.clients {
		tr.retry(ctx, fmt.Sprintf("describe on node %d", id), func(ctx context.Context, _ geologv1.LogClient) error {
			_, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "r"})
			return err
		})
	}
	appendAll := func(tag string, count int) {
		for i := 0; i < count; i++ {
			seq := uint64(i)
			tr.retry(ctx, "append", func(ctx context.Context, c geologv1.LogClient) error {
				_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "r", Range: 1, ProducerId: 77,
					BaseSequence: seq, Records: []*geologv1.Record{{Key: []byte("k"), Value: []byte(fmt.Sprintf("%s-%d", tag, i))}}})
				return err
			})
		}
	}
	appendAll("a", 20)
	// Every replica serves the same committed log (follower reads).
	for id, c := range tr.clients {
		rr, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "r", Range: 1, Consistency: geologv1.Consistency_CONSISTENCY_MIN_OFFSET, MinOffset: 20})
		if err != nil || len(rr.Records) != 20 {
			t.Fatalf("node %d read: %v %v", id, rr, err)
		}
		for i, r := range rr.Records {
			if r.Offset != uint64(i) || string(r.Value) != fmt.Sprintf("a-%d", i) {
				t.Fatalf("node %d offset %d: %q", id, r.Offset, r.Value)
			}
		}
	}
	// Stop the leader of range 1: the others elect a new one and go on.
	var leader uint64
	for id, n := range tr.nodes {
		st := n.streams["r"]
		if st.ranges[1].rep.IsLeader() {
			leader = id
		}
	}
	if leader == 0 {
		t.Fatal("no leader for range 1")
	}
	tr.stop(leader)
	for i := 20; i < 30; i++ {
		seq := uint64(i)
		tr.retry(ctx, "append after leader stop", func(ctx context.Context, c geologv1.LogClient) error {
			_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "r", Range: 1, ProducerId: 77,
				BaseSequence: seq, Records: []*geologv1.Record{{Key: []byte("k"), Value: []byte(fmt.Sprintf("b-%d", i))}}})
			return err
		})
	}
	// The stopped node comes back and catches up.
	tr.start(leader)
	// It relearns the catalogue from the meta group, then the range.
	var rr *geologv1.ReadResponse
	c := tr.clients[leader]
	tr.retry(ctx, "read on the restarted node", func(ctx context.Context, _ geologv1.LogClient) error {
		var err error
		rr, err = c.Read(ctx, &geologv1.ReadRequest{Stream: "r", Range: 1, MaxRecords: 100,
			Consistency: geologv1.Consistency_CONSISTENCY_MIN_OFFSET, MinOffset: 30})
		return err
	})
	if len(rr.Records) != 30 || string(rr.Records[29].Value) != "b-29" {
		t.Fatalf("restarted node: %d records", len(rr.Records))
	}
	for i, r := range rr.Records {
		want := fmt.Sprintf("a-%d", i)
		if i >= 20 {
			want = fmt.Sprintf("b-%d", i)
		}
		if r.Offset != uint64(i) || string(r.Value) != want {
			t.Fatalf("restarted node offset %d: %q, want %q", r.Offset, r.Value, want)
		}
	}
}

// TestReplaceReplicaThroughAdmin: in a 4-node region with ranges on nodes
// 1-3, move range 0's replica from node 1 to node 4 (learner, catch-up,
// promote, remove) while appends go on; node 4 then serves the whole log.
func TestReplaceReplicaThroughAdmin(t *testing.T) {
	t.Parallel()
	tr := newTestRegionRF(t, 4, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tr.retry(ctx, "create stream", func(ctx context.Context, c geologv1.LogClient) error {
		_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "m", RangeCount: 1})
		if rpcerr.CodeOf(err) == apierr.StreamExists {
			return nil
		}
		return err
	})
	seq := uint64(0)
	appendN := func(n int) {
		for i := 0; i < n; i++ {
			s := seq
			tr.retry(ctx, "append", func(ctx context.Context, c geologv1.LogClient) error {
				_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "m", ProducerId: 3, BaseSequence: s,
					Records: []*geologv1.Record{{Value: []byte(fmt.Sprintf("v%d", s))}}})
				return err
			})
			seq++
		}
	}
	appendN(10)
	admin := func(change geologv1.ReplicaChange, node uint64) {
		t.Helper()
		var last error
		for id := uint64(1); id <= 4 && ctx.Err() == nil; id = id%4 + 1 {
			a, ok := tr.admins[id]
			if !ok {
				continue
			}
			cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
			_, last = a.ChangeReplicas(cctx, &geologv1.ChangeReplicasRequest{Stream: "m", Change: change, NodeId: node})
			ccancel()
			if last == nil {
				return
			}
			if code := rpcerr.CodeOf(last); code != apierr.NotLeader && code != apierr.StreamNotFound && !rpcerr.IsRetriable(last) {
				t.Fatalf("%v %d: %v", change, node, last)
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("%v %d: %v", change, node, last)
	}
	admin(geologv1.ReplicaChange_REPLICA_CHANGE_ADD_LEARNER, 4)
	appendN(5)
	// Wait until the learner has caught up with the leader.
	tr.retry(ctx, "learner catch-up", func(ctx context.Context, c geologv1.LogClient) error {
		for id := uint64(1); id <= 3; id++ {
			d, err := tr.admins[id].DescribeReplicas(ctx, &geologv1.DescribeReplicasRequest{Stream: "m"})
			if err != nil {
				continue
			}
			for _, r := range d.Replicas {
				if r.NodeId == 4 && r.Role == "learner" && r.MatchIndex == d.LastIndex {
					return nil
				}
			}
			return fmt.Errorf("learner not caught up: %v", d)
		}
		return fmt.Errorf("no leader answered")
	})
	// A change decided from voters the range no longer has is refused,
	// whichever way they are listed, and changes nothing.
	refuseStale := func(expect []uint64) {
		t.Helper()
		for id := uint64(1); ctx.Err() == nil; id = id%3 + 1 {
			_, err := tr.admins[id].ChangeReplicas(ctx, &geologv1.ChangeReplicasRequest{Stream: "m",
				Change: geologv1.ReplicaChange_REPLICA_CHANGE_REMOVE, NodeId: 3, ExpectedVoters: expect})
			if code := rpcerr.CodeOf(err); code == apierr.NotLeader || rpcerr.IsRetriable(err) {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			if rpcerr.CodeOf(err) != apierr.InvalidArgument || !strings.Contains(err.Error(), "voters changed") {
				t.Fatalf("remove 3 expecting %v: %v", expect, err)
			}
			return
		}
	}
	refuseStale([]uint64{4, 1, 2})
	refuseStale([]uint64{1, 2})
	admin(geologv1.ReplicaChange_REPLICA_CHANGE_PROMOTE, 4)
	admin(geologv1.ReplicaChange_REPLICA_CHANGE_REMOVE, 1)
	// A bad request gets a typed error.
	_, err := tr.admins[2].ChangeReplicas(ctx, &geologv1.ChangeReplicasRequest{Stream: "m", Change: geologv1.ReplicaChange_REPLICA_CHANGE_PROMOTE, NodeId: 9})
	if rpcerr.CodeOf(err) != apierr.InvalidArgument {
		t.Fatalf("unknown node: %v", err)
	}
	tr.stop(1)
	appendN(5)
	rr, err := tr.clients[4].Read(ctx, &geologv1.ReadRequest{Stream: "m", MaxRecords: 100,
		Consistency: geologv1.Consistency_CONSISTENCY_MIN_OFFSET, MinOffset: 20})
	if err != nil || len(rr.Records) != 20 {
		t.Fatalf("node 4 read: %v %v", rr, err)
	}
	for i, r := range rr.Records {
		if string(r.Value) != fmt.Sprintf("v%d", i) {
			t.Fatalf("node 4 offset %d: %q", i, r.Value)
		}
	}
}

// TestStreamNotFoundIsFinal: a stream created through one node is found at
// once through every other node, although their copies of the catalogue
// learn of the commit a message later (a miss is confirmed with the
// catalogue leader); a stream that was never created is STREAM_NOT_FOUND
// everywhere.
func TestStreamNotFoundIsFinal(t *testing.T) {
	t.Parallel()
	tr := newTestRegion(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tr.retry(ctx, "first stream", func(ctx context.Context, c geologv1.LogClient) error {
		_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "first", RangeCount: 1})
		if rpcerr.CodeOf(err) == apierr.StreamExists {
			return nil
		}
		return err
	})
	for i := 0; i < 30; i++ {
		name := fmt.Sprintf("s%d", i)
		via := uint64(i%3) + 1
		// A leader change under load answers a create NOT_LEADER: retried
		// at the same node (the stream may exist by then).
		for {
			_, err := tr.clients[via].CreateStream(ctx, &geologv1.CreateStreamRequest{Name: name, RangeCount: 1})
			if err == nil || rpcerr.CodeOf(err) == apierr.StreamExists {
				break
			}
			if !rpcerr.IsRetriable(err) || ctx.Err() != nil {
				t.Fatalf("create %s via node %d: %v", name, via, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		for id := uint64(1); id <= 3; id++ {
			if _, err := tr.clients[id].DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: name}); err != nil {
				t.Fatalf("describe %s on node %d right after its create via node %d: %v", name, id, via, err)
			}
		}
	}
	// The final answer for a stream never created is STREAM_NOT_FOUND. A
	// node that cannot confirm it yet (its catalogue's leader changing
	// under load) answers retriably instead, and a client retries; what
	// must never come is another final answer.
	finalAnswer := func(call func() error) error {
		for {
			err := call()
			if err == nil || !rpcerr.IsRetriable(err) || ctx.Err() != nil {
				return err
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for id := uint64(1); id <= 3; id++ {
		err := finalAnswer(func() error {
			_, err := tr.clients[id].DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "never"})
			return err
		})
		wantCode(t, err, apierr.StreamNotFound)
		err = finalAnswer(func() error {
			_, err := tr.clients[id].Append(ctx, &geologv1.AppendRequest{Stream: "never", Records: []*geologv1.Record{{Value: []byte("x")}}})
			return err
		})
		wantCode(t, err, apierr.StreamNotFound)
	}
}
