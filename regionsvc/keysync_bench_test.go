package regionsvc

import (
	"context"
	"flag"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/internal/keysync"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/segment"
)

var (
	keysyncRecords = flag.Uint64("keysync.records", 200_000,
		"records in the range of BenchmarkKeySyncRPC* (make bench-keysync: 10 million); 2^a*5^b")
	keysyncDir = flag.String("keysync.dir", "",
		"data directory of the node of BenchmarkKeySyncRPC*, kept and reused by later runs (default: a temporary directory)")
)

const keysyncStream = "chat"

// keysyncNode starts a single node whose stream "chat" has one range of
// -keysync.records records in conversations of 100 (internal/keysync),
// building it the first time: the stream through the API, its records
// straight into the range's segment store (FsyncNever), as the node would
// have written them, before the node opens it. It returns a Log client.
func keysyncNode(b *testing.B) geologv1.LogClient {
	b.Helper()
	w := keysync.Workload{Records: *keysyncRecords, Conversations: *keysyncRecords / 100, ValueBytes: 100, BatchRecords: 100}
	if err := w.Check(); err != nil {
		b.Fatal(err)
	}
	dir := *keysyncDir
	if dir == "" {
		dir = b.TempDir()
	}
	n, c := keysyncStart(b, dir)
	_, err := c.CreateStream(context.Background(), &geologv1.CreateStreamRequest{Name: keysyncStream, RangeCount: 1})
	if err != nil && rpcerr.CodeOf(err) != apierr.StreamExists {
		b.Fatal(err)
	}
	resp, err := c.Read(context.Background(), &geologv1.ReadRequest{Stream: keysyncStream, MaxRecords: 1})
	if err != nil {
		b.Fatal(err)
	}
	if resp.TailOffset == w.Records {
		return c
	}
	if resp.TailOffset != 0 {
		b.Fatalf("range holds %d records, not 0 or %d: remove %s", resp.TailOffset, w.Records, dir)
	}
	rangeDir := n.rangeDir(keysyncStream, 0)
	n.Close()
	if err := buildKeysyncRange(b, rangeDir, w); err != nil {
		b.Fatal(err)
	}
	began := time.Now()
	_, c = keysyncStart(b, dir)
	b.Logf("node opened the range in %v", time.Since(began).Round(time.Millisecond))
	return c
}

// keysyncStart starts a node on dir and returns it with a client.
func keysyncStart(b *testing.B, dir string) (*Node, geologv1.LogClient) {
	b.Helper()
	n, err := New(Config{DataDir: dir, ListenAddr: "127.0.0.1:0",
		Logger: hclog.New(&hclog.LoggerOptions{Output: os.Stderr, Level: hclog.Warn})})
	if err != nil {
		b.Fatal(err)
	}
	if err := n.Start(); err != nil {
		b.Fatal(err)
	}
	conn, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close(); n.Close() })
	return n, geologv1.NewLogClient(conn)
}

// buildKeysyncRange appends the workload to the segment store in dir as a
// single node's range holds it: data frames of epoch 1.
func buildKeysyncRange(b *testing.B, dir string, w keysync.Workload) error {
	s, err := segment.Open(segment.Config{Dir: dir, Fsync: segment.FsyncNever})
	if err != nil {
		return err
	}
	began := time.Now().UnixNano()
	for base := uint64(0); base < w.Records; base += uint64(w.BatchRecords) {
		frame := batch.Encode(nil, batch.Header{BaseOffset: base, Epoch: 1, AppendTimeUnixNanos: began + int64(base)},
			w.Batch(base, int(min(uint64(w.BatchRecords), w.Records-base))))
		if err := s.Append(frame); err != nil {
			s.Close()
			return err
		}
	}
	b.Logf("built %d records (%d bytes) in %v", w.Records, s.Size(), time.Duration(time.Now().UnixNano()-began).Round(time.Millisecond))
	return s.Close()
}

// BenchmarkKeySyncRPC is one conversation's sync after being offline
// through a node's Read RPC filtered by key: all its records (100) from
// offset 0 of a range of -keysync.records records, over loopback gRPC. It
// reports the p50 and p99 latency; see make bench-keysync.
func BenchmarkKeySyncRPC(b *testing.B) {
	c := keysyncNode(b)
	ctx := context.Background()
	conversations := *keysyncRecords / 100
	rng := rand.New(rand.NewPCG(5, 6))
	var lat []time.Duration
	cpu := keysync.CPUTime()
	for b.Loop() {
		key := keysync.Key(rng.Uint64N(conversations))
		began := time.Now()
		resp, err := c.Read(ctx, &geologv1.ReadRequest{Stream: keysyncStream, Key: key, MaxRecords: 1000})
		lat = append(lat, time.Since(began))
		if err != nil || len(resp.Records) != 100 || resp.NextOffset != resp.TailOffset {
			b.Fatalf("read of %s: %d records, %v", key, len(resp.GetRecords()), err)
		}
	}
	cpu = (keysync.CPUTime() - cpu) / time.Duration(max(1, len(lat)))
	p := keysync.Percentiles(lat, 50, 99)
	b.ReportMetric(float64(p[0].Microseconds()), "p50-µs")
	b.ReportMetric(float64(p[1].Microseconds()), "p99-µs")
	b.ReportMetric(float64(cpu.Microseconds()), "cpu-µs/op")
	b.Logf("%d Read RPCs by key (100 records each) on a range of %d records: p50 %v, p99 %v; CPU %v per read (node and client)",
		len(lat), *keysyncRecords, p[0], p[1], cpu.Round(time.Microsecond))
}

// BenchmarkKeySyncRPCScan is the same sync without the key: a client that
// reads the whole range through the Read RPC (pages of 100,000 records)
// and keeps the conversation's records.
func BenchmarkKeySyncRPCScan(b *testing.B) {
	c := keysyncNode(b)
	ctx := context.Background()
	conversations := *keysyncRecords / 100
	rng := rand.New(rand.NewPCG(7, 8))
	var lat []time.Duration
	for b.Loop() {
		key := string(keysync.Key(rng.Uint64N(conversations)))
		began := time.Now()
		found := 0
		for from := uint64(0); ; {
			resp, err := c.Read(ctx, &geologv1.ReadRequest{Stream: keysyncStream, FromOffset: from, MaxRecords: 100_000, MaxBytes: 32 << 20})
			if err != nil {
				b.Fatal(err)
			}
			for _, r := range resp.Records {
				if string(r.Key) == key {
					found++
				}
			}
			if from = resp.NextOffset; from == resp.TailOffset {
				break
			}
		}
		lat = append(lat, time.Since(began))
		if found != 100 {
			b.Fatalf("scan found %d records of %s", found, key)
		}
	}
	p := keysync.Percentiles(lat, 50, 100)
	b.ReportMetric(float64(p[0].Milliseconds()), "p50-ms")
	b.Logf("%d full scans through the Read RPC on a range of %d records: p50 %v, max %v", len(lat), *keysyncRecords, p[0], p[1])
}
