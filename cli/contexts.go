package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/geolog/geolog/vfs"
)

// A context is a named set of global settings (addresses, TLS files, time
// bounds), kept in the config file so that a command needs none of the
// flags: like `nats context` or `rpk profile`. Flags win over environment
// variables, which win over the context, which wins over the defaults.
type cliContext struct {
	Addr          string `toml:"addr,omitempty" json:"addr,omitempty"`
	CertsDir      string `toml:"certs_dir,omitempty" json:"certs_dir,omitempty"`
	TLSCA         string `toml:"tls_ca,omitempty" json:"tls_ca,omitempty"`
	TLSCert       string `toml:"tls_cert,omitempty" json:"tls_cert,omitempty"`
	TLSKey        string `toml:"tls_key,omitempty" json:"tls_key,omitempty"`
	TLSServerName string `toml:"tls_server_name,omitempty" json:"tls_server_name,omitempty"`
	Timeout       string `toml:"timeout,omitempty" json:"timeout,omitempty"`
	Retries       *int   `toml:"retries,omitempty" json:"retries,omitempty"`
	Description   string `toml:"description,omitempty" json:"description,omitempty"`
}

// configFile is the config file's content.
type configFile struct {
	// Current is the context used when neither --context nor
	// GEOLOG_CONTEXT names one.
	Current  string                `toml:"current,omitempty"`
	Contexts map[string]cliContext `toml:"contexts"`
}

// configBytesMax bounds the config file read.
const configBytesMax = 1 << 20

var contextNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// configPath is the config file: $GEOLOG_CONFIG, else
// $XDG_CONFIG_HOME/geolog/config.toml, else ~/.config/geolog/config.toml.
func configPath() (string, error) {
	if p := os.Getenv("GEOLOG_CONFIG"); p != "" {
		return p, nil
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("no config folder: %w (set GEOLOG_CONFIG)", err)
	}
	return filepath.Join(dir, "geolog", "config.toml"), nil
}

