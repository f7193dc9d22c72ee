package chaos

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/geolog/geolog/pki"
	"github.com/geolog/geolog/wan"
)

// EnvCluster attaches to a running cluster described by an env file in
// scripts/cluster.sh's format (what terraform/local writes too):
//
//	export GEOLOG_ADDR_US=127.0.0.1:7501,127.0.0.1:7502,127.0.0.1:7503   (node i is the i-th)
//	export GEOLOG_WAN_CONTROL=127.0.0.1:7599                              (optional)
//	export GEOLOG_CLUSTER_REGIONS="us eu ap"                               (optional: else every GEOLOG_ADDR_<R>)
//	export GEOLOG_PID_DIR=/path/pids                                       (optional: default <env dir>/pids)
//	export GEOLOG_PG_SCRIPT=/repo/scripts/pg.sh GEOLOG_PG_PORT=7701 GEOLOG_PG_DIR=/path/pg
//	                                                                       (optional: the lease store, terraform/local)
//
// Process faults need the pid files <region>-n<i>.pid, holding "PID" (as
// cluster.sh writes them) or "PID STARTTIME" (terraform/local's proc.sh:
// field 22 of /proc/PID/stat, checked so that a reused pid is never
// signalled); each pid is checked to be a geologd before it is signalled.
// A killed node is restarted with the command line, environment and working
// directory it had, its output appended to <env dir>/<region>-n<i>.log, and
// its pid file rewritten in the format it had (so terraform destroy stops
// the new process). Failpoint faults need nodes started with --debug-addr
// and --debug-failpoints, homing nodes started with --lease-store (its TTL
// is read from --lease-ttl): all read from their command lines.
//
// The harness dials as principal "chaos", not a superuser: when the env
// file's client certificate (GEOLOG_CERTS_DIR) names another principal
// and the CA's key lies beside it (<certs>/../ca/ca.key, as scripts/pki.sh
// lays a PKI out for scripts/cluster.sh and terraform/local), it issues
// itself a "chaos" certificate (<certs>/../chaos/) and grants it
// chaosGrants as the env file's principal (a superuser, "operator");
// without the CA's key it dials as the env file's principal.
//
// Links are found in the WAN emulator's list by name, as LocalCluster and
// terraform/local (chaos_links) name them: Raft links inside a region
// ("us:n1->us:n2") make intra-region partitions possible and name the
// addresses leader hints carry; client links ("client->us:n1") become the
// nodes' client addresses; lease-store links ("us->pg") make a lease-store
// cut possible. The GEOLOG_PG_* variables make a lease-store stop
// possible. Close leaves the cluster running.
type EnvCluster struct {
	dir     string
	pidDir  string
	regions []string
	nodes   []Node
	control string
	caps    Caps

	// pg runs the lease store's script (GEOLOG_PG_*), nil without.
	pg *pgServer
	// tls is the clients' configuration (GEOLOG_CERTS_DIR), nil without.
	tls *tls.Config

	mu    sync.Mutex
	saved map[NodeRef]*savedProc // command lines of killed nodes
}

type savedProc struct {
	argv []string
	env  []string
	cwd  string
	// withStart: the pid file held "PID STARTTIME"; the restart's does too.
	withStart bool
}

// ReadEnvFile parses "export K=V" / "K=V" lines (values may be quoted).
func ReadEnvFile(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	vars := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		line = strings.TrimPrefix(line, "export ")
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		vars[strings.TrimSpace(k)] = v
	}
	return vars, sc.Err()
}

