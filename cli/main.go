// Package cli is the geolog command-line tool: stream admin, produce,
// consume and bench. cmd/geolog is a thin main around Main; tests call Run.
package cli

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/internal/version"
	"github.com/geolog/geolog/pki"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the operation failed
	exitUsage = 2 // the command line is wrong
)

// DefaultAddr is the node address used when neither --addr nor GEOLOG_ADDR
// is set.
const DefaultAddr = "127.0.0.1:7400"

const usage = `geolog — command-line client for geolog

usage: geolog [global flags] <command> [flags] [args]

commands:
  streams create <name> [--ranges N] [--regions a,b] [--home REGION|spread]
                 [--retention-age 168h] [--retention-bytes N] [--replication-factor 1|3|5]
                 [--mirror-hold-bytes N] [--mirror-hold-age D]
  streams list [--json | --format T]
  streams describe <name> [--json | --format T]
  streams alter <name> [--retention-age D] [--retention-bytes N] [--mirror-hold-bytes N] [--mirror-hold-age D]
                       change a stream's retention in every region of it
  streams delete <name>
  ranges <stream> [--json | --format T]
                       per range: home, epoch, tail, leader, and each region's
                       applied offset and lag (offsets/time), merged from every
                       node of --addr (give nodes of every region)
  ranges split --stream S --range R [--at HASH]
                       split a range at a hash boundary (default: its
                       midpoint) into two children (docs/split.md)
  lag <stream> [--duration 30s] [--home REGION] [--json]
                       follow every range from its tail on --addr's nodes and
                       report replication lag (receipt minus home append time)
  produce <stream> [--key K | --key-field F | --tab] [--value V]... [--header k=v]... [-v]
  consume <stream> [--range N] [--key K] [--from start|end|N|-1h|RFC3339] [--follow] [--max N] [--json | --format T]
  consume <stream> --group G [--start earliest|latest] [--member ID] [--instance ID]
          [--session 10s] [--max N] [--json]
                       consume as a member of a consumer group: ranges are
                       shared with the group's other members, records printed
                       are committed (at least once)
  groups list [--stream S] [--json | --format T]
  groups describe <group> [--json | --format T]
                       members, ranges, committed positions and lag (records
                       and time) per range
  groups delete <group>
  groups reset <group> [--stream S] [--range N]... --to-earliest | --to-latest |
               --to-time RFC3339 | --to-offset N
                       move a group's positions (refused while it has members)
  bench floor [--dir D] [--writers 3] [--json]
                       this machine's floor: write+fdatasync of 4 KiB and 1 MiB
                       with 1 and --writers writers, 4 KiB over zeros written
                       before (zero-ahead's), loopback round trip
  bench cursors [--cursors 1000] [--batch 500] [--concurrency 8] [--duration 10s]
  bench rebalance [--ranges 64] [--members 8] [--rounds 5] [--session 3s]
  bench e2e --consume-addr host:port,... [--stream S] [--rate 1000] [--duration 20s] [--producers 8]
                       produce on --addr, consume as a group member on
                       --consume-addr: end-to-end latency p50/p99
  bench [--stream S] [--ranges 8] [--producers 1] [--record-bytes 1024] [--inflight 1]
        [--linger D] [--batch-bytes N] [--buffer-bytes N] [--duration 10s | --count N] [--keys N]
        [--sync] [--json]
  acl add <principal> <resource> <perm[,perm...]> [--json]
  acl list [--resource PATTERN] [--json]
  acl remove <principal> <resource>
                       access rules, the same in every region: perms are
                       produce, consume, describe, admin, group; principal
                       and resource are names or prefix* patterns
  orphans list <stream> [--json]
  orphans republish <stream> [--range N] [--fork INDEX] [--dry-run]
                       records a failed home acked but never replicated, kept
                       by a fork in its orphan log (needs --lease-store)
  keys list|rotate|rewrap --data-dir DIR --kek-file FILE
  keys add-kek|remove-kek --kek-file FILE
                       encryption at rest: a stopped node's data keys and the
                       KEK file (see 'geolog keys --help')
  verify --data-dir DIR [--kek-file FILE] [--json]
                       check a stopped node's ranges on disk (CRCs, lost
                       segments, indexes); exit 1 on any problem
  rehome <stream> <range|all> <region> [--json]
                       move homes to region with zero loss (needs --lease-store)
  replicas describe <stream> <range>
  replicas add-learner|promote|remove <stream> <range> <node-id>
  replicas replace <stream> <range> <old-node-id> <new-node-id>
  nodes list [--json]
  nodes drain|undrain|decommission <node-id>
                       the region's node list (nodes join with geologd --join);
                       a draining node takes no new replicas, a decommissioned
                       one leaves for good (its id is never reused)
  certs create-ca --certs-dir DIR [--ca-key FILE] [--lifetime D] [--overwrite]
  certs create-node --certs-dir DIR --region R --node-id N [--ca-cert F] [--ca-key F] HOST...
  certs create-client --certs-dir DIR [--ca-cert F] [--ca-key F] PRINCIPAL
  certs create-server --certs-dir DIR [--ca-cert F] [--ca-key F] HOST...
                       a development PKI (ECDSA P-256), files 0600; node
                       certificates name geolog://node/<region>/<id>, client
                       certificates geolog://client/<principal>; server
                       certificates (the lease store's) name no identity

  context list|show|use|add|remove
                       named settings (addresses, TLS files, time bounds) in
                       $GEOLOG_CONFIG or ~/.config/geolog/config.toml, like
                       nats context or rpk profile; --context NAME picks one
  completion bash|zsh|fish
                       the shell's completion script (source <(geolog completion bash))
  help [<command> [<subcommand>]]
                       this text, or a command's usage and flags
  version [--json]     this build's version and commit

global flags (also accepted after the command):
  --addr host:port[,host:port...]
                       node addresses, any nodes of the region (default
                       $GEOLOG_ADDR or ` + DefaultAddr + `)
  --context NAME       the config file's context to use ($GEOLOG_CONTEXT;
                       default: the file's current one)
  --timeout D          bound on each admin or read call, its retries included (default 30s)
  --retries N          retries of a retriable admin or read call (default 2)
  --certs-dir DIR      dial with TLS: ca.crt, and client.crt/client.key when
                       present, from DIR (default $GEOLOG_CERTS_DIR)
  --tls-ca FILE        dial with TLS, trusting this CA bundle ($GEOLOG_TLS_CA)
  --tls-cert FILE      client certificate for mutual TLS, with --tls-key
                       ($GEOLOG_TLS_CERT)
  --tls-key FILE       client key for mutual TLS ($GEOLOG_TLS_KEY)
  --tls-server-name S  expected server name (default: host of --addr;
                       $GEOLOG_TLS_SERVER_NAME)
  --token JWT          bearer token sent with every call (over TLS only); the
                       nodes decide the calls as jwt:<sub> ($GEOLOG_TOKEN)

Run 'geolog <command> --help' for a command's flags.
`

