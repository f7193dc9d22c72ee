package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"github.com/geolog/geolog/replica"
	"github.com/geolog/geolog/replicator"
)

// Replication between regions. Every range is homed in region 0; each
// other region mirrors it. Per (range, mirror region) a link holds the
// real source core, a replicator.Cursor, owned by the home range's
// current Raft leader (a new leader starts a new cursor, as a new leader
// starts a new replicator.Task). The simulator executes its Actions: a
// Read reads the owner's committed frames (segment.Store.ReadFrames) and
// ships them, as replicator.BuildBatch describes them, over a stream of
// the virtual WAN to a node of the mirror region, which serves it as
// mirror.go does. Every choice comes from the run's generator.

// GeoResult counts what replication between regions did in a run.
type GeoResult struct {
	// Cursors counts the cursors started (one per route and home leader),
	// Zombies those that shipped on a while after their node lost the
	// lead;
	// Opens the streams opened, Streams those the mirror answered.
	Cursors, Zombies, Opens, Streams int
	// Broken counts streams broken by WAN loss or a mirror node's crash;
	// TimedOut those the source gave up on (a partition swallowed them).
	Broken, TimedOut int
	// Batches counts batches applied, Frames the frames they proposed
	// verbatim, Duplicates the batches wholly below the applied end, Gaps
	// the batches refused as gaps, Refusals the other refusals.
	Batches, Frames, Duplicates, Gaps, Refusals int
	// Resends counts streams resumed below a mirror's end at an epoch
	// change (Cursor.Resend).
	Resends int
	// Partitions counts region partitions; Dropped WAN messages lost in one.
	Partitions, Dropped int
	// LargerFrameForks counts the forks of a mirror whose divergent frame
	// at the fork point was larger than the batch's frame there and lay
	// past a read sized for an identical overlap (mirror.go
	// noteLargerFrame: what replicator.ReadOverlap reads on for). Not in
	// String, so that the pinned schedule digests stay as they were.
	LargerFrameForks int
}

func (g GeoResult) String() string {
	if g == (GeoResult{}) {
		return ""
	}
	return fmt.Sprintf("; geo: %d cursors (%d zombies), %d streams opened (%d answered, %d broken, %d timed out, %d resent from an epoch change), %d batches applied (%d frames), %d duplicates, %d gaps, %d other refusals, %d region partitions (%d WAN messages lost)",
		g.Cursors, g.Zombies, g.Opens, g.Streams, g.Broken, g.TimedOut, g.Resends, g.Batches, g.Frames, g.Duplicates, g.Gaps, g.Refusals, g.Partitions, g.Dropped)
}

// add sums two runs' counters.
func (g GeoResult) add(o GeoResult) GeoResult {
	g.Cursors += o.Cursors
	g.Zombies += o.Zombies
	g.Opens += o.Opens
	g.Streams += o.Streams
	g.Broken += o.Broken
	g.TimedOut += o.TimedOut
	g.Batches += o.Batches
	g.Frames += o.Frames
	g.Duplicates += o.Duplicates
	g.Gaps += o.Gaps
	g.Refusals += o.Refusals
	g.Resends += o.Resends
	g.Partitions += o.Partitions
	g.Dropped += o.Dropped
	g.LargerFrameForks += o.LargerFrameForks
	return g
}

// Virtual-time constants of replication between regions.
const (
	geoTickMs         = 100    // a cursor's heartbeat interval
	geoTimeoutMs      = 1500   // a stream silent this long with requests in flight is given up (keepalive)
	mirrorQueueMax    = 256    // requests a mirror node queues per range
	zombieMsMax       = 1500   // how long a deposed leader's cursor may ship on
	mirrorSettleMsMax = 30_000 // virtual ms the final check gives mirrors to catch up
)

// geoWorld is the state of replication between regions.
type geoWorld struct {
	w *world
	// delayMs is the one-way base delay of each region pair's link.
	delayMs [][]int64
	// lossP is the chance a WAN message breaks its stream (a reset
	// connection: TCP hides loss as delay, a long one as a break); partP
	// the chance per virtual ms that a region is cut off the WAN.
	lossP, partP float64
	cutTill      []int64 // per region: cut off the WAN until then
	routes       []*route
	streamSeq    uint64
	res          *GeoResult
}

