package wan

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// The two directions of a link.
const (
	toUpstream   = 0 // listener side → upstream
	fromUpstream = 1 // upstream → listener side
)

// acceptBackoffMax bounds the wait after a failed Accept (e.g. out of file
// descriptors).
const acceptBackoffMax = time.Second

// Link is a TCP proxy from a listen address to an upstream address that
// delays both directions, can cap their bandwidth, and can be cut and healed
// at run time. All methods are safe for concurrent use. See the package
// documentation for the contract.
type Link struct {
	cfg    Config
	logger hclog.Logger
	ln     *net.TCPListener

	latencyNanos       atomic.Int64
	jitterNanos        atomic.Int64
	bandwidthPerSecond atomic.Int64
	shapers            [2]struct {
		mu sync.Mutex
		s  shaper
	}

	// gate is closed while the link is up; a cut installs an open one and
	// Heal closes it. Readers and writers load it once per loop turn.
	gate atomic.Pointer[chan struct{}]

	mu      sync.Mutex
	mode    CutMode // 0 while up
	conns   map[*conn]struct{}
	connSeq uint64
	closed  bool
	closing chan struct{}
	wg      sync.WaitGroup

	connsAccepted atomic.Uint64
	connsRefused  atomic.Uint64
	dialErrors    atomic.Uint64
	cuts          atomic.Uint64
	bytes         [2]atomic.Uint64
}

// NewLink validates cfg, listens on cfg.Listen and starts proxying. A bad
// cfg gives a *ConfigError (errors.Is ErrInvalidConfig); a failed listen
// is returned wrapped.
func NewLink(cfg Config) (*Link, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("wan: link %q: %w", cfg.Name, err)
	}
	l := &Link{
		cfg:     cfg,
		logger:  cfg.Logger.Named("wan").With("link", cfg.Name),
		ln:      ln.(*net.TCPListener),
		conns:   make(map[*conn]struct{}),
		closing: make(chan struct{}),
	}
	l.latencyNanos.Store(int64(cfg.Latency))
	l.jitterNanos.Store(int64(cfg.Jitter))
	l.bandwidthPerSecond.Store(cfg.BandwidthBytesPerSecond)
	open := make(chan struct{})
	close(open)
	l.gate.Store(&open)
	l.wg.Add(1)
	go l.acceptLoop()
	l.logger.Debug("link up", "listen", l.Addr(), "upstream", cfg.Upstream, "latency", cfg.Latency, "jitter", cfg.Jitter)
	return l, nil
}

// Name returns the link's name.
func (l *Link) Name() string { return l.cfg.Name }

// From returns the region clients of the link are in ("" if unset).
func (l *Link) From() string { return l.cfg.From }

// To returns the region the link's upstream is in ("" if unset).
func (l *Link) To() string { return l.cfg.To }

// Addr returns the address the link listens on, for clients to dial.
func (l *Link) Addr() string { return l.ln.Addr().String() }

// Upstream returns the address the link forwards to.
func (l *Link) Upstream() string { return l.cfg.Upstream }

// Cut breaks the link in both directions, in the given mode (see CutMode),
// until Heal. Cutting a cut link changes its mode: CutReset after
// CutBlackhole resets the held connections. ErrInvalidArgument for an
// unknown mode, ErrClosed after Close.
func (l *Link) Cut(mode CutMode) error {
	if mode != CutBlackhole && mode != CutReset {
		return fmt.Errorf("%w: cut mode %d", ErrInvalidArgument, int(mode))
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	prev := l.mode
	if prev == 0 {
		gate := make(chan struct{})
		l.gate.Store(&gate)
	}
	l.mode = mode
	var victims []*conn
	if mode == CutReset {
		victims = make([]*conn, 0, len(l.conns))
		for c := range l.conns {
			victims = append(victims, c)
		}
	}
	l.mu.Unlock()
	// New connections are refused from here on (admit checks the mode under
	// l.mu), so resetting the ones registered before is enough.
	for _, c := range victims {
		c.abort()
	}
	if prev != mode {
		l.cuts.Add(1)
		l.logger.Info("link cut", "mode", mode, "conns_reset", len(victims))
	}
	return nil
}

// Heal ends a cut: new connections pass again, and connections held by a
// blackhole resume, delivering what they held first, in order. Healing an
// up link does nothing. ErrClosed after Close.
func (l *Link) Heal() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	if l.mode == 0 {
		return nil
	}
	l.mode = 0
	close(*l.gate.Load())
	l.logger.Info("link healed")
	return nil
}

// SetLatency changes the one-way latency and jitter of both directions, for
// bytes read from now on. Bytes never overtake earlier ones, so lowering
// the latency takes effect as the bytes already delayed drain.
// ErrInvalidArgument beyond [0, LatencyMax].
func (l *Link) SetLatency(latency, jitter time.Duration) error {
	if err := checkLatency(latency, jitter); err != nil {
		return fmt.Errorf("%w: %s", ErrInvalidArgument, err)
	}
	l.latencyNanos.Store(int64(latency))
	l.jitterNanos.Store(int64(jitter))
	l.logger.Info("latency set", "latency", latency, "jitter", jitter)
	return nil
}

