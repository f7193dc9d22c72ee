package sim

import (
	"context"
	"fmt"
	"strconv"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/homing"
	"math/rand/v2"
)

// Homing (Regions > 1): every range has a home record in the real
// homing.MemStore (the lease store's in-memory twin), created in region
// 0 at epoch 1. Every node of every region runs the real liveness core
// (homing.Core) on the virtual clock: its heartbeats are synchronous
// calls to the store (MemStore answers at once; it reads no clock: the
// readings come in the requests). A home node admits an append only
// under its lease (View.Check, as regionsvc's admit), proposes it at the
// lease's epoch and acks it only if the lease still holds at that epoch
// (regionsvc's leaseCheck). The store has outages (MemStore.SetDown);
// a node cut off the WAN, or in a region cut off it, cannot reach it.

// Virtual-time constants of homing (milliseconds).
const (
	leaseTTLMs       = 1000
	heartbeatMs      = 200
	heartbeatRetryMs = 100
	maxOffsetMs      = 50
)

// HomingResult counts what homing did in a run.
type HomingResult struct {
	// Heartbeats counts heartbeats sent, Failed those that failed;
	// Outages the lease-store outages; Refused the appends refused for
	// want of a lease (at admission or at the ack).
	Heartbeats, Failed, Outages, Refused int
	// Failovers counts home regions cut off past a lease TTL, Takeovers
	// the ranges taken over, Orphaned the acked records past a fork
	// point (acked by the old home, never replicated), Abandoned the
	// producers' batches left unanswered when a range's new home was
	// not serving (this layer).
	Failovers, Takeovers, Orphaned, Abandoned int
	// SecondTakeovers counts takeovers of a range already taken over,
	// DivergentTakers the tails surveyed that a divergent tail made no
	// candidate (homeWorld.regionTail).
	SecondTakeovers, DivergentTakers int
	// InFlightTakers counts the tails surveyed while the region's group
	// held more than the copy read (an apply in flight, a leader's log
	// past its committed end, a follower behind: agent.candidateTail):
	// candidates, whose start the new home raises.
	InFlightTakers int
	// RelearningTakers counts the tails surveyed in which a copy
	// relearning its commit index held a divergent tail its lowered
	// committed end hid: its log ends in an epoch older than the range's
	// and runs past where the range's log left that epoch, its committed
	// end at or below it (homeWorld.regionTail passes the copy over;
	// Options.mut.takerRelearning counts it at that end). Not in String,
	// so that the pinned schedule digests stay as they were.
	RelearningTakers int
	// StartsRaised counts epoch starts a new home raised to its log's
	// end, StartWaits the start gate's rounds run again (something in
	// flight) and the held appends it refused (gate.go).
	StartsRaised, StartWaits int
	// HomeForks counts new homes' leaders that forked their own log's
	// divergent tail off before their epoch's first frame (gate.go).
	HomeForks int
	// DivergedBelow counts confirmations refused because the log
	// diverges below the recorded start (rangecore.StartDivergedBelow:
	// no sound takeover records such a start; a range so refused stays
	// refused).
	DivergedBelow int
	// NewHomeAcks counts records acked by a new home, at an epoch above 1.
	NewHomeAcks int
	// Forks counts forks seen applied (a replica cut a divergent tail
	// into its orphan log).
	Forks int
	// Reads is what the readers did (reads.go), Rehomes the planned
	// rehomes (rehome.go).
	Reads    ReadResult
	Rehomes  RehomeResult
	Replaced ReplaceResult // replace.go
}

func (h HomingResult) String() string {
	if h == (HomingResult{}) {
		return ""
	}
	return fmt.Sprintf("; homing: %d heartbeats (%d failed), %d lease-store outages, %d appends refused without a lease, %d home regions cut off, %d ranges taken over (%d a second time; %d divergent copies no candidate, %d copies applying taken), %d acked records orphaned, %d batches abandoned, %d records acked by a new home, %d replicas forked",
		h.Heartbeats, h.Failed, h.Outages, h.Refused, h.Failovers, h.Takeovers, h.SecondTakeovers, h.DivergentTakers, h.InFlightTakers, h.Orphaned, h.Abandoned, h.NewHomeAcks, h.Forks) +
		fmt.Sprintf(", %d epoch starts raised (%d appends waited, %d divergent tails of a new home forked, %d starts above a divergence refused)", h.StartsRaised, h.StartWaits, h.HomeForks, h.DivergedBelow) + h.Reads.String() + h.Rehomes.String() + h.Replaced.String()
}

