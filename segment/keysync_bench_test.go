package segment

import (
	"flag"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/internal/keysync"
	"github.com/geolog/geolog/vfs"
)

var (
	keysyncRecords = flag.Uint64("keysync.records", 200_000,
		"records in the range of BenchmarkKeySync* (make bench-keysync: 10 million); 2^a*5^b")
	keysyncDir = flag.String("keysync.dir", "",
		"directory of the range of BenchmarkKeySync*, kept and reused by later runs (default: a temporary directory)")
)

// keysyncWorkload is the range of the key sync figures: conversations of
// 100 records each, 100-byte messages, batches of 100 records.
func keysyncWorkload() keysync.Workload {
	return keysync.Workload{Records: *keysyncRecords, Conversations: *keysyncRecords / 100, ValueBytes: 100, BatchRecords: 100}
}

var keysyncRange struct {
	once sync.Once
	dir  string
	err  error
}

// keysyncStore opens the range of the key sync figures, building it the
// first time (through Append, FsyncNever: what is measured is reading).
func keysyncStore(b *testing.B) *Store {
	b.Helper()
	w := keysyncWorkload()
	if err := w.Check(); err != nil {
		b.Fatal(err)
	}
	r := &keysyncRange
	r.once.Do(func() {
		r.dir = *keysyncDir
		if r.dir == "" {
			tmp, err := os.MkdirTemp("", "keysync")
			if err != nil {
				r.err = err
				return
			}
			r.dir = tmp
		}
		r.err = buildKeysyncRange(b, r.dir, w)
	})
	if r.err != nil {
		b.Fatal(r.err)
	}
	began := time.Now()
	s, err := Open(Config{Dir: r.dir, FS: countingFS{FS: vfs.OS(), reads: &keysyncReads}})
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("opened %d records in %d bytes (%d key index bytes) in %v (recovery verifies every frame and key index file)",
		s.NextOffset(), s.Size(), keyIndexBytes(b, r.dir), time.Since(began).Round(time.Millisecond))
	return s
}

// buildKeysyncRange appends the workload's records to the store in dir,
// unless it holds them already.
func buildKeysyncRange(b *testing.B, dir string, w keysync.Workload) error {
	s, err := Open(Config{Dir: dir, Fsync: FsyncNever})
	if err != nil {
		return err
	}
	if s.NextOffset() == w.Records {
		return s.Close()
	}
	if s.NextOffset() != 0 {
		s.Close()
		return os.ErrExist
	}
	began := time.Now()
	for base := uint64(0); base < w.Records; base += uint64(w.BatchRecords) {
		frame := batch.Encode(nil, batch.Header{BaseOffset: base, Epoch: 1, AppendTimeUnixNanos: int64(base)},
			w.Batch(base, int(min(uint64(w.BatchRecords), w.Records-base))))
		if err := s.Append(frame); err != nil {
			s.Close()
			return err
		}
	}
	took := time.Since(began)
	b.Logf("built %d records (%d bytes) in %v: %.0f records/s through Append with the key index",
		w.Records, s.Size(), took.Round(time.Millisecond), float64(w.Records)/took.Seconds())
	return s.Close()
}

// keysyncReads counts the preads of the store keysyncStore opens.
var keysyncReads atomic.Int64

// countingFS counts the ReadAt calls (one pread each) of its files.
type countingFS struct {
	vfs.FS
	reads *atomic.Int64
}

func (c countingFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	f, err := c.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return countingFile{File: f, reads: c.reads}, nil
}

type countingFile struct {
	vfs.File
	reads *atomic.Int64
}

func (f countingFile) ReadAt(p []byte, off int64) (int, error) {
	f.reads.Add(1)
	return f.File.ReadAt(p, off)
}

// keyIndexBytes is the size of the .keyindex files in dir.
func keyIndexBytes(b *testing.B, dir string) int64 {
	names, err := filepath.Glob(filepath.Join(dir, "*"+keyIndexSuffix))
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for _, name := range names {
		if st, err := os.Stat(name); err == nil {
			n += st.Size()
		}
	}
	return n
}

