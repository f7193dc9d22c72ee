package regionsvc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/nodeproc"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// TestAuthzProc: a geologd with TLS and authorization on (--superusers
// alice). bob, a principal with no rights, is refused every public call
// with PERMISSION_DENIED and an ErrorDetail, and nothing he appends is
// written (alice reads the same tail before and after); the refusals are
// logged with bob's name. With --no-authz, bob may append, and the node
// says so loudly at start.
func TestAuthzProc(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real-process test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := nodeproc.NewPKI(t)
	node := nodeproc.Start(t, t.TempDir(), nodeproc.FreeAddr(t), "--certs-dir", p.NodeDir("local", 1), "--superusers", "alice")
	alice, bob := p.ClientDir("alice"), p.ClientDir("bob")
	aliceLog := geologv1.NewLogClient(nodeproc.Dial(t, node.Addr, alice))
	bobLog := geologv1.NewLogClient(nodeproc.Dial(t, node.Addr, bob))
	waitFor(t, ctx, "stream created", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := aliceLog.CreateStream(cctx, &geologv1.CreateStreamRequest{Name: "orders", RangeCount: 1})
		return err == nil || rpcerr.FromError(err).Code == apierr.StreamExists
	})
	appendOne := func(c geologv1.LogClient, v string) error {
		_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "orders", Records: []*geologv1.Record{{Value: []byte(v)}}})
		return err
	}
	if err := appendOne(aliceLog, "by alice"); err != nil {
		t.Fatalf("alice appends: %v", err)
	}
	tail := func() int {
		r, err := aliceLog.Read(ctx, &geologv1.ReadRequest{Stream: "orders", MaxRecords: 100})
		if err != nil {
			t.Fatalf("alice reads: %v", err)
		}
		return len(r.GetRecords())
	}
	before := tail()

	denied := func(what string, err error) {
		t.Helper()
		if e := rpcerr.FromError(err); e == nil || e.Code != apierr.PermissionDenied {
			t.Errorf("bob %s: %v, want PERMISSION_DENIED", what, err)
		}
	}
	denied("appends", appendOne(bobLog, "by bob"))
	as, err := bobLog.AppendStream(ctx)
	if err == nil {
		_ = as.Send(&geologv1.AppendRequest{Stream: "orders", Records: []*geologv1.Record{{Value: []byte("by bob, streamed")}}})
		_, err = as.Recv()
	}
	denied("appends on a stream", err)
	_, err = bobLog.Read(ctx, &geologv1.ReadRequest{Stream: "orders"})
	denied("reads", err)
	sub, err := bobLog.Subscribe(ctx, &geologv1.SubscribeRequest{Stream: "orders"})
	if err == nil {
		_, err = sub.Recv()
	}
	denied("subscribes", err)
	_, err = bobLog.DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "orders"})
	denied("describes", err)
	_, err = bobLog.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "bobs", RangeCount: 1})
	denied("creates", err)

	if after := tail(); after != before {
		t.Fatalf("alice reads %d records after bob's refused appends, %d before", after, before)
	}
	waitFor(t, ctx, "the refusal logged with bob's name", func() bool {
		return strings.Contains(node.Output(), "principal=bob") && strings.Contains(node.Output(), `reason="no permission"`)
	})

	open := nodeproc.Start(t, t.TempDir(), nodeproc.FreeAddr(t), "--certs-dir", p.NodeDir("local", 1), "--no-authz")
	openLog := geologv1.NewLogClient(nodeproc.Dial(t, open.Addr, bob))
	waitFor(t, ctx, "bob creates a stream with authorization off", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := openLog.CreateStream(cctx, &geologv1.CreateStreamRequest{Name: "orders", RangeCount: 1})
		return err == nil
	})
	if err := appendOne(openLog, "by bob"); err != nil {
		t.Fatalf("bob appends with authorization off: %v", err)
	}
	if !strings.Contains(open.Output(), "AUTHORIZATION OFF") {
		t.Errorf("no warning that authorization is off:\n%s", open.Output())
	}
}
