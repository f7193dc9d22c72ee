package sim

import (
	crand "crypto/rand"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/homing"
	"github.com/geolog/geolog/rangecore"
	"github.com/geolog/geolog/replica"
	"github.com/geolog/geolog/segment"
	"github.com/geolog/geolog/vfs"
	"github.com/hashicorp/go-hclog"
	"go.etcd.io/raft/v3/raftpb"
)

// Options configure a run. Zero values take the defaults named.
type Options struct {
	Seed int64
	// Steps is the number of virtual milliseconds under faults, default 3000.
	Steps int
	// Nodes is the region's size, default 3.
	Nodes int
	// Ranges is the number of Raft groups, default 2.
	Ranges int
	// Producers is the number of idempotent producers, default 4.
	Producers int
	// Regions is the number of regions of Nodes nodes each, default 1.
	// Every range is homed in region 0, where the producers write; each
	// other region mirrors it (its own Raft group per range), fed by the
	// home leader's replicator.Cursor over a virtual WAN (geo.go).
	Regions int
	// Logger receives the replicas' logs, default none.
	Logger hclog.Logger
	// Trace receives a line per event of the layers above the replicas
	// (trace.go), default none.
	Trace io.Writer
	// mutateNoSettle, in tests, configures the failover agents without
	// their settle wait (SettleNanos 0: the fix of a takeover right after
	// a lease-store outage, reverted).
	mutateNoSettle bool
	// mutateShortStart, in tests, makes the failover agents ask to
	// continue one offset below their tail (a taker that misreads it).
	mutateShortStart bool
	// mutateOrphanDrop, in tests, takes every fork's orphan log for one
	// that starts a record later, as if the fork had orphaned one record
	// less than it cut (orphans.go).
	mutateOrphanDrop bool
	// mutateSkew, in tests, sets region 0's clocks three times the max
	// clock offset homing assumes behind, the others' as much ahead.
	mutateSkew bool
	// mut, in tests, breaks this layer's code on purpose (reads.go).
	mut mutations
	// tamper, in tests, is called after every step until it returns
	// true: it breaks the system behind its checks, to show the checker
	// finds what it broke.
	tamper func(w *world) bool
	// holdWrite, in tests, holds node n's log write of range r while it
	// returns true (asked each virtual ms the write is due): a slow disk
	// placed on purpose, to open a window a test needs
	// (TestTakerInFlightIsChecked, TestTakerRelearningIsChecked).
	holdWrite func(w *world, n *node, r int) bool
	// batchRecords, in tests, is asked how many records producer p's
	// new batch of range r holds when it is about to start one (after
	// its draws, so the run's other draws stay as they were): 0 starts
	// none now, a negative count keeps the drawn 1-3. The model's
	// producers decide its frames' sizes; a test that needs a frame of
	// a given size at a given time places it with this
	// (TestLargerDivergentFrameIsForked).
	batchRecords func(w *world, p *producer, r int) int
}

// Result summarises a run.
type Result struct {
	Seed                                   int64
	Acked, Committed                       int
	Retries, Duplicates                    int
	Crashes, Partitions, Dropped, Duped    int
	LostReplies, LeaderChanges, Truncation int
	// AckedAhead counts acks a leader gave before its own log held the
	// batch (a quorum of followers had it durably; its write was queued).
	AckedAhead int
	// Compaction: whether the run compacted logs (small segments,
	// aggressive retention); segments deleted; snapshots sent, failed
	// (lost, or refused as busy or stale) and installed.
	Compaction                 bool
	SegmentsCompacted          int
	SnapshotsSent, SnapsFailed int
	SnapshotsInstalled         int
	// SnapsSourceChanged counts the failed snapshots whose sender's log
	// replaced the body's frames while it was read (a fork after the
	// snapshot was taken: replica.ErrSnapshotSourceChanged).
	SnapsSourceChanged int
	// Geo is what replication between regions did (Regions > 1).
	Geo GeoResult
	// Homing is what the leases and the lease store did (Regions > 1).
	Homing HomingResult
	// Orphans is what the orphan-log checks read (Regions > 1).
	Orphans OrphanResult
	// Moves is what replica moves, joins and drains did (moves.go).
	Moves MoveResult
	// Splits is what the split did (split.go).
	Splits SplitResult
	// QuiescedTicks counts the ticks a replica skipped quiesced
	// (driver.go).
	QuiescedTicks int
	// LeaderBalanceTicks is the run's leader balance interval in ticks (0:
	// off); BalanceTransfers counts the hand-offs to preferred leaders
	// (driver.go).
	LeaderBalanceTicks, BalanceTransfers int
	// VirtualMs is the virtual time the run covered: its faults, the
	// healing and the final checks.
	VirtualMs int64
}

