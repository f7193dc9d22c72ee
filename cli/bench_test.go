package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/cli"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/client/clienttest"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

func TestBenchCommandJSON(t *testing.T) {
	addr := startFake(t).Addr()
	testBenchCommandJSON(t, addr)
}

func testBenchCommandJSON(t *testing.T, addr string) {
	out := mustRun(t, addr, "", "bench", "--stream", "b", "--ranges", "4", "--count", "3000",
		"--producers", "2", "--keys", "16", "--record-bytes", "100", "--json")
	var res cli.BenchResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bench --json printed %q: %v", out, err)
	}
	checkSane(t, &res, 3000)
	if res.Producers != 2 || res.Keys != 16 || res.RecordBytes != 100 {
		t.Fatalf("config not echoed: %+v", res)
	}
	// 100-byte values plus 10-byte keys.
	if want := res.RecordsPerSec * 110 / 1e6; res.MBPerSec < want*0.99 || res.MBPerSec > want*1.01 {
		t.Fatalf("MB/s %f, want %f", res.MBPerSec, want)
	}

	// Sync mode, text output.
	out = mustRun(t, addr, "", "bench", "--stream", "b", "--count", "50", "--sync")
	for _, want := range []string{"50 acked, 0 errors", "records/s", "p99.9"} {
		if !strings.Contains(out, want) {
			t.Fatalf("bench printed %q, missing %q", out, want)
		}
	}
}

func checkSane(t *testing.T, res *cli.BenchResult, records int64) {
	t.Helper()
	l := res.LatencyMs
	switch {
	case records > 0 && res.Records != records, res.Records == 0:
		t.Fatalf("acked %d records, want %d", res.Records, records)
	case res.Errors != 0 || res.OrderViolations != 0 || !res.OK():
		t.Fatalf("errors %d (%v), order violations %d", res.Errors, res.ErrorSamples, res.OrderViolations)
	case res.RecordsPerSec <= 0 || res.MBPerSec <= 0 || res.ElapsedSeconds <= 0:
		t.Fatalf("rates %+v", res)
	case !(0 < l.P50 && l.P50 <= l.P99 && l.P99 <= l.P999 && l.P999 <= l.Max*1.001):
		t.Fatalf("latencies %+v", l)
	}
}

