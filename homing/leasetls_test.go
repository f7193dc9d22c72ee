package homing

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/geolog/geolog/pki"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// tlsPeer is a stand-in for the lease store's server that stops after
// the TLS handshake: it answers PostgreSQL's SSLRequest, completes the
// handshake with the certificate cert returns, asking for and verifying a
// client certificate against clientCA, and reports the client's
// certificate (nil for a failed handshake).
type tlsPeer struct {
	ln   net.Listener
	seen chan *x509.Certificate
}

func startTLSPeer(t *testing.T, cert func() tls.Certificate, clientCA *x509.CertPool) *tlsPeer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tlsPeer{ln: ln, seen: make(chan *x509.Certificate, 16)}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.serve(c, cert(), clientCA)
		}
	}()
	return p
}

func (p *tlsPeer) serve(c net.Conn, cert tls.Certificate, clientCA *x509.CertPool) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	var req [8]byte
	if _, err := io.ReadFull(c, req[:]); err != nil || binary.BigEndian.Uint32(req[4:]) != 80877103 {
		p.seen <- nil
		return
	}
	if _, err := c.Write([]byte{'S'}); err != nil {
		p.seen <- nil
		return
	}
	tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clientCA})
	if err := tc.Handshake(); err != nil {
		p.seen <- nil
		return
	}
	p.seen <- tc.ConnectionState().PeerCertificates[0]
}

// TestLeaseStoreTLSReload: the lease store's connections read the URL's
// TLS files as they are when each connection is made: a client pair
// replaced on disk is the one the next connection presents, and a CA
// bundle replaced on disk is the one the next connection verifies the
// server against (a server certificate from a CA the file no longer
// holds fails the handshake; once the file holds that CA, it passes),
// all without reopening the store's pool config.
func TestLeaseStoreTLSReload(t *testing.T) {
	dir := t.TempDir()
	newCA := func(name string) (*pki.Authority, pki.Pair) {
		p, err := pki.CreateCA(name, pki.Options{})
		if err != nil {
			t.Fatal(err)
		}
		a, err := pki.ParseAuthority(p.CertPEM, p.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return a, p
	}
	caA, caAPair := newCA("ca A")
	caB, caBPair := newCA("ca B")
	serverCert := func(ca *pki.Authority) tls.Certificate {
		p, err := pki.CreateServer(ca, []string{"127.0.0.1"}, pki.Options{})
		if err != nil {
			t.Fatal(err)
		}
		c, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	certA, certB := serverCert(caA), serverCert(caB)
	serving := make(chan tls.Certificate, 1)
	serving <- certA
	current := func() tls.Certificate { c := <-serving; serving <- c; return c }
	setServing := func(c tls.Certificate) { <-serving; serving <- c }
	clientCAs := x509.NewCertPool()
	clientCAs.AddCert(caA.Cert)
	peer := startTLSPeer(t, current, clientCAs)

	rootPath := filepath.Join(dir, "root.crt")
	certPath, keyPath := filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")
	writeRoot := func(pem []byte) {
		if err := pki.WriteCACopy(rootPath, pem, true); err != nil {
			t.Fatal(err)
		}
	}
	writeClient := func() *x509.Certificate {
		p, err := pki.CreateClient(caA, "geolog-node", pki.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := pki.WritePair(certPath, keyPath, p, true); err != nil {
			t.Fatal(err)
		}
		c, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return leaf
	}
	writeRoot(caAPair.CertPEM)
	client1 := writeClient()

	q := url.Values{"sslmode": {"verify-full"}, "sslrootcert": {rootPath}, "sslcert": {certPath}, "sslkey": {keyPath}, "connect_timeout": {"10"}}
	dbURL := "postgres://geolog@" + peer.ln.Addr().String() + "/leases?" + q.Encode()
	pcfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	reloadRoots(pcfg, dbURL)
	// connect makes one connection as the pool would and returns the
	// client certificate the peer saw (nil: the handshake failed).
	connect := func() *x509.Certificate {
		t.Helper()
		cc := pcfg.ConnConfig.Copy()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := pcfg.BeforeConnect(ctx, cc); err != nil {
			t.Fatalf("before connect: %v", err)
		}
		if c, err := pgx.ConnectConfig(ctx, cc); err == nil {
			c.Close(ctx)
			t.Fatal("the stand-in server finished a PostgreSQL connection")
		}
		select {
		case c := <-peer.seen:
			return c
		case <-ctx.Done():
			t.Fatal("the stand-in server saw no connection")
			return nil
		}
	}
	if got := connect(); got == nil || !got.Equal(client1) {
		t.Fatalf("first connection presented %v, want the first client certificate", got)
	}
	client2 := writeClient()
	if got := connect(); got == nil || !got.Equal(client2) {
		t.Fatalf("after the client pair was replaced, a new connection presented %v, want the new certificate", got)
	}
	// The server moves to CA B before the client's bundle holds it: the
	// handshake fails (the client refuses the server).
	setServing(certB)
	if got := connect(); got != nil {
		t.Fatal("a server certificate from a CA outside the bundle passed")
	}
	writeRoot(append(append([]byte{}, caAPair.CertPEM...), caBPair.CertPEM...))
	if got := connect(); got == nil || !got.Equal(client2) {
		t.Fatalf("with CA B added to the bundle on disk, a new connection presented %v, want a handshake", got)
	}
	// Only CA A in the bundle again: B's server is refused once more, A's
	// server passes, and the name is still checked.
	writeRoot(caAPair.CertPEM)
	if got := connect(); got != nil {
		t.Fatal("CA B removed from the bundle on disk, its server still passed")
	}
	setServing(certA)
	if got := connect(); got == nil {
		t.Fatal("CA A's server refused")
	}
	wrongName, err := pki.CreateServer(caA, []string{"10.9.9.9"}, pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	wc, err := tls.X509KeyPair(wrongName.CertPEM, wrongName.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	setServing(wc)
	if got := connect(); got != nil {
		t.Fatal("a server certificate for another address passed verify-full")
	}
}