// Main runs the tool with the process's stdin and signals and returns the
// exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	return Run(ctx, args, os.Stdin, stdout, stderr)
}

// Run runs the tool; args exclude the program name. Ending ctx stops
// following consumers and benchmarks cleanly.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	env := &env{stdin: stdin, stdout: stdout, stderr: stderr}
	if err := env.selectContext(args); err != nil {
		fmt.Fprintf(stderr, "geolog: %v\n", err)
		return exitCodeOf(err)
	}
	fs := env.flagSet("geolog")
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	// Global flags stop at the command name.
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	args = fs.Args()
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	cmd, args := args[0], args[1:]
	var err error
	switch cmd {
	case "streams":
		err = env.streams(ctx, args)
	case "produce":
		err = env.produce(ctx, args)
	case "consume":
		err = env.consume(ctx, args)
	case "bench":
		err = env.bench(ctx, args)
	case "replicas":
		err = env.replicas(ctx, args)
	case "nodes":
		err = env.nodes(ctx, args)
	case "ranges":
		err = env.ranges(ctx, args)
	case "lag":
		err = env.lag(ctx, args)
	case "rehome":
		err = env.rehome(ctx, args)
	case "orphans":
		err = env.orphans(ctx, args)
	case "keys":
		err = env.keys(ctx, args)
	case "verify":
		err = env.verify(ctx, args)
	case "certs":
		err = env.certs(ctx, args)
	case "groups":
		err = env.groups(ctx, args)
	case "acl":
		err = env.acl(ctx, args)
	case "help":
		if len(args) == 0 {
			fmt.Fprint(stdout, usage)
			return exitOK
		}
		return env.help(ctx, args)
	case "version":
		err = env.version(args)
	case "context":
		err = env.contextCmd(ctx, args)
	case "completion":
		err = env.completion(args)
	case "__complete":
		err = env.complete(ctx, args)
	default:
		fmt.Fprintf(stderr, "geolog: unknown command %q\n\n%s", cmd, usage)
		return exitUsage
	}
	if err != nil {
		switch {
		case errors.Is(err, flag.ErrHelp), errors.Is(err, errReported), isFlagError(err):
			// Already printed.
		default:
			fmt.Fprintf(stderr, "geolog %s: %v\n", cmd, err)
			if hint := env.errorHint(err); hint != "" {
				fmt.Fprintf(stderr, "(%s)\n", hint)
			}
		}
		return exitCodeOf(err)
	}
	return exitOK
}

