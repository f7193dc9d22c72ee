package chaos

import (
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/geolog/geolog/internal/portlock"
	"github.com/geolog/geolog/pki"
	"github.com/hashicorp/go-hclog"
)

// LocalConfig configures LocalCluster.
type LocalConfig struct {
	// BinDir holds geologd and geolog-wan (make build's bin/). Required.
	BinDir string
	// Dir is where each cluster lives (Dir/<scenario>: data, logs, env,
	// pids); a scenario's folder is wiped when its cluster starts.
	// Required.
	Dir string
	// PortMin and PortMax bound the loopback ports used, default
	// portlock.DefaultRange() (above the kernel's ephemeral range). Ports
	// are held through portlock while the cluster lives: two clusters, of
	// one run or of two, never share one, and busy ones are skipped. A
	// 3×3 cluster with every link takes 55.
	PortMin, PortMax int
	// GOMAXPROCS of each node, default 1 (as scripts/cluster.sh: nine
	// runtimes share the machine's cores).
	GOMAXPROCS int
	// LogLevel of the nodes, default "info".
	LogLevel string
	// PGScript is scripts/pg.sh, for shapes with a lease store; PGPort its
	// port, default a free one of the cluster's range (held like the
	// others).
	PGScript string
	PGPort   int
	// Logger hears the cluster's life, default null.
	Logger hclog.Logger
	// Insecure runs the nodes with --insecure. By default every node
	// serves and dials with TLS, its certificate from a development PKI
	// the harness makes under Dir/certs, and the harness's clients dial
	// with a client certificate of it (principal "chaos", which holds
	// only the access rules grantChaos adds, run as the superuser
	// "operator"; see docs/authz.md).
	Insecure bool
	// NoAtRest runs the nodes without encryption at rest. By default each
	// node runs with --kek-file, a KEK file of its own under Dir/keks (off
	// its data directory, mode 0600).
	NoAtRest bool
}