// add sums two runs' counters.
func (h HomingResult) add(o HomingResult) HomingResult {
	h.Heartbeats += o.Heartbeats
	h.Failed += o.Failed
	h.Outages += o.Outages
	h.Refused += o.Refused
	h.Failovers += o.Failovers
	h.Takeovers += o.Takeovers
	h.Orphaned += o.Orphaned
	h.Abandoned += o.Abandoned
	h.Forks += o.Forks
	h.SecondTakeovers += o.SecondTakeovers
	h.DivergentTakers += o.DivergentTakers
	h.InFlightTakers += o.InFlightTakers
	h.RelearningTakers += o.RelearningTakers
	h.StartsRaised += o.StartsRaised
	h.HomeForks += o.HomeForks
	h.DivergedBelow += o.DivergedBelow
	h.StartWaits += o.StartWaits
	h.NewHomeAcks += o.NewHomeAcks
	h.Reads = h.Reads.add(o.Reads)
	h.Rehomes = h.Rehomes.add(o.Rehomes)
	h.Replaced = h.Replaced.add(o.Replaced)
	return h
}

// homeWorld is the lease store, the truth of each range's home, and the
// lease-store outages.
type homeWorld struct {
	w     *world
	store *homing.MemStore
	// homes is, per range, the home record as the simulator last saw the
	// store grant it: what the checks hold acks against.
	homes    []homing.Home
	outageP  float64
	downTill int64
	homeIdx  []int // per range: the index of homes[r].Region
	// orphans is, per range, the acked records counted as orphaned, by
	// value: the offset the old home acked them at, and its region.
	orphans []map[string]orphaned
	// failAt is when the home region is cut off (-1: never), failFor
	// for how long.
	failAt, failFor int64
	agents          []*agent // per region
	// skewNs is, per node, its clock's offset from the true one: within
	// half the max clock offset either way, so that any two differ by at
	// most the max offset homing assumes (Options.mutateSkew: region 0's
	// three times the max offset behind, the others as much ahead).
	skewNs []int64
	// reachSince is, per node, since when it has been up and able to
	// reach the store (-1: it is not).
	reachSince []int64
	res        *HomingResult
	reads      *readWorld // reads.go
	rehomer    *rehomer   // rehome.go
	replacer   *replacer  // replace.go
	// cutAt holds the forks recorded but not yet published (cutting).
	cutAt map[cutKey]cut
	// history is, per range, every epoch granted after the first: its
	// home record and when the simulator saw the grant.
	history [][]grant
	// canonCuts are, by range, the canonical records grants cut off
	// (newTimeline), latest last: a raise of the epoch's start puts back
	// what its log holds below the new start (raised, restoreCanon).
	canonCuts map[int][]canonCut
	// rng draws this layer's faults (second takeovers, rehomes,
	// replacements) apart from the run's generator, so that the
	// earlier layers' seeds draw what they drew.
	rng *rand.Rand
	// secondAt is when the home region of a first takeover is cut off in
	// turn (-1: not planned, or done), secondFor for how long.
	secondAt, secondFor int64
	starts              *startGates // epochstart.go
}

func newHomeWorld(w *world) *homeWorld {
	h := &homeWorld{w: w, store: homing.NewMemStore(), outageP: w.rng.Float64() * 0.0005, res: &w.res.Homing}
	h.failoverPlan()
	h.rng = rand.New(rand.NewPCG(uint64(w.opt.Seed), 0x6661756c7473))
	h.secondPlan()
	h.history = make([][]grant, w.opt.Ranges)
	h.canonCuts = map[int][]canonCut{}
	h.cutAt = map[cutKey]cut{}
	h.reads = newReadWorld(w, &h.res.Reads)
	h.rehomer = newRehomer(h)
	h.replacer = newReplacer(h)
	h.reachSince = make([]int64, w.opt.Regions*w.opt.Nodes)
	h.skewNs = make([]int64, w.opt.Regions*w.opt.Nodes)
	bound := int64(maxOffsetMs * 1e6 / 2)
	for i := range h.skewNs {
		h.skewNs[i] = w.rng.Int64N(2*bound+1) - bound
		if w.opt.mutateSkew && i < w.opt.Nodes {
			h.skewNs[i] = -3 * maxOffsetMs * 1e6 // the home's clocks behind
		} else if w.opt.mutateSkew {
			h.skewNs[i] = 3 * maxOffsetMs * 1e6 // the takers' ahead
		}
	}
	return h
}

