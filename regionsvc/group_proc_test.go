package regionsvc_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/cursors"
	"github.com/geolog/geolog/internal/nodeproc"
	"github.com/geolog/geolog/internal/rpcerr"
)

var memberLoopDuration = flag.Duration("memberloop", 20*time.Second, "how long TestGroupMemberKillLoop kills and adds members")

var (
	cliOnce sync.Once
	cliPath string
	cliErr  error
)

// geologCLI builds cmd/geolog once per test process.
func geologCLI(t *testing.T) string {
	t.Helper()
	cliOnce.Do(func() {
		dir, err := os.MkdirTemp("", "geolog-cli-")
		if err != nil {
			cliErr = err
			return
		}
		cliPath = filepath.Join(dir, "geolog")
		cmd := exec.Command("go", "build", "-o", cliPath, "github.com/geolog/geolog/cmd/geolog")
		if b, err := cmd.CombinedOutput(); err != nil {
			cliErr = fmt.Errorf("go build geolog: %v\n%s", err, b)
		}
	})
	if cliErr != nil {
		t.Fatal(cliErr)
	}
	return cliPath
}

// memberProc is one `geolog consume --group` process.
type memberProc struct {
	cmd    *exec.Cmd
	out    string // its stdout: one JSON record per line
	stderr *bytes.Buffer
	exited chan struct{}
}

func startMember(t *testing.T, bin, addrs, stream, group string, n int) *memberProc {
	out := filepath.Join(t.TempDir(), fmt.Sprintf("member-%d.out", n))
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	m := &memberProc{out: out, stderr: &bytes.Buffer{}, exited: make(chan struct{})}
	m.cmd = exec.Command(bin, "--addr", addrs, "consume", stream, "--group", group, "--json", "--session", "2s",
		"--member", fmt.Sprintf("member-%d", n))
	m.cmd.Stdout, m.cmd.Stderr = f, &lockedBuffer{b: m.stderr}
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { m.cmd.Wait(); f.Close(); close(m.exited) }()
	t.Cleanup(func() { m.cmd.Process.Kill(); <-m.exited })
	return m
}

type lockedBuffer struct {
	mu sync.Mutex
	b  *bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// processed reads the values a member printed (a last line cut by a kill
// is skipped).
func (m *memberProc) processed() []string {
	f, err := os.Open(m.out)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r struct {
			Value string `json:"value"`
		}
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.Value != "" {
			out = append(out, r.Value)
		}
	}
	return out
}

// TestGroupMemberKillLoop runs a 3-node region (real processes), a
// producer, and group members as real `geolog consume --group` processes
// that are killed (SIGKILL), stopped (SIGINT) and started in a loop. Then:
// every acknowledged record was processed by some member at least once;
// in the cursor stream's log every position raises its register (commits
// are monotonic) and every member commit came from the range's owner in
// its current incarnation (no member of an old generation committed).
func TestGroupMemberKillLoop(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real-process test")
	}
	// No compaction of _cursors: the check needs the whole cursor log.
	procs := nodeproc.Region(t, 3, "--tick", "50ms", "--cursor-compaction-lag", "1h")
	bin := geologCLI(t)
	var addrList []string
	for _, p := range procs {
		addrList = append(addrList, p.Addr)
	}
	addrs := strings.Join(addrList, ",")
	c, err := client.New(addrs, client.RetryBackoff(20*time.Millisecond, 300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *memberLoopDuration+4*time.Minute)
	defer cancel()
	waitFor(t, ctx, "stream created", func() bool {
		_, err := c.CreateStream(ctx, client.StreamConfig{Name: "events", RangeCount: 8})
		return err == nil || client.CodeOf(err) == client.CodeStreamExists
	})
	_, stopProducer := produceInBackground(t, ctx, c, "events")
	members, kills, stops := runMemberLoop(t, ctx, bin, addrs, *memberLoopDuration)
	values := stopProducer()
	t.Logf("%d records acknowledged; %d members started, %d killed, %d stopped", len(values), len(*members), kills, stops)
	// Catch up: one member (started if none runs) processes the rest.
	last := startMember(t, bin, addrs, "events", "g", len(*members)+1)
	*members = append(*members, last)
	seen := map[string]int{}
	waitFor(t, ctx, "every acknowledged record processed", func() bool {
		clear(seen)
		for _, m := range *members {
			for _, v := range m.processed() {
				seen[v]++
			}
		}
		for _, v := range values {
			if seen[v] == 0 {
				return false
			}
		}
		return true
	})
	dup := 0
	for _, n := range seen {
		dup += n - 1
	}
	t.Logf("every record processed; %d processed more than once (at least once)", dup)
	checkCursorLog(t, ctx, c)
}

