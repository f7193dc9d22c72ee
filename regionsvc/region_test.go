package regionsvc

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// testRegion runs n replicated nodes in this process.
type testRegion struct {
	t       *testing.T
	peers   map[uint64]string
	dirs    map[uint64]string
	nodes   map[uint64]*Node
	clients map[uint64]geologv1.LogClient
}

func newTestRegion(t *testing.T, size int) *testRegion {
	tr := &testRegion{t: t, peers: map[uint64]string{}, dirs: map[uint64]string{}, nodes: map[uint64]*Node{}, clients: map[uint64]geologv1.LogClient{}}
	for id := uint64(1); id <= uint64(size); id++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		tr.peers[id] = l.Addr().String()
		l.Close()
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
	n, err := New(Config{
		DataDir: tr.dirs[id], ListenAddr: tr.peers[id], NodeID: id, Peers: tr.peers,
		TickInterval: 20 * time.Millisecond, Fsync: 1, // FsyncNever: the test is about replication
		Logger: hclog.New(&hclog.LoggerOptions{Output: tWriter{tr.t}, Level: hclog.Warn}),
	})
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
}

func (tr *testRegion) stop(id uint64) {
	if n := tr.nodes[id]; n != nil {
		n.Close()
		delete(tr.nodes, id)
		delete(tr.clients, id)
	}
}

// retry calls fn against every live node in turn until it succeeds.
func (tr *testRegion) retry(ctx context.Context, what string, fn func(c geologv1.LogClient) error) {
	tr.t.Helper()
	var last error
	for ctx.Err() == nil {
		for id := uint64(1); id <= uint64(len(tr.peers)); id++ {
			c, ok := tr.clients[id]
			if !ok {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			last = fn(c)
			cancel()
			_ = cctx
			if last == nil {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	tr.t.Fatalf("%s: %v", what, last)
}

func TestRegionReplicates(t *testing.T) {
	tr := newTestRegion(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tr.retry(ctx, "create stream", func(c geologv1.LogClient) error {
		_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "r", RangeCount: 2})
		if apierr.CodeOf(err) == apierr.StreamExists {
			return nil
		}
		return err
	})
	// Every node learns the stream from the catalogue.
	for id, c := range tr.clients {
		tr.retry(ctx, fmt.Sprintf("describe on node %d", id), func(geologv1.LogClient) error {
			_, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "r"})
			return err
		})
	}
	appendAll := func(tag string, count int) {
		for i := 0; i < count; i++ {
			seq := uint64(i)
			tr.retry(ctx, "append", func(c geologv1.LogClient) error {
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
		tr.retry(ctx, "append after leader stop", func(c geologv1.LogClient) error {
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
	tr.retry(ctx, "read on the restarted node", func(geologv1.LogClient) error {
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
