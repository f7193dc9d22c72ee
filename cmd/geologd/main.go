// Command geologd runs one geolog node.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/geolog/geolog/atrest"
	"github.com/geolog/geolog/homing"
	"github.com/geolog/geolog/internal/failpoint"
	"github.com/geolog/geolog/internal/version"
	"github.com/geolog/geolog/pki"
	"github.com/geolog/geolog/regionsvc"
	"github.com/geolog/geolog/segment"
	"github.com/geolog/geolog/vfs"
	"github.com/hashicorp/go-hclog"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/experimental"
)

func main() {
	// Every gRPC message this process marshals or unmarshals (the codecs
	// take gRPC's process-wide pool, not a server's) gets a buffer of at
	// most twice its size: regionsvc.GRPCBufferPool.
	experimental.SetDefaultBufferPool(regionsvc.GRPCBufferPool)
	os.Exit(run())
}

func run() int {
	if len(os.Args) == 2 && (os.Args[1] == "version" || os.Args[1] == "--version" || os.Args[1] == "-version") {
		fmt.Println("geologd", version.Get())
		return 0
	}
	fs := flag.NewFlagSet("geologd", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "data directory (required)")
	listen := fs.String("listen", "127.0.0.1:7400", "gRPC listen address")
	advertise := fs.String("advertise-addr", "", "the address clients dial this node at, host:port (default: the listen address); every leader and home hint names nodes by theirs")
	region := fs.String("region", "local", "this node's region")
	fsync := fs.String("fsync", "always", "durability: always, or never (benchmarks only: acks mean page cache)")
	recordBytesMax := fs.Int("record-bytes-max", 1<<20, "largest record accepted (key+value+headers)")
	segmentBytesMax := fs.Int64("segment-bytes-max", 64<<20, "segment roll size")
	zeroAhead := fs.Int64("log-zero-ahead-bytes", regionsvc.ZeroAheadBytesDefault, "zeros each range's log keeps written past its last frame, so that appends overwrite blocks the file has and an fdatasync flushes data alone (a range that writes little keeps less: a quarter of its segment, at least 64 KiB); -1 turns it off; at most 16 MiB")
	nodeID := fs.Uint64("node-id", 0, "this node's Raft id in its region (with --peers)")
	peersFlag := fs.String("peers", "", "replicate: every node of the region as id=host:port,... (this one included); empty runs a region of one")
	join := fs.String("join", "", "join a running region on this node's first start, through any node of it (host:port); instead of --peers, with --node-id (never a decommissioned one) and a --listen the region's nodes reach")
	zone := fs.String("zone", "", "this node's failure domain in its region: new ranges spread their replicas over zones first")
	var remote regionAddrs
	fs.Var(&remote, "region-addrs", "another region's nodes as region=host:port,host:port (repeatable); needed by streams placed in several regions")
	tick := fs.Duration("tick", 100*time.Millisecond, "Raft tick")
	heartbeatTicks := fs.Int("heartbeat-ticks", 2, "leader heartbeat interval, in ticks")
	electionTicks := fs.Int("election-ticks", 8, "election timeout, in ticks (randomised to [n, 2n))")
	leaderBalance := fs.Duration("leader-balance-interval", 10*time.Second,
		"how often a range leader hands leadership back to the range's preferred node once that node is up and caught up, keeping the region's leaders spread (0: never)")
	rebalanceInterval := fs.Duration("rebalance-interval", 30*time.Second,
		"how often the catalogue leader's rebalancer plans replica moves (repairs, drains, balance over joined nodes) and leader transfers, besides when a move ends (0: never, and drain and decommission move nothing)")
	deadNodeAfter := fs.Duration("dead-node-after", 5*time.Minute,
		"a node unreachable for longer is taken as dead: new ranges avoid it and its replicas are repaired on other nodes")
	movesMax := fs.Int("rebalance-moves-max", 2, "replica moves under way at once in the region")
	strayCheck := fs.Duration("stray-check-interval", 30*time.Second,
		"how often this node looks for stray replicas (of ranges whose configuration no longer names it, e.g. moved away while it was dead) and removes them, freeing their disk space (0: never)")
	leaderTransfersMax := fs.Int("rebalance-leader-transfers-max", 4,
		"range leader transfers the rebalancer has under way at once, balancing leaders by count over the live nodes (0: no leader balancing; needs --leader-balance-interval)")
	transferRate := fs.Int64("rebalance-transfer-bytes-per-second", 32<<20,
		"bound on the bytes per second this node sends to catching-up replicas: snapshots (segment transfers) and log entries to learners (0: no bound)")
	groupCommit := fs.Bool("group-commit", false, "every range log of the node joins one sync point (one flush round in flight, writers arriving during it batched into the next) instead of fdatasyncing on its own; off by default: it lost to per-range fdatasyncs on ext4 (notes/gcommit.md)")
	syncConcurrency := fs.Int("sync-concurrency", 2, "ignored (kept so that existing command lines still parse): every range's log writer makes its own group commit")
	appendDelayTarget := fs.Duration("append-queue-delay-target", regionsvc.AppendQueueDelayTargetDefault,
		"a range leader refuses new appends with a retriable OVERLOADED while its appends have queued (arrival to commit) for longer than this (negative: never)")
	logLevel := fs.String("log-level", "info", "trace, debug, info, warn or error")
	logJSON := fs.Bool("log-json", false, "log as JSON")
	leaseStore := fs.String("lease-store", "", "homing: the lease store's connection string (postgres://... for PostgreSQL or CockroachDB); empty: static homes from the stream specs")
	leaseTTL := fs.Duration("lease-ttl", 5*time.Second, "homing: how far a liveness heartbeat extends this node's lease")
	leaseHeartbeat := fs.Duration("lease-heartbeat", time.Second, "homing: liveness heartbeat interval")
	maxClockOffset := fs.Duration("max-clock-offset", 500*time.Millisecond, "homing: the cluster's maximum clock offset (the same on every node)")
	failoverOrder := fs.String("failover-order", "", "homing: preferred regions to take over a failed home, comma-separated (default: each stream's region order)")
	noFailover := fs.Bool("no-failover", false, "homing: never take over a failed home region automatically")
	tailSurveyTimeout := fs.Duration("tail-survey-timeout", time.Second, "homing: how long a failover's or a planned rehome's survey waits for one node's tails before counting it out; raise it only where a round trip between regions comes near this")
	httpAddr := fs.String("http-addr", "", "serve /metrics (Prometheus), /healthz and /readyz on this address (e.g. 0.0.0.0:7480); off by default")
	debugAddr := fs.String("debug-addr", "", "serve /metrics, /healthz, /readyz and /debug/pprof on this address (e.g. 127.0.0.1:6060; keep it private); off by default")
	otlpEndpoint := fs.String("otlp-endpoint", "", "export traces over OTLP/gRPC to this URL (http://host:4317 plaintext, https:// TLS); default: OTEL_EXPORTER_OTLP_ENDPOINT if set, else no tracing")
	debugFailpoints := fs.Bool("debug-failpoints", false, "chaos tests only: serve "+failpoint.Path+" on --debug-addr to slow or fail fsyncs and skew the clock at run time; off by default")
	clockSkew := fs.Duration("clock-skew", 0, "chaos tests only: add this to the node's clock (needs --debug-failpoints; changeable at run time)")
	limits := addLimitFlags(fs)
	tlsf := addTLSFlags(fs)
	authzf := addAuthzFlags(fs)
	cursorRanges := fs.Int("cursor-ranges", 16, "consumers: range count of the cursor stream _cursors (the same on every node)")
	cursorHome := fs.String("cursor-home", "", "consumers: the region homing every range of _cursors at its creation (default: spread over the regions; the same on every node)")
	groupHeartbeat := fs.Duration("group-heartbeat", 500*time.Millisecond, "consumers: how often group members heartbeat")
	cursorLag := fs.Duration("cursor-compaction-lag", 0, "consumers: the least age of a cursor-stream record compaction by key may drop (0: 1 min; negative: none; the same on every node)")
	cursorTombstones := fs.Duration("cursor-delete-retention", 0, "consumers: how long a deleted cursor position's tombstone stays in the cursor stream (0: 24 h; negative: none; the same on every node)")
	maintenance := fs.Duration("maintenance-interval", 30*time.Second, "how often each range applies retention and considers compaction by key")
	splitRangeRecords := fs.Int64("split-range-records-per-second", 0, "range splits: split a range once more than this many records a second commit to it at three --maintenance-interval looks in a row, at the boundary that halves its sampled keys (0: never by load)")
	splitRangeBytes := fs.Int64("split-range-bytes", 0, "range splits: split a range at its hash midpoint once its log on the home leader retains more bytes than this, checked every --maintenance-interval (0: never by size)")
	compactionInterval := fs.Duration("compaction-interval", time.Minute, "compaction by key: least time between two decisions of a range")
	compactionRate := fs.Int64("compaction-bytes-per-second", 64<<20, "compaction by key: the node's read and write rate (negative: unbounded)")
	kekFile := fs.String("kek-file", "", "encryption at rest: the KEK file (JSON, mode 0600, kept off the data disk; geolog keys add-kek makes one); empty: off, and a data directory holding a keyring is refused")
	dataKeyRotation := fs.Duration("data-key-rotation-period", 7*24*time.Hour, "encryption at rest: start a new data key when the active one is older, at startup and while running (negative: never)")
	resealRate := fs.Int64("reseal-bytes-per-second", 16<<20, "encryption at rest: the rate of the background re-encryption of segments sealed under an older data key, reads and writes together (negative: off)")
	resealInterval := fs.Duration("reseal-interval", 10*time.Minute, "encryption at rest: how often the node looks for segments to re-encrypt (it also does at start)")
	checkFlags := fs.Bool("check-flags", false, "check the flags and their values, then exit (0: they are valid) without opening anything")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "geologd: unexpected argument %q (geologd takes flags only)\n", fs.Arg(0))
		return 2
	}
	// SIGHUP reloads the TLS files; caught from the start, so that one
	// sent while the node opens does not kill it.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "geologd: --data-dir is required")
		return 2
	}
	var policy segment.FsyncPolicy
	switch *fsync {
	case "always":
		policy = segment.FsyncAlways
	case "never":
		policy = segment.FsyncNever
	default:
		fmt.Fprintf(os.Stderr, "geologd: --fsync must be always or never, not %q\n", *fsync)
		return 2
	}
	if *rebalanceInterval < 0 || *strayCheck < 0 || *deadNodeAfter <= 0 || *movesMax < 1 || *transferRate < 0 || *leaderTransfersMax < 0 {
		fmt.Fprintf(os.Stderr, "geologd: --rebalance-interval and --stray-check-interval must be 0 or positive, --dead-node-after positive, --rebalance-moves-max at least 1, --rebalance-transfer-bytes-per-second and --rebalance-leader-transfers-max 0 or positive\n")
		return 2
	}
	if *tailSurveyTimeout <= 0 {
		fmt.Fprintf(os.Stderr, "geologd: --tail-survey-timeout must be positive, not %v\n", *tailSurveyTimeout)
		return 2
	}
	if *leaderBalance < 0 {
		fmt.Fprintf(os.Stderr, "geologd: --leader-balance-interval must be 0 (never) or positive, not %v\n", *leaderBalance)
		return 2
	}
	level := hclog.LevelFromString(*logLevel)
	if level == hclog.NoLevel {
		fmt.Fprintf(os.Stderr, "geologd: --log-level must be trace, debug, info, warn or error, not %q\n", *logLevel)
		return 2
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "geologd", Level: level, JSONFormat: *logJSON, Output: os.Stderr})
	peers, err := parsePeers(*peersFlag)
	if err != nil {
		fmt.Fprintf(os.Stderr, "geologd: --peers: %v\n", err)
		return 2
	}
	if *checkFlags {
		return 0
	}
	certs, err := tlsf.open(logger, *region, *nodeID)
	if err != nil {
		fmt.Fprintf(os.Stderr, "geologd: %v\n", err)
		return 2
	}
	access, err := authzf.policy(logger, certs != nil)
	if err != nil {
		fmt.Fprintf(os.Stderr, "geologd: %v\n", err)
		return 2
	}
	tokens, err := authzf.tokens(logger, certs != nil)
	if err != nil {
		fmt.Fprintf(os.Stderr, "geologd: %v\n", err)
		return 2
	}
	// Failpoints (internal/failpoint) exist only when asked for: without
	// the flag the node runs on the plain file system and clock.
	var failpoints *failpoint.Set
	if *debugFailpoints {
		if *debugAddr == "" {
			fmt.Fprintln(os.Stderr, "geologd: --debug-failpoints needs --debug-addr")
			return 2
		}
		failpoints = &failpoint.Set{}
		if err := failpoints.Apply(failpoint.Settings{ClockSkew: failpoint.Duration(*clockSkew)}); err != nil {
			fmt.Fprintf(os.Stderr, "geologd: --clock-skew: %v\n", err)
			return 2
		}
		logger.Warn("failpoints enabled: fsyncs and the clock can be faulted over the debug address", "path", failpoint.Path, "clock_skew", *clockSkew)
	} else if *clockSkew != 0 {
		fmt.Fprintln(os.Stderr, "geologd: --clock-skew needs --debug-failpoints")
		return 2
	}
	// Telemetry: metrics when an HTTP address serves them, traces when an
	// OTLP endpoint is configured (telemetry.go); the HTTP addresses are
	// listened on before anything opens, so that an unusable one stops the
	// start with one clear line (http.go).
	res, err := nodeResource(*region, *nodeID)
	if err != nil {
		logger.Error("telemetry resource", "error", err)
		return 1
	}
	handlers := &httpHandlers{failpoints: failpoints}
	var meterProvider metric.MeterProvider
	if *httpAddr != "" || *debugAddr != "" {
		mp, _, metricsHandler, err := newMetrics(res)
		if err != nil {
			logger.Error("metrics exporter", "error", err)
			return 1
		}
		defer mp.Shutdown(context.Background())
		meterProvider, handlers.metrics = mp, metricsHandler
	}
	muxes := map[string]*http.ServeMux{} // by flag, for the console below
	for _, srv := range []struct {
		flag, addr string
		mux        func() *http.ServeMux
	}{{"--http-addr", *httpAddr, handlers.operatorMux}, {"--debug-addr", *debugAddr, handlers.debugMux}} {
		if srv.addr == "" {
			continue
		}
		mux := srv.mux()
		ln, err := net.Listen("tcp", srv.addr)
		if err != nil {
			fmt.Fprintf(os.Stderr, "geologd: %s %s: %v\n", srv.flag, srv.addr, err)
			return 1
		}
		ln = httpsListener(ln, certs) // console.go: HTTPS with the node's certificate when TLS is on
		defer ln.Close()
		muxes[srv.flag] = mux
		logger.Info("http serving", "flag", srv.flag, "addr", ln.Addr().String())
		go func() {
			if err := http.Serve(ln, mux); err != nil && !errors.Is(err, net.ErrClosed) {
				logger.Error("http server", "flag", srv.flag, "error", err)
			}
		}()
	}
	var tracerProvider trace.TracerProvider
	switch tp, err := newTracing(*otlpEndpoint, res); {
	case errors.Is(err, errTracingOff):
	case err != nil:
		fmt.Fprintf(os.Stderr, "geologd: %v\n", err)
		return 2
	default:
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			tp.Shutdown(ctx) // flushes the spans still queued
		}()
		tracerProvider = tp
		logger.Info("tracing on: spans exported over OTLP")
	}
	if policy == segment.FsyncNever {
		logger.Warn("fsync disabled: acknowledged records can be lost on a machine crash; for benchmarks only")
	}
	var kek atrest.KEKProvider
	if *kekFile != "" {
		fk, err := atrest.OpenKEKFile(*kekFile)
		if err != nil {
			logger.Error("encryption at rest", "error", err)
			return 1
		}
		kek = fk
	}
	var store homing.Store
	if *leaseStore != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		s, err := homing.OpenSQL(ctx, homing.SQLConfig{URL: *leaseStore, Logger: logger, RequireVerifyFull: !tlsf.insecure})
		cancel()
		if err != nil {
			logger.Error("open lease store", "error", err)
			return 1
		}
		defer s.Close()
		store = s
	}
	var order []string
	for _, r := range strings.Split(*failoverOrder, ",") {
		if r = strings.TrimSpace(r); r != "" {
			order = append(order, r)
		}
	}
	cfg := regionsvc.Config{
		LeaseStore:            store,
		LeaseTTL:              *leaseTTL,
		LeaseHeartbeat:        *leaseHeartbeat,
		MaxClockOffset:        *maxClockOffset,
		FailoverOrder:         order,
		FailoverDisabled:      *noFailover,
		TailSurveyTimeout:     *tailSurveyTimeout,
		DataDir:               *dataDir,
		ListenAddr:            *listen,
		AdvertiseAddr:         *advertise,
		Region:                *region,
		Logger:                logger,
		RecordBytesMax:        *recordBytesMax,
		Fsync:                 policy,
		GroupCommit:           *groupCommit,
		SegmentBytesMax:       *segmentBytesMax,
		ZeroAheadBytes:        *zeroAhead,
		SyncConcurrencyMax:    *syncConcurrency,
		MeterProvider:         meterProvider,
		TracerProvider:        tracerProvider,
		NodeID:                *nodeID,
		Peers:                 peers,
		Join:                  *join,
		Zone:                  *zone,
		Regions:               remote.m,
		TickInterval:          *tick,
		HeartbeatTicks:        *heartbeatTicks,
		ElectionTicks:         *electionTicks,
		LeaderBalanceInterval: *leaderBalance,
		Rebalance: regionsvc.RebalanceConfig{Interval: *rebalanceInterval, DeadNodeAfter: *deadNodeAfter,
			MovesMax: *movesMax, TransferBytesPerSecond: *transferRate, LeaderTransfersMax: leaderTransfersFlag(*leaderTransfersMax),
			StrayCheckInterval: strayCheckFlag(*strayCheck)},

		KEK:                   kek,
		DataKeyRotationPeriod: *dataKeyRotation,
		ResealBytesPerSecond:  *resealRate,
		ResealInterval:        *resealInterval,

		MaintenanceInterval:        *maintenance,
		SplitRangeBytes:            *splitRangeBytes,
		SplitRangeRecordsPerSecond: *splitRangeRecords,
		CompactionInterval:         *compactionInterval,
		CompactionBytesPerSecond:   *compactionRate,

		AppendQueueDelayTarget: *appendDelayTarget,
	}
	limits.apply(&cfg, logger)
	if certs != nil {
		cfg.TLS = certs.ServerTLS()
		if tokens != nil {
			// A token client needs no certificate of its own; nodes and
			// certificate clients still present theirs (verified).
			cfg.TLS = certs.ServerTLSClientCertOptional()
		}
		cfg.ClientCredentials = certs.ClientCredentials(pki.RequireNode)
		cfg.Authz, cfg.Tokens = access, tokens
		if err := certs.RegisterMetrics(meterProvider); err != nil {
			logger.Error("tls metrics", "error", err)
			return 1
		}
	}
	cfg.CursorRanges, cfg.CursorHome, cfg.GroupHeartbeatInterval = *cursorRanges, *cursorHome, *groupHeartbeat
	cfg.CursorCompactionLag, cfg.CursorDeleteRetention = *cursorLag, *cursorTombstones
	if failpoints != nil {
		cfg.FS = vfs.WithFaults(vfs.OS(), &failpoints.Faults)
		cfg.Now = failpoints.Now
	}
	logger.Info("geologd starting", "version", version.Get().String())
	node, err := regionsvc.New(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "geologd: cannot open the node: %v\n", err)
		return 1
	}
	if err := node.Start(); err != nil {
		node.Close()
		fmt.Fprintf(os.Stderr, "geologd: cannot start the node: %v\n", err)
		return 1
	}
	handlers.node.Store(node)
	// The web console goes on the operator's address, else on the debug
	// one (where it was before --http-addr).
	consoleMux, consoleAddr := muxes["--http-addr"], *httpAddr
	if consoleMux == nil {
		consoleMux, consoleAddr = muxes["--debug-addr"], *debugAddr
	}
	defer mountConsole(consoleMux, node, consoleSetup{consoleAddr, *region, *nodeID, peers, remote.m, certs, access, logger})() // console.go
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	watchDone := make(chan struct{})
	go func() { defer close(watchDone); tlsf.watch(ctx, logger, certs, hup) }()
	defer func() { stop(); <-watchDone }()
	err = node.Wait(ctx)
	node.Close()
	if err != nil && ctx.Err() == nil {
		logger.Error("server stopped", "error", err)
		return 1
	}
	return 0
}