func (r Result) String() string {
	return fmt.Sprintf("seed %d: %d acked (%d ahead of the leader's own write), %d committed, %d retries (%d answered as duplicates), %d crashes, %d partitions, %d messages dropped, %d duplicated, %d replies lost, %d leader changes; compaction %v: %d segments compacted, %d snapshots sent, %d failed (%d by a fork under the body), %d installed",
		r.Seed, r.Acked, r.AckedAhead, r.Committed, r.Retries, r.Duplicates, r.Crashes, r.Partitions, r.Dropped, r.Duped, r.LostReplies, r.LeaderChanges,
		r.Compaction, r.SegmentsCompacted, r.SnapshotsSent, r.SnapsFailed, r.SnapsSourceChanged, r.SnapshotsInstalled) + fmt.Sprintf("; %d ticks skipped quiesced; leader balance every %d ticks: %d transfers", r.QuiescedTicks, r.LeaderBalanceTicks, r.BalanceTransfers) + r.Geo.String() + r.Homing.String() + r.Orphans.String() + r.Moves.String() + r.Splits.String()
}

const (
	tickMs        = 10
	startUnixNano = int64(1_800_000_000) * 1e9
	replyTimeout  = 400 // ms before a producer resends an unanswered batch
	settleMsMax   = 60_000
)

// event is something due at a virtual time: a Raft message, a producer
// request reaching a node, or a reply reaching a producer.
type event struct {
	at   int64
	seq  uint64
	kind int
	// Raft message
	region int // of the nodes to and from (Raft never leaves a region)
	group  int
	to     int
	msg    *raftpb.Message
	// request / reply
	producer int
	pid      int // the producer's id for the range when it sent the request
	rng      int
	attempt  uint64
	batchSeq uint64   // reply: the batch's base sequence
	count    int      // reply: the batch's record count
	values   []string // reply: the batch's records (a split child's are named in its parent: children.go)
	res      replica.Result
	// snapshot
	from    int
	fromGen int
	body    io.ReadCloser
	snapErr error
	// replication between regions (evGeo, evGeoConnect)
	geo *geoMsg
	// evFunc: what a node's driver runs then (gate.go)
	fn func()
}

const (
	evRaft = iota
	evRequest
	evReply
	evSnap       // a MsgSnap and its body reach their receiver
	evSnapStatus // a snapshot's outcome reaches its sender
	evWrite      // a replica's log writer runs (WriteLog) on what is queued
	evGeo        // a replication stream's message crosses the WAN (geo.go)
	evGeoConnect // a cursor's Connect action, after its delay
	evFunc       // a node's driver runs fn (gate.go), unless it crashed since
)

type node struct {
	region   int
	id       int // the Raft id, within the region: 1..Nodes
	gen      int // incarnation: +1 on every start
	fs       *vfs.Mem
	up       bool
	downTill int64
	cutTill  int64
	stores   []*segment.Store
	replicas []*replica.Replica
	// drivers run, per range, the range driver's loop body on the
	// replica (driver.go); down is the node's view of its region's peers
	// (by Raft id - 1) at its last tick.
	drivers  []*rangecore.Driver
	down     []bool
	verified []uint64 // per range: committed offsets already checked
	// served is, per range, the highest committed end the node has
	// published in any incarnation: it never publishes less (invariant 8).
	served  []uint64
	writing []bool // per range: an evWrite is due
	dying   bool   // a Sync was where the process died (syncCrashLog)
	opening bool   // restartDue is starting it (syncCrashLog)
	cutWAN  bool   // its partition cuts it off the WAN too (geo.go)
	// mirror serving, per range (regions other than the home; geo.go):
	// requests waiting for the one being applied, as the replicator's
	// Server serializes a range's requests.
	mirror []mirrorQueue
	// gates are, per range, the epoch start gates of this incarnation
	// (gate.go).
	gates []rangecore.StartGate[*gateOp]
	// timelines are, per range, the timeline fences' knowledge of epoch
	// starts of this incarnation (fence.go).
	timelines []rangecore.Timeline
	// core is the node's liveness lease and view of its region's homes
	// (Regions > 1; homing.go); epochs is, per range, the highest homing
	// epoch its replica held in this incarnation (it never goes back).
	core   *homing.Core
	epochs []uint64
	// fresh is, per range, the epoch whose fork point its log (this
	// incarnation) was seen to hold that epoch at: not stale.
	fresh []uint64
	// forkEpoch is, per range, the epoch of the last fork seen applied
	// on the node (any incarnation): its committed end fell back then.
	forkEpoch []uint64
	// divergence caches, per range, divergent's last answer and what it
	// depended on (divergentCached).
	divergence []divergence
	// logStart is, per range, the highest start offset its log was seen
	// at, in any incarnation (orphans.go: retention may have deleted part
	// of a divergent tail before the fork).
	logStart []uint64
	// tailChecked is, per range, the committed end checkStaleTail last
	// looked at (this incarnation).
	tailChecked []uint64
	// downLogEpoch is, per range, the epoch its log ended in when it last
	// went down (geo.go resendPoint: a down copy's resend point).
	downLogEpoch []uint64
	// links are its transport's senders towards its region's peers, its
	// failure detector (detector.go).
	links peerLinks
	// confs are, per range, its replica's configuration as last read
	// (moves.go node.conf); orphans its orphan stores (Regions > 1).
	confs   []confSeen
	orphans []*replica.OrphanStore
	// tailEpochs are, per range, its log's epoch at its committed end as
	// last read (geo.go tailEpoch).
	tailEpochs []tailEpochSeen
}

