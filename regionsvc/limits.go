package regionsvc

import (
	"context"
	"math"
	"math/rand/v2"
	"net"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/hashicorp/go-hclog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/tap"
)

// Limits (DESIGN.md "Security": memory per request, per connection and
// per node is bounded). What a client can make a node hold, and where it
// is bounded:
//
//   - a request on the wire: the receive limit (BatchBytesMax + 1 MiB)
//     for every message, and an append's records and headers counted
//     before it is decoded (codec.go);
//   - requests being received (receive.go): a request of the client API
//     (AppendStream's aside) waits for a receive slot among
//     RequestsWaitingMax, each holding at most its stream's flow-control
//     window (4 MiB) of request bytes sent ahead, and is refused at once
//     with OVERLOADED when none is free; RequestsReceivingMax requests
//     read theirs at once (up to the receive limit each), a request
//     waiting up to receiveWaitMax for a slot before OVERLOADED (a method
//     whose handler is not gated takes its slot as it arrives, as all did
//     before); an AppendStream receives one request at a time, and a
//     connection carries StreamsPerConnectionMax streams;
//   - appends in flight, from decoding to the answer:
//     AppendBytesInflightMax bytes of encoded batches;
//   - reads and subscription messages being read and sent:
//     ReadBytesInflightMax bytes (twice a reply's bound each: the frames
//     read and the encoded reply); a subscriber that does not take a
//     message within SubscriberSendTimeout is cut off with SLOW_CONSUMER;
//   - connections: ConnectionsMax in all and ConnectionsPerAddressMax per
//     peer address, each handshaken within HandshakeTimeout, and closed
//     after ConnectionIdleMax without a stream;
//   - ranges: RangesMax per node, checked before a create is accepted;
//   - per principal (principalOf), requests and bytes per second
//     (QuotaRequestsPerSecond, QuotaBytesPerSecond; off by default).
//
// A request refused by a budget or quota gets a retriable OVERLOADED with
// a retry-after that the SDK honours.

// LimitsConfig are the node's resource bounds (see limits.go). Zero values
// take the documented defaults; defaults that depend on file descriptors
// are computed from the process's RLIMIT_NOFILE as Start finds it (raise
// it first: RaiseFileLimit).
type LimitsConfig struct {
	// AppendBytesInflightMax bounds the encoded bytes of appends between
	// their decoding and their answer, default 128 MiB.
	AppendBytesInflightMax int64
	// ReadBytesInflightMax bounds the bytes of reads and subscription
	// messages being read and sent, default 128 MiB.
	ReadBytesInflightMax int64
	// RequestsReceivingMax bounds the unary client requests being read
	// and decoded at once, default 8: each may reach the receive limit
	// (BatchBytesMax + 1 MiB). RequestsWaitingMax bounds those admitted
	// to wait for one of these slots, default 256 (fewer under a memory
	// limit: waitingMaxDefault): each holds at most its stream's
	// flow-control window (4 MiB) until it is read.
	RequestsReceivingMax, RequestsWaitingMax int
	// StreamsPerConnectionMax bounds the concurrent RPCs of a connection,
	// default 1024.
	StreamsPerConnectionMax int
	// ConnectionsMax bounds the node's inbound connections, default a
	// quarter of RLIMIT_NOFILE; ConnectionsPerAddressMax those of one
	// peer address, default half of ConnectionsMax. Connections past them
	// are closed as they are accepted.
	ConnectionsMax, ConnectionsPerAddressMax int
	// HandshakeTimeout bounds a new connection's handshakes (TLS, HTTP/2),
	// default 10 s. ConnectionIdleMax closes a connection without an RPC
	// for that long, default 15 min.
	HandshakeTimeout, ConnectionIdleMax time.Duration
	// SubscriberSendTimeout is how long a subscription message may wait
	// for its subscriber to take it before the subscriber is cut off
	// (SLOW_CONSUMER), default 30 s.
	SubscriberSendTimeout time.Duration
	// RangesMax bounds the ranges the node hosts (every range of every
	// stream placed in its region), default 16,384: an idle range holds
	// no file descriptor (FileDescriptorsMax bounds them node-wide), so
	// the bound is memory, about 125 KiB per idle range.
	RangesMax int
	// FileDescriptorsMax bounds the descriptors of the ranges' files
	// (segments, their key indexes, Raft state) held at once, node-wide:
	// idle files are closed, least recently used first, and reopened on
	// their next use (vfs.Cache). A file being written, not yet synced
	// or in a call is never closed, so the bound is exceeded while that
	// many are busy. Default half of what ConnectionsMax and the reserve
	// leave of RLIMIT_NOFILE, at least 64.
	FileDescriptorsMax int
	// QuotaRequestsPerSecond and QuotaBytesPerSecond bound each
	// principal's requests and bytes (appended or read) per second; 0
	// (the default) means no quota.
	QuotaRequestsPerSecond, QuotaBytesPerSecond float64
	// receiveWait bounds a request's wait for a receive slot,
	// receiveWaitMax (tests lengthen it).
	receiveWait time.Duration
}