// route is one (range, mirror region): the link of the home's current
// leader, and those of deposed leaders that have not noticed yet.
type route struct {
	rng, region int
	live        *link
	zombies     []*link
	dropped     bool // the range was taken over: this layer ships no more
}

// link is one cursor of a route, on one home node, and its current
// stream.
type link struct {
	rng, region int
	src         int   // the home region it ships from
	until       int64 // a zombie's end
	cur         *replicator.Cursor
	owner       *node // the home leader driving cur
	ownerGen    int
	connectSeq  uint64     // the current Connect action's number
	stream      *wanStream // the current stream, nil if none
	lastTarget  int        // the mirror node last tried without a hint
}

// wanStream is one stream of a link, to one mirror node.
type wanStream struct {
	id         uint64
	l          *link
	target     *node
	targetGen  int
	open       bool    // the mirror answered the open
	dead       bool    // broken or ended: nothing more travels on it
	closing    bool    // the source closed it: it sends nothing more
	blackholed bool    // a partition swallowed a message: nothing more arrives
	openedAt   int64   // when the open was sent
	sentAt     []int64 // when each unanswered request was sent (FIFO)
	upAt       int64   // the last arrival towards the mirror (FIFO)
	downAt     int64   // the last arrival towards the source
}

// Kinds of geoMsg.
const (
	gmOpen = iota + 1
	gmBatch
	gmHeartbeat
	gmOpened // the answer to an open
	gmAnswer // the answer to a batch or heartbeat
	gmReset  // the stream broke: the source learns it
	gmClose  // the source closed the stream: the mirror learns it
)

// geoMsg is a message of a stream, or a link's delayed Connect.
type geoMsg struct {
	kind             int
	s                *wanStream
	l                *link  // evGeoConnect
	seq              uint64 // evGeoConnect: the Connect action's number
	hint             string
	batch            *geologinternalv1.MirrorBatch
	applied, highest uint64
	logEpoch         uint64 // gmOpened: the epoch the mirror's log ends in (0: unknown)
	forked           bool   // a batch a fork was cut for: not another
	err              error
}

func newGeoWorld(w *world) *geoWorld {
	g := &geoWorld{w: w, res: &w.res.Geo}
	n := w.opt.Regions
	g.delayMs = make([][]int64, n)
	for a := range g.delayMs {
		g.delayMs[a] = make([]int64, n)
	}
	for a := 0; a < n; a++ {
		for b := a + 1; b < n; b++ {
			d := 10 + w.rng.Int64N(70)
			g.delayMs[a][b], g.delayMs[b][a] = d, d
		}
	}
	g.lossP = w.rng.Float64() * 0.01
	g.partP = w.rng.Float64() * 0.001
	g.cutTill = make([]int64, n)
	return g
}

// build creates a link per (range, mirror region).
func (g *geoWorld) build() {
	for r := 0; r < g.w.opt.Ranges; r++ {
		for region := 1; region < g.w.opt.Regions; region++ {
			g.routes = append(g.routes, &route{rng: r, region: region})
		}
	}
}

func (g *geoWorld) heal() {
	for i := range g.cutTill {
		g.cutTill[i] = 0
	}
	g.lossP = 0
}

// injectFaults cuts a whole region off the WAN now and then.
func (g *geoWorld) injectFaults() {
	w := g.w
	if w.rng.Float64() < g.partP {
		region := w.rng.IntN(w.opt.Regions)
		g.cutTill[region] = w.now + 200 + w.rng.Int64N(2000)
		g.res.Partitions++
	}
}

func (g *geoWorld) partitioned(region int) bool { return g.cutTill[region] > g.w.now }

// offWAN reports whether node n is cut off from everything, the WAN
// included (one node partition in two; the others cut it off from its
// region only).
func (g *geoWorld) offWAN(n *node) bool { return n.cutWAN && g.w.cut(n.region, n.id) }

