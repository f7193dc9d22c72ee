package regionsvc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/geolog/geolog/authz"
	"github.com/geolog/geolog/internal/stopper"
	"golang.org/x/time/rate"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/atrest"
	"github.com/geolog/geolog/compact"
	"github.com/geolog/geolog/homing"
	"github.com/geolog/geolog/internal/rpcerr"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/replicator"
	"github.com/geolog/geolog/segment"
	"github.com/geolog/geolog/vfs"
	"github.com/hashicorp/go-hclog"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/experimental"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
)

// Config configures a Node. Zero values take the documented defaults.
type Config struct {
	// DataDir holds the catalogue and every range's segments. Required.
	DataDir string
	// ListenAddr is the gRPC listen address, default "127.0.0.1:7400".
	// Use "127.0.0.1:0" for an ephemeral port (see Addr).
	ListenAddr string
	// AdvertiseAddr is the address clients dial this node at (host:port),
	// default the address it listens on. Every address a node gives
	// clients (leader and home hints, RangeInfo leaders) is some node's
	// AdvertiseAddr, never a Peers or Regions address: see advertise.go.
	AdvertiseAddr string
	// Region names this node's region, default "local".
	Region string
	// Regions maps each other region to the client addresses of its nodes,
	// as this node reaches them (in a local cluster, through the WAN
	// emulator), in Raft id order (the first is node 1's). Streams placed in several regions need it: creation is
	// propagated there, the home ranges' leaders replicate there, and
	// appends to a mirror are redirected there. A region of one node is
	// fine (without Peers its node is Raft id 1).
	Regions map[string][]string
	// Logger defaults to a null logger.
	Logger hclog.Logger
	// TLS, when set, serves gRPC over TLS and turns identity checks on
	// (peerauth.go): every caller must present a certificate the node
	// verifies (set ClientAuth to tls.RequireAndVerifyClientCert) naming a
	// geolog identity (pki), and node-to-node services take nodes only.
	// Default: plaintext, and no check of who calls.
	TLS *tls.Config
	// Authz, when set with TLS, turns per-stream authorization on
	// (authz.go): a client principal may make only the calls the policy
	// grants it (superusers, rules); nodes pass. Default: any verified
	// identity may call every public method.
	Authz *authz.Policy
	// Tokens, when set with TLS, verifies the bearer tokens (JWT) clients
	// may present in an "authorization: Bearer" header; a verified token's
	// principal ("jwt:<sub>") replaces the client certificate's
	// (peerauth.go). Default: a call with a token is refused.
	Tokens *authz.TokenVerifier
	// ClientTLS is used when this node calls another (Raft, forwarding,
	// replication, catalogue propagation).
	ClientTLS *tls.Config
	// ClientCredentials, when set, are used instead of ClientTLS
	// (pki.Files.ClientCredentials: they reload their certificates).
	ClientCredentials credentials.TransportCredentials
	// RecordBytesMax bounds one record (key + value + headers), default 1 MiB.
	RecordBytesMax int
	// BatchBytesMax bounds one encoded append batch, default 16 MiB.
	BatchBytesMax int
	// Fsync is the durability policy, default segment.FsyncAlways.
	// segment.FsyncNever is for benchmarks only: acks then mean "written to
	// the page cache".
	Fsync segment.FsyncPolicy
	// GroupCommit makes every range log of the node join one sync point
	// (vfs.SyncGroup) instead of fdatasyncing on its own: one flush round
	// in flight for the node's data directory, writers arriving during it
	// batched into the next. Default false: it lost to per-range
	// fdatasyncs on ext4, whose journal already commits concurrent
	// fdatasyncs together (notes/gcommit.md).
	GroupCommit bool
	// SegmentBytesMax is the segment roll size, default 64 MiB.
	SegmentBytesMax int64
	// ZeroAheadBytes bounds the zeros each range's log keeps written past
	// its last frame, so that an append overwrites blocks the file has and
	// its fdatasync flushes data alone, not the file's size and block map
	// (segment.Config.ZeroAheadBytes). Default ZeroAheadBytesDefault;
	// negative turns it off. A range that writes little keeps less (a
	// quarter of its segment, at least 64 KiB).
	ZeroAheadBytes int64
	// Epoch stamped on every batch without a lease store, default 1.
	Epoch uint64
	// LeaseStore, if set, turns homing on (see homing.go): which region is
	// home for each range, at which epoch, comes from it; appends are
	// admitted and acked under a lease only; failed home regions are taken
	// over. The node does not close it.
	LeaseStore homing.Store
	// LeaseHeartbeat, LeaseTTL and MaxClockOffset configure the liveness
	// lease (homing.Config: defaults 1 s, 5 s, 500 ms). MaxClockOffset
	// must be the same on every node.
	LeaseHeartbeat, LeaseTTL, MaxClockOffset time.Duration
	// FailoverOrder is the preference among regions for taking over a
	// failed home when mirrors are equally caught up (default: the
	// stream's region order).
	FailoverOrder []string
	// FailoverDisabled turns the takeover agent off (operators then move
	// homes by hand).
	FailoverDisabled bool
	// TailSurveyTimeout bounds how long a takeover's or a rehome's survey
	// waits for one node's copies of a stream (regiontails.go), default
	// 1 s: a node that has not answered by then counts for nothing. The
	// node keeps its connections to other regions' nodes open (warmRegionConns),
	// so an answer takes one round trip; raise it only for links slower
	// than that.
	TailSurveyTimeout time.Duration
	// KEK, if set, turns encryption at rest on: the node's data keys live
	// in <DataDir>/keys, wrapped by this provider (geologd --kek-file), and
	// every range's log is sealed under them (see atrest.go). Without it a
	// data directory that holds a keyring is refused. Default nil.
	KEK atrest.KEKProvider
	// DataKeyRotationPeriod makes the node start a new data key when it
	// starts with an active one older than this, default 7 days; negative
	// never. (geolog keys rotate rotates a stopped node's at once.)
	DataKeyRotationPeriod time.Duration
	// SyncConcurrencyMax is ignored. It bounded the fsyncs of the
	// single-node write path, which is gone: every range, in a region of
	// one too, writes through its replica's log writer (one group commit
	// per range). Kept so that configurations that set it still load.
	SyncConcurrencyMax int
	// InboxOpsMax bounds queued appends per range, default 4096.
	InboxOpsMax int
	// AppendQueueDelayTarget is the queueing delay past which a range
	// leader sheds appends with a retriable OVERLOADED before proposing
	// them (shed.go: when the least time from arrival to commit over an
	// interval of twice the target exceeded it), default
	// AppendQueueDelayTargetDefault (100 ms); negative: never.
	AppendQueueDelayTarget time.Duration
	// ProducersMax bounds idempotent producers remembered per range,
	// default 100,000.
	ProducersMax int
	// ProducerStateTTL is how long compaction by key keeps a producer's
	// newest batch after its last one (compact.Policy.ProducerRetention),
	// default 7 days. The idempotence table itself is bounded by
	// ProducersMax.
	ProducerStateTTL time.Duration
	// MaintenanceInterval is how often retention runs, default 30 s.
	MaintenanceInterval time.Duration
	// SplitRangeBytes splits a range automatically at its hash midpoint
	// once its log on the range's home leader retains more bytes than
	// this, checked every MaintenanceInterval (split_auto.go); 0, the
	// default, never splits a range by itself.
	SplitRangeBytes int64
	// SplitRangeRecordsPerSecond splits a range automatically once the
	// records committed to it pass this many a second at three looks in a
	// row (every MaintenanceInterval), at the boundary that halves its
	// sampled keys (split_load.go); 0, the default, never splits by load.
	SplitRangeRecordsPerSecond int64
	// CompactionInterval is the least time between two compaction
	// decisions of a range compacted by key (checked every
	// MaintenanceInterval), default 1 min. CompactionBytesPerSecond bounds
	// the node's compaction I/O, default 64 MiB/s (negative: none);
	// CompactionMemoryBytesMax the keys one compaction remembers, default
	// 64 MiB (see package compact).
	CompactionInterval       time.Duration
	CompactionBytesPerSecond int64
	CompactionMemoryBytesMax int64
	// ResealBytesPerSecond bounds the node's background re-encryption of
	// segments sealed under an older data key (reseal.go; with a KEK
	// only), reads and writes together, default 16 MiB/s; negative: no
	// background re-encryption. ResealInterval is how often the node looks
	// for such segments (it also does at start), default 10 min.
	ResealBytesPerSecond int64
	ResealInterval       time.Duration
	// Now is the clock, default time.Now.
	Now func() time.Time
	// FS is the file system of every range's segments and Raft state,
	// default vfs.OS(). geologd --debug-failpoints passes vfs.WithFaults.
	FS vfs.FS
	// NodeID and Peers name the region's nodes: Peers maps every node of
	// the region, this one included, from its Raft id (non-zero) to its
	// listen address. Every range and the stream catalogue are Raft groups
	// over these nodes. Without Peers the node is a region of one: every
	// group has one voter, this node (NodeID, default 1), and commits once
	// the node's own log write is durable.
	NodeID uint64
	Peers  map[uint64]string
	// Join, instead of Peers, makes a node join a running region on its
	// first start: the address of any node of the region (members_join.go).
	// NodeID is then required (with TLS, the id the node's certificate
	// names) and never one the region had before; the region's nodes reach
	// this one at ListenAddr. Once joined, the node keeps the region's node
	// list in its data directory and Join is not used again.
	Join string
	// Zone names the node's failure domain inside its region, for the
	// placement of new ranges (spread over zones first); default "".
	Zone string
	// ReplicationFactor is how many of the region's nodes are the initial
	// voters of a new range (the lowest Raft ids), default 3 or all nodes
	// if fewer. The others host passive replicas that membership changes
	// (Admin.ChangeReplicas) can bring in. The catalogue spans all nodes.
	ReplicationFactor int
	// TickInterval is Raft's tick, default 100 ms.
	TickInterval time.Duration
	// HeartbeatTicks is the leader's heartbeat interval in ticks, default 2;
	// ElectionTicks the followers' election timeout, default 8 (randomised
	// by Raft to [8, 16) ticks). Heartbeats are per range, so they set the
	// cost of idle ranges (see notes/README.md).
	HeartbeatTicks, ElectionTicks int
	// LeaderBalanceInterval is how often a range leader checks that it is
	// the range's preferred leader and, if not, hands leadership to it
	// once it is up and caught up (leaderbalance.go): the region's leaders
	// stay spread over its nodes after restarts and elections. 0: never
	// (geologd's default is 10 s).
	LeaderBalanceInterval time.Duration
	// Rebalance configures the region's rebalancer (rebalance.go); its
	// zero value is off.
	Rebalance RebalanceConfig
	// MeterProvider receives the node's metrics, default a no-op provider.
	MeterProvider metric.MeterProvider
	// TracerProvider receives gRPC spans, default a no-op provider.
	TracerProvider trace.TracerProvider
	// Limits are the node's resource bounds (limits.go).
	Limits LimitsConfig

	// CursorRanges is the range count of the cursor stream ("_cursors",
	// cursorstream.go), default 16; CursorHome the region its ranges are
	// homed in at creation, default "" (spread over the regions). Both are
	// part of the stream's definition: set them alike on every node.
	CursorRanges int
	CursorHome   string
	// CursorCompactionLag and CursorDeleteRetention are the cursor
	// stream's compaction by key (it is created with cleanup compact): the
	// least age of a record compaction may drop, and how long a deleted
	// position's tombstone stays; 0 takes package compact's defaults (1
	// min, 24 h), negative means none. Part of the stream's definition.
	CursorCompactionLag, CursorDeleteRetention time.Duration
	// GroupHeartbeatInterval is how often group members are told to
	// heartbeat, default 500 ms.
	GroupHeartbeatInterval time.Duration

	// openAwakeMax bounds the node's awake groups as new streams' ranges
	// start (openpace.go), default openAwakeMaxDefault; tests set it.
	openAwakeMax int
	// hintAttempts and hintPendingRetry override strayHintAttemptsMax
	// and pendingHintRetry (strayhint.go, hintpending.go) when positive;
	// tests set them.
	hintAttempts     int
	hintPendingRetry time.Duration
}

