package cli_test

// The CLI's tests again, against a real region node in-process.

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

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
