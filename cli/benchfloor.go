package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"
)

// floorRow is one measured floor: a write of SizeBytes and its fdatasync
// by each of Writers concurrent writers (each to its own file), or a
// loopback round trip (Writers 0).
type floorRow struct {
	What      string  `json:"what"`
	SizeBytes int     `json:"size_bytes"`
	Writers   int     `json:"writers"`
	Count     int     `json:"count"`
	P50Ms     float64 `json:"p50_ms"`
	P99Ms     float64 `json:"p99_ms"`
	MaxMs     float64 `json:"max_ms"`
	OpsPerSec float64 `json:"ops_per_sec"`
}

// benchFloor prints this machine's physical floor, which every benchmark
// figure stands beside: a write + fdatasync of 4 KiB and of 1 MiB with one
// writer and with --writers at once (as many as the benchmark has replicas
// on this disk), the same 4 KiB write over zeros written and synced
// before (what a range's log does with zero-ahead: segment/zeroahead.go),
// and the loopback TCP round trip.
func (e *env) benchFloor(ctx context.Context, args []string) error {
	fs := e.flagSet("bench floor")
	dir := fs.String("dir", os.TempDir(), "where to write (on the disk the benchmark's nodes use)")
	writers := fs.Int("writers", 3, "concurrent writers of the second run (the replicas on this disk)")
	count4k := fs.Int("count", 2000, "fdatasyncs of 4 KiB per writer (1 MiB: a tenth)")
	rtts := fs.Int("rtts", 5000, "loopback round trips")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 || *writers < 1 || *writers > 64 || *count4k < 10 || *rtts < 10 {
		return usagef("usage: bench floor [--dir D] [--writers 1..64] [--count N>=10] [--rtts N>=10] [--json]")
	}
	work, err := os.MkdirTemp(*dir, "geolog-floor-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	var rows []floorRow
	for _, run := range []struct {
		size      int
		overwrite bool
	}{{4 << 10, false}, {4 << 10, true}, {1 << 20, false}} {
		n := *count4k
		if run.size > 4<<10 {
			n = max(*count4k/10, 10)
		}
		for _, w := range slices.Compact([]int{1, *writers}) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r, err := fsyncFloor(ctx, work, run.size, w, n, run.overwrite)
			if err != nil {
				return err
			}
			rows = append(rows, r)
		}
	}
	r, err := rttFloor(ctx, *rtts)
	if err != nil {
		return err
	}
	rows = append(rows, r)
	if *asJSON {
		return json.NewEncoder(e.stdout).Encode(rows)
	}
	fmt.Fprintf(e.stdout, "floor of this machine (%s):\n", *dir)
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "what\tsize\twriters\tcount\tp50 ms\tp99 ms\tmax ms\tops/s\t")
	for _, r := range rows {
		size, writers := fmt.Sprint(r.SizeBytes), fmt.Sprint(r.Writers)
		if r.What == "loopback rtt" {
			writers = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.3f\t%.3f\t%.3f\t%.0f\t\n", r.What, size, writers, r.Count, r.P50Ms, r.P99Ms, r.MaxMs, r.OpsPerSec)
	}
	return tw.Flush()
}

// fsyncFloor has each of writers goroutines append size bytes to its own
// file and fdatasync it, n times, and returns the latencies of write +
// fdatasync over all of them. With overwrite, each file is first filled
// with n writes' worth of zeros and fdatasynced (untimed), and the timed
// writes go over them: the file's size and block map never change.
func fsyncFloor(ctx context.Context, dir string, size, writers, n int, overwrite bool) (floorRow, error) {
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = byte(i*7 + 1)
	}
	lat := make([][]time.Duration, writers)
	errs := make([]error, writers)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("w%d-%d", size, w)), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			if err != nil {
				errs[w] = err
				return
			}
			defer f.Close()
			if overwrite {
				if err := zeroFill(f, int64(size)*int64(n)); err != nil {
					errs[w] = err
					return
				}
			}
			for i := 0; i < n && ctx.Err() == nil; i++ {
				t0 := time.Now()
				if _, err := f.WriteAt(buf, int64(i)*int64(size)); err != nil {
					errs[w] = err
					return
				}
				if err := syscall.Fdatasync(int(f.Fd())); err != nil {
					errs[w] = fmt.Errorf("fdatasync: %w", err)
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	for _, err := range errs {
		if err != nil {
			return floorRow{}, err
		}
	}
	all := slices.Concat(lat...)
	what := "write+fdatasync"
	if overwrite {
		what = "overwrite+fdatasync"
	}
	return floorSummary(fmt.Sprintf("%s %s", what, sizeText(size)), size, writers, all, elapsed), nil
}

// zeroFill writes n zero bytes to the start of f and fdatasyncs them.
func zeroFill(f *os.File, n int64) error {
	zeros := make([]byte, min(n, 1<<20))
	for at := int64(0); at < n; {
		k, err := f.WriteAt(zeros[:min(int64(len(zeros)), n-at)], at)
		if err != nil {
			return err
		}
		at += int64(k)
	}
	if err := syscall.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("fdatasync: %w", err)
	}
	return nil
}

// rttFloor measures n round trips of 64 bytes over loopback TCP.
func rttFloor(ctx context.Context, n int) (floorRow, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return floorRow{}, err
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c) // echo
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return floorRow{}, err
	}
	defer c.Close()
	msg, back := make([]byte, 64), make([]byte, 64)
	lat := make([]time.Duration, 0, n)
	start := time.Now()
	for i := 0; i < n && ctx.Err() == nil; i++ {
		t0 := time.Now()
		if _, err := c.Write(msg); err != nil {
			return floorRow{}, err
		}
		if _, err := io.ReadFull(c, back); err != nil {
			return floorRow{}, err
		}
		lat = append(lat, time.Since(t0))
	}
	return floorSummary("loopback rtt", 64, 0, lat, time.Since(start)), nil
}

func floorSummary(what string, size, writers int, lat []time.Duration, elapsed time.Duration) floorRow {
	slices.Sort(lat)
	q := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))]) / 1e6
	}
	r := floorRow{What: what, SizeBytes: size, Writers: writers, Count: len(lat), P50Ms: q(0.50), P99Ms: q(0.99)}
	if len(lat) > 0 {
		r.MaxMs = float64(lat[len(lat)-1]) / 1e6
	}
	if elapsed > 0 {
		r.OpsPerSec = float64(len(lat)) / elapsed.Seconds()
	}
	return r
}

func sizeText(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}
