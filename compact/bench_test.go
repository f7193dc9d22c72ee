package compact

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/segment"
)

var (
	benchRecords = flag.Int("compact.records", 500_000, "BenchmarkCompactChangelog: records in the changelog")
	benchKeys    = flag.Int("compact.keys", 50_000, "BenchmarkCompactChangelog: distinct keys")
	benchValue   = flag.Int("compact.value", 100, "BenchmarkCompactChangelog: value bytes")
)

// BenchmarkCompactChangelog builds a changelog on disk (the real file
// system, fsync on): -compact.records updates of -compact.value bytes over
// -compact.keys keys, a tenth of them tombstones, in batches of 100 and
// 64 MiB segments; then times one compaction of all of it (unthrottled,
// as the cleaner runs with a negative rate) and reports the read rate over
// the log (MB/s: log bytes before / duration) and the space saved.
//
//	go test -run XXX -bench CompactChangelog -benchtime 1x ./compact/
func BenchmarkCompactChangelog(b *testing.B) {
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		s, point := buildChangelog(b, uint64(i))
		before := s.Size()
		d := batch.Compaction{Point: point, TombstoneCutoffUnixNanos: math.MaxInt64, ProducerCutoffUnixNanos: math.MaxInt64}
		c := NewCleaner(CleanerConfig{BytesPerSecond: -1, MemoryBytesMax: 1 << 30})
		b.StartTimer()
		began := time.Now()
		res := c.RunJob(context.Background(), Job{Log: s, Decision: d, Limit: math.MaxUint64})
		took := time.Since(began)
		b.StopTimer()
		if res.Err != nil || !res.Complete {
			b.Fatalf("%+v", res)
		}
		after := s.Size()
		b.ReportMetric(float64(before)/took.Seconds()/1e6, "MB/s")
		b.ReportMetric(100*float64(before-after)/float64(before), "saved_%")
		b.ReportMetric(float64(before)/1e6, "MB_before")
		b.ReportMetric(float64(after)/1e6, "MB_after")
		b.Logf("%d records over %d keys: %.1f MB -> %.1f MB in %v (%d keys kept, %d MB read and written)",
			*benchRecords, *benchKeys, float64(before)/1e6, float64(after)/1e6, took, res.Keys, res.BytesIO/1e6)
		s.Close()
	}
}

// buildChangelog writes the benchmark's changelog and returns the store
// and the offset past it (a frame boundary: the decision's point).
func buildChangelog(b *testing.B, seed uint64) (*segment.Store, uint64) {
	s, err := segment.Open(segment.Config{Dir: b.TempDir(), Logger: hclog.NewNullLogger()})
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 9))
	value := make([]byte, *benchValue)
	for i := range value {
		value[i] = byte('a' + rng.IntN(26))
	}
	recs := make([]batch.Record, 100)
	var frame []byte
	tm := int64(1)
	for written := 0; written < *benchRecords; written += len(recs) {
		for j := range recs {
			recs[j] = batch.Record{Key: fmt.Appendf(nil, "user-%08d", rng.IntN(*benchKeys)), Value: value}
			if rng.IntN(10) == 0 {
				recs[j].Value, recs[j].Tombstone = nil, true
			}
		}
		tm++
		frame = batch.Encode(frame[:0], batch.Header{BaseOffset: s.NextOffset(), Epoch: 1, AppendTimeUnixNanos: tm}, recs)
		if err := s.Append(frame); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Sync(); err != nil {
		b.Fatal(err)
	}
	point := s.NextOffset()
	if err := s.SealBefore(point); err != nil {
		b.Fatal(err)
	}
	return s, point
}
