package replicator

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/klauspost/compress/zstd"
)

// BenchmarkReplicate ships a log of 1 KiB chat records (JSON, 16 records a
// frame, 32 MiB) through a Task and a Server over loopback gRPC into an
// in-memory mirror, and reports records/s, MB/s of frames, and the wire
// ratio (frame bytes / bytes sent). Each iteration ships the whole log to a
// fresh mirror range.
//
//	go test -run '^$' -bench BenchmarkReplicate -benchtime 5x ./replicator
func BenchmarkReplicate(b *testing.B) {
	const recordBytes, perFrame, logBytes = 1024, 16, 32 << 20
	g := newLogGen(40, recordBytes)
	src := NewMemSource(0)
	var frameBytes int
	for frameBytes < logBytes {
		f := g.frame(perFrame)
		if err := src.AppendCommitted(f); err != nil {
			b.Fatal(err)
		}
		frameBytes += len(f)
	}
	records := src.CommittedEnd()
	for _, tc := range []struct {
		name  string
		comp  Compression
		level zstd.EncoderLevel
	}{
		{"none", CompressionNone, 0},
		{"zstd-fastest", CompressionZstd, zstd.SpeedFastest},
		{"zstd-default", CompressionZstd, zstd.SpeedDefault},
	} {
		b.Run(tc.name, func(b *testing.B) {
			store := NewMemMirrorStore()
			node := startMirror(b, store, func(c *ServerConfig) { c.Logger = hclog.NewNullLogger() })
			dialer := newDialer(b)
			var wire, sent uint64
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				cfg := taskConfig(b, src, dialer, node.addr)
				cfg.Stream = fmt.Sprintf("bench-%d", i)
				cfg.Compression, cfg.ZstdLevel = tc.comp, tc.level
				cfg.Logger = hclog.NewNullLogger()
				cfg.HeartbeatInterval = time.Second
				task, err := NewTask(cfg)
				if err != nil {
					b.Fatal(err)
				}
				m := store.Range(cfg.Stream, testRange)
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- task.Run(ctx) }()
				for m.AppliedEnd() < records {
					time.Sleep(200 * time.Microsecond)
				}
				cancel()
				<-done
				st := task.Stats()
				wire += st.WireBytes
				sent += st.FrameBytes
			}
			elapsed := time.Since(start).Seconds()
			b.StopTimer()
			b.ReportMetric(float64(records)*float64(b.N)/elapsed, "records/s")
			b.ReportMetric(float64(frameBytes)*float64(b.N)/elapsed/1e6, "MB/s")
			b.ReportMetric(float64(sent)/float64(wire), "ratio")
			b.ReportMetric(0, "ns/op")
		})
	}
}