// File descriptors kept for everything but connections and range files,
// and RangesMax's default (see RangesMax).
const (
	fdsReserved      = 512
	rangesMaxDefault = 16384
)

// overloadRetryAfter is the wait a budget's refusal asks for, jittered:
// budgets drain as appends are answered and reads sent.
const overloadRetryAfter = 100 * time.Millisecond

// streamWindowBytes is the server's flow-control window per stream
// (baseServerOptions): what a request waiting to be read may hold.
const streamWindowBytes = 4 << 20

// waitingMaxDefault is RequestsWaitingMax's default: 256, or fewer under
// a memory limit (GOMEMLIMIT, --memory-limit) so that the requests
// waiting to be read, each holding up to a stream window, hold at most a
// quarter of it (at least 16 of them). gRPC hands out a connection's
// window as the bytes arrive, not as they are read, so only the stream
// windows bound them: 256 x 4 MiB is 1 GiB, over a 700 MiB limit.
func waitingMaxDefault(memoryLimit int64) int {
	n := int64(256)
	if memoryLimit > 0 && memoryLimit < math.MaxInt64 {
		n = min(n, max(16, memoryLimit/4/streamWindowBytes))
	}
	return int(n)
}

func (c *LimitsConfig) setDefaults(fileLimit int) {
	setDefault(&c.AppendBytesInflightMax, 128<<20)
	setDefault(&c.ReadBytesInflightMax, 128<<20)
	setDefault(&c.RequestsReceivingMax, 8)
	setDefault(&c.RequestsWaitingMax, waitingMaxDefault(debug.SetMemoryLimit(-1)))
	setDefault(&c.receiveWait, receiveWaitMax)
	setDefault(&c.StreamsPerConnectionMax, 1024)
	setDefault(&c.ConnectionsMax, max(64, fileLimit/4))
	setDefault(&c.ConnectionsPerAddressMax, max(16, c.ConnectionsMax/2))
	setDefault(&c.HandshakeTimeout, 10*time.Second)
	setDefault(&c.ConnectionIdleMax, 15*time.Minute)
	setDefault(&c.SubscriberSendTimeout, 30*time.Second)
	setDefault(&c.RangesMax, rangesMaxDefault)
	setDefault(&c.FileDescriptorsMax, max(64, (fileLimit-c.ConnectionsMax-fdsReserved)/2))
}