// SetBandwidth changes the cap of each direction, 0 for none.
// ErrInvalidArgument when negative.
func (l *Link) SetBandwidth(bytesPerSecond int64) error {
	if bytesPerSecond < 0 {
		return fmt.Errorf("%w: bandwidth %d bytes/s", ErrInvalidArgument, bytesPerSecond)
	}
	l.bandwidthPerSecond.Store(bytesPerSecond)
	l.logger.Info("bandwidth set", "bytes_per_second", bytesPerSecond)
	return nil
}

// Stats are a link's settings and counters at one moment.
type Stats struct {
	Name, From, To   string
	Listen, Upstream string
	// State is "up", "blackhole" or "reset".
	State                   string
	Latency, Jitter         time.Duration
	BandwidthBytesPerSecond int64
	// ConnsOpen counts connections open now, held ones included.
	ConnsOpen int
	// ConnsAccepted counts connections accepted and proxied (or held);
	// ConnsRefused those reset on accept (a CutReset link, or ConnsMax
	// reached); DialErrors the upstream dials that failed.
	ConnsAccepted, ConnsRefused, DialErrors uint64
	// Cuts counts changes from up, or between cut modes.
	Cuts uint64
	// BytesToUpstream and BytesFromUpstream count bytes delivered.
	BytesToUpstream, BytesFromUpstream uint64
	// BytesHeld counts bytes read and not yet delivered, both directions:
	// in flight, or held by a blackhole.
	BytesHeld int64
}

// Stats returns the link's settings and counters.
func (l *Link) Stats() Stats {
	s := Stats{
		Name:                    l.cfg.Name,
		From:                    l.cfg.From,
		To:                      l.cfg.To,
		Listen:                  l.Addr(),
		Upstream:                l.cfg.Upstream,
		Latency:                 time.Duration(l.latencyNanos.Load()),
		Jitter:                  time.Duration(l.jitterNanos.Load()),
		BandwidthBytesPerSecond: l.bandwidthPerSecond.Load(),
		ConnsAccepted:           l.connsAccepted.Load(),
		ConnsRefused:            l.connsRefused.Load(),
		DialErrors:              l.dialErrors.Load(),
		Cuts:                    l.cuts.Load(),
		BytesToUpstream:         l.bytes[toUpstream].Load(),
		BytesFromUpstream:       l.bytes[fromUpstream].Load(),
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s.State = stateName(l.mode)
	s.ConnsOpen = len(l.conns)
	for c := range l.conns {
		s.BytesHeld += c.heldBytes()
	}
	return s
}

func stateName(mode CutMode) string {
	if mode == 0 {
		return "up"
	}
	return mode.String()
}

// Close stops listening, resets every connection and waits for the link's
// goroutines. Later calls return ErrClosed.
func (l *Link) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	l.closed = true
	close(l.closing)
	victims := make([]*conn, 0, len(l.conns))
	for c := range l.conns {
		victims = append(victims, c)
	}
	l.mu.Unlock()
	err := l.ln.Close()
	for _, c := range victims {
		c.abort()
	}
	l.wg.Wait()
	l.logger.Debug("link closed")
	return err
}

// waitOpen returns true at once while the link is up; while it is cut it
// waits for Heal, or returns false when done is closed first.
func (l *Link) waitOpen(done <-chan struct{}) bool {
	gate := *l.gate.Load()
	select {
	case <-gate:
		return true
	default:
	}
	select {
	case <-gate:
		return true
	case <-done:
		return false
	}
}

// due returns when n bytes of direction dir read at now are due at the far
// end: after the bandwidth cap's queue, the latency and a jitter draw.
func (l *Link) due(dir int, now time.Time, n int, p *pipe) time.Time {
	depart := now
	if bw := l.bandwidthPerSecond.Load(); bw > 0 {
		sh := &l.shapers[dir]
		sh.mu.Lock()
		depart = sh.s.depart(now, n, bw)
		sh.mu.Unlock()
	}
	return depart.Add(drawDelay(p.rng, time.Duration(l.latencyNanos.Load()), time.Duration(l.jitterNanos.Load())))
}

func (l *Link) acceptLoop() {
	defer l.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		client, err := l.ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			l.logger.Warn("accept failed", "error", err, "backoff", backoff)
			select {
			case <-time.After(backoff):
			case <-l.closing:
				return
			}
			backoff = min(2*backoff, acceptBackoffMax)
			continue
		}
		backoff = 5 * time.Millisecond
		l.admit(client)
	}
}

// admit starts proxying a new connection, or resets it when the link is
// closed, cut in reset mode, or full.
func (l *Link) admit(client *net.TCPConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		resetTCP(client)
		return
	case l.mode == CutReset:
		l.connsRefused.Add(1)
		resetTCP(client)
		return
	case len(l.conns) >= l.cfg.ConnsMax:
		l.connsRefused.Add(1)
		// Debug, not warn: a flood of connections must not flood the log
		// (Stats counts them).
		l.logger.Debug("connection refused: too many connections", "conns_max", l.cfg.ConnsMax)
		resetTCP(client)
		return
	}
	l.connSeq++
	c := newConn(l, client, l.connSeq)
	l.conns[c] = struct{}{}
	l.connsAccepted.Add(1)
	l.wg.Add(1)
	go c.serve()
}

func (l *Link) forget(c *conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
}

// resetTCP closes c with an RST rather than a FIN.
func resetTCP(c *net.TCPConn) {
	_ = c.SetLinger(0)
	_ = c.Close()
}