// pid is the producer's id for range r in its current incarnation.
func (p *producer) pid(r int) int { return p.id + 100*p.inc[r] }

// baseEpoch is a frame's base offset and homing epoch.
type baseEpoch struct{ base, epoch uint64 }

// errSyncCrash is what a replica sees from the Sync its process dies in.
var errSyncCrash = errors.New("sim: the process dies in fdatasync")

// syncCrashLog is a range's log as the replica sees it: now and then a
// Sync is where the process dies, after the frames were written and before
// any of them is durable. The replica sees an error (it must neither ack
// nor send anything that waited for the write), and the simulator crashes
// the node before anything else runs, so what was written is lost as a
// crash loses it.
type syncCrashLog struct {
	*segment.Store
	w *world
	n *node
}

func (l *syncCrashLog) Sync() error {
	p := l.w.syncCrashP
	if l.n.opening && p > 0 {
		p = max(p, l.w.opt.mut.startSyncCrashP)
	}
	if l.w.rng.Float64() < p {
		l.n.dying = true
		return errSyncCrash
	}
	return l.Store.Sync()
}

// failed handles an error from a replica of n: the node dies if a Sync
// said so, else the run fails.
func (w *world) failed(n *node, r int, err error) {
	if n.dying {
		w.crash(n)
		return
	}
	w.err = fmt.Errorf("%v range %d: %w", n, r, err)
}

type inflight struct {
	seq     uint64
	values  []string
	attempt uint64
	sentAt  int64
	target  int
	hinted  bool // target is a NOT_LEADER's hint (moves.go)
}

type producer struct {
	id int
	// inc is, per range, the producer's incarnation: a takeover that
	// orphaned what it appended makes it start over as a new idempotent
	// producer (pid), as its sequence would otherwise show a gap.
	inc     []int
	home    []int // per range: the home region it believes in
	nextSeq []uint64
	batch   []*inflight
}