func (c *Config) setDefaults() error {
	if c.DataDir == "" {
		return errors.New("regionsvc: Config.DataDir is required")
	}
	if c.ListenAddr == "" {
		c.ListenAddr = "127.0.0.1:7400"
	}
	if c.AdvertiseAddr != "" {
		if err := validAdvertised(c.AdvertiseAddr); err != nil {
			return fmt.Errorf("regionsvc: AdvertiseAddr: %w", err)
		}
	}
	if c.Region == "" {
		c.Region = "local"
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if err := c.setLogDefaults(); err != nil {
		return err
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	// The lease defaults (homing.Config's), set here so that the node's
	// own uses (rehome, takeover) see the values the lease runs with.
	if c.LeaseHeartbeat == 0 {
		c.LeaseHeartbeat = time.Second
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 5 * time.Second
	}
	if c.MaxClockOffset == 0 {
		c.MaxClockOffset = 500 * time.Millisecond
	}
	if c.TailSurveyTimeout <= 0 {
		c.TailSurveyTimeout = time.Second
	}
	if err := c.setReplicationDefaults(); err != nil {
		return err
	}
	if c.MeterProvider == nil {
		c.MeterProvider = metricnoop.NewMeterProvider()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = tracenoop.NewTracerProvider()
	}
	c.Limits.setDefaults(fileLimit())
	return c.setConsumerDefaults()
}

// fsys is the node's file system: FS, else the operating system's.
func (c *Config) fsys() vfs.FS {
	if c.FS == nil {
		return vfs.OS()
	}
	return c.FS
}

// ZeroAheadBytesDefault is Config.ZeroAheadBytes's default.
const ZeroAheadBytesDefault = 1 << 20

// setLogDefaults sets the defaults and checks the bounds of the log each
// range keeps: records, batches, segments, producers.
func (c *Config) setLogDefaults() error {
	if c.RecordBytesMax <= 0 {
		c.RecordBytesMax = 1 << 20
	}
	if c.BatchBytesMax <= 0 {
		c.BatchBytesMax = 16 << 20
	}
	if c.RecordBytesMax > c.BatchBytesMax {
		return fmt.Errorf("regionsvc: RecordBytesMax %d exceeds BatchBytesMax %d", c.RecordBytesMax, c.BatchBytesMax)
	}
	if c.SegmentBytesMax <= 0 {
		c.SegmentBytesMax = 64 << 20
	}
	switch {
	case c.ZeroAheadBytes == 0:
		c.ZeroAheadBytes = ZeroAheadBytesDefault
	case c.ZeroAheadBytes < 0:
		c.ZeroAheadBytes = 0
	case c.ZeroAheadBytes > segment.ZeroAheadBytesMax:
		return fmt.Errorf("regionsvc: ZeroAheadBytes %d exceeds %d", c.ZeroAheadBytes, segment.ZeroAheadBytesMax)
	}
	if c.Epoch == 0 {
		c.Epoch = 1
	}
	if c.SyncConcurrencyMax <= 0 {
		c.SyncConcurrencyMax = 2
	}
	if c.InboxOpsMax <= 0 {
		c.InboxOpsMax = 4096
	}
	if c.AppendQueueDelayTarget == 0 {
		c.AppendQueueDelayTarget = AppendQueueDelayTargetDefault
	}
	if c.ProducersMax <= 0 {
		c.ProducersMax = 100_000
	}
	if c.ProducerStateTTL == 0 {
		c.ProducerStateTTL = 7 * 24 * time.Hour
	}
	if c.MaintenanceInterval <= 0 {
		c.MaintenanceInterval = 30 * time.Second
	}
	return nil
}

// setReplicationDefaults checks the region's peers and the other regions,
// and sets the Raft defaults.
func (c *Config) setReplicationDefaults() error {
	if len(c.Peers) == 0 && c.NodeID == 0 {
		c.NodeID = 1 // a region of one: the sole voter of every group
	}
	if c.Join != "" && (len(c.Peers) > 0 || c.NodeID == 0) {
		return errors.New("regionsvc: Join needs NodeID and excludes Peers")
	}
	if len(c.Peers) > 0 {
		if c.NodeID == 0 || c.Peers[c.NodeID] == "" {
			return fmt.Errorf("regionsvc: NodeID %d must be one of Peers", c.NodeID)
		}
		if _, ok := c.Peers[0]; ok {
			return errors.New("regionsvc: Raft id 0 is not valid")
		}
	}
	for region, addrs := range c.Regions {
		if region == c.Region || region == "" || len(addrs) == 0 {
			return fmt.Errorf("regionsvc: Regions[%q] must name another region and list its addresses", region)
		}
	}
	if c.ReplicationFactor <= 0 {
		c.ReplicationFactor = 3
	}
	if c.Join == "" { // a joiner's is bounded by the seeds (openMembers)
		c.ReplicationFactor = min(c.ReplicationFactor, max(len(c.Peers), 1))
	}
	if c.TickInterval <= 0 {
		c.TickInterval = 100 * time.Millisecond
	}
	if c.HeartbeatTicks <= 0 {
		c.HeartbeatTicks = 2
	}
	if c.ElectionTicks <= 0 {
		c.ElectionTicks = 8
	}
	if c.ElectionTicks <= c.HeartbeatTicks {
		return fmt.Errorf("regionsvc: ElectionTicks %d must exceed HeartbeatTicks %d", c.ElectionTicks, c.HeartbeatTicks)
	}
	return nil
}

// streamState is an open stream: its spec and one driver per range.
type streamState struct {
	spec   streamSpec
	ranges []*rangeDriver
}

// Node is one geolog region node: it owns a data directory, the streams in
// it, and a gRPC server for the public Log API.
type Node struct {
	cfg    Config
	logger hclog.Logger

	mu      sync.RWMutex // guards streams
	streams map[string]*streamState
	// splits admits one split decision per stream at a time (split.go).
	splits splitGuard
	// loadSplits measures the load of the ranges led here (split_load.go).
	loadSplits loadSplitter

	// acl is the access rules of the catalogue (acl.go); aclSyncDone is
	// closed when its comparison with other regions stopped.
	acl         aclState
	aclSyncDone chan struct{}

	metrics     *nodeMetrics
	authMetrics *authMetrics
	// policy is what client principals may do (authz.go); refusals
	// rate-limits the refusal log.
	policy   policyState
	refusals refusalLog
	region   *region // nil unless replicated
	// cleaner runs the compactions by key of every range here
	// (compaction.go); cleanerStop and cleanerDone stop it.
	cleaner        *compact.Cleaner
	compactMetrics *compactionMetrics
	cleanerStop    context.CancelFunc
	cleanerDone    chan struct{}
	// resealer re-encrypts segments under the active data key (reseal.go);
	// nil without a keyring.
	resealer atomic.Pointer[resealer]
	// repl runs this node's replicator tasks (set by Start: range
	// drivers, which may run before it in a region of one, whose streams
	// open in New, load it) and replServer applies other regions' batches
	// to the mirrors here.
	repl       atomic.Pointer[replicationManager]
	replServer *replicator.Server
	// homing is nil unless Config.LeaseStore is set.
	homing *homingState
	// epochs caches the streams' epoch histories (epochs.go).
	epochs epochHistories
	// advertise is the node's advertised address (set by Start); book
	// holds the other nodes' (advertise.go); bookDone is closed when its
	// refresher stopped (nil if none runs).
	advertise string
	book      *addrBook
	// regionDir holds other regions' members as they answered
	// (regiondir.go).
	regionDir regionDir
	bookDone  chan struct{}
	// cursors serves cursors and consumer groups (cursorstream.go).
	cursors *cursorService
	// peerConns are client connections to the region's other nodes and
	// to other regions' (peerConn), bounded by the addresses the node
	// knows: forgetPeerConns closes those of addresses no longer known,
	// which peerConnsUnknown times.
	peerConnsMu      sync.Mutex
	peerConns        map[string]*grpc.ClientConn
	peerConnsUnknown map[string]time.Time
	grpcServer       *grpc.Server
	listener         net.Listener
	keyring          *atrest.Keyring // nil: encryption at rest is off
	// tasks is the node's stopper: every goroutine that outlives the call
	// that starts it goes through tasks.Go, and Close stops and waits for
	// them (internal/stopper).
	tasks *stopper.Stopper
	// strayHints bounds the replica removal hints in flight
	// (strayhint.go).
	strayHints strayHints
	// pendingHints holds the hints whose attempts ran out, retried at a
	// low rate (hintpending.go).
	pendingHints *pendingHints
	// testBlockPeer, set by tests, cuts this node off from the peers it
	// returns true for: their Raft messages are dropped, hints to them
	// fail (strayhint.go).
	testBlockPeer atomic.Pointer[func(peer uint64) bool]
	// dirLock is the node's exclusive lock on its data directory, held from
	// New to Close: a second node on the same directory fails to start.
	dirLock io.Closer
	// files is the file system of the ranges' files: Config.FS behind a
	// node-wide bound on open descriptors (Limits.FileDescriptorsMax).
	// Its Lock is in-process only: dirLock keeps other processes out.
	files *vfs.Cache
	// syncs is the node's sync point that every range log's fdatasyncs
	// join (Config.GroupCommit), nil when off.
	syncs   *vfs.SyncGroup
	closing chan struct{}
	started time.Time // when New returned (Config.Now)
	// limits are the node's budgets and quotas (limits.go); conns its
	// bounded listener (after Start).
	limits *limits
	conns  *limitListener
	// rangesMu guards rangesReserved: the ranges of creates in progress,
	// counted against Limits.RangesMax.
	rangesMu       sync.Mutex
	rangesReserved int
	// deleted are the streams this node deleted (delete.go).
	deletedMu sync.Mutex
	deleted   map[string]bool
	closeOnce sync.Once
	serveErr  chan error
	// serving is set once Start has the gRPC server serving (Ready).
	serving atomic.Bool
	// rebalancer is the region's rebalancing driver (nil: off);
	// transferLimiter bounds the snapshots this node sends (nil: no
	// bound). rebalance.go, rebalance_throttle.go.
	rebalancer      *rebalancer
	transferLimiter *rate.Limiter
	// learnerBytes counts the log bytes sent to learners under the
	// bucket, learnerDeferred the appends to learners it deferred
	// (rebalance_throttle.go).
	learnerBytes, learnerDeferred atomic.Int64
}

// New opens the data directory, recovers every range and returns a node that
// is not yet listening. Ranges that fail to recover (for example corrupt
// segments) are kept closed and reported; the rest are served.
func New(cfg Config) (*Node, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(cfg.DataDir, "streams"), 0o700); err != nil {
		return nil, fmt.Errorf("regionsvc: data dir: %w", err)
	}
	var err error
	n := &Node{
		cfg:          cfg,
		logger:       cfg.Logger.Named("node"),
		streams:      map[string]*streamState{},
		closing:      make(chan struct{}),
		serveErr:     make(chan error, 1),
		files:        vfs.NewCache(cfg.fsys(), cfg.Limits.FileDescriptorsMax),
		syncs:        newSyncGroup(cfg.GroupCommit),
		started:      cfg.Now(),
		book:         newAddrBook(),
		tasks:        stopper.New(),
		strayHints:   newStrayHints(),
		pendingHints: newPendingHints(pendingHintsMax),
	}
	n.cleaner = compact.NewCleaner(compact.CleanerConfig{BytesPerSecond: cfg.CompactionBytesPerSecond,
		MemoryBytesMax: cfg.CompactionMemoryBytesMax, Logger: n.logger})
	if n.metrics, err = newNodeMetrics(n, cfg.MeterProvider); err != nil {
		return nil, fmt.Errorf("regionsvc: metrics: %w", err)
	}
	n.limits = newLimits(cfg.Limits, cfg.Now, n.metrics, cfg.Logger)
	if n.authMetrics, err = newAuthMetrics(cfg.MeterProvider); err != nil {
		return nil, fmt.Errorf("regionsvc: metrics: %w", err)
	}
	if cfg.Authz != nil {
		n.policy.set(cfg.Authz)
	}
	if err := n.loadACLs(); err != nil {
		return nil, err
	}
	if n.compactMetrics, err = newCompactionMetrics(cfg.MeterProvider); err != nil {
		return nil, fmt.Errorf("regionsvc: metrics: %w", err)
	}
	if err := n.registerResealMetrics(cfg.MeterProvider); err != nil {
		return nil, fmt.Errorf("regionsvc: metrics: %w", err)
	}
	if err := n.newRebalancer(); err != nil { // rebalance.go
		return nil, fmt.Errorf("regionsvc: metrics: %w", err)
	}
	// The directory lock and the keyring are taken last before the ranges:
	// every later failure closes the node, which releases them.
	if n.dirLock, err = lockDataDir(cfg); err != nil {
		return nil, err
	}
	if n.keyring, err = openKeyring(cfg); err != nil {
		n.dirLock.Close()
		return nil, err
	}
	// The catalogue is the meta range; streams appear as it applies. A
	// region of one node is a Raft group of one (its own voter).
	if err := checkNotSingleNodeDir(cfg.fsys(), cfg.DataDir); err != nil {
		n.Close()
		return nil, err
	}
	if err := n.openRegion(); err != nil {
		n.Close()
		return nil, err
	}
	if err := n.checkRangeKeys(); err != nil {
		n.Close()
		return nil, err
	}
	n.logger.Info("node opened", "data_dir", cfg.DataDir, "node_id", cfg.NodeID, "peers", fmtPeers(cfg.Peers))
	return n, nil
}

// lockDataDir takes the node's exclusive lock on cfg.DataDir (vfs.Lock: a
// LOCK file under an flock), so that a second node on the same directory
// fails to start with one clear error instead of serving without its ranges.
func lockDataDir(cfg Config) (io.Closer, error) {
	fsys := cfg.FS
	if fsys == nil {
		fsys = vfs.OS()
	}
	l, err := fsys.Lock(cfg.DataDir)
	if errors.Is(err, vfs.ErrLocked) {
		return nil, fmt.Errorf("regionsvc: data directory %s is in use by another geologd (it holds %s): stop that one or pick another --data-dir: %w",
			cfg.DataDir, filepath.Join(cfg.DataDir, vfs.LockFileName), err)
	}
	if err != nil {
		return nil, fmt.Errorf("regionsvc: data directory %s: %w", cfg.DataDir, err)
	}
	return l, nil
}

func (n *Node) rangeDir(stream string, r uint32) string {
	return filepath.Join(n.cfg.DataDir, "streams", stream, fmt.Sprintf("%05d", r))
}

// rangeOpenConcurrencyMax bounds the ranges of one stream opened at once:
// opening a range makes its Raft state durable (fsyncs), and a stream of
// thousands of ranges opened one after another would take minutes.
const rangeOpenConcurrencyMax = 16

// openStreamAt opens a stream's ranges, up to rangeOpenConcurrencyMax at
// once; metaOffset, the catalogue offset of the stream's creation, names
// their Raft groups. Paced, its new groups start ticking as the node's
// pace admits them (openpace.go).
func (n *Node) openStreamAt(spec streamSpec, metaOffset uint64, paced bool) *streamState {
	st := &streamState{spec: spec, ranges: make([]*rangeDriver, spec.rangeTotal())}
	slots := make(chan struct{}, rangeOpenConcurrencyMax)
	var wg sync.WaitGroup
	for r := uint32(0); r < spec.rangeTotal(); r++ { // split ranges and their children too
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			st.ranges[r] = n.openRangeWith(spec, metaOffset, r, paced)
		}()
	}
	wg.Wait()
	return st
}

