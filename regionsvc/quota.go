package regionsvc

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/geolog/geolog/pki"
	"google.golang.org/grpc/peer"
)

// addrPrincipal names a caller without a verified identity (a node without
// TLS): by the peer's IP address, so that a client's connections share its
// quota; calls made in-process (no peer) are "local".
func addrPrincipal(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "local"
	}
	if host, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
		return "ip:" + host
	}
	return "addr:" + p.Addr.String()
}

// quotas are per-principal token buckets for requests and bytes: each
// refills at its rate up to one second's worth; a request is admitted
// while both buckets are positive, and then takes what it costs, which may
// leave a bucket in debt (so a batch larger than a second's worth passes,
// and the principal waits for it afterwards). A refused request takes
// nothing and is told how long until both buckets are positive again.
type quotas struct {
	requestsPerSecond, bytesPerSecond float64
	now                               func() time.Time

	mu      sync.Mutex
	buckets map[string]*quotaBuckets
}

type quotaBuckets struct {
	requests, bytes float64
	at              time.Time
}

// principalsMax bounds the principals with quota state; past it the
// idle ones (full buckets) are forgotten, and a new principal is refused
// until some are.
const principalsMax = 1 << 16

func newQuotas(requestsPerSecond, bytesPerSecond float64, now func() time.Time) *quotas {
	if requestsPerSecond <= 0 && bytesPerSecond <= 0 {
		return nil
	}
	return &quotas{requestsPerSecond: requestsPerSecond, bytesPerSecond: bytesPerSecond, now: now, buckets: map[string]*quotaBuckets{}}
}

// take admits a request of principal costing requests and bytes, or
// returns how long to wait (> 0) before it may be admitted. A nil quotas
// admits everything.
// principal is the principal whose quota ctx's request takes
// (principalOf), or "" when quotas are off or the caller is a node: nodes
// forward and propagate their clients' requests, which took their quota
// where they arrived.
func (q *quotas) principal(ctx context.Context) string {
	if q == nil {
		return ""
	}
	if id, err := pki.PeerIdentity(ctx); err == nil && id.IsNode() {
		return ""
	}
	return principalOf(ctx)
}

func (q *quotas) take(principal string, requests, bytes int64) time.Duration {
	if q == nil || principal == "" {
		return 0
	}
	now := q.now()
	q.mu.Lock()
	defer q.mu.Unlock()
	b := q.buckets[principal]
	if b == nil {
		if len(q.buckets) >= principalsMax && !q.forgetIdle(now) {
			return time.Second
		}
		b = &quotaBuckets{requests: q.requestsPerSecond, bytes: q.bytesPerSecond, at: now}
		q.buckets[principal] = b
	}
	q.refill(b, now)
	wait := max(deficit(b.requests, q.requestsPerSecond), deficit(b.bytes, q.bytesPerSecond))
	if wait > 0 {
		return wait
	}
	if q.requestsPerSecond > 0 {
		b.requests -= float64(requests)
	}
	if q.bytesPerSecond > 0 {
		b.bytes -= float64(bytes)
	}
	return 0
}

// charge takes bytes from principal's byte bucket without asking (a read
// whose size is known once it is read); the debt delays its next request.
func (q *quotas) charge(principal string, bytes int64) {
	if q == nil || q.bytesPerSecond <= 0 || principal == "" {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if b := q.buckets[principal]; b != nil {
		b.bytes -= float64(bytes)
	}
}

func (q *quotas) refill(b *quotaBuckets, now time.Time) {
	dt := now.Sub(b.at).Seconds()
	if dt <= 0 {
		return
	}
	b.at = now
	if q.requestsPerSecond > 0 {
		b.requests = min(q.requestsPerSecond, b.requests+dt*q.requestsPerSecond)
	}
	if q.bytesPerSecond > 0 {
		b.bytes = min(q.bytesPerSecond, b.bytes+dt*q.bytesPerSecond)
	}
}

// deficit is how long a bucket of rate needs to become positive (0 if it
// is, or has no rate).
func deficit(tokens, rate float64) time.Duration {
	if rate <= 0 || tokens > 0 {
		return 0
	}
	// Positive means at least a thousandth of a second's worth.
	return time.Duration((0.001*rate - tokens) / rate * float64(time.Second))
}

// forgetIdle drops the principals whose buckets are full; q.mu is held.
func (q *quotas) forgetIdle(now time.Time) bool {
	before := len(q.buckets)
	for p, b := range q.buckets {
		q.refill(b, now)
		if (q.requestsPerSecond <= 0 || b.requests >= q.requestsPerSecond) && (q.bytesPerSecond <= 0 || b.bytes >= q.bytesPerSecond) {
			delete(q.buckets, p)
		}
	}
	return len(q.buckets) < before
}