func setDefault[T int | int64 | time.Duration](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// limits are a node's budgets, quotas and counters.
type limits struct {
	cfg       LimitsConfig
	logger    hclog.Logger
	appends   *byteBudget
	reads     *byteBudget
	receiving *slots
	waiting   *slots
	// gated holds the full names of the methods whose handlers take a
	// receive slot before they read (receiveGated, before the server
	// serves; read-only after).
	gated   map[string]bool
	quotas  *quotas
	metrics *nodeMetrics
	// refusedConns counts connections closed at accept; refused the
	// requests refused, by limit (limitNames).
	refusedConns atomic.Uint64
	refused      [len(limitNames)]atomic.Uint64
}

// limitNames are the limits a request can be refused by, as counted.
var limitNames = [...]string{"receiving", "appends", "reads", "quota", "slow_consumer"}

// count counts a refusal by limit.
func (l *limits) count(limit string) {
	for i, name := range limitNames {
		if name == limit {
			l.refused[i].Add(1)
		}
	}
}

// refusals returns the requests refused by limit so far.
func (l *limits) refusals(limit string) uint64 {
	for i, name := range limitNames {
		if name == limit {
			return l.refused[i].Load()
		}
	}
	return 0
}

func newLimits(cfg LimitsConfig, now func() time.Time, metrics *nodeMetrics, logger hclog.Logger) *limits {
	return &limits{
		cfg:       cfg,
		logger:    logger.Named("limits"),
		appends:   newByteBudget("appends", cfg.AppendBytesInflightMax),
		reads:     newByteBudget("reads", cfg.ReadBytesInflightMax),
		receiving: newSlots(cfg.RequestsReceivingMax),
		waiting:   newSlots(cfg.RequestsWaitingMax),
		gated:     map[string]bool{},
		quotas:    newQuotas(cfg.QuotaRequestsPerSecond, cfg.QuotaBytesPerSecond, now),
		metrics:   metrics,
	}
}

// overloaded is the refusal of a request by limit, counted.
func (l *limits) overloaded(ctx context.Context, limit string, retryAfter time.Duration, format string, args ...any) *apierr.Error {
	l.count(limit)
	if l.metrics != nil {
		l.metrics.overloads.Add(ctx, 1, limitAttr(limit))
	}
	return apierr.NewOverloaded(retryAfter, format, args...)
}

// jittered spreads a retry-after over [d, 1.5d), so that refused clients
// do not come back together.
func jittered(d time.Duration) time.Duration {
	return d + time.Duration(rand.Int64N(int64(d)/2+1))
}

// serverOptions are the gRPC options that enforce the limits.
func (l *limits) serverOptions(recvLimit int) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(recvLimit),
		grpc.ForceServerCodecV2(newAPICodec()),
		grpc.MaxConcurrentStreams(uint32(l.cfg.StreamsPerConnectionMax)),
		grpc.ConnectionTimeout(l.cfg.HandshakeTimeout),
		grpc.InTapHandle(l.tap),
		grpc.StatsHandler(limitsStats{}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: l.cfg.ConnectionIdleMax,
			Time: 30 * time.Second, Timeout: 10 * time.Second}),
	}
}

// clientAPI reports whether method belongs to the public services.
func clientAPI(method string) bool {
	return strings.HasPrefix(method, "/geolog.v1.")
}

// tap admits a new RPC of the client API (gRPC calls it as the RPC's
// headers arrive, before any of its request is read): every one gets an
// rpcHold, and all but AppendStream a waiting slot (receive.go), or
// OVERLOADED at once.
func (l *limits) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if !clientAPI(info.FullMethodName) {
		return ctx, nil
	}
	h := &rpcHold{}
	if info.FullMethodName != "/geolog.v1.Log/AppendStream" {
		// An AppendStream's requests take the quota one by one.
		p := l.quotas.principal(ctx)
		if wait := l.quotas.take(p, 1, 0); wait > 0 {
			e := l.overloaded(ctx, "quota", wait, "%s is over its quota; retry in %v", p, wait)
			return ctx, rpcerr.ToStatus(e)
		}
		if err := l.admitReceive(ctx, info.FullMethodName, h); err != nil {
			return ctx, err
		}
	}
	ctx = context.WithValue(ctx, rpcHoldKey{}, h)
	// Whatever happens to the RPC, its stream's context ends with it.
	context.AfterFunc(ctx, h.release)
	return ctx, nil
}

// admitReceive gives the RPC of method a waiting slot if its handler
// takes a receive slot before it reads (receiveGated), else the receive
// slot itself, its request being read as soon as its goroutine runs; or
// OVERLOADED, as a status.
func (l *limits) admitReceive(ctx context.Context, method string, h *rpcHold) error {
	if !l.gated[method] {
		if !l.receiving.tryTake() {
			e := l.overloaded(ctx, "receiving", jittered(overloadRetryAfter), "node is receiving %d requests", l.cfg.RequestsReceivingMax)
			return rpcerr.ToStatus(e)
		}
		h.slot = l.receiving
		return nil
	}
	if !l.waiting.tryTake() {
		e := l.overloaded(ctx, "receiving", jittered(overloadRetryAfter), "node has %d requests waiting to be received", l.cfg.RequestsWaitingMax)
		return rpcerr.ToStatus(e)
	}
	h.wait = l.waiting
	return nil
}

// limitsStats returns an RPC's receive slot once its request is decoded,
// and everything it holds when it ends.
type limitsStats struct{}

func (limitsStats) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (limitsStats) HandleRPC(ctx context.Context, s stats.RPCStats) {
	h := holdOf(ctx)
	if h == nil {
		return
	}
	switch s.(type) {
	case *stats.InPayload:
		h.received()
	case *stats.End:
		h.release()
	}
}

