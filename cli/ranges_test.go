package cli_test

import (
	"context"
	"encoding/json"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/portlock"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// describeNode is a Log server that answers DescribeStream with a canned
// response (this node's view of the stream) and records CreateStream
// requests: one node of a multi-region cluster as `geolog ranges` sees it.
type describeNode struct {
	geologv1.UnimplementedLogServer
	addr string

	mu       sync.Mutex
	describe *geologv1.DescribeStreamResponse // nil: STREAM_NOT_FOUND
	created  []*geologv1.CreateStreamRequest
}

func startDescribeNode(t *testing.T) *describeNode {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &describeNode{addr: lis.Addr().String()}
	g := grpc.NewServer()
	geologv1.RegisterLogServer(g, n)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return n
}

func (n *describeNode) set(resp *geologv1.DescribeStreamResponse) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.describe = resp
}

func (n *describeNode) DescribeStream(ctx context.Context, req *geologv1.DescribeStreamRequest) (*geologv1.DescribeStreamResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.describe == nil || n.describe.GetStream().GetName() != req.GetName() {
		return nil, rpcerr.ToStatus(apierr.New(apierr.StreamNotFound, "stream %q not found", req.GetName()))
	}
	return n.describe, nil
}

func (n *describeNode) CreateStream(ctx context.Context, req *geologv1.CreateStreamRequest) (*geologv1.CreateStreamResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.created = append(n.created, req)
	regions := req.GetRegions()
	if len(regions) == 0 {
		regions = []string{"local"}
	}
	homes := make([]string, req.GetRangeCount())
	for i := range homes {
		switch req.GetHomeRegion() {
		case "spread":
			homes[i] = regions[i%len(regions)]
		case "":
			homes[i] = regions[0]
		default:
			homes[i] = req.GetHomeRegion()
		}
	}
	return &geologv1.CreateStreamResponse{Stream: &geologv1.StreamInfo{
		Name: req.GetName(), RangeCount: req.GetRangeCount(), Regions: regions, RangeHomes: homes,
	}}, nil
}

// chatInfo is a 2-range stream in us, eu and ap.
var chatInfo = &geologv1.StreamInfo{Name: "chat", RangeCount: 2, Regions: []string{"us", "eu", "ap"}, RangeHomes: []string{"us", "eu"}}

func rangeInfo(rng uint32, home string, epoch, tail uint64, leader string, repl ...*geologv1.RegionProgress) *geologv1.RangeInfo {
	return &geologv1.RangeInfo{Range: rng, HomeRegion: home, Epoch: epoch, TailOffset: tail, Leader: leader, Status: "ok", Replication: repl}
}

func progress(region string, applied, lag uint64, timeLagMs int64, state string) *geologv1.RegionProgress {
	return &geologv1.RegionProgress{Region: region, AppliedEndOffset: applied, OffsetLag: lag, TimeLagMillis: timeLagMs,
		HeartbeatAgeMillis: 20, State: state}
}

// cells splits a tabwriter line into its cells (two or more spaces apart;
// cells themselves hold single spaces).
func cells(line string) []string {
	return regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(line), -1)
}

