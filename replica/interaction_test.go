package replica

import (
	crand "crypto/rand"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/geolog/geolog/batch"
)

// TestInteraction runs the replica interaction scripts in
// testdata/interactions (regenerate their output with -rewrite): a group
// of real Replicas over vfs.Mem disks, driven step by step through
// interactionEnv (interaction_env_test.go). Commands (node ids are bare
// arguments, e.g. "process-ready 1 3"; none means every node):
//
//	create n=3 [seed=1] [retention=<bytes>]  new group (segments of 1 KiB)
//	tick [n=1] [ids] [stabilize]      Tick the nodes n times (stabilize after each)
//	campaign <id> | transfer from=<id> to=<id>
//	propose <id> producer=<p> seq=<s> records=<n> [tag=<t>] [epoch=<e>] [count=<k>]
//	                                  an append; its answer prints when it comes
//	propose <id> split                a split marker (range 0 into 1 and 2)
//	fork <id> at=<offset> epoch=<e>   ProposeFork; its answer prints when it comes
//	process-ready [ids]               one Ready cycle each
//	write-log [ids]                   WriteLog (even when held)
//	msgs                              the messages in flight
//	deliver-msgs [from=] [to=] [type=] [n=] [drop]
//	stabilize [verbose]               Ready, write (but held), deliver until quiet
//	hold-writes [ids] | release-writes [ids]   a node's log writer stops/resumes
//	partition [ids] | heal            cut the nodes off / reconnect all
//	crash <id> | restart <id>         power loss (unsynced writes lost) / reopen
//	fail-fsync <id> [n=1]             fail the node's next n fdatasyncs (EIO)
//	disk-space <id> free=<bytes> | disk-space <id> unlimited   the disk fills up
//	fail-op <id> after=<k>            fail the node's k-th disk change from now (EIO)
//	check-logs                        the live nodes' committed frames agree
//	compact [ids]                     Compact (retention as log compaction)
//	share-floor [ids]                 a leader sends its floor or that it has none
//	status [ids] | log <id> | orphans <id>
//	log-level level=debug|info|warn|error|off  replica and Raft log lines
//	                                  into the output (off: to the test log)
//
// After every command each node's published committed offset is checked
// against the highest it published before, across restarts too: it may
// only move back when the node applies a fork.
func TestInteraction(t *testing.T) {
	paths, err := filepath.Glob("testdata/interactions/*.txt")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no scripts in testdata/interactions: %v", err)
	}
	for _, path := range paths {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
			f := runInteraction(t, 0)
			datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string { return f(t, d) })
		})
	}
}

// runInteraction returns the datadriven callback of one script, with its
// own environment; it makes etcd raft's election jitter (drawn from
// crypto/rand.Reader) follow a fixed seed for the script's duration.
// diskSeed, if not 0, overrides the seed of create (what crashes keep of
// unsynced writes).
func runInteraction(t testing.TB, diskSeed uint64) func(testing.TB, *datadriven.TestData) string {
	env := newInteractionEnv(t)
	env.diskSeed = diskSeed
	saved := crand.Reader
	crand.Reader = seededReader{rand.New(rand.NewPCG(1, 2))}
	t.Cleanup(func() { crand.Reader = saved })
	return func(t testing.TB, d *datadriven.TestData) string {
		env.t = t
		out := env.handle(d)
		out += env.checkPublished()
		if out == "" {
			return "ok\n"
		}
		return out
	}
}

// seededReader feeds crypto/rand.Reader from a seeded generator.
type seededReader struct{ r *rand.Rand }

func (g seededReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(g.r.Uint32())
	}
	return len(p), nil
}