type world struct {
	opt    Options
	rng    *rand.Rand
	now    int64
	evSeq  uint64
	events eventHeap
	nodes  []*node
	prods  []*producer
	res    Result

	dropP, dupP, lostReplyP, crashP, cutP float64
	// syncCrashP is the chance that a replica's log Sync is where its
	// process dies (syncCrashLog).
	syncCrashP float64
	// balanceTicks is the run's leader balance interval (drawBalance; 0:
	// off).
	balanceTicks int
	// compaction runs: segment size, retention, compaction period.
	compaction      bool
	segmentBytesMax int64
	retentionBytes  int64
	retentionAge    time.Duration
	// counters of replicas that crashed (their Stats die with them)
	compactedBefore, installedBefore int

	canonical [][]string          // per range, the committed log
	acked     []map[uint64]string // per range: offset → value acked (ack, unack)
	// ackedEnds caches, per range, the end of what is acked (ackedEnd);
	// -1: to recompute.
	ackedEnds []int64
	lastSeq   []map[int]int64     // per range: producer → last sequence in canonical order
	seen      []map[string]uint64 // per range: value → offset
	leaders   []uint64            // per range: last leader seen
	// canonFrames is, per range, the home's committed frames by base
	// offset: what every mirror's frame at that offset must equal.
	canonFrames []map[uint64][]byte
	// homeCommitted is, per range, the highest committed end a home
	// replica was seen to publish (by the checks, or by a source when it
	// read): no mirror may commit past it.
	homeCommitted []uint64
	// lastEpoch is, per range, the home's frame with the highest base
	// offset seen, and its homing epoch.
	lastEpoch  []baseEpoch
	geo        *geoWorld    // Regions > 1
	homing     *homeWorld   // Regions > 1
	orphanLogs *orphanWorld // Regions > 1
	moves      *moveWorld   // Regions 1, one run in two (moves.go)
	splits     *splitWorld  // Regions 1, one run in two (split.go)
	// perRegion is the nodes of a region: Nodes and the spares that join
	// during the run (moves.go).
	perRegion int
	tampered  bool
	traceLead map[[2]int]string // trace.go: leaders last traced
	// spareEvents are delivered Raft events for raftEvent to reuse.
	spareEvents []*event
	// mutateNoLease, set by a test, makes home nodes admit and ack
	// appends without their lease: the fencing check must report it.
	mutateNoLease bool
	err           error
}

// Run simulates one seed and returns an error naming the first invariant
// violated.
func Run(opt Options) (res Result, err error) {
	opt = opt.withDefaults()
	w := &world{opt: opt, rng: rand.New(rand.NewPCG(uint64(opt.Seed), 0x9e3779b97f4a7c15))}
	w.res.Seed = opt.Seed
	// etcd raft draws election jitter from crypto/rand.Reader.
	saved := crand.Reader
	crand.Reader = rngReader{w.rng}
	defer func() { crand.Reader = saved }()
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("seed %d: panic: %v\n%s", opt.Seed, p, debug.Stack())
		}
	}()
	w.drawFaults()
	w.drawBalance() // driver.go
	w.moves = newMoveWorld(w)
	w.splits = newSplitWorld(w)
	defer w.moves.stop()
	if err := w.build(); err != nil {
		return w.res, err
	}
	for ; w.now < int64(opt.Steps) && w.err == nil; w.now++ {
		w.injectFaults()
		w.step()
	}
	w.heal()
	deadline := w.now + settleMsMax
	for ; w.err == nil && w.now < deadline && w.busy(); w.now++ {
		w.step()
	}
	if w.err == nil && w.busy() {
		w.err = fmt.Errorf("liveness: producers still waiting %d ms after the faults ended", settleMsMax)
		if err := w.moves.final(); w.moves.on && err != nil {
			w.err = fmt.Errorf("liveness: %d moves under way %d ms after the faults ended: %w", len(w.moves.moves), settleMsMax, err)
		}
	}
	if w.err == nil {
		w.err = w.finalCheck()
	}
	w.tally()
	if w.err != nil {
		return w.res, fmt.Errorf("seed %d at %d ms: %w", opt.Seed, w.now, w.err)
	}
	return w.res, nil
}

func (opt Options) withDefaults() Options {
	if opt.Steps == 0 {
		opt.Steps = 3000
	}
	if opt.Nodes == 0 {
		opt.Nodes = 3
	}
	if opt.Ranges == 0 {
		opt.Ranges = 2
	}
	if opt.Producers == 0 {
		opt.Producers = 4
	}
	if opt.Regions == 0 {
		opt.Regions = 1
	}
	if opt.Logger == nil {
		opt.Logger = hclog.NewNullLogger()
	}
	return opt
}

// drawFaults draws the run's fault rates and its compaction settings.
// A run of one region draws nothing more than before regions came, so
// that its seeds replay as they did.
func (w *world) drawFaults() {
	w.dropP = w.rng.Float64() * 0.1
	w.dupP = w.rng.Float64() * 0.05
	w.lostReplyP = w.rng.Float64() * 0.1
	w.crashP = w.rng.Float64() * 0.002
	w.cutP = w.rng.Float64() * 0.002
	w.syncCrashP = w.rng.Float64() * 0.0005
	// Half the seeds compact: tiny segments and aggressive retention, so
	// that crashed and cut-off replicas fall behind the compaction point
	// and catch up by snapshot.
	w.segmentBytesMax = 16 << 10
	if w.compaction = w.rng.IntN(2) == 0; w.compaction {
		w.segmentBytesMax = segment.SegmentBytesMaxMin << w.rng.IntN(2)
		w.retentionBytes = w.segmentBytesMax * (1 + w.rng.Int64N(3))
		if w.rng.IntN(2) == 0 {
			w.retentionAge = time.Duration(200+w.rng.IntN(800)) * time.Millisecond
		}
	}
	w.res.Compaction = w.compaction
	if w.opt.Regions > 1 {
		w.geo = newGeoWorld(w)
		w.homing = newHomeWorld(w)
		w.orphanLogs = newOrphanWorld(w.opt.Ranges)
	}
}