// subcommanded are the commands that take a subcommand.
var subcommanded = map[string]bool{"acl": true, "context": true, "streams": true, "groups": true, "orphans": true, "keys": true, "replicas": true, "certs": true, "nodes": true}

// help prints help for a command: "help <command> <subcommand>" and a
// command without subcommands show its flags (its --help, on standard
// output); "help <command>" of one with subcommands shows the usage lines
// of its subcommands.
func (e *env) help(ctx context.Context, args []string) int {
	cmd := args[0]
	if !strings.Contains(usage, "\n  "+cmd+" ") {
		fmt.Fprintf(e.stderr, "geolog help: unknown command %q\n\n%s", cmd, usage)
		return exitUsage
	}
	if len(args) > 1 || !subcommanded[cmd] {
		code := Run(ctx, append(append([]string(nil), args...), "--help"), e.stdin, e.stdout, e.stdout)
		if code == exitUsage {
			return exitOK // --help's own exit
		}
		return code
	}
	fmt.Fprintf(e.stdout, "usage of geolog %s:\n%s\nRun 'geolog help %s <subcommand>' for a subcommand's flags.\n", cmd, usageOf(cmd), cmd)
	return exitOK
}

// usageOf returns the lines of the top-level usage that describe cmd: its
// lines and their deeper-indented continuations.
func usageOf(cmd string) string {
	var b strings.Builder
	in := false
	for _, line := range strings.Split(usage, "\n") {
		switch {
		case strings.HasPrefix(line, "  "+cmd+" "):
			in = true
		case strings.HasPrefix(line, "   ") && in:
		default:
			in = false
		}
		if in {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// usageError is a wrong command line.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// errReported is returned by commands that already printed their errors.
var errReported = errors.New("errors reported")

func exitCodeOf(err error) int {
	var ue usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue), isFlagError(err):
		return exitUsage
	default:
		return exitError
	}
}

// flagError marks errors from flag parsing (already printed by the flag
// package).
type flagError struct{ err error }

func (e flagError) Error() string { return e.err.Error() }

func isFlagError(err error) bool {
	var fe flagError
	return errors.As(err, &fe)
}

// env is one invocation's I/O and global settings.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer

	addr          string
	timeout       time.Duration
	retries       int
	tlsCA         string
	tlsCert       string
	tlsKey        string
	tlsServerName string
	certsDir      string
	token         string
	globalsSet    bool

	// contextName and ctxDefaults: the selected context of the config
	// file (contexts.go), nil when none is.
	contextName string
	ctxDefaults *cliContext
}