// openRange opens range r of spec.
func (n *Node) openRange(spec streamSpec, metaOffset uint64, r uint32) *rangeDriver {
	return n.openRangeWith(spec, metaOffset, r, false)
}

// openRangeWith opens range r of spec; paced, a new group waits for the
// node's pace to admit it before it ticks (openpace.go).
func (n *Node) openRangeWith(spec streamSpec, metaOffset uint64, r uint32, paced bool) *rangeDriver {
	cfg := n.rangeConfig(spec.Name, r, segment.Config{
		Dir:            n.rangeDir(spec.Name, r),
		RetentionAge:   time.Duration(spec.RetentionAgeMillis) * time.Millisecond,
		RetentionBytes: spec.RetentionBytes,
	}, &replicationConfig{groupID: groupFor(metaOffset, r), peers: n.rangePeers(spec, r), paced: paced})
	cfg.homeRegion = spec.home(r)
	cfg.home = cfg.homeRegion == n.cfg.Region
	cfg.compaction = n.compactionConfigFor(spec, r)
	if len(spec.Regions) > 1 {
		cfg.compactionFloor = func() (uint64, bool) { return n.mirrorFloor(spec.Name, r) }
	}
	if n.cfg.LeaseStore != nil {
		cfg.leaseCheck = n.leaseCheck
		cfg.fenced = len(spec.Regions) > 1
		cfg.wantEpochs = n.wantEpochs
		if cfg.fenced {
			cfg.confirmStart = n.confirmStart
		}
	}
	d := openRangeDriver(cfg)
	d.setMirrorHold(spec) // mirrorhold.go
	d.setRole(n.initialRole(spec.Name, r, spec))
	d.learnSplitEnd(spec.RangeMap) // split_read.go
	return d
}