// floor is the lowest committed end any mirror replica of range r
// outside region own published: the home keeps every segment at or past
// it, and so does every mirror (it may become the home: a takeover picks
// the most caught-up region, whose log the others then need). A copy
// holding a divergent tail (stale) counts at the point a source resends
// to it from (resendPoint), as regionsvc's floor holds a task's lag at
// its resend (replicator Task, evConnected): without it the home could
// delete what the copy needs to fork and catch up, and the copy would
// wait for it for ever (seed 125 of the minute runs). So does a copy that
// is down, whose divergence cannot be read: a Task's lag keeps the resend
// point of its last connection, or 0 before the first; counting a down
// divergent copy at its published end let the home delete its resend
// point while its whole region was down (seed 169 of the minute runs).
func (g *geoWorld) floor(r, own int) uint64 {
	f := ^uint64(0)
	home := g.w.homeRegion(r)
	for _, n := range g.w.nodes {
		if n.region == home || (n.region == own && own == home) {
			continue
		}
		if !n.up || g.w.stale(n, r) {
			f = min(f, g.resendPoint(n, r))
		} else {
			f = min(f, n.served[r])
		}
	}
	return f
}

// resendPoint is where a source resumes shipping range r to copy n
// (connected): where the range's log left the epoch n's log ends in, if
// that is older than the home's, or n's end. For a copy that is down, the
// epoch its log ended in when it went down (a later takeover may still
// move where the range's log left it lower).
func (g *geoWorld) resendPoint(n *node, r int) uint64 {
	end := n.served[r]
	var e uint64
	switch {
	case n.up:
		e = n.tailEpoch(r)
	case n.downLogEpoch != nil:
		e = n.downLogEpoch[r]
	}
	if e != 0 && e < g.w.homing.homes[r].Epoch {
		return min(end, g.w.homing.epochStart(r, e))
	}
	return end
}

// tailEpochSeen is logEpoch of a replica's committed end, and what it was
// read on (tailEpoch).
type tailEpochSeen struct {
	rep                       *replica.Replica
	gen                       int
	committed, highest, start uint64
	valid                     bool
	epoch                     uint64
}

// tailEpoch is logEpoch(n, r, committed end, false), read again only when
// what it depends on changed (as divergentCached: the replica, its
// incarnation, committed end, highest epoch or log start): the
// compaction floor asks it of every copy, for every replica, every
// compaction round.
func (n *node) tailEpoch(r int) uint64 {
	rep := n.replicas[r]
	key := tailEpochSeen{rep: rep, gen: n.gen, committed: rep.Committed(), highest: rep.HighestEpoch(), start: n.stores[r].StartOffset(), valid: true}
	if len(n.tailEpochs) <= r {
		n.tailEpochs = append(n.tailEpochs, make([]tailEpochSeen, r+1-len(n.tailEpochs))...)
	}
	if c := n.tailEpochs[r]; c.valid {
		c.epoch = 0
		if c == key {
			return n.tailEpochs[r].epoch
		}
	}
	key.epoch = logEpoch(n, r, key.committed, false)
	n.tailEpochs[r] = key
	return key.epoch
}

// noteDown records, as node n goes down, the epoch each of its logs ends
// in (resendPoint).
func (g *geoWorld) noteDown(n *node) {
	if n.downLogEpoch == nil {
		n.downLogEpoch = make([]uint64, len(n.replicas))
	}
	for r, rep := range n.replicas {
		if rep == nil {
			continue // not opened: the process died in its start-up; as at its last crash
		}
		n.downLogEpoch[r] = logEpoch(n, r, rep.Committed(), false)
	}
}

// step serves the mirrors' queued requests, then drives every link.
func (g *geoWorld) step() {
	for _, n := range g.w.nodes {
		for r := range n.mirror {
			if g.w.err == nil && n.up && n.region != g.w.homeRegion(r) {
				g.serve(n, r)
			}
		}
	}
	for _, rt := range g.routes {
		if g.w.err == nil {
			g.driveRoute(rt)
		}
	}
}

// homeLeader returns the live home node leading range r, or nil.
func (g *geoWorld) homeLeader(r int) *node {
	return g.w.leaderOf(g.w.homeRegion(r), r)
}

// driveRoute gives a route's live link to the home's current leader
// (retiring the previous owner's, which may linger as a zombie), then
// drives the live link and the zombies.
func (g *geoWorld) driveRoute(rt *route) {
	w := g.w
	if rt.dropped {
		return
	}
	leader := g.homeLeader(rt.rng)
	if l := rt.live; (l == nil && leader != nil) || (l != nil && (leader != l.owner || leader.gen != l.ownerGen)) {
		if l != nil {
			g.retire(rt, l)
		}
		rt.live = nil
		if leader != nil {
			rt.live = g.newLink(rt, leader)
		}
	}
	if rt.live != nil {
		g.drive(rt.live)
	}
	kept := rt.zombies[:0]
	for _, z := range rt.zombies {
		if w.now >= z.until || !z.owner.up || z.owner.gen != z.ownerGen {
			g.stop(z)
			continue
		}
		kept = append(kept, z)
		g.drive(z)
	}
	rt.zombies = kept
}

