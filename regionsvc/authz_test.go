package regionsvc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/authz"
	"github.com/geolog/geolog/pki"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// callerCtx returns a request context whose caller presented (and the
// server verified) a certificate naming id.
func callerCtx(t testing.TB, id pki.Identity) context.Context {
	t.Helper()
	caPair, err := pki.CreateCA("test CA", pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.ParseAuthority(caPair.CertPEM, caPair.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	var pair pki.Pair
	if id.IsNode() {
		pair, err = pki.CreateNode(ca, id.Region, id.NodeID, []string{"127.0.0.1"}, pki.Options{})
	} else {
		pair, err = pki.CreateClient(ca, id.Principal, pki.Options{})
	}
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(pair.CertPEM)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	info := credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}}}
	return peer.NewContext(context.Background(), &peer.Peer{AuthInfo: info})
}

func authzNode(p *authz.Policy) *Node {
	n := &Node{cfg: Config{Region: "us", TLS: &tls.Config{}, Authz: p}, logger: hclog.NewNullLogger()}
	n.policy.set(p)
	return n
}

func wantDenied(t *testing.T, what string, err error) {
	t.Helper()
	var e *apierr.Error
	if !errors.As(err, &e) || e.Code != apierr.PermissionDenied {
		t.Errorf("%s: %v, want PERMISSION_DENIED", what, err)
	}
}

// TestAuthorizeRequest decides requests of each kind against a policy:
// the permission each method needs, on the stream or group it names.
func TestAuthorizeRequest(t *testing.T) {
	t.Parallel()
	n := authzNode(&authz.Policy{Superusers: []string{"root"}, Rules: []authz.Rule{
		{Principal: "writer", Resource: "orders", Perms: authz.Of(authz.Produce)},
		{Principal: "user.*", Resource: "chat.*", Perms: authz.Of(authz.Consume)},
		{Principal: "user.*", Resource: "g-*", Perms: authz.Of(authz.Group)},
		{Principal: "auditor", Resource: "*", Perms: authz.Of(authz.Describe)},
	}})
	appendTo := &geologv1.AppendRequest{Stream: "orders"}
	join := func(g, s string) *geologv1.JoinGroupRequest { return &geologv1.JoinGroupRequest{Group: g, Stream: s} }
	for _, c := range []struct {
		who    string
		method string
		req    any
		ok     bool
	}{
		{"writer", geologv1.Log_Append_FullMethodName, appendTo, true},
		{"writer", geologv1.Log_AppendStream_FullMethodName, appendTo, true},
		{"writer", geologv1.Log_Append_FullMethodName, &geologv1.AppendRequest{Stream: "orders2"}, false},
		{"writer", geologv1.Log_Read_FullMethodName, &geologv1.ReadRequest{Stream: "orders"}, false},
		{"user.ann", geologv1.Log_Append_FullMethodName, &geologv1.AppendRequest{Stream: "chat.r1"}, false},
		{"user.ann", geologv1.Log_Subscribe_FullMethodName, &geologv1.SubscribeRequest{Stream: "chat.r1"}, true},
		{"user.ann", geologv1.Log_Read_FullMethodName, &geologv1.ReadRequest{Stream: "chat"}, false},
		{"user.ann", geologv1.Consumer_JoinGroup_FullMethodName, join("g-1", "chat.r1"), true},
		{"user.ann", geologv1.Consumer_JoinGroup_FullMethodName, join("h-1", "chat.r1"), false},
		{"user.ann", geologv1.Consumer_JoinGroup_FullMethodName, join("g-1", "orders"), false},
		{"user.ann", geologv1.Consumer_CommitCursors_FullMethodName, &geologv1.CommitCursorsRequest{Cursor: "g-1",
			Positions: []*geologv1.CursorPosition{{Stream: "chat.a"}, {Stream: "orders"}}}, false},
		{"user.ann", geologv1.Log_DescribeStream_FullMethodName, &geologv1.DescribeStreamRequest{Name: "chat.r1"}, false},
		{"auditor", geologv1.Log_DescribeStream_FullMethodName, &geologv1.DescribeStreamRequest{Name: "chat.r1"}, true},
		{"auditor", geologv1.Log_ListStreams_FullMethodName, &geologv1.ListStreamsRequest{}, true},
		{"writer", geologv1.Log_ListStreams_FullMethodName, &geologv1.ListStreamsRequest{}, false},
		{"auditor", geologv1.Log_CreateStream_FullMethodName, &geologv1.CreateStreamRequest{Name: "x"}, false},
		{"auditor", geologv1.Admin_Rehome_FullMethodName, &geologv1.RehomeRequest{Stream: "x"}, false},
		{"root", geologv1.Admin_Rehome_FullMethodName, &geologv1.RehomeRequest{Stream: "x"}, true},
		{"root", "/geolog.v1.Log/NotInTheTable", &geologv1.ReadRequest{}, false},
	} {
		err := n.authorizeRequest(callerCtx(t, pki.ClientIdentity(c.who)), c.method, c.req)
		if c.ok && err != nil {
			t.Errorf("%s %s %v: %v, want allowed", c.who, c.method, c.req, err)
		} else if !c.ok {
			wantDenied(t, c.who+" "+c.method, err)
		}
	}
	// Nodes pass: they call public methods only on a client's behalf.
	if err := n.authorizeRequest(callerCtx(t, pki.NodeIdentity("eu", 2)), geologv1.Admin_Rehome_FullMethodName, &geologv1.RehomeRequest{}); err != nil {
		t.Errorf("a node: %v", err)
	}
}

