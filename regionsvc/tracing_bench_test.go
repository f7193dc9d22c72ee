package regionsvc_test

import (
	"context"
	"sync/atomic"
	"testing"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/regionsvc"
	"github.com/geolog/geolog/segment"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// BenchmarkAppendTracing appends 1 KiB records, one per unary call, from
// parallel callers to a node of one in this process (fsync off), with
// tracing off (no TracerProvider: what geologd runs without an OTLP
// endpoint), on but sampling nothing, and on recording every span (to an
// in-memory exporter, reset as it goes). cpu-µs/op is the process's CPU
// per append:
//
//	go test -run '^$' -bench AppendTracing -benchtime 5s ./regionsvc/
func BenchmarkAppendTracing(b *testing.B) {
	for _, tc := range []struct {
		name string
		tp   func() trace.TracerProvider
	}{
		{"off", func() trace.TracerProvider { return nil }},
		{"unsampled", func() trace.TracerProvider {
			return sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
		}},
		{"sampled", func() trace.TracerProvider {
			return sdktrace.NewTracerProvider(sdktrace.WithSyncer(resettingExporter{tracetest.NewInMemoryExporter()}))
		}},
	} {
		b.Run(tc.name, func(b *testing.B) { benchAppendTraced(b, tc.tp()) })
	}
}

// resettingExporter keeps no span: the benchmark measures recording.
type resettingExporter struct{ *tracetest.InMemoryExporter }

func (e resettingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.Reset()
	return nil
}

func benchAppendTraced(b *testing.B, tp trace.TracerProvider) {
	n, err := regionsvc.New(regionsvc.Config{DataDir: b.TempDir(), ListenAddr: "127.0.0.1:0", Fsync: segment.FsyncNever, TracerProvider: tp,
		// Room for every caller (the default on 2 cores is 8 at once).
		Limits: regionsvc.LimitsConfig{RequestsReceivingMax: 256}})
	if err != nil {
		b.Fatal(err)
	}
	if err := n.Start(); err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	conn, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	lc := geologv1.NewLogClient(conn)
	ctx := context.Background()
	if _, err := lc.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "b", RangeCount: 8}); err != nil {
		b.Fatal(err)
	}
	value := make([]byte, 1024)
	b.SetBytes(int64(len(value)))
	cpu0 := cpuTime(b)
	b.ResetTimer()
	defer func() { b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N)/1e3, "cpu-µs/op") }()
	var rng atomic.Uint32
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		r := rng.Add(1) % 8
		req := &geologv1.AppendRequest{Stream: "b", Range: r, Records: []*geologv1.Record{{Value: value}}}
		for pb.Next() {
			if _, err := lc.Append(ctx, req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