// rangesCluster sets up the nodes of a 3-region cluster as they answer in
// the middle of a run, and returns their addresses:
//
//   - us1 leads range 0 in its home (us): tail 100, lists eu (at 90, 45ms
//     behind; its replicator's offset lag, 7, is from before the tail
//     reached 100) but not ap (its task has not started yet).
//   - us2 follows range 0 and mirrors range 1 without leading it: it
//     reports no replication at all.
//   - eu1 leads range 0's eu mirror (its own view: 95, lag 0: it has not
//     heard of the newer records yet) and range 1 in its home (eu) without
//     any replicator task started: it reports nothing for range 1.
//   - ap1 leads both ap mirrors: range 0 at 80 (lag 20, 130ms) and range 1
//     at 7 (lag 3, 200ms), not yet having heard from the home (a state
//     "mirror: ..." still marks a mirror's own report, never a home's).
//   - a dead address, skipped.
//
// Range 1's home leader (eu1) lists no mirrors, so range 1's tail, epoch
// and leader are unknown, and so are its us mirror and its eu home.
func rangesCluster(t *testing.T) (us1, us2, eu1, ap1, dead string) {
	t.Helper()
	nodes := make([]*describeNode, 4)
	for i := range nodes {
		nodes[i] = startDescribeNode(t)
	}
	u1, u2, e1, a1 := nodes[0], nodes[1], nodes[2], nodes[3]
	u1.set(&geologv1.DescribeStreamResponse{Stream: chatInfo, Ranges: []*geologv1.RangeInfo{
		rangeInfo(0, "us", 3, 100, u1.addr, progress("eu", 90, 7, 45, "streaming")),
		rangeInfo(1, "eu", 3, 6, u2.addr),
	}})
	u2.set(&geologv1.DescribeStreamResponse{Stream: chatInfo, Ranges: []*geologv1.RangeInfo{
		rangeInfo(0, "us", 3, 99, u1.addr),
		rangeInfo(1, "eu", 3, 6, u2.addr),
	}})
	e1.set(&geologv1.DescribeStreamResponse{Stream: chatInfo, Ranges: []*geologv1.RangeInfo{
		rangeInfo(0, "us", 3, 95, e1.addr, progress("eu", 95, 0, 12, "mirror")),
		rangeInfo(1, "eu", 3, 10, e1.addr),
	}})
	a1.set(&geologv1.DescribeStreamResponse{Stream: chatInfo, Ranges: []*geologv1.RangeInfo{
		rangeInfo(0, "us", 3, 80, a1.addr, progress("ap", 80, 20, 130, "mirror")),
		rangeInfo(1, "eu", 3, 7, a1.addr, &geologv1.RegionProgress{Region: "ap", AppliedEndOffset: 7, OffsetLag: 3,
			TimeLagMillis: 200, State: "mirror: no heartbeat yet"}),
	}})
	dead = portlock.Addr(t) // held, and nothing listens on it
	return u1.addr, u2.addr, e1.addr, a1.addr, dead
}

func TestRangesMergesEveryNodesView(t *testing.T) {
	us1, us2, eu1, ap1, dead := rangesCluster(t)
	addrs := []string{dead, ap1, eu1, us2, us1}
	out, errOut, code := run(t, testCtx(t), "", "--addr", strings.Join(addrs, ","), "--retries", "0", "ranges", "chat")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(errOut, dead) || !strings.Contains(errOut, "skipped") {
		t.Errorf("stderr does not report the dead node %s as skipped: %q", dead, errOut)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	want := [][]string{
		{"RANGE", "HOME", "EPOCH", "TAIL", "LEADER", "us", "eu", "ap"},
		// The home leader's view of eu wins over eu's own (stale) one, its
		// offset lag brought up to tail - applied; ap, which the home does
		// not list yet, comes from ap's leader.
		{"0", "us", "3", "100", us1, "100 home", "90 lag 10/45ms", "80 lag 20/130ms"},
		// No home leader report: tail, epoch, leader and both home and us
		// unknown; ap's own view, its replicator state shown.
		{"1", "eu", "?", "?", "?", "?", "?", "7 lag 3/200ms mirror: no heartbeat yet"},
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(want), out)
	}
	for i, w := range want {
		if got := cells(lines[i]); !slices.Equal(got, w) {
			t.Errorf("line %d:\n got %q\nwant %q", i, got, w)
		}
	}

	// The answer does not depend on the order the nodes are listed in.
	slices.Reverse(addrs)
	out2, _, code := run(t, testCtx(t), "", "--addr", strings.Join(addrs, ","), "--retries", "0", "ranges", "chat")
	if code != 0 || out2 != out {
		t.Errorf("reversed addresses: exit %d, output\n%s\nwant\n%s", code, out2, out)
	}
}