func (c *LocalConfig) setDefaults() error {
	if c.BinDir == "" || c.Dir == "" {
		return fmt.Errorf("chaos: LocalConfig needs BinDir and Dir")
	}
	if c.PortMin == 0 && c.PortMax == 0 {
		r, err := portlock.DefaultRange()
		if err != nil {
			return fmt.Errorf("chaos: %w", err)
		}
		c.PortMin, c.PortMax = r.Min, r.Max
	}
	if c.PortMin < 1024 || c.PortMax > 65535 || c.PortMin > c.PortMax {
		return fmt.Errorf("chaos: ports %d-%d: want a range within 1024-65535", c.PortMin, c.PortMax)
	}
	if c.GOMAXPROCS <= 0 {
		c.GOMAXPROCS = 1
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	c.BinDir, c.Dir = absPath(c.BinDir), absPath(c.Dir)
	return nil
}

// LocalFactory starts a fresh LocalCluster of each scenario's shape under
// cfg.Dir/<scenario>.
func LocalFactory(cfg LocalConfig) ClusterFactory {
	return func(ctx context.Context, name string, shape Shape) (Cluster, error) {
		c := cfg
		c.Dir = filepath.Join(cfg.Dir, name)
		return StartLocal(ctx, c, shape)
	}
}

// LocalCluster is a cluster of geologd processes and one geolog-wan on
// loopback, started and owned by the harness. Every byte between nodes
// crosses the WAN emulator:
//
//   - between regions, as scripts/cluster.sh: link "<f>-><t>.n<i>" per
//     pair of regions and node of the destination, with the shape's
//     latency;
//   - inside a region (the choice made for Raft-link faults): link
//     "<r>:n<i>-><r>:n<j>" per ordered pair of nodes, no added latency;
//     each node's --peers lists itself at its own address and every peer
//     at its link to that peer, so the links i→j and j→i carry the
//     messages each side sends (raftnet dials per direction) and cutting
//     both partitions the pair while clients still reach both nodes;
//   - with Shape.ClientLinks, SDK clients reach node n through
//     "client-><r>:n<i>", which the reply-dropping fault resets.
//
// Each node advertises its client address (geologd --advertise-addr: its
// client link, or its own address), so every leader and home hint a
// client gets names a node's client address: no client traffic rides a
// Raft or WAN link, and the harness's clients need no address mapping. It
// writes an env
// file (Dir/env, scripts/cluster.sh's variables) and pid files (Dir/pids),
// so EnvCluster can attach to it as to cluster.sh's cluster.
type LocalCluster struct {
	cfg     LocalConfig
	shape   Shape
	regions []string
	nodes   []Node
	procs   map[NodeRef]*proc
	tls     *tls.Config // the clients' (principal "chaos"); nil with Insecure
	opTLS   *tls.Config // the superuser's ("operator"), for the grants; nil with Insecure
	wan     *proc
	control string
	pg      *pgServer
	ports   *portAllocator

	mu     sync.Mutex
	closed bool
	// joinArgs are the flags a joining node shares with the region's
	// others, per region (all but the per-node ones); joined counts the
	// spare nodes started per region.
	joinArgs map[string][]string
	joined   map[string]int
}

// StartLocal starts a cluster of shape and waits until every node answers.
func StartLocal(ctx context.Context, cfg LocalConfig, shape Shape) (_ *LocalCluster, err error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	shape.setDefaults()
	for _, bin := range []string{"geologd", "geolog-wan"} {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, bin)); err != nil {
			return nil, fmt.Errorf("chaos: %s: %w (make build)", bin, err)
		}
	}
	if err := os.RemoveAll(cfg.Dir); err != nil {
		return nil, err
	}
	for _, d := range []string{"data", "pids"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	c := &LocalCluster{cfg: cfg, shape: shape, regions: shape.Regions, procs: map[NodeRef]*proc{},
		joinArgs: map[string][]string{}, joined: map[string]int{},
		ports: &portAllocator{r: portlock.Range{Min: cfg.PortMin, Max: cfg.PortMax}}}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if !cfg.Insecure {
		if c.tls, c.opTLS, err = makePKI(filepath.Join(cfg.Dir, "certs"), shape); err != nil {
			return nil, err
		}
	}

	ports := c.ports
	type plan struct {
		addr, debug string
		peers       map[int]string      // id → address this node dials
		remote      map[string][]string // region → this node's links to its nodes
	}
	plans := map[NodeRef]*plan{}
	var refs []NodeRef
	for _, r := range shape.Regions {
		for i := 1; i <= shape.NodesPerRegion; i++ {
			ref := NodeRef{r, i}
			refs = append(refs, ref)
			p := &plan{peers: map[int]string{}, remote: map[string][]string{}}
			if p.addr, err = ports.addr(); err != nil {
				return nil, err
			}
			if p.debug, err = ports.addr(); err != nil {
				return nil, err
			}
			plans[ref] = p
		}
	}
	if c.control, err = ports.addr(); err != nil {
		return nil, err
	}
	var links []string
	clientAddr := map[NodeRef]string{}
	link := func(name, upstream string, latency, jitter time.Duration) (string, error) {
		listen, err := ports.addr()
		if err != nil {
			return "", err
		}
		links = append(links, "--link", fmt.Sprintf("%s,%s,%s,%s,%s", name, listen, upstream, latency, jitter))
		return listen, nil
	}
	for _, from := range refs {
		for _, to := range refs {
			switch {
			case from == to:
				plans[from].peers[from.ID] = plans[from].addr
			case from.Region == to.Region:
				l, err := link(from.String()+"->"+to.String(), plans[to].addr, 0, 0)
				if err != nil {
					return nil, err
				}
				plans[from].peers[to.ID] = l
			}
		}
	}
	for _, f := range shape.Regions {
		for _, to := range refs {
			if to.Region == f {
				continue
			}
			l, err := link(fmt.Sprintf("%s->%s.n%d", f, to.Region, to.ID), plans[to].addr, shape.WANLatency.Std(), shape.WANJitter.Std())
			if err != nil {
				return nil, err
			}
			for _, from := range refs {
				if from.Region == f {
					plans[from].remote[to.Region] = append(plans[from].remote[to.Region], l)
				}
			}
		}
	}
	for _, ref := range refs {
		clientAddr[ref] = plans[ref].addr
		if shape.ClientLinks {
			l, err := link("client->"+ref.String(), plans[ref].addr, shape.ClientLatency.Std(), 0)
			if err != nil {
				return nil, err
			}
			clientAddr[ref] = l
		}
	}
	leaseStoreURL := map[string]string{}
	if shape.LeaseStore {
		if c.pg, err = startPG(ctx, cfg, ports); err != nil {
			return nil, err
		}
		for _, r := range shape.Regions {
			l, err := link(r+"->pg", fmt.Sprintf("127.0.0.1:%d", c.pg.port), 0, 0)
			if err != nil {
				return nil, err
			}
			leaseStoreURL[r] = fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=verify-full&sslrootcert=%s", l,
				url.QueryEscape(filepath.Join(c.pg.dir, "tls", "ca.crt")))
		}
	}

	wanArgs := append([]string{"--control", c.control, "--seed", "1", "--log-level", "warn"}, links...)
	c.wan = &proc{name: "wan", bin: filepath.Join(cfg.BinDir, "geolog-wan"), args: wanArgs,
		logPath: filepath.Join(cfg.Dir, "wan.log"), pidPath: filepath.Join(cfg.Dir, "pids", "wan.pid")}
	if err := c.wan.start(); err != nil {
		return nil, err
	}
	if err := waitFor(ctx, 10*time.Second, func() bool { return httpOK("http://" + c.control + "/healthz") }); err != nil {
		return nil, fmt.Errorf("chaos: geolog-wan did not come up (%s): %w", c.wan.logPath, err)
	}

	for _, ref := range refs {
		p := plans[ref]
		var peers []string
		for i := 1; i <= shape.NodesPerRegion; i++ {
			peers = append(peers, fmt.Sprintf("%d=%s", i, p.peers[i]))
		}
		args := []string{
			"--data-dir", filepath.Join(cfg.Dir, "data", ref.Region+"-n"+strconv.Itoa(ref.ID)),
			"--listen", p.addr, "--advertise-addr", clientAddr[ref], "--region", ref.Region, "--node-id", strconv.Itoa(ref.ID),
			"--peers", strings.Join(peers, ","), "--fsync", "always",
			"--debug-addr", p.debug, "--debug-failpoints", "--log-level", cfg.LogLevel,
		}
		if c.tls == nil {
			args = append(args, "--insecure")
		} else {
			args = append(args, "--certs-dir", filepath.Join(cfg.Dir, "certs", ref.Region+"-n"+strconv.Itoa(ref.ID)),
				"--superusers", operatorPrincipal)
		}
		if !cfg.NoAtRest {
			kek, err := makeKEK(cfg.Dir, ref)
			if err != nil {
				return nil, err
			}
			args = append(args, "--kek-file", kek)
		}
		shared := len(args)
		for _, r := range shape.Regions {
			if r != ref.Region {
				args = append(args, "--region-addrs", r+"="+strings.Join(p.remote[r], ","))
			}
		}
		if shape.LeaseStore {
			args = append(args, "--lease-store", leaseStoreURL[ref.Region], "--lease-ttl", shape.LeaseTTL.Std().String(),
				"--lease-heartbeat", max(shape.LeaseTTL.Std()/3, 100*time.Millisecond).String(),
				"--max-clock-offset", shape.MaxClockOffset.Std().String())
		}
		for _, f := range shape.NodeFlags {
			args = append(args, strings.ReplaceAll(f, "{lease-store}", leaseStoreURL[ref.Region]))
		}
		if ref.ID == 1 {
			c.joinArgs[ref.Region] = slices.Clone(args[shared:])
		}
		name := ref.Region + "-n" + strconv.Itoa(ref.ID)
		c.procs[ref] = &proc{name: name, bin: filepath.Join(cfg.BinDir, "geologd"), args: args,
			env:     []string{"GOMAXPROCS=" + strconv.Itoa(cfg.GOMAXPROCS)},
			logPath: filepath.Join(cfg.Dir, name+".log"), pidPath: filepath.Join(cfg.Dir, "pids", name+".pid")}
		if err := c.procs[ref].start(); err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, Node{NodeRef: ref, Addr: p.addr, ClientAddr: clientAddr[ref], DebugAddr: p.debug})
	}
	for _, n := range c.nodes {
		pr := c.procs[n.NodeRef]
		err := waitFor(ctx, 60*time.Second, func() bool { return pr.running() && answers(ctx, n.Addr, c.opTLS) })
		if err != nil || !pr.running() {
			return nil, fmt.Errorf("chaos: %s did not come up (%s): %v", n.NodeRef, pr.logPath, err)
		}
	}
	if c.opTLS != nil {
		if err := grantChaos(ctx, c.nodes[0].Addr, c.opTLS); err != nil {
			return nil, err
		}
	}
	if err := c.writeEnv(); err != nil {
		return nil, err
	}
	cfg.Logger.Info("cluster up", "dir", cfg.Dir, "regions", shape.Regions, "nodes_per_region", shape.NodesPerRegion, "wan_control", c.control)
	return c, nil
}

