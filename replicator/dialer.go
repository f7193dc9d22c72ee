package replicator

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/geolog/geolog/internal/grpcdial"

	"github.com/geolog/geolog/batch"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// ReplicateStream is the client side of one Replicate stream.
type ReplicateStream = grpc.BidiStreamingClient[geologinternalv1.ReplicateRequest, geologinternalv1.ReplicateResponse]

// Dialer opens Replicate streams to nodes of a destination region. A Task
// calls Open from its own goroutines; implementations are safe for
// concurrent use. GRPCDialer is the production one; tests wrap it to inject
// faults.
type Dialer interface {
	// Open opens a Replicate stream to the node at addr (host:port). The
	// stream ends when ctx does.
	Open(ctx context.Context, addr string) (ReplicateStream, error)
}

// dialerConnsMax bounds the connections a GRPCDialer keeps: one per
// destination node address. A region has a handful of nodes per stream,
// and one dialer serves every task of a node.
const dialerConnsMax = 256

// DialerConfig configures a GRPCDialer. Zero values take the defaults.
type DialerConfig struct {
	// TLS secures the connections (RootCAs to verify the mirrors, and
	// Certificates for mutual TLS). Default: plaintext.
	TLS *tls.Config
	// Credentials, when set, secure the connections instead of TLS
	// (credentials that reload their certificates, for example).
	Credentials credentials.TransportCredentials
	// KeepaliveInterval is how often an idle connection is pinged, default
	// 10 s; a ping unanswered for KeepaliveTimeout (default 5 s) breaks the
	// connection and with it its streams. The server must permit it (see
	// Server.ServerOptions).
	KeepaliveInterval time.Duration
	KeepaliveTimeout  time.Duration
	// ConnectBackoffMax bounds gRPC's own reconnect backoff, default 5 s.
	ConnectBackoffMax time.Duration
	// SendBytesMax bounds one request on the wire, default
	// batch.FrameBytesMax plus 64 KiB (a lone largest frame and framing).
	SendBytesMax int
}

// GRPCDialer opens streams over one shared gRPC connection per address.
type GRPCDialer struct {
	cfg DialerConfig

	mu     sync.Mutex
	closed bool
	conns  map[string]*dialerConn
	clock  uint64 // orders uses, for eviction
}

type dialerConn struct {
	conn     *grpc.ClientConn
	client   geologinternalv1.MirrorClient
	lastUsed uint64
}

// NewGRPCDialer returns a dialer with no connection yet.
func NewGRPCDialer(cfg DialerConfig) *GRPCDialer {
	setDuration(&cfg.KeepaliveInterval, 10*time.Second)
	setDuration(&cfg.KeepaliveTimeout, 5*time.Second)
	setDuration(&cfg.ConnectBackoffMax, 5*time.Second)
	setInt(&cfg.SendBytesMax, batch.FrameBytesMax+64<<10)
	return &GRPCDialer{cfg: cfg, conns: make(map[string]*dialerConn)}
}

// Open implements Dialer.
func (d *GRPCDialer) Open(ctx context.Context, addr string) (ReplicateStream, error) {
	c, err := d.conn(addr)
	if err != nil {
		return nil, err
	}
	return c.Replicate(ctx)
}

func (d *GRPCDialer) conn(addr string) (geologinternalv1.MirrorClient, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	d.clock++
	if c := d.conns[addr]; c != nil {
		c.lastUsed = d.clock
		return c.client, nil
	}
	if len(d.conns) >= dialerConnsMax {
		// Evict the connection used least recently; its streams (if any)
		// fail and their tasks reconnect.
		var oldest string
		for a, c := range d.conns {
			if oldest == "" || c.lastUsed < d.conns[oldest].lastUsed {
				oldest = a
			}
		}
		_ = d.conns[oldest].conn.Close()
		delete(d.conns, oldest)
	}
	creds := insecure.NewCredentials()
	switch {
	case d.cfg.Credentials != nil:
		creds = d.cfg.Credentials
	case d.cfg.TLS != nil:
		creds = credentials.NewTLS(d.cfg.TLS)
	}
	conn, err := grpcdial.Dial(addr, grpcdial.Config{
		Credentials:   creds,
		KeepaliveTime: d.cfg.KeepaliveInterval, KeepaliveTimeout: d.cfg.KeepaliveTimeout, PermitWithoutStream: true,
		BackoffMin: 50 * time.Millisecond, BackoffMax: d.cfg.ConnectBackoffMax, BackoffMultiplier: 2,
		ConnectTimeout: 5 * time.Second,
		SendBytesMax:   d.cfg.SendBytesMax,
		RecvBytesMax:   64 << 10,
	})
	if err != nil {
		return nil, fmt.Errorf("replicator: dial %s: %w", addr, err)
	}
	c := &dialerConn{conn: conn, client: geologinternalv1.NewMirrorClient(conn), lastUsed: d.clock}
	d.conns[addr] = c
	return c.client, nil
}

// Close closes every connection; streams on them fail. Open then fails
// with ErrClosed.
func (d *GRPCDialer) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	var errs []error
	for a, c := range d.conns {
		errs = append(errs, c.conn.Close())
		delete(d.conns, a)
	}
	return errors.Join(errs...)
}
