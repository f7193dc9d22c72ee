package client

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// Client is a connection to a geolog node. It is safe for concurrent use.
type Client struct {
	addr string
	cfg  clientConfig
	log  hclog.Logger
	conn *grpc.ClientConn
	api  geologv1.LogClient

	mu        sync.Mutex
	closed    bool
	producers map[*Producer]struct{}
}

// New returns a client for the node at addr ("host:port"). It validates all
// options; the connection itself is made lazily and re-made as needed.
func New(addr string, opts ...Opt) (*Client, error) {
	if addr == "" {
		return nil, fmt.Errorf("client: empty address")
	}
	cfg := defaultClientConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if cfg.tls != nil {
		creds = credentials.NewTLS(cfg.tls)
	}
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(cfg.messageBytesMax),
			grpc.MaxCallSendMsgSize(cfg.messageBytesMax),
		),
		grpc.WithInitialWindowSize(cfg.streamWindowBytes),
		grpc.WithInitialConnWindowSize(cfg.connWindowBytes),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:    cfg.keepaliveTime,
			Timeout: cfg.keepaliveTimeout,
		}),
		grpc.WithWriteBufferSize(256 << 10),
		grpc.WithReadBufferSize(256 << 10),
	}
	dial = append(dial, cfg.dialOpts...)
	// "passthrough" hands host:port to the dialer as is, as a plain
	// net.Dial would; the default dns resolver would also work but adds a
	// resolution step that buys nothing for a single address.
	conn, err := grpc.NewClient("passthrough:///"+addr, dial...)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return &Client{
		addr:      addr,
		cfg:       cfg,
		log:       cfg.logger.Named("geolog-client"),
		conn:      conn,
		api:       geologv1.NewLogClient(conn),
		producers: make(map[*Producer]struct{}),
	}, nil
}

// Addr returns the address the client was created with.
func (c *Client) Addr() string { return c.addr }

// API returns the raw generated gRPC client on the client's connection, for
// calls this package does not wrap. Errors from it should go through
// apierr.FromError.
func (c *Client) API() geologv1.LogClient { return c.api }

// Close closes every producer of the client (failing unacknowledged records
// with ErrClosed) and then the connection.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	ps := make([]*Producer, 0, len(c.producers))
	for p := range c.producers {
		ps = append(ps, p)
	}
	c.mu.Unlock()
	for _, p := range ps {
		p.Close()
	}
	return c.conn.Close()
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// call runs one unary RPC attempt at a time, bounding each attempt by the
// request timeout when ctx has none, and retries retriable errors with backoff
// up to RetriesMax times when retry is true. Errors go through rpcError.
func (c *Client) call(ctx context.Context, retry bool, fn func(ctx context.Context) error) error {
	if c.isClosed() {
		return ErrClosed
	}
	for attempt := 0; ; attempt++ {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if _, ok := ctx.Deadline(); !ok && c.cfg.requestTimeout > 0 {
			actx, cancel = context.WithTimeout(ctx, c.cfg.requestTimeout)
		}
		err := fn(actx)
		cancel()
		if err == nil {
			return nil
		}
		err = rpcError(ctx, err)
		if !retry || !IsRetriable(err) || attempt >= c.cfg.retriesMax {
			return err
		}
		c.log.Debug("retrying call", "attempt", attempt+1, "error", err)
		if err := sleepCtx(ctx, backoffDelay(attempt+1, c.cfg.backoffMin, c.cfg.backoffMax)); err != nil {
			return err
		}
	}
}

// backoffDelay returns the jittered exponential backoff before attempt n
// (n >= 1): a uniformly random duration in [d/2, d] where d doubles from min
// and is capped at max.
func backoffDelay(n int, min, max time.Duration) time.Duration {
	d := min
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	half := d / 2
	return half + time.Duration(rand.Int64N(int64(d-half)+1))
}

// sleepCtx waits d or until ctx is done, returning ctx.Err() in that case.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
