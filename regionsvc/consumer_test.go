package regionsvc

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

func consumerClient(t *testing.T, addr string) geologv1.ConsumerClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return geologv1.NewConsumerClient(conn)
}

func appendN(t *testing.T, ctx context.Context, c geologv1.LogClient, stream string, rng uint32, n int) {
	t.Helper()
	if _, err := c.Append(ctx, &geologv1.AppendRequest{Stream: stream, Range: rng, Records: recs("r", n)}); err != nil {
		t.Fatal(err)
	}
}

// TestCursorsOneNode commits and reads cursors on a node without
// replication, and refuses bad commits with typed errors that change
// nothing; the cursors survive a restart.
func TestCursorsOneNode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	n, lc := testNode(t, dir, nil)
	ctx := ctxT(t)
	createStream(t, lc, "chat", 4)
	appendN(t, ctx, lc, "chat", 1, 10)
	cc := consumerClient(t, n.Addr())
	commit := func(cursor string, ps ...*geologv1.CursorPosition) (*geologv1.CommitCursorsResponse, error) {
		return cc.CommitCursors(ctx, &geologv1.CommitCursorsRequest{Cursor: cursor, Positions: ps})
	}
	resp, err := commit("dev-1", &geologv1.CursorPosition{Stream: "chat", Range: 1, Offset: 7, Epoch: 1, Metadata: []byte("read")})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Results[0].Applied || resp.Results[0].Position.Offset != 7 || resp.Results[0].Position.CommitTimeUnixNanos == 0 {
		t.Fatalf("commit: %v", resp)
	}
	// Lower: not applied, no error.
	resp, err = commit("dev-1", &geologv1.CursorPosition{Stream: "chat", Range: 1, Offset: 3})
	if err != nil || resp.Results[0].Applied || resp.Results[0].Position.Offset != 7 {
		t.Fatalf("lower commit: %v %v", resp, err)
	}
	for _, bad := range []struct {
		what string
		p    *geologv1.CursorPosition
		code apierr.Code
	}{
		{"unknown stream", &geologv1.CursorPosition{Stream: "nope", Range: 0, Offset: 1}, apierr.StreamNotFound},
		{"unknown range", &geologv1.CursorPosition{Stream: "chat", Range: 4, Offset: 1}, apierr.RangeNotFound},
		{"past the tail", &geologv1.CursorPosition{Stream: "chat", Range: 1, Offset: 11}, apierr.OffsetOutOfRange},
		{"bad stream name", &geologv1.CursorPosition{Stream: "a b", Range: 0}, apierr.InvalidArgument},
		{"metadata too large", &geologv1.CursorPosition{Stream: "chat", Range: 1, Offset: 9, Metadata: make([]byte, 2000)}, apierr.InvalidArgument},
	} {
		_, err := commit("dev-1", &geologv1.CursorPosition{Stream: "chat", Range: 1, Offset: 8}, bad.p)
		wantCode(t, err, bad.code)
	}
	_, err = commit("", &geologv1.CursorPosition{Stream: "chat", Range: 1, Offset: 1})
	wantCode(t, err, apierr.InvalidArgument)
	many := make([]*geologv1.CursorPosition, 5000)
	for i := range many {
		many[i] = &geologv1.CursorPosition{Stream: "chat", Range: 1, Offset: 1}
	}
	_, err = commit("dev-1", many...)
	wantCode(t, err, apierr.InvalidArgument)
	// Nothing of the refused requests changed the cursor.
	got, err := cc.GetCursors(ctx, &geologv1.GetCursorsRequest{Cursor: "dev-1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Positions) != 1 || got.Positions[0].Offset != 7 || string(got.Positions[0].Metadata) != "read" {
		t.Fatalf("cursor after refusals: %v", got.Positions)
	}
	// Appends to the cursor stream are refused.
	_, err = lc.Append(ctx, &geologv1.AppendRequest{Stream: cursorStreamName, Range: 0, Records: recs("x", 1)})
	wantCode(t, err, apierr.PermissionDenied)
	// The cursor survives a restart.
	n.Close()
	n2, _ := testNode(t, dir, nil)
	cc2 := consumerClient(t, n2.Addr())
	got, err = cc2.GetCursors(ctx, &geologv1.GetCursorsRequest{Cursor: "dev-1", Consistency: geologv1.Consistency_CONSISTENCY_HOME})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Positions) != 1 || got.Positions[0].Offset != 7 {
		t.Fatalf("cursor after restart: %v", got.Positions)
	}
}

