package chaos

import (
	"bufio"
	"bytes"
	"context"
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
)

// EnvCluster attaches to a running cluster described by an env file in
// scripts/cluster.sh's format (what terraform/local writes too):
//
//	export GEOLOG_ADDR_US=127.0.0.1:7501,127.0.0.1:7502,127.0.0.1:7503   (node i is the i-th)
//	export GEOLOG_WAN_CONTROL=127.0.0.1:7599                              (optional)
//	export GEOLOG_CLUSTER_REGIONS="us eu ap"                               (optional: else every GEOLOG_ADDR_<R>)
//	export GEOLOG_PID_DIR=/path/pids                                       (optional: default <env dir>/pids)
//
// Process faults need the pid files <region>-n<i>.pid (cluster.sh writes
// them); each pid is checked to be a geologd before it is signalled. A
// killed node is restarted with the command line, environment and working
// directory it had, its output appended to <env dir>/<region>-n<i>.log.
// Failpoint faults need nodes started with --debug-addr and
// --debug-failpoints (read from their command lines). Raft links inside a
// region do not pass through the WAN emulator in such a cluster, so
// intra-region partitions are unsupported, as are client links and the
// lease store. Close leaves the cluster running.
type EnvCluster struct {
	dir     string
	pidDir  string
	regions []string
	nodes   []Node
	control string
	caps    Caps

	mu    sync.Mutex
	saved map[NodeRef]*savedProc // command lines of killed nodes
}

type savedProc struct {
	argv []string
	env  []string
	cwd  string
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
	for _, r := range c.regions {
		list := vars["GEOLOG_ADDR_"+strings.ToUpper(r)]
		if list == "" {
			return nil, fmt.Errorf("chaos: %s: no GEOLOG_ADDR_%s", path, strings.ToUpper(r))
		}
		for i, a := range strings.Split(list, ",") {
			n := Node{NodeRef: NodeRef{r, i + 1}, Addr: strings.TrimSpace(a)}
			n.ClientAddr = n.Addr
			if pid, err := c.pid(n.NodeRef); err == nil {
				args := cmdline(pid)
				n.DebugAddr = flagValue(args, "debug-addr")
				if n.DebugAddr == "" || !slices.Contains(args, "--debug-failpoints") {
					c.caps.Failpoints = false
				}
			} else {
				c.caps.Processes, c.caps.Failpoints = false, false
			}
			if !answers(ctx, n.Addr) {
				return nil, fmt.Errorf("chaos: node %s at %s does not answer", n.NodeRef, n.Addr)
			}
			c.nodes = append(c.nodes, n)
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
		if shape.LeaseStore {
			return nil, fmt.Errorf("%w: an attached cluster has no lease store the harness controls", ErrUnsupported)
		}
		if shape.ClientLinks {
			return nil, fmt.Errorf("%w: an attached cluster has no client links", ErrUnsupported)
		}
		return c, nil
	}
}

func (c *EnvCluster) Regions() []string  { return c.regions }
func (c *EnvCluster) Nodes() []Node      { return c.nodes }
func (c *EnvCluster) Caps() Caps         { return c.caps }
func (c *EnvCluster) WANControl() string { return c.control }
func (c *EnvCluster) Close() error       { return nil }

func (c *EnvCluster) StopLeaseStore() error  { return ErrUnsupported }
func (c *EnvCluster) StartLeaseStore() error { return ErrUnsupported }

func (c *EnvCluster) pidPath(n NodeRef) string {
	return filepath.Join(c.pidDir, fmt.Sprintf("%s-n%d.pid", n.Region, n.ID))
}

// pid reads a node's pid file and checks that the process is a live
// geologd (a pid reused by another program is refused).
func (c *EnvCluster) pid(n NodeRef) (int, error) {
	b, err := os.ReadFile(c.pidPath(n))
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("chaos: %s: bad pid %q", c.pidPath(n), b)
	}
	args := cmdline(pid)
	if len(args) == 0 || filepath.Base(args[0]) != "geologd" || processGone(pid) {
		return 0, fmt.Errorf("chaos: pid %d of %s is not a running geologd", pid, n)
	}
	return pid, nil
}

func (c *EnvCluster) signal(n NodeRef, sig syscall.Signal) (int, error) {
	if !c.caps.Processes {
		return 0, ErrUnsupported
	}
	pid, err := c.pid(n)
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
	pid, err := c.pid(n)
	if err != nil {
		return err
	}
	sp := &savedProc{argv: cmdline(pid), env: nulSplit(readProc(pid, "environ"))}
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
	return os.WriteFile(c.pidPath(n), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644)
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
