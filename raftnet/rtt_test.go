package raftnet

import (
	"context"
	"crypto/tls"
	"net"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// BenchmarkLoopbackUnary is the reference for an append's client round
// trip (notes/commitpath2.md): a bare gRPC unary call (the health check)
// over loopback, one at a time, with TLS 1.3 (mutual, as the nodes run)
// and without; it reports the round trip's p50 and p99.
//
//	go test -run '^$' -bench BenchmarkLoopbackUnary -benchtime 5000x ./raftnet/
func BenchmarkLoopbackUnary(b *testing.B) {
	for _, secure := range []bool{true, false} {
		name := "insecure"
		if secure {
			name = "tls"
		}
		b.Run(name, func(b *testing.B) { benchUnary(b, secure) })
	}
}

func benchUnary(b *testing.B, secure bool) {
	serverCreds, clientCreds := insecure.NewCredentials(), insecure.NewCredentials()
	if secure {
		t := &testing.T{}
		ca := newTestCA(t)
		cert := ca.nodeCert(t, "node", 2)
		serverCreds = credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: ca.pool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13})
		clientCreds = credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: ca.pool, MinVersion: tls.VersionTLS13})
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(serverCreds))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(clientCreds))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	ctx := context.Background()
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		b.Fatal(err)
	}
	took := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-us")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-us")
}