// TestGroupOneNode runs a group of two members on one node: join,
// incremental handover, fenced fetch and commit, leave.
func TestGroupOneNode(t *testing.T) {
	t.Parallel()
	n, lc := testNode(t, t.TempDir(), nil)
	ctx := ctxT(t)
	createStream(t, lc, "orders", 4)
	for r := uint32(0); r < 4; r++ {
		appendN(t, ctx, lc, "orders", r, 5)
	}
	cc := consumerClient(t, n.Addr())
	a, err := cc.JoinGroup(ctx, &geologv1.JoinGroupRequest{Group: "billing", MemberId: "a", Stream: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Ranges) != 4 || a.HeartbeatIntervalMs == 0 {
		t.Fatalf("first member: %v", a)
	}
	if _, err := cc.CommitCursors(ctx, &geologv1.CommitCursorsRequest{Cursor: "billing", MemberId: "a", MemberEpoch: a.MemberEpoch,
		Positions: []*geologv1.CursorPosition{{Stream: "orders", Range: 2, Offset: 3}}}); err != nil {
		t.Fatal(err)
	}
	b, err := cc.JoinGroup(ctx, &geologv1.JoinGroupRequest{Group: "billing", MemberId: "b", Stream: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Ranges) != 0 {
		t.Fatalf("b got ranges a still owns: %v", b.Ranges)
	}
	// b may not fetch a range it does not own.
	fs, err := cc.Fetch(ctx, &geologv1.FetchRequest{Group: "billing", MemberId: "b", MemberEpoch: b.MemberEpoch, Stream: "orders", Range: 2})
	if err == nil {
		_, err = fs.Recv()
	}
	wantCode(t, err, apierr.RangeNotAssigned)
	// a is asked to release two ranges; it does, and b gets them with the
	// position a committed.
	a2, err := cc.GroupHeartbeat(ctx, &geologv1.GroupHeartbeatRequest{Group: "billing", MemberId: "a", MemberEpoch: a.MemberEpoch, OwnedRanges: a.Ranges})
	if err != nil {
		t.Fatal(err)
	}
	if len(a2.Ranges) != 2 {
		t.Fatalf("a after b joined: %v", a2)
	}
	if _, err := cc.GroupHeartbeat(ctx, &geologv1.GroupHeartbeatRequest{Group: "billing", MemberId: "a", MemberEpoch: a2.MemberEpoch, OwnedRanges: a2.Ranges}); err != nil {
		t.Fatal(err)
	}
	b2, err := cc.GroupHeartbeat(ctx, &geologv1.GroupHeartbeatRequest{Group: "billing", MemberId: "b", MemberEpoch: b.MemberEpoch})
	if err != nil {
		t.Fatal(err)
	}
	if len(b2.Ranges) != 2 || b2.MemberEpoch <= b.MemberEpoch {
		t.Fatalf("b after a released: %v", b2)
	}
	// b fetches its range from the committed position (range 2 is b's).
	var from uint64
	for _, p := range b2.Positions {
		if p.Range == 2 {
			from = p.Offset
		}
	}
	if from != 3 {
		t.Fatalf("b's positions %v", b2.Positions)
	}
	fctx, cancel := context.WithCancel(ctx)
	fs, err = cc.Fetch(fctx, &geologv1.FetchRequest{Group: "billing", MemberId: "b", MemberEpoch: b2.MemberEpoch, Stream: "orders", Range: 2, FromOffset: from})
	if err != nil {
		t.Fatal(err)
	}
	fr, err := fs.Recv()
	if err != nil || len(fr.Records) != 2 || fr.Records[0].Offset != 3 {
		t.Fatalf("fetch: %v %v", fr, err)
	}
	cancel()
	// a's commit of a range it released is refused, b's old epoch too.
	_, err = cc.CommitCursors(ctx, &geologv1.CommitCursorsRequest{Cursor: "billing", MemberId: "a", MemberEpoch: a2.MemberEpoch,
		Positions: []*geologv1.CursorPosition{{Stream: "orders", Range: 2, Offset: 4}}})
	wantCode(t, err, apierr.RangeNotAssigned)
	_, err = cc.CommitCursors(ctx, &geologv1.CommitCursorsRequest{Cursor: "billing", MemberId: "b", MemberEpoch: b2.MemberEpoch + 1,
		Positions: []*geologv1.CursorPosition{{Stream: "orders", Range: 2, Offset: 4}}})
	wantCode(t, err, apierr.StaleMemberEpoch)
	// Reset and delete are refused while members are live.
	_, err = cc.ResetGroup(ctx, &geologv1.ResetGroupRequest{Group: "billing", Stream: "orders", To: &geologv1.ResetGroupRequest_ToEarliest{ToEarliest: true}})
	wantCode(t, err, apierr.GroupNotEmpty)
	_, err = cc.DeleteGroup(ctx, &geologv1.DeleteGroupRequest{Group: "billing"})
	wantCode(t, err, apierr.GroupNotEmpty)
	d, err := cc.DescribeGroup(ctx, &geologv1.DescribeGroupRequest{Group: "billing", Consistency: geologv1.Consistency_CONSISTENCY_HOME})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Members) != 2 || len(d.Ranges) != 4 || d.Ranges[2].LagRecords != 2 || d.Members[0].LastHeartbeatAgeMs < 0 {
		t.Fatalf("describe: %v", d)
	}
	for _, m := range []string{"a", "b"} {
		if _, err := cc.LeaveGroup(ctx, &geologv1.LeaveGroupRequest{Group: "billing", MemberId: m, MemberEpoch: d.Members[0].MemberEpoch}); err != nil && rpcerr.CodeOf(err) != apierr.StaleMemberEpoch {
			t.Fatal(err)
		}
	}
	for _, m := range d.Members {
		if _, err := cc.LeaveGroup(ctx, &geologv1.LeaveGroupRequest{Group: "billing", MemberId: m.MemberId, MemberEpoch: m.MemberEpoch}); err != nil {
			t.Fatal(err)
		}
	}
	rr, err := cc.ResetGroup(ctx, &geologv1.ResetGroupRequest{Group: "billing", Stream: "orders", To: &geologv1.ResetGroupRequest_ToLatest{ToLatest: true}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rr.Positions) != 4 || rr.Positions[0].Offset != 5 || rr.Positions[0].Generation != 1 {
		t.Fatalf("reset: %v", rr)
	}
	lg, err := cc.ListGroups(ctx, &geologv1.ListGroupsRequest{})
	if err != nil || len(lg.Groups) != 1 || lg.Groups[0].State != "empty" {
		t.Fatalf("list: %v %v", lg, err)
	}
	if _, err := cc.DeleteGroup(ctx, &geologv1.DeleteGroupRequest{Group: "billing"}); err != nil {
		t.Fatal(err)
	}
	_, err = cc.DescribeGroup(ctx, &geologv1.DescribeGroupRequest{Group: "billing"})
	wantCode(t, err, apierr.GroupNotFound)
}

// TestCursorsRegion runs cursors in a 3-node region: any node takes a
// commit (forwarding it to the coordinator), and every node's copy reads
// it with CONSISTENCY_HOME.
func TestCursorsRegion(t *testing.T) {
	t.Parallel()
	tr := newTestRegion(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tr.retry(ctx, "create", func(ctx context.Context, c geologv1.LogClient) error {
		_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "chat", RangeCount: 2})
		if rpcerr.CodeOf(err) == apierr.StreamExists {
			return nil
		}
		return err
	})
	tr.retry(ctx, "append", func(ctx context.Context, c geologv1.LogClient) error {
		_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "chat", Range: 0, Records: recs("r", 100)})
		return err
	})
	ccs := map[uint64]geologv1.ConsumerClient{}
	for id, addr := range tr.peers {
		ccs[id] = consumerClient(t, addr)
	}
	hinted := 0
	for i := 0; i < 30; i++ {
		id := uint64(i%3) + 1
		cursor := "dev-" + string(rune('a'+i%7))
		var err error
		var md metadata.MD
		for attempt := 0; attempt < 50; attempt++ {
			_, err = ccs[id].CommitCursors(ctx, &geologv1.CommitCursorsRequest{Cursor: cursor,
				Positions: []*geologv1.CursorPosition{{Stream: "chat", Range: 0, Offset: uint64(i + 1)}}}, grpc.Header(&md))
			if err == nil || !rpcerr.IsRetriable(err) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("commit %d at node %d: %v", i, id, err)
		}
		// The coordinator's hint names the cursor range of the name.
		if len(md.Get(CoordinatorHeader)) > 0 {
			hinted++
			want := fmt.Sprintf("%d/%d", keyspace.RangeForKey([]byte(cursor), cursorRangesDefault), cursorRangesDefault)
			if got := md.Get(CursorRangeHeader); len(got) != 1 || got[0] != want {
				t.Fatalf("commit %d of %q: %s %v, want %s", i, cursor, CursorRangeHeader, got, want)
			}
		}
		for rid, c := range ccs {
			got, err := c.GetCursors(ctx, &geologv1.GetCursorsRequest{Cursor: cursor, Consistency: geologv1.Consistency_CONSISTENCY_HOME})
			if err != nil {
				t.Fatalf("get at node %d: %v", rid, err)
			}
			if len(got.Positions) != 1 || got.Positions[0].Offset != uint64(i+1) {
				t.Fatalf("node %d reads %v after commit %d", rid, got.Positions, i+1)
			}
		}
	}
	if hinted == 0 {
		t.Fatal("no commit named its coordinator")
	}
	// The records are in the cursor stream, hashed by name.
	r := keyspace.RangeForKey([]byte("dev-a"), cursorRangesDefault)
	rr, err := tr.clients[1].Read(ctx, &geologv1.ReadRequest{Stream: cursorStreamName, Range: r})
	if err != nil || len(rr.Records) == 0 {
		t.Fatalf("cursor stream range %d: %v %v", r, rr, err)
	}
}

