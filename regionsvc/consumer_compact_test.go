package regionsvc

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/geolog/geolog/cursors"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// TestCursorStreamCompacted: the cursor stream is compacted by key. Many
// commits to the same positions, a group's life, a reset and a delete
// (tombstones) are compacted away to about one record per key, the
// deleted positions' tombstones stay (within the delete retention), the
// compacted log applied to a new State gives what the node serves, and a
// restarted node, whose applier rebuilds from the compacted log with its
// holes and markers, serves the same cursors and group, and still keeps
// every register where it was.
func TestCursorStreamCompacted(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := func(cfg *Config) {
		compactingNode()(cfg)
		cfg.CursorRanges = 2
		cfg.CursorCompactionLag = -1 // compact at once
	}
	n, lc := testNode(t, dir, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	createStream(t, lc, "chat", 4)
	for r := uint32(0); r < 4; r++ {
		appendN(t, ctx, lc, "chat", r, 100)
	}
	cc := consumerClient(t, n.Addr())
	names := make([]string, 12)
	for i := range names {
		names[i] = fmt.Sprintf("dev-%d", i)
	}
	written := 0
	for round := uint64(1); round <= 10; round++ {
		for _, c := range names {
			var ps []*geologv1.CursorPosition
			for r := uint32(0); r < 4; r++ {
				ps = append(ps, &geologv1.CursorPosition{Stream: "chat", Range: r, Offset: round * 10, Metadata: []byte(c)})
			}
			commitRetrying(t, ctx, cc, &geologv1.CommitCursorsRequest{Cursor: c, Positions: ps})
			written += len(ps)
		}
	}
	groupLife(t, ctx, cc)
	if _, err := cc.ResetGroup(ctx, &geologv1.ResetGroupRequest{Group: "dev-1", Stream: "chat", To: &geologv1.ResetGroupRequest_ToOffset{ToOffset: 5}}); err != nil {
		t.Fatal(err)
	}
	if _, err := cc.DeleteGroup(ctx, &geologv1.DeleteGroupRequest{Group: "dev-2"}); err != nil {
		t.Fatal(err)
	}
	want := servedCursors(t, ctx, cc, names)

	// Compacted: no key twice below the last marker, so about one record
	// per key in all.
	var logs [][]cursors.Record
	waitUntil(t, ctx, 2*time.Minute, "the cursor stream compacted", func() bool {
		logs = readCursorLogs(t, ctx, lc, 2)
		total := 0
		for _, l := range logs {
			total += len(l)
		}
		return total < written/4
	})
	tombstones := 0
	rebuilt := map[uint32]*cursors.State{}
	for r, l := range logs {
		s := cursors.NewState(cursors.Limits{})
		for _, rec := range l {
			if rec.Tombstone {
				tombstones++
			}
			if err := s.Apply(rec); err != nil {
				t.Fatalf("range %d: %v", r, err)
			}
		}
		rebuilt[uint32(r)] = s
	}
	if tombstones != 4 {
		t.Fatalf("%d tombstones in the compacted log, want dev-2's 4", tombstones)
	}
	for _, name := range append(names, "billing") {
		s := rebuilt[n.cursorRangeOf(name)]
		if got := fmt.Sprint(positionsOf(s.Positions(name, ""))); got != want[name] {
			t.Errorf("%s from the compacted log: %s, served %s", name, got, want[name])
		}
	}
	if g := rebuilt[n.cursorRangeOf("billing")].Group("billing"); g == nil || g.Live() || g.Epoch == 0 {
		t.Fatalf("billing from the compacted log: %+v", g)
	}

	// A restart applies the compacted log.
	n.Close()
	n2, lc2 := testNode(t, dir, cfg)
	cc2 := consumerClient(t, n2.Addr())
	again := servedCursors(t, ctx, cc2, names)
	for name, w := range want {
		if again[name] != w {
			t.Errorf("%s after the restart: %s, before %s", name, again[name], w)
		}
	}
	// Registers hold: lower commits do not apply, higher ones do.
	appendN(t, ctx, lc2, "chat", 0, 10)
	resp, err := cc2.CommitCursors(ctx, &geologv1.CommitCursorsRequest{Cursor: "dev-3", Positions: []*geologv1.CursorPosition{
		{Stream: "chat", Range: 0, Offset: 105}, {Stream: "chat", Range: 1, Offset: 50}}})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Results[0].Applied || resp.Results[1].Applied || resp.Results[1].Position.Offset != 100 {
		t.Fatalf("commits after the restart: %v", resp.Results)
	}
	// A group created again under billing's name continues its epochs.
	a, err := cc2.JoinGroup(ctx, &geologv1.JoinGroupRequest{Group: "billing", MemberId: "z", Stream: "chat"})
	if err != nil {
		t.Fatal(err)
	}
	if old := rebuilt[n.cursorRangeOf("billing")].Group("billing").Epoch; a.MemberEpoch <= old {
		t.Fatalf("billing joined again at epoch %d, not above %d", a.MemberEpoch, old)
	}
}

// groupLife runs the group billing on chat: two members join, hand over,
// commit and leave.
func groupLife(t *testing.T, ctx context.Context, cc geologv1.ConsumerClient) {
	t.Helper()
	a, err := cc.JoinGroup(ctx, &geologv1.JoinGroupRequest{Group: "billing", MemberId: "a", Stream: "chat"})
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 5; i++ {
		if _, err := cc.CommitCursors(ctx, &geologv1.CommitCursorsRequest{Cursor: "billing", MemberId: "a", MemberEpoch: a.MemberEpoch,
			Positions: []*geologv1.CursorPosition{{Stream: "chat", Range: 0, Offset: i}, {Stream: "chat", Range: 3, Offset: 2 * i}}}); err != nil {
			t.Fatal(err)
		}
	}
	b, err := cc.JoinGroup(ctx, &geologv1.JoinGroupRequest{Group: "billing", MemberId: "b", Stream: "chat"})
	if err != nil {
		t.Fatal(err)
	}
	a2, err := cc.GroupHeartbeat(ctx, &geologv1.GroupHeartbeatRequest{Group: "billing", MemberId: "a", MemberEpoch: a.MemberEpoch, OwnedRanges: a.Ranges})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cc.GroupHeartbeat(ctx, &geologv1.GroupHeartbeatRequest{Group: "billing", MemberId: "a", MemberEpoch: a2.MemberEpoch, OwnedRanges: a2.Ranges}); err != nil {
		t.Fatal(err)
	}
	b2, err := cc.GroupHeartbeat(ctx, &geologv1.GroupHeartbeatRequest{Group: "billing", MemberId: "b", MemberEpoch: b.MemberEpoch})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct {
		id    string
		epoch uint64
	}{{"a", a2.MemberEpoch}, {"b", b2.MemberEpoch}} {
		if _, err := cc.LeaveGroup(ctx, &geologv1.LeaveGroupRequest{Group: "billing", MemberId: m.id, MemberEpoch: m.epoch}); err != nil {
			t.Fatal(err)
		}
	}
}

// servedCursors reads each cursor's positions (and the group billing's)
// from the node, printed as positionsOf prints them.
func servedCursors(t *testing.T, ctx context.Context, cc geologv1.ConsumerClient, names []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, name := range append(names, "billing") {
		resp, err := cc.GetCursors(ctx, &geologv1.GetCursorsRequest{Cursor: name, Consistency: geologv1.Consistency_CONSISTENCY_HOME})
		if err != nil {
			t.Fatal(err)
		}
		var ps []cursors.Position
		for _, p := range resp.Positions {
			ps = append(ps, positionFromProto(p))
		}
		out[name] = fmt.Sprint(positionsOf(ps))
	}
	return out
}

// positionsOf is what a test compares of positions: what GetCursors
// returns but the commit time.
func positionsOf(ps []cursors.Position) []string {
	out := []string{}
	for _, p := range ps {
		out = append(out, fmt.Sprintf("%s/%d gen=%d off=%d epoch=%d meta=%q", p.Stream, p.Range, p.Generation, p.Offset, p.Epoch, p.Metadata))
	}
	return out
}

// readCursorLogs reads every range of the cursor stream through the API,
// following next offsets over compaction's holes.
func readCursorLogs(t *testing.T, ctx context.Context, lc geologv1.LogClient, ranges uint32) [][]cursors.Record {
	t.Helper()
	out := make([][]cursors.Record, ranges)
	for r := range ranges {
		for from := uint64(0); ; {
			resp, err := lc.Read(ctx, &geologv1.ReadRequest{Stream: cursorStreamName, Range: r, FromOffset: from})
			if err != nil {
				t.Fatal(err)
			}
			for _, rec := range resp.Records {
				out[r] = append(out[r], cursors.Record{Key: rec.Key, Value: rec.Value, Tombstone: rec.Tombstone})
			}
			if resp.NextOffset >= resp.TailOffset || resp.NextOffset <= from {
				break
			}
			from = resp.NextOffset
		}
	}
	return out
}

// cursorRangeOf is the cursor-stream range holding name.
func (n *Node) cursorRangeOf(name string) uint32 {
	return keyspace.RangeForKey([]byte(name), uint32(n.cfg.CursorRanges))
}

// commitRetrying commits req, again while the answer is retriable (a
// busy machine can outlast a term's read barrier: TIMEOUT), as a client
// would; a commit is idempotent.
func commitRetrying(t *testing.T, ctx context.Context, cc geologv1.ConsumerClient, req *geologv1.CommitCursorsRequest) {
	t.Helper()
	for {
		_, err := cc.CommitCursors(ctx, req)
		if err == nil {
			return
		}
		if !rpcerr.IsRetriable(err) || ctx.Err() != nil {
			t.Fatal(err)
		}
		t.Logf("commit %s: %v; again", req.GetCursor(), err)
		time.Sleep(100 * time.Millisecond)
	}
}