// newSyncGroup returns the node's sync point when group commit is on, nil
// otherwise (every store then fdatasyncs its own files).
func newSyncGroup(on bool) *vfs.SyncGroup {
	if !on {
		return nil
	}
	return vfs.NewSyncGroup()
}

// rangeConfig completes a range driver's configuration from the node's.
func (n *Node) rangeConfig(stream string, r uint32, store segment.Config, rc *replicationConfig) rangeDriverConfig {
	store.SegmentBytesMax = n.cfg.SegmentBytesMax
	store.ZeroAheadBytes = n.cfg.ZeroAheadBytes
	store.Fsync = n.cfg.Fsync
	store.Now = n.cfg.Now
	store.FS = n.files
	store.SyncGroup = n.syncs
	store.Keyring = n.keyring
	if rc != nil {
		// Retention applies to replicated ranges too, as Raft log
		// compaction (see snapshot.go); the catalogue has none.
		n.completeReplication(rc)
	}
	return rangeDriverConfig{
		stream:       stream,
		rangeID:      r,
		store:        store,
		epoch:        n.cfg.Epoch,
		logger:       n.cfg.Logger,
		now:          n.cfg.Now,
		inboxOpsMax:  n.cfg.InboxOpsMax,
		producersMax: n.cfg.ProducersMax,
		metrics:      n.metrics,
		repl:         rc,

		appendQueueDelayTarget: n.cfg.AppendQueueDelayTarget,
	}
}

