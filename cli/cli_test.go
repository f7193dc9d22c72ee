package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/cli"
	"github.com/geolog/geolog/client/clienttest"
	"github.com/geolog/geolog/keyspace"
)

// run runs the tool in-process and returns its output and exit code.
func run(t *testing.T, ctx context.Context, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb syncBuffer
	code = cli.Run(ctx, args, strings.NewReader(stdin), &out, &errb)
	return out.String(), errb.String(), code
}

// syncBuffer is a bytes.Buffer safe for the concurrent writes of follow and
// bench progress.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startFake(t *testing.T) *clienttest.Server {
	t.Helper()
	s, err := clienttest.Start(clienttest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// mustRun fails the test unless the command exits 0.
func mustRun(t *testing.T, addr, stdin string, args ...string) string {
	t.Helper()
	out, errOut, code := run(t, testCtx(t), stdin, append([]string{"--addr", addr}, args...)...)
	if code != 0 {
		t.Fatalf("geolog %v: exit %d\nstdout: %s\nstderr: %s", args, code, out, errOut)
	}
	return out
}

func TestStreamsCommands(t *testing.T) {
	addr := startFake(t).Addr()
	testStreamsCommands(t, addr)
}

func testStreamsCommands(t *testing.T, addr string) {
	out := mustRun(t, addr, "", "streams", "create", "chat", "--ranges", "4", "--retention-age", "168h", "--retention-bytes", "1000000")
	if !strings.Contains(out, "created stream chat with 4 ranges") {
		t.Fatalf("create printed %q", out)
	}
	// Global flags also work after the command.
	mustRun(t, addr, "", "streams", "create", "--ranges", "2", "other")

	out = mustRun(t, addr, "", "streams", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME") {
		t.Fatalf("list printed %q", out)
	}
	fields := strings.Fields(lines[1])
	if fields[0] != "chat" || fields[1] != "4" || fields[3] != "168h0m0s" || fields[4] != "1000000" {
		t.Fatalf("list row %q", lines[1])
	}

	var list []struct {
		Name       string `json:"name"`
		RangeCount int    `json:"range_count"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, addr, "", "streams", "list", "--json")), &list); err != nil || len(list) != 2 {
		t.Fatalf("list --json: %v %+v", err, list)
	}

	out = mustRun(t, addr, "", "streams", "describe", "chat")
	var rows [][]string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 9 && f[0] != "RANGE" {
			rows = append(rows, f)
		}
	}
	if len(rows) != 4 {
		t.Fatalf("describe printed %q", out)
	}
	for i, f := range rows {
		want := fmt.Sprintf("%016x-%016x", keyspace.HashStart(uint32(i), 4), keyspace.HashEnd(uint32(i), 4))
		if f[0] != strconv.Itoa(i) || f[1] != want || f[2] != "0" || f[3] != "0" {
			t.Fatalf("describe row %d: %v, want slice %s", i, f, want)
		}
	}
	var desc struct {
		Stream struct{ Name string } `json:"stream"`
		Ranges []struct {
			Range  int    `json:"range"`
			Status string `json:"status"`
		} `json:"ranges"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, addr, "", "streams", "describe", "chat", "--json")), &desc); err != nil ||
		len(desc.Ranges) != 4 || desc.Stream.Name != "chat" {
		t.Fatalf("describe --json: %v %+v", err, desc)
	}

	ctx := testCtx(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"streams", "create", "chat", "--ranges", "1"}, 1, "STREAM_EXISTS"},
		{[]string{"streams", "describe", "nope"}, 1, "STREAM_NOT_FOUND"},
		{[]string{"streams", "create"}, 2, "usage"},
		{[]string{"streams", "create", "x", "--ranges", "0"}, 2, "--ranges"},
		{[]string{"streams", "frob"}, 2, "unknown streams subcommand"},
		{[]string{"frob"}, 2, "unknown command"},
		{[]string{"streams", "list", "--nope"}, 2, "flag provided but not defined"},
		{[]string{}, 2, "usage:"},
	} {
		_, errOut, code := run(t, ctx, "", append([]string{"--addr", addr}, tc.args...)...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("geolog %v: exit %d, stderr %q; want exit %d mentioning %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}

func TestAddrFromEnvironment(t *testing.T) {
	fake := startFake(t)
	fake.MustCreateStream("s", 1)
	t.Setenv("GEOLOG_ADDR", fake.Addr())
	out, errOut, code := run(t, testCtx(t), "", "streams", "list")
	if code != 0 || !strings.Contains(out, "s ") {
		t.Fatalf("exit %d: %s %s", code, out, errOut)
	}
}

func TestUnreachableNode(t *testing.T) {
	_, errOut, code := run(t, testCtx(t), "", "--addr", "127.0.0.1:1", "--retries", "0", "streams", "list")
	if code != 1 || !strings.Contains(errOut, "is a geolog node listening at 127.0.0.1:1") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}

// consumed is one parsed line of consume's text output.
type consumed struct {
	rng    uint32
	offset uint64
	key    string
	value  string
}

func parseConsumed(t *testing.T, out string) []consumed {
	t.Helper()
	var recs []consumed
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if l == "" {
			continue
		}
		f := strings.SplitN(l, "\t", 4)
		if len(f) != 4 {
			t.Fatalf("bad consume line %q", l)
		}
		r, _ := strconv.Atoi(f[0])
		o, _ := strconv.ParseUint(f[1], 10, 64)
		recs = append(recs, consumed{uint32(r), o, f[2], f[3]})
	}
	return recs
}

func TestProduceAndConsume(t *testing.T) {
	addr := startFake(t).Addr()
	testProduceAndConsume(t, addr)
}

func testProduceAndConsume(t *testing.T, addr string) {
	mustRun(t, addr, "", "streams", "create", "events", "--ranges", "3")

	// key<TAB>value lines; -v prints range and offset per line in order.
	var in strings.Builder
	for i := range 30 {
		fmt.Fprintf(&in, "user-%d\tevent %d\n", i%5, i)
	}
	out := mustRun(t, addr, in.String(), "produce", "events", "--tab", "-v")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 30 {
		t.Fatalf("produce -v printed %d lines: %q", len(lines), out)
	}
	nextOffset := map[uint32]uint64{}
	for i, l := range lines {
		var r uint32
		var o uint64
		if _, err := fmt.Sscanf(l, "%d\t%d", &r, &o); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if want := keyspace.RangeForKey(fmt.Appendf(nil, "user-%d", i%5), 3); r != want {
			t.Fatalf("record %d went to range %d, want %d", i, r, want)
		}
		if o != nextOffset[r] {
			t.Fatalf("record %d at offset %d of range %d, want %d", i, o, r, nextOffset[r])
		}
		nextOffset[r]++
	}

	// Constant key, values from flags, JSON key field.
	mustRun(t, addr, "", "produce", "events", "--key", "user-0", "--value", "a", "--value", "b", "--header", "src=cli")
	mustRun(t, addr, `{"user":"user-1","n":1}`+"\n"+`{"user":"user-1","n":2}`+"\n", "produce", "events", "--key-field", "user")

	// Everything back, per key in order.
	recs := parseConsumed(t, mustRun(t, addr, "", "consume", "events"))
	if len(recs) != 34 {
		t.Fatalf("consumed %d records, want 34", len(recs))
	}
	perKey := map[string][]string{}
	for _, r := range recs {
		perKey[r.key] = append(perKey[r.key], r.value)
	}
	if got := fmt.Sprint(perKey["user-0"]); got != "[event 0 event 5 event 10 event 15 event 20 event 25 a b]" {
		t.Fatalf("user-0: %s", got)
	}
	if got := perKey["user-1"]; len(got) != 8 || got[6] != `{"user":"user-1","n":1}` {
		t.Fatalf("user-1: %q", got)
	}

	// One range, from an offset, bounded; JSON output.
	r0 := keyspace.RangeForKey([]byte("user-0"), 3)
	out = mustRun(t, addr, "", "consume", "events", "--range", strconv.Itoa(int(r0)), "--from-offset", "1", "--max", "2", "--json")
	var js []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		js = append(js, m)
	}
	if len(js) != 2 || js[0]["offset"].(float64) != 1 || js[0]["append_time"] == "" {
		t.Fatalf("consume --json: %v", js)
	}

	// From a time: only what was appended after it.
	time.Sleep(2 * time.Millisecond) // the fake's clock must move past the last append
	mark := time.Now().UTC().Format(time.RFC3339Nano)
	time.Sleep(2 * time.Millisecond)
	mustRun(t, addr, "", "produce", "events", "--key", "late", "--value", "after-mark")
	recs = parseConsumed(t, mustRun(t, addr, "", "consume", "events", "--from-time", mark))
	if len(recs) != 1 || recs[0].value != "after-mark" {
		t.Fatalf("consume --from-time: %+v", recs)
	}

	ctx := testCtx(t)
	for _, tc := range []struct {
		args  []string
		stdin string
		code  int
		want  string
	}{
		{[]string{"produce", "events", "--tab"}, "no-tab-here\n", 2, "no TAB"},
		{[]string{"produce", "events", "--key-field", "id"}, "not json\n", 2, "not a JSON object"},
		{[]string{"produce", "events", "--key", "a", "--tab"}, "", 2, "exclude each other"},
		{[]string{"produce", "nope", "--value", "x"}, "", 1, "STREAM_NOT_FOUND"},
		{[]string{"consume", "events", "--range", "9"}, "", 2, "has ranges 0..2"},
		{[]string{"consume", "events", "--from-time", "yesterday"}, "", 2, "--from-time"},
		{[]string{"consume", "nope"}, "", 1, "STREAM_NOT_FOUND"},
	} {
		_, errOut, code := run(t, ctx, tc.stdin, append([]string{"--addr", addr}, tc.args...)...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("geolog %v: exit %d, stderr %q; want exit %d mentioning %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}

func TestConsumeFollow(t *testing.T) {
	addr := startFake(t).Addr()
	testConsumeFollow(t, addr)
}

func testConsumeFollow(t *testing.T, addr string) {
	mustRun(t, addr, "", "streams", "create", "tail", "--ranges", "2")
	mustRun(t, addr, "", "produce", "tail", "--key", "k", "--value", "old")

	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(testCtx(t), []string{"--addr", addr, "consume", "tail", "--follow", "--max", "4"},
			strings.NewReader(""), &out, &errOut)
	}()
	// Produce while it follows; it exits after the 4th record.
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		select {
		case code := <-done:
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut.String())
			}
			recs := parseConsumed(t, out.String())
			if len(recs) != 4 || recs[0].value != "old" {
				t.Fatalf("followed %+v", recs)
			}
			return
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("follow did not stop at --max; output %q", out.String())
		}
		mustRun(t, addr, "", "produce", "tail", "--key", "k", "--value", fmt.Sprint("new ", i))
		time.Sleep(5 * time.Millisecond)
	}
}

func TestFollowStopsOnInterrupt(t *testing.T) {
	fake := startFake(t)
	fake.MustCreateStream("s", 1)
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, []string{"--addr", fake.Addr(), "consume", "s", "--follow"}, strings.NewReader(""), io.Discard, io.Discard)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for fake.Stats().Subscriptions == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no subscription")
		}
		time.Sleep(2 * time.Millisecond)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d after interrupt", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("follow did not stop")
	}
}

