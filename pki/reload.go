package pki

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/credentials"
)

// FilesConfig names the PEM files a Files serves from.
type FilesConfig struct {
	// CAFile is the CA bundle peers are verified against (several CAs
	// during a CA rotation). Required.
	CAFile string
	// CertFile and KeyFile are this party's certificate and key. Required.
	CertFile, KeyFile string
	// Logger defaults to a null logger; Files names it "tls".
	Logger hclog.Logger
	// Now is the clock certificates are checked against, default
	// time.Now.
	Now func() time.Time
}

// Files is a party's TLS material loaded from files: its certificate and
// key, and the CA bundle it trusts. Reload reads them again; connections
// made after a successful reload use the new material (the tls.Configs
// below read it at every handshake), connections already open carry on
// with what they were made with. A reload that fails (unreadable or
// mismatched files, a certificate that is expired, not signed by the
// bundle, or that names another identity than the first one loaded)
// changes nothing. Safe for concurrent use.
type Files struct {
	cfg    FilesConfig
	logger hclog.Logger
	cur    atomic.Pointer[material]

	mu    sync.Mutex // serialises loads; guards seen
	seen  [3]os.FileInfo
	ident Identity // fixed by the first load
}

// material is one loaded set of files.
type material struct {
	cert   tls.Certificate // Leaf set
	ident  Identity
	pool   *x509.CertPool
	raw    [3][]byte // ca, cert, key as read
	server *tls.Config
	// serverCertOptional is server asking for, not requiring, a client
	// certificate (ServerTLSClientCertOptional).
	serverCertOptional *tls.Config
	// caNotAfter is when the bundle's first certificate to expire does.
	caNotAfter time.Time
}

// OpenFiles loads the files once; an error names what is wrong with them.
func OpenFiles(cfg FilesConfig) (*Files, error) {
	if cfg.CAFile == "" || cfg.CertFile == "" || cfg.KeyFile == "" {
		return nil, errors.New("pki: the CA, certificate and key files are all required")
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	f := &Files{cfg: cfg, logger: cfg.Logger.Named("tls")}
	if _, err := f.Reload(); err != nil {
		return nil, err
	}
	return f, nil
}

// Identity is the identity the certificate names (the same after every
// reload).
func (f *Files) Identity() Identity { return f.cur.Load().ident }

// Leaf is the certificate in use now.
func (f *Files) Leaf() *x509.Certificate { return f.cur.Load().cert.Leaf }

// Reload reads the files again. It reports whether the material in use
// changed (false when the files hold what is already in use).
func (f *Files) Reload() (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	paths := [3]string{f.cfg.CAFile, f.cfg.CertFile, f.cfg.KeyFile}
	var raw [3][]byte
	for i, p := range paths {
		// Stat before reading: a change after the stat is seen by the
		// next poll, never missed.
		st, err := os.Stat(p)
		if err == nil {
			f.seen[i] = st
			raw[i], err = os.ReadFile(p)
		}
		if err != nil {
			return false, fmt.Errorf("pki: %w", err)
		}
	}
	if old := f.cur.Load(); old != nil && sameFiles(raw, old.raw) {
		return false, nil
	}
	m, err := f.parse(raw)
	if err != nil {
		return false, err
	}
	first := f.cur.Load() == nil
	if first {
		f.ident = m.ident
	} else if m.ident != f.ident {
		return false, fmt.Errorf("pki: %s names %s, not %s: a reload keeps the identity (restart to change it)", f.cfg.CertFile, m.ident, f.ident)
	}
	f.cur.Store(m)
	f.logger.Info("tls material loaded", "identity", m.ident.Name(), "serial", m.cert.Leaf.SerialNumber.Text(16),
		"not_after", m.cert.Leaf.NotAfter.UTC().Format(time.RFC3339), "first", first)
	return true, nil
}

// parse checks one set of files.
func (f *Files) parse(raw [3][]byte) (*material, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(raw[0]) {
		return nil, fmt.Errorf("pki: no certificate in the CA file %s", f.cfg.CAFile)
	}
	cert, err := tls.X509KeyPair(raw[1], raw[2])
	if err != nil {
		return nil, fmt.Errorf("pki: %s and %s: %w", f.cfg.CertFile, f.cfg.KeyFile, err)
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("pki: %s: %w", f.cfg.CertFile, err)
		}
		cert.Leaf = leaf
	}
	ident, err := FromCertificate(leaf)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", f.cfg.CertFile, err)
	}
	// Our own certificate must pass the check our peers make of it:
	// signed by the bundle, valid now.
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: intermediates(cert.Certificate[1:]),
		CurrentTime: f.cfg.Now(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("pki: %s does not verify against %s: %w", f.cfg.CertFile, f.cfg.CAFile, err)
	}
	m := &material{cert: cert, ident: ident, pool: pool, raw: raw, caNotAfter: soonestNotAfter(raw[0])}
	m.server = &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		NextProtos:   []string{"h2"}, // gRPC's ALPN: the config returned per handshake must carry it
	}
	m.serverCertOptional = m.server.Clone()
	m.serverCertOptional.ClientAuth = tls.VerifyClientCertIfGiven
	return m, nil
}

