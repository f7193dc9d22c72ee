package regionsvc

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/homing"
	"github.com/geolog/geolog/internal/rpcerr"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
)

// TestEpochHistoryWithoutTheLeaseStore: a region of one node with homing
// on an in-memory lease store. DescribeStream's epochs come from the
// store; while the store is down and the node has read no history yet, it
// answers with the epoch it knows (the current one, from its view) and
// says why the history is incomplete; once the store is back, the full
// history, which it then keeps.
func TestEpochHistoryWithoutTheLeaseStore(t *testing.T) {
	t.Parallel()
	store := homing.NewMemStore()
	addr := freeAddr(t)
	_, c := testNode(t, t.TempDir(), func(cfg *Config) {
		cfg.ListenAddr, cfg.NodeID, cfg.Peers, cfg.Region = addr, 1, map[uint64]string{1: addr}, "us"
		cfg.LeaseStore, cfg.LeaseTTL, cfg.LeaseHeartbeat = store, 2*time.Second, 100*time.Millisecond
		cfg.TickInterval = 20 * time.Millisecond
	})
	ctx := ctxT(t)
	waitUntil(t, ctx, 15*time.Second, "stream created", func() bool {
		_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "h", RangeCount: 2})
		return err == nil
	})
	store.SetDown(true)
	d, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "h"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(d.GetEpochsUnavailable(), "lease store") {
		t.Fatalf("epochs_unavailable %q with the store down", d.GetEpochsUnavailable())
	}
	for _, ri := range d.GetRanges() {
		es := ri.GetEpochs()
		if len(es) != 1 || es[0].GetEpoch() != 1 || es[0].GetStartOffset() != 0 || es[0].GetHomeRegion() != "us" {
			t.Fatalf("range %d with the store down: epochs %v, want the current one", ri.GetRange(), es)
		}
	}
	// Once the store is back, the node reads it again (not at once: a
	// failed read is not retried for epochHistoryRetry).
	store.SetDown(false)
	waitUntil(t, ctx, 15*time.Second, "the full history", func() bool {
		d, err = c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "h"})
		return err == nil && d.GetEpochsUnavailable() == ""
	})
	for _, ri := range d.GetRanges() {
		es := ri.GetEpochs()
		if len(es) != 1 || es[0].GetKind() != geologv1.EpochKind_EPOCH_KIND_CREATE || es[0].GetHomeRegion() != "us" {
			t.Fatalf("range %d: epochs %v, want its creation", ri.GetRange(), es)
		}
	}
	// Cached: the store going down again changes nothing.
	store.SetDown(true)
	if d, err := c.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "h"}); err != nil || d.GetEpochsUnavailable() != "" {
		t.Fatalf("with the history cached and the store down: %v %v", d.GetEpochsUnavailable(), err)
	}
	store.SetDown(false)
}

