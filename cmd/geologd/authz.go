package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/geolog/geolog/authz"
	"github.com/hashicorp/go-hclog"
)

// authzFlags are geologd's authorization flags (docs/security.md).
type authzFlags struct {
	superusers string
	off        bool
	// Bearer tokens (JWT).
	jwtKeys, jwtIssuer, jwtAudience string
	jwtLeeway                       time.Duration
}

func addAuthzFlags(fs *flag.FlagSet) *authzFlags {
	var f authzFlags
	fs.StringVar(&f.superusers, "superusers", "", "authorization: client principals (patterns: a trailing '*' matches any suffix) that may make every call; the bootstrap of a fresh cluster")
	fs.BoolVar(&f.off, "no-authz", false, "development only: let every client principal make every public call (nodes-only services stay for nodes)")
	fs.StringVar(&f.jwtKeys, "jwt-keys", "", "accept bearer tokens (JWT) signed by the PEM public keys in this file (RSA, ECDSA P-256, Ed25519); a token's principal is jwt:<sub>")
	fs.StringVar(&f.jwtIssuer, "jwt-issuer", "", "with --jwt-keys: the iss a token must name (default: any)")
	fs.StringVar(&f.jwtAudience, "jwt-audience", "", "with --jwt-keys: an aud a token must name (default: any)")
	fs.DurationVar(&f.jwtLeeway, "jwt-leeway", authz.TokenLeewayDefault, "with --jwt-keys: clock skew tolerated on a token's exp and nbf")
	return &f
}

// policy is the node's authorization policy, or nil when authorization is
// off (--no-authz, or --insecure, where no caller has an identity).
func (f *authzFlags) policy(logger hclog.Logger, secure bool) (*authz.Policy, error) {
	var supers []string
	for _, s := range strings.Split(f.superusers, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if err := authz.ValidatePattern(s); err != nil {
			return nil, fmt.Errorf("--superusers: %w", err)
		}
		supers = append(supers, s)
	}
	switch {
	case f.off && len(supers) > 0:
		return nil, errors.New("--no-authz and --superusers exclude each other")
	case !secure:
		return nil, nil // --insecure said it loudly already
	case f.off:
		logger.Warn("AUTHORIZATION OFF (--no-authz): every client principal with a valid certificate may produce, consume and administer every stream; for development only")
		return nil, nil
	case len(supers) == 0:
		logger.Warn("authorization on and no --superusers: client principals may make no call (nodes still may)")
	}
	return &authz.Policy{Superusers: supers}, nil
}

// tokens is the node's bearer token verifier, nil without --jwt-keys.
func (f *authzFlags) tokens(logger hclog.Logger, secure bool) (*authz.TokenVerifier, error) {
	if f.jwtKeys == "" {
		if f.jwtIssuer != "" || f.jwtAudience != "" {
			return nil, errors.New("--jwt-issuer and --jwt-audience need --jwt-keys")
		}
		return nil, nil
	}
	if !secure {
		return nil, errors.New("--jwt-keys needs TLS: bearer tokens are accepted over TLS only")
	}
	pem, err := os.ReadFile(f.jwtKeys)
	if err != nil {
		return nil, fmt.Errorf("--jwt-keys: %w", err)
	}
	v, err := authz.NewTokenVerifier(authz.TokenConfig{KeysPEM: pem, Issuer: f.jwtIssuer, Audience: f.jwtAudience, Leeway: f.jwtLeeway})
	if err != nil {
		return nil, fmt.Errorf("--jwt-keys %s: %w", f.jwtKeys, err)
	}
	if f.jwtIssuer == "" || f.jwtAudience == "" {
		logger.Warn("bearer tokens accepted without checking their issuer or audience: any token the keys signed is good here (--jwt-issuer, --jwt-audience)")
	}
	return v, nil
}