// regionName is region g's name in the lease store.
func regionName(g int) string { return "r" + strconv.Itoa(g) }

// storeNodeID is n's node id in the lease store (unique across regions).
func storeNodeID(n *node) uint64 { return uint64(n.region*100 + n.id) }

func rangeKey(r int) homing.RangeKey { return homing.RangeKey{Stream: "sim", Range: uint32(r)} }

// nanos is the virtual clock in Unix nanoseconds.
func (w *world) nanos() int64 { return startUnixNano + w.now*1e6 }

// nodeNanos is node n's clock in Unix nanoseconds: the virtual clock
// plus its skew (the true clock when n is nil). Homing reads it; the
// replicas' append times read the true one.
func (w *world) nodeNanos(n *node) int64 {
	if n == nil || w.homing == nil {
		return w.nanos()
	}
	return w.nanos() + w.homing.skewNs[n.region*w.opt.Nodes+n.id-1]
}

// build creates every range's home record in region 0.
func (h *homeWorld) build() error {
	specs := make([]homing.HomeSpec, h.w.opt.Ranges)
	for r := range specs {
		specs[r] = homing.HomeSpec{Key: rangeKey(r), Region: regionName(0)}
	}
	homes, err := h.store.CreateHomes(context.Background(), specs)
	if err != nil {
		return err
	}
	h.homes = homes
	h.homeIdx = make([]int, len(homes))
	h.orphans = make([]map[string]orphaned, len(homes))
	for r := range h.orphans {
		h.orphans[r] = map[string]orphaned{}
	}
	for g := 0; g < h.w.opt.Regions; g++ {
		a, err := newAgent(h, g)
		if err != nil {
			return err
		}
		h.agents = append(h.agents, a)
	}
	return nil
}

// startNode gives a (re)started node a new liveness core: it registers
// again, as a restarted process does.
func (h *homeWorld) startNode(n *node) error {
	core, err := homing.NewCore(homing.CoreConfig{
		NodeID: storeNodeID(n), Region: regionName(n.region),
		HeartbeatIntervalNanos: heartbeatMs * 1e6, RetryIntervalNanos: heartbeatRetryMs * 1e6,
		LivenessTTLNanos: leaseTTLMs * 1e6, MaxOffsetNanos: maxOffsetMs * 1e6,
	})
	n.core = core
	return err
}

// injectFaults starts a lease-store outage now and then.
func (h *homeWorld) injectFaults() {
	w := h.w
	if h.downTill <= w.now && w.rng.Float64() < h.outageP {
		h.downTill = w.now + 200 + w.rng.Int64N(2000)
		h.store.SetDown(true)
		h.res.Outages++
	}
}

func (h *homeWorld) heal() { h.downTill = 0 }

// step ends a due outage and sends every live node's due heartbeat.
func (h *homeWorld) step() {
	w := h.w
	if h.downTill <= w.now {
		h.store.SetDown(false)
	}
	for _, n := range w.nodes {
		if n.up {
			h.heartbeat(n)
		}
	}
	h.failover()
	if w.err == nil {
		h.rehomer.step()
		h.replacer.step()
	}
	if w.err == nil {
		h.reads.step()
	}
}

// heartbeat sends node n's heartbeat if one is due.
func (h *homeWorld) heartbeat(n *node) {
	req, ok := n.core.Next(h.w.nodeNanos(n))
	if !ok {
		return
	}
	h.res.Heartbeats++
	ctx := context.Background()
	if h.unreachable(n) {
		c, cancel := context.WithCancel(ctx)
		cancel()
		ctx = c // MemStore answers a cancelled call as unavailable
	}
	res, err := h.store.Heartbeat(ctx, req)
	if err != nil {
		h.res.Failed++
	}
	n.core.Done(req, res, err)
}

