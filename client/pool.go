package client

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/backoff"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// AddrsMax bounds the node addresses a Client knows: the bootstrap
// addresses (New's and Addrs') and those learned from leader hints. Each has
// at most one connection. When a hint names a new address and the table is
// full, the learned address used least recently is dropped (its connection
// closed); bootstrap addresses are never dropped.
const AddrsMax = 64

// leaderCacheEntriesMax bounds the (stream, range) leaders a Client
// remembers. It is a cache: when full, an arbitrary entry makes room.
const leaderCacheEntriesMax = 1 << 16

// parseAddrs splits comma-separated lists of "host:port" addresses, trims
// blanks, drops empty items and duplicates (keeping the first), and checks
// each address's form.
func parseAddrs(lists ...string) ([]string, error) {
	var out []string
	seen := make(map[string]bool)
	for _, list := range lists {
		for _, a := range strings.Split(list, ",") {
			a = strings.TrimSpace(a)
			if a == "" || seen[a] {
				continue
			}
			if err := checkAddr(a); err != nil {
				return nil, err
			}
			seen[a] = true
			out = append(out, a)
		}
	}
	switch {
	case len(out) == 0:
		return nil, fmt.Errorf("client: no node address")
	case len(out) > AddrsMax:
		return nil, fmt.Errorf("client: %d node addresses, at most %d allowed", len(out), AddrsMax)
	}
	return out, nil
}

func checkAddr(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("client: address %q is not host:port: %w", a, err)
	}
	if port == "" || strings.ContainsAny(host, "/ ") {
		return fmt.Errorf("client: address %q is not host:port", a)
	}
	return nil
}

// connPool holds the client's node addresses, one lazily made connection
// per address, what the client knows of each address's health, and the
// range leaders it learned. Its methods are safe for concurrent use.
//
// Addresses form a ring (bootstrap addresses first, learned ones after, in
// the order learned). An address is down for a jittered backoff after a
// failure (growing with consecutive failures, reset by a success); calls
// that may go to any node skip down addresses while another is up.
type connPool struct {
	dial                   []grpc.DialOption
	backoffMin, backoffMax time.Duration

	mu      sync.Mutex
	closed  bool
	nodes   []*poolNode // the ring
	cur     int         // the ring index calls that may go anywhere use
	leaders map[leaderKey]string
}

type poolNode struct {
	addr      string
	bootstrap bool
	conn      *grpc.ClientConn // nil until first used
	api       geologv1.LogClient
	failures  int       // consecutive
	downUntil time.Time // zero: up
	lastUsed  time.Time // for evicting learned addresses
}

type leaderKey struct {
	stream string
	rng    uint32
}

func newConnPool(addrs []string, dial []grpc.DialOption, backoffMin, backoffMax time.Duration) *connPool {
	p := &connPool{dial: dial, backoffMin: backoffMin, backoffMax: backoffMax, leaders: make(map[leaderKey]string)}
	for _, a := range addrs {
		p.nodes = append(p.nodes, &poolNode{addr: a, bootstrap: true})
	}
	return p
}

func (p *connPool) indexLocked(addr string) int {
	for i, n := range p.nodes {
		if n.addr == addr {
			return i
		}
	}
	return -1
}

// addrs returns the known addresses in ring order.
func (p *connPool) addrs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, len(p.nodes))
	for i, n := range p.nodes {
		out[i] = n.addr
	}
	return out
}

// pick returns the address for a call that any node can serve: the current
// one if it is up, else the next one up in ring order, else the one that
// comes back soonest. The choice sticks, so calls share one connection
// while its node is healthy.
func (p *connPool) pick() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	best := -1
	for k := range p.nodes {
		i := (p.cur + k) % len(p.nodes)
		n := p.nodes[i]
		if !now.Before(n.downUntil) {
			p.cur = i
			return n.addr
		}
		if best < 0 || n.downUntil.Before(p.nodes[best].downUntil) {
			best = i
		}
	}
	p.cur = best
	return p.nodes[best].addr
}

// next returns the address after addr in ring order, skipping down
// addresses while one is up: where a caller that gave up on addr goes.
// With a single address it is that address.
func (p *connPool) next(addr string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := p.indexLocked(addr)
	if i < 0 {
		i = p.cur
	}
	return p.afterLocked(i, func(*poolNode) bool { return true })
}

