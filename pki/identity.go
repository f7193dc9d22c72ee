package pki

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Kind tells a node's identity from a client's.
type Kind int

const (
	// KindClient is a client principal: an application, an operator, a
	// tool. It may call the public API, never a node-to-node service.
	KindClient Kind = iota + 1
	// KindNode is a geolog node of a region, with its Raft id there.
	KindNode
)

// uriScheme is the scheme of the URI SAN that names a geolog identity.
const uriScheme = "geolog"

// Bounds on the names an identity carries.
const (
	// RegionNameBytesMax bounds a region name (as homing's).
	RegionNameBytesMax = 64
	// PrincipalBytesMax bounds a client principal's name.
	PrincipalBytesMax = 128
)

var (
	regionRE    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	principalRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@+-]*$`)
)

// Identity is who a certificate names: a node of a region (URI SAN
// geolog://node/<region>/<node-id>) or a client principal (URI SAN
// geolog://client/<principal>). The zero value names no one.
type Identity struct {
	Kind Kind
	// Region and NodeID are a node's; zero for a client.
	Region string
	NodeID uint64
	// Principal is a client's name; empty for a node.
	Principal string
}

// NodeIdentity returns the identity of node id of region.
func NodeIdentity(region string, id uint64) Identity {
	return Identity{Kind: KindNode, Region: region, NodeID: id}
}

// ClientIdentity returns the identity of a client principal.
func ClientIdentity(principal string) Identity {
	return Identity{Kind: KindClient, Principal: principal}
}

// IsNode reports whether the identity is a node's.
func (id Identity) IsNode() bool { return id.Kind == KindNode }

// Name is the identity as logs, metrics and access rules name it:
// "node:<region>/<id>" for a node, the principal itself for a client,
// "" for the zero Identity.
func (id Identity) Name() string {
	switch id.Kind {
	case KindNode:
		return fmt.Sprintf("node:%s/%d", id.Region, id.NodeID)
	case KindClient:
		return id.Principal
	}
	return ""
}

func (id Identity) String() string {
	if n := id.Name(); n != "" {
		return n
	}
	return "no identity"
}

// URI is the identity's URI SAN.
func (id Identity) URI() *url.URL {
	switch id.Kind {
	case KindNode:
		return &url.URL{Scheme: uriScheme, Host: "node", Path: fmt.Sprintf("/%s/%d", id.Region, id.NodeID)}
	case KindClient:
		return &url.URL{Scheme: uriScheme, Host: "client", Path: "/" + id.Principal}
	}
	return nil
}

// Validate checks the names an identity carries.
func (id Identity) Validate() error {
	switch id.Kind {
	case KindNode:
		if err := ValidateRegion(id.Region); err != nil {
			return err
		}
		if id.NodeID == 0 || id.NodeID > 1<<63-1 {
			return fmt.Errorf("%w: node id %d: must be in [1, 2^63)", ErrBadIdentity, id.NodeID)
		}
	case KindClient:
		if len(id.Principal) == 0 || len(id.Principal) > PrincipalBytesMax || !principalRE.MatchString(id.Principal) {
			return fmt.Errorf("%w: principal %.140q: use 1 to %d letters, digits, '.', '_', '@', '+' and '-', starting with a letter or digit",
				ErrBadIdentity, id.Principal, PrincipalBytesMax)
		}
	default:
		return fmt.Errorf("%w: no kind", ErrBadIdentity)
	}
	return nil
}

// ValidateRegion checks a region name as an identity carries it.
func ValidateRegion(region string) error {
	if len(region) == 0 || len(region) > RegionNameBytesMax || !regionRE.MatchString(region) {
		return fmt.Errorf("%w: region %.80q: use 1 to %d letters, digits, '.', '_' and '-', starting with a letter or digit",
			ErrBadIdentity, region, RegionNameBytesMax)
	}
	return nil
}

// parseURI reads one geolog URI SAN.
func parseURI(u *url.URL) (Identity, error) {
	if u.Scheme != uriScheme || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return Identity{}, fmt.Errorf("%w: %.200q is not a geolog identity URI", ErrBadIdentity, u.String())
	}
	parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	var id Identity
	switch {
	case u.Host == "node" && len(parts) == 2:
		n, err := strconv.ParseUint(parts[1], 10, 64)
		if err != nil || parts[1] != strconv.FormatUint(n, 10) {
			return Identity{}, fmt.Errorf("%w: node id %.40q is not a decimal number", ErrBadIdentity, parts[1])
		}
		id = NodeIdentity(parts[0], n)
	case u.Host == "client" && len(parts) == 1:
		id = ClientIdentity(parts[0])
	default:
		return Identity{}, fmt.Errorf("%w: %.200q names neither geolog://node/<region>/<id> nor geolog://client/<principal>", ErrBadIdentity, u.String())
	}
	if err := id.Validate(); err != nil {
		return Identity{}, err
	}
	return id, nil
}

// FromCertificate reads the identity a certificate names: exactly one URI
// SAN with the geolog scheme. A node certificate must also be good for
// both TLS server and client authentication (a node serves and dials); a
// client certificate for client authentication.
func FromCertificate(cert *x509.Certificate) (Identity, error) {
	var found []*url.URL
	for _, u := range cert.URIs {
		if u.Scheme == uriScheme {
			found = append(found, u)
		}
	}
	if len(found) != 1 {
		return Identity{}, fmt.Errorf("%w: certificate %q carries %d geolog URI SANs, want exactly 1", ErrBadIdentity, cert.Subject.CommonName, len(found))
	}
	id, err := parseURI(found[0])
	if err != nil {
		return Identity{}, err
	}
	need := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if id.IsNode() {
		need = append(need, x509.ExtKeyUsageServerAuth)
	}
	for _, u := range need {
		if !hasExtKeyUsage(cert, u) {
			return Identity{}, fmt.Errorf("%w: %s certificate lacks extended key usage %d", ErrBadIdentity, id, u)
		}
	}
	return id, nil
}

func hasExtKeyUsage(cert *x509.Certificate, want x509.ExtKeyUsage) bool {
	for _, u := range cert.ExtKeyUsage {
		if u == want || u == x509.ExtKeyUsageAny {
			return true
		}
	}
	return false
}

// Errors of this package.
var (
	// ErrBadIdentity: a certificate or a name does not make a valid
	// geolog identity.
	ErrBadIdentity = errors.New("pki: not a valid geolog identity")
	// ErrNoIdentity: the caller presented no verified certificate
	// (plaintext, or TLS without a client certificate).
	ErrNoIdentity = errors.New("pki: caller has no verified certificate")
)

// OverTLSWithoutCertificate reports whether ctx's call came over TLS with no
// client certificate (a listener of ServerTLSClientCertOptional).
func OverTLSWithoutCertificate(ctx context.Context) bool {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return false
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	return ok && len(info.State.PeerCertificates) == 0
}

// PeerIdentity is the identity of the caller of a gRPC request, from the
// certificate it presented and the server's TLS verified. Without TLS, or
// without a verified client certificate, it returns ErrNoIdentity; with a
// certificate that names no valid identity, ErrBadIdentity.
func PeerIdentity(ctx context.Context) (Identity, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return Identity{}, ErrNoIdentity
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return Identity{}, ErrNoIdentity
	}
	// VerifiedChains is set only when the server verified the client's
	// certificate against its CA pool; PeerCertificates alone prove
	// nothing.
	if len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return Identity{}, ErrNoIdentity
	}
	return FromCertificate(info.State.VerifiedChains[0][0])
}
