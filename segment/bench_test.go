package segment

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/vfs"
)

// benchFrame encodes a batch of n records with 1 KiB values at base 0.
func benchFrame(n int) []byte {
	recs := make([]batch.Record, n)
	for i := range recs {
		recs[i] = batch.Record{Key: fmt.Appendf(nil, "key-%08d", i), Value: bytes.Repeat([]byte{byte(i)}, 1024)}
	}
	return batch.Encode(nil, batch.Header{Epoch: 1}, recs)
}

// BenchmarkAppendSync measures durable appends (FsyncAlways) of 1 KiB
// records: each op appends one batch through a mutex-serialised appender and
// then calls Sync, from 1 or 8 goroutines, so concurrent Syncs share
// fdatasyncs. MB/s counts record values.
func BenchmarkAppendSync(b *testing.B) {
	for _, records := range []int{1, 64} {
		for _, goroutines := range []int{1, 8} {
			b.Run(fmt.Sprintf("records=%d/goroutines=%d", records, goroutines), func(b *testing.B) {
				var fsyncs atomic.Int64
				cfg := Config{Dir: b.TempDir(), testHooks: testHooks{fdatasync: func(f vfs.File) error {
					fsyncs.Add(1)
					return f.Datasync()
				}}}
				s, err := Open(cfg)
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				template := benchFrame(records)
				var appendMu sync.Mutex
				var ops atomic.Int64
				var wg sync.WaitGroup
				b.SetBytes(int64(records) * 1024)
				b.ReportAllocs()
				fsyncs.Store(0)
				b.ResetTimer()
				for range goroutines {
					wg.Add(1)
					go func() {
						defer wg.Done()
						frame := bytes.Clone(template)
						for ops.Add(1) <= int64(b.N) {
							appendMu.Lock()
							batch.Patch(frame, s.NextOffset(), 1, time.Now().UnixNano())
							err := s.Append(frame)
							appendMu.Unlock()
							if err == nil {
								err = s.Sync()
							}
							if err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				b.StopTimer()
				b.ReportMetric(float64(b.N*records)/b.Elapsed().Seconds(), "records/s")
				b.ReportMetric(float64(fsyncs.Load())/float64(b.N), "fsyncs/op")
			})
		}
	}
}

// BenchmarkAppendCPU measures the CPU an append costs, without fsync and
// on the in-memory file system: Append (which checks the frame's CRC and
// records) against AppendChecked (which trusts a caller that just did, as a
// replica does after entryFrame), for one batch of 64 records of 1 KiB.
func BenchmarkAppendCPU(b *testing.B) {
	for _, mode := range []string{"Append", "AppendChecked"} {
		b.Run(mode, func(b *testing.B) {
			s, err := Open(Config{Dir: "/range", FS: vfs.NewMem(rand.New(rand.NewPCG(1, 2))), SegmentBytesMax: 64 << 20})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			frame := benchFrame(64)
			appendFn := s.Append
			if mode == "AppendChecked" {
				appendFn = s.AppendChecked
			}
			b.SetBytes(64 * 1024)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				batch.Patch(frame, s.NextOffset(), 1, int64(i))
				if err := appendFn(frame); err != nil {
					b.Fatal(err)
				}
				if s.Size() > 48<<20 {
					b.StopTimer()
					if err := s.TruncateSuffix(0); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
			}
		})
	}
}

// BenchmarkReadFrames measures reads of a 32 MiB log of 1 KiB records
// (page cache warm): sequential reads of up to maxBytes, and single-frame
// reads at random offsets (an index seek each).
func BenchmarkReadFrames(b *testing.B) {
	for _, bc := range []struct {
		name     string
		records  int // per batch
		maxBytes int
		random   bool
	}{
		{"sequential/records=64/max=1MiB", 64, 1 << 20, false},
		{"sequential/records=1/max=64KiB", 1, 64 << 10, false},
		{"random/records=1/max=0", 1, 0, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s, err := Open(Config{Dir: b.TempDir(), Fsync: FsyncNever})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			frame := benchFrame(bc.records)
			for s.Size() < 32<<20 {
				batch.Patch(frame, s.NextOffset(), 1, 0)
				if err := s.Append(frame); err != nil {
					b.Fatal(err)
				}
			}
			next := s.NextOffset()
			rng := rand.New(rand.NewPCG(1, 1))
			var total int64
			off := uint64(0)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if bc.random {
					off = rng.Uint64N(next)
				}
				got, err := s.ReadFrames(off, bc.maxBytes, math.MaxUint64)
				if err != nil || len(got) == 0 {
					b.Fatalf("ReadFrames(%d): %d bytes, %v", off, len(got), err)
				}
				total += int64(len(got))
				if !bc.random {
					off += uint64(len(got)/len(frame)) * uint64(bc.records)
					if off >= next {
						off = 0
					}
				}
			}
			b.ReportMetric(float64(total)/b.Elapsed().Seconds()/1e6, "MB/s")
		})
	}
}

// BenchmarkRaftReads measures what Raft asks of its log over a 32 MiB log of
// 1 KiB single-record entries (page cache warm): TermAt of random indexes
// (an index seek each), and ReadFramesByIndex in 1 MiB pieces.
func BenchmarkRaftReads(b *testing.B) {
	s, err := Open(Config{Dir: b.TempDir(), Fsync: FsyncNever})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	frame := benchFrame(1)
	for index := uint64(1); s.Size() < 32<<20; index++ {
		batch.Patch(frame, s.NextOffset(), 1, 0)
		batch.PatchRaft(frame, 1, index)
		if err := s.Append(frame); err != nil {
			b.Fatal(err)
		}
	}
	first, last := s.FirstIndex(), s.LastIndex()
	b.Run("TermAt/random", func(b *testing.B) {
		rng := rand.New(rand.NewPCG(1, 1))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.TermAt(first + rng.Uint64N(last-first+1)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ReadFramesByIndex/max=1MiB", func(b *testing.B) {
		var total int64
		lo := first
		b.ReportAllocs()
		for b.Loop() {
			got, err := s.ReadFramesByIndex(lo, last+1, 1<<20)
			if err != nil || len(got) == 0 {
				b.Fatalf("ReadFramesByIndex(%d): %d bytes, %v", lo, len(got), err)
			}
			total += int64(len(got))
			if lo += uint64(len(got) / len(frame)); lo > last {
				lo = first
			}
		}
		b.ReportMetric(float64(total)/b.Elapsed().Seconds()/1e6, "MB/s")
	})
}