// interceptors is the node's interceptor chain: the error boundary first
// (rpcerr), so that every later interceptor and every handler returns plain
// errors and the stats handler (metrics, spans) sees the status it made;
// then authentication and authorization.
func (n *Node) interceptors() []grpc.ServerOption {
	return append(rpcerr.ServerOptions(n.logger), n.authInterceptors()...)
}

// baseServerOptions are the server's options before the services' own:
// message and window sizes, the keepalive policy, OpenTelemetry at the
// gRPC boundary (one span and the RPC metrics per call), TLS and the
// interceptor chain.
func (n *Node) baseServerOptions() []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.MaxSendMsgSize(readBytesMax + (4 << 20)),
		experimental.BufferPool(grpcBufferPool), // bufpool.go
		grpc.InitialWindowSize(streamWindowBytes),
		grpc.InitialConnWindowSize(16 << 20),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.StatsHandler(otelgrpc.NewServerHandler(
			otelgrpc.WithMeterProvider(n.cfg.MeterProvider),
			otelgrpc.WithTracerProvider(n.cfg.TracerProvider),
			otelgrpc.WithPropagators(tracePropagator))),
	}
	if n.cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(n.cfg.TLS)))
	}
	return append(opts, n.interceptors()...)
}

// Start listens on cfg.ListenAddr and serves in the background.
func (n *Node) Start() error {
	lis, err := net.Listen("tcp", n.cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("regionsvc: listen: %w", err)
	}
	opts := n.baseServerOptions()
	if n.replicated() {
		// Raft's transport shares the port; its options bound its streams.
		opts = append(opts, n.region.transport.ServerOptions()...)
		rs, err := replicator.NewServer(replicator.ServerConfig{Region: n.cfg.Region, Store: &mirrorStore{n: n},
			Now: n.cfg.Now, Logger: n.cfg.Logger, UncompressedBytesMax: n.cfg.frameBytesMax(),
			AuthorizeSource: n.authorizeMirrorSource})
		if err != nil {
			lis.Close()
			return fmt.Errorf("regionsvc: mirror server: %w", err)
		}
		n.replServer = rs
		// The Mirror service's keepalive policy and bounds; the receive
		// bound stays the larger one, given last.
		opts = append(opts, rs.ServerOptions()...)
	}
	n.advertise = n.cfg.AdvertiseAddr
	if n.advertise == "" {
		n.advertise = lis.Addr().String()
	}
	// The limits come last: their receive limit, near the batch bound,
	// is the one for every service on the port (Raft's messages and the
	// mirror's batches carry frames of at most a batch).
	opts = append(opts, n.limits.serverOptions(n.cfg.recvMsgBytesMax())...)
	n.conns = newLimitListener(lis, n.limits)
	n.grpcServer = grpc.NewServer(opts...)
	// The client API's services read requests once they hold a receive
	// slot (receive.go).
	n.grpcServer.RegisterService(n.limits.receiveGated(&geologv1.Log_ServiceDesc), &logServer{node: n})
	n.grpcServer.RegisterService(n.limits.receiveGated(&geologv1.Admin_ServiceDesc), &adminServer{node: n})
	geologinternalv1.RegisterNodeDirectoryServer(n.grpcServer, &directoryServer{node: n})
	geologinternalv1.RegisterRegionCatalogueServer(n.grpcServer, &catalogueServer{node: n}) // split_forward.go
	geologinternalv1.RegisterReplicaHintsServer(n.grpcServer, &hintServer{node: n})         // strayhint.go
	n.grpcServer.RegisterService(n.limits.receiveGated(&geologv1.Consumer_ServiceDesc), &consumerServer{node: n})
	healthpb.RegisterHealthServer(n.grpcServer, &healthServer{node: n}) // health.go
	if n.replicated() {
		n.region.transport.Register(n.grpcServer)
		n.replServer.Register(n.grpcServer)
		repl := newReplicationManager(n)
		n.repl.Store(repl)
		go repl.run()
		n.bookDone = make(chan struct{})
		go n.runAddrBook()
		if len(n.cfg.Regions) > 0 {
			n.tasks.Go(n.runRegionDir) // regiondir.go
		}
		n.tasks.Go(n.runWarmRegionConns) // regiondir.go: with one region too (forgetPeerConns)
		n.aclSyncDone = make(chan struct{})
		go n.runACLSync()
		if err := n.startHoming(); err != nil {
			lis.Close()
			return fmt.Errorf("regionsvc: homing: %w", err)
		}
	}
	n.listener = lis
	if n.replicated() && n.cfg.Zone != "" {
		n.tasks.Go(n.registerZone) // members_join.go
	}
	if n.replicated() && n.rebalancer != nil {
		n.tasks.Go(n.rebalancer.run) // rebalance.go
	}
	if n.replicated() {
		n.startRegionTasks()
	}
	n.cursors = newCursorService(n)
	go n.cursors.run()
	n.startCleaner()
	n.startResealer()
	go func() { n.serveErr <- n.grpcServer.Serve(n.conns) }()
	n.serving.Store(true)
	n.logger.Info("serving", "addr", lis.Addr().String(), "advertise", n.advertise, "region", n.cfg.Region, "tls", n.secure())
	return nil
}