// AttachEnv reads the env file at path and checks that every node answers.
func AttachEnv(ctx context.Context, path string) (*EnvCluster, error) {
	vars, err := ReadEnvFile(path)
	if err != nil {
		return nil, fmt.Errorf("chaos: env file: %w", err)
	}
	c := &EnvCluster{dir: filepath.Dir(absPath(path)), control: vars["GEOLOG_WAN_CONTROL"], saved: map[NodeRef]*savedProc{}}
	c.pidDir = vars["GEOLOG_PID_DIR"]
	if c.pidDir == "" {
		c.pidDir = filepath.Join(c.dir, "pids")
	}
	if rs := strings.Fields(vars["GEOLOG_CLUSTER_REGIONS"]); len(rs) > 0 {
		c.regions = rs
	} else {
		for k := range vars {
			if r, ok := strings.CutPrefix(k, "GEOLOG_ADDR_"); ok && r != "ALL" {
				c.regions = append(c.regions, strings.ToLower(r))
			}
		}
		slices.Sort(c.regions)
	}
	if len(c.regions) == 0 {
		return nil, fmt.Errorf("chaos: %s names no GEOLOG_ADDR_<REGION>", path)
	}
	c.caps = Caps{Processes: true, WAN: c.control != "", Failpoints: true}
	if dir := vars["GEOLOG_CERTS_DIR"]; dir != "" {
		// The cluster serves TLS: dial with its client certificate.
		cfg, err := pki.ClientConfig(filepath.Join(dir, pki.CACertFile), filepath.Join(dir, pki.ClientCertFile), filepath.Join(dir, pki.ClientKeyFile), "")
		if err != nil {
			return nil, fmt.Errorf("chaos: %s: GEOLOG_CERTS_DIR: %w", path, err)
		}
		c.tls = cfg
	}
	if script := vars["GEOLOG_PG_SCRIPT"]; script != "" && vars["GEOLOG_PG_DIR"] != "" {
		port, err := strconv.Atoi(vars["GEOLOG_PG_PORT"])
		if err != nil {
			return nil, fmt.Errorf("chaos: %s: GEOLOG_PG_PORT=%q", path, vars["GEOLOG_PG_PORT"])
		}
		c.pg = &pgServer{script: script, dir: vars["GEOLOG_PG_DIR"], port: port}
		c.caps.LeaseStore = true
	}
	var links []wan.LinkStatus
	if c.control != "" {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		all, err := newWANClient(c.control).Links(cctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("chaos: %s: the WAN emulator: %w", path, err)
		}
		links = all
	}
	homing, ttls := 0, map[time.Duration]bool{}
	for _, r := range c.regions {
		list := vars["GEOLOG_ADDR_"+strings.ToUpper(r)]
		if list == "" {
			return nil, fmt.Errorf("chaos: %s: no GEOLOG_ADDR_%s", path, strings.ToUpper(r))
		}
		for i, a := range strings.Split(list, ",") {
			n := Node{NodeRef: NodeRef{r, i + 1}, Addr: strings.TrimSpace(a)}
			n.ClientAddr = n.Addr
			for _, l := range links {
				e := endsOf(l)
				switch {
				case len(e.to) == 1 && e.to[0] == n.NodeRef.String() && e.from[0] == "client":
					n.ClientAddr = l.Listen
					c.caps.ClientLinks = true
				case len(e.to) == 1 && e.to[0] == n.NodeRef.String() && strings.HasPrefix(e.from[0], r+":"):
					c.caps.IntraRegionLinks = true
				}
			}
			if pid, _, err := c.pid(n.NodeRef); err == nil {
				args := cmdline(pid)
				n.DebugAddr = flagValue(args, "debug-addr")
				if n.DebugAddr == "" || !slices.Contains(args, "--debug-failpoints") {
					c.caps.Failpoints = false
				}
				if flagValue(args, "lease-store") != "" {
					homing++
					ttl, err := time.ParseDuration(flagValue(args, "lease-ttl"))
					if err != nil {
						ttl = 5 * time.Second // geologd's default
					}
					ttls[ttl] = true
				}
			} else {
				c.caps.Processes, c.caps.Failpoints = false, false
			}
			if !answers(ctx, n.Addr, c.tls) {
				return nil, fmt.Errorf("chaos: node %s at %s does not answer", n.NodeRef, n.Addr)
			}
			c.nodes = append(c.nodes, n)
		}
	}
	// Homing: every node runs with a lease store, all with one TTL (the
	// checks read it).
	if homing == len(c.nodes) && len(ttls) == 1 {
		for ttl := range ttls {
			c.caps.LeaseTTL = ttl
		}
	}
	if c.tls != nil {
		if c.tls, err = asChaosPrincipal(ctx, vars["GEOLOG_CERTS_DIR"], c.tls, c.nodes[0].Addr); err != nil {
			return nil, fmt.Errorf("chaos: %s: %w", path, err)
		}
	}
	return c, nil
}

// EnvFactory attaches to the cluster of the env file at path once and
// runs every scenario on it (each on its own stream); a scenario must use
// regions the cluster has.
func EnvFactory(path string) ClusterFactory {
	var (
		once sync.Once
		c    *EnvCluster
		err  error
	)
	return func(ctx context.Context, name string, shape Shape) (Cluster, error) {
		once.Do(func() { c, err = AttachEnv(ctx, path) })
		if err != nil {
			return nil, err
		}
		for _, r := range shape.Regions {
			if !slices.Contains(c.regions, r) {
				return nil, fmt.Errorf("%w: the scenario needs region %s; the cluster has %v", ErrUnsupported, r, c.regions)
			}
		}
		if shape.LeaseStore && c.caps.LeaseTTL == 0 {
			return nil, fmt.Errorf("%w: the attached cluster's nodes do not all run with --lease-store (and one --lease-ttl)", ErrUnsupported)
		}
		if shape.ClientLinks && !c.caps.ClientLinks {
			return nil, fmt.Errorf("%w: the attached cluster has no client links", ErrUnsupported)
		}
		return c, nil
	}
}

func (c *EnvCluster) Regions() []string      { return c.regions }
func (c *EnvCluster) Nodes() []Node          { return c.nodes }
func (c *EnvCluster) Caps() Caps             { return c.caps }
func (c *EnvCluster) ClientTLS() *tls.Config { return c.tls }
func (c *EnvCluster) WANControl() string     { return c.control }
func (c *EnvCluster) Close() error           { return nil }

func (c *EnvCluster) StopLeaseStore() error {
	if c.pg == nil {
		return ErrUnsupported
	}
	return c.pg.run(context.Background(), "stop")
}

