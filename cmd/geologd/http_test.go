package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/internal/nodeproc"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// get returns the status and body of an HTTP GET, or 0 when it fails.
func get(url string) (int, string) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, string(b)
}

// waitStatus polls url until it answers code, failing after d with the
// last answer.
func waitStatus(t *testing.T, url string, code int, d time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got, body := get(url)
		if got == code {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d %q, want %d", url, got, body, code)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestReadyzOnARegion runs three geologd processes with --http-addr:
// /healthz answers 200 from the start; /readyz turns 200 once the region
// elected its catalogue's leader, and again once a new stream's ranges
// have leaders; gRPC health says SERVING; with two nodes killed the last
// one's ranges lose their leaders and its /readyz answers 503 with the
// reasons.
func TestReadyzOnARegion(t *testing.T) {
	const size = 3
	addrs, httpAddrs := make([]string, size), make([]string, size)
	var peers []string
	for i := range addrs {
		addrs[i], httpAddrs[i] = nodeproc.FreeAddr(t), nodeproc.FreeAddr(t)
		peers = append(peers, fmt.Sprintf("%d=%s", i+1, addrs[i]))
	}
	procs := make([]*nodeproc.Proc, size)
	for i := range procs {
		procs[i] = nodeproc.Start(t, t.TempDir(), addrs[i], "--node-id", fmt.Sprint(i+1), "--peers", strings.Join(peers, ","),
			"--http-addr", httpAddrs[i], "--tick", "50ms")
	}
	for _, h := range httpAddrs {
		if body := waitStatus(t, "http://"+h+"/healthz", 200, 30*time.Second); body != "ok\n" {
			t.Fatalf("/healthz: %q", body)
		}
	}
	for _, h := range httpAddrs {
		waitStatus(t, "http://"+h+"/readyz", 200, 60*time.Second)
	}
	conn, err := grpc.NewClient(addrs[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		_, err := geologv1.NewLogClient(conn).CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "ready", RangeCount: 4})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("create: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, h := range httpAddrs {
		if body := waitStatus(t, "http://"+h+"/readyz", 200, 60*time.Second); body != "ready\n" {
			t.Fatalf("/readyz: %q", body)
		}
	}
	if r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("grpc health: %v %v", r, err)
	}
	procs[1].Kill()
	procs[2].Kill()
	body := waitStatus(t, "http://"+httpAddrs[0]+"/readyz", 503, 60*time.Second)
	if !strings.HasPrefix(body, "not ready:\n") || !strings.Contains(body, "leader") {
		t.Fatalf("/readyz of the last node: %q", body)
	}
	if code, _ := get("http://" + httpAddrs[0] + "/healthz"); code != 200 {
		t.Fatalf("/healthz of the last node: %d", code)
	}
}