// flagSet returns a flag set that also carries the global flags, so that
// they may come before or after the command.
func (e *env) flagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	if !e.globalsSet {
		e.addr = DefaultAddr
		e.timeout = 30 * time.Second
		e.retries = 2
		// Flags win over the environment, which wins over the context,
		// which wins over the defaults.
		e.applyContext()
		if a := os.Getenv("GEOLOG_ADDR"); a != "" {
			e.addr = a
		}
		for _, v := range []struct {
			dst *string
			env string
		}{{&e.certsDir, "GEOLOG_CERTS_DIR"}, {&e.tlsCA, "GEOLOG_TLS_CA"}, {&e.tlsCert, "GEOLOG_TLS_CERT"}, {&e.tlsKey, "GEOLOG_TLS_KEY"}, {&e.tlsServerName, "GEOLOG_TLS_SERVER_NAME"}} {
			if x := os.Getenv(v.env); x != "" {
				*v.dst = x
			}
		}
		// A token is a secret: from the environment or the flag only,
		// never from the context file.
		e.token = os.Getenv("GEOLOG_TOKEN")
		e.globalsSet = true
	}
	fs.StringVar(&e.addr, "addr", e.addr, "node addresses host:port[,host:port...] (env GEOLOG_ADDR)")
	fs.DurationVar(&e.timeout, "timeout", e.timeout, "bound on each admin or read call, its retries included")
	fs.IntVar(&e.retries, "retries", e.retries, "retries of a retriable admin or read call")
	fs.StringVar(&e.tlsCA, "tls-ca", e.tlsCA, "dial with TLS trusting this PEM CA bundle")
	fs.StringVar(&e.tlsCert, "tls-cert", e.tlsCert, "PEM client certificate for mutual TLS")
	fs.StringVar(&e.tlsKey, "tls-key", e.tlsKey, "PEM client key for mutual TLS")
	fs.StringVar(&e.tlsServerName, "tls-server-name", e.tlsServerName, "expected TLS server name")
	fs.StringVar(&e.certsDir, "certs-dir", e.certsDir, "TLS folder: ca.crt, client.crt, client.key (env GEOLOG_CERTS_DIR)")
	fs.StringVar(&e.token, "token", e.token, "bearer token (JWT) sent with every call, over TLS only (env GEOLOG_TOKEN)")
	fs.StringVar(&e.contextName, "context", e.contextName, "use this context of the config file (env GEOLOG_CONTEXT; 'geolog context list')")
	return fs
}

// parse parses args allowing flags and positional arguments in any order
// (the flag package alone stops at the first positional argument).
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, flagError{err}
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// client dials the configured nodes (--addr).
func (e *env) client(opts ...client.Opt) (*client.Client, error) {
	return e.clientFor(e.addr, opts...)
}

// clientFor dials addrs (a comma-separated list) with the global settings.
func (e *env) clientFor(addrs string, opts ...client.Opt) (*client.Client, error) {
	if e.retries < 0 || e.timeout < 0 {
		return nil, usagef("--retries and --timeout must not be negative")
	}
	opts = append([]client.Opt{client.CallTimeout(e.timeout), client.RetriesMax(e.retries)}, opts...)
	cfg, err := e.tlsConfig()
	if err != nil {
		return nil, err
	}
	if cfg != nil {
		opts = append(opts, client.TLSConfig(cfg))
	}
	if e.token != "" {
		if cfg == nil {
			return nil, usagef("--token (GEOLOG_TOKEN) is sent over TLS only: give --certs-dir or --tls-ca")
		}
		opts = append(opts, client.BearerToken(e.token))
	}
	return client.New(addrs, opts...)
}

// tlsHint says what to check about TLS when a node cannot be reached.
func (e *env) tlsHint() string {
	if cfg, err := e.tlsConfig(); err == nil && cfg == nil {
		return "nodes serve TLS unless run with --insecure: give --certs-dir or GEOLOG_CERTS_DIR"
	}
	return "with TLS: do the node and --certs-dir share a CA, and does the node's certificate name the address dialed?"
}

// tlsConfig is the client TLS configuration the global flags ask for, nil
// for plaintext (no --certs-dir and no --tls-* file). Explicit --tls-*
// files win over the folder's.
func (e *env) tlsConfig() (*tls.Config, error) {
	ca, cert, key := e.tlsCA, e.tlsCert, e.tlsKey
	if e.certsDir != "" {
		if ca == "" {
			ca = filepath.Join(e.certsDir, pki.CACertFile)
		}
		if cert == "" && key == "" {
			c, k := filepath.Join(e.certsDir, pki.ClientCertFile), filepath.Join(e.certsDir, pki.ClientKeyFile)
			if _, err := os.Stat(c); err == nil {
				cert, key = c, k
			}
		}
	}
	if ca == "" && cert == "" && key == "" {
		return nil, nil
	}
	if (cert == "") != (key == "") {
		return nil, usagef("--tls-cert and --tls-key go together")
	}
	return pki.ClientConfig(ca, cert, key, e.tlsServerName)
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// version prints this build's version and commit (--json: as JSON).
func (e *env) version(args []string) error {
	fs := e.flagSet("version")
	asJSON := fs.Bool("json", false, "print as JSON")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	info := version.Get()
	if *asJSON {
		return json.NewEncoder(e.stdout).Encode(info)
	}
	fmt.Fprintln(e.stdout, "geolog", info)
	return nil
}