// BenchmarkKeySync is one conversation's sync after being offline: all its
// records (100) from offset 0 of a range of -keysync.records records, through
// Store.ReadKey, page cache warm. It reports the p50 and p99 latency of
// the syncs it made; see make bench-keysync.
func BenchmarkKeySync(b *testing.B) {
	s := keysyncStore(b)
	defer s.Close()
	w := keysyncWorkload()
	rng := rand.New(rand.NewPCG(1, 2))
	var lat []time.Duration
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	cpu := keysync.CPUTime()
	reads := keysyncReads.Load()
	for b.Loop() {
		c := rng.Uint64N(w.Conversations)
		began := time.Now()
		recs, _, err := s.ReadKey(keysync.Key(c), 0, s.NextOffset(), 1000, 1<<20)
		lat = append(lat, time.Since(began))
		if err != nil || uint64(len(recs)) != w.Records/w.Conversations {
			b.Fatalf("conversation %d: %d records, %v", c, len(recs), err)
		}
	}
	b.StopTimer()
	cpu = (keysync.CPUTime() - cpu) / time.Duration(max(1, len(lat)))
	preads := float64(keysyncReads.Load()-reads) / float64(max(1, len(lat)))
	runtime.ReadMemStats(&after)
	p := keysync.Percentiles(lat, 50, 99)
	b.ReportMetric(float64(p[0].Microseconds()), "p50-µs")
	b.ReportMetric(float64(p[1].Microseconds()), "p99-µs")
	b.ReportMetric(float64(cpu.Microseconds()), "cpu-µs/op")
	b.ReportMetric(preads, "preads/op")
	b.Logf("%d syncs of one conversation (%d records) on %d records in %d segments: p50 %v, p99 %v; CPU %v, %.1f preads and %d bytes allocated per sync",
		len(lat), w.Records/w.Conversations, s.NextOffset(), s.segmentCount(), p[0], p[1], cpu.Round(time.Microsecond), preads,
		(after.TotalAlloc-before.TotalAlloc)/uint64(max(1, len(lat))))
}

// BenchmarkKeySyncScan is the same sync without the key index: a scan of
// the whole range (ReadFrames in 1 MiB reads, every record's key compared).
func BenchmarkKeySyncScan(b *testing.B) {
	s := keysyncStore(b)
	defer s.Close()
	w := keysyncWorkload()
	rng := rand.New(rand.NewPCG(3, 4))
	var lat []time.Duration
	for b.Loop() {
		key := keysync.Key(rng.Uint64N(w.Conversations))
		began := time.Now()
		found := 0
		for off := uint64(0); off < s.NextOffset(); {
			frames, err := s.ReadFrames(off, 1<<20, math.MaxUint64)
			if err != nil {
				b.Fatal(err)
			}
			for len(frames) > 0 {
				n, _ := batch.FrameSize(frames)
				h, err := batch.DecodeHeader(frames)
				if err != nil {
					b.Fatal(err)
				}
				if err := batch.RecordKeys(frames[:n], func(_ uint32, k []byte) {
					if string(k) == string(key) {
						found++
					}
				}); err != nil {
					b.Fatal(err)
				}
				frames, off = frames[n:], h.NextOffset()
			}
		}
		lat = append(lat, time.Since(began))
		if uint64(found) != w.Records/w.Conversations {
			b.Fatalf("scan found %d records", found)
		}
	}
	p := keysync.Percentiles(lat, 50, 99)
	b.ReportMetric(float64(p[0].Milliseconds()), "p50-ms")
	b.Logf("%d full scans for one conversation on %d records: p50 %v, max %v", len(lat), s.NextOffset(), p[0], p[1])
}

// segmentCount returns the number of segments.
func (s *Store) segmentCount() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.segs)
}

// TestMain removes the temporary range of the key sync benchmarks.
func TestMain(m *testing.M) {
	code := m.Run()
	if keysyncRange.dir != "" && *keysyncDir == "" {
		os.RemoveAll(keysyncRange.dir)
	}
	os.Exit(code)
}
