package client_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/client/clienttest"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// BenchmarkOneAtATime splits the SDK's one-at-a-time append round trip
// (notes/sdkqueue.md) against the in-memory fake, which appends at once:
// "sdk" is ProduceSync of one 1 KiB record, "stream" the same append as a
// bare Send and Recv on an AppendStream, "unary" as a bare Append call.
// sdk less stream is what the producer's goroutines add (Produce to the
// range driver, the reply from the receive goroutine back to it, and the
// callback). It reports each round trip's p50 and p99.
//
//	go test -run '^$' -bench BenchmarkOneAtATime -benchtime 5000x ./client/
func BenchmarkOneAtATime(b *testing.B) {
	fake := startFake(b, clienttest.Config{})
	fake.MustCreateStream("s", 1)
	value := make([]byte, 1024)
	b.Run("sdk", func(b *testing.B) {
		c := newClient(b, fake.Addr())
		p := newProducer(b, c, "s", client.InflightBatchesMax(1))
		ctx := context.Background()
		rec := func() *client.Record { return &client.Record{Value: value} }
		if _, err := p.ProduceSync(ctx, rec()); err != nil {
			b.Fatal(err)
		}
		timeRoundTrips(b, func() error { _, err := p.ProduceSync(ctx, rec()); return err })
	})
	conn, err := grpc.NewClient(fake.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	api := geologv1.NewLogClient(conn)
	req := func() *geologv1.AppendRequest {
		return &geologv1.AppendRequest{Stream: "s", Records: []*geologv1.Record{{Value: value}}}
	}
	b.Run("stream", func(b *testing.B) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		stream, err := api.AppendStream(ctx)
		if err != nil {
			b.Fatal(err)
		}
		var id uint64
		timeRoundTrips(b, func() error {
			id++
			r := req()
			r.RequestId = id
			if err := stream.Send(r); err != nil {
				return err
			}
			_, err := stream.Recv()
			return err
		})
	})
	b.Run("unary", func(b *testing.B) {
		ctx := context.Background()
		timeRoundTrips(b, func() error { _, err := api.Append(ctx, req()); return err })
	})
}

// timeRoundTrips runs call b.N times and reports its p50 and p99.
func timeRoundTrips(b *testing.B, call func() error) {
	took := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if err := call(); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-us")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-us")
}
