package cli

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/geolog/geolog/pki"
)

// certs makes a development PKI (docs/security.md): a CA, node
// certificates carrying their identity, client certificates carrying a
// principal. Every file is written atomically with mode 0600; an existing
// file is replaced only with --overwrite.
func (e *env) certs(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usagef("certs needs a subcommand: create-ca, create-node or create-client")
	}
	switch sub, args := args[0], args[1:]; sub {
	case "create-ca":
		return e.certsCreateCA(args)
	case "create-node":
		return e.certsCreateNode(args)
	case "create-client":
		return e.certsCreateClient(args)
	case "create-server":
		return e.certsCreateServer(args)
	default:
		return usagef("unknown certs subcommand %q (want create-ca, create-node, create-client or create-server)", sub)
	}
}

// certFlags are the flags every certs subcommand takes.
type certFlags struct {
	caCert, caKey string
	lifetime      time.Duration
	overwrite     bool
}

func (e *env) certFlagSet(name string, lifetimeDefault time.Duration) (*flag.FlagSet, *certFlags) {
	fs := e.flagSet(name)
	var cf certFlags
	fs.StringVar(&cf.caCert, "ca-cert", "", "the CA certificate (default: ca.crt in --certs-dir)")
	fs.StringVar(&cf.caKey, "ca-key", "", "the CA key (default: ca.key in --certs-dir; keep it elsewhere in production)")
	fs.DurationVar(&cf.lifetime, "lifetime", lifetimeDefault, "how long the certificate is valid (never past its CA)")
	fs.BoolVar(&cf.overwrite, "overwrite", false, "replace existing files")
	return fs, &cf
}

// paths completes the CA paths from --certs-dir, which is required.
func (e *env) certPaths(cf *certFlags) error {
	if e.certsDir == "" {
		return usagef("--certs-dir (or GEOLOG_CERTS_DIR) names the folder to write")
	}
	if cf.caCert == "" {
		cf.caCert = filepath.Join(e.certsDir, pki.CACertFile)
	}
	if cf.caKey == "" {
		cf.caKey = filepath.Join(e.certsDir, pki.CAKeyFile)
	}
	return nil
}

func (e *env) certsCreateCA(args []string) error {
	fs, cf := e.certFlagSet("certs create-ca", pki.CALifetimeDefault)
	name := fs.String("name", "geolog development CA", "the CA's common name")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("usage: certs create-ca --certs-dir DIR [--ca-key FILE] [--lifetime D] [--overwrite]")
	}
	if err := e.certPaths(cf); err != nil {
		return err
	}
	p, err := pki.CreateCA(*name, pki.Options{Lifetime: cf.lifetime})
	if err != nil {
		return err
	}
	if err := pki.WritePair(cf.caCert, cf.caKey, p, cf.overwrite); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "wrote %s and %s\n", cf.caCert, cf.caKey)
	return nil
}

// authority loads the CA and puts a copy of its certificate in the certs
// folder, where the node or client reads it.
func (e *env) authority(cf *certFlags) (*pki.Authority, error) {
	ca, err := pki.LoadAuthority(cf.caCert, cf.caKey)
	if err != nil {
		return nil, err
	}
	if err := pki.WriteCACopy(filepath.Join(e.certsDir, pki.CACertFile), ca.CertPEM, cf.overwrite); err != nil {
		return nil, err
	}
	return ca, nil
}

func (e *env) certsCreateNode(args []string) error {
	fs, cf := e.certFlagSet("certs create-node", pki.CertLifetimeDefault)
	region := fs.String("region", "", "the node's region (its geologd --region)")
	nodeID := fs.String("node-id", "", "the node's Raft id in its region (its geologd --node-id; 1 for a region of one)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 || *region == "" || *nodeID == "" {
		return usagef("usage: certs create-node --certs-dir DIR --region R --node-id N [--ca-cert FILE] [--ca-key FILE] HOST... (every address the node is dialed by)")
	}
	id, err := strconv.ParseUint(*nodeID, 10, 64)
	if err != nil {
		return usagef("--node-id %q is not a number", *nodeID)
	}
	if err := e.certPaths(cf); err != nil {
		return err
	}
	ca, err := e.authority(cf)
	if err != nil {
		return err
	}
	p, err := pki.CreateNode(ca, *region, id, pos, pki.Options{Lifetime: cf.lifetime})
	if err != nil {
		return err
	}
	return e.writeLeaf(p, pki.NodeCertFile, pki.NodeKeyFile, cf.overwrite, pki.NodeIdentity(*region, id))
}

func (e *env) certsCreateClient(args []string) error {
	fs, cf := e.certFlagSet("certs create-client", pki.CertLifetimeDefault)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("usage: certs create-client --certs-dir DIR [--ca-cert FILE] [--ca-key FILE] PRINCIPAL")
	}
	if err := e.certPaths(cf); err != nil {
		return err
	}
	ca, err := e.authority(cf)
	if err != nil {
		return err
	}
	p, err := pki.CreateClient(ca, pos[0], pki.Options{Lifetime: cf.lifetime})
	if err != nil {
		return err
	}
	return e.writeLeaf(p, pki.ClientCertFile, pki.ClientKeyFile, cf.overwrite, pki.ClientIdentity(pos[0]))
}

// certsCreateServer issues a certificate for a server that is not a node
// (the lease store's PostgreSQL): server.crt and server.key.
func (e *env) certsCreateServer(args []string) error {
	fs, cf := e.certFlagSet("certs create-server", pki.CertLifetimeDefault)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("usage: certs create-server --certs-dir DIR [--ca-cert FILE] [--ca-key FILE] HOST...")
	}
	if err := e.certPaths(cf); err != nil {
		return err
	}
	ca, err := e.authority(cf)
	if err != nil {
		return err
	}
	p, err := pki.CreateServer(ca, pos, pki.Options{Lifetime: cf.lifetime})
	if err != nil {
		return err
	}
	cert, key := filepath.Join(e.certsDir, pki.ServerCertFile), filepath.Join(e.certsDir, pki.ServerKeyFile)
	if err := pki.WritePair(cert, key, p, cf.overwrite); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "wrote %s and %s for %v\n", cert, key, pos)
	return nil
}

func (e *env) writeLeaf(p pki.Pair, certName, keyName string, overwrite bool, id pki.Identity) error {
	cert, key := filepath.Join(e.certsDir, certName), filepath.Join(e.certsDir, keyName)
	if err := pki.WritePair(cert, key, p, overwrite); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "wrote %s and %s for %s (%s)\n", cert, key, id.Name(), id.URI())
	return nil
}