// build creates the per-range tables, starts every node of every region
// and creates the producers.
func (w *world) build() error {
	opt := w.opt
	w.canonical = make([][]string, opt.Ranges)
	w.acked = make([]map[uint64]string, opt.Ranges)
	w.ackedEnds = make([]int64, opt.Ranges)
	w.lastSeq = make([]map[int]int64, opt.Ranges)
	w.seen = make([]map[string]uint64, opt.Ranges)
	w.leaders = make([]uint64, opt.Ranges)
	w.canonFrames = make([]map[uint64][]byte, opt.Ranges)
	w.homeCommitted = make([]uint64, opt.Ranges)
	w.lastEpoch = make([]baseEpoch, opt.Ranges)
	for r := 0; r < opt.Ranges; r++ {
		w.acked[r] = map[uint64]string{}
		w.lastSeq[r] = map[int]int64{}
		w.seen[r] = map[string]uint64{}
		w.canonFrames[r] = map[uint64][]byte{}
	}
	if w.homing != nil {
		if err := w.homing.build(); err != nil {
			return err
		}
	}
	for g := 0; g < opt.Regions; g++ {
		for i := 0; i < w.perRegion; i++ {
			src := w.rng
			if i >= opt.Nodes {
				src = w.moves.rng // a spare: the run's other draws stay as they were
			}
			n := &node{region: g, id: i + 1, fs: vfs.NewMem(rand.New(rand.NewPCG(src.Uint64(), src.Uint64()))), served: make([]uint64, opt.Ranges),
				forkEpoch: make([]uint64, opt.Ranges), logStart: make([]uint64, opt.Ranges)}
			w.nodes = append(w.nodes, n)
			if i >= opt.Nodes {
				n.downTill = w.moves.joinAt[i-opt.Nodes] // it joins then
				continue
			}
			if err := w.start(n); err != nil {
				return err
			}
		}
	}
	for i := 0; i < opt.Producers; i++ {
		p := &producer{id: i + 1, nextSeq: make([]uint64, opt.Ranges), batch: make([]*inflight, opt.Ranges),
			inc: make([]int, opt.Ranges), home: make([]int, opt.Ranges)}
		w.prods = append(w.prods, p)
	}
	if w.geo != nil {
		w.geo.build()
	}
	return nil
}

// heal restarts every node, ends partitions and stops the faults: every
// producer must get its batches acked, every mirror catch up.
func (w *world) heal() {
	for _, n := range w.nodes {
		n.cutTill = 0
		if !n.up && w.err == nil && !w.moves.gone(n) { // gone: dead.go
			w.err = w.start(n)
		}
	}
	w.dropP, w.dupP, w.lostReplyP = 0, 0, 0
	w.syncCrashP = 0 // a crash in fdatasync is a fault too (seed 711699 died in one 1 s before the final check)
	if w.geo != nil {
		w.geo.heal()
		w.homing.heal()
	}
}

// tally adds up the run's counters.
func (w *world) tally() {
	w.res.VirtualMs = w.now
	w.res.Moves = w.moves.res
	w.res.Splits = w.splits.result()
	for r := range w.canonical {
		w.res.Committed += len(w.canonical[r])
	}
	for _, n := range w.nodes {
		for _, rep := range n.replicas {
			st := rep.Stats()
			w.res.SegmentsCompacted += int(st.SegmentsCompacted)
			w.res.SnapshotsInstalled += int(st.SnapshotsInstalled)
		}
	}
	w.res.SegmentsCompacted += w.compactedBefore
	w.res.SnapshotsInstalled += w.installedBefore
}

// node returns node id (1..Nodes, then the spares: moves.go) of region g.
func (w *world) node(g, id int) *node { return w.nodes[g*w.perRegion+id-1] }

// regionNodes returns region g's nodes.
func (w *world) regionNodes(g int) []*node {
	return w.nodes[g*w.perRegion : (g+1)*w.perRegion]
}

