package client

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc/credentials"
)

// BearerToken makes the client send token (a JWT) with every call, in an
// "authorization: Bearer" header: the nodes then decide the calls as the
// token's principal ("jwt:<sub>") instead of the client certificate's
// (docs/authz.md). The default is no token. A token is sent over TLS only:
// New refuses it without TLSConfig. A token that expires is not renewed:
// make a new Client with a fresh one (or use TokenSource).
func BearerToken(token string) Opt {
	return TokenSource(func(context.Context) (string, error) { return token, nil })
}

// TokenSource is BearerToken with a token fetched for each call (and each
// stream, when it opens) from source, which may cache and renew it; an
// error from it fails the call.
func TokenSource(source func(ctx context.Context) (string, error)) Opt {
	return func(c *clientConfig) { c.token = source }
}

// bearerCreds are gRPC per-call credentials carrying the token.
type bearerCreds struct {
	source func(ctx context.Context) (string, error)
}

func (b bearerCreds) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	tok, err := b.source(ctx)
	if err != nil {
		return nil, fmt.Errorf("client: bearer token: %w", err)
	}
	if tok = strings.TrimSpace(tok); tok == "" || strings.ContainsAny(tok, " \r\n") {
		return nil, fmt.Errorf("client: bearer token is empty or holds whitespace")
	}
	return map[string]string{"authorization": "Bearer " + tok}, nil
}

// RequireTransportSecurity keeps the token off plaintext connections.
func (bearerCreds) RequireTransportSecurity() bool { return true }

// TokenCredentials are the per-call credentials BearerToken installs, for
// a caller of the generated gRPC clients on its own connections
// (grpc.WithPerRPCCredentials). They are sent over TLS only.
func TokenCredentials(token string) credentials.PerRPCCredentials {
	return bearerCreds{source: func(context.Context) (string, error) { return token, nil }}
}
