package regionsvc

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/pki"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/raftnet"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// Who may call what (docs/security.md). With Config.TLS set, every caller
// presents a certificate the node verified, and its identity (pki) decides:
//
//   - the public API (geolog.v1 Log, Admin and Consumer) takes any
//     identity, node or client principal; with Config.Authz a client
//     principal needs the permissions methodPerms names (authz.go);
//   - node-to-node services take node identities only: every service
//     outside geolog.v1 (Mirror, and whatever internal service is added:
//     the rule fails closed), Admin.RefreshHomes, and any request that
//     carries the internal headers (x-geolog-forwarded, x-geolog-propagated);
//   - Raft, RegionCatalogue and ReplicaHints take nodes of this region only, and raftnet then binds each
//     stream to its caller (authorizeRaftPeer): a stream in another node's
//     name is refused. The Mirror server binds its streams the same way
//     (authorizeMirrorSource), and a mirror takes frames only from a node
//     of the range's home region (mirrorStore.Open).
//
// Without Config.TLS (geologd --insecure) nothing is checked.

// callClass is who may make a call.
type callClass int

const (
	callPublic callClass = iota // any verified identity
	callNode                    // node identities
	callRegion                  // nodes of this region
)

func (c callClass) String() string {
	switch c {
	case callPublic:
		return "public"
	case callNode:
		return "nodes"
	case callRegion:
		return "nodes of the region"
	}
	return "unknown"
}

const raftMethodPrefix = "/geolog.internal.v1.RaftTransport/"

// catalogueMethodPrefix is RegionCatalogue's: for nodes of the region.
const catalogueMethodPrefix = "/geolog.internal.v1.RegionCatalogue/"

// hintsMethodPrefix is ReplicaHints': for nodes of the region.
const hintsMethodPrefix = "/geolog.internal.v1.ReplicaHints/"

// classOf classifies a gRPC method by its full name.
func classOf(fullMethod string) callClass {
	switch {
	case strings.HasPrefix(fullMethod, raftMethodPrefix), strings.HasPrefix(fullMethod, catalogueMethodPrefix),
		strings.HasPrefix(fullMethod, hintsMethodPrefix):
		return callRegion
	case fullMethod == geologv1.Admin_RefreshHomes_FullMethodName:
		return callNode
	case strings.HasPrefix(fullMethod, "/geolog.v1."):
		return callPublic
	}
	return callNode
}

// hasInternalHeader reports whether a request carries a header only nodes
// may set.
func hasInternalHeader(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(forwardedKey)) > 0 || len(md.Get(propagatedKey)) > 0
}

// secure reports whether the node checks identities (it serves TLS).
func (n *Node) secure() bool { return n.cfg.TLS != nil }

// principalOf names the caller of a request, the one place the node
// decides it (logs, metrics, access rules, quotas): "node:<region>/<id>"
// or a client's principal from its verified certificate; without TLS or a
// valid identity, the peer's address (addrPrincipal).
func principalOf(ctx context.Context) string {
	if c, ok := ctx.Value(callerKey{}).(caller); ok {
		return c.principal
	}
	if id, err := pki.PeerIdentity(ctx); err == nil && id.Name() != "" {
		return id.Name()
	}
	return addrPrincipal(ctx)
}

// Why a call was refused, the "reason" of the refused-calls metric.
const (
	reasonNoIdentity    = "no identity"
	reasonNodesOnly     = "nodes only"
	reasonRegionOnly    = "region nodes only"
	reasonUnknownMethod = "not in the permission table"
	reasonNoPermission  = "no permission"
	reasonBadToken      = "bad token"
)

// callerOf names the verified caller of ctx and says whether it is a
// node: a bearer token's principal when the call presented one
// (authenticateToken), else its certificate's.
func callerOf(ctx context.Context) (string, bool) {
	if c, ok := ctx.Value(callerKey{}).(caller); ok {
		return c.principal, false
	}
	id, err := pki.PeerIdentity(ctx)
	if err != nil {
		return "", false
	}
	return id.Name(), id.IsNode()
}

// authorizeCall decides whether the caller of ctx may make a call to
// fullMethod at all (its class); authorizeRequest then decides the
// request's permissions. Errors are *apierr.Error (UNAUTHENTICATED or
// PERMISSION_DENIED).
func (n *Node) authorizeCall(ctx context.Context, fullMethod string) error {
	if !n.secure() {
		return nil
	}
	id, err := pki.PeerIdentity(ctx)
	if err != nil && n.tokenOnlyCaller(ctx, fullMethod) {
		return nil // authenticateToken decides, on the token alone
	}
	if err != nil {
		return n.authRefused(ctx, fullMethod, "", reasonNoIdentity, apierr.Wrap(apierr.Unauthenticated, err, "%s", fullMethod))
	}
	class := classOf(fullMethod)
	if class == callPublic && hasInternalHeader(ctx) {
		class = callNode
	}
	switch {
	case class == callNode && !id.IsNode():
		return n.authRefused(ctx, fullMethod, id.Name(), reasonNodesOnly, apierr.New(apierr.PermissionDenied, "%s is for nodes only; the caller is %s", fullMethod, id.Name()))
	case class == callRegion && (!id.IsNode() || id.Region != n.cfg.Region):
		return n.authRefused(ctx, fullMethod, id.Name(), reasonRegionOnly, apierr.New(apierr.PermissionDenied, "%s is for nodes of region %s only; the caller is %s", fullMethod, n.cfg.Region, id.Name()))
	}
	return nil
}

