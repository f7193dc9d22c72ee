package pki

import (
	"crypto/x509"
	"errors"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// newCA issues a CA for tests.
func newCA(t testing.TB, name string) *Authority {
	t.Helper()
	p, err := CreateCA(name, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := ParseAuthority(p.CertPEM, p.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func leafOf(t testing.TB, p Pair) *x509.Certificate {
	t.Helper()
	c, err := parseCertPEM(p.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestIdentityURIs(t *testing.T) {
	for _, tc := range []struct {
		uri  string
		want Identity
		err  bool
	}{
		{uri: "geolog://node/us/1", want: NodeIdentity("us", 1)},
		{uri: "geolog://node/eu-west.2/18446744073709551", want: NodeIdentity("eu-west.2", 18446744073709551)},
		{uri: "geolog://client/alice@example.com", want: ClientIdentity("alice@example.com")},
		{uri: "geolog://client/bench-1", want: ClientIdentity("bench-1")},
		{uri: "geolog://node/us/0", err: true},
		{uri: "geolog://node/us/01", err: true},
		{uri: "geolog://node/us/-1", err: true},
		{uri: "geolog://node/us/9223372036854775808", err: true},
		{uri: "geolog://node/us", err: true},
		{uri: "geolog://node/us/1/2", err: true},
		{uri: "geolog://node//1", err: true},
		{uri: "geolog://node/u%2Fs/1", err: true},
		{uri: "geolog://client/", err: true},
		{uri: "geolog://client/a/b", err: true},
		{uri: "geolog://client/-x", err: true},
		{uri: "geolog://client/" + strings.Repeat("a", PrincipalBytesMax+1), err: true},
		{uri: "geolog://root/x", err: true},
		{uri: "geolog://client/x?admin=1", err: true},
		{uri: "geolog://u@client/x", err: true},
		{uri: "spiffe://client/x", err: true},
	} {
		u, err := url.Parse(tc.uri)
		if err != nil {
			t.Fatal(err)
		}
		got, err := parseURI(u)
		if tc.err {
			if err == nil || !errors.Is(err, ErrBadIdentity) {
				t.Errorf("%s: got %v, %v; want ErrBadIdentity", tc.uri, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: got %v, %v; want %v", tc.uri, got, err, tc.want)
			continue
		}
		if back := got.URI().String(); back != tc.uri {
			t.Errorf("%s: round trip gives %s", tc.uri, back)
		}
	}
}

func TestCreateNodeAndClient(t *testing.T) {
	ca := newCA(t, "test ca")
	node, err := CreateNode(ca, "us", 3, []string{"127.0.0.1", "localhost", "n3.us.example"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	leaf := leafOf(t, node)
	id, err := FromCertificate(leaf)
	if err != nil || id != NodeIdentity("us", 3) {
		t.Fatalf("node identity %v, %v", id, err)
	}
	if id.Name() != "node:us/3" {
		t.Fatalf("name %q", id.Name())
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	for _, host := range []string{"127.0.0.1", "localhost", "n3.us.example"} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: host, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("verify as server %s: %v", host, err)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "10.0.0.1"}); err == nil {
		t.Error("node certificate verifies for an address it does not carry")
	}

	cl, err := CreateClient(ca, "alice", Options{})
	if err != nil {
		t.Fatal(err)
	}
	cleaf := leafOf(t, cl)
	if id, err := FromCertificate(cleaf); err != nil || id != ClientIdentity("alice") {
		t.Fatalf("client identity %v, %v", id, err)
	}
	// A client certificate can never serve: it is not good for server
	// authentication.
	if _, err := cleaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Error("client certificate verifies for server authentication")
	}
	if _, err := cleaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client certificate for client authentication: %v", err)
	}
}

func TestCreateRefusesBadInput(t *testing.T) {
	ca := newCA(t, "test ca")
	if _, err := CreateNode(ca, "us", 1, nil, Options{}); err == nil {
		t.Error("node certificate without hosts")
	}
	if _, err := CreateNode(ca, "us", 1, []string{"bad host!"}, Options{}); err == nil {
		t.Error("node certificate with an invalid host")
	}
	if _, err := CreateNode(ca, "u/s", 1, []string{"localhost"}, Options{}); !errors.Is(err, ErrBadIdentity) {
		t.Errorf("region with a slash: %v", err)
	}
	if _, err := CreateNode(ca, "us", 0, []string{"localhost"}, Options{}); !errors.Is(err, ErrBadIdentity) {
		t.Errorf("node id 0: %v", err)
	}
	if _, err := CreateClient(ca, "a/b", Options{}); !errors.Is(err, ErrBadIdentity) {
		t.Errorf("principal with a slash: %v", err)
	}
	// A leaf never outlives its CA.
	short, err := CreateCA("short", Options{Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	sca, err := ParseAuthority(short.CertPEM, short.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	p, err := CreateClient(sca, "bob", Options{Lifetime: 365 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if got := leafOf(t, p).NotAfter; got.After(sca.Cert.NotAfter) {
		t.Errorf("client certificate ends %v, after its CA %v", got, sca.Cert.NotAfter)
	}
	if _, err := CreateClient(sca, "bob", Options{Now: time.Now().Add(2 * time.Hour)}); err == nil {
		t.Error("issued by an expired CA")
	}
}

func TestParseAuthorityChecks(t *testing.T) {
	a, err := CreateCA("a", Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := CreateCA("b", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseAuthority(a.CertPEM, b.KeyPEM); err == nil {
		t.Error("CA with another CA's key")
	}
	ca := newCA(t, "c")
	leaf, err := CreateClient(ca, "x", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseAuthority(leaf.CertPEM, leaf.KeyPEM); err == nil {
		t.Error("a client certificate taken for a CA")
	}
}

func TestFromCertificateWantsOneIdentity(t *testing.T) {
	ca := newCA(t, "test ca")
	p, err := CreateNode(ca, "us", 1, []string{"localhost"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	leaf := leafOf(t, p)
	two := *leaf
	two.URIs = append(append([]*url.URL{}, leaf.URIs...), ClientIdentity("root").URI())
	if _, err := FromCertificate(&two); !errors.Is(err, ErrBadIdentity) {
		t.Errorf("two identities: %v", err)
	}
	none := *leaf
	none.URIs = nil
	if _, err := FromCertificate(&none); !errors.Is(err, ErrBadIdentity) {
		t.Errorf("no identity: %v", err)
	}
	// A node identity in a certificate that cannot serve is refused.
	clientOnly := *leaf
	clientOnly.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if _, err := FromCertificate(&clientOnly); !errors.Is(err, ErrBadIdentity) {
		t.Errorf("node identity without server authentication: %v", err)
	}
}

func TestWritePairModesAndOverwrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	ca := newCA(t, "test ca")
	p, err := CreateClient(ca, "alice", Options{})
	if err != nil {
		t.Fatal(err)
	}
	cert, key := filepath.Join(dir, ClientCertFile), filepath.Join(dir, ClientKeyFile)
	if err := WritePair(cert, key, p, false); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{cert, key} {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", path, st.Mode().Perm())
		}
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("folder mode %v, %v; want 0700", st.Mode().Perm(), err)
	}
	q, err := CreateClient(ca, "alice", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := WritePair(cert, key, q, false); !errors.Is(err, ErrExists) {
		t.Fatalf("second write without overwrite: %v", err)
	}
	if b, _ := os.ReadFile(cert); string(b) != string(p.CertPEM) {
		t.Fatal("a refused write changed the certificate")
	}
	if err := WritePair(cert, key, q, true); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(cert); string(b) != string(q.CertPEM) {
		t.Fatal("overwrite did not replace the certificate")
	}
	caPath := filepath.Join(dir, CACertFile)
	if err := WriteCACopy(caPath, ca.CertPEM, false); err != nil {
		t.Fatal(err)
	}
	if err := WriteCACopy(caPath, ca.CertPEM, false); err != nil {
		t.Fatalf("same CA again: %v", err)
	}
	other := newCA(t, "other")
	if err := WriteCACopy(caPath, other.CertPEM, false); !errors.Is(err, ErrExists) {
		t.Fatalf("another CA without overwrite: %v", err)
	}
}

func TestHostsGoToTheRightSANs(t *testing.T) {
	ca := newCA(t, "test ca")
	p, err := CreateNode(ca, "eu", 2, []string{"::1", "10.1.2.3", "node-2.eu"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	leaf := leafOf(t, p)
	if len(leaf.IPAddresses) != 2 || !leaf.IPAddresses[0].Equal(net.ParseIP("::1")) || len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != "node-2.eu" {
		t.Fatalf("IPs %v DNS %v", leaf.IPAddresses, leaf.DNSNames)
	}
}

func TestCreateServerNamesNoIdentity(t *testing.T) {
	ca := newCA(t, "test ca")
	p, err := CreateServer(ca, []string{"127.0.0.1", "db.local"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	leaf := leafOf(t, p)
	if _, err := FromCertificate(leaf); !errors.Is(err, ErrBadIdentity) {
		t.Fatalf("a server certificate names an identity: %v", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "db.local", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Fatal("a server certificate is good for client authentication")
	}
	if _, err := CreateServer(ca, nil, Options{}); err == nil {
		t.Fatal("server certificate without hosts")
	}
}