// The bench engine runs in-process for a fixed time, prints progress, and
// its cheap correctness checks hold under injected faults.
func TestRunBenchDurationWithFaults(t *testing.T) {
	fake := startFake(t)
	fake.SetAppendFault(func(n int64, _ *geologv1.AppendRequest) clienttest.Fault {
		switch {
		case n%17 == 0:
			return clienttest.Fault{DropAfterApply: true}
		case n%13 == 0:
			return clienttest.Fault{Err: apierr.New(apierr.Unavailable, "injected")}
		}
		return clienttest.Fault{}
	})
	c, err := client.New(fake.Addr(), client.RetryBackoff(time.Millisecond, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var progress syncBuffer
	res, err := cli.RunBench(testCtx(t), c, cli.BenchConfig{
		Stream: "faulty", Ranges: 2, Producers: 2, RecordBytes: 64, Keys: 8,
		BatchBytesMax: 4 << 10, BufferedBytesMax: 64 << 10,
		Duration: 700 * time.Millisecond, ProgressInterval: 200 * time.Millisecond,
	}, &progress)
	if err != nil {
		t.Fatal(err)
	}
	checkSane(t, res, 0)
	t.Logf("fake stats %+v", fake.Stats())
	if res.Duplicates == 0 {
		t.Errorf("lost acks were not resolved as duplicates: %+v", res)
	}
	if n := strings.Count(progress.String(), "records/s"); n < 2 {
		t.Fatalf("%d progress lines: %q", n, progress.String())
	}
	// The log holds exactly the acknowledged records.
	total := 0
	for r := range uint32(2) {
		total += len(fake.Records("faulty", r))
	}
	if int64(total) != res.Records {
		t.Fatalf("log holds %d records, %d were acked", total, res.Records)
	}
}

func TestRunBenchStopsOnContext(t *testing.T) {
	fake := startFake(t)
	c, err := client.New(fake.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The context ends once the bench is producing (a fixed deadline could
	// end it during the set-up on a busy machine, before any record).
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	var cancelled atomic.Int64 // UnixNano of the cancel
	go func() {
		for fake.Stats().AppendRequests == 0 && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		cancelled.Store(time.Now().UnixNano())
		cancel()
	}()
	res, err := cli.RunBench(ctx, c, cli.BenchConfig{Duration: time.Hour, ProgressInterval: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// An hour's bench that ends at all stopped on the context; the bound
	// only keeps a broken one from running the test's whole timeout.
	after := time.Since(time.Unix(0, cancelled.Load()))
	if cancelled.Load() == 0 || after > time.Minute || res.Records == 0 || res.Errors != 0 {
		t.Fatalf("returned %v after the cancel: %+v", after, res)
	}
}

// TestBenchFloor: bench floor measures write+fdatasync of 4 KiB and 1 MiB
// with one and with --writers writers, the 4 KiB write over zeros too,
// and the loopback round trip, and leaves nothing behind in --dir.
func TestBenchFloor(t *testing.T) {
	dir := t.TempDir()
	out, errOut, code := run(t, testCtx(t), "", "bench", "floor", "--dir", dir, "--writers", "2", "--count", "20", "--rtts", "50", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rows []struct {
		What      string  `json:"what"`
		SizeBytes int     `json:"size_bytes"`
		Writers   int     `json:"writers"`
		Count     int     `json:"count"`
		P50Ms     float64 `json:"p50_ms"`
		P99Ms     float64 `json:"p99_ms"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("%v: %q", err, out)
	}
	want := []struct{ size, writers, count int }{{4096, 1, 20}, {4096, 2, 40}, {4096, 1, 20}, {4096, 2, 40}, {1 << 20, 1, 10}, {1 << 20, 2, 20}, {64, 0, 50}}
	if len(rows) != len(want) {
		t.Fatalf("rows %+v", rows)
	}
	for i, w := range want {
		r := rows[i]
		if r.SizeBytes != w.size || r.Writers != w.writers || r.Count != w.count || r.P50Ms <= 0 || r.P99Ms < r.P50Ms {
			t.Errorf("row %d: %+v, want size %d, writers %d, count %d and 0 < p50 <= p99", i, r, w.size, w.writers, w.count)
		}
		if overwrite := i == 2 || i == 3; overwrite != strings.HasPrefix(r.What, "overwrite+") {
			t.Errorf("row %d is %q", i, r.What)
		}
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("left %d files in --dir", len(left))
	}
}

// --values N: the records cycle through N distinct random values (the
// default, 1, writes one value over and over, which the replicator's
// compression shrinks to nothing).
func TestBenchDistinctValues(t *testing.T) {
	srv := startFake(t)
	for _, tc := range []struct {
		values string
		want   int
	}{{"1", 1}, {"64", 64}} {
		stream := "v" + tc.values
		mustRun(t, srv.Addr(), "", "bench", "--stream", stream, "--ranges", "1", "--count", "500",
			"--record-bytes", "32", "--values", tc.values, "--json")
		distinct := map[string]bool{}
		for _, r := range srv.Records(stream, 0) {
			if len(r.GetValue()) != 32 {
				t.Fatalf("a record of %d bytes, want 32", len(r.GetValue()))
			}
			distinct[string(r.GetValue())] = true
		}
		if len(distinct) != tc.want {
			t.Fatalf("--values %s: %d distinct values in 500 records, want %d", tc.values, len(distinct), tc.want)
		}
	}
	if _, errOut, code := run(t, testCtx(t), "", "--addr", srv.Addr(), "bench", "--values", "0"); code == 0 || !strings.Contains(errOut, "--values") {
		t.Fatalf("--values 0: exit %d, stderr %q", code, errOut)
	}
}
