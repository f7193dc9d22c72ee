package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/homing/pgtest"
	"github.com/geolog/geolog/internal/nodeproc"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

// buildSink builds this command into a temporary directory.
func buildSink(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "pgsink")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build pgsink: %v\n%s", err, out)
	}
	return bin
}

// sinkProc is one pgsink process, restartable.
type sinkProc struct {
	t      *testing.T
	args   []string
	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	out    bytes.Buffer // every incarnation's stderr
}

func startSink(t *testing.T, bin string, args ...string) *sinkProc {
	p := &sinkProc{t: t, args: append([]string{bin}, args...)}
	p.start()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			p.mu.Lock()
			t.Logf("pgsink %v:\n%s", args, p.out.String())
			p.mu.Unlock()
		}
	})
	return p
}

func (p *sinkProc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *sinkProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func (p *sinkProc) start() {
	cmd := exec.Command(p.args[0], p.args[1:]...)
	cmd.Stdout, cmd.Stderr = p, p
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *sinkProc) kill() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	cmd.Process.Kill()
	<-exited
}

// running reports whether the current incarnation is alive (a sink that
// stopped on an error is a failure of the test).
func (p *sinkProc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// produced records, by (range, offset) → value.
type produced struct {
	mu   sync.Mutex
	recs map[[2]uint64]string
}

// produce appends n records at about rate per second, keyed over 50 keys.
func produce(t *testing.T, ctx context.Context, c *client.Client, stream string, n, rate int, acked *produced) error {
	p, err := c.NewProducer(stream)
	if err != nil {
		return err
	}
	defer p.Close()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	var failed error
	var mu sync.Mutex
	for i := range n {
		<-tick.C
		v := fmt.Sprintf("v%05d", i)
		p.Produce(ctx, &client.Record{Key: fmt.Appendf(nil, "k%d", i%50), Value: []byte(v)}, func(r client.ProduceResult, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = err
				return
			}
			acked.mu.Lock()
			acked.recs[[2]uint64{uint64(r.Range), r.Offset}] = v
			acked.mu.Unlock()
		})
	}
	if err := p.Flush(ctx); err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	return failed
}

func countRows(ctx context.Context, pool *pgxpool.Pool) (n int) {
	pool.QueryRow(ctx, `SELECT count(*) FROM events_out`).Scan(&n)
	return n
}

// TestSinkKilledAtRandomPoints: a geologd process, a producer appending
// 3,000 records over about six seconds, and two pgsink processes (static
// members of one group, small transactions) killed with SIGKILL at random
// moments and restarted, eight times; then every acknowledged record is
// in the table exactly once, with its value, and the cursor table stands
// at each range's tail.
func TestSinkKilledAtRandomPoints(t *testing.T) {
	bin := buildSink(t)
	pgURL := pgtest.NewDatabase(t)
	node := nodeproc.Start(t, t.TempDir(), nodeproc.FreeAddr(t), "--fsync", "never")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := client.New(node.Addr, client.RetryBackoff(50*time.Millisecond, time.Second), client.RetriesMax(20))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.CreateStream(ctx, client.StreamConfig{Name: "events", RangeCount: 4}); err != nil {
		t.Fatal(err)
	}
	const n = 3000
	acked := &produced{recs: map[[2]uint64]string{}}
	prodErr := make(chan error, 1)
	go func() { prodErr <- produce(t, ctx, c, "events", n, 500, acked) }()

	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	args := func(inst string) []string {
		return []string{"--addr", node.Addr, "--stream", "events", "--pg", pgURL, "--table", "events_out",
			"--instance", inst, "--batch", "25", "--session", "3s", "--commit-interval", "200ms"}
	}
	sinks := []*sinkProc{startSink(t, bin, args("a")...), startSink(t, bin, args("b")...)}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	for i := range 8 {
		time.Sleep(time.Duration(200+rng.IntN(1300)) * time.Millisecond)
		s := sinks[rng.IntN(2)]
		if !s.running() {
			t.Fatalf("a sink stopped on its own:\n%s", s.output())
		}
		s.kill()
		t.Logf("kill %d: sink %s killed with %d rows written", i, s.args[len(s.args)-7], countRows(ctx, pool))
		s.start()
	}
	if err := <-prodErr; err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for countRows(ctx, pool) < n && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second) // a duplicate would be written by now
	for _, s := range sinks {
		if !s.running() {
			t.Fatalf("a sink stopped on its own:\n%s", s.output())
		}
		s.kill()
	}
	checkExactlyOnce(t, ctx, pool, acked, n)
}

// checkExactlyOnce: one row per acknowledged record, with its value, no
// other row, and positions at each range's tail.
func checkExactlyOnce(t *testing.T, ctx context.Context, pool *pgxpool.Pool, acked *produced, n int) {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT src_range, src_offset, value FROM events_out`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[[2]uint64]int{}
	tails := map[uint64]uint64{}
	for rows.Next() {
		var r, o int64
		var v []byte
		if err := rows.Scan(&r, &o, &v); err != nil {
			t.Fatal(err)
		}
		k := [2]uint64{uint64(r), uint64(o)}
		got[k]++
		if want := acked.recs[k]; string(v) != want {
			t.Errorf("row %d/%d holds %q, the record was %q", r, o, v, want)
		}
		tails[uint64(r)] = max(tails[uint64(r)], uint64(o)+1)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if len(acked.recs) != n {
		t.Fatalf("%d records acknowledged, want %d", len(acked.recs), n)
	}
	for k, count := range got {
		if count != 1 {
			t.Errorf("record %d/%d has %d rows", k[0], k[1], count)
		}
	}
	for k := range acked.recs {
		if got[k] == 0 {
			t.Errorf("record %d/%d has no row", k[0], k[1])
		}
	}
	if len(got) != n {
		t.Errorf("%d distinct records in the table, want %d", len(got), n)
	}
	cur, err := pool.Query(ctx, `SELECT range_id, next_offset FROM geolog_sink_cursors WHERE sink = 'pgsink' AND stream = 'events'`)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	for cur.Next() {
		var r, next int64
		if err := cur.Scan(&r, &next); err != nil {
			t.Fatal(err)
		}
		if uint64(next) != tails[uint64(r)] {
			t.Errorf("range %d's cursor at %d, its last row at %d", r, next, tails[uint64(r)])
		}
	}
}
