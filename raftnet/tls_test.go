package raftnet

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/credentials"
	grpcpeer "google.golang.org/grpc/peer"
)

// testCA is a throwaway certificate authority.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "geolog test ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// nodeCert issues a certificate for a node, good as server (127.0.0.1) and
// as client.
func (ca *testCA) nodeCert(t *testing.T, name string, serial int64) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestMutualTLS(t *testing.T) {
	ca := newTestCA(t)
	node := func(id NodeID, name string, clientCert bool) *testNode {
		cert := ca.nodeCert(t, name, int64(id)+1)
		serverTLS := &tls.Config{
			Certificates: []tls.Certificate{cert},
			ClientCAs:    ca.pool,
			ClientAuth:   tls.RequireAndVerifyClientCert,
			MinVersion:   tls.VersionTLS13,
		}
		clientTLS := &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS13}
		if clientCert {
			clientTLS.Certificates = []tls.Certificate{cert}
		}
		return startNode(t, id, "", func(c *Config) {
			c.ClientTLS = clientTLS
			c.ServerTLS = serverTLS
			c.HandshakeTimeout = time.Second
		})
	}
	a, b := node(1, "node-1", true), node(2, "node-2", true)
	connect(t, a, b)
	sendAll(t, a, 2, 20, 2)
	sendAll(t, b, 1, 20, 2)
	waitFor(t, 10*time.Second, "delivery over mutual TLS", func() bool {
		return a.rec.count() == 40 && b.rec.count() == 40
	})
	checkFIFO(t, a.rec)
	checkFIFO(t, b.rec)

	// A node without a client certificate is refused: it never gets a
	// stream up, its messages are reported, and b receives nothing from it.
	c := node(3, "node-3", false)
	if err := c.tr.SetPeer(2, b.addr); err != nil {
		t.Fatal(err)
	}
	// The refusal reaches the sender one of two ways: a message queued
	// while the stream was opening is reported lost (ReportUnreachable),
	// or, once the open failed, Send refuses while the peer backs off.
	// Which one a poll sees depends on timing (a plaintext open fails
	// within a millisecond), so either counts.
	refused := func(n *testNode, from NodeID) func() bool {
		return func() bool {
			err := n.tr.Send(1, msg(raftpb.MsgHeartbeat, from, 2, 1))
			return len(n.rec.unreachableGroups(2)) > 0 || errors.Is(err, ErrPeerUnreachable)
		}
	}
	waitFor(t, 10*time.Second, "refusal reported", refused(c, 3))
	if s := c.tr.Stats(); s.StreamsOpened != 0 || s.MessagesSent != 0 {
		t.Fatalf("node without a certificate got through: %+v", s)
	}
	// A plaintext client is refused as well.
	d := startNode(t, 4, "", nil)
	if err := d.tr.SetPeer(2, b.addr); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "plaintext refusal reported", refused(d, 4))
	if s := d.tr.Stats(); s.StreamsOpened != 0 || s.MessagesSent != 0 {
		t.Fatalf("plaintext node got through: %+v", s)
	}
	for _, m := range b.rec.received() {
		if m.from != 1 {
			t.Fatalf("b received from node %d", m.from)
		}
	}
}

// TestAuthorizePeer: a caller with a valid certificate that names another
// node than the one its stream claims is refused before its stream is
// accepted: it delivers nothing and does not supersede the real node's
// stream, which goes on delivering.
func TestAuthorizePeer(t *testing.T) {
	ca := newTestCA(t)
	// The receiver's rule: the caller's certificate is named node-<from>.
	authorize := func(ctx context.Context, from NodeID) error {
		p, ok := grpcpeer.FromContext(ctx)
		if !ok {
			return errors.New("no peer")
		}
		info, ok := p.AuthInfo.(credentials.TLSInfo)
		if !ok || len(info.State.VerifiedChains) == 0 {
			return errors.New("no verified certificate")
		}
		if cn := info.State.VerifiedChains[0][0].Subject.CommonName; cn != fmt.Sprintf("node-%d", from) {
			return fmt.Errorf("certificate %s", cn)
		}
		return nil
	}
	node := func(id NodeID, name string, serial int64, authz func(context.Context, NodeID) error) *testNode {
		cert := ca.nodeCert(t, name, serial)
		return startNode(t, id, "", func(c *Config) {
			c.ClientTLS = &tls.Config{RootCAs: ca.pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}
			c.ServerTLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: ca.pool,
				ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}
			c.AuthorizePeer = authz
		})
	}
	a, b := node(1, "node-1", 11, nil), node(2, "node-2", 12, authorize)
	connect(t, a, b)
	sendAll(t, a, 2, 4, 5)
	waitFor(t, 10*time.Second, "a's messages", func() bool { return b.rec.count() == 20 })

	// An impostor: a certificate of node 3 on a transport calling itself 1.
	imp := node(1, "node-3", 13, nil)
	if err := imp.tr.SetPeer(2, b.addr); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "impostor refused", func() bool {
		_ = imp.tr.Send(7, msg(raftpb.MsgHeartbeat, 1, 2, 1))
		return len(imp.rec.unreachableGroups(2)) > 0 && b.tr.Stats().StreamsRejected > 0
	})
	// a's stream was never superseded: it still delivers.
	sendAll(t, a, 2, 4, 5)
	waitFor(t, 10*time.Second, "a's messages after the impostor", func() bool { return b.rec.count() == 40 })
	for _, m := range b.rec.received() {
		if m.group == 7 {
			t.Fatal("b received the impostor's message")
		}
	}
	if s := a.tr.Stats(); s.StreamsOpened != 1 {
		t.Fatalf("a opened %d streams; its first was superseded", s.StreamsOpened)
	}
}
