package vfs

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkSyncGroup compares, on the real disk under the test's temporary
// directory (TMPDIR moves it), 24 writers each appending 8 KiB to its own
// file and making it durable, as 3 nodes × 8 ranges' log writers do on one
// disk: each with its own fdatasync ("own"), or through one SyncGroup
// ("group"). It reports each write's latency (p50, p99) and, when
// GEOLOG_BENCH_BLOCKDEV names the disk (e.g. vda), the device's cache
// flushes per write (the whole device's: other tenants' count too).
//
//	go test -run '^$' -bench BenchmarkSyncGroup -benchtime 20000x ./vfs/
func BenchmarkSyncGroup(b *testing.B) {
	for _, mode := range []string{"own", "group"} {
		b.Run(mode, func(b *testing.B) { benchSyncGroup(b, mode == "group") })
	}
}

func benchSyncGroup(b *testing.B, group bool) {
	const writers, writeBytes = 24, 8 << 10
	dir := b.TempDir()
	g := NewSyncGroup()
	files := make([]File, writers)
	for i := range files {
		f, err := OS().OpenFile(filepath.Join(dir, fmt.Sprint(i)), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		files[i] = f
	}
	data := make([]byte, writeBytes)
	lat := make([][]time.Duration, writers)
	flushesBefore := deviceFlushes()
	b.ResetTimer()
	var wg sync.WaitGroup
	for i, f := range files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := i; j < b.N; j += writers {
				start := time.Now()
				if _, err := f.WriteAt(data, int64(j/writers)*writeBytes); err != nil {
					b.Error(err)
					return
				}
				var err error
				if group {
					err = g.Datasync(f)
				} else {
					err = f.Datasync()
				}
				if err != nil {
					b.Error(err)
					return
				}
				lat[i] = append(lat[i], time.Since(start))
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	all := slices.Concat(lat...)
	if len(all) == 0 {
		return
	}
	slices.Sort(all)
	b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99-ms")
	if flushesBefore >= 0 {
		b.ReportMetric(float64(deviceFlushes()-flushesBefore)/float64(len(all)), "flushes/write")
	}
}

// deviceFlushes returns the cache flushes completed by the block device
// GEOLOG_BENCH_BLOCKDEV names (/sys/block/<dev>/stat, field 16), -1 if
// unset or unreadable.
func deviceFlushes() int64 {
	dev := os.Getenv("GEOLOG_BENCH_BLOCKDEV")
	if dev == "" {
		return -1
	}
	b, err := os.ReadFile(filepath.Join("/sys/block", dev, "stat"))
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) < 16 {
		return -1
	}
	n, err := strconv.ParseInt(f[15], 10, 64)
	if err != nil {
		return -1
	}
	return n
}
