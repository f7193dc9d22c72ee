package regionsvc

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/authz"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// waitReady polls n.Ready until want, failing with the last reasons.
func waitReady(t *testing.T, n *Node, want bool) []string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, reasons := n.Ready()
		if ok == want {
			return reasons
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ready stayed %v: %v", ok, reasons)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestReadyNamesAnUnservedRange: a node is ready once it serves; a range
// whose log is corrupt makes it unready, and the reason names the range;
// the gRPC health service says the same; a closed node is not ready.
func TestReadyNamesAnUnservedRange(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	n, c := testNode(t, dir, nil)
	if reasons := waitReady(t, n, true); len(reasons) != 0 {
		t.Fatalf("ready with reasons %v", reasons)
	}
	createStream(t, c, "s", 2)
	for i := 0; i < 3; i++ { // a corrupt first batch with valid ones after it is no torn tail
		if _, err := c.Append(ctxT(t), &geologv1.AppendRequest{Stream: "s", Range: 1, Records: recs("v", 10)}); err != nil {
			t.Fatal(err)
		}
	}
	n.Close()
	if ok, reasons := n.Ready(); ok || len(reasons) != 1 || !strings.Contains(reasons[0], "shutting down") {
		t.Fatalf("a closed node: ready %v, reasons %v", ok, reasons)
	}
	logPath := filepath.Join(dir, "streams", "s", "00001", "00000000000000000000.log")
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	b[150] ^= 0x40
	if err := os.WriteFile(logPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	n, _ = testNode(t, dir, nil)
	// The restarted region of one elects its ranges as their drivers
	// start: until then "no leader yet" reasons stand beside the corrupt
	// range's, which stays.
	var ok bool
	var reasons []string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ok, reasons = n.Ready()
		if ok || len(reasons) == 1 || time.Now().After(deadline) {
			break
		}
	}
	if ok || len(reasons) != 1 || !strings.HasPrefix(reasons[0], "stream s range 1: not served") {
		t.Fatalf("a corrupt range: ready %v, reasons %v", ok, reasons)
	}
	conn, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	h := healthpb.NewHealthClient(conn)
	for _, svc := range []string{"", "geolog.v1.Log"} {
		r, err := h.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("health %q: %v %v", svc, r, err)
		}
	}
	if _, err := h.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: "nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown service: %v", err)
	}
}

// TestReadyOnceTheRegionElected: each node of a 3-node region turns ready
// once the catalogue and every range of a new stream have leaders, and the
// gRPC health service (Check and Watch) says SERVING; the reasons are
// bounded however many ranges wait.
func TestReadyOnceTheRegionElected(t *testing.T) {
	t.Parallel()
	tr := newTestRegion(t, 3)
	ctx := ctxT(t)
	tr.retry(ctx, "create", func(ctx context.Context, c geologv1.LogClient) error {
		_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "r", RangeCount: 3})
		return err
	})
	for id, n := range tr.nodes {
		// The stream must have reached the node before its ranges count.
		deadline := time.Now().Add(30 * time.Second)
		for {
			if _, ok := n.streamSpec("r"); ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d never applied the stream", id)
			}
			time.Sleep(20 * time.Millisecond)
		}
		waitReady(t, n, true)
	}
	conn, err := grpc.NewClient(tr.peers[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch: %v %v", r, err)
	}

	var r reasons
	for i := 0; i < 3*readyReasonsMax; i++ {
		r.add("x")
	}
	if l := r.list(); len(l) != readyReasonsMax+1 || l[readyReasonsMax] != "and 40 more" {
		t.Fatalf("bounded reasons: %d lines, last %q", len(l), l[len(l)-1])
	}
}

// TestHealthNeedsNoRights: behind a node's auth interceptors, with TLS
// and authorization on, a caller without a verified identity is refused
// the Log service (UNAUTHENTICATED) but answered by the health service.
func TestHealthNeedsNoRights(t *testing.T) {
	t.Parallel()
	n := authzNode(&authz.Policy{})
	n.closing = make(chan struct{})
	srv := grpc.NewServer(n.interceptors()...)
	healthpb.RegisterHealthServer(srv, &healthServer{node: n})
	geologv1.RegisterLogServer(srv, &logServer{node: n})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r, err := healthpb.NewHealthClient(conn).Check(ctxT(t), &healthpb.HealthCheckRequest{})
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health of a node not started: %v %v", r, err)
	}
	if _, err := geologv1.NewLogClient(conn).ListStreams(ctxT(t), &geologv1.ListStreamsRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("ListStreams without an identity: %v, want UNAUTHENTICATED", err)
	}
}