func (n *node) String() string {
	if n.region == 0 {
		return fmt.Sprintf("node %d", n.id)
	}
	return fmt.Sprintf("region %d node %d", n.region, n.id)
}

// rngReader feeds crypto/rand.Reader from the run's seeded generator.
type rngReader struct{ r *rand.Rand }

func (g rngReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(g.r.Uint32())
	}
	return len(p), nil
}

func (w *world) clock() time.Time { return time.Unix(0, startUnixNano+w.now*int64(time.Millisecond)) }

func (w *world) start(n *node) error {
	n.up = true
	n.gen++
	w.moves.started(n)
	ranges := len(w.canonical) // Ranges, and the children of a split (children.go)
	n.stores = make([]*segment.Store, ranges)
	n.replicas = make([]*replica.Replica, ranges)
	n.drivers, n.down = make([]*rangecore.Driver, ranges), nil
	n.verified = make([]uint64, ranges)
	n.writing = make([]bool, ranges)
	n.dying = false
	n.mirror = make([]mirrorQueue, ranges)
	n.gates = make([]rangecore.StartGate[*gateOp], ranges)
	n.timelines = make([]rangecore.Timeline, ranges)
	n.epochs = make([]uint64, ranges)
	n.fresh = make([]uint64, ranges)
	n.divergence = make([]divergence, ranges)
	n.tailChecked = make([]uint64, ranges)
	if w.homing != nil {
		if err := w.homing.startNode(n); err != nil {
			return err
		}
	}
	for r := 0; r < ranges; r++ {
		if err := w.openReplica(n, r); err != nil {
			return err
		}
	}
	return nil
}

// openReplica opens node n's replica of range r: its log, its state and
// its Raft group of the range's first voters (1..Nodes, or a split
// child's: children.go).
func (w *world) openReplica(n *node, r int) error {
	peers := w.splits.peers(r)
	if peers == nil {
		peers = make([]uint64, w.opt.Nodes)
		for i := range peers {
			peers[i] = uint64(i + 1)
		}
	}
	dir := filepath.Join("/data", strconv.Itoa(r))
	if err := w.moves.stray(n, r, replica.FileState{FS: n.fs, Dir: dir}); err != nil {
		return err
	}
	var headers []batch.Header
	st, err := segment.Open(segment.Config{
		Dir: dir, FS: n.fs, SegmentBytesMax: w.segmentBytesMax, Logger: w.opt.Logger, Now: w.clock,
		RetentionBytes: w.retentionBytes, RetentionAge: w.retentionAge,
		OnRecover: func(h batch.Header) error { headers = append(headers, h); return nil },
	})
	if err != nil {
		return fmt.Errorf("%v range %d: open after crash: %w", n, r, err)
	}
	var orphans *replica.OrphanStore
	if w.geo != nil {
		if orphans, err = replica.OpenOrphans(n.fs, filepath.Join(dir, replica.OrphanDirName), w.opt.Logger); err != nil {
			return fmt.Errorf("%v range %d: open orphans: %w", n, r, err)
		}
	}
	region, group, from, gen := n.region, r, n.id, n.gen
	// The replicas elect as the product's do: by succession
	// (replica/succession.go) beside Raft's random timer.
	rep, err := replica.New(replica.Config{
		NodeID: uint64(n.id), Stream: "sim", Range: uint32(r), Peers: peers, HeartbeatTick: 2, ElectionTick: 8,
		Log: &syncCrashLog{Store: st, w: w, n: n}, State: replica.FileState{FS: n.fs, Dir: dir}, Orphans: orphans,
		Send: func(msgs []*raftpb.Message) { w.sendRaft(region, group, msgs) },
		SendSnapshot: func(m *raftpb.Message, body io.ReadCloser) error {
			return w.sendSnapshot(region, group, from, gen, m, body)
		},
		Now: w.clock, Logger: w.opt.Logger,
	}, headers)
	if err != nil {
		return fmt.Errorf("%v range %d: %w", n, r, err)
	}
	n.stores[r], n.replicas[r] = st, rep
	if orphans != nil {
		if len(n.orphans) <= r {
			n.orphans = append(n.orphans, make([]*replica.OrphanStore, r+1-len(n.orphans))...)
		}
		n.orphans[r] = orphans
	}
	n.drivers[r] = w.newDriver(n, r, rep) // driver.go
	if w.tracing() {
		f, ok := rep.LearnedCompactionFloor()
		w.tracef("%s range %d: start gen %d (committed %d, log [%d, %d), learned floor %d %v)", traceName(n), r, n.gen, rep.Committed(), st.StartOffset(), st.NextOffset(), f, ok)
	}
	return nil
}