// writeEnv writes Dir/env in scripts/cluster.sh's format.
func (c *LocalCluster) writeEnv() error {
	var b strings.Builder
	b.WriteString("# written by the chaos harness (chaos.LocalCluster); same variables as scripts/cluster.sh\n")
	var all []string
	for _, r := range c.regions {
		var addrs []string
		for _, n := range regionNodes(c, r) {
			addrs = append(addrs, n.Addr)
		}
		all = append(all, addrs...)
		fmt.Fprintf(&b, "export GEOLOG_ADDR_%s=%s\n", strings.ToUpper(r), strings.Join(addrs, ","))
	}
	fmt.Fprintf(&b, "export GEOLOG_ADDR_ALL=%s\nexport GEOLOG_WAN_CONTROL=%s\nexport GEOLOG_CLUSTER_REGIONS=%q\n",
		strings.Join(all, ","), c.control, strings.Join(c.regions, " "))
	if c.tls != nil {
		fmt.Fprintf(&b, "export GEOLOG_CERTS_DIR=%s\n", filepath.Join(c.cfg.Dir, "certs", "client"))
	}
	return os.WriteFile(filepath.Join(c.cfg.Dir, "env"), []byte(b.String()), 0o644)
}

func (c *LocalCluster) Regions() []string      { return c.regions }
func (c *LocalCluster) ClientTLS() *tls.Config { return c.tls }

