package main

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/internal/nodeproc"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// fakeCollector is an OTLP/gRPC trace receiver that keeps what it gets.
type fakeCollector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu   sync.Mutex
	reqs []*coltracepb.ExportTraceServiceRequest
}

func (c *fakeCollector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reqs = append(c.reqs, req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// spans returns the names of the spans received and the resource
// attributes they came with.
func (c *fakeCollector) spans() (names map[string]bool, resource map[string]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	names, resource = map[string]bool{}, map[string]string{}
	for _, req := range c.reqs {
		for _, rs := range req.GetResourceSpans() {
			for _, kv := range rs.GetResource().GetAttributes() {
				resource[kv.GetKey()] = kv.GetValue().GetStringValue()
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					names[s.GetName()] = true
				}
			}
		}
	}
	return names, resource
}

// TestOTLPExport: geologd with --otlp-endpoint exports the spans of an
// append over OTLP/gRPC, with its resource (service.name geologd, its
// region and node id), at the latest when it stops (SIGTERM flushes).
func TestOTLPExport(t *testing.T) {
	col := &fakeCollector{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, col)
	go srv.Serve(lis)
	defer srv.Stop()

	addr := nodeproc.FreeAddr(t)
	p := nodeproc.Start(t, t.TempDir(), addr, "--region", "eu", "--otlp-endpoint", "http://"+lis.Addr().String())
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := geologv1.NewLogClient(conn)
	for {
		_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "t", RangeCount: 1})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("create: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "t", Records: []*geologv1.Record{{Value: []byte("v")}}}); err != nil {
		t.Fatal(err)
	}
	p.Stop()
	names, res := col.spans()
	for _, want := range []string{"geolog.v1.Log/Append", "geolog.append", "geolog.raft.commit", "geolog.append.ack"} {
		if !names[want] {
			t.Errorf("no %s span received (got %v)", want, names)
		}
	}
	if res["service.name"] != "geologd" || res["geolog.region"] != "eu" || res["geolog.node_id"] != "0" || res["service.version"] == "" {
		t.Errorf("resource %v", res)
	}
}