// fakeStream is a server stream that receives one request and records
// what is sent.
type fakeStream struct {
	grpc.ServerStream
	ctx  context.Context
	req  *geologv1.SubscribeRequest
	sent int
}

func (s *fakeStream) Context() context.Context { return s.ctx }
func (s *fakeStream) RecvMsg(m any) error {
	*m.(*geologv1.SubscribeRequest) = geologv1.SubscribeRequest{Stream: s.req.GetStream()}
	return nil
}
func (s *fakeStream) SendMsg(any) error { s.sent++; return nil }

// TestOpenStreamRecheckedOnPolicyChange: a subscription is decided when
// it is opened, and again at its next message once the policy changed;
// a right taken away cuts it off.
func TestOpenStreamRecheckedOnPolicyChange(t *testing.T) {
	t.Parallel()
	rule := authz.Rule{Principal: "reader", Resource: "orders", Perms: authz.Of(authz.Consume)}
	n := authzNode(&authz.Policy{Rules: []authz.Rule{rule}})
	fs := &fakeStream{ctx: callerCtx(t, pki.ClientIdentity("reader")), req: &geologv1.SubscribeRequest{Stream: "orders"}}
	s := newAuthzStream(fs, n, geologv1.Log_Subscribe_FullMethodName)
	if err := s.RecvMsg(new(geologv1.SubscribeRequest)); err != nil {
		t.Fatalf("open: %v", err)
	}
	if err := s.SendMsg(&geologv1.SubscribeResponse{}); err != nil {
		t.Fatalf("send: %v", err)
	}
	// A change that keeps the right: the stream goes on.
	n.policy.set(&authz.Policy{Rules: []authz.Rule{rule, {Principal: "x", Resource: "y", Perms: authz.Of(authz.Admin)}}})
	if err := s.SendMsg(&geologv1.SubscribeResponse{}); err != nil {
		t.Fatalf("send after a change that keeps the right: %v", err)
	}
	n.policy.set(&authz.Policy{})
	wantDenied(t, "send after the right was removed", apierr.As(s.SendMsg(&geologv1.SubscribeResponse{})))
	if fs.sent != 2 {
		t.Errorf("%d messages sent, want 2 (none after the right was removed)", fs.sent)
	}
	// Opened without the right: refused at the first message.
	s2 := newAuthzStream(fs, n, geologv1.Log_Subscribe_FullMethodName)
	wantDenied(t, "open without the right", apierr.As(s2.RecvMsg(new(geologv1.SubscribeRequest))))
}