// handle runs one command and returns what it printed, events first.
func (e *interactionEnv) handle(d *datadriven.TestData) string {
	var b strings.Builder
	switch d.Cmd {
	case "create":
		e.cmdCreate(d)
	case "tick":
		ids, n := e.idArgs(d), e.intArg(d, "n", 1)
		if !d.HasArg("stabilize") {
			e.tick(ids, n)
			break
		}
		for range n {
			e.tick(ids, 1)
			e.stabilize()
		}
	case "campaign":
		if err := e.upNode(d, e.idArg(d)).Campaign(); err != nil {
			fmt.Fprintf(&b, "campaign: %v\n", err)
		}
	case "transfer":
		e.upNode(d, e.intArgU(d, "from")).TransferLeadership(e.intArgU(d, "to"))
	case "propose":
		b.WriteString(e.cmdPropose(d))
	case "fork":
		e.cmdFork(d)
	case "skip":
		e.cmdSkip(d)
	case "process-ready":
		for _, id := range e.idArgs(d) {
			e.readyNode(id)
		}
	case "write-log":
		e.cmdWriteLog(d)
	case "msgs":
		if len(e.queue) == 0 {
			b.WriteString("no messages\n")
		}
		for _, em := range e.queue {
			fmt.Fprintf(&b, "%s\n", describeMsg(em.m))
		}
	case "deliver-msgs":
		e.cmdDeliver(d, &e.out)
	case "stabilize":
		e.verbose = d.HasArg("verbose")
		e.stabilize()
		e.verbose = false
	default:
		return e.handleFaults(d)
	}
	return e.flush() + b.String()
}

// handleFaults runs the commands that change the world around the
// replicas, and the ones that only print.
func (e *interactionEnv) handleFaults(d *datadriven.TestData) string {
	var b strings.Builder
	switch d.Cmd {
	case "hold-writes", "release-writes":
		for _, id := range e.idArgs(d) {
			e.held[id] = d.Cmd == "hold-writes"
		}
	case "partition":
		for _, id := range e.idArgs(d) {
			e.cut[id] = true
		}
	case "heal":
		clear(e.cut)
	case "log-level":
		var level string
		d.ScanArgs(e.t, "level", &level)
		e.setLogLevel(level)
	case "crash":
		id := e.idArg(d)
		e.upNode(d, id)
		e.crash(id)
	case "restart":
		b.WriteString(e.cmdRestart(d))
	case "disk-space":
		id := e.idArg(d)
		e.nodes[id].fs.SetSpaceBytes(int64(e.intArg(d, "free", 0)) + e.nodes[id].fs.UsedBytes())
		if d.HasArg("unlimited") {
			e.nodes[id].fs.SetSpaceBytes(0)
		}
	case "fail-op":
		e.failOp(e.idArg(d), e.intArg(d, "after", 1))
	case "check-logs":
		b.WriteString(e.checkLogs())
	case "fail-fsync":
		e.nodes[e.idArg(d)].fs.FailDatasyncs(e.intArg(d, "n", 1))
	case "compact":
		for _, id := range e.idArgs(d) {
			n, err := e.upNode(d, id).Compact()
			fmt.Fprintf(&b, "node %d: compacted %d segments (err %v), log starts at index %d offset %d\n",
				id, n, err, e.nodes[id].st.FirstIndex(), e.nodes[id].st.StartOffset())
		}
	case "share-floor":
		// share-floor <ids>: each leader sends its floor, or that it has
		// none, as Compact does first (floor.go), without compacting.
		for _, id := range e.idArgs(d) {
			r := e.upNode(d, id)
			r.floorShare.sentTerm = 0 // send now, whatever was sent before
			r.shareFloor()
			if floor, ok := r.compactionFloor(); ok {
				fmt.Fprintf(&b, "node %d: floor %d\n", id, floor)
			} else {
				fmt.Fprintf(&b, "node %d: no floor\n", id)
			}
		}
	case "floor":
		// floor <id> at=<offset> sets node id's driver floor; floor <id>
		// off lifts it (SetCompactionFloor). It prints the floor the node
		// learned from a leader (floor.go).
		for _, id := range e.idArgs(d) {
			r := e.upNode(d, id)
			if d.HasArg("at") {
				r.SetCompactionFloor(uint64(e.intArg(d, "at", 0)), true)
			}
			if d.HasArg("off") {
				r.SetCompactionFloor(0, false)
			}
			if f, ok := r.LearnedCompactionFloor(); ok {
				fmt.Fprintf(&b, "node %d: learned floor %d\n", id, f)
			} else {
				fmt.Fprintf(&b, "node %d: no learned floor\n", id)
			}
		}
	case "status":
		for _, id := range e.idArgs(d) {
			fmt.Fprintf(&b, "%s\n", e.status(id))
		}
	case "log":
		id := e.idArg(d)
		e.upNode(d, id)
		b.WriteString(e.logLines(id))
	case "orphans":
		id := e.idArg(d)
		e.upNode(d, id)
		b.WriteString(e.orphanLines(id))
	default:
		d.Fatalf(e.t, "unknown command %q", d.Cmd)
	}
	return e.flush() + b.String()
}

