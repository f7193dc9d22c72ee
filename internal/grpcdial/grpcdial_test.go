package grpcdial

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
)

// TestKeepaliveClosesADeadConnection: a connection to a server that stops
// answering (its process frozen: here, a listener that accepts and then
// never reads) is found dead by keepalive and fails the call in flight,
// instead of hanging until the call's own deadline.
func TestKeepaliveClosesADeadConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// A real server first, so that the connection is up; then its
	// connections are frozen by never reading again.
	frozen, release := make(chan struct{}), make(chan struct{})
	srv := grpc.NewServer(grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Millisecond, PermitWithoutStream: true}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(freezingListener{ln, frozen, release})
	defer srv.Stop()
	defer close(release) // first: the frozen connections' reads return
	// 10 s is the least keepalive time gRPC allows a client.
	conn, err := Dial(ln.Addr().String(), Config{KeepaliveTime: 10 * time.Second, KeepaliveTimeout: time.Second, PermitWithoutStream: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	close(frozen)
	// A streaming call that waits forever: only keepalive can end it.
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		for err == nil {
			_, err = w.Recv()
		}
	}
	if ctx.Err() != nil {
		t.Fatalf("the call ran to its deadline on a dead connection: %v", err)
	}
}

// freezingListener's connections stop reading and writing once frozen is
// closed, as a SIGSTOPped peer's would.
type freezingListener struct {
	net.Listener
	frozen, release chan struct{}
}

func (l freezingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return freezingConn{c, l.frozen, l.release}, nil
}

// freezingConn blocks every read and write once frozen, until release.
type freezingConn struct {
	net.Conn
	frozen, release chan struct{}
}

func (c freezingConn) wait() error {
	select {
	case <-c.frozen:
		<-c.release
		return net.ErrClosed
	default:
		return nil
	}
}

func (c freezingConn) Read(p []byte) (int, error) {
	if err := c.wait(); err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}

func (c freezingConn) Write(p []byte) (int, error) {
	if err := c.wait(); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

// TestOptionsDefaults: every field's zero value takes its default, and the
// bounds given are kept.
func TestOptionsDefaults(t *testing.T) {
	if n := len(Options(Config{})); n != 3 {
		t.Fatalf("default options: %d, want credentials, keepalive, connect params", n)
	}
	if n := len(Options(Config{SendBytesMax: 1, RecvBytesMax: 1, Extra: []grpc.DialOption{grpc.WithUserAgent("x")}})); n != 5 {
		t.Fatalf("with call bounds and an extra: %d options, want 5", n)
	}
}
