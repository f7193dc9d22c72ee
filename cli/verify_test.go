package cli_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/geolog/geolog/atrest"
	"github.com/geolog/geolog/internal/portlock"
	"github.com/geolog/geolog/regionsvc"
	"github.com/geolog/geolog/segment"
)

// startNodeAt starts a node on dataDir with small segments and returns it.
func startNodeAt(t *testing.T, dataDir string) *regionsvc.Node {
	t.Helper()
	n, err := regionsvc.New(regionsvc.Config{
		DataDir:         dataDir,
		ListenAddr:      "127.0.0.1:0",
		SegmentBytesMax: segment.SegmentBytesMaxMin,
		Logger:          hclog.New(&hclog.LoggerOptions{Name: "node", Level: hclog.Warn, Output: tWriter{t}}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		n.Close()
		t.Fatal(err)
	}
	return n
}

type verifiedRange struct {
	Range         string     `json:"range"`
	OK            bool       `json:"ok"`
	Segments      int        `json:"segments"`
	StartOffset   uint64     `json:"start_offset"`
	NextOffset    uint64     `json:"next_offset"`
	RecordedStart *uint64    `json:"recorded_start"`
	Error         string     `json:"error"`
	Missing       *[2]uint64 `json:"missing"`
}

func verifyJSON(t *testing.T, dataDir string) ([]verifiedRange, int) {
	t.Helper()
	stdout, stderr, code := run(t, testCtx(t), "", "verify", "--data-dir", dataDir, "--json")
	var out []verifiedRange
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("verify --json printed %q (stderr %q): %v", stdout, stderr, err)
	}
	return out, code
}

// TestVerifyAndLostSegment: a node runs and writes, stops; geolog verify
// finds every range sound; the oldest segment of a range is deleted; then
// verify reports that range (exit 1, the lost offsets named), and the
// node, started again, refuses the range with CORRUPTION instead of
// serving it from a later start, while the other ranges serve on.
func TestVerifyAndLostSegment(t *testing.T) {
	dataDir := t.TempDir()
	n := startNodeAt(t, dataDir)
	addr := n.Addr()
	mustRun(t, addr, "", "streams", "create", "ev", "--ranges", "2")
	// One produce per batch: frames of about 1 KiB, a segment or so each.
	for b := range 8 {
		var in strings.Builder
		for i := range 30 {
			fmt.Fprintf(&in, "k%d\t%s\n", (b*30+i)%7, strings.Repeat("v", 60))
		}
		mustRun(t, addr, in.String(), "produce", "ev", "--tab")
	}
	n.Close()

	lines, code := verifyJSON(t, dataDir)
	if code != 0 || len(lines) < 2 {
		t.Fatalf("verify of a sound data dir: exit %d, %+v", code, lines)
	}
	var victim verifiedRange
	for _, l := range lines {
		if !l.OK || l.RecordedStart == nil || *l.RecordedStart != l.StartOffset {
			t.Fatalf("range %s: %+v", l.Range, l)
		}
		if strings.HasPrefix(l.Range, "ev/") && l.Segments > victim.Segments {
			victim = l
		}
	}
	if victim.Segments < 2 {
		t.Fatalf("no range of ev has two segments: %+v", lines)
	}
	dir := filepath.Join(dataDir, "streams", victim.Range)
	segs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	if err := os.Remove(segs[0]); err != nil {
		t.Fatal(err)
	}
	// What the lost segment held: from the start to the next segment.
	var second uint64
	fmt.Sscanf(filepath.Base(segs[1]), "%d.log", &second)

	lines, code = verifyJSON(t, dataDir)
	if code != 1 {
		t.Fatalf("verify after losing a segment: exit %d, want 1", code)
	}
	for _, l := range lines {
		if l.Range != victim.Range {
			if !l.OK {
				t.Fatalf("range %s: %+v", l.Range, l)
			}
			continue
		}
		if l.OK || l.Missing == nil || l.Missing[0] != victim.StartOffset || l.Missing[1] != second {
			t.Fatalf("range %s after losing [%d, %d): %+v", l.Range, victim.StartOffset, second, l)
		}
	}
	stdout, _, _ := run(t, testCtx(t), "", "verify", "--data-dir", dataDir)
	if !strings.Contains(stdout, "PROBLEM") || !strings.Contains(stdout, "missing") {
		t.Fatalf("verify's table does not show the problem:\n%s", stdout)
	}

	// The store refuses the log with the typed error...
	_, err := segment.Open(segment.Config{Dir: dir})
	var me *segment.MissingError
	if !errors.As(err, &me) || !errors.Is(err, segment.ErrCorrupt) {
		t.Fatalf("segment.Open of the range: %v, want a MissingError", err)
	}
	// ...and so does the node, which serves the other range.
	n = startNodeAt(t, dataDir)
	defer n.Close()
	var r int
	fmt.Sscanf(strings.TrimPrefix(victim.Range, "ev/"), "%d", &r)
	_, stderr, code := run(t, testCtx(t), "", "--addr", n.Addr(), "consume", "ev", "--range", fmt.Sprint(r))
	if code == 0 || !strings.Contains(stderr, "CORRUPTION") || !strings.Contains(stderr, "missing") {
		t.Fatalf("consume of the damaged range: exit %d, %q", code, stderr)
	}
	mustRun(t, n.Addr(), "", "consume", "ev", "--range", fmt.Sprint(1-r))
}

// TestDataDirModes: every file a node writes is 0600 and every directory
// 0700, after a replicated region of one with encryption at rest created
// a stream, took appends, rolled segments and stopped (segments, index
// files, Raft state and commit marks, the catalogue, orphan logs, key
// files). Its sealed ranges verify with the KEK file and not without.
func TestDataDirModes(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	kekFile := filepath.Join(t.TempDir(), "kek.json")
	if _, err := atrest.AddKEK(kekFile); err != nil {
		t.Fatal(err)
	}
	kek, err := atrest.OpenKEKFile(kekFile)
	if err != nil {
		t.Fatal(err)
	}
	addr := portlock.Addr(t)
	n, err := regionsvc.New(regionsvc.Config{
		DataDir: dataDir, ListenAddr: addr, NodeID: 1, Peers: map[uint64]string{1: addr},
		SegmentBytesMax: segment.SegmentBytesMaxMin, KEK: kek,
		Logger: hclog.New(&hclog.LoggerOptions{Name: "node", Level: hclog.Warn, Output: tWriter{t}}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		n.Close()
		t.Fatal(err)
	}
	ctx := testCtx(t)
	for {
		_, stderr, code := run(t, ctx, "", "--addr", addr, "streams", "create", "modes", "--ranges", "2")
		if code == 0 || strings.Contains(stderr, "STREAM_EXISTS") {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("create: %s", stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for b := range 4 {
		var in strings.Builder
		for i := range 30 {
			fmt.Fprintf(&in, "k%d\t%s\n", (b*30+i)%5, strings.Repeat("m", 50))
		}
		mustRun(t, addr, in.String(), "produce", "modes", "--tab")
	}
	n.Close()
	checked := map[string]bool{}
	err = filepath.WalkDir(dataDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		st, err := os.Lstat(path)
		if err != nil {
			return err
		}
		want := os.FileMode(0o600)
		if d.IsDir() {
			want = 0o700
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", strings.TrimPrefix(path, dataDir), st.Mode().Perm(), want)
		}
		checked[d.Name()] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"meta", "00001", "_raftstate", "_orphans", "_logstart", "00000000000000000000.log"} {
		if !checked[name] {
			t.Errorf("walked no %s (%d entries)", name, len(checked))
		}
	}
	if _, stderr, code := run(t, ctx, "", "verify", "--data-dir", dataDir, "--kek-file", kekFile); code != 0 {
		t.Fatalf("verify with the KEK file: exit %d, %s", code, stderr)
	}
	stdout, _, code := run(t, ctx, "", "verify", "--data-dir", dataDir)
	if code != 1 || !strings.Contains(stdout, "--kek-file") {
		t.Fatalf("verify of sealed ranges without the KEK file: exit %d,\n%s", code, stdout)
	}
}
