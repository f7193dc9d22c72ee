package homing

import (
	"context"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/geolog/geolog/homing/pgtest"
	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

// testLogger routes logs to t.Log.
func testLogger(t testing.TB) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Debug, Output: tWriter{t}})
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// newSQLStore opens a SQLStore on a fresh database. extra adjusts the config.
func newSQLStore(t testing.TB, extra ...func(*SQLConfig)) (*SQLStore, string) {
	t.Helper()
	url := pgtest.NewDatabase(t)
	return openSQLAt(t, url, extra...), url
}

func openSQLAt(t testing.TB, url string, extra ...func(*SQLConfig)) *SQLStore {
	t.Helper()
	cfg := SQLConfig{URL: url, Logger: testLogger(t)}
	for _, f := range extra {
		f(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := OpenSQL(ctx, cfg)
	if err != nil {
		t.Fatalf("open SQL store: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// storeKinds are the Store implementations every contract test runs on.
var storeKinds = []string{"mem", "pg"}

func newStore(t testing.TB, kind string) Store {
	t.Helper()
	switch kind {
	case "mem":
		return NewMemStore()
	case "pg":
		s, _ := newSQLStore(t)
		return s
	}
	t.Fatalf("unknown store kind %q", kind)
	return nil
}

// ctxT bounds a whole test's calls to the lease store. The bound is a
// guard against a hang, not a timing goal: on a machine busy with other
// work (a loaded make test) a test of several rounds of concurrent
// transactions took more than 30 s (TestConcurrentTakeovers, at a load
// average of 40-57), so it is generous.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// faultStore wraps a Store; while down, every call fails as an unreachable
// store's would, without reaching it.
type faultStore struct {
	Store
	down atomic.Bool
}

func (f *faultStore) err() error {
	if f.down.Load() {
		return newError(ErrStoreUnavailable, "lease store is down (test)")
	}
	return nil
}

func (f *faultStore) Heartbeat(ctx context.Context, req HeartbeatRequest) (HeartbeatResult, error) {
	if err := f.err(); err != nil {
		return HeartbeatResult{}, err
	}
	return f.Store.Heartbeat(ctx, req)
}

func (f *faultStore) Takeover(ctx context.Context, req TakeoverRequest) (TakeoverResult, error) {
	if err := f.err(); err != nil {
		return TakeoverResult{}, err
	}
	return f.Store.Takeover(ctx, req)
}

func (f *faultStore) CompleteRehome(ctx context.Context, req RehomeRequest) (Home, error) {
	if err := f.err(); err != nil {
		return Home{}, err
	}
	return f.Store.CompleteRehome(ctx, req)
}

func (f *faultStore) PrepareRehome(ctx context.Context, req RehomeRequest) (Home, error) {
	if err := f.err(); err != nil {
		return Home{}, err
	}
	return f.Store.PrepareRehome(ctx, req)
}

// fakeClock is a settable clock for drivers.
type fakeClock struct{ nanos atomic.Int64 }

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.nanos.Load()) }
func (c *fakeClock) Set(d time.Duration)     { c.nanos.Store(int64(d)) }
func (c *fakeClock) Advance(d time.Duration) { c.nanos.Add(int64(d)) }

// statementCounter is a pgx tracer that counts statements: all of them (n),
// and by the outcome of the transaction they were sent in: committed, or
// aborted (rolled back, or a failed COMMIT). On a busy machine concurrent
// heartbeats conflict more often and are retried in fresh transactions;
// the statements of committed transactions are what one heartbeat costs.
type statementCounter struct {
	n                  atomic.Int64
	committed, aborted atomic.Int64

	mu   sync.Mutex
	open map[*pgx.Conn]int64 // statements of the transaction under way on a connection
}

type sqlKey struct{}

func (c *statementCounter) sent(conn *pgx.Conn, sql string) {
	c.n.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open == nil {
		c.open = map[*pgx.Conn]int64{}
	}
	if strings.HasPrefix(strings.ToLower(sql), "begin") {
		c.open[conn] = 0 // statements before it were outside any transaction
	}
	c.open[conn]++
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.sent(conn, data.SQL)
	return context.WithValue(ctx, sqlKey{}, data.SQL)
}

func (c *statementCounter) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	sql, _ := ctx.Value(sqlKey{}).(string)
	sql = strings.ToLower(sql)
	commit := strings.HasPrefix(sql, "commit")
	if !commit && (!strings.HasPrefix(sql, "rollback") || strings.Contains(sql, "savepoint")) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if commit && data.Err == nil {
		c.committed.Add(c.open[conn])
	} else {
		c.aborted.Add(c.open[conn])
	}
	delete(c.open, conn)
}

// The statements of a batch (one round trip) count one by one.
func (c *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *statementCounter) TraceBatchQuery(_ context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	c.sent(conn, data.SQL)
}

func (c *statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// cutProxy forwards TCP connections to a server until cut: Cut closes every
// connection and refuses new ones (they are accepted and closed at once)
// until Restore.
type cutProxy struct {
	ln       net.Listener
	upstream string
	cut      atomic.Bool
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	wg       sync.WaitGroup
}

func newCutProxy(t testing.TB, upstream string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &cutProxy{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.closeAll()
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) Addr() string { return p.ln.Addr().String() }

func (p *cutProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.cut.Load() {
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			c.Close()
			continue
		}
		if !p.track(c, up) {
			continue
		}
		p.wg.Add(2)
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

func (p *cutProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut.Load() {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *cutProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
}

func (p *cutProxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]struct{}{}
}

// Cut breaks every connection and refuses new ones.
func (p *cutProxy) Cut() {
	p.cut.Store(true)
	p.closeAll()
}

// Restore lets connections through again.
func (p *cutProxy) Restore() { p.cut.Store(false) }

// urlVia returns url with its host replaced by addr.
func urlVia(t testing.TB, url, addr string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Replace(url, cfg.Host+":"+strconv.Itoa(int(cfg.Port)), addr, 1)
}