// TestListOrphansScopes: a node without replication answers both scopes
// (it holds no orphan log), refuses an unknown scope, and a cluster-wide
// listing of a stream no node holds is STREAM_NOT_FOUND.
func TestListOrphansScopes(t *testing.T) {
	t.Parallel()
	n, c := testNode(t, t.TempDir(), nil)
	createStream(t, c, "s", 2)
	conn, err := grpcConn(n.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	admin := geologv1.NewAdminClient(conn)
	ctx := ctxT(t)
	resp, err := admin.ListOrphans(ctx, &geologv1.ListOrphansRequest{Stream: "s", Scope: geologv1.OrphanScope_ORPHAN_SCOPE_CLUSTER})
	if err != nil || resp.GetPartial() || len(resp.GetNodes()) != 1 || resp.GetNodes()[0].GetAddress() != n.AdvertiseAddr() || len(resp.GetForks()) != 0 {
		t.Fatalf("cluster scope on a single node: %v %v", resp, err)
	}
	_, err = admin.ListOrphans(ctx, &geologv1.ListOrphansRequest{Stream: "s", Scope: 99})
	wantCode(t, err, apierr.InvalidArgument)
	_, err = admin.ListOrphans(ctx, &geologv1.ListOrphansRequest{Stream: "nope", Scope: geologv1.OrphanScope_ORPHAN_SCOPE_CLUSTER})
	wantCode(t, err, apierr.StreamNotFound)
	_, err = admin.ListOrphans(ctx, &geologv1.ListOrphansRequest{Stream: "../x", Scope: geologv1.OrphanScope_ORPHAN_SCOPE_CLUSTER})
	wantCode(t, err, apierr.InvalidArgument)
}

// TestMergeOrphans: the cluster-wide answer lists each fork once per
// (region, range, fork index), in that order, whatever the nodes' order;
// a silent node makes it partial; a node that does not hold the stream
// has answered unless its region is one of the stream's.
func TestMergeOrphans(t *testing.T) {
	t.Parallel()
	fork := func(rng uint32, idx uint64) *geologv1.OrphanFork {
		return &geologv1.OrphanFork{Range: rng, ForkIndex: idx}
	}
	node := func(region string, id uint64, forks ...*geologv1.OrphanFork) orphanAnswer {
		return orphanAnswer{entry: &geologv1.NodeOrphans{Region: region, NodeId: id, Forks: forks}}
	}
	spec := streamSpec{Name: "s", RangeCount: 2, Regions: []string{"us", "eu"}}
	answers := []orphanAnswer{
		node("us", 2, fork(1, 9), fork(0, 7)),
		node("eu", 1, fork(0, 3)),
		node("us", 1, fork(0, 7), fork(1, 9)),
		{entry: &geologv1.NodeOrphans{Region: "eu", NodeId: 2, Error: "ERROR_CODE_UNAVAILABLE: down"}},
		{entry: &geologv1.NodeOrphans{Region: "ap", NodeId: 1}, notFound: true},
	}
	resp, err := mergeOrphans("s", answers, spec, true)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range resp.GetForks() {
		got = append(got, strings.TrimSpace(f.String()))
	}
	want := []string{"range:1 fork_index:3", "fork_index:7", "range:1 fork_index:9"} // eu first, then us by range
	if len(got) != len(want) || !resp.GetPartial() || len(resp.GetNodes()) != 5 {
		t.Fatalf("merged %v (partial %v, %d nodes), want %v", got, resp.GetPartial(), len(resp.GetNodes()), want)
	}
	if resp.GetForks()[0].GetForkIndex() != 3 || resp.GetForks()[1].GetForkIndex() != 7 || resp.GetForks()[2].GetForkIndex() != 9 {
		t.Fatalf("order %v, want eu's fork, then us's by range", got)
	}
	// A node of one of the stream's regions that does not hold it has not
	// answered the question.
	answers = []orphanAnswer{node("us", 1), {entry: &geologv1.NodeOrphans{Region: "eu", NodeId: 1}, notFound: true}}
	resp, err = mergeOrphans("s", answers, spec, true)
	if err != nil || !resp.GetPartial() || resp.GetNodes()[1].GetError() == "" {
		t.Fatalf("a stream's region without it: %v %v", resp, err)
	}
	// Nobody holds it.
	_, err = mergeOrphans("s", []orphanAnswer{{entry: &geologv1.NodeOrphans{Region: "ap"}, notFound: true}}, streamSpec{}, false)
	if rpcerr.CodeOf(err) != apierr.StreamNotFound {
		t.Fatalf("no holder: %v", err)
	}
}

// lyingDirectory answers Identify with whatever the test sets.
type lyingDirectory struct {
	geologinternalv1.UnimplementedNodeDirectoryServer
	resp *geologinternalv1.IdentifyResponse
}

func (d *lyingDirectory) Identify(context.Context, *geologinternalv1.IdentifyRequest) (*geologinternalv1.IdentifyResponse, error) {
	return d.resp, nil
}

// TestIdentifyTrustsOnlyWhatMatches: what a node learns of another's
// advertised address comes from the network, so it is taken only from the
// node configured at that address (same region, same Raft id for a peer)
// and only if it is a plausible host:port.
func TestIdentifyTrustsOnlyWhatMatches(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dir := &lyingDirectory{}
	srv := grpc.NewServer()
	geologinternalv1.RegisterNodeDirectoryServer(srv, dir)
	go srv.Serve(lis)
	defer srv.Stop()
	// eu's node is asked over the node's shared connection (peerConn),
	// which is for addresses the configuration names.
	n := &Node{cfg: Config{Region: "us", NodeID: 1, Regions: map[string][]string{"eu": {lis.Addr().String()}}}}
	defer func() {
		for _, c := range n.peerConns {
			c.Close()
		}
	}()
	peer := identifyTarget{addr: lis.Addr().String(), region: "us", id: 2}
	remote := identifyTarget{addr: lis.Addr().String(), region: "eu"}
	for _, c := range []struct {
		tg   identifyTarget
		resp *geologinternalv1.IdentifyResponse
		ok   bool
	}{
		{peer, &geologinternalv1.IdentifyResponse{Region: "us", NodeId: 2, AdvertiseAddr: "us-2.example:7400"}, true},
		{remote, &geologinternalv1.IdentifyResponse{Region: "eu", NodeId: 3, AdvertiseAddr: "[::1]:7400"}, true},
		{peer, &geologinternalv1.IdentifyResponse{Region: "us", NodeId: 3, AdvertiseAddr: "us-3.example:7400"}, false},
		{peer, &geologinternalv1.IdentifyResponse{Region: "eu", NodeId: 2, AdvertiseAddr: "eu-2.example:7400"}, false},
		{remote, &geologinternalv1.IdentifyResponse{Region: "eu", AdvertiseAddr: "eu.example:7400"}, false},
		{remote, &geologinternalv1.IdentifyResponse{Region: "eu", NodeId: 1, AdvertiseAddr: "no-port"}, false},
		{remote, &geologinternalv1.IdentifyResponse{Region: "eu", NodeId: 1, AdvertiseAddr: ":7400"}, false},
		{remote, &geologinternalv1.IdentifyResponse{Region: "eu", NodeId: 1, AdvertiseAddr: strings.Repeat("a", 300) + ":1"}, false},
		{remote, &geologinternalv1.IdentifyResponse{Region: "eu", NodeId: 1}, false},
	} {
		dir.resp = c.resp
		ni, err := n.identify(context.Background(), c.tg)
		if (err == nil) != c.ok {
			t.Fatalf("%v from a node configured as %+v: %+v %v, want ok=%v", c.resp, c.tg, ni, err, c.ok)
		}
		if c.ok && (ni.advertise != c.resp.GetAdvertiseAddr() || ni.id != c.resp.GetNodeId()) {
			t.Fatalf("learned %+v from %v", ni, c.resp)
		}
	}
	// A node's own advertised address is checked when it starts.
	if _, err := New(Config{DataDir: t.TempDir(), AdvertiseAddr: "nohost"}); err == nil {
		t.Fatal("an advertised address without a port was accepted")
	}
}

// TestForkPoint: the offset from which a producer's acknowledgements were
// lost is the lowest start of the first epoch after its newest batch and
// of every later one (a takeover may continue below an earlier start).
func TestForkPoint(t *testing.T) {
	t.Parallel()
	h := func(starts ...uint64) []*geologv1.EpochStart {
		var out []*geologv1.EpochStart
		for i, s := range starts {
			out = append(out, &geologv1.EpochStart{Epoch: uint64(i + 1), StartOffset: s})
		}
		return out
	}
	for _, c := range []struct {
		hist      []*geologv1.EpochStart
		forkEpoch uint64
		want      uint64
		found     bool
	}{
		{h(0, 25), 2, 25, true},
		{h(0, 25, 45), 2, 25, true},
		{h(0, 25, 45), 3, 45, true},
		// Epoch 2's home appended 100..119 and failed; epoch 3 took over
		// at 90: a producer last seen under epoch 1 lost everything from 90.
		{h(0, 100, 90), 2, 90, true},
		{h(0, 100, 90, 95), 2, 90, true},
		{h(0, 100, 90, 95), 4, 95, true},
		{h(0, 25), 3, 0, false},
		{h(0, 25), 1, 0, true},
	} {
		got, found := forkPoint(c.forkEpoch, c.hist)
		if got != c.want || found != c.found {
			t.Errorf("forkPoint(%d, %v) = %d, %v; want %d, %v", c.forkEpoch, c.hist, got, found, c.want, c.found)
		}
	}
}