func TestRangesJSON(t *testing.T) {
	us1, us2, eu1, ap1, _ := rangesCluster(t)
	out := mustRun(t, strings.Join([]string{us1, us2, eu1, ap1}, ","), "", "ranges", "chat", "--json")
	type regionJ struct {
		Home             bool    `json:"home"`
		AppliedEndOffset *uint64 `json:"applied_end_offset"`
		OffsetLag        *uint64 `json:"offset_lag"`
		TimeLagMs        *int64  `json:"time_lag_ms"`
		State            string  `json:"state"`
		Source           string  `json:"source"`
	}
	var got []struct {
		Range      uint32             `json:"range"`
		HomeRegion string             `json:"home_region"`
		Epoch      *uint64            `json:"epoch"`
		TailOffset *uint64            `json:"tail_offset"`
		Leader     string             `json:"leader"`
		Regions    map[string]regionJ `json:"regions"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(got) != 2 {
		t.Fatalf("%d ranges: %s", len(got), out)
	}
	r0, r1 := got[0], got[1]
	if r0.HomeRegion != "us" || r0.Epoch == nil || *r0.Epoch != 3 || r0.TailOffset == nil || *r0.TailOffset != 100 || r0.Leader != us1 {
		t.Errorf("range 0: %+v", r0)
	}
	if us := r0.Regions["us"]; !us.Home || us.AppliedEndOffset == nil || *us.AppliedEndOffset != 100 {
		t.Errorf("range 0 us: %+v", us)
	}
	if eu := r0.Regions["eu"]; eu.AppliedEndOffset == nil || *eu.AppliedEndOffset != 90 || *eu.OffsetLag != 10 ||
		*eu.TimeLagMs != 45 || eu.State != "streaming" || eu.Source != us1 {
		t.Errorf("range 0 eu (the home leader's view): %+v", eu)
	}
	if ap := r0.Regions["ap"]; ap.AppliedEndOffset == nil || *ap.AppliedEndOffset != 80 || ap.State != "mirror" || ap.Source != ap1 {
		t.Errorf("range 0 ap (its own leader's view): %+v", ap)
	}
	if r1.Epoch != nil || r1.TailOffset != nil || r1.Leader != "" {
		t.Errorf("range 1 without a home leader report: %+v", r1)
	}
	for _, reg := range []string{"us", "eu"} {
		if rj := r1.Regions[reg]; rj.AppliedEndOffset != nil || rj.OffsetLag != nil || rj.TimeLagMs != nil {
			t.Errorf("range 1 %s should be unknown (null): %+v", reg, rj)
		}
	}
	if ap := r1.Regions["ap"]; ap.AppliedEndOffset == nil || *ap.AppliedEndOffset != 7 || *ap.OffsetLag != 3 || *ap.TimeLagMs != 200 {
		t.Errorf("range 1 ap: %+v", ap)
	}
}

// When a leadership change races the calls, two nodes may both report as
// the home leader: the newer epoch, then the longer tail, wins; and a
// replicator in trouble shows its state.
func TestRangesPicksTheMostAdvancedHomeReport(t *testing.T) {
	old, cur := startDescribeNode(t), startDescribeNode(t)
	info := &geologv1.StreamInfo{Name: "s", RangeCount: 1, Regions: []string{"us", "eu"}}
	old.set(&geologv1.DescribeStreamResponse{Stream: info, Ranges: []*geologv1.RangeInfo{
		rangeInfo(0, "us", 4, 500, old.addr, progress("eu", 400, 100, 900, "streaming")),
	}})
	cur.set(&geologv1.DescribeStreamResponse{Stream: info, Ranges: []*geologv1.RangeInfo{
		rangeInfo(0, "us", 5, 450, cur.addr, &geologv1.RegionProgress{Region: "eu", AppliedEndOffset: 420, OffsetLag: 30,
			TimeLagMillis: 1500, State: "backoff", LastError: "connection refused"}),
	}})
	out := mustRun(t, old.addr+","+cur.addr, "", "ranges", "s")
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	want := []string{"0", "us", "5", "450", cur.addr, "450 home", "420 lag 30/1.5s backoff"}
	if len(lines) != 2 || !slices.Equal(cells(lines[1]), want) {
		t.Fatalf("got\n%s\nwant row %q", out, want)
	}
}

// A single-region stream has no mirrors: the node naming itself leader is
// the home leader.
func TestRangesSingleRegion(t *testing.T) {
	leader, follower := startDescribeNode(t), startDescribeNode(t)
	info := &geologv1.StreamInfo{Name: "s", RangeCount: 1, Regions: []string{"local"}}
	leader.set(&geologv1.DescribeStreamResponse{Stream: info, Ranges: []*geologv1.RangeInfo{rangeInfo(0, "local", 1, 42, leader.addr)}})
	follower.set(&geologv1.DescribeStreamResponse{Stream: info, Ranges: []*geologv1.RangeInfo{rangeInfo(0, "local", 1, 41, leader.addr)}})
	out := mustRun(t, follower.addr+","+leader.addr, "", "ranges", "s")
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	want := []string{"0", "local", "1", "42", leader.addr, "42 home"}
	if len(lines) != 2 || !slices.Equal(cells(lines[1]), want) {
		t.Fatalf("got\n%s\nwant row %q", out, want)
	}
}

func TestRangesErrors(t *testing.T) {
	n := startDescribeNode(t)
	ctx := testCtx(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		// Every node failing is an error; the per-node errors are printed.
		{[]string{"--addr", n.addr, "ranges", "nope"}, 1, "STREAM_NOT_FOUND"},
		{[]string{"--addr", n.addr, "ranges"}, 2, "usage: ranges"},
		{[]string{"--addr", " , ", "ranges", "s"}, 2, "names no node"},
	} {
		_, errOut, code := run(t, ctx, "", tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("geolog %v: exit %d, stderr %q; want exit %d mentioning %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}

func TestStreamsCreateRegionsAndHome(t *testing.T) {
	n := startDescribeNode(t)
	out := mustRun(t, n.addr, "", "streams", "create", "chat", "--ranges", "4", "--regions", "us, eu,ap", "--home", "spread")
	if !strings.Contains(out, "created stream chat with 4 ranges in us,eu,ap") || !strings.Contains(out, "range homes: 0=us 1=eu 2=ap 3=us") {
		t.Fatalf("create printed %q", out)
	}
	mustRun(t, n.addr, "", "streams", "create", "other", "--regions", "us,eu", "--home", "eu")
	mustRun(t, n.addr, "", "streams", "create", "plain")
	n.mu.Lock()
	reqs := n.created
	n.mu.Unlock()
	if len(reqs) != 3 {
		t.Fatalf("%d create requests", len(reqs))
	}
	if r := reqs[0]; !slices.Equal(r.GetRegions(), []string{"us", "eu", "ap"}) || r.GetHomeRegion() != "spread" || r.GetRangeCount() != 4 {
		t.Errorf("request 0: %v", r)
	}
	if r := reqs[1]; !slices.Equal(r.GetRegions(), []string{"us", "eu"}) || r.GetHomeRegion() != "eu" {
		t.Errorf("request 1: %v", r)
	}
	if r := reqs[2]; len(r.GetRegions()) != 0 || r.GetHomeRegion() != "" {
		t.Errorf("request 2 (defaults): %v", r)
	}

	// A home outside the listed regions is refused before any request.
	_, errOut, code := run(t, testCtx(t), "", "--addr", n.addr, "streams", "create", "x", "--regions", "us,eu", "--home", "ap")
	if code != 2 || !strings.Contains(errOut, "--home ap is not one of --regions us,eu") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.created) != 3 {
		t.Errorf("a refused command sent a request: %d requests", len(n.created))
	}
}
