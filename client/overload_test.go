package client_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// overloadedLog answers ListStreams OVERLOADED (retry after 1 ms) its first
// refusals times, then with no stream.
type overloadedLog struct {
	geologv1.UnimplementedLogServer
	refusals int64
	calls    atomic.Int64
}

func (s *overloadedLog) ListStreams(context.Context, *geologv1.ListStreamsRequest) (*geologv1.ListStreamsResponse, error) {
	if s.calls.Add(1) <= s.refusals {
		e := apierr.New(apierr.Overloaded, "node is receiving 8 requests")
		e.RetryAfter = time.Millisecond
		return nil, rpcerr.ToStatus(e)
	}
	return &geologv1.ListStreamsResponse{}, nil
}

// TestOverloadedIsRetriedBeyondRetriesMax: a node that sheds a call with
// OVERLOADED and a retry-after is asked again after it, however many
// RetriesMax allows for failures (the node is alive: it said when to come
// back), up to a bound; a call that keeps failing otherwise still stops at
// RetriesMax.
func TestOverloadedIsRetriedBeyondRetriesMax(t *testing.T) {
	srv := grpc.NewServer()
	log := &overloadedLog{refusals: 20}
	geologv1.RegisterLogServer(srv, log)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()
	c := newClient(t, ln.Addr().String(), client.RetriesMax(2))
	if _, err := c.ListStreams(testCtx(t)); err != nil {
		t.Fatalf("after 20 OVERLOADED answers: %v", err)
	}
	if n := log.calls.Load(); n != 21 {
		t.Fatalf("%d calls, want 21", n)
	}
	log.calls.Store(0)
	log.refusals = 1 << 30
	if _, err := c.ListStreams(testCtx(t)); client.CodeOf(err) != client.CodeOverloaded {
		t.Fatalf("a node overloaded for good: %v", err)
	}
	if n := log.calls.Load(); n < 100 || n > 110 {
		t.Fatalf("%d calls to a node overloaded for good, want about 100", n)
	}
}
