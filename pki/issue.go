package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/url"
	"regexp"
	"time"
)

// Default lifetimes of what Create* issue.
const (
	CALifetimeDefault   = 10 * 365 * 24 * time.Hour
	CertLifetimeDefault = 365 * 24 * time.Hour
	// backdate is how far before now a certificate starts to be valid,
	// so that a peer whose clock is a little behind accepts it at once.
	backdate = time.Hour
)

// Options tune what Create* issue. Zero values take the defaults.
type Options struct {
	// Lifetime is how long the certificate is valid, default
	// CALifetimeDefault for a CA and CertLifetimeDefault otherwise. A
	// certificate never outlives the CA that signs it: its end is clamped
	// to the CA's.
	Lifetime time.Duration
	// Now is the issue time, default time.Now().
	Now time.Time
	// Rand is the randomness for keys and serial numbers, default
	// crypto/rand.Reader.
	Rand io.Reader
}

func (o *Options) setDefaults(lifetime time.Duration) {
	if o.Lifetime <= 0 {
		o.Lifetime = lifetime
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	if o.Rand == nil {
		o.Rand = rand.Reader
	}
}

// Pair is a PEM certificate and its PEM (PKCS #8) private key.
type Pair struct {
	CertPEM, KeyPEM []byte
}

// Authority is a CA that can sign: its certificate and key.
type Authority struct {
	Cert    *x509.Certificate
	CertPEM []byte
	Key     crypto.Signer
}

// ParseAuthority reads a CA's PEM certificate and PEM key, and checks that
// they belong together and that the certificate is a CA's.
func ParseAuthority(certPEM, keyPEM []byte) (*Authority, error) {
	cert, err := parseCertPEM(certPEM)
	if err != nil {
		return nil, err
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("pki: certificate %q is not a CA's", cert.Subject.CommonName)
	}
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, err
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(cert.PublicKey) {
		return nil, errors.New("pki: the CA key does not match the CA certificate")
	}
	return &Authority{Cert: cert, CertPEM: certPEM, Key: key}, nil
}

// CreateCA issues a self-signed CA (ECDSA P-256) named commonName.
func CreateCA(commonName string, o Options) (Pair, error) {
	o.setDefaults(CALifetimeDefault)
	key, err := ecdsa.GenerateKey(elliptic.P256(), o.Rand)
	if err != nil {
		return Pair{}, fmt.Errorf("pki: CA key: %w", err)
	}
	tmpl, err := template(commonName, o, o.Now.Add(o.Lifetime))
	if err != nil {
		return Pair{}, err
	}
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.MaxPathLenZero = true // it signs leaves only
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	return sign(tmpl, tmpl, key, key, o.Rand)
}

// CreateNode issues the certificate of node id of region, signed by ca:
// its identity as the URI SAN geolog://node/<region>/<id>, each of hosts
// as an IP or DNS SAN (the addresses other nodes and clients dial it by;
// at least one), good for TLS server and client authentication.
func CreateNode(ca *Authority, region string, id uint64, hosts []string, o Options) (Pair, error) {
	ident := NodeIdentity(region, id)
	if err := ident.Validate(); err != nil {
		return Pair{}, err
	}
	if len(hosts) == 0 {
		return Pair{}, errors.New("pki: a node certificate needs at least one host (an IP address or a DNS name it is dialed by)")
	}
	return createLeaf(ca, ident, fmt.Sprintf("node %s/%d", region, id), hosts,
		[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, o)
}

// CreateClient issues a client certificate for principal, signed by ca:
// the URI SAN geolog://client/<principal>, common name principal, good for
// TLS client authentication only.
func CreateClient(ca *Authority, principal string, o Options) (Pair, error) {
	ident := ClientIdentity(principal)
	if err := ident.Validate(); err != nil {
		return Pair{}, err
	}
	return createLeaf(ca, ident, principal, nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, o)
}

// CreateServer issues a certificate for a server that is not a geolog
// node (the lease store's PostgreSQL, a proxy), signed by ca: each of
// hosts as an IP or DNS SAN (at least one), good for TLS server
// authentication only, naming no geolog identity, so that it can never
// pass for a node or a client.
func CreateServer(ca *Authority, hosts []string, o Options) (Pair, error) {
	if len(hosts) == 0 {
		return Pair{}, errors.New("pki: a server certificate needs at least one host (an IP address or a DNS name it is dialed by)")
	}
	return createLeaf(ca, Identity{}, hosts[0], hosts, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, o)
}

var dnsNameRE = regexp.MustCompile(`^(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`)

func createLeaf(ca *Authority, ident Identity, commonName string, hosts []string, usage []x509.ExtKeyUsage, o Options) (Pair, error) {
	o.setDefaults(CertLifetimeDefault)
	key, err := ecdsa.GenerateKey(elliptic.P256(), o.Rand)
	if err != nil {
		return Pair{}, fmt.Errorf("pki: key: %w", err)
	}
	notAfter := o.Now.Add(o.Lifetime)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	if !notAfter.After(o.Now) {
		return Pair{}, fmt.Errorf("pki: the CA expired at %s", ca.Cert.NotAfter.UTC().Format(time.RFC3339))
	}
	tmpl, err := template(commonName, o, notAfter)
	if err != nil {
		return Pair{}, err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = usage
	if u := ident.URI(); u != nil {
		tmpl.URIs = []*url.URL{u}
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if len(h) <= 253 && dnsNameRE.MatchString(h) {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		} else {
			return Pair{}, fmt.Errorf("pki: host %.80q is neither an IP address nor a DNS name", h)
		}
	}
	return sign(tmpl, ca.Cert, key, ca.Key, o.Rand)
}

// template is a certificate template with a random 128-bit serial number.
func template(commonName string, o Options, notAfter time.Time) (*x509.Certificate, error) {
	serial, err := rand.Int(o.Rand, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("pki: serial number: %w", err)
	}
	return &x509.Certificate{
		SerialNumber: serial.Add(serial, big.NewInt(1)), // never 0
		Subject:      pkix.Name{CommonName: commonName, Organization: []string{"geolog"}},
		NotBefore:    o.Now.Add(-backdate),
		NotAfter:     notAfter,
	}, nil
}

func sign(tmpl, parent *x509.Certificate, key *ecdsa.PrivateKey, parentKey crypto.Signer, r io.Reader) (Pair, error) {
	der, err := x509.CreateCertificate(r, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return Pair{}, fmt.Errorf("pki: sign: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Pair{}, fmt.Errorf("pki: key: %w", err)
	}
	return Pair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// parseCertPEM reads the first certificate of a PEM bundle.
func parseCertPEM(b []byte) (*x509.Certificate, error) {
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return nil, errors.New("pki: no PEM certificate found")
		}
		if block.Type == "CERTIFICATE" {
			cert, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("pki: certificate: %w", err)
			}
			return cert, nil
		}
	}
}

// parseKeyPEM reads a PEM private key (PKCS #8, or SEC 1 for EC keys).
func parseKeyPEM(b []byte) (crypto.Signer, error) {
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return nil, errors.New("pki: no PEM private key found")
		}
		switch block.Type {
		case "PRIVATE KEY":
			k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("pki: private key: %w", err)
			}
			s, ok := k.(crypto.Signer)
			if !ok {
				return nil, fmt.Errorf("pki: private key of type %T cannot sign", k)
			}
			return s, nil
		case "EC PRIVATE KEY":
			k, err := x509.ParseECPrivateKey(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("pki: private key: %w", err)
			}
			return k, nil
		}
	}
}