// nextBootstrap is next among the bootstrap addresses (from the first if
// addr is not one).
func (p *connPool) nextBootstrap(addr string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := p.indexLocked(addr)
	if i < 0 || !p.nodes[i].bootstrap {
		i = len(p.nodes) - 1
	}
	return p.afterLocked(i, func(n *poolNode) bool { return n.bootstrap })
}

// afterLocked returns the first address after ring index i that keep
// accepts and that is up, else the first it accepts (else the next one).
func (p *connPool) afterLocked(i int, keep func(*poolNode) bool) string {
	now := time.Now()
	first := -1
	for k := 1; k <= len(p.nodes); k++ {
		j := (i + k) % len(p.nodes)
		n := p.nodes[j]
		if !keep(n) {
			continue
		}
		if !now.Before(n.downUntil) {
			return n.addr
		}
		if first < 0 {
			first = j
		}
	}
	if first < 0 {
		first = (i + 1) % len(p.nodes)
	}
	return p.nodes[first].addr
}

// failed records that addr could not serve a request: it is down for a
// backoff, and calls that may go anywhere move off it.
func (p *connPool) failed(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := p.indexLocked(addr)
	if i < 0 {
		return
	}
	n := p.nodes[i]
	n.failures++
	n.downUntil = time.Now().Add(backoff.Delay(n.failures-1, p.backoffMin, p.backoffMax, nil))
	if i == p.cur {
		p.cur = (i + 1) % len(p.nodes)
	}
}

// succeeded records that addr answered.
func (p *connPool) succeeded(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i := p.indexLocked(addr); i >= 0 {
		p.nodes[i].failures = 0
		p.nodes[i].downUntil = time.Time{}
	}
}

// api returns the gRPC client of addr's connection, making the connection
// on first use. An unknown address is learned (see AddrsMax); the error is
// ErrClosed once the pool is closed, or a retriable Unavailable *Error when
// the address cannot be used.
func (p *connPool) api(addr string) (geologv1.LogClient, *grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, nil, ErrClosed
	}
	i := p.indexLocked(addr)
	if i < 0 {
		if err := checkAddr(addr); err != nil {
			return nil, nil, apierr.Wrap(apierr.Unavailable, err, "")
		}
		if !p.makeRoomLocked() {
			return nil, nil, apierr.New(apierr.Unavailable, "address table full (%d), not learning %s", AddrsMax, addr)
		}
		p.nodes = append(p.nodes, &poolNode{addr: addr})
		i = len(p.nodes) - 1
	}
	n := p.nodes[i]
	n.lastUsed = time.Now()
	if n.conn == nil {
		// "passthrough" hands host:port to the dialer as is, as a plain
		// net.Dial would; the dns resolver would add a resolution step
		// that buys nothing for one address.
		conn, err := grpc.NewClient("passthrough:///"+addr, p.dial...)
		if err != nil {
			return nil, nil, apierr.Wrap(apierr.Unavailable, err, "connect to %s", addr)
		}
		n.conn, n.api = conn, geologv1.NewLogClient(conn)
	}
	return n.api, n.conn, nil
}

// makeRoomLocked drops the learned address used least recently when the
// table is full; false if there is none to drop.
func (p *connPool) makeRoomLocked() bool {
	if len(p.nodes) < AddrsMax {
		return true
	}
	victim := -1
	for i, n := range p.nodes {
		if !n.bootstrap && (victim < 0 || n.lastUsed.Before(p.nodes[victim].lastUsed)) {
			victim = i
		}
	}
	if victim < 0 {
		return false
	}
	// A stream still on it ends and its owner retries elsewhere.
	if c := p.nodes[victim].conn; c != nil {
		_ = c.Close()
	}
	p.nodes = append(p.nodes[:victim], p.nodes[victim+1:]...)
	if victim < p.cur {
		p.cur--
	}
	if p.cur >= len(p.nodes) {
		p.cur = 0
	}
	return true
}

// waitReady waits until addr's connection is established. A request that
// must not be sent twice goes only over a ready connection, so that a node
// that cannot be reached is skipped without doubt about whether it got the
// request. The error is a retriable Unavailable when the connection failed.
func (p *connPool) waitReady(ctx context.Context, addr string, conn *grpc.ClientConn) error {
	conn.Connect()
	for {
		switch s := conn.GetState(); s {
		case connectivity.Ready:
			return nil
		case connectivity.TransientFailure:
			return apierr.New(apierr.Unavailable, "no connection to %s", addr)
		case connectivity.Shutdown:
			return ErrClosed
		default:
			if !conn.WaitForStateChange(ctx, s) {
				return ctx.Err()
			}
		}
	}
}

