package cli_test

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/geolog/geolog/regionsvc"
	"github.com/geolog/geolog/segment"
)

// TestCompactedStreamCommands: streams create --cleanup compact, produce
// --tab --tombstones, and consume of the compacted range against a real
// node that compacts every few tens of milliseconds.
func TestCompactedStreamCommands(t *testing.T) {
	n, err := regionsvc.New(regionsvc.Config{
		DataDir: t.TempDir(), ListenAddr: "127.0.0.1:0", Fsync: segment.FsyncNever, SegmentBytesMax: 2048,
		MaintenanceInterval: 20 * time.Millisecond, CompactionInterval: 20 * time.Millisecond,
		Logger: hclog.New(&hclog.LoggerOptions{Name: "node", Level: hclog.Warn, Output: tWriter{t}}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	addr := n.Addr()
	out := mustRun(t, addr, "", "streams", "create", "users", "--cleanup", "compact", "--delete-retention", "1h", "--min-compaction-lag", "1ms")
	if !strings.Contains(out, "cleanup compact") {
		t.Fatalf("create printed %q", out)
	}
	if out := mustRun(t, addr, "", "streams", "list"); !strings.Contains(out, "compact") {
		t.Fatalf("list printed %q", out)
	}
	if _, errOut, code := run(t, testCtx(t), "", "--addr", addr, "streams", "create", "x", "--delete-retention", "1h"); code == 0 {
		t.Fatalf("--delete-retention without --cleanup compact: exit 0 (%s)", errOut)
	}
	var in strings.Builder
	for i := range 50 {
		in.WriteString("u1\tv" + string(rune('a'+i%26)) + "\n")
	}
	in.WriteString("u2\tbob\nu3\tcy\nu2\n")
	mustRun(t, addr, in.String(), "produce", "users", "--tab", "--tombstones")
	// The newest of u1, then u3, then u2's tombstone (delete retention
	// 1h), at offsets compaction markers may have pushed along.
	want := "u1 vx | u3 cy | u2 (tombstone)"
	deadline := time.Now().Add(30 * time.Second)
	for {
		var got []string
		for _, l := range strings.Split(strings.TrimSpace(mustRun(t, addr, "", "consume", "users")), "\n") {
			if f := strings.Split(l, "\t"); len(f) == 4 {
				got = append(got, f[2]+" "+f[3])
			}
		}
		if strings.Join(got, " | ") == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("consume printed %q, want %q", strings.Join(got, " | "), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if out := mustRun(t, addr, "", "consume", "users", "--json"); !strings.Contains(out, `"tombstone":true`) {
		t.Fatalf("consume --json printed %s", out)
	}
}