// loadConfig reads the config file; a missing file is an empty config.
func loadConfig() (configFile, string, error) {
	path, err := configPath()
	if err != nil {
		return configFile{}, "", err
	}
	data, err := vfs.ReadFile(vfs.OS(), path, configBytesMax)
	if errors.Is(err, fs.ErrNotExist) {
		return configFile{Contexts: map[string]cliContext{}}, path, nil
	}
	if err != nil {
		return configFile{}, path, fmt.Errorf("config %s: %w", path, err)
	}
	var cf configFile
	md, err := toml.Decode(string(data), &cf)
	if err != nil {
		return configFile{}, path, fmt.Errorf("config %s: %w", path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return configFile{}, path, fmt.Errorf("config %s: unknown setting %q", path, und[0].String())
	}
	if cf.Contexts == nil {
		cf.Contexts = map[string]cliContext{}
	}
	for name, c := range cf.Contexts {
		if err := c.check(name); err != nil {
			return configFile{}, path, fmt.Errorf("config %s: %w", path, err)
		}
	}
	return cf, path, nil
}

func (c cliContext) check(name string) error {
	if !contextNameRE.MatchString(name) {
		return fmt.Errorf("context name %q: use letters, digits, '.', '_' or '-' (at most 64)", name)
	}
	if c.Timeout != "" {
		if d, err := time.ParseDuration(c.Timeout); err != nil || d < 0 {
			return fmt.Errorf("context %s: timeout %q is not a duration such as 10s", name, c.Timeout)
		}
	}
	if c.Retries != nil && *c.Retries < 0 {
		return fmt.Errorf("context %s: retries must not be negative", name)
	}
	return nil
}

func saveConfig(path string, cf configFile) error {
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(cf); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	// 0600: a context names key files.
	return vfs.WriteFileAtomic(vfs.OS(), path, buf.Bytes(), 0o600)
}

// contextFlag finds --context NAME (or --context=NAME) among the arguments:
// the context must be known before the other flags get their defaults.
func contextFlag(args []string) (string, bool) {
	for i, a := range args {
		if a == "--" {
			break
		}
		if a == "--context" || a == "-context" {
			if i+1 < len(args) {
				return args[i+1], true
			}
			return "", true
		}
		if v, ok := strings.CutPrefix(a, "--context="); ok {
			return v, true
		}
		if v, ok := strings.CutPrefix(a, "-context="); ok {
			return v, true
		}
	}
	return "", false
}

// selectContext loads the context the invocation asks for (--context,
// GEOLOG_CONTEXT, the file's current one) into e's defaults.
func (e *env) selectContext(args []string) error {
	name, set := contextFlag(args)
	if !set {
		name = os.Getenv("GEOLOG_CONTEXT")
	}
	cf, path, err := loadConfig()
	if err != nil {
		if name == "" && !set {
			// A broken file must not stop commands that do not use it;
			// say so once.
			fmt.Fprintf(e.stderr, "geolog: ignoring the config file: %v\n", err)
			return nil
		}
		return err
	}
	if name == "" {
		name = cf.Current
	}
	if name == "" {
		return nil
	}
	c, ok := cf.Contexts[name]
	if !ok {
		return usagef("no context %q in %s ('geolog context list' shows them)", name, path)
	}
	e.contextName, e.ctxDefaults = name, &c
	return nil
}

// applyContext sets the global settings' defaults from the selected context.
func (e *env) applyContext() {
	c := e.ctxDefaults
	if c == nil {
		return
	}
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	set(&e.addr, c.Addr)
	set(&e.certsDir, c.CertsDir)
	set(&e.tlsCA, c.TLSCA)
	set(&e.tlsCert, c.TLSCert)
	set(&e.tlsKey, c.TLSKey)
	set(&e.tlsServerName, c.TLSServerName)
	if d, err := time.ParseDuration(c.Timeout); err == nil && c.Timeout != "" {
		e.timeout = d
	}
	if c.Retries != nil {
		e.retries = *c.Retries
	}
}

const contextUsage = `usage:
  context list [--json]
  context show [NAME] [--json]
  context use NAME
  context add NAME [--addr A] [--certs-dir D] [--tls-ca F] [--tls-cert F] [--tls-key F]
                   [--tls-server-name S] [--timeout D] [--retries N] [--description T] [--use]
  context remove NAME`

// contextCmd runs the context subcommands.
func (e *env) contextCmd(_ context.Context, args []string) error {
	if len(args) == 0 {
		return usagef("%s", contextUsage)
	}
	cf, path, err := loadConfig()
	if err != nil {
		return err
	}
	sub, args := args[0], args[1:]
	switch sub {
	case "list", "show":
		fs := e.flagSet("context " + sub)
		asJSON := fs.Bool("json", false, "print as JSON")
		pos, err := parse(fs, args)
		if err != nil {
			return err
		}
		if sub == "show" {
			name := cf.Current
			if len(pos) == 1 {
				name = pos[0]
			} else if len(pos) > 1 {
				return usagef("usage: context show [NAME] [--json]")
			}
			c, ok := cf.Contexts[name]
			if !ok {
				return usagef("no context %q in %s", name, path)
			}
			if *asJSON {
				return json.NewEncoder(e.stdout).Encode(c)
			}
			return toml.NewEncoder(e.stdout).Encode(map[string]cliContext{name: c})
		}
		names := make([]string, 0, len(cf.Contexts))
		for n := range cf.Contexts {
			names = append(names, n)
		}
		sort.Strings(names)
		if *asJSON {
			type row struct {
				Name    string `json:"name"`
				Current bool   `json:"current"`
				cliContext
			}
			rows := []row{}
			for _, n := range names {
				rows = append(rows, row{n, n == cf.Current, cf.Contexts[n]})
			}
			return json.NewEncoder(e.stdout).Encode(rows)
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CURRENT\tNAME\tADDR\tTLS\tDESCRIPTION")
		for _, n := range names {
			c := cf.Contexts[n]
			cur, tls := "", "plaintext"
			if n == cf.Current {
				cur = "*"
			}
			if c.CertsDir != "" || c.TLSCA != "" {
				tls = "tls"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", cur, n, c.Addr, tls, c.Description)
		}
		return tw.Flush()
	case "use":
		if len(args) != 1 {
			return usagef("usage: context use NAME")
		}
		if _, ok := cf.Contexts[args[0]]; !ok {
			return usagef("no context %q in %s", args[0], path)
		}
		cf.Current = args[0]
		if err := saveConfig(path, cf); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "using context %s\n", args[0])
		return nil
	case "add":
		return e.contextAdd(cf, path, args)
	case "remove":
		if len(args) != 1 {
			return usagef("usage: context remove NAME")
		}
		if _, ok := cf.Contexts[args[0]]; !ok {
			return usagef("no context %q in %s", args[0], path)
		}
		delete(cf.Contexts, args[0])
		if cf.Current == args[0] {
			cf.Current = ""
		}
		if err := saveConfig(path, cf); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "removed context %s\n", args[0])
		return nil
	}
	return usagef("unknown context subcommand %q (want list, show, use, add or remove)\n%s", sub, contextUsage)
}

// contextAdd adds or replaces a context. Its settings are its own flags
// (not the global ones, which say how this invocation dials).
func (e *env) contextAdd(cf configFile, path string, args []string) error {
	var c cliContext
	retries := -1
	// The context's settings reuse the global flags' names: parse them into
	// a scratch env so that this invocation's own settings stay apart.
	scratch := &env{stdin: e.stdin, stdout: e.stdout, stderr: e.stderr, globalsSet: true, retries: -1}
	sfs := scratch.flagSet("context add")
	desc := sfs.String("description", "", "what the context is for")
	use := sfs.Bool("use", false, "make it the current context")
	pos, err := parse(sfs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("%s", contextUsage)
	}
	name := pos[0]
	visited := map[string]bool{}
	sfs.Visit(func(f *flag.Flag) { visited[f.Name] = true })
	c = cliContext{Description: *desc}
	if visited["addr"] {
		for _, a := range strings.Split(scratch.addr, ",") {
			if _, _, err := net.SplitHostPort(strings.TrimSpace(a)); err != nil {
				return usagef("--addr %q: want host:port[,host:port...]", scratch.addr)
			}
		}
		c.Addr = scratch.addr
	}
	c.CertsDir, c.TLSCA, c.TLSCert, c.TLSKey, c.TLSServerName = scratch.certsDir, scratch.tlsCA, scratch.tlsCert, scratch.tlsKey, scratch.tlsServerName
	if visited["timeout"] {
		c.Timeout = scratch.timeout.String()
	}
	if visited["retries"] {
		retries = scratch.retries
		c.Retries = &retries
	}
	for _, p := range []*string{&c.CertsDir, &c.TLSCA, &c.TLSCert, &c.TLSKey} {
		if *p != "" {
			abs, err := filepath.Abs(*p)
			if err != nil {
				return err
			}
			*p = abs
		}
	}
	if err := c.check(name); err != nil {
		return usagef("%v", err)
	}
	_, existed := cf.Contexts[name]
	cf.Contexts[name] = c
	if *use || cf.Current == "" {
		cf.Current = name
	}
	if err := saveConfig(path, cf); err != nil {
		return err
	}
	verb := "added"
	if existed {
		verb = "replaced"
	}
	fmt.Fprintf(e.stdout, "%s context %s in %s\n", verb, name, path)
	return nil
}
