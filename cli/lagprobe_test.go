package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/cli"
)

// TestNodeLagCommand: `geolog lag` follows every range from its tail and
// measures each record it receives; records produced while it runs are all
// counted, with lags that are positive and bounded by the run; with
// --home-addr each is also matched with its receipt by a reader there.
func TestNodeLagCommand(t *testing.T) {
	addr := startNode(t)
	mustRun(t, addr, "", "streams", "create", "lagged", "--ranges", "3")
	// Records from before the probe starts are not counted: it starts at
	// the tails.
	mustRun(t, addr, "", "bench", "--stream", "lagged", "--count", "500", "--record-bytes", "50")
	var wg sync.WaitGroup
	var out string
	var errOut syncBuffer
	var code int
	wg.Add(1)
	go func() {
		defer wg.Done()
		var stdout syncBuffer
		code = cli.Run(context.Background(), []string{"--addr", addr, "lag", "lagged", "--duration", "10s", "--json", "--home-addr", addr},
			strings.NewReader(""), &stdout, &errOut)
		out = stdout.String()
	}()
	// The probe counts what is appended after it read the tails, which it
	// says on stderr; the 10 s leave a busy machine time to append and
	// deliver the 300 records.
	waitFor(t, "the probe following the stream", func() bool { return strings.Contains(errOut.String(), "following lagged from its tails") })
	mustRun(t, addr, "", "bench", "--stream", "lagged", "--count", "300", "--record-bytes", "50")
	wg.Wait()
	if code != 0 {
		t.Fatalf("lag exited %d: %s", code, out)
	}
	var rep struct {
		Records int64   `json:"records"`
		Ranges  int     `json:"ranges"`
		P50Ms   float64 `json:"p50_ms"`
		MaxMs   float64 `json:"max_ms"`
		Home    *struct {
			Records int64   `json:"records"`
			P99Ms   float64 `json:"p99_ms"`
		} `json:"from_home"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("lag --json printed %q: %v", out, err)
	}
	if rep.Records != 300 || rep.Ranges != 3 {
		t.Fatalf("lag saw %d records over %d ranges, want the 300 produced while it ran over 3", rep.Records, rep.Ranges)
	}
	if rep.P50Ms <= 0 || rep.MaxMs > 10000 {
		t.Fatalf("lags p50 %v ms max %v ms: not plausible for a local node", rep.P50Ms, rep.MaxMs)
	}
	// --home-addr naming the same node: every record is matched with its
	// receipt by the "home" reader, a moment apart.
	if rep.Home == nil || rep.Home.Records != 300 || rep.Home.P99Ms > rep.MaxMs+1000 {
		t.Fatalf("from_home %+v: want the 300 records matched", rep.Home)
	}
}

// waitFor polls cond every 5 ms for up to a minute (slack for a busy
// machine: it returns as soon as cond holds).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