// TestGroupLagMetrics: the lag of a group per range is exported as
// geolog.group.lag.records and .seconds.
func TestGroupLagMetrics(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	n, lc := testNode(t, t.TempDir(), func(cfg *Config) { cfg.MeterProvider = mp })
	ctx := ctxT(t)
	createStream(t, lc, "m", 2)
	appendN(t, ctx, lc, "m", 0, 10)
	appendN(t, ctx, lc, "m", 1, 4)
	cc := consumerClient(t, n.Addr())
	a, err := cc.JoinGroup(ctx, &geologv1.JoinGroupRequest{Group: "lagging", MemberId: "a", Stream: "m"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cc.CommitCursors(ctx, &geologv1.CommitCursorsRequest{Cursor: "lagging", MemberId: "a", MemberEpoch: a.MemberEpoch,
		Positions: []*geologv1.CursorPosition{{Stream: "m", Range: 0, Offset: 7}, {Stream: "m", Range: 1, Offset: 4}}}); err != nil {
		t.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	lag := map[int64]int64{}
	var seconds float64
	members := int64(-1)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					if g, _ := p.Attributes.Value("group"); g.AsString() != "lagging" {
						continue
					}
					switch m.Name {
					case "geolog.group.lag.records":
						r, _ := p.Attributes.Value("range")
						lag[r.AsInt64()] = p.Value
					case "geolog.group.members":
						members = p.Value
					}
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					if r, _ := p.Attributes.Value("range"); m.Name == "geolog.group.lag.seconds" && r.AsInt64() == 0 {
						seconds = p.Value
					}
				}
			}
		}
	}
	if lag[0] != 3 || lag[1] != 0 || members != 1 || seconds < 0 {
		t.Fatalf("lag %v, members %d, seconds %v", lag, members, seconds)
	}
}