// flush returns the events printed since the last command.
func (e *interactionEnv) flush() string {
	s := e.out.String()
	e.out.Reset()
	return s
}

func (e *interactionEnv) cmdCreate(d *datadriven.TestData) {
	if len(e.ids) > 0 {
		d.Fatalf(e.t, "the group exists")
	}
	e.seed = uint64(e.intArg(d, "seed", 1))
	if e.diskSeed != 0 {
		e.seed = e.diskSeed
	}
	e.retain = int64(e.intArg(d, "retention", 0))
	e.create(e.intArg(d, "n", 3))
	e.published, e.forks = map[uint64]uint64{}, map[uint64]int{}
}

// cmdPropose proposes count (default 1) appends of records values
// "<tag>-<i>" (tag<k> for the k-th of several; sequences follow on) and
// prints "pN: ..." for each when its answer comes (at once, or in a later
// command's events).
func (e *interactionEnv) cmdPropose(d *datadriven.TestData) string {
	id := e.idArg(d)
	r := e.upNode(d, id)
	producer, seq := uint64(e.intArg(d, "producer", 0)), uint64(e.intArg(d, "seq", 0))
	n, count := e.intArg(d, "records", 1), e.intArg(d, "count", 1)
	tag := "x"
	if d.HasArg("tag") {
		d.ScanArgs(e.t, "tag", &tag)
	}
	var b strings.Builder
	for k := 0; k < count; k++ {
		t := tag
		if count > 1 {
			t = fmt.Sprintf("%s%d", tag, k)
		}
		e.replies++
		name := fmt.Sprintf("p%d", e.replies)
		answered := false
		op := envOp(producer, seq+uint64(k*n), n, t)
		if d.HasArg("split") {
			op = &Op{RecordCount: 1, Frame: batch.EncodeSplit(nil, batch.Header{},
				batch.Split{MapVersion: 2, HashEnd: ^uint64(0), At: 1 << 63, Left: 1, Right: 2})}
		}
		op.Epoch = uint64(e.intArg(d, "epoch", 0))
		op.Reply = func(res Result) {
			answered = true
			fmt.Fprintf(&e.out, "%s (node %d): %s\n", name, id, describeResult(res))
		}
		r.Propose(op)
		b.WriteString(e.flush())
		if !answered {
			fmt.Fprintf(&b, "%s (node %d): pending\n", name, id)
		}
	}
	return b.String()
}

// envOp builds an append of n records "<tag>-<i>".
func envOp(producer, seq uint64, n int, tag string) *Op {
	recs := make([]batch.Record, n)
	for i := range recs {
		recs[i] = batch.Record{Key: []byte("k"), Value: []byte(fmt.Sprintf("%s-%d", tag, i))}
	}
	h := batch.Header{Type: batch.TypeData, ProducerID: producer, BaseSequence: seq}
	return &Op{ProducerID: producer, BaseSequence: seq, RecordCount: uint32(n), Frame: batch.Encode(nil, h, recs)}
}