// OperatorTLS is the superuser's TLS configuration (principal
// "operator"), nil when the nodes run --insecure: the injector changes
// node membership (drain, decommission) as the operator would.
func (c *LocalCluster) OperatorTLS() *tls.Config { return c.opTLS }
func (c *LocalCluster) Nodes() []Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.nodes)
}
func (c *LocalCluster) WANControl() string { return c.control }

// Dir is the cluster's folder (data, logs, env, pids).
func (c *LocalCluster) Dir() string { return c.cfg.Dir }

func (c *LocalCluster) Caps() Caps {
	caps := Caps{Processes: true, WAN: true, IntraRegionLinks: c.shape.NodesPerRegion > 1, ClientLinks: c.shape.ClientLinks,
		Failpoints: true, LeaseStore: c.pg != nil}
	if c.pg != nil {
		caps.LeaseTTL = c.shape.LeaseTTL.Std()
	}
	return caps
}

func (c *LocalCluster) proc(n NodeRef) (*proc, error) {
	c.mu.Lock()
	p, ok := c.procs[n]
	c.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("chaos: no node %s", n)
	}
	return p, nil
}

func (c *LocalCluster) Kill(n NodeRef) error {
	p, err := c.proc(n)
	if err != nil {
		return err
	}
	return p.kill()
}

func (c *LocalCluster) Restart(n NodeRef) error {
	p, err := c.proc(n)
	if err != nil {
		return err
	}
	return p.start()
}

func (c *LocalCluster) Pause(n NodeRef) error {
	p, err := c.proc(n)
	if err != nil {
		return err
	}
	return p.signal(sigStop, 0)
}

func (c *LocalCluster) Resume(n NodeRef) error {
	p, err := c.proc(n)
	if err != nil {
		return err
	}
	return p.signal(sigCont, 0)
}