// tokenOnlyCaller reports whether ctx's call may go on without a client
// certificate: it came over TLS with none, carries a bearer token, this node
// accepts tokens, and it is a public call (internal ones are for nodes,
// which present certificates).
func (n *Node) tokenOnlyCaller(ctx context.Context, fullMethod string) bool {
	if n.cfg.Tokens == nil || !pki.OverTLSWithoutCertificate(ctx) || classOf(fullMethod) != callPublic || hasInternalHeader(ctx) {
		return false
	}
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(authorizationKey)) > 0
}

// authRefused logs (rate-limited) and counts a refusal, and returns err.
func (n *Node) authRefused(ctx context.Context, method, principal, reason string, err *apierr.Error) error {
	now := time.Now
	if n.cfg.Now != nil {
		now = n.cfg.Now
	}
	if ok, leftOut := n.refusals.admit(now()); ok {
		n.logger.Warn("call refused", "method", method, "principal", principal, "reason", reason,
			"code", err.Code.String(), "error", err.Message, "refusals_not_logged", leftOut)
	}
	if n.authMetrics != nil {
		n.authMetrics.refused.Add(ctx, 1, metric.WithAttributes(attribute.String("code", err.Code.String()),
			attribute.String("method", method), attribute.String("reason", reason)))
	}
	return err
}

// authInterceptors put authorizeCall and authorizeRequest in front of
// every handler: a unary request is decided before its handler runs, a
// stream's on each message the client sends (authzStream).
func (n *Node) authInterceptors() []grpc.ServerOption {
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if isHealthMethod(info.FullMethod) {
			return h(ctx, req) // any caller the transport admits (health.go)
		}
		if err := n.authorizeCall(ctx, info.FullMethod); err != nil {
			return nil, err
		}
		ctx, err := n.authenticateToken(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		if err := n.authorizeRequest(ctx, info.FullMethod, req); err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if isHealthMethod(info.FullMethod) {
			return h(srv, ss)
		}
		if err := n.authorizeCall(ss.Context(), info.FullMethod); err != nil {
			return err
		}
		ctx, err := n.authenticateToken(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		if ctx != ss.Context() {
			ss = callerStream{ServerStream: ss, ctx: ctx}
		}
		if n.authzOn() && classOf(info.FullMethod) == callPublic {
			ss = newAuthzStream(ss, n, info.FullMethod)
		}
		return h(srv, ss)
	}
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(unary), grpc.ChainStreamInterceptor(stream)}
}

// authorizeRaftPeer is raftnet's AuthorizePeer: the caller must be node
// from of this region, and from one of the region's nodes.
func (n *Node) authorizeRaftPeer(ctx context.Context, from raftnet.NodeID) error {
	if !n.secure() {
		return nil
	}
	id, err := pki.PeerIdentity(ctx)
	switch {
	case err != nil:
		return err
	case id != pki.NodeIdentity(n.cfg.Region, uint64(from)):
		return errors.New("the caller is " + id.Name() + ", not the node the stream names")
	case !n.isRegionPeer(uint64(from)): // members.go
		return errors.New("the caller is not a node of this region (or was decommissioned)")
	}
	return nil
}

// authorizeMirrorSource is the Mirror server's AuthorizeSource: the caller
// must be a node of the region the stream names as its source and, when
// the stream names the home leader, that node.
func (n *Node) authorizeMirrorSource(ctx context.Context, sourceRegion string, leaderNodeID uint64) error {
	if !n.secure() {
		return nil
	}
	id, err := pki.PeerIdentity(ctx)
	switch {
	case err != nil:
		return err
	case !id.IsNode() || id.Region != sourceRegion:
		return errors.New("the caller is " + id.Name() + ", not a node of region " + sourceRegion)
	case leaderNodeID != 0 && id.NodeID != leaderNodeID:
		return errors.New("the caller is " + id.Name() + ", not the leader node its heartbeats name")
	}
	return nil
}

// checkMirrorCaller refuses a mirror stream for d unless its caller is a
// node of the range's home region as this node knows it.
func (n *Node) checkMirrorCaller(ctx context.Context, d *rangeDriver) error {
	if !n.secure() {
		return nil
	}
	id, err := pki.PeerIdentity(ctx)
	if err != nil {
		return apierr.Wrap(apierr.Unauthenticated, err, "mirror stream")
	}
	if home := d.role().region; id.Region != home {
		return apierr.New(apierr.NotHome, "stream %s range %d: %s is not a node of the home region %s", d.cfg.stream, d.cfg.rangeID, id.Name(), home)
	}
	return nil
}

// authMetrics counts refused calls.
type authMetrics struct {
	refused metric.Int64Counter
}

func newAuthMetrics(mp metric.MeterProvider) (*authMetrics, error) {
	c, err := mp.Meter("github.com/geolog/geolog/regionsvc").Int64Counter("geolog.auth.refused_calls",
		metric.WithDescription("calls refused for their caller's identity or permissions (UNAUTHENTICATED, PERMISSION_DENIED), by code, method and reason"))
	if err != nil {
		return nil, err
	}
	return &authMetrics{refused: c}, nil
}