func (e *interactionEnv) cmdFork(d *datadriven.TestData) {
	id := e.idArg(d)
	at, epoch := uint64(e.intArg(d, "at", 0)), uint64(e.intArg(d, "epoch", 0))
	e.upNode(d, id).ProposeFork(at, epoch, func(res ForkResult) {
		if res.Err != nil {
			fmt.Fprintf(&e.out, "fork (node %d): %s\n", id, describeErr(res.Err))
			return
		}
		fmt.Fprintf(&e.out, "fork (node %d): ok index=%d at=%d epoch=%d orphaned records=%d offsets [%d,%d)\n",
			id, res.Index, res.At, res.Epoch, res.Records, res.FirstOffset, res.NextOffset)
	})
}

// cmdSkip proposes on node <id> a skip to offset at= (ProposeSkip) and
// prints its answer when it comes.
func (e *interactionEnv) cmdSkip(d *datadriven.TestData) {
	id := e.idArg(d)
	e.upNode(d, id).ProposeSkip(uint64(e.intArg(d, "at", 0)), func(res SkipResult) {
		if res.Err != nil {
			fmt.Fprintf(&e.out, "skip (node %d): %s\n", id, describeErr(res.Err))
			return
		}
		fmt.Fprintf(&e.out, "skip (node %d): ok index=%d at=%d\n", id, res.Index, res.At)
	})
}

// cmdWriteLog runs the log writers of the nodes, held or not.
func (e *interactionEnv) cmdWriteLog(d *datadriven.TestData) {
	for _, id := range e.idArgs(d) {
		held := e.held[id]
		e.held[id] = false
		e.writeNode(id)
		e.held[id] = held
	}
}

// cmdDeliver delivers (or drops) the messages in flight that the filter
// selects, printing each.
func (e *interactionEnv) cmdDeliver(d *datadriven.TestData, b *strings.Builder) {
	f := msgFilter{from: uint64(e.intArg(d, "from", 0)), to: uint64(e.intArg(d, "to", 0))}
	if d.HasArg("type") {
		d.ScanArgs(e.t, "type", &f.typ)
	}
	took := e.takeMsgs(f, e.intArg(d, "n", -1))
	if len(took) == 0 {
		b.WriteString("no messages\n")
	}
	for _, em := range took {
		e.deliver(em, d.HasArg("drop"), b)
	}
}

// cmdRestart reopens a crashed node and prints what it publishes at once.
func (e *interactionEnv) cmdRestart(d *datadriven.TestData) string {
	id := e.idArg(d)
	if e.up(id) != nil {
		d.Fatalf(e.t, "node %d is up", id)
	}
	e.restart(id)
	nd := e.nodes[id]
	return fmt.Sprintf("node %d: restarted: durable index %d, offsets [%d,%d), committed=%d\n",
		id, nd.st.LastIndex(), nd.st.StartOffset(), nd.st.NextOffset(), nd.r.Committed())
}

// checkPublished reports a node whose published committed offset went
// back (a reader would see the log go backwards), unless a fork applied
// there since, and fails the test. A replica relearning its commit index
// after a machine's crash serves no reader (relearn.go): it is held to
// what it published before once it has relearned.
func (e *interactionEnv) checkPublished() string {
	var b strings.Builder
	for _, id := range e.ids {
		r := e.up(id)
		if r == nil || e.published == nil {
			continue
		}
		if r.Relearning() {
			continue
		}
		c := r.Committed()
		if forks := len(r.Orphans()); forks != e.forks[id] {
			e.forks[id], e.published[id] = forks, c
			continue
		}
		if c < e.published[id] {
			fmt.Fprintf(&b, "node %d: PUBLISHED COMMITTED OFFSET WENT BACK from %d to %d\n", id, e.published[id], c)
			e.t.Errorf("node %d: published committed offset went back from %d to %d", id, e.published[id], c)
		}
		e.published[id] = max(e.published[id], c)
	}
	return b.String()
}