// retire ends a deposed leader's link: at once, or (one time in two,
// while its node lives) up to zombieMsMax later, as a deposed leader's
// replicator.Task ships on until its driver notices. What it ships is
// committed, so it is the home's; the mirror compares it (Overlap).
func (g *geoWorld) retire(rt *route, l *link) {
	w := g.w
	if l.owner.up && l.owner.gen == l.ownerGen && w.rng.IntN(2) == 0 {
		l.until = w.now + 1 + w.rng.Int64N(zombieMsMax)
		rt.zombies = append(rt.zombies, l)
		g.res.Zombies++
		return
	}
	g.stop(l)
}

// dropRoute stops a route's links for good.
func (g *geoWorld) dropRoute(rt *route) {
	rt.dropped = true
	if rt.live != nil {
		g.stop(rt.live)
	}
	for _, z := range rt.zombies {
		g.stop(z)
	}
	rt.live, rt.zombies = nil, nil
}

// stop ends a link's cursor and stream.
func (g *geoWorld) stop(l *link) {
	if l.cur != nil {
		l.cur.Stop(errOwnerChanged)
		l.cur.Ready()
	}
	g.endStream(l)
	l.connectSeq++
	l.cur = nil
}

// drive gives a link's cursor its tail, ticks and timeouts, and executes
// its actions.
func (g *geoWorld) drive(l *link) {
	w := g.w
	if l.cur == nil {
		return
	}
	l.cur.TailAdvanced(g.shippable(l))
	if w.now%geoTickMs == 0 {
		l.cur.Tick()
	}
	if s := l.stream; s != nil && s.silent(w.now) {
		g.res.TimedOut++
		g.endStream(l)
		l.cur.StreamFailed(errStreamTimeout)
	}
	for i := 0; i < 64 && w.err == nil; i++ {
		acts := l.cur.Ready()
		if len(acts) == 0 {
			return
		}
		for _, a := range acts {
			g.exec(l, a)
		}
	}
}

var (
	errStreamTimeout = errors.New("sim: replication stream silent past its timeout")
	errStreamReset   = errors.New("sim: replication stream reset")
	errConnRefused   = errors.New("sim: connection refused (mirror node down)")
	errOwnerChanged  = errors.New("sim: the home leader changed")
)

// newLink starts a cursor on leader for a route, as a new home leader
// starts a replicator.Task per mirror region.
func (g *geoWorld) newLink(rt *route, leader *node) *link {
	w := g.w
	cur, err := replicator.NewCursor(replicator.CursorConfig{
		Epoch: g.w.homing.homes[rt.rng].Epoch, Rand: rand.New(rand.NewPCG(w.rng.Uint64(), w.rng.Uint64())),
		WindowBytes: 32 << 10, BatchBytesMax: 4 << 10, BackoffMax: 2 * time.Second,
	})
	if err != nil {
		w.err = err
		return nil
	}
	g.res.Cursors++
	cur.Start()
	return &link{rng: rt.rng, region: rt.region, src: leader.region, cur: cur, owner: leader, ownerGen: leader.gen}
}

// endStream drops a link's current stream: its source closes it, and
// the mirror learns of it once what was sent before the close arrived
// (until then it serves them, and its answers go unheard).
func (g *geoWorld) endStream(l *link) {
	s := l.stream
	l.stream = nil
	if s == nil || s.dead || s.closing {
		return
	}
	s.closing = true
	w := g.w
	if s.blackholed || g.partitioned(s.l.src) || g.partitioned(s.l.region) {
		return // the close is lost too: nothing more reaches the mirror anyway
	}
	at := max(w.now+g.delayMs[s.l.src][s.l.region], s.upAt)
	s.upAt = at
	w.push(&event{at: at, kind: evGeo, geo: &geoMsg{kind: gmClose, s: s}})
}