// crash loses everything not synced: the node restarts on what its disk
// kept.
func (w *world) crash(n *node) {
	for _, rep := range n.replicas {
		if rep == nil {
			continue // not opened yet: the process died in its start-up
		}
		st := rep.Stats()
		w.compactedBefore += int(st.SegmentsCompacted)
		w.installedBefore += int(st.SnapshotsInstalled)
	}
	if w.geo != nil {
		w.geo.noteDown(n)
	}
	if w.tracing() {
		for r, rep := range n.replicas {
			if rep == nil {
				w.tracef("%s range %d: crash before it opened", traceName(n), r)
				continue
			}
			w.tracef("%s range %d: crash (leader %v, committed %d, log [%d, ...), epoch %d)", traceName(n), r, rep.IsLeader(), rep.Committed(), n.stores[r].StartOffset(), rep.HighestEpoch())
		}
	}
	n.up = false
	n.fs = n.fs.Crash()
	n.stores, n.replicas, n.mirror, n.gates, n.timelines = nil, nil, nil, nil, nil
	n.drivers = nil
	n.downTill = w.now + 50 + w.rng.Int64N(1000)
	w.res.Crashes++
}

func (w *world) push(e *event) {
	if m := w.opt.mut.eventsMax; m > 0 && w.evSeq >= m && w.err == nil {
		w.err = fmt.Errorf("liveness: %d events queued (a Raft group's message storm)", m)
	}
	w.evSeq++
	e.seq = w.evSeq
	w.events.push(e)
}

// raftEvent returns the event of Raft message m reaching node to of
// region g's range group at, reusing one delivered before: Raft messages
// are most of the events, and nothing keeps their event once delivered.
func (w *world) raftEvent(at int64, g, group, to int, m *raftpb.Message) *event {
	var e *event
	if k := len(w.spareEvents); k > 0 {
		e, w.spareEvents = w.spareEvents[k-1], w.spareEvents[:k-1]
	} else {
		e = new(event)
	}
	*e = event{at: at, kind: evRaft, region: g, group: group, to: to, msg: m}
	return e
}

// spareEvent keeps delivered Raft event e for raftEvent.
func (w *world) spareEvent(e *event) {
	*e = event{}
	w.spareEvents = append(w.spareEvents, e)
}

func (w *world) sendRaft(region, group int, msgs []*raftpb.Message) {
	for _, m := range msgs {
		from, to := int(m.GetFrom()), int(m.GetTo())
		w.linkSent(region, from, to) // detector.go
		if replica.IsFloorMessage(m) {
			w.sendFloor(region, group, m) // floor.go: no draw
			continue
		}
		if w.rng.Float64() < w.dropP || w.cut(region, from) || w.cut(region, to) {
			w.res.Dropped++
			continue
		}
		copies := 1
		if w.rng.Float64() < w.dupP {
			copies = 2
			w.res.Duped++
		}
		for c := 0; c < copies; c++ {
			w.push(w.raftEvent(w.now+1+w.rng.Int64N(8), region, group, to, cloneMessage(m)))
		}
	}
}

// cut reports whether node id of region g is cut off from its region.
func (w *world) cut(g, id int) bool {
	return id >= 1 && id <= w.perRegion && w.node(g, id).cutTill > w.now
}

// restartDue restarts crashed nodes whose downtime is over.
func (w *world) restartDue() {
	for _, n := range w.nodes {
		if !n.up && w.now >= n.downTill && w.err == nil {
			n.opening = true
			err := w.start(n)
			n.opening = false
			if err != nil && n.dying {
				// The process died in an fdatasync of its start-up (a
				// fork or a snapshot completed at open): down again,
				// the ranges it did not open yet as they were.
				w.crash(n)
			} else if err != nil {
				w.err = err
			}
		}
	}
}

// injectFaults crashes nodes and cuts them off, at the run's rates.
func (w *world) injectFaults() {
	if w.rng.Float64() < w.crashP {
		n := w.nodes[w.rng.IntN(len(w.nodes))]
		if n.up {
			w.crash(n)
		}
	}
	if w.rng.Float64() < w.cutP {
		n := w.nodes[w.rng.IntN(len(w.nodes))]
		n.cutTill = w.now + 100 + w.rng.Int64N(1500)
		if w.geo != nil {
			n.cutWAN = w.rng.IntN(2) == 0
		}
		w.res.Partitions++
	}
	if w.geo != nil {
		w.geo.injectFaults()
		w.homing.injectFaults()
	}
}