// TestCursorHomeReadOnCatalogueLaggard: a home read of a cursor at a node
// whose catalogue has not applied the creation of the cursor stream yet
// (the create and the first commit need only a quorum: nodes that lag are
// left behind) must not answer "nothing stored": it confirms with the
// catalogue leader and waits for the stream, then reads the commit. The
// laggard is made by holding its catalogue driver's goroutine.
func TestCursorHomeReadOnCatalogueLaggard(t *testing.T) {
	t.Parallel()
	tr := newTestRegion(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tr.retry(ctx, "create", func(ctx context.Context, c geologv1.LogClient) error {
		_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "chat", RangeCount: 1})
		if rpcerr.CodeOf(err) == apierr.StreamExists {
			return nil
		}
		return err
	})
	tr.retry(ctx, "append", func(ctx context.Context, c geologv1.LogClient) error {
		_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "chat", Range: 0, Records: recs("r", 10)})
		return err
	})
	// The laggard: a node that does not lead the catalogue, and that has
	// applied the creation of "chat" (so the catalogue's leader is known
	// to it and only the next entries are held back).
	var lag, via uint64
	for lag == 0 && ctx.Err() == nil {
		for id, n := range tr.nodes {
			leader := n.region.meta.rep.LeaderID()
			if _, ok := n.streamSpec("chat"); ok && leader != 0 && leader != id {
				lag, via = id, leader
				break
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	laggard := tr.nodes[lag]
	release := make(chan struct{})
	held := make(chan struct{})
	go laggard.region.meta.exec(ctx, func() { close(held); <-release })
	<-held
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	cc := consumerClient(t, tr.peers[via])
	var err error
	for attempt := 0; attempt < 100; attempt++ {
		_, err = cc.CommitCursors(ctx, &geologv1.CommitCursorsRequest{Cursor: "dev-a",
			Positions: []*geologv1.CursorPosition{{Stream: "chat", Range: 0, Offset: 5}}})
		if err == nil || !rpcerr.IsRetriable(err) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("commit at node %d: %v", via, err)
	}
	if _, ok := laggard.streamSpec(cursorStreamName); ok {
		t.Fatalf("node %d applied the cursor stream's creation while its catalogue was held", lag)
	}
	type answer struct {
		resp *geologv1.GetCursorsResponse
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		resp, err := consumerClient(t, tr.peers[lag]).GetCursors(ctx, &geologv1.GetCursorsRequest{Cursor: "dev-a",
			Consistency: geologv1.Consistency_CONSISTENCY_HOME})
		got <- answer{resp, err}
	}()
	// Before the fix the laggard answered at once, with no position; now
	// it waits for its catalogue, which the test lets go after a moment.
	var a answer
	select {
	case a = <-got:
	case <-time.After(300 * time.Millisecond):
		close(release)
		a = <-got
	}
	// A retriable answer (on a loaded machine a cursor range may be
	// electing a leader just then) is retried, as a client would; the
	// answer that counts is the first final one.
	for a.err != nil && rpcerr.IsRetriable(a.err) && ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
		resp, err := consumerClient(t, tr.peers[lag]).GetCursors(ctx, &geologv1.GetCursorsRequest{Cursor: "dev-a",
			Consistency: geologv1.Consistency_CONSISTENCY_HOME})
		a = answer{resp, err}
	}
	if a.err != nil {
		t.Fatalf("home read at node %d: %v", lag, a.err)
	}
	if len(a.resp.Positions) != 1 || a.resp.Positions[0].Offset != 5 {
		t.Fatalf("node %d reads %v at home consistency after an acknowledged commit of offset 5", lag, a.resp.Positions)
	}
}
