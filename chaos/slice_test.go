package chaos

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/geolog/geolog/internal/portlock"
	"github.com/geolog/geolog/pki"
	"github.com/hashicorp/go-hclog"
)

var sliceDir = flag.String("chaos.dir", "", "keep the slice's clusters, logs and histories in this folder (default: a temporary one)")

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binaries builds geologd and geolog-wan once per test process.
func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			buildErr = err
			return
		}
		if binDir, buildErr = os.MkdirTemp("", "geolog-chaos-bin-"); buildErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", binDir+"/", "./cmd/geologd", "./cmd/geolog-wan", "./cmd/geolog")
		cmd.Dir = filepath.Dir(strings.TrimSpace(string(out)))
		if b, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, b)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// testPorts reads GEOLOG_CHAOS_PORTS (LOW-HIGH), the range the slice's
// clusters take their ports from; unset, portlock's default range. Either
// way ports are held through portlock (two runs never share one) and the
// PostgreSQL of the homing scenario takes its port from the same range.
func testPorts(t *testing.T) (int, int) {
	s := os.Getenv("GEOLOG_CHAOS_PORTS")
	if s == "" {
		return 0, 0
	}
	r, err := portlock.ParseRange(s)
	if err != nil {
		t.Fatalf("GEOLOG_CHAOS_PORTS: %v", err)
	}
	return r.Min, r.Max
}

