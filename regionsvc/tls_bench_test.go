package regionsvc_test

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/geolog/geolog/internal/nodeproc"
	"github.com/geolog/geolog/pki"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/regionsvc"
	"github.com/geolog/geolog/segment"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// BenchmarkAppendTLS appends 1 KiB records, one per unary call, from
// parallel callers to a node of one in this process (fsync off, so that
// the transport's share of the cost shows), in plaintext and with mutual
// TLS and the identity checks. cpu-µs/op is the CPU the process (client
// and node) spends per append: the difference is what TLS adds per
// request, an upper bound of its share in a node that also fsyncs:
//
//	go test -run '^$' -bench AppendTLS -benchtime 5s ./regionsvc/
func BenchmarkAppendTLS(b *testing.B) {
	for _, secure := range []bool{false, true} {
		name := "plaintext"
		if secure {
			name = "tls"
		}
		b.Run(name, func(b *testing.B) { benchAppend(b, secure) })
	}
}

func benchAppend(b *testing.B, secure bool) {
	// 32 callers: above the default bound of requests being received (8).
	cfg := regionsvc.Config{DataDir: b.TempDir(), ListenAddr: "127.0.0.1:0", Fsync: segment.FsyncNever,
		Limits: regionsvc.LimitsConfig{RequestsReceivingMax: 256}}
	creds := insecure.NewCredentials()
	if secure {
		p := nodeproc.NewPKI(b)
		dir := p.NodeDir("local", 1)
		files, err := pki.OpenFiles(pki.FilesConfig{CAFile: filepath.Join(dir, pki.CACertFile),
			CertFile: filepath.Join(dir, pki.NodeCertFile), KeyFile: filepath.Join(dir, pki.NodeKeyFile)})
		if err != nil {
			b.Fatal(err)
		}
		cfg.TLS = files.ServerTLS()
		creds = credentials.NewTLS(nodeproc.ClientTLS(b, p.ClientDir("bench")))
	}
	n, err := regionsvc.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := n.Start(); err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	conn, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(creds))
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
	// Wall time on a shared machine says little; the process's CPU time
	// (client and node, both ends of TLS) per append says what it costs.
	cpu0 := cpuTime(b)
	b.ResetTimer()
	defer func() { b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N)/1e3, "cpu-µs/op") }()
	var rng atomic.Uint32
	b.SetParallelism(16) // appends wait for the range's commit round
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

// cpuTime is the CPU time this process has used (user and system), in ns.
func cpuTime(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