func intermediates(ders [][]byte) *x509.CertPool {
	pool := x509.NewCertPool()
	for _, der := range ders {
		if c, err := x509.ParseCertificate(der); err == nil {
			pool.AddCert(c)
		}
	}
	return pool
}

// changedOnDisk reports whether any file differs (by identity, size or
// modification time) from when it was last read.
func (f *Files) changedOnDisk() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, p := range [3]string{f.cfg.CAFile, f.cfg.CertFile, f.cfg.KeyFile} {
		st, err := os.Stat(p)
		if err != nil {
			continue // a file being replaced; the next poll sees it
		}
		old := f.seen[i]
		if old == nil || !os.SameFile(old, st) || old.Size() != st.Size() || !old.ModTime().Equal(st.ModTime()) {
			return true
		}
	}
	return false
}

// Watch reloads whenever a file changes on disk (polled every interval)
// and whenever trigger fires (geologd sends SIGHUP there), until ctx ends.
// Failures are logged and leave the material in use as it was.
func (f *Files) Watch(ctx context.Context, interval time.Duration, trigger <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		var why string
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if !f.changedOnDisk() {
				continue
			}
			why = "files changed"
		case <-trigger:
			why = "reload asked"
		}
		changed, err := f.Reload()
		switch {
		case err != nil:
			f.logger.Error("tls reload failed: still using the material loaded before", "why", why, "error", err)
		case !changed:
			f.logger.Info("tls reload: the files hold the material in use", "why", why)
		}
	}
}

// ServerTLS is the configuration of a server that requires a client
// certificate signed by the CA bundle (mutual TLS): the certificate and
// bundle are those of the moment of each handshake.
func (f *Files) ServerTLS() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return f.cur.Load().server, nil
		},
	}
}

// ServerTLSClientCertOptional is ServerTLS for a listener where clients may
// come without a certificate (to present a bearer token instead): a
// certificate given is still verified against the bundle, and one that
// does not verify fails the handshake. What a caller without one may do is
// the server's to decide (pki.OverTLSWithoutCertificate): nodes always
// present theirs.
func (f *Files) ServerTLSClientCertOptional() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return f.cur.Load().serverCertOptional, nil
		},
	}
}

// ClientCredentials are gRPC transport credentials for a client that
// presents this certificate and verifies the server's against the CA
// bundle and the name it dialed, with the certificate and bundle of the
// moment of each handshake. check, if set, is also asked about the
// server's identity (a node dialing a node requires a node).
//
// They are credentials rather than a tls.Config because a client-side
// tls.Config fixes its RootCAs, and its verification callbacks cannot see
// the name dialed when it is an IP address (no SNI is sent).
func (f *Files) ClientCredentials(check func(Identity) error) credentials.TransportCredentials {
	return &reloadingCreds{f: f, check: check, info: credentials.NewTLS(&tls.Config{}).Info()}
}

// clientConfig is one handshake's client configuration.
func (f *Files) clientConfig(check func(Identity) error) *tls.Config {
	m := f.cur.Load()
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		RootCAs:      m.pool,
		Certificates: []tls.Certificate{m.cert},
		Time:         f.cfg.Now,
	}
	if check != nil {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			// Called after the chain and the name were verified.
			if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
				return errors.New("pki: the server's certificate was not verified")
			}
			ident, err := FromCertificate(cs.VerifiedChains[0][0])
			if err != nil {
				return err
			}
			return check(ident)
		}
	}
	return cfg
}

// reloadingCreds builds gRPC's TLS credentials anew for each handshake.
type reloadingCreds struct {
	f          *Files
	check      func(Identity) error
	info       credentials.ProtocolInfo
	serverName string // OverrideServerName's
}

func (c *reloadingCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	cfg := c.f.clientConfig(c.check)
	cfg.ServerName = c.serverName
	return credentials.NewTLS(cfg).ClientHandshake(ctx, authority, conn)
}

func (c *reloadingCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("pki: client credentials cannot serve")
}

func (c *reloadingCreds) Info() credentials.ProtocolInfo { return c.info }

func (c *reloadingCreds) Clone() credentials.TransportCredentials {
	cp := *c
	return &cp
}

func (c *reloadingCreds) OverrideServerName(name string) error {
	c.serverName = name
	return nil
}

// RequireNode is a ClientCredentials check that the server is a geolog node.
func RequireNode(id Identity) error {
	if !id.IsNode() {
		return fmt.Errorf("%w: the server is %s, not a node", ErrBadIdentity, id)
	}
	return nil
}

// ClientConfig is a static client configuration for tools and SDK users:
// it trusts the CA bundle in caFile (none: the system's roots), presents
// the pair in certFile and keyFile when given, and expects serverName
// when set (default: the host dialed).
func ClientConfig(caFile, certFile, keyFile, serverName string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if caFile != "" {
		b, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("pki: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("pki: no certificate in the CA file %s", caFile)
		}
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("pki: a client certificate and its key go together")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("pki: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

func sameFiles(a, b [3][]byte) bool {
	return bytes.Equal(a[0], b[0]) && bytes.Equal(a[1], b[1]) && bytes.Equal(a[2], b[2])
}
