package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/geolog/geolog/authz"
	"github.com/hashicorp/go-hclog"
)

// authzFlags are geologd's authorization flags (docs/security.md).
type authzFlags struct {
	superusers string
	off        bool
}

func addAuthzFlags(fs *flag.FlagSet) *authzFlags {
	var f authzFlags
	fs.StringVar(&f.superusers, "superusers", "", "authorization: client principals (patterns: a trailing '*' matches any suffix) that may make every call; the bootstrap of a fresh cluster")
	fs.BoolVar(&f.off, "no-authz", false, "development only: let every client principal make every public call (nodes-only services stay for nodes)")
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
