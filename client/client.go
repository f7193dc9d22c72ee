package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/geolog/geolog/internal/backoff"
	"github.com/geolog/geolog/internal/grpcdial"

	"github.com/hashicorp/go-hclog"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// Client is a connection to the nodes of a geolog region. It is safe for
// concurrent use.
//
// It knows a set of node addresses (see New, Addrs and AddrsMax) with one
// lazily made connection each. Admin and read calls go to any healthy
// address and move to the next one on a retriable error; producers route
// each range to its leader (see the package doc, "Routing").
type Client struct {
	addr string
	cfg  clientConfig
	log  hclog.Logger
	pool *connPool

	mu        sync.Mutex
	closed    bool
	producers map[*Producer]struct{}
	// coordinators: where cursors' and groups' requests go (cursors.go).
	coordinators coordinators
}

// New returns a client for the nodes at addr: one "host:port" or a
// comma-separated list of them ("10.0.0.1:7400,10.0.0.2:7400"), joined by
// those of the Addrs option. Any node of the region will do; the client
// learns range leaders from the nodes' hints. New validates all options and
// addresses; connections are made lazily and re-made as needed.
func New(addr string, opts ...Opt) (*Client, error) {
	cfg := defaultClientConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	addrs, err := parseAddrs(append([]string{addr}, cfg.addrs...)...)
	if err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if cfg.tls != nil {
		creds = credentials.NewTLS(cfg.tls)
	}
	extra := []grpc.DialOption{
		grpc.WithInitialWindowSize(cfg.streamWindowBytes),
		grpc.WithInitialConnWindowSize(cfg.connWindowBytes),
		grpc.WithWriteBufferSize(256 << 10),
		grpc.WithReadBufferSize(256 << 10),
	}
	if cfg.token != nil {
		extra = append(extra, grpc.WithPerRPCCredentials(bearerCreds{source: cfg.token}))
	}
	// A node that died and came back should be reachable again within
	// the retry backoff, not gRPC's default of up to two minutes.
	dial := grpcdial.Options(grpcdial.Config{
		Credentials:      creds,
		KeepaliveTime:    cfg.keepaliveTime,
		KeepaliveTimeout: cfg.keepaliveTimeout,
		BackoffMin:       cfg.backoffMin,
		BackoffMax:       cfg.backoffMax,
		ConnectTimeout:   connectTimeoutMin,
		SendBytesMax:     cfg.messageBytesMax,
		RecvBytesMax:     cfg.messageBytesMax,
		Extra:            append(extra, cfg.dialOpts...),
	})
	if cfg.tracerProvider != nil {
		dial = append(dial, grpc.WithStatsHandler(otelgrpc.NewClientHandler(
			otelgrpc.WithTracerProvider(cfg.tracerProvider),
			otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()),
			otelgrpc.WithPropagators(propagation.TraceContext{}))))
	}
	return &Client{
		addr:      addr,
		cfg:       cfg,
		log:       cfg.logger.Named("geolog-client"),
		pool:      newConnPool(addrs, dial, cfg.backoffMin, cfg.backoffMax),
		producers: make(map[*Producer]struct{}),
	}, nil
}

// connectTimeoutMin bounds one attempt to establish a connection (gRPC's
// MinConnectTimeout, whose default is 20s).
const connectTimeoutMin = 10 * time.Second

// Addr returns the addr argument of New, as given.
func (c *Client) Addr() string { return c.addr }

// Addrs returns the node addresses the client knows now, bootstrap
// addresses first, then those learned from leader hints.
func (c *Client) Addrs() []string { return c.pool.addrs() }

// API returns a raw generated gRPC client for calls this package does not
// wrap. Each of its calls goes to the address the client currently prefers
// for calls any node can serve, without retries or failover. Errors from it
// should go through FromError.
func (c *Client) API() geologv1.LogClient { return pooledAPI{c.pool} }