// startRegionTasks starts the background tasks of a replicated node's
// catalogue and ranges.
func (n *Node) startRegionTasks() {
	n.tasks.Go(n.keepCatalogueVoters) // members_voters.go
	n.tasks.Go(n.registerAddress)     // members_move.go
	n.tasks.Go(n.collectStrays)       // strays.go
	n.tasks.Go(n.retryPendingHints)   // hintpending.go
	if len(n.cfg.Regions) > 0 {
		n.tasks.Go(n.recordMirrorSplits) // split_mirror.go: only a node with other regions mirrors
	}
	if n.cfg.SplitRangeBytes > 0 || n.cfg.SplitRangeRecordsPerSecond > 0 {
		n.tasks.Go(n.autoSplitRanges) // split_auto.go, split_load.go
	}
}

// Addr is the address the node listens on (after Start).
func (n *Node) Addr() string {
	if n.listener == nil {
		return ""
	}
	return n.listener.Addr().String()
}

// Close stops serving: subscribers are ended, every range makes what it has
// written durable and acks it, queued appends are refused with a retriable
// SHUTTING_DOWN, then the gRPC server stops (gracefully for up to 5 s).
// stopRanges stops every range driver of the node, the catalogue's too.
// A catalogue record applied while the first ones stop (applies run on the
// catalogue driver's goroutine) can open ranges after the node's ranges
// were listed, so it lists them again until a listing finds none left
// running: once the catalogue driver stopped, nothing opens more.
func (n *Node) stopRanges() {
	stopped := make(map[*rangeDriver]bool)
	for {
		n.mu.RLock()
		var next []*rangeDriver
		for _, st := range n.streams {
			for _, rd := range st.ranges {
				if rd != nil && !stopped[rd] {
					next = append(next, rd)
				}
			}
		}
		if n.replicated() && n.region.meta != nil && !stopped[n.region.meta] {
			next = append(next, n.region.meta)
		}
		n.mu.RUnlock()
		if len(next) == 0 {
			return
		}
		var wg sync.WaitGroup
		for _, rd := range next {
			stopped[rd] = true
			wg.Add(1)
			go func() { defer wg.Done(); rd.stop() }()
		}
		wg.Wait()
	}
}