// unreachable reports whether n cannot reach the lease store: it is cut
// off the WAN, or its region is.
func (h *homeWorld) unreachable(n *node) bool {
	g := h.w.geo
	return g != nil && (g.partitioned(n.region) || g.offWAN(n))
}

// admit is the lease check before a node proposes an append (regionsvc's
// admit): the epoch to propose it at, or a retriable refusal.
func (h *homeWorld) admit(n *node, r int) (uint64, error) {
	e, err := n.core.View().Check(rangeKey(r), h.w.nodeNanos(n))
	if err != nil {
		h.res.Refused++
		return 0, apierr.New(apierr.Unavailable, "%v range %d: no lease: %v", n, r, err)
	}
	return e, nil
}

// ackable is the lease check before a node acks an append proposed at
// epoch (regionsvc's leaseCheck): a duplicate carries the epoch it was
// first appended at, so only the lease matters for it.
func (h *homeWorld) ackable(n *node, r int, epoch uint64, duplicate bool) error {
	e, err := n.core.View().Check(rangeKey(r), h.w.nodeNanos(n))
	if err == nil && (e == epoch || duplicate) {
		return nil
	}
	h.res.Refused++
	return apierr.New(apierr.Unavailable, "%v range %d: committed at epoch %d but not acknowledged: lease %d, %v", n, r, epoch, e, err)
}

// checkAck holds an ack against the store's truth: only a node of the
// range's current home region acks, and a new append only at the
// current epoch (fencing: a home whose range was taken over acks
// nothing more).
func (h *homeWorld) checkAck(n *node, r int, epoch uint64, duplicate bool) error {
	home := h.homes[r]
	if regionName(n.region) != home.Region {
		return fmt.Errorf("%v range %d: acked an append at epoch %d, but the range is homed in %s at epoch %d", n, r, epoch, home.Region, home.Epoch)
	}
	if !duplicate && epoch != home.Epoch {
		return fmt.Errorf("%v range %d: acked an append at epoch %d, the range is at epoch %d", n, r, epoch, home.Epoch)
	}
	if !duplicate && epoch > 1 {
		h.res.NewHomeAcks++
	}
	return nil
}

// Failover (unplanned, DESIGN.md "Homing"): one run in three cuts the
// home region off the WAN (and so off the lease store) for longer than a
// lease TTL plus the max clock offset. Every region's failover agent
// (agent.go: the real homing.Takeover core) judges it every
// failoverScanMs and the most caught-up surviving region takes its
// ranges over through the store's own decision (MemStore.Takeover:
// decideTakeover, refused while any node of the home may be live),
// continuing at the committed end its agent's survey read (agent.go
// survey). The producers stay with the old home (they are local to it)
// and meet its fencing.
//
// On a grant (granted, newTimeline) the canonical log is cut at the fork
// point (the grant's StartOffset) and the new home's records follow it
// there at the new epoch; the acked records at or past it are counted as
// orphaned (acked by the old home before the grant, never replicated);
// the producers start over as new idempotent producers of the range and
// move to the new home when a refusal makes them describe the stream
// again (one time in two); the range's routes are re-sourced from the
// new home, to every other region, the old home included: a mirror
// holding the old home's frames past the fork point forks them off into
// its orphan log (mirror.go's fork) and follows; until then it is stale
// (not checked past the fork point). See notes/simhome.md.

const failoverScanMs = 50

// failoverPlan draws whether and when the run cuts its home region off.
func (h *homeWorld) failoverPlan() {
	w := h.w
	h.failAt = -1
	if w.rng.IntN(3) == 0 {
		h.failAt = 300 + w.rng.Int64N(1000)
		h.failFor = leaseTTLMs + maxOffsetMs + 200 + w.rng.Int64N(800)
	}
}

