package nodeproc

import (
	"crypto/tls"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/geolog/geolog/pki"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// PKI is a development PKI in a test's temporary folder: a CA, and on
// demand a certs folder per node (ca.crt, node.crt, node.key for
// 127.0.0.1 and localhost) and per client principal (ca.crt, client.crt,
// client.key), as `geolog certs` writes them.
type PKI struct {
	t    testing.TB
	Root string
	CA   *pki.Authority
}

// NewPKI makes a CA under a temporary folder.
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	root := t.TempDir()
	p, err := pki.CreateCA("geolog test CA", pki.Options{})
	if err != nil {
		t.Fatal(err)
	}
	caDir := filepath.Join(root, "ca")
	if err := pki.WritePair(filepath.Join(caDir, pki.CACertFile), filepath.Join(caDir, pki.CAKeyFile), p, false); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.ParseAuthority(p.CertPEM, p.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &PKI{t: t, Root: root, CA: ca}
}

// NodeDir writes (again, with a fresh key and serial: a rotation) the
// certs folder of node id of region and returns it.
func (p *PKI) NodeDir(region string, id uint64) string {
	p.t.Helper()
	return p.nodeDir(fmt.Sprintf("node-%s-%d", region, id), region, id)
}

// OtherNodeDir writes a certs folder for node id of region apart from
// the one NodeDir writes (which a running node reads): a second holder of
// that identity, or a probe's.
func (p *PKI) OtherNodeDir(region string, id uint64) string {
	p.t.Helper()
	return p.nodeDir(fmt.Sprintf("node-other-%s-%d", region, id), region, id)
}

func (p *PKI) nodeDir(name, region string, id uint64) string {
	dir := filepath.Join(p.Root, name)
	pair, err := pki.CreateNode(p.CA, region, id, []string{"127.0.0.1", "localhost"}, pki.Options{})
	if err != nil {
		p.t.Fatal(err)
	}
	p.write(dir, pair, pki.NodeCertFile, pki.NodeKeyFile)
	return dir
}

// ClientDir writes the certs folder of a client principal and returns it.
func (p *PKI) ClientDir(principal string) string {
	p.t.Helper()
	dir := filepath.Join(p.Root, "client-"+principal)
	pair, err := pki.CreateClient(p.CA, principal, pki.Options{})
	if err != nil {
		p.t.Fatal(err)
	}
	p.write(dir, pair, pki.ClientCertFile, pki.ClientKeyFile)
	return dir
}

func (p *PKI) write(dir string, pair pki.Pair, certName, keyName string) {
	p.t.Helper()
	if err := pki.WriteCACopy(filepath.Join(dir, pki.CACertFile), p.CA.CertPEM, true); err != nil {
		p.t.Fatal(err)
	}
	if err := pki.WritePair(filepath.Join(dir, certName), filepath.Join(dir, keyName), pair, true); err != nil {
		p.t.Fatal(err)
	}
}

// ClientTLS is the TLS configuration of a client with the certs folder
// dir (a client's or a node's: a node's certificate is good as a client's
// too).
func ClientTLS(t testing.TB, dir string) *tls.Config {
	t.Helper()
	cert, key := filepath.Join(dir, pki.ClientCertFile), filepath.Join(dir, pki.ClientKeyFile)
	if strings.HasPrefix(filepath.Base(dir), "node-") {
		cert, key = filepath.Join(dir, pki.NodeCertFile), filepath.Join(dir, pki.NodeKeyFile)
	}
	cfg, err := pki.ClientConfig(filepath.Join(dir, pki.CACertFile), cert, key, "")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// Dial opens a gRPC connection to addr with the certs folder dir, closed
// when the test ends.
func Dial(t testing.TB, addr, dir string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(ClientTLS(t, dir))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TLSRegion starts size geologd processes forming one replicated region
// of the given name with TLS, each with its node folder from p; extra
// flags go to every node.
func TLSRegion(t testing.TB, p *PKI, region string, size int, extra ...string) []*Proc {
	t.Helper()
	addrs := make([]string, size)
	var peers []string
	for i := range addrs {
		addrs[i] = FreeAddr(t)
		peers = append(peers, fmt.Sprintf("%d=%s", i+1, addrs[i]))
	}
	procs := make([]*Proc, size)
	for i := range procs {
		args := append([]string{"--region", region, "--node-id", fmt.Sprint(i + 1), "--peers", strings.Join(peers, ","),
			"--certs-dir", p.NodeDir(region, uint64(i+1))}, extra...)
		procs[i] = Start(t, t.TempDir(), addrs[i], args...)
	}
	return procs
}