// exec executes one cursor action.
func (g *geoWorld) exec(l *link, a replicator.Action) {
	w := g.w
	switch a.Kind {
	case replicator.ActionConnect:
		g.endStream(l)
		l.connectSeq++
		w.push(&event{at: w.now + a.Delay.Milliseconds(), kind: evGeoConnect, geo: &geoMsg{l: l, seq: l.connectSeq, hint: a.Hint}})
	case replicator.ActionRead:
		g.read(l, a)
	case replicator.ActionHeartbeat:
		g.send(l.stream, &geoMsg{kind: gmHeartbeat}, true)
	case replicator.ActionStop:
		if !errors.Is(a.Err, errOwnerChanged) {
			w.err = fmt.Errorf("range %d region %d: the cursor stopped with one home epoch: %v", l.rng, l.region, a.Err)
		}
	}
}

// shippable is the end of what l's cursor may ship: the owner's committed
// end, or its copy's timeline fence if lower (regionsvc's driverSource:
// a new home's tail from its earlier time as home, which its start gate
// forks off, is not shipped before; seed 7705544).
func (g *geoWorld) shippable(l *link) uint64 {
	end := l.owner.replicas[l.rng].Committed()
	if h := g.w.homing; h != nil && !g.w.opt.mut.shipPastFence {
		end = min(end, h.fence(l.owner, l.rng))
	}
	return end
}

// read executes a Read: the owner's committed frames from a.From, as a
// replicator.Task reads and ships them.
func (g *geoWorld) read(l *link, a replicator.Action) {
	st := l.owner.stores[l.rng]
	g.w.homeCommitted[l.rng] = max(g.w.homeCommitted[l.rng], l.owner.replicas[l.rng].Committed())
	frames, err := st.ReadFrames(a.From, a.MaxBytes, g.shippable(l))
	switch {
	case err != nil:
		l.cur.ReadFailed(err)
		return
	case len(frames) == 0:
		l.cur.ReadEmpty()
		return
	case len(frames) > a.FitBytes:
		l.cur.ReadBlocked(len(frames))
		return
	}
	frames = append([]byte(nil), frames...)
	b, err := replicator.BuildBatch(frames, a.From)
	if err != nil {
		l.cur.ReadFailed(err)
		return
	}
	g.send(l.stream, &geoMsg{kind: gmBatch, batch: b}, true)
	l.cur.ReadDone(b.GetFirstOffset(), b.GetEndOffset(), len(frames))
}

// connect runs a Connect action after its delay: a new stream to the
// hinted mirror node, or to the next one.
func (g *geoWorld) connect(m *geoMsg) {
	w, l := g.w, m.l
	if l.cur == nil || m.seq != l.connectSeq {
		return // the cursor moved on
	}
	target := 0
	if id, err := strconv.Atoi(strings.TrimPrefix(m.hint, "node:")); err == nil && id >= 1 && id <= w.opt.Nodes {
		target = id
	} else {
		l.lastTarget = l.lastTarget%w.opt.Nodes + 1
		target = l.lastTarget
	}
	g.streamSeq++
	s := &wanStream{id: g.streamSeq, l: l, target: w.node(l.region, target), openedAt: w.now}
	l.stream = s
	g.res.Opens++
	g.send(s, &geoMsg{kind: gmOpen}, true)
}

// send puts m on stream s towards the mirror (up) or the source. A
// region cut off the WAN swallows it, and everything after it on the
// stream (its source times out); WAN loss breaks the stream (both ends
// learn); otherwise it arrives a link delay later, in stream order.
func (g *geoWorld) send(s *wanStream, m *geoMsg, up bool) {
	w := g.w
	if s == nil || s.dead || (up && s.closing) {
		return
	}
	if s.blackholed {
		if m.kind == gmBatch || m.kind == gmHeartbeat {
			s.sentAt = append(s.sentAt, w.now)
		}
		return
	}
	m.s = s
	if m.kind == gmBatch || m.kind == gmHeartbeat {
		s.sentAt = append(s.sentAt, w.now)
	}
	from, to := s.l.src, s.l.region
	if !up {
		from, to = to, from
	}
	if g.partitioned(from) || g.partitioned(to) || g.offWAN(s.l.owner) || g.offWAN(s.target) {
		// A region cut off the WAN, or either end cut off from everything.
		s.blackholed = true
		g.res.Dropped++
		return
	}
	if w.rng.Float64() < g.lossP {
		g.breakStream(s)
		return
	}
	d := g.delayMs[from][to]
	at := w.now + d + w.rng.Int64N(d/4+1)
	if up {
		at = max(at, s.upAt)
		s.upAt = at
	} else {
		at = max(at, s.downAt)
		s.downAt = at
	}
	w.push(&event{at: at, kind: evGeo, geo: m})
}