// Close closes every producer of the client (failing unacknowledged records
// with ErrClosed) and then the connections.
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
	return c.pool.close()
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// call runs one unary RPC attempt at a time against the client's nodes,
// bounding each attempt by the request timeout when ctx has none. Errors go
// through rpcError.
//
// The first attempt goes to the pool's pick. After a retriable error the
// next attempt goes to the error's leader hint if it has one, else the
// address is marked failed and the next attempt goes to the pool's pick
// (another address while one is up). With retry, retriable errors are
// retried with backoff up to RetriesMax times. Without retry (a call that
// must not run twice) the request is sent only over an established
// connection and never resent; attempts that could not reach a node are
// retried like retriable errors, since nothing was sent.
func (c *Client) call(ctx context.Context, retry bool, fn func(ctx context.Context, api geologv1.LogClient) error) error {
	return c.callConn(ctx, retry, func(ctx context.Context, api geologv1.LogClient, _ *grpc.ClientConn) error { return fn(ctx, api) })
}

// callConn is call with the attempt's connection, for the other services
// a node serves (the Consumer service).
func (c *Client) callConn(ctx context.Context, retry bool, fn func(ctx context.Context, api geologv1.LogClient, conn *grpc.ClientConn) error) error {
	if c.isClosed() {
		return ErrClosed
	}
	outer := ctx
	if c.cfg.callTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.callTimeout)
		defer cancel()
	}
	addr := c.pool.pick()
	overloads := 0
	for attempt := 0; ; attempt++ {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if _, ok := ctx.Deadline(); !ok && c.cfg.requestTimeout > 0 {
			actx, cancel = context.WithTimeout(ctx, c.cfg.requestTimeout)
		}
		sent := false
		api, conn, err := c.pool.api(addr)
		if err == nil && !retry {
			err = c.pool.waitReady(actx, addr, conn)
		}
		if err == nil {
			sent = true
			err = fn(actx, api, conn)
		}
		cancel()
		if err == nil {
			c.pool.succeeded(addr)
			return nil
		}
		err = rpcError(ctx, err)
		if !IsRetriable(err) {
			return err
		}
		from := addr
		if retry && CodeOf(err) == CodeOverloaded && overloads < overloadRetriesMax {
			// The node shed the call before it ran it and said when to
			// come back: that is not a failure of the node, so it costs
			// no retry of RetriesMax (like Kafka's throttling) and the
			// call stays at the node; CallTimeout or ctx bound the wait.
			overloads++
			attempt--
		} else {
			addr = c.nextAddr(addr, err)
		}
		if (!retry && sent) || attempt >= c.cfg.retriesMax {
			return err
		}
		c.log.Debug("retrying call", "attempt", attempt+1, "addr", from, "next_addr", addr, "error", err)
		if serr := backoff.Sleep(ctx, retryDelay(err, attempt+1, c.cfg.backoffMin, c.cfg.backoffMax)); serr != nil {
			if outer.Err() == nil {
				// CallTimeout ran out: what failed says more than the
				// deadline does.
				return fmt.Errorf("gave up after %d attempts in %v: %w", attempt+1, c.cfg.callTimeout, err)
			}
			return serr
		}
	}
}

// overloadRetriesMax bounds the retries of one call answered OVERLOADED
// (each after the retry-after the node gave), beside RetriesMax.
const overloadRetriesMax = 100

// nextAddr returns where a call that any node can serve goes after addr
// answered the retriable err: to the leader hint if err carries a usable
// one, else to the pool's pick after marking addr failed.
func (c *Client) nextAddr(addr string, err error) string {
	if hint := leaderHint(err, addr); hint != "" {
		return hint
	}
	c.pool.failed(addr)
	return c.pool.pick()
}

// leaderHint returns the leader hint of err when it names a well-formed
// address other than from, or "".
func leaderHint(err error, from string) string {
	var e *Error
	if !errors.As(err, &e) || e.LeaderHint == "" || e.LeaderHint == from || checkAddr(e.LeaderHint) != nil {
		return ""
	}
	return e.LeaderHint
}