// upNode returns node id's replica, failing the script if it is down.
func (e *interactionEnv) upNode(d *datadriven.TestData, id uint64) *Replica {
	r := e.up(id)
	if r == nil {
		d.Fatalf(e.t, "node %d is down", id)
	}
	return r
}

// idArgs returns the bare numeric arguments as node ids, every node if
// there are none.
func (e *interactionEnv) idArgs(d *datadriven.TestData) []uint64 {
	var ids []uint64
	for _, a := range d.CmdArgs {
		if len(a.Vals) > 0 {
			continue
		}
		if id, err := strconv.ParseUint(a.Key, 10, 64); err == nil {
			if e.nodes[id] == nil {
				d.Fatalf(e.t, "no node %d", id)
			}
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return slices.Clone(e.ids)
	}
	return ids
}

// idArg returns the one node id the command names.
func (e *interactionEnv) idArg(d *datadriven.TestData) uint64 {
	bare := 0
	for _, a := range d.CmdArgs {
		if _, err := strconv.ParseUint(a.Key, 10, 64); err == nil && len(a.Vals) == 0 {
			bare++
		}
	}
	if bare != 1 {
		d.Fatalf(e.t, "%s needs exactly one node id", d.Cmd)
	}
	return e.idArgs(d)[0]
}

func (e *interactionEnv) intArg(d *datadriven.TestData, key string, def int) int {
	if !d.HasArg(key) {
		return def
	}
	var v int
	d.ScanArgs(e.t, key, &v)
	return v
}

func (e *interactionEnv) intArgU(d *datadriven.TestData, key string) uint64 {
	if !d.HasArg(key) {
		d.Fatalf(e.t, "%s needs %s=", d.Cmd, key)
	}
	return uint64(e.intArg(d, key, 0))
}

// TestInteractionDetectsMismatch: the suite really compares. A script
// run unchanged passes; the same script with one expected line changed
// (a committed offset) fails, at that directive.
func TestInteractionDetectsMismatch(t *testing.T) {
	script := readScript(t, "quorum_ack")
	const right, wrong = "2: Follower term=1 lead=1 commit=2 applied=2 durable=2 committed=2", "2: Follower term=1 lead=1 commit=2 applied=2 durable=2 committed=3"
	if !strings.Contains(script, right) {
		t.Fatalf("quorum_ack.txt no longer holds %q: pick another line to change", right)
	}
	if fails, _ := runRecorded(t, script, 0, false); len(fails) != 0 {
		t.Fatalf("the unchanged script failed: %v", fails)
	}
	fails, _ := runRecorded(t, strings.Replace(script, right, wrong, 1), 0, false)
	if len(fails) != 1 || !strings.Contains(fails[0], "committed=3") || !strings.Contains(fails[0], "committed=2") {
		t.Fatalf("a wrong expected output gave failures %q, want one naming the line", fails)
	}
}

// TestInteractionCrashSeeds runs the scripts that crash nodes with other
// disk seeds, so that what each crash keeps of unsynced writes and
// directory changes (vfs.Mem.Crash) varies: their output may then differ
// from the golden (another election, another loss), but every restart
// must open, and no node's published committed offset may go back.
func TestInteractionCrashSeeds(t *testing.T) {
	seeds := uint64(16)
	if testing.Short() {
		seeds = 4
	}
	for _, name := range []string{"crash_restart", "stopped_leader", "snapshot_crash", "fork", "snapshot"} {
		script := readScript(t, name)
		outputs := map[string]bool{}
		for seed := uint64(2); seed < 2+seeds; seed++ {
			fails, out := runRecorded(t, script, seed, true)
			if len(fails) != 0 {
				t.Errorf("%s with disk seed %d: %v", name, seed, fails)
			}
			outputs[out] = true
		}
		t.Logf("%s: %d seeds, %d distinct outputs", name, seeds, len(outputs))
	}
}

// TestInteractionDiskFaults runs fail_op.txt failing, in turn, every
// disk operation a node makes from the fault's command on (until a run
// in which the fault never fires), on a follower (node 3) and on the
// leader (node 1), which then crashes and restarts: every restart must
// open, no published committed offset may go back, and check-logs must
// find the live replicas' committed logs equal.
func TestInteractionDiskFaults(t *testing.T) {
	script := readScript(t, "fail_op")
	for _, line := range []string{"fail-op 3 after=7\n", "crash 3\n", "restart 3\n"} {
		if !strings.Contains(script, line) {
			t.Fatalf("fail_op.txt no longer holds %q", line)
		}
	}
	for _, node := range []string{"3", "1"} {
		fired := 0
		for k := 1; k < 1000; k++ {
			s := strings.Replace(script, "fail-op 3 after=7\n", fmt.Sprintf("fail-op %s after=%d\n", node, k), 1)
			s = strings.Replace(s, "crash 3\n", "crash "+node+"\n", 1)
			s = strings.Replace(s, "restart 3\n", "restart "+node+"\n", 1)
			fails, out := runRecorded(t, s, 0, true)
			if len(fails) != 0 {
				t.Errorf("node %s failing its disk operation %d: %v", node, k, fails)
			}
			if !strings.Contains(out, "injected EIO") {
				break
			}
			fired++
		}
		if fired < 10 {
			t.Errorf("node %s: the fault fired in %d runs only", node, fired)
		}
		t.Logf("node %s: failed each of %d disk operations in turn", node, fired)
	}
}

// readScript returns the script testdata/interactions/<name>.txt, for a
// test that runs it other than as written; it skips under -rewrite,
// which is for TestInteraction.
func readScript(t *testing.T, name string) string {
	if f := flag.Lookup("rewrite"); f != nil && f.Value.String() == "true" {
		t.Skip("-rewrite rewrites the scripts")
	}
	b, err := os.ReadFile(filepath.Join("testdata/interactions", name+".txt"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// runRecorded runs script as TestInteraction would (with diskSeed: see
// runInteraction), on its own goroutine with a testing.TB that records
// failures instead of failing t, and returns them. With anyOutput, the
// expected output is not compared.
func runRecorded(t *testing.T, script string, diskSeed uint64, anyOutput bool) (fails []string, output string) {
	rec := &failRecorder{TB: t}
	var out strings.Builder
	done := make(chan struct{})
	go func() {
		defer close(done)
		run := runInteraction(rec, diskSeed)
		f := func(t testing.TB, d *datadriven.TestData) string {
			s := run(t, d)
			out.WriteString(s)
			return s
		}
		if anyOutput {
			// Run every directive, whatever it prints: only the harness's
			// own checks can fail.
			rewrite := flag.Lookup("rewrite").Value.String()
			flag.Set("rewrite", "true")
			defer flag.Set("rewrite", rewrite)
		}
		datadriven.RunTestFromStringAny(rec, script, f)
	}()
	<-done
	return rec.failures, out.String()
}

// failRecorder is a testing.TB whose failures are recorded; Fatal and
// FailNow end the calling goroutine, as testing's do.
type failRecorder struct {
	testing.TB
	mu       sync.Mutex
	failures []string
}

func (f *failRecorder) record(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures = append(f.failures, s)
}

func (f *failRecorder) Error(args ...any)                 { f.record(fmt.Sprint(args...)) }
func (f *failRecorder) Errorf(format string, args ...any) { f.record(fmt.Sprintf(format, args...)) }
func (f *failRecorder) Fatal(args ...any)                 { f.record(fmt.Sprint(args...)); runtime.Goexit() }
func (f *failRecorder) Fatalf(format string, args ...any) {
	f.record(fmt.Sprintf(format, args...))
	runtime.Goexit()
}
func (f *failRecorder) Fail()    { f.record("Fail") }
func (f *failRecorder) FailNow() { f.record("FailNow"); runtime.Goexit() }
func (f *failRecorder) Failed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.failures) > 0
}