func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		close(n.closing)
		n.tasks.Stop() // background calls end before what they call stops
		if n.bookDone != nil {
			<-n.bookDone
		}
		if n.aclSyncDone != nil {
			<-n.aclSyncDone
		}
		if n.cursors != nil {
			n.cursors.close() // before the ranges it proposes to stop
		}
		n.stopCleaner() // no rewrite runs under ranges about to close
		n.stopResealer()
		n.closeHoming()
		if repl := n.repl.Load(); repl != nil {
			repl.close() // no more shipping from ranges about to stop
		}
		if n.replServer != nil {
			n.replServer.Close()
		}
		n.stopRanges()
		if n.replicated() {
			close(n.region.stopCh)
			n.region.transport.Close()
		}
		if n.grpcServer != nil {
			stopped := make(chan struct{})
			go func() { n.grpcServer.GracefulStop(); close(stopped) }()
			select {
			case <-stopped:
			case <-time.After(5 * time.Second):
				n.grpcServer.Stop()
			}
		}
		n.peerConnsMu.Lock()
		for _, c := range n.peerConns {
			c.Close()
		}
		n.peerConnsMu.Unlock()
		if n.keyring != nil {
			n.keyring.Close()
		}
		if n.dirLock != nil {
			n.dirLock.Close()
		}
		n.logger.Info("node closed")
	})
	return nil
}