// TestStreamCallerNamedAtOpen: a stream's caller is named once, when it
// opens (its certificate cannot change while it is open), and what the
// caller may do is still decided on every message against the policy of
// the moment. The fake stream's context loses its identity after the
// open: a stream that named its caller on every message would refuse the
// second message as from no one.
func TestStreamCallerNamedAtOpen(t *testing.T) {
	t.Parallel()
	rule := authz.Rule{Principal: "reader", Resource: "orders", Perms: authz.Of(authz.Consume)}
	n := authzNode(&authz.Policy{Rules: []authz.Rule{rule}})
	fs := &fakeStream{ctx: callerCtx(t, pki.ClientIdentity("reader")), req: &geologv1.SubscribeRequest{Stream: "orders"}}
	s := newAuthzStream(fs, n, geologv1.Log_Subscribe_FullMethodName)
	fs.ctx = context.Background()
	for i := range 3 {
		if err := s.RecvMsg(new(geologv1.SubscribeRequest)); err != nil {
			t.Fatalf("message %d: %v, want allowed (the caller named at the open)", i, err)
		}
	}
	n.policy.set(&authz.Policy{})
	wantDenied(t, "a message after the right was removed", apierr.As(s.RecvMsg(new(geologv1.SubscribeRequest))))
	// Opened with no identity: refused at its first message, as before.
	anon := newAuthzStream(&fakeStream{ctx: context.Background(), req: fs.req}, authzNode(&authz.Policy{Rules: []authz.Rule{rule}}), geologv1.Log_Subscribe_FullMethodName)
	wantDenied(t, "a stream with no identity", apierr.As(anon.RecvMsg(new(geologv1.SubscribeRequest))))
}

// TestRefusalLogIsRateLimited: past the burst, refusals in a window are
// counted and reported with the first line of the next window.
func TestRefusalLogIsRateLimited(t *testing.T) {
	t.Parallel()
	var l refusalLog
	now := time.Unix(1000, 0)
	for i := range refusalLogBurst {
		if ok, _ := l.admit(now); !ok {
			t.Fatalf("line %d of the burst refused", i)
		}
	}
	for range 5 {
		if ok, _ := l.admit(now.Add(time.Second)); ok {
			t.Fatal("a line past the burst admitted")
		}
	}
	ok, leftOut := l.admit(now.Add(refusalLogWindow))
	if !ok || leftOut != 5 {
		t.Fatalf("next window: admitted %v, %d left out; want true, 5", ok, leftOut)
	}
}

// BenchmarkStreamMessageAuthz: deciding one message of a stream, with the
// caller named at the stream's open (named) and named again from its
// certificate on every message, as before notes/rtt.md (each):
//
//	go test -run '^$' -bench BenchmarkStreamMessageAuthz -benchmem ./regionsvc/
func BenchmarkStreamMessageAuthz(b *testing.B) {
	rule := authz.Rule{Principal: "writer", Resource: "orders", Perms: authz.Of(authz.Consume)}
	n := authzNode(&authz.Policy{Rules: []authz.Rule{rule}})
	ctx := callerCtx(b, pki.ClientIdentity("writer"))
	req := &geologv1.SubscribeRequest{Stream: "orders"}
	method := geologv1.Log_Subscribe_FullMethodName
	b.Run("named", func(b *testing.B) {
		s := newAuthzStream(&fakeStream{ctx: ctx, req: req}, n, method)
		for b.Loop() {
			if err := s.RecvMsg(new(geologv1.SubscribeRequest)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("each", func(b *testing.B) {
		for b.Loop() {
			if err := n.authorizeRequest(ctx, method, req); err != nil {
				b.Fatal(err)
			}
		}
	})
}
