package regionsvc

import (
	"context"
	"strings"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/pki"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// Bearer tokens (docs/authz.md, "Bearer tokens"). A client may send
// "authorization: Bearer <JWT>" with a call; Config.Tokens verifies it
// and its principal ("jwt:<sub>", authz.TokenPrincipalPrefix) is then the
// caller's for every decision, instead of the client certificate's. The
// certificate still has to be a valid client's (the TLS listener asks
// every caller for one), and:
//
//   - a token is accepted over TLS only: a node without TLS refuses a
//     call that carries one (the client sent a secret in plaintext);
//   - a node's certificate with a token is refused (nodes never send
//     one, and a token must not turn a node into a client);
//   - a bad, expired, foreign-signed or unsigned token, or one sent to a
//     node without Config.Tokens, is UNAUTHENTICATED;
//   - a stream opened with a token ends with UNAUTHENTICATED at its next
//     message once the token expired (authzStream).

// authorizationKey is the gRPC metadata key of the bearer token.
const authorizationKey = "authorization"

// caller is the principal the interceptor decided a call is made by,
// when a bearer token named it; expires is the token's exp.
type caller struct {
	principal string
	expires   time.Time
}

type callerKey struct{}

// authenticateToken verifies the bearer token of a call, if it carries
// one, and returns ctx naming its principal (ctx itself without one).
func (n *Node) authenticateToken(ctx context.Context, method string) (context.Context, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(authorizationKey)
	if len(vals) == 0 {
		return ctx, nil
	}
	refuse := func(principal, format string, args ...any) (context.Context, error) {
		return nil, n.authRefused(ctx, method, principal, reasonBadToken, apierr.New(apierr.Unauthenticated, format, args...))
	}
	if !n.secure() {
		return refuse("", "%s: bearer tokens are accepted over TLS only (this node serves plaintext)", method)
	}
	id, err := pki.PeerIdentity(ctx)
	if err != nil && n.tokenOnlyCaller(ctx, method) {
		// No certificate: the token alone names the caller.
		id, err = pki.Identity{}, nil
	}
	switch {
	case err != nil:
		return refuse("", "%s: %v", method, err)
	case id.IsNode():
		return refuse(id.Name(), "%s: a node presents no bearer token", method)
	case len(vals) > 1:
		return refuse(id.Name(), "%s: %d authorization headers (at most one)", method, len(vals))
	case n.cfg.Tokens == nil:
		return refuse(id.Name(), "%s: this node accepts no bearer tokens (geologd --jwt-keys)", method)
	}
	scheme, token, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return refuse(id.Name(), "%s: the authorization header is not \"Bearer <token>\"", method)
	}
	tok, err := n.cfg.Tokens.Verify(strings.TrimSpace(token))
	if err != nil {
		return refuse(id.Name(), "%s: %v", method, err)
	}
	return context.WithValue(ctx, callerKey{}, caller{principal: tok.Principal, expires: tok.Expires}), nil
}

// tokenExpired reports whether ctx's call was authenticated by a bearer
// token that has expired since.
func (n *Node) tokenExpired(ctx context.Context) bool {
	c, ok := ctx.Value(callerKey{}).(caller)
	return ok && n.cfg.Tokens != nil && n.cfg.Tokens.Expired(c.expires)
}

// checkTokenStillValid refuses a call whose token expired.
func (n *Node) checkTokenStillValid(ctx context.Context, method string) error {
	if !n.tokenExpired(ctx) {
		return nil
	}
	c, _ := ctx.Value(callerKey{}).(caller)
	return n.authRefused(ctx, method, c.principal, reasonBadToken,
		apierr.New(apierr.Unauthenticated, "%s: the bearer token of %s expired at %s", method, c.principal, c.expires.UTC().Format(time.RFC3339)))
}

// callerStream is a server stream whose context names the caller.
type callerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s callerStream) Context() context.Context { return s.ctx }
