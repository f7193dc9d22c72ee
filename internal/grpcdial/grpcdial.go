// Package grpcdial is the one place geolog builds gRPC client connections:
// the SDK's to nodes, a node's to its peers (Raft, forwarding, identity),
// and the replicator's to other regions. Every connection gets keepalive
// pings (so a dead peer is noticed without traffic) and a reconnect backoff
// bounded by the caller's (gRPC's default, 1 s growing to 120 s, would keep
// a restarted node away for minutes).
package grpcdial

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
)

// Config is a connection's settings; the zero value of each field takes
// the default named beside it.
type Config struct {
	// Credentials secure the connection; nil dials plaintext.
	Credentials credentials.TransportCredentials
	// KeepaliveTime is the idle time before a ping (default 30 s);
	// KeepaliveTimeout how long a ping may go unanswered before the
	// connection is closed (default 10 s). PermitWithoutStream pings with
	// no call in flight too (peer links: an idle Raft link must still
	// notice a dead peer). Servers must allow the interval (node.go's
	// enforcement policy allows 5 s).
	KeepaliveTime, KeepaliveTimeout time.Duration
	PermitWithoutStream             bool
	// BackoffMin and BackoffMax bound the reconnect backoff (defaults
	// 100 ms and 5 s), with multiplier BackoffMultiplier (default 1.6)
	// and 20% jitter.
	BackoffMin, BackoffMax time.Duration
	BackoffMultiplier      float64
	// ConnectTimeout is the least time a connection attempt is given
	// (default 5 s).
	ConnectTimeout time.Duration
	// SendBytesMax and RecvBytesMax bound a message (0: gRPC's defaults,
	// 4 MiB received, unbounded sent).
	SendBytesMax, RecvBytesMax int
	// Extra options follow the ones built here.
	Extra []grpc.DialOption
}

// Options returns the dial options for cfg.
func Options(cfg Config) []grpc.DialOption {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.KeepaliveTime, 30*time.Second)
	def(&cfg.KeepaliveTimeout, 10*time.Second)
	def(&cfg.BackoffMin, 100*time.Millisecond)
	def(&cfg.BackoffMax, 5*time.Second)
	def(&cfg.ConnectTimeout, 5*time.Second)
	if cfg.BackoffMax < cfg.BackoffMin {
		cfg.BackoffMax = cfg.BackoffMin
	}
	if cfg.BackoffMultiplier <= 1 {
		cfg.BackoffMultiplier = 1.6
	}
	creds := cfg.Credentials
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:                cfg.KeepaliveTime,
			Timeout:             cfg.KeepaliveTimeout,
			PermitWithoutStream: cfg.PermitWithoutStream,
		}),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  cfg.BackoffMin,
				Multiplier: cfg.BackoffMultiplier,
				Jitter:     0.2,
				MaxDelay:   cfg.BackoffMax,
			},
			MinConnectTimeout: cfg.ConnectTimeout,
		}),
	}
	var call []grpc.CallOption
	if cfg.SendBytesMax > 0 {
		call = append(call, grpc.MaxCallSendMsgSize(cfg.SendBytesMax))
	}
	if cfg.RecvBytesMax > 0 {
		call = append(call, grpc.MaxCallRecvMsgSize(cfg.RecvBytesMax))
	}
	if len(call) > 0 {
		opts = append(opts, grpc.WithDefaultCallOptions(call...))
	}
	return append(opts, cfg.Extra...)
}

// Dial makes a connection to addr with cfg's options (grpc.NewClient: it
// connects on first use).
func Dial(addr string, cfg Config) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, Options(cfg)...)
}