// repoRoot is the module's folder.
func repoRoot(t *testing.T) string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestSlice runs the fixed-seed slice (Slice) on local clusters: real
// processes, real faults, the checkers must pass and reach a verdict.
func TestSlice(t *testing.T) {
	if testing.Short() {
		t.Skip("real-process chaos slice")
	}
	dir := *sliceDir
	if dir == "" {
		dir = t.TempDir()
		// PostgreSQL (the homing scenario's lease store) runs as the
		// postgres user when the test runs as root: it must reach its
		// folder under the temporary directory.
		for _, d := range []string{filepath.Dir(dir), dir} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	lo, hi := testPorts(t)
	logger := hclog.New(&hclog.LoggerOptions{Name: "chaos", Level: hclog.Warn, Output: tWriter{t}})
	cfg := RunConfig{
		Cluster: LocalFactory(LocalConfig{BinDir: binaries(t), Dir: filepath.Join(dir, "clusters"), PortMin: lo, PortMax: hi,
			PGScript: filepath.Join(repoRoot(t), "scripts", "pg.sh"), Logger: logger}),
		Seed: 1, Dir: dir, Logger: logger,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var results []Result
	for _, sc := range Slice() {
		results = append(results, Run(ctx, cfg, sc))
	}
	var table bytes.Buffer
	WriteTable(&table, results)
	t.Logf("\n%s", table.String())
	for _, r := range results {
		if r.Status() != "PASS" {
			t.Errorf("%s: %s (table above; clusters and histories under %s, keep them with -chaos.dir)", r.Scenario, r.Status(), dir)
		}
	}
	if h := results[0].History; h != nil && !t.Failed() {
		checkersBite(t, h)
	}
	if h := results[len(results)-1].History; h != nil && !t.Failed() {
		homingCheckersBite(t, h)
	}
	if h := results[len(results)-2].History; h != nil && !t.Failed() {
		groupCheckersBite(t, h)
	}
	if h := results[len(results)-3].History; h != nil && !t.Failed() {
		splitCheckersBite(t, h)
	}
}

// splitCheckersBite: the split scenario split three times, its children
// were produced to and read by the consumers, and a record dropped from a
// child's final read is found lost.
func splitCheckersBite(t *testing.T, h *History) {
	split := 0
	for _, sp := range h.Spans {
		if len(sp.Children) > 0 {
			split++
		}
	}
	if split != 3 {
		t.Errorf("split-under-load: %d ranges split, want 3 (%v)", split, h.Spans)
		return
	}
	i := slices.IndexFunc(h.Reads, func(o Observation) bool {
		return o.Final && o.Range >= 2 && h.span(o.Range) != nil && len(h.span(o.Range).Children) == 0
	})
	if i < 0 || !slices.ContainsFunc(h.Reads, func(o Observation) bool { return !o.Final && o.Source == "consume/us" && o.Range >= 2 }) {
		t.Errorf("split-under-load: no child read finally and by a consumer")
		return
	}
	lost := *h
	lost.Reads = slices.Delete(slices.Clone(h.Reads), i, i+1)
	if q := CheckQueue(&lost); q.Counts[Lost] == 0 {
		t.Errorf("a record dropped from a child's final read: no loss found (%v)", q.Anomalies)
	}
}

// groupCheckersBite: the consumer scenario's members processed records,
// rebalanced after a fault, and committed through the coordinator; a
// record no member processed is found.
func groupCheckersBite(t *testing.T, h *History) {
	g := h.Group
	if g == nil || len(g.Processed) == 0 || g.CursorRecords == 0 {
		t.Errorf("consumer-faults: no group history (%v)", g)
		return
	}
	if r := CheckGroup(h); len(r.Rebalances) == 0 {
		t.Errorf("consumer-faults: no rebalance measured after the member faults")
	}
	damaged := *h
	dg := *g
	gone := g.Processed[len(g.Processed)/2].Value
	dg.Processed = slices.DeleteFunc(slices.Clone(g.Processed), func(p Processed) bool { return p.Value == gone })
	damaged.Group = &dg
	if r := CheckGroup(&damaged); r.Unprocessed != 1 || !r.Violated() {
		t.Errorf("a record no member processed: %d unprocessed found", r.Unprocessed)
	}
}

// homingCheckersBite damages the real history of a region kill and
// return: the checkers must object to an orphan log that lost its records
// and to an ack under the old epoch after the new one's.
func homingCheckersBite(t *testing.T, h *History) {
	if len(h.Orphans) == 0 {
		t.Errorf("region-kill-and-return orphaned nothing: the replicator stop before the kill should leave a divergent tail")
		return
	}
	noOrphans := *h
	noOrphans.Orphans = nil
	if q := CheckQueue(&noOrphans); q.Counts[Lost] == 0 {
		t.Errorf("orphan logs dropped: no loss found (%v)", q.Anomalies)
	}
	stale := *h
	stale.Ops = slices.Clone(h.Ops)
	i := slices.IndexFunc(stale.Ops, func(op Op) bool { return op.Kind == OpAppend && op.Outcome == OK && op.Epoch > 1 })
	if i < 0 {
		t.Errorf("no ack under a new epoch in the history")
		return
	}
	stale.Ops[i].Epoch = 1
	stale.Ops[i].Call = stale.Ops[len(stale.Ops)-1].Return + 1
	stale.Ops[i].Return = stale.Ops[i].Call + 1
	if q := CheckQueue(&stale); q.Counts[Stale] == 0 {
		t.Errorf("an ack under epoch 1 after epoch 2's: no stale epoch found (%v)", q.Anomalies)
	}
}

// checkersBite damages a real history of the slice in ways a broken node
// would, and expects the checkers to object: the safety assertions of the
// slice can fail.
func checkersBite(t *testing.T, h *History) {
	damaged := func(edit func(h *History)) *History {
		c := *h
		c.Ops = slices.Clone(h.Ops)
		c.Reads = slices.Clone(h.Reads)
		edit(&c)
		return &c
	}
	// An acked record missing from the home's final read.
	lost := damaged(func(h *History) {
		i := slices.IndexFunc(h.Reads, func(o Observation) bool { return o.Final && o.Region == h.Homes[o.Range] })
		h.Reads = slices.Delete(h.Reads, i, i+1)
	})
	if q := CheckQueue(lost); q.Counts[Lost] == 0 {
		t.Errorf("a record dropped from the final read: no loss found (%v)", q.Anomalies)
	}
	// A consumer that read another record at an offset.
	forked := damaged(func(h *History) {
		i := slices.IndexFunc(h.Reads, func(o Observation) bool { return !o.Final && !strings.HasPrefix(o.Source, "tail") && o.Offset > 10 })
		h.Reads[i].Value = h.Reads[i-1].Value
	})
	if q := CheckQueue(forked); q.Counts[Inconsistent] == 0 || q.Counts[Duplicated] == 0 {
		t.Errorf("a consumer read another record at an offset: %v", q.Anomalies)
	}
	// An ack at the wrong offset.
	moved := damaged(func(h *History) {
		i := slices.IndexFunc(h.Ops, func(op Op) bool { return op.Kind == OpAppend && op.Outcome == OK && op.Offset > 10 })
		h.Ops[i].Offset -= 3
	})
	if l := CheckLinearizable(moved, time.Minute, ""); l.Result != porcupine.Illegal {
		t.Errorf("an ack moved 3 offsets down: linearizability %s", l.Result)
	}
}

// TestEnvClusterAttach attaches to a LocalCluster through the env file it
// writes, as geolog-chaos --env does to scripts/cluster.sh's, and kills,
// restarts, pauses and resumes one of its nodes by pid file.
func TestEnvClusterAttach(t *testing.T) {
	if testing.Short() {
		t.Skip("real-process test")
	}
	lo, hi := testPorts(t)
	ctx := context.Background()
	local, err := StartLocal(ctx, LocalConfig{BinDir: binaries(t), Dir: t.TempDir(), PortMin: lo, PortMax: hi, LogLevel: "warn"},
		Shape{Regions: []string{"us"}, NodesPerRegion: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	env, err := AttachEnv(ctx, filepath.Join(local.Dir(), "env"))
	if err != nil {
		t.Fatal(err)
	}
	checkSecured(t, local, env.ClientTLS())
	// An env file naming the superuser's certificate (as scripts/cluster.sh
	// and terraform/local write it), its CA key beside: the harness issues
	// itself a "chaos" certificate and dials as it.
	opEnv := filepath.Join(local.Dir(), "env-operator")
	b, err := os.ReadFile(filepath.Join(local.Dir(), "env"))
	if err != nil {
		t.Fatal(err)
	}
	b = []byte(strings.ReplaceAll(string(b), filepath.Join(local.Dir(), "certs", "client"), filepath.Join(local.Dir(), "certs", operatorPrincipal)))
	if err := os.WriteFile(opEnv, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if opAttached, err := AttachEnv(ctx, opEnv); err != nil {
		t.Fatal(err)
	} else {
		checkSecured(t, local, opAttached.ClientTLS())
		if _, err := os.Stat(filepath.Join(local.Dir(), "certs", chaosPrincipal, pki.ClientCertFile)); err != nil {
			t.Errorf("no chaos certificate issued: %v", err)
		}
	}
	if caps := env.Caps(); !caps.Processes || !caps.WAN || !caps.Failpoints || !caps.IntraRegionLinks || caps.ClientLinks || caps.LeaseTTL != 0 {
		t.Fatalf("caps %+v", caps)
	}
	if env.ClientTLS() == nil || local.ClientTLS() == nil {
		t.Fatal("the cluster's nodes serve TLS, and the env file does not say so (GEOLOG_CERTS_DIR)")
	}
	if len(env.Nodes()) != 3 || env.Nodes()[1].Addr != local.Nodes()[1].Addr || env.Nodes()[1].DebugAddr != local.Nodes()[1].DebugAddr {
		t.Fatalf("nodes %+v, want those of %+v", env.Nodes(), local.Nodes())
	}
	for i, n := range env.Nodes() {
		// The client address found (the one the node advertises).
		if n.ClientAddr != local.Nodes()[i].ClientAddr {
			t.Fatalf("%s: client address %s, want %s", n.NodeRef, n.ClientAddr, local.Nodes()[i].ClientAddr)
		}
	}
	n2 := env.Nodes()[1]
	if err := env.Kill(n2.NodeRef); err != nil {
		t.Fatal(err)
	}
	if answers(ctx, n2.Addr, env.ClientTLS()) {
		t.Fatal("killed node answers")
	}
	if err := env.Restart(n2.NodeRef); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, 30*time.Second, func() bool { return answers(ctx, n2.Addr, env.ClientTLS()) }); err != nil {
		t.Fatalf("restarted node: %v", err)
	}
	n3 := env.Nodes()[2]
	if err := env.Pause(n3.NodeRef); err != nil {
		t.Fatal(err)
	}
	if answers(ctx, n3.Addr, env.ClientTLS()) {
		t.Fatal("paused node answers")
	}
	if err := env.Resume(n3.NodeRef); err != nil {
		t.Fatal(err)
	}
	if !answers(ctx, n3.Addr, env.ClientTLS()) {
		t.Fatal("resumed node does not answer")
	}
	// A scenario through the attach path: faults by pid file and through
	// the cluster's WAN; one that needs intra-region links is skipped.
	factory := EnvFactory(filepath.Join(local.Dir(), "env"))
	cfg := RunConfig{Cluster: factory, Seed: 2}
	zombie := zombieLeader(Shape{Regions: []string{"us"}}, 8*time.Second)
	zombie.Workload.Ranges = 2
	if r := Run(ctx, cfg, zombie); r.Status() != "PASS" || len(r.Failovers) == 0 {
		var b bytes.Buffer
		WriteTable(&b, []Result{r})
		t.Fatalf("zombie-leader on the attached cluster:\n%s", b.String())
	}
	if r := Run(ctx, cfg, ambiguousAckKill(Shape{Regions: []string{"us"}}, 8*time.Second)); r.Status() != "SKIP" {
		t.Fatalf("ambiguous-ack-kill on a cluster without client links: %s, want SKIP", r.Status())
	}
	if r := Run(ctx, cfg, homeLeaseStoreCut(Shape{Regions: []string{"us"}, LeaseStore: true}, 8*time.Second)); r.Status() != "SKIP" {
		t.Fatalf("a homing scenario on a cluster without a lease store: %s, want SKIP", r.Status())
	}
	// The restarted n2 is no longer the LocalCluster's child: stop it here.
	if err := env.Kill(n2.NodeRef); err != nil {
		t.Fatal(err)
	}
}
