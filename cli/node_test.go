package cli_test

// The CLI's tests again, against a real region node in-process.

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/geolog/geolog/cli"
	"github.com/geolog/geolog/regionsvc"
	"github.com/geolog/geolog/segment"
)

func startNode(t *testing.T) string {
	t.Helper()
	n, err := regionsvc.New(regionsvc.Config{
		DataDir:    t.TempDir(),
		ListenAddr: "127.0.0.1:0",
		Fsync:      segment.FsyncNever,
		Logger:     hclog.New(&hclog.LoggerOptions{Name: "node", Level: hclog.Warn, Output: tWriter{t}}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n.Addr()
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

func TestNodeStreamsCommands(t *testing.T)   { testStreamsCommands(t, startNode(t)) }
func TestNodeProduceAndConsume(t *testing.T) { testProduceAndConsume(t, startNode(t)) }
func TestNodeConsumeFollow(t *testing.T)     { testConsumeFollow(t, startNode(t)) }
func TestNodeBenchCommandJSON(t *testing.T)  { testBenchCommandJSON(t, startNode(t)) }

// TestNodeStreamsDelete: streams delete removes a stream, and frees its
// name; deleting one that does not exist fails with STREAM_NOT_FOUND.
func TestNodeStreamsDelete(t *testing.T) {
	addr := startNode(t)
	mustRun(t, addr, "", "streams", "create", "gone", "--ranges", "2")
	if out := mustRun(t, addr, "", "streams", "delete", "gone"); !strings.Contains(out, "deleted stream gone") {
		t.Fatalf("delete printed %q", out)
	}
	ctx := testCtx(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"streams", "describe", "gone"}, 1, "STREAM_NOT_FOUND"},
		{[]string{"streams", "delete", "gone"}, 1, "STREAM_NOT_FOUND"},
		{[]string{"streams", "delete"}, 2, "usage"},
	} {
		_, errOut, code := run(t, ctx, "", append([]string{"--addr", addr}, tc.args...)...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("geolog %v: exit %d, stderr %q; want exit %d mentioning %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
	mustRun(t, addr, "", "streams", "create", "gone", "--ranges", "1")
}

// TestNodeErrorsInPlainWords: errors name no internal enum or Go layout,
// and say what to do next (an existing stream, a record over the size
// bound, a bad --from time).
func TestNodeErrorsInPlainWords(t *testing.T) {
	addr := startNode(t)
	mustRun(t, addr, "", "streams", "create", "dup", "--ranges", "1")
	big := strings.Repeat("x", 1<<20+1)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"streams", "create", "dup", "--ranges", "2"}, []string{"(STREAM_EXISTS)", "geolog streams describe"}},
		{[]string{"produce", "dup", "--key", "k", "--value", big}, []string{"--record-bytes-max", "split the value"}},
		{[]string{"streams", "describe", "nope"}, []string{"(STREAM_NOT_FOUND)", "geolog streams list"}},
	} {
		_, errOut, code := run(t, testCtx(t), "", append([]string{"--addr", addr}, tc.args...)...)
		if code == 0 {
			t.Errorf("geolog %.40v: exit 0", tc.args)
			continue
		}
		if strings.Contains(errOut, "ERROR_CODE_") || strings.Contains(errOut, "2006-01-02") {
			t.Errorf("geolog %.40v: internals in %q", tc.args, errOut)
		}
		for _, w := range tc.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("geolog %.40v: stderr %q lacks %q", tc.args, errOut, w)
			}
		}
	}
}

// TestNodeConsumeFrom: --from start|end|N|-1h|RFC 3339 picks where consume
// starts; a bad --from or a negative --range is a usage error in plain words
// (--range -2 used to read every range).
func TestNodeConsumeFrom(t *testing.T) {
	addr := startNode(t)
	mustRun(t, addr, "", "streams", "create", "f", "--ranges", "1")
	mustRun(t, addr, "", "produce", "f", "--key", "k", "--value", "a", "--value", "b", "--value", "c")
	count := func(args ...string) int {
		t.Helper()
		return len(parseConsumed(t, mustRun(t, addr, "", append([]string{"consume", "f"}, args...)...)))
	}
	for _, tc := range []struct {
		from string
		want int
	}{
		{"start", 3}, {"end", 0}, {"1", 2}, {"-1h", 3}, {"1h", 3}, {"2000-01-01T00:00:00Z", 3}, {"2999-01-01T00:00:00Z", 0},
	} {
		if got := count("--from", tc.from); got != tc.want {
			t.Errorf("--from %s: %d records, want %d", tc.from, got, tc.want)
		}
	}
	for _, args := range [][]string{
		{"--from", "5 minutes"}, {"--from", "-0s"}, {"--range", "-2"}, {"--from", "end", "--from-offset", "1"},
	} {
		_, errOut, code := run(t, testCtx(t), "", append([]string{"--addr", addr, "consume", "f"}, args...)...)
		if code != 2 || strings.Contains(errOut, "2006-01-02") {
			t.Errorf("consume %v: exit %d, stderr %q; want a usage error in plain words", args, code, errOut)
		}
	}
}