func (limitsStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (limitsStats) HandleConn(context.Context, stats.ConnStats)                       {}

// holdRead takes bytes of the read budget for the RPC of ctx, until it
// ends (or until the returned func, for a subscription's message). It
// waits up to wait for them; it refuses with OVERLOADED.
func (l *limits) holdRead(ctx context.Context, bytes int64, wait time.Duration) (func(), error) {
	ok := false
	if wait > 0 {
		ok = l.reads.acquire(ctx, bytes, wait)
	} else {
		ok = l.reads.tryAcquire(bytes)
	}
	if !ok {
		return nil, l.overloaded(ctx, "reads", jittered(overloadRetryAfter), "node is sending %d bytes of reads", l.reads.inUse())
	}
	var once sync.Once
	return func() { once.Do(func() { l.reads.release(bytes) }) }, nil
}

// limitListener closes connections past the node's bounds as it accepts
// them (so that they cost no more than the accept), and counts the others
// until they close.
type limitListener struct {
	net.Listener
	l *limits

	mu     sync.Mutex
	total  int
	byAddr map[string]int
}

func newLimitListener(lis net.Listener, l *limits) *limitListener {
	return &limitListener{Listener: lis, l: l, byAddr: map[string]int{}}
}

func (ll *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := ll.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := remoteHost(c)
		ll.mu.Lock()
		ok := ll.total < ll.l.cfg.ConnectionsMax && ll.byAddr[addr] < ll.l.cfg.ConnectionsPerAddressMax
		if ok {
			ll.total++
			ll.byAddr[addr]++
		}
		ll.mu.Unlock()
		if !ok {
			if ll.l.refusedConns.Add(1)%1000 == 1 {
				ll.l.logger.Warn("refusing connections past the limits", "from", addr, "connections_max", ll.l.cfg.ConnectionsMax,
					"per_address_max", ll.l.cfg.ConnectionsPerAddressMax, "refused", ll.l.refusedConns.Load())
			}
			c.Close()
			continue
		}
		return &limitConn{Conn: c, ll: ll, addr: addr}, nil
	}
}

func (ll *limitListener) done(addr string) {
	ll.mu.Lock()
	defer ll.mu.Unlock()
	ll.total--
	if ll.byAddr[addr]--; ll.byAddr[addr] <= 0 {
		delete(ll.byAddr, addr)
	}
}

// connections returns the connections open now.
func (ll *limitListener) connections() int {
	ll.mu.Lock()
	defer ll.mu.Unlock()
	return ll.total
}

type limitConn struct {
	net.Conn
	ll   *limitListener
	addr string
	once sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.ll.done(c.addr) })
	return err
}

func remoteHost(c net.Conn) string {
	a := c.RemoteAddr()
	if a == nil {
		return ""
	}
	if host, _, err := net.SplitHostPort(a.String()); err == nil {
		return host
	}
	return a.String()
}

// checkRanges refuses a create that would take the node past RangesMax:
// it reserves the ranges until release is called (the create is done, or
// failed).
func (n *Node) reserveRanges(add uint32) (release func(), err error) {
	n.rangesMu.Lock()
	defer n.rangesMu.Unlock()
	hosted := 0
	n.mu.RLock()
	for _, st := range n.streams {
		hosted += len(st.ranges)
	}
	n.mu.RUnlock()
	if have := hosted + n.rangesReserved; have+int(add) > n.cfg.Limits.RangesMax {
		return nil, apierr.New(apierr.LimitExceeded, "the node hosts %d ranges; %d more would pass its bound of %d (--ranges-max, file descriptors)",
			have, add, n.cfg.Limits.RangesMax)
	}
	n.rangesReserved += int(add)
	var once sync.Once
	return func() {
		once.Do(func() {
			n.rangesMu.Lock()
			n.rangesReserved -= int(add)
			n.rangesMu.Unlock()
		})
	}, nil
}

func limitAttr(limit string) metric.MeasurementOption {
	return metric.WithAttributes(attribute.String("limit", limit))
}

// frameBytesMax bounds a frame of the node's log: an append batch (control
// frames are smaller).
func (c *Config) frameBytesMax() int { return c.BatchBytesMax + batch.HeaderSize }

// recvMsgBytesMax is the receive limit of every message the node takes:
// a batch and the messages around it (an append's fields, a Raft message,
// a mirror batch) fit.
func (c *Config) recvMsgBytesMax() int { return c.BatchBytesMax + 1<<20 }

// raftMessageBytesMax bounds a Raft message between the region's nodes: one
// entry of a frame and Raft's fields.
func (c *Config) raftMessageBytesMax() int { return c.BatchBytesMax + 512<<10 }