func (c *LocalCluster) StopLeaseStore() error {
	if c.pg == nil {
		return ErrUnsupported
	}
	return c.pg.run(context.Background(), "stop")
}

func (c *LocalCluster) StartLeaseStore() error {
	if c.pg == nil {
		return ErrUnsupported
	}
	return c.pg.run(context.Background(), "start")
}

// Close stops the nodes (SIGTERM, then SIGKILL), the WAN emulator and the
// lease store. Data and logs stay in Dir.
func (c *LocalCluster) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	procs := maps.Clone(c.procs)
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func() { defer wg.Done(); p.stop(10 * time.Second) }()
	}
	wg.Wait()
	if c.wan != nil {
		c.wan.stop(5 * time.Second)
	}
	if c.pg != nil {
		_ = c.pg.run(context.Background(), "stop")
	}
	c.ports.release()
	return nil
}

// makePKI writes a development PKI under dir: the CA (ca/), a certs
// folder per node of shape (<region>-n<i>/), the harness's client folder
// (client/, principal "chaos") and the superuser's (operator/, principal
// "operator"); it returns the TLS configurations of the client and of the
// superuser.
func makePKI(dir string, shape Shape) (client, operator *tls.Config, err error) {
	p, err := pki.CreateCA("geolog chaos CA", pki.Options{})
	if err != nil {
		return nil, nil, err
	}
	ca, err := pki.ParseAuthority(p.CertPEM, p.KeyPEM)
	if err != nil {
		return nil, nil, err
	}
	write := func(sub, certName, keyName string, pair pki.Pair) error {
		if err := pki.WriteCACopy(filepath.Join(dir, sub, pki.CACertFile), ca.CertPEM, false); err != nil {
			return err
		}
		return pki.WritePair(filepath.Join(dir, sub, certName), filepath.Join(dir, sub, keyName), pair, false)
	}
	if err := pki.WritePair(filepath.Join(dir, "ca", pki.CACertFile), filepath.Join(dir, "ca", pki.CAKeyFile), p, false); err != nil {
		return nil, nil, err
	}
	for _, r := range shape.Regions {
		for i := 1; i <= shape.NodesPerRegion+shape.SpareNodes; i++ {
			pair, err := pki.CreateNode(ca, r, uint64(i), []string{"127.0.0.1", "localhost"}, pki.Options{})
			if err == nil {
				err = write(fmt.Sprintf("%s-n%d", r, i), pki.NodeCertFile, pki.NodeKeyFile, pair)
			}
			if err != nil {
				return nil, nil, err
			}
		}
	}
	clientConfig := func(sub, principal string) (*tls.Config, error) {
		pair, err := pki.CreateClient(ca, principal, pki.Options{})
		if err == nil {
			err = write(sub, pki.ClientCertFile, pki.ClientKeyFile, pair)
		}
		if err != nil {
			return nil, err
		}
		cd := filepath.Join(dir, sub)
		return pki.ClientConfig(filepath.Join(cd, pki.CACertFile), filepath.Join(cd, pki.ClientCertFile), filepath.Join(cd, pki.ClientKeyFile), "")
	}
	if client, err = clientConfig("client", chaosPrincipal); err != nil {
		return nil, nil, err
	}
	if operator, err = clientConfig("operator", operatorPrincipal); err != nil {
		return nil, nil, err
	}
	return client, operator, nil
}

// pgServer is a private PostgreSQL run by scripts/pg.sh.
type pgServer struct {
	script, dir string
	port        int
	geolog      string // the geolog binary pg.sh makes its certificate with ("": it builds one)
}

// startPG starts the cluster's PostgreSQL on cfg.PGPort, or on a port
// from ports.
func startPG(ctx context.Context, cfg LocalConfig, ports *portAllocator) (*pgServer, error) {
	if cfg.PGScript == "" {
		return nil, fmt.Errorf("chaos: the shape needs a lease store and LocalConfig.PGScript is empty")
	}
	port := cfg.PGPort
	if port == 0 {
		var err error
		if port, err = ports.take(); err != nil {
			return nil, err
		}
	}
	pg := &pgServer{script: absPath(cfg.PGScript), dir: filepath.Join(cfg.Dir, "pg"), port: port,
		geolog: filepath.Join(cfg.BinDir, "geolog")}
	return pg, pg.run(ctx, "start")
}