// regionAddrs collects --region-addrs flags.
type regionAddrs struct{ m map[string][]string }

func (r *regionAddrs) String() string { return fmt.Sprint(r.m) }

func (r *regionAddrs) Set(v string) error {
	name, list, ok := strings.Cut(v, "=")
	if !ok || name == "" || list == "" {
		return fmt.Errorf("want region=host:port,host:port, got %q", v)
	}
	if r.m == nil {
		r.m = map[string][]string{}
	}
	for _, a := range strings.Split(list, ",") {
		if a = strings.TrimSpace(a); a != "" {
			r.m[name] = append(r.m[name], a)
		}
	}
	return nil
}

// parsePeers reads "1=host:port,2=host:port".
func parsePeers(s string) (map[uint64]string, error) {
	if s == "" {
		return nil, nil
	}
	peers := map[uint64]string{}
	for _, part := range strings.Split(s, ",") {
		idStr, addr, ok := strings.Cut(strings.TrimSpace(part), "=")
		id, err := strconv.ParseUint(idStr, 10, 64)
		if !ok || err != nil || id == 0 || addr == "" {
			return nil, fmt.Errorf("%q is not id=host:port with a non-zero id", part)
		}
		if _, dup := peers[id]; dup {
			return nil, fmt.Errorf("id %d listed twice", id)
		}
		peers[id] = addr
	}
	return peers, nil
}

// strayCheckFlag maps --stray-check-interval to
// RebalanceConfig.StrayCheckInterval (whose 0 is the default and negative
// is off).
func strayCheckFlag(v time.Duration) time.Duration {
	if v == 0 {
		return -1
	}
	return v
}

// leaderTransfersFlag maps --rebalance-leader-transfers-max to
// RebalanceConfig.LeaderTransfersMax (whose 0 is the default and negative
// is off).
func leaderTransfersFlag(v int) int {
	if v == 0 {
		return -1
	}
	return v
}