// breakStream ends s on both sides: the source hears of it a WAN delay
// later.
func (g *geoWorld) breakStream(s *wanStream) {
	if s.dead {
		return
	}
	s.dead = true
	g.res.Broken++
	w := g.w
	w.push(&event{at: w.now + g.delayMs[s.l.src][s.l.region], kind: evGeo, geo: &geoMsg{kind: gmReset, s: s}})
}

// deliver hands a WAN message to its end.
func (g *geoWorld) deliver(m *geoMsg) {
	switch m.kind {
	case gmOpen, gmBatch, gmHeartbeat:
		g.arrive(m)
	case gmClose:
		m.s.dead = true
	default:
		g.answered(m)
	}
}

// answered delivers an answer (or a reset) to the link's cursor, if the
// stream is still its current one.
func (g *geoWorld) answered(m *geoMsg) {
	s := m.s
	l := s.l
	if l.stream != s || l.cur == nil {
		return
	}
	if m.kind == gmAnswer && len(s.sentAt) > 0 {
		s.sentAt = s.sentAt[1:]
	}
	switch {
	case m.kind == gmReset:
		l.stream = nil
		l.cur.StreamFailed(errStreamReset)
	case m.kind == gmOpened && m.err != nil:
		l.stream = nil
		l.cur.StreamFailed(m.err)
	case m.kind == gmOpened:
		s.open = true
		g.res.Streams++
		g.connected(l, m)
	case m.err != nil:
		var ref *replicator.Refusal
		if errors.As(m.err, &ref) && errors.Is(ref, replicator.ErrGap) {
			l.cur.Refused(ref)
			return
		}
		g.endStream(l) // the mirror ended the stream with it
		l.cur.StreamFailed(m.err)
	default:
		l.cur.Response(m.applied, m.highest)
	}
}

// connected resumes a cursor on an open stream where replicator.ResumeAt
// says, as a Task does: a mirror whose log ends in an older epoch than the
// source's may hold another home's divergent tail past where this log left
// that epoch; shipping resumes there (Cursor.Resend) and the mirror
// compares. The search stands in for the Task's of its log
// (Task.epochStart): offsets below the source's log start count as older,
// so a resend never starts below what the source retains (else a mirror
// whose log epoch a restart lowered would wait for ever for a read that
// cannot succeed: seed 116 of the minute runs; the floor keeps a divergent
// copy's resend point).
func (g *geoWorld) connected(l *link, m *geoMsg) {
	home := g.w.homing.homes[l.rng]
	o := l.owner
	owned := o.up && o.gen == l.ownerGen // (a crashed owner's link is retired at its next drive)
	var start uint64
	if owned {
		start = o.stores[l.rng].StartOffset()
	}
	epochStart := func(after, _ uint64) uint64 {
		return max(g.w.homing.resendFrom(l.rng, after, o), start)
	}
	var logEpoch *uint64
	if m.logEpoch != 0 {
		logEpoch = &m.logEpoch
	}
	from, resend := replicator.ResumeAt(m.applied, logEpoch, home.Epoch, epochStart)
	if g.w.tracing() {
		g.w.tracef("range %d: %s (epoch %d, log from %d) connected to %s: applied %d, highest %d, log epoch %d; resend point %d",
			l.rng, traceName(o), home.Epoch, start, traceName(m.s.target), m.applied, m.highest, m.logEpoch, epochStart(m.logEpoch, m.applied))
	}
	l.cur.Connected(from, m.highest)
	if resend {
		l.cur.Resend()
		if from < m.applied {
			g.res.Resends++
		}
	}
}

// silent reports whether the stream's open, or its oldest unanswered
// request, has waited past the timeout.
func (s *wanStream) silent(now int64) bool {
	if !s.open {
		return now-s.openedAt > geoTimeoutMs
	}
	return len(s.sentAt) > 0 && now-s.sentAt[0] > geoTimeoutMs
}
