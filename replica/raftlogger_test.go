package replica

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// formatCount counts how often it is formatted.
type formatCount struct{ n *int }

func (f formatCount) String() string { *f.n++; return "arg" }

// TestRaftLoggerFormatsOnlyWhatItLogs: raft's lines below the logger's
// level are not formatted (the simulator's null logger formatted every
// election's), and those at or above it are logged.
func TestRaftLoggerFormatsOnlyWhatItLogs(t *testing.T) {
	var out bytes.Buffer
	var n int
	arg := formatCount{&n}
	l := raftLogger{hclog.New(&hclog.LoggerOptions{Level: hclog.Warn, Output: &out})}
	l.Debug(arg)
	l.Debugf("%v", arg)
	l.Info(arg)
	l.Infof("%v", arg)
	if n != 0 || out.Len() != 0 {
		t.Fatalf("below the level: formatted %d times, logged %q", n, out.String())
	}
	l.Warningf("w %v", arg)
	l.Errorf("e %v", arg)
	if n != 2 || !strings.Contains(out.String(), "w arg") || !strings.Contains(out.String(), "e arg") {
		t.Fatalf("at the level: formatted %d times, logged %q", n, out.String())
	}
	n = 0
	raftLogger{hclog.NewNullLogger()}.Infof("%v", arg)
	if n != 0 {
		t.Fatalf("a null logger formatted %d times", n)
	}
}