// rangeOf finds an open range, or returns a typed error.
func (n *Node) rangeOf(ctx context.Context, stream string, r uint32) (*rangeDriver, error) {
	d, _, err := n.rangeAndCount(ctx, stream, r)
	return d, err
}

// rangeAndCount is rangeOf, with the stream's key router (split.go).
func (n *Node) rangeAndCount(ctx context.Context, stream string, r uint32) (*rangeDriver, keyRouter, error) {
	if stream == "" {
		return nil, keyRouter{}, apierr.New(apierr.InvalidArgument, "stream name is empty")
	}
	st, err := n.lookupStream(ctx, stream)
	if err != nil {
		return nil, keyRouter{}, err
	}
	if r >= uint32(len(st.ranges)) {
		return nil, keyRouter{}, apierr.New(apierr.RangeNotFound, "stream %q has %d ranges; range %d does not exist", stream, len(st.ranges), r)
	}
	return st.ranges[r], st.spec.keyRouter(), nil
}

func (n *Node) createStream(ctx context.Context, req *geologv1.CreateStreamRequest) (*geologv1.StreamInfo, error) {
	if isInternalStream(req.GetName()) {
		return n.createInternalStream(ctx, req) // cursorstream.go
	}
	spec, err := specFromRequest(req, n.cfg.Region, n.cfg.Now().UnixNano())
	if err != nil {
		return nil, err
	}
	return n.createStreamFromSpec(ctx, wantFromRequest(req, spec))
}

// createStreamFromSpec creates a validated stream (w.spec), or answers a
// retry of the same create with the existing stream.
func (n *Node) createStreamFromSpec(ctx context.Context, w createWant) (*geologv1.StreamInfo, error) {
	spec := w.spec
	select {
	case <-n.closing:
		return nil, apierr.New(apierr.ShuttingDown, "node is shutting down")
	default:
	}
	if spec.hasRegion(n.cfg.Region) {
		// The node must be able to open every range: refused up front,
		// not accepted and left unopenable.
		release, err := n.reserveRanges(spec.RangeCount)
		if err != nil {
			return nil, err
		}
		defer release()
	}
	return n.createStreamRegions(ctx, w)
}

func (n *Node) listStreams() []*geologv1.StreamInfo {
	n.mu.RLock()
	defer n.mu.RUnlock()
	out := make([]*geologv1.StreamInfo, 0, len(n.streams))
	for _, st := range n.streams {
		if !isInternalStream(st.spec.Name) { // described by name only
			out = append(out, st.spec.info())
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// diskFullStatus is RangeInfo.status of a copy whose appends are refused
// for want of disk space: its log is whole and served.
const diskFullStatus = "appends refused: out of disk space (reads are served; appends resume once space is freed)"

func (n *Node) describeStream(ctx context.Context, name string) (*geologv1.DescribeStreamResponse, error) {
	if err := validateStreamNameOrInternal(name); err != nil {
		return nil, err
	}
	st, err := n.lookupStream(ctx, name)
	if err != nil {
		return nil, err
	}
	epochs, unavailable := n.rangeEpochs(ctx, st)
	resp := &geologv1.DescribeStreamResponse{Stream: st.spec.info(), EpochsUnavailable: unavailable}
	m := st.spec.rangeMap() // split ranges and their children too (split.go)
	for r, rd := range st.ranges {
		bounds, _ := m.Get(uint32(r))
		ri := &geologv1.RangeInfo{
			Range:      uint32(r),
			HashStart:  bounds.HashStart,
			HashEnd:    bounds.HashEnd,
			HomeRegion: rd.role().region,
			Epoch:      rd.role().epoch,
			Leader:     n.advertise,
			Status:     "ok",
			Epochs:     epochs[r],
		}
		if f := rd.failure.Load(); f != nil {
			ri.Status = f.Error()
		} else if rd.diskFull() {
			ri.Status = diskFullStatus
		}
		if rd.rep != nil {
			ri.Leader = n.clientAddr(n.cfg.Region, rd.rep.LeaderID())
			ri.Relearning = rd.rep.Relearning()
			ri.EpochUnplaced = rd.heardUnplaced()
			ri.NotMember = !rd.member()
		}
		ri.HomeLeader = n.homeLeaderAddr(rd)
		if rd.store != nil {
			ri.StartOffset = rd.store.StartOffset()
			ri.TailOffset = rd.committed.Load()
			ri.SizeBytes = rd.store.Size()
		}
		if f := rd.fenceNow(); f != nil {
			fence := f.offset
			ri.TimelineFenceOffset = &fence
		}
		ri.Replication = n.rangeReplication(st.spec, uint32(r), rd)
		describeSplit(ri, bounds) // split_describe.go
		resp.Ranges = append(resp.Ranges, ri)
	}
	resp.RangeMapVersion = m.Version
	return resp, nil
}

// Wait blocks until the gRPC server stops or ctx ends.
func (n *Node) Wait(ctx context.Context) error {
	select {
	case err := <-n.serveErr:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