// TestFollowFailsWhenNodeDies: a follow whose node stops exits non-zero and
// says why (it used to exit 0 without a word, so a pipeline reading from it
// stopped silently).
func TestFollowFailsWhenNodeDies(t *testing.T) {
	fake := startFake(t)
	fake.MustCreateStream("s", 2)
	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(testCtx(t), []string{"--addr", fake.Addr(), "consume", "s", "--follow"},
			strings.NewReader(""), &out, &errOut)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for fake.Stats().Subscriptions < 2 {
		if time.Now().After(deadline) {
			t.Fatal("no subscriptions")
		}
		time.Sleep(2 * time.Millisecond)
	}
	fake.Close()
	select {
	case code := <-done:
		if code == 0 {
			t.Fatalf("follow exited 0 after its node died; stderr %q", errOut.String())
		}
		if strings.TrimSpace(errOut.String()) == "" {
			t.Fatal("follow failed without a word on stderr")
		}
		t.Logf("exit %d: %s", code, errOut.String())
	case <-time.After(60 * time.Second):
		t.Fatal("follow did not end after its node died")
	}
}

// TestProduceStopsOnInterrupt: an interrupt while produce waits on standard
// input ends it (it used to ignore Ctrl-C until the input closed), and the
// lines read before it are delivered.
func TestProduceStopsOnInterrupt(t *testing.T) {
	fake := startFake(t)
	fake.MustCreateStream("s", 1)
	stdin, feed := io.Pipe()
	defer feed.Close()
	ctx, cancel := context.WithCancel(testCtx(t))
	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, []string{"--addr", fake.Addr(), "produce", "s", "--key", "k"}, stdin, &out, &errOut)
	}()
	if _, err := io.WriteString(feed, "one\ntwo\n"); err != nil {
		t.Fatal(err)
	}
	// Both lines are produced and acked while stdin stays open; then the
	// interrupt comes while produce is blocked reading the next line.
	deadline := time.Now().Add(20 * time.Second)
	for len(parseConsumed(t, mustRun(t, fake.Addr(), "", "consume", "s"))) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the lines written to stdin were not produced")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case code := <-done:
		if code == 0 || !strings.Contains(errOut.String(), "interrupted") {
			t.Fatalf("exit %d, stderr %q; want a non-zero exit saying it was interrupted", code, errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("produce ignored the interrupt while reading stdin")
	}
	recs := parseConsumed(t, mustRun(t, fake.Addr(), "", "consume", "s"))
	if len(recs) != 2 || recs[0].value != "one" || recs[1].value != "two" {
		t.Fatalf("read back %+v, want the two lines read before the interrupt", recs)
	}
}