// TestNodeFormat: --format runs a template over the JSON form's fields:
// per stream, per record, per range; a bad template is a usage error.
func TestNodeFormat(t *testing.T) {
	addr := startNode(t)
	mustRun(t, addr, "", "streams", "create", "fa", "--ranges", "2")
	mustRun(t, addr, "", "streams", "create", "fb", "--ranges", "3")
	mustRun(t, addr, "", "produce", "fa", "--key", "k", "--value", "v1", "--value", "v2")
	if out := mustRun(t, addr, "", "streams", "list", "--format", "{{.name}}={{.range_count}}"); out != "fa=2\nfb=3\n" {
		t.Errorf("streams list --format: %q", out)
	}
	if out := mustRun(t, addr, "", "consume", "fa", "--format", "{{.offset}}:{{.key}}:{{.value}}"); out != "0:k:v1\n1:k:v2\n" {
		t.Errorf("consume --format: %q", out)
	}
	if out := mustRun(t, addr, "", "streams", "describe", "fb", "--format", "{{range .ranges}}{{.range}} {{end}}"); out != "0 1 2 \n" {
		t.Errorf("streams describe --format: %q", out)
	}
	for _, args := range [][]string{
		{"streams", "list", "--format", "{{.name"},
		{"streams", "list", "--format", "{{.nosuch}}"},
		{"streams", "list", "--json", "--format", "{{.name}}"},
	} {
		if _, errOut, code := run(t, testCtx(t), "", append([]string{"--addr", addr}, args...)...); code != 2 {
			t.Errorf("geolog %v: exit %d (%s), want a usage error", args, code, errOut)
		}
	}
}

// TestNodeStreamsAlter: streams alter changes a stream's retention (shown
// by streams describe), and refuses a call that changes nothing.
func TestNodeStreamsAlter(t *testing.T) {
	addr := startNode(t)
	mustRun(t, addr, "", "streams", "create", "al", "--ranges", "1")
	if out := mustRun(t, addr, "", "streams", "alter", "al", "--retention-age", "2h", "--retention-bytes", "1048576"); !strings.Contains(out, "altered stream al") {
		t.Fatalf("alter printed %q", out)
	}
	out := mustRun(t, addr, "", "streams", "describe", "al", "--format", "{{.stream.retention_age}} {{.stream.retention_bytes}}")
	if out != "2h0m0s 1048576\n" {
		t.Fatalf("describe after the alter: %q", out)
	}
	// The mirror hold: set at creation (-1: no bound), changed alone.
	mustRun(t, addr, "", "streams", "create", "mh", "--ranges", "1", "--mirror-hold-bytes", "-1", "--mirror-hold-age", "2h")
	mustRun(t, addr, "", "streams", "alter", "mh", "--mirror-hold-bytes", "1048576")
	if out := mustRun(t, addr, "", "streams", "describe", "mh", "--format", "{{.stream.mirror_hold_bytes}} {{.stream.mirror_hold_age}}"); out != "1048576 2h0m0s\n" {
		t.Fatalf("describe after the mirror hold's alter: %q", out)
	}
	if _, _, code := run(t, testCtx(t), "", "--addr", addr, "streams", "alter", "al"); code != 2 {
		t.Fatalf("an alter of nothing: exit %d", code)
	}
	if _, errOut, code := run(t, testCtx(t), "", "--addr", addr, "streams", "alter", "nope", "--retention-age", "1h"); code != 1 || !strings.Contains(errOut, "STREAM_NOT_FOUND") {
		t.Fatalf("an alter of a missing stream: exit %d, %q", code, errOut)
	}
}

// TestNodeBenchBreakdown: bench --breakdown against a real node prints
// where the records' time went, every stage over every record, and the
// means of the parts add up to the end-to-end mean.
func TestNodeBenchBreakdown(t *testing.T) {
	addr := startNode(t)
	out := mustRun(t, addr, "", "bench", "--stream", "bd", "--ranges", "2", "--count", "2000",
		"--producers", "2", "--record-bytes", "100", "--breakdown", "--json")
	var res cli.BenchResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bench --breakdown --json printed %q: %v", out, err)
	}
	if len(res.Breakdown) != 9 {
		t.Fatalf("breakdown %+v: want 9 stages", res.Breakdown)
	}
	var parts float64
	for _, s := range res.Breakdown {
		if s.Records+res.BreakdownUntimed != res.Records {
			t.Errorf("stage %s: %d records timed and %d not, of %d acked", s.Stage, s.Records, res.BreakdownUntimed, res.Records)
		}
		if !(s.P50 <= s.P90 && s.P90 <= s.P99 && s.P99 <= s.Max*1.001) {
			t.Errorf("stage %s: percentiles %+v", s.Stage, s)
		}
		if s.Stage != "end to end" {
			parts += s.Mean
		}
	}
	byName := map[string]cli.StageSummary{}
	for _, s := range res.Breakdown {
		byName[s.Stage] = s
	}
	if byName["leader write"].Max == 0 {
		t.Errorf("no leader write time in %+v", res.Breakdown)
	}
	// Each record's parts add up to its end-to-end time, up to the
	// histograms' microsecond rounding (network is clamped at 0).
	if e2e := byName["end to end"].Mean; parts < e2e*0.95 || parts > e2e*1.05+0.01 {
		t.Errorf("stage means add up to %.3f ms, end to end %.3f ms", parts, e2e)
	}
	text := mustRun(t, addr, "", "bench", "--stream", "bd", "--count", "100", "--breakdown")
	for _, want := range []string{"breakdown", "producer wait", "leader write", "quorum", "end to end"} {
		if !strings.Contains(text, want) {
			t.Fatalf("bench --breakdown printed %q, missing %q", text, want)
		}
	}
}
