package console

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// One address, both protocols. With TLS on, the console is served over
// HTTPS on the node's HTTP address while the same address keeps serving
// /metrics, pprof and the failpoints to the plaintext clients that scrape
// and drive them. The listener looks at each connection's first byte: a
// TLS handshake record (0x16) gets a TLS server, anything else the plain
// connection.

const (
	// sniffTimeout bounds how long a new connection may take to send its
	// first byte.
	sniffTimeout = 10 * time.Second
	// sniffPendingMax bounds the connections waiting for their first byte.
	sniffPendingMax = 64
	// tlsRecordHandshake opens every TLS ClientHello.
	tlsRecordHandshake = 0x16
)

// ViewerTLS is the HTTP side's TLS configuration made from a node's
// server configuration (pki.Files.ServerTLS, read at each handshake): the
// node's certificate, HTTP/1.1, and a client certificate verified against
// the cluster's CA when the browser presents one, not required, so that
// the other paths of the address need none. The console refuses a request
// without one (Config.Secure).
func ViewerTLS(server *tls.Config) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			cfg := server
			if server.GetConfigForClient != nil {
				c, err := server.GetConfigForClient(hello)
				if err != nil {
					return nil, err
				}
				if c != nil {
					cfg = c
				}
			}
			cfg = cfg.Clone()
			cfg.GetConfigForClient = nil
			cfg.ClientAuth = tls.VerifyClientCertIfGiven
			cfg.NextProtos = []string{"http/1.1"} // a poll a second needs no HTTP/2
			return cfg, nil
		},
	}
}

// SniffTLS returns a listener that hands out a *tls.Conn (so that
// net/http fills in Request.TLS) for each connection opening with a TLS
// handshake, and the plain connection for any other. Close closes ln; a
// connection still waiting for its first byte is closed within
// sniffTimeout.
func SniffTLS(ln net.Listener, cfg *tls.Config) net.Listener {
	l := &sniffListener{Listener: ln, cfg: cfg, conns: make(chan net.Conn), done: make(chan struct{}),
		failed: make(chan struct{}), pending: make(chan struct{}, sniffPendingMax)}
	go l.acceptLoop()
	return l
}

type sniffListener struct {
	net.Listener
	cfg     *tls.Config
	conns   chan net.Conn
	done    chan struct{} // closed by Close
	failed  chan struct{} // closed when the accept loop ends; err says why
	err     error
	pending chan struct{} // a token per connection being sniffed
	once    sync.Once
}

func (l *sniffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.failed:
		return nil, l.err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *sniffListener) Close() error {
	err := net.ErrClosed
	l.once.Do(func() {
		close(l.done)
		err = l.Listener.Close()
	})
	return err
}

// acceptLoop accepts until the listener fails or closes, backing off on
// errors that pass (as net/http's Serve does: too many open files).
func (l *sniffListener) acceptLoop() {
	var backoff time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || !errors.Is(err, net.ErrClosed) && isTemporary(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(backoff):
					continue
				case <-l.done:
				}
			}
			l.err = err
			close(l.failed)
			return
		}
		backoff = 0
		select {
		case l.pending <- struct{}{}:
		case <-l.done:
			c.Close()
			return
		}
		go l.sniff(c)
	}
}

func isTemporary(err error) bool {
	t, ok := err.(interface{ Temporary() bool })
	return ok && t.Temporary()
}

// sniff reads c's first byte and hands c on as TLS or plain.
func (l *sniffListener) sniff(c net.Conn) {
	defer func() { <-l.pending }()
	var first [1]byte
	c.SetReadDeadline(time.Now().Add(sniffTimeout))
	if _, err := io.ReadFull(c, first[:]); err != nil {
		c.Close()
		return
	}
	c.SetReadDeadline(time.Time{})
	var out net.Conn = &peekedConn{Conn: c, r: io.MultiReader(bytes.NewReader(first[:]), c)}
	if first[0] == tlsRecordHandshake {
		out = tls.Server(out, l.cfg)
	}
	select {
	case l.conns <- out:
	case <-l.done:
		out.Close()
	}
}

// peekedConn is a connection whose first bytes were read already.
type peekedConn struct {
	net.Conn
	r io.Reader
}

func (c *peekedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