// TestTimeoutBoundsTheWholeCall: --timeout bounds a call with its retries
// (it bounded each attempt: --timeout 3s took 9.3 s). With 40 retries of up
// to 2 s backoff the call would take over a minute unbounded; the bound
// here, 1 s, is given 20 s of slack for a loaded machine.
func TestTimeoutBoundsTheWholeCall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	_, errOut, code := run(t, ctx, "", "--addr", "127.0.0.1:1", "--retries", "40", "--timeout", "1s", "streams", "list")
	took := time.Since(start)
	if code != 1 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if took > 21*time.Second {
		t.Fatalf("--timeout 1s took %v", took)
	}
	t.Logf("--timeout 1s: %v, %q", took, errOut)
}

// TestHelpAndVersion: "help <command>" shows that command's usage (it
// printed the top-level help), "help <command> <sub>" its flags, and
// version names the build.
func TestHelpAndVersion(t *testing.T) {
	ctx := testCtx(t)
	for _, tc := range []struct {
		args      []string
		want, not string
	}{
		{[]string{"help", "produce"}, "-key-field", "commands:"},
		{[]string{"help", "streams"}, "streams describe <name>", "commands:"},
		{[]string{"help", "streams", "create"}, "-ranges", "commands:"},
		{[]string{"help"}, "commands:", ""},
		{[]string{"version"}, "geolog dev (", ""},
	} {
		out, errOut, code := run(t, ctx, "", tc.args...)
		if code != 0 || !strings.Contains(out, tc.want) || (tc.not != "" && strings.Contains(out, tc.not)) {
			t.Errorf("geolog %v: exit %d, stdout %q, stderr %q; want %q, not %q", tc.args, code, out, errOut, tc.want, tc.not)
		}
	}
	if _, _, code := run(t, ctx, "", "help", "nosuch"); code != 2 {
		t.Errorf("help nosuch: exit %d, want 2", code)
	}
}

// TestAddrOfAnHTTPServer: pointed at an HTTP port (a node's metrics), the
// tool says so instead of leaving an HTTP/2 frame error unexplained.
func TestAddrOfAnHTTPServer(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	_, errOut, code := run(t, testCtx(t), "", "--addr", addr, "--retries", "0", "streams", "list")
	if code != 1 || !strings.Contains(errOut, "answers HTTP, not gRPC") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}