func (c *EnvCluster) StartLeaseStore() error {
	if c.pg == nil {
		return ErrUnsupported
	}
	return c.pg.run(context.Background(), "start")
}

func (c *EnvCluster) pidPath(n NodeRef) string {
	return filepath.Join(c.pidDir, fmt.Sprintf("%s-n%d.pid", n.Region, n.ID))
}

// pid reads a node's pid file ("PID" or "PID STARTTIME") and checks that
// the process is a live geologd (a pid reused by another program is
// refused); withStart says which format the file has.
func (c *EnvCluster) pid(n NodeRef) (pid int, withStart bool, err error) {
	b, err := os.ReadFile(c.pidPath(n))
	if err != nil {
		return 0, false, fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 || len(fields) > 2 {
		return 0, false, fmt.Errorf("chaos: %s: bad pid file %q", c.pidPath(n), b)
	}
	pid, err = strconv.Atoi(fields[0])
	if err != nil || pid <= 1 {
		return 0, false, fmt.Errorf("chaos: %s: bad pid %q", c.pidPath(n), b)
	}
	if len(fields) == 2 && fields[1] != startTime(pid) {
		return 0, false, fmt.Errorf("chaos: pid %d of %s started at %s, not %s: another process", pid, n, startTime(pid), fields[1])
	}
	args := cmdline(pid)
	if len(args) == 0 || filepath.Base(args[0]) != "geologd" || processGone(pid) {
		return 0, false, fmt.Errorf("chaos: pid %d of %s is not a running geologd", pid, n)
	}
	return pid, len(fields) == 2, nil
}

// startTime is field 22 of /proc/pid/stat (clock ticks after boot), "" if
// the process is gone.
func startTime(pid int) string {
	stat := string(readProc(pid, "stat"))
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return ""
	}
	// Fields after the command: state is field 3, start time field 22.
	f := strings.Fields(stat[i+1:])
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

func (c *EnvCluster) signal(n NodeRef, sig syscall.Signal) (int, error) {
	if !c.caps.Processes {
		return 0, ErrUnsupported
	}
	pid, _, err := c.pid(n)
	if err != nil {
		return 0, err
	}
	return pid, syscall.Kill(pid, sig)
}

func (c *EnvCluster) Pause(n NodeRef) error  { _, err := c.signal(n, syscall.SIGSTOP); return err }
func (c *EnvCluster) Resume(n NodeRef) error { _, err := c.signal(n, syscall.SIGCONT); return err }

// Kill saves the node's command line, SIGKILLs it and waits until it is
// gone (it is not our child: a zombie awaiting its parent counts as gone).
func (c *EnvCluster) Kill(n NodeRef) error {
	if !c.caps.Processes {
		return ErrUnsupported
	}
	pid, withStart, err := c.pid(n)
	if err != nil {
		return err
	}
	sp := &savedProc{argv: cmdline(pid), env: nulSplit(readProc(pid, "environ")), withStart: withStart}
	sp.cwd, _ = os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	c.mu.Lock()
	c.saved[n] = sp
	c.mu.Unlock()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return err
	}
	return waitFor(context.Background(), 30*time.Second, func() bool { return processGone(pid) })
}

// Restart starts a node killed by Kill again, as it ran.
func (c *EnvCluster) Restart(n NodeRef) error {
	c.mu.Lock()
	sp := c.saved[n]
	delete(c.saved, n)
	c.mu.Unlock()
	if sp == nil || len(sp.argv) == 0 {
		return fmt.Errorf("chaos: %s was not killed by the harness; nothing to restart", n)
	}
	log, err := os.OpenFile(filepath.Join(c.dir, fmt.Sprintf("%s-n%d.log", n.Region, n.ID)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(sp.argv[0], sp.argv[1:]...)
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = sp.env, sp.cwd, log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("chaos: restart %s: %w", n, err)
	}
	go func() { _ = cmd.Wait() }() // reap it if it dies while we run
	line := strconv.Itoa(cmd.Process.Pid)
	if sp.withStart {
		line += " " + startTime(cmd.Process.Pid)
	}
	return os.WriteFile(c.pidPath(n), []byte(line+"\n"), 0o644)
}

func readProc(pid int, file string) []byte {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file))
	return b
}

func nulSplit(b []byte) []string {
	var out []string
	for _, s := range bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0}) {
		if len(s) > 0 {
			out = append(out, string(s))
		}
	}
	return out
}

func cmdline(pid int) []string { return nulSplit(readProc(pid, "cmdline")) }

// processGone reports whether pid has exited (a zombie has).
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	stat := string(readProc(pid, "stat"))
	if i := strings.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] == 'Z'
	}
	return stat == ""
}

// flagValue finds --name value or --name=value in args.
func flagValue(args []string, name string) string {
	for i, a := range args {
		switch {
		case a == "--"+name || a == "-"+name:
			if i+1 < len(args) {
				return args[i+1]
			}
		case strings.HasPrefix(a, "--"+name+"="):
			return strings.TrimPrefix(a, "--"+name+"=")
		}
	}
	return ""
}