// produceInBackground produces keyed records until its stop function is
// called; stop returns the values acknowledged.
func produceInBackground(t *testing.T, ctx context.Context, c *client.Client, stream string) (*[]string, func() []string) {
	p, err := c.NewProducer(stream)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var acked []string
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(4 * time.Millisecond):
			}
			v := fmt.Sprintf("v%07d", i)
			p.Produce(ctx, &client.Record{Key: fmt.Appendf(nil, "k%d", i%61), Value: []byte(v)}, func(_ client.ProduceResult, err error) {
				if err == nil {
					mu.Lock()
					acked = append(acked, v)
					mu.Unlock()
				}
			})
		}
	}()
	return &acked, func() []string {
		close(stop)
		<-done
		if err := p.Flush(ctx); err != nil {
			t.Errorf("producer flush: %v", err)
		}
		p.Close()
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), acked...)
	}
}

// runMemberLoop keeps 1 to 4 members running for d, killing, stopping and
// starting one every 0.5 to 2.5 s.
func runMemberLoop(t *testing.T, ctx context.Context, bin, addrs string, d time.Duration) (*[]*memberProc, int, int) {
	rng := rand.New(rand.NewPCG(16, 1))
	var all []*memberProc
	var live []*memberProc
	for i := 0; i < 3; i++ {
		m := startMember(t, bin, addrs, "events", "g", len(all)+1)
		all, live = append(all, m), append(live, m)
	}
	kills, stops := 0, 0
	end := time.Now().Add(d)
	for time.Now().Before(end) && ctx.Err() == nil {
		time.Sleep(time.Duration(500+rng.IntN(2000)) * time.Millisecond)
		switch k := rng.IntN(3); {
		case len(live) > 1 && k == 0:
			i := rng.IntN(len(live))
			live[i].cmd.Process.Signal(syscall.SIGKILL)
			<-live[i].exited
			live = append(live[:i], live[i+1:]...)
			kills++
		case len(live) > 1 && k == 1:
			i := rng.IntN(len(live))
			live[i].cmd.Process.Signal(syscall.SIGINT) // graceful: commit and leave
			select {
			case <-live[i].exited:
			case <-time.After(15 * time.Second):
				t.Errorf("member did not stop on SIGINT: %s", live[i].stderr)
			}
			live = append(live[:i], live[i+1:]...)
			stops++
		case len(live) < 4:
			m := startMember(t, bin, addrs, "events", "g", len(all)+1)
			all, live = append(all, m), append(live, m)
		}
	}
	return &all, kills, stops
}

// checkCursorLog reads every range of the cursor stream and checks it
// with cursors.CheckLog.
func checkCursorLog(t *testing.T, ctx context.Context, c *client.Client) {
	t.Helper()
	d, err := c.DescribeStream(ctx, "_cursors")
	if err != nil {
		t.Fatal(err)
	}
	memberCommits := map[string]int{}
	total := 0
	for r := range d.Stream.RangeCount {
		var recs []cursors.Record
		for from := uint64(0); ; {
			res, err := c.Read(ctx, "_cursors", r, from, client.ReadOptions{Consistency: client.ConsistencyHome})
			if err != nil {
				if rpcerr.CodeOf(err) == apierr.OffsetOutOfRange {
					break
				}
				t.Fatal(err)
			}
			for _, rec := range res.Records {
				recs = append(recs, cursors.Record{Key: rec.Key, Value: rec.Value, Tombstone: rec.Tombstone})
				if dec, err := cursors.Decode(cursors.Record{Key: rec.Key, Value: rec.Value, Tombstone: rec.Tombstone}); err == nil && dec.Position != nil && dec.Position.MemberID != "" {
					memberCommits[dec.Position.MemberID]++
				}
			}
			if res.NextOffset >= res.TailOffset {
				break
			}
			from = res.NextOffset
		}
		total += len(recs)
		for _, v := range cursors.CheckLog(recs) {
			t.Errorf("cursor range %d: %v", r, v)
		}
	}
	t.Logf("cursor log: %d records, commits by %d members", total, len(memberCommits))
	if len(memberCommits) < 3 {
		t.Fatalf("commits by only %d members: the test did not exercise handovers", len(memberCommits))
	}
}
