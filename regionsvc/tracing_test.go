package regionsvc

import (
	"context"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestAppendSpanTree: one append through the SDK (client.TracerProvider)
// to a 3-node region, first sent to a follower (which redirects it to the
// leader), then to the leader, makes one trace under the caller's span:
//
//	produce
//	  geolog.v1.Log/Append (client) → geolog.v1.Log/Append (server)
//	    geolog.append (NOT_LEADER, leader hint) → geolog.raft.commit (NOT_LEADER)
//	  geolog.v1.Log/Append (client) → geolog.v1.Log/Append (server)
//	    geolog.append → geolog.raft.commit, then geolog.append.ack
func TestAppendSpanTree(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	tr := newTestRegionWith(t, 3, 3, func(cfg *Config) { cfg.TracerProvider = tp })
	ctx := ctxT(t)
	tr.retry(ctx, "create", func(ctx context.Context, c geologv1.LogClient) error {
		_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "t", RangeCount: 1})
		return err
	})
	leader, follower := rangeLeader(t, tr, "t", 0)
	// The follower hints the leader's advertised address once it has
	// learnt it (advertise.go).
	for fn := tr.nodes[follower]; fn.clientAddr(fn.cfg.Region, leader) != tr.peers[leader]; {
		if ctx.Err() != nil {
			t.Fatalf("node %d never learnt node %d's address", follower, leader)
		}
		time.Sleep(20 * time.Millisecond)
	}

	root, span := tp.Tracer("test").Start(ctx, "produce")
	req := &geologv1.AppendRequest{Stream: "t", Range: 0, Records: recs("v", 3)}
	_, err := sdkClient(t, tr.peers[follower], tp).API().Append(root, req)
	if rpcerr.FromError(err).Code != apierr.NotLeader {
		t.Fatalf("append to the follower: %v, want NOT_LEADER", err)
	}
	resp, err := sdkClient(t, tr.peers[leader], tp).API().Append(root, req)
	if err != nil {
		t.Fatal(err)
	}
	span.End()
	traceID := span.SpanContext().TraceID()

	// Server spans end as their calls finish, a moment after the client
	// has its answer: wait for all ten.
	var spans []sdktrace.ReadOnlySpan
	deadline := time.Now().Add(20 * time.Second)
	for {
		spans = spans[:0]
		for _, s := range rec.Ended() {
			if s.SpanContext().TraceID() == traceID {
				spans = append(spans, s)
			}
		}
		if len(spans) >= 10 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	children := map[trace.SpanID][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		children[s.Parent().SpanID()] = append(children[s.Parent().SpanID()], s)
	}
	only := func(parent sdktrace.ReadOnlySpan, name string, kind trace.SpanKind) sdktrace.ReadOnlySpan {
		t.Helper()
		var got []sdktrace.ReadOnlySpan
		for _, c := range children[parent.SpanContext().SpanID()] {
			if c.Name() == name && c.SpanKind() == kind {
				got = append(got, c)
			}
		}
		if len(got) != 1 {
			t.Fatalf("%d %s spans (%v) under %s; spans of the trace: %v", len(got), name, kind, parent.Name(), names(spans))
		}
		return got[0]
	}
	var rootSpan sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == "produce" {
			rootSpan = s
		}
	}
	if rootSpan == nil {
		t.Fatalf("no root span: %v", names(spans))
	}
	calls := children[rootSpan.SpanContext().SpanID()]
	if len(calls) != 2 {
		t.Fatalf("%d calls under the root, want 2: %v", len(calls), names(spans))
	}
	if calls[0].StartTime().After(calls[1].StartTime()) {
		calls[0], calls[1] = calls[1], calls[0]
	}
	for i, call := range calls {
		if call.Name() != geologv1.Log_Append_FullMethodName[1:] || call.SpanKind() != trace.SpanKindClient {
			t.Fatalf("call %d: %s (%v)", i, call.Name(), call.SpanKind())
		}
		server := only(call, call.Name(), trace.SpanKindServer)
		app := only(server, "geolog.append", trace.SpanKindInternal)
		commit := only(app, "geolog.raft.commit", trace.SpanKindInternal)
		if want(app, "geolog.stream") != "t" {
			t.Errorf("geolog.append attributes %v", app.Attributes())
		}
		if i == 0 {
			// The follower redirects: both spans say why and where to.
			for _, s := range []sdktrace.ReadOnlySpan{app, commit} {
				if s.Status().Code != codes.Error || want(s, "geolog.error_code") != "not_leader" || want(s, "geolog.leader_hint") != tr.peers[leader] {
					t.Errorf("%s on the follower: status %v, attributes %v (leader %s)", s.Name(), s.Status(), s.Attributes(), tr.peers[leader])
				}
			}
			if len(children[app.SpanContext().SpanID()]) != 1 {
				t.Errorf("the follower acked: %v", names(children[app.SpanContext().SpanID()]))
			}
			continue
		}
		ack := only(app, "geolog.append.ack", trace.SpanKindInternal)
		if ack.StartTime().Before(commit.EndTime()) {
			t.Errorf("the ack began at %v, before the commit ended at %v", ack.StartTime(), commit.EndTime())
		}
		if app.Status().Code == codes.Error || want(commit, "geolog.base_offset") != "0" || want(app, "geolog.epoch") != "1" {
			t.Errorf("leader spans: append %v %v, commit %v", app.Status(), app.Attributes(), commit.Attributes())
		}
	}
	if resp.GetBaseOffset() != 0 {
		t.Fatalf("base offset %d", resp.GetBaseOffset())
	}
}

// rangeLeader waits for a leader of stream/range and returns it and
// another node of the region.
func rangeLeader(t *testing.T, tr *testRegion, stream string, rng uint32) (leader, follower uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for id, n := range tr.nodes {
			d, err := n.rangeOf(context.Background(), stream, rng)
			if err == nil && d.rep != nil && d.rep.LeaderID() == id {
				for other := range tr.nodes {
					if od, err := tr.nodes[other].rangeOf(context.Background(), stream, rng); other != id && err == nil && od.rep.LeaderID() == id {
						return id, other
					}
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no leader of %s/%d that a follower knows", stream, rng)
	return 0, 0
}

func sdkClient(t *testing.T, addr string, tp trace.TracerProvider) *client.Client {
	t.Helper()
	c, err := client.New(addr, client.TracerProvider(tp), client.RetriesMax(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// want is s's attribute key as a string ("" when missing).
func want(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if kv.Key == attribute.Key(key) {
			return kv.Value.Emit()
		}
	}
	return ""
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name() + "<-" + s.Parent().SpanID().String()
	}
	return out
}
