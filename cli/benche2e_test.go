package cli_test

import (
	"encoding/json"
	"testing"
)

// TestNodeBenchE2E: bench e2e against one node (producers and the group
// consumer on the same address): every acknowledged record reaches the
// consumer, and the measured latencies are ordered and positive.
func TestNodeBenchE2E(t *testing.T) {
	addr := startNode(t)
	out := mustRun(t, addr, "", "bench", "e2e", "--consume-addr", addr, "--ranges", "2", "--rate", "200",
		"--duration", "3s", "--warmup", "1s", "--producers", "2", "--record-bytes", "64", "--json")
	var r struct {
		Produced struct{ Records int64 }
		Received int64
		Expected int64
		Measured int64
		Latency  struct{ P50, P99, Max float64 } `json:"e2e_latency_ms"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	switch {
	case r.Produced.Records < 300 || r.Expected != r.Produced.Records:
		t.Fatalf("produced %d, expected %d: %s", r.Produced.Records, r.Expected, out)
	case r.Received < r.Expected || r.Measured == 0 || r.Measured > r.Received:
		t.Fatalf("received %d, measured %d of %d: %s", r.Received, r.Measured, r.Expected, out)
	case r.Latency.P50 <= 0 || r.Latency.P50 > r.Latency.P99 || r.Latency.P99 > r.Latency.Max:
		t.Fatalf("latencies %+v", r.Latency)
	}
}