// step advances one virtual millisecond.
func (w *world) step() {
	w.restartDue()
	w.watchLinks() // detector.go
	if w.now%tickMs == 0 {
		w.tickDrivers() // driver.go
	}
	if w.compaction && w.now%compactMs == compactMs/4 { // between ticks
		w.compact()
	}
	// Deliver what is due, in (time, sequence) order; what the deliveries
	// queue waits for the next step, even if due now.
	last := w.evSeq
	for len(w.events) > 0 && w.events[0].at <= w.now && w.events[0].seq <= last {
		w.deliver(w.events.pop())
	}
	if !w.readyAll() {
		return
	}
	w.traceLeaders()
	if w.geo != nil {
		w.homing.step()
		w.geo.step()
	}
	if w.opt.tamper != nil && !w.tampered {
		w.tampered = w.opt.tamper(w)
	}
	w.moves.step()
	w.splits.step()
	w.produce()
	if w.err == nil {
		w.err = w.check()
	}
}

// readyAll runs every replica's Ready cycles (rangecore.Driver.Cycle: the
// driver's AfterReady schedules the writes, or fails the run); false if
// the run failed.
func (w *world) readyAll() bool {
	if w.err != nil {
		return false
	}
	for _, n := range w.nodes {
		for r, rep := range n.replicas {
			if rep.HasReady() && !w.readyOne(n, r) {
				if w.err != nil {
					return false
				}
				break // the node died
			}
			if n.region == w.homeRegion(r) && rep.IsLeader() && w.leaders[r] != uint64(n.id) {
				w.leaders[r] = uint64(n.id)
				w.res.LeaderChanges++
			}
		}
	}
	return true
}

func (w *world) deliver(e *event) {
	switch e.kind {
	case evRaft:
		defer w.spareEvent(e)
		n := w.node(e.region, e.to)
		if !n.up || w.cut(e.region, e.to) {
			w.res.Dropped++
			return
		}
		w.stepRaft(n, e.group, e.msg) // driver.go
	case evRequest:
		w.request(e)
	case evReply:
		w.reply(e)
	case evSnap:
		w.deliverSnapshot(e)
	case evSnapStatus:
		n := w.node(e.region, e.from)
		if n.up && n.gen == e.fromGen {
			n.replicas[e.group].ReportSnapshot(uint64(e.to), e.snapErr)
		}
	case evWrite:
		n := w.node(e.region, e.to)
		if !n.up || n.gen != e.fromGen {
			return // the writes died with the process
		}
		if w.opt.holdWrite != nil && w.opt.holdWrite(w, n, e.group) {
			e.at = w.now + 1
			w.push(e) // held: n.writing stays set
			return
		}
		n.writing[e.group] = false
		if err := n.replicas[e.group].WriteLog(); err != nil {
			w.failed(n, e.group, fmt.Errorf("write log: %w", err))
			return
		}
		// What it made durable here is stepped and answered at once
		// (regionsvc's loop on LogWritten).
		w.logWritten(n, e.group) // driver.go
	case evGeo:
		w.geo.deliver(e.geo)
	case evGeoConnect:
		w.geo.connect(e.geo)
	case evFunc:
		if n := w.node(e.region, e.to); n.up && n.gen == e.fromGen {
			e.fn()
		}
	}
}

// scheduleWrite runs a replica's log writer after a virtual disk latency
// (the driver's log-writer goroutine, fsync included): meanwhile the
// replica steps messages, proposes and runs Ready cycles, whose writes
// join the queue and go with the same WriteLog. Now and then the disk is
// slow, long enough for a leader to commit on its followers' acks alone
// and for messages to pile up behind the write. A crash loses what is
// queued.
func (w *world) scheduleWrite(n *node, r int) {
	if n.writing[r] || !n.replicas[r].HasLogWrites() {
		return
	}
	n.writing[r] = true
	delay := w.rng.Int64N(3)
	if w.rng.Float64() < 0.05 {
		delay = 5 + w.rng.Int64N(30)
	}
	w.push(&event{at: w.now + delay, kind: evWrite, region: n.region, group: r, to: n.id, fromGen: n.gen})
}
