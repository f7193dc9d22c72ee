package wan

import (
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// testLogger routes logs to t.Log.
func testLogger(t testing.TB) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "test", Level: hclog.Debug, Output: testWriter{t}})
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// upstream is a loopback TCP server for tests. By default it echoes every
// connection (half-closing when the client half-closes).
type upstream struct {
	ln       net.Listener
	accepted atomic.Int64
	handle   func(net.Conn)
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

func startUpstream(t testing.TB, handle func(net.Conn)) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if handle == nil {
		handle = echo
	}
	u := &upstream{ln: ln, handle: handle}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.accepted.Add(1)
			u.mu.Lock()
			u.conns = append(u.conns, c)
			u.mu.Unlock()
			u.wg.Add(1)
			go func() {
				defer u.wg.Done()
				defer c.Close()
				u.handle(c)
			}()
		}
	}()
	t.Cleanup(u.close)
	return u
}

func (u *upstream) addr() string { return u.ln.Addr().String() }

func (u *upstream) close() {
	u.ln.Close()
	u.mu.Lock()
	for _, c := range u.conns {
		c.Close()
	}
	u.mu.Unlock()
	u.wg.Wait()
}

// echo copies everything back and half-closes after the client does.
func echo(c net.Conn) {
	_, _ = io.Copy(c, c)
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// discard reads and drops everything.
func discard(c net.Conn) { _, _ = io.Copy(io.Discard, c) }

// startLink starts a link closed at cleanup.
func startLink(t testing.TB, cfg Config) *Link {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	l, err := NewLink(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func dial(t testing.TB, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// roundTrip writes msg and reads len(msg) bytes back; it returns the time
// taken.
func roundTrip(t testing.TB, c net.Conn, msg []byte) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Time{})
	if string(got) != string(msg) {
		t.Fatalf("echo = %q, want %q", got, msg)
	}
	return time.Since(start)
}

// expectSilence checks that nothing arrives on c for d (a stall, not an
// error).
func expectSilence(t testing.TB, c net.Conn, d time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	defer c.SetReadDeadline(time.Time{})
	var b [1]byte
	n, err := c.Read(b[:])
	var ne net.Error
	if n != 0 || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read during a blackhole: n=%d err=%v, want a timeout", n, err)
	}
}

// waitFor polls cond until it holds or the deadline passes (callers give
// slack for a busy machine: it returns as soon as cond holds).
func waitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// expectBroken waits for c to fail with an error other than a timeout (the
// peer reset or closed it), for up to 30 s (slack for a busy machine).
func expectBroken(t testing.TB, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 4096)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("connection still open after a reset cut")
		}
		return
	}
}

// expectRefused dials addr and expects the connection to be reset, during
// the connect (the RST can beat connect's return) or at the first read.
func expectRefused(t testing.TB, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 30*time.Second)
	if err != nil {
		return
	}
	defer c.Close()
	expectBroken(t, c)
}