func (pg *pgServer) run(ctx context.Context, action string) error {
	cmd := exec.CommandContext(ctx, pg.script, action)
	cmd.Env = append(os.Environ(), "GEOLOG_PG_PORT="+strconv.Itoa(pg.port), "GEOLOG_PG_DIR="+pg.dir)
	if pg.geolog != "" {
		cmd.Env = append(cmd.Env, "GEOLOG_PG_GEOLOG="+pg.geolog) // for its certificate: no build
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("chaos: pg.sh %s: %v: %s", action, err, out)
	}
	return nil
}

// waitFor polls cond every 100 ms until it holds, ctx ends or timeout
// passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func httpOK(url string) bool {
	cl := http.Client{Timeout: time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// chaosPrincipal is the principal of the harness's clients (workload,
// fault injection, checks): not a superuser, it holds chaosGrants.
// operatorPrincipal is the cluster's superuser (--superusers), which only
// grants them.
const (
	chaosPrincipal    = "chaos"
	operatorPrincipal = "operator"
)

// Join starts the next spare node of region (Shape.SpareNodes) with
// --join through the region's first node, and waits until it answers. It
// shares the others' flags; its Raft traffic does not ride the WAN
// emulator (the region's nodes dial the address it advertises), so link
// faults between nodes of a region do not reach it.
func (c *LocalCluster) Join(ctx context.Context, region string) (Node, error) {
	c.mu.Lock()
	shared, ok := c.joinArgs[region]
	i := c.joined[region] + 1
	if !ok || i > c.shape.SpareNodes {
		c.mu.Unlock()
		return Node{}, fmt.Errorf("%w: no spare node left in region %q", ErrUnsupported, region)
	}
	c.joined[region] = i
	var seed Node
	for _, n := range c.nodes {
		if n.Region == region && n.ID == 1 {
			seed = n
		}
	}
	c.mu.Unlock()
	ref := NodeRef{region, c.shape.NodesPerRegion + i}
	addr, err := c.ports.addr()
	if err != nil {
		return Node{}, err
	}
	debug, err := c.ports.addr()
	if err != nil {
		return Node{}, err
	}
	name := ref.Region + "-n" + strconv.Itoa(ref.ID)
	args := []string{"--data-dir", filepath.Join(c.cfg.Dir, "data", name), "--listen", addr, "--advertise-addr", addr,
		"--region", region, "--node-id", strconv.Itoa(ref.ID), "--join", seed.Addr, "--fsync", "always",
		"--debug-addr", debug, "--debug-failpoints", "--log-level", c.cfg.LogLevel}
	if c.tls == nil {
		args = append(args, "--insecure")
	} else {
		args = append(args, "--certs-dir", filepath.Join(c.cfg.Dir, "certs", name), "--superusers", operatorPrincipal)
	}
	if !c.cfg.NoAtRest {
		kek, err := makeKEK(c.cfg.Dir, ref)
		if err != nil {
			return Node{}, err
		}
		args = append(args, "--kek-file", kek)
	}
	pr := &proc{name: name, bin: filepath.Join(c.cfg.BinDir, "geologd"), args: append(args, shared...),
		env:     []string{"GOMAXPROCS=" + strconv.Itoa(c.cfg.GOMAXPROCS)},
		logPath: filepath.Join(c.cfg.Dir, name+".log"), pidPath: filepath.Join(c.cfg.Dir, "pids", name+".pid")}
	if err := pr.start(); err != nil {
		return Node{}, err
	}
	n := Node{NodeRef: ref, Addr: addr, ClientAddr: addr, DebugAddr: debug}
	c.mu.Lock()
	c.procs[ref] = pr
	c.nodes = append(c.nodes, n)
	c.mu.Unlock()
	err = waitFor(ctx, 60*time.Second, func() bool { return pr.running() && answers(ctx, n.Addr, c.opTLS) })
	if err != nil || !pr.running() {
		return n, fmt.Errorf("chaos: joining %s did not come up (%s): %v", ref, pr.logPath, err)
	}
	return n, nil
}