// leader returns the cached leader address of a range, or "".
func (p *connPool) leader(stream string, rng uint32) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.leaders[leaderKey{stream, rng}]
}

// setLeader caches addr as the leader of a range.
func (p *connPool) setLeader(stream string, rng uint32, addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := leaderKey{stream, rng}
	if _, ok := p.leaders[k]; !ok && len(p.leaders) >= leaderCacheEntriesMax {
		for old := range p.leaders {
			delete(p.leaders, old)
			break
		}
	}
	p.leaders[k] = addr
}

// forgetLeader drops a range's cached leader if it is still addr, so that a
// newer entry another producer learned meanwhile survives.
func (p *connPool) forgetLeader(stream string, rng uint32, addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := leaderKey{stream, rng}
	if p.leaders[k] == addr {
		delete(p.leaders, k)
	}
}

// close closes every connection; later api calls fail with ErrClosed.
func (p *connPool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var first error
	for _, n := range p.nodes {
		if n.conn != nil {
			if err := n.conn.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// pooledAPI is a geologv1.LogClient whose every call goes to the pool's
// pick, once (see Client.API).
type pooledAPI struct{ p *connPool }

func (a pooledAPI) api() (geologv1.LogClient, error) {
	api, _, err := a.p.api(a.p.pick())
	return api, err
}

func (a pooledAPI) Append(ctx context.Context, in *geologv1.AppendRequest, opts ...grpc.CallOption) (*geologv1.AppendResponse, error) {
	api, err := a.api()
	if err != nil {
		return nil, err
	}
	return api.Append(ctx, in, opts...)
}

func (a pooledAPI) AppendStream(ctx context.Context, opts ...grpc.CallOption) (grpc.BidiStreamingClient[geologv1.AppendRequest, geologv1.AppendResponse], error) {
	api, err := a.api()
	if err != nil {
		return nil, err
	}
	return api.AppendStream(ctx, opts...)
}

func (a pooledAPI) Read(ctx context.Context, in *geologv1.ReadRequest, opts ...grpc.CallOption) (*geologv1.ReadResponse, error) {
	api, err := a.api()
	if err != nil {
		return nil, err
	}
	return api.Read(ctx, in, opts...)
}

func (a pooledAPI) Subscribe(ctx context.Context, in *geologv1.SubscribeRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[geologv1.SubscribeResponse], error) {
	api, err := a.api()
	if err != nil {
		return nil, err
	}
	return api.Subscribe(ctx, in, opts...)
}

func (a pooledAPI) CreateStream(ctx context.Context, in *geologv1.CreateStreamRequest, opts ...grpc.CallOption) (*geologv1.CreateStreamResponse, error) {
	api, err := a.api()
	if err != nil {
		return nil, err
	}
	return api.CreateStream(ctx, in, opts...)
}

func (a pooledAPI) ListStreams(ctx context.Context, in *geologv1.ListStreamsRequest, opts ...grpc.CallOption) (*geologv1.ListStreamsResponse, error) {
	api, err := a.api()
	if err != nil {
		return nil, err
	}
	return api.ListStreams(ctx, in, opts...)
}

func (a pooledAPI) DescribeStream(ctx context.Context, in *geologv1.DescribeStreamRequest, opts ...grpc.CallOption) (*geologv1.DescribeStreamResponse, error) {
	api, err := a.api()
	if err != nil {
		return nil, err
	}
	return api.DescribeStream(ctx, in, opts...)
}

func (a pooledAPI) DeleteStream(ctx context.Context, in *geologv1.DeleteStreamRequest, opts ...grpc.CallOption) (*geologv1.DeleteStreamResponse, error) {
	api, err := a.api()
	if err != nil {
		return nil, err
	}
	return api.DeleteStream(ctx, in, opts...)
}

func (a pooledAPI) AlterStream(ctx context.Context, in *geologv1.AlterStreamRequest, opts ...grpc.CallOption) (*geologv1.AlterStreamResponse, error) {
	api, err := a.api()
	if err != nil {
		return nil, err
	}
	return api.AlterStream(ctx, in, opts...)
}
