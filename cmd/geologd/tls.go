package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/geolog/geolog/pki"
	"github.com/hashicorp/go-hclog"
)

// tlsFlags are geologd's transport security flags (docs/security.md).
type tlsFlags struct {
	certsDir, ca, cert, key string
	insecure                bool
	reloadInterval          time.Duration
}

func addTLSFlags(fs *flag.FlagSet) *tlsFlags {
	var f tlsFlags
	fs.StringVar(&f.certsDir, "certs-dir", "", "TLS: a folder with ca.crt, node.crt and node.key (geolog certs create-node writes it)")
	fs.StringVar(&f.ca, "tls-ca", "", "TLS: the CA bundle peers and clients are verified against (default: ca.crt in --certs-dir)")
	fs.StringVar(&f.cert, "tls-cert", "", "TLS: this node's certificate (default: node.crt in --certs-dir)")
	fs.StringVar(&f.key, "tls-key", "", "TLS: this node's key (default: node.key in --certs-dir)")
	fs.BoolVar(&f.insecure, "insecure", false, "development only: serve plaintext, check no caller, reach the lease store without TLS")
	fs.DurationVar(&f.reloadInterval, "tls-reload-interval", 10*time.Second, "TLS: how often the files are checked for a change (SIGHUP reloads at once)")
	return &f
}

// errNoTLS is geologd's refusal to start without TLS and without
// --insecure: one line that says what to do.
var errNoTLS = errors.New("no TLS: give --certs-dir (or --tls-ca, --tls-cert and --tls-key), or --insecure for development without TLS")

// open loads the node's TLS material, checks that its certificate names
// this node (region, and node id when replicated), or returns nil in
// insecure mode.
func (f *tlsFlags) open(logger hclog.Logger, region string, nodeID uint64) (*pki.Files, error) {
	given := f.certsDir != "" || f.ca != "" || f.cert != "" || f.key != ""
	switch {
	case f.insecure && given:
		return nil, errors.New("--insecure and TLS files exclude each other")
	case f.insecure:
		logger.Warn("INSECURE MODE: no TLS; any caller can reach every service, Raft and mirroring included, as any node; for development only")
		return nil, nil
	case !given:
		return nil, errNoTLS
	case f.reloadInterval <= 0:
		return nil, errors.New("--tls-reload-interval must be positive")
	}
	pick := func(v, name string) string {
		if v == "" && f.certsDir != "" {
			return filepath.Join(f.certsDir, name)
		}
		return v
	}
	cfg := pki.FilesConfig{CAFile: pick(f.ca, pki.CACertFile), CertFile: pick(f.cert, pki.NodeCertFile),
		KeyFile: pick(f.key, pki.NodeKeyFile), Logger: logger}
	if cfg.CAFile == "" || cfg.CertFile == "" || cfg.KeyFile == "" {
		return nil, errors.New("TLS needs a CA bundle, a certificate and a key: give --certs-dir, or all of --tls-ca, --tls-cert and --tls-key")
	}
	files, err := pki.OpenFiles(cfg)
	if err != nil {
		return nil, err
	}
	id := files.Identity()
	switch {
	case !id.IsNode():
		return nil, fmt.Errorf("%s names %s, not a node (geolog certs create-node)", cfg.CertFile, id.Name())
	case id.Region != region:
		return nil, fmt.Errorf("%s names %s, a node of region %s, but --region is %s", cfg.CertFile, id.Name(), id.Region, region)
	case nodeID != 0 && id.NodeID != nodeID:
		return nil, fmt.Errorf("%s names %s, but --node-id is %d", cfg.CertFile, id.Name(), nodeID)
	}
	return files, nil
}

// watch reloads files on change and on each signal from hup (SIGHUP)
// until ctx ends. Without files (insecure mode) a SIGHUP only says so.
func (f *tlsFlags) watch(ctx context.Context, logger hclog.Logger, files *pki.Files, hup <-chan os.Signal) {
	trigger := make(chan struct{})
	go func() {
		for {
			select {
			case <-hup:
				if files == nil {
					logger.Info("SIGHUP: no TLS material to reload (insecure mode)")
					continue
				}
				select {
				case trigger <- struct{}{}:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	if files != nil {
		files.Watch(ctx, f.reloadInterval, trigger)
	}
}
