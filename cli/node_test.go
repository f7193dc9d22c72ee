package cli_test

// The CLI's tests again, against a real region node in-process.

import (
	"bytes"
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