// failover cuts the home region off when planned, and runs every
// region's failover agent (agent.go).
func (h *homeWorld) failover() {
	w := h.w
	if w.now == h.failAt {
		w.geo.cutTill[0] = max(w.geo.cutTill[0], w.now+h.failFor)
		h.res.Failovers++
	}
	h.cutSecond()
	h.trackReach()
	if w.now%failoverScanMs != 0 || w.now >= int64(w.opt.Steps) {
		return
	}
	for _, a := range h.agents {
		a.scan()
	}
}

// granted records a takeover: the new home, the fork point, and the
// acked records past it, which only an orphan log can now hold.
func (h *homeWorld) granted(r int, home homing.Home) {
	w := h.w
	if home.Epoch <= h.homes[r].Epoch {
		w.err = fmt.Errorf("range %d: a takeover granted epoch %d, not above %d", r, home.Epoch, h.homes[r].Epoch)
		return
	}
	if err := h.checkNeeded(r, h.homes[r].Region); err != nil {
		w.err = err
		return
	}
	h.res.Takeovers++
	if len(h.history[r]) > 0 {
		h.res.SecondTakeovers++
	}
	for off, v := range w.acked[r] {
		if off >= home.StartOffset {
			w.unack(r, off)
			h.orphan(r, off, v, h.epochAt(r, off))
		}
	}
	h.move(r, home, false)
	h.secondFailover()
}

// move makes home range r's home (a takeover's or a planned rehome's):
// the range's routes are re-sourced from it, to every other region, the
// old home included (a mirror holding a divergent tail forks it off when
// the new home's frames meet it: mirror.go), and the canonical log
// continues at its start.
func (h *homeWorld) move(r int, home homing.Home, planned bool) {
	w := h.w
	w.tracef("range %d: home %s at epoch %d from %d (planned %v)", r, home.Region, home.Epoch, home.StartOffset, planned)
	h.homes[r] = home
	h.homeIdx[r] = regionIndex(home.Region)
	h.history[r] = append(h.history[r], grant{home: home, at: w.now, planned: planned})
	h.reads.granted(r, home)
	for _, rt := range w.geo.routes {
		if rt.rng == r {
			w.geo.dropRoute(rt)
		}
	}
	for g := 0; g < w.opt.Regions; g++ {
		if g != regionIndex(home.Region) {
			w.geo.routes = append(w.geo.routes, &route{rng: r, region: g})
		}
	}
	h.newTimeline(r, home)
}

// newTimeline cuts the canonical log at the fork point: the new home's
// records follow it there. The producers start over as new idempotent
// producers of the range (what they appended past the fork point is
// orphaned: their next sequence would be a gap at the new home).
func (h *homeWorld) newTimeline(r int, home homing.Home) {
	w := h.w
	at := home.StartOffset
	canon := w.canonical[r]
	if uint64(len(canon)) > at {
		h.saveCut(r, at, canon[at:])
		for _, v := range canon[at:] {
			delete(w.seen[r], v)
		}
		w.canonical[r] = canon[:at:at]
		w.rereadLastSeqs(r)
	}
	for base := range w.canonFrames[r] {
		if base >= at {
			delete(w.canonFrames[r], base)
		}
	}
	w.homeCommitted[r] = at
	for _, n := range w.regionNodes(regionIndex(home.Region)) {
		if n.up {
			n.verified[r] = min(n.verified[r], at)
		}
	}
	for _, p := range w.prods {
		p.inc[r]++
		p.nextSeq[r] = 0
		if p.batch[r] != nil {
			h.res.Abandoned++ // unanswered: committed or not, the producer moves on
			p.batch[r] = nil
		}
	}
}

// homeRegion is the index of range r's home region (0 without homing).
func (w *world) homeRegion(r int) int {
	if w.homing == nil {
		return 0
	}
	return w.homing.homeIdx[r]
}

// stale reports whether node n's committed log of range r holds, at the
// fork point of a takeover, a frame of an older epoch: a divergent tail
// (the old home's, or the old home's frames a mirror received) that it
// has not forked off yet (a fork's record may already be in its orphan
// log while the log is not yet cut). Its frames past the fork point are
// not the range's, and are not checked until the fork (noteForks).
func (w *world) stale(n *node, r int) bool {
	if !w.homing.taken(r) || !n.up {
		return false
	}
	// Every epoch start the node's log passed: a second takeover may
	// meet a copy that diverged under the first (a region away for both).
	fresh := true
	for _, g := range w.homing.history[r] {
		home := g.home
		if n.fresh[r] >= home.Epoch {
			continue
		}
		if n.replicas[r].Committed() <= home.StartOffset {
			fresh = false
			continue
		}
		if w.divergentCached(n, r, home) {
			return true
		}
		if fresh {
			n.fresh[r] = home.Epoch // its log holds this epoch at its start: for good
		}
	}
	return false
}

// divergent reports whether n's log of range r holds an older epoch than
// home's at home's fork point (see stale).
func (w *world) divergent(n *node, r int, home homing.Home) bool {
	// The frame at the fork point, or the first one retained past it.
	from := max(home.StartOffset, n.stores[r].StartOffset())
	f, err := n.stores[r].ReadFrames(from, 1, n.replicas[r].Committed())
	if err != nil || len(f) == 0 {
		// Nothing retained past it (compacted, or a snapshot): what it
		// held was of the new epoch only if it ever saw that epoch.
		return n.replicas[r].HighestEpoch() < home.Epoch
	}
	h, err := batch.DecodeHeader(f)
	return err == nil && h.Epoch < home.Epoch
}

// noteForks takes the forks node n's replica of range r applied since
// last seen (in any incarnation): each must be at the range's current
// fork point and epoch; the committed end falls back there once.
func (h *homeWorld) noteForks(n *node, r int) error {
	home := h.homes[r]
	for _, f := range n.replicas[r].Orphans() {
		if f.Epoch <= n.forkEpoch[r] {
			continue
		}
		if h.w.divergent(n, r, homing.Home{Epoch: f.Epoch, StartOffset: f.At}) {
			// A fork not (wholly) applied yet: its log is not cut. (Not
			// "the copy is stale": a copy that applied a fork to one epoch
			// may already be divergent from a later one's start, and its
			// committed end fell back with the fork: seed 107 of the
			// minute runs, forked to epoch 8 by a snapshot while epoch 9
			// had begun.)
			return nil
		}
		if !h.isStart(r, f.Epoch, f.At) {
			return fmt.Errorf("%v range %d: forked at %d to epoch %d, the range's epoch %d starts at %d", n, r, f.At, f.Epoch, home.Epoch, home.StartOffset)
		}
		n.forkEpoch[r] = f.Epoch
		if n.replicas[r].Committed() > f.At {
			h.cutAt[cutKey{n, r}] = cut{at: f.At, epoch: f.Epoch, gen: n.gen, was: n.replicas[r].Committed()} // see cutting
		}
		n.served[r] = min(n.served[r], f.At)
		n.verified[r] = min(n.verified[r], f.At)
		h.res.Forks++
	}
	return nil
}

// cutKey names a node's replica of a range.
type cutKey struct {
	n *node
	r int
}

// cut is a fork point not yet published, in the node's incarnation gen.
type cut struct {
	at, epoch uint64
	gen       int
	was       uint64 // the committed end published when the fork was seen
}

// cutting reports whether node n's replica of range r has a fork on
// record whose cut it has not published yet: its committed end has not
// fallen back, and its log still holds, at the fork point (or the first
// frame retained past it), a frame older than the fork's epoch, or
// nothing (compacted to its end). Its committed end may fall back to the
// fork point at any step, and its log is not checked until it did. A
// replica whose retention had deleted its whole divergent tail records
// the fork while publishing its old end for a while (seed 398 of the
// first runs with readers); one catching up by Raft may fork and grow
// past the fork point in one step (seed 246).
func (h *homeWorld) cutting(n *node, r int, committed uint64) bool {
	if len(h.cutAt) == 0 {
		return false // the checks ask every replica after every step
	}
	c, ok := h.cutAt[cutKey{n, r}]
	if !ok {
		return false
	}
	if !n.up || n.gen != c.gen || committed <= c.at || h.cutDone(n, r, c, committed) {
		delete(h.cutAt, cutKey{n, r})
		return false
	}
	return true
}

// cutDone reports whether n's log holds, at the fork point c.at, a frame
// of the fork's epoch or newer (the fork frame, or what followed it).
func (h *homeWorld) cutDone(n *node, r int, c cut, committed uint64) bool {
	if committed < c.was {
		return true // it fell back: the cut is published
	}
	// The frame at the fork point, or the first retained past it (a
	// snapshot of the new home may start past the fork point).
	st := n.stores[r]
	f, err := st.ReadFrames(max(c.at, st.StartOffset()), 1, committed)
	if err != nil || len(f) == 0 {
		return false // nothing retained: the old log's end (seed 398)
	}
	hd, err := batch.DecodeHeader(f)
	return err == nil && hd.Epoch >= c.epoch
}

// orphaned is an acked record counted as orphaned: the offset it was
// acked at, and the region that acked it (the home of the epoch it was
// acked in, which a second takeover makes other than the latest grant's
// PrevRegion: deletedByRetention looks there).
type orphaned struct {
	off    uint64
	region int
}

// orphan counts an acked record past a fork point, acked at epoch: only
// an orphan log may hold it, never the range's log (finalTaken).
func (h *homeWorld) orphan(r int, off uint64, v string, epoch uint64) {
	h.orphans[r][v] = orphaned{off: off, region: h.epochRegion(r, epoch)}
	h.res.Orphaned++
}

// epochAt is the epoch range r's log is at, at offset off, as the grants
// so far left it: that of the latest grant starting at or below off (a
// later takeover may start below an earlier one's start, cutting it), 1
// if none.
func (h *homeWorld) epochAt(r int, off uint64) uint64 {
	e := uint64(1)
	for _, g := range h.history[r] {
		if g.home.StartOffset <= off {
			e = g.home.Epoch
		}
	}
	return e
}

// epochRegion is the region that homed range r at epoch (region 0 at
// epoch 1, where every range is created).
func (h *homeWorld) epochRegion(r int, epoch uint64) int {
	for _, g := range h.history[r] {
		if g.home.Epoch == epoch {
			return regionIndex(g.home.Region)
		}
	}
	return 0
}

// taken reports whether range r's home changed since its creation.
func (h *homeWorld) taken(r int) bool { return h != nil && h.homes[r].Epoch > 1 }

// epochStart is where range r's log left epoch after: the lowest start
// of a later epoch (epochs never go back along a log; a later takeover may
// start below an earlier one's start, cutting it), or ^0 if none. A Task
// finds it by searching the source's log (Task.epochStart).
func (h *homeWorld) epochStart(r int, after uint64) uint64 {
	at := ^uint64(0)
	for _, g := range h.history[r] {
		if g.home.Epoch > after {
			at = min(at, g.home.StartOffset)
		}
	}
	return at
}

// leaderOf returns the live node of region g leading range r, or nil.
func (w *world) leaderOf(g, r int) *node {
	for _, n := range w.regionNodes(g) {
		if n.up && n.replicas[r].IsLeader() {
			return n
		}
	}
	return nil
}

// finalTaken requires every node of the taker region to hold the log up
// to each taken range's fork point, as the home committed it (their
// frames there were checked against the home's by checkMirror).
func (h *homeWorld) finalTaken() error {
	if err := h.reads.final(); err != nil {
		return err
	}
	for r, home := range h.homes {
		if !h.taken(r) {
			continue
		}
		for v, o := range h.orphans[r] {
			if at, ok := h.w.seen[r][v]; ok {
				return fmt.Errorf("range %d: %q, acked at %d and counted as orphaned at the fork point %d, is in the new home's log at %d", r, v, o.off, home.StartOffset, at)
			}
		}
		for _, n := range h.w.regionNodes(regionIndex(home.Region)) {
			if n.verified[r] < home.StartOffset {
				return fmt.Errorf("range %d: %v, in the new home, verified %d of the log up to the fork point %d", r, n, n.verified[r], home.StartOffset)
			}
		}
	}
	return nil
}

// rereadLastSeqs reads each producer's last sequence in range r's
// canonical log again, after a cut (newTimeline) or a restore
// (restoreCanon) changed it.
func (w *world) rereadLastSeqs(r int) {
	clear(w.lastSeq[r])
	for _, v := range w.canonical[r] {
		var pid, rr int
		var seq int64
		if err := scanRecord(v, &pid, &rr, &seq); err == nil {
			w.lastSeq[r][pid] = seq
		}
	}
}
