package regionsvc

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/geolog/geolog/homing"
)

// Unplanned failover (DESIGN.md "Homing"): the catalogue leader of every
// region watches the ranges its region mirrors. When every node of a
// range's home region may be dead by the lease store (each liveness record
// past its expiration plus the max clock offset), the most caught-up
// surviving mirror takes the home at epoch+1 and continues at its applied
// tail: each region's agent asks the other surviving regions how far their
// mirrors are, and only the best one (ties broken by the preference order)
// acts; after failoverGrace, any does (the best may be unable to). The
// store's compare-and-set on the epoch makes the race harmless: one wins.
// The decision is the deterministic core homing.Takeover; the agent below
// only drives it.

// failoverScanInterval is how often the agent looks. It reads a region's
// liveness records only when they could have expired by then (see
// homing.Takeover), so a short interval costs no lease-store reads and the
// takeover follows the last expiry within it.
const failoverScanInterval = 50 * time.Millisecond

// failoverGrace is how long the agent of a region that is not the best
// candidate waits, once a home region is dead, before taking over itself.
const failoverGrace = 3 * time.Second

// failoverAgent drives the failover decision core (homing.Takeover) on
// the homing loop: it ticks the core with the node's lease and home
// directory, carries out the ops (lease-store reads and takeovers, the
// other regions' tails, refreshes) and feeds the answers back.
type failoverAgent struct {
	n    *Node
	core *homing.Takeover
}

func newFailoverAgent(n *Node) *failoverAgent {
	regions := append([]string{n.cfg.Region}, slices.Collect(maps.Keys(n.cfg.Regions))...)
	core, err := homing.NewTakeover(homing.TakeoverConfig{Region: n.cfg.Region, Regions: regions,
		SettleNanos: int64(n.cfg.LeaseTTL + n.cfg.MaxClockOffset), GraceNanos: int64(failoverGrace),
		MaxOffsetNanos: int64(n.cfg.MaxClockOffset)})
	if err != nil {
		panic(err) // homing.NewHomes validated the region; the durations are not negative
	}
	return &failoverAgent{n: n, core: core}
}

// leading reports whether this node judges its region's failover.
func (a *failoverAgent) leading() bool {
	return !a.n.cfg.FailoverDisabled && a.n.leadsCatalogue()
}

// scan runs one round (on the homing loop): one tick, then the core's ops
// until it asks for nothing more.
func (a *failoverAgent) scan(ctx context.Context) {
	n := a.n
	view := n.homing.homes.View()
	tk := homing.TakeoverTick{NowNanos: n.cfg.Now().UnixNano(), Leading: a.leading(),
		ServeUntilNanos: view.ServeUntilNanos, StoreUnreached: view.Failures > 0, ReachedSinceNanos: view.ReachedSinceNanos,
		Streams: map[string][]string{}}
	if tk.Leading {
		n.homing.dirMu.Lock()
		for _, h := range n.homing.dir {
			tk.Homes = append(tk.Homes, h)
		}
		n.homing.dirMu.Unlock()
		for _, h := range tk.Homes {
			if spec, ok := n.streamSpec(h.Key.Stream); ok {
				tk.Streams[h.Key.Stream] = orderRegions(spec.Regions, n.cfg.FailoverOrder)
			}
		}
	}
	a.core.Tick(tk)
	for {
		ops, notes := a.core.Ready()
		a.note(notes)
		if len(ops) == 0 {
			return
		}
		for _, op := range ops {
			if ctx.Err() != nil {
				a.core.LeaderChanged(false) // closing: drop the round
				return
			}
			// The lead may move while a round runs: the core then drops it,
			// and what it asked for is not done.
			a.core.LeaderChanged(a.leading())
			if op.Kind.Awaited() && !a.core.Current(op.Round) {
				continue
			}
			a.do(ctx, op)
		}
	}
}

// do carries out one op and feeds its answer to the core.
func (a *failoverAgent) do(ctx context.Context, op homing.TakeoverOp) {
	n := a.n
	switch op.Kind {
	case homing.OpReadLiveness:
		cctx, cancel := context.WithTimeout(ctx, n.storeTimeout())
		live, err := n.homing.store.Liveness(cctx, op.Region)
		cancel()
		a.core.LivenessRead(op.Round, live, err)
	case homing.OpSurveyTails:
		a.core.TailsRead(op.Round, a.surveyTails(ctx, op.Asks, op.Keys))
	case homing.OpTakeover:
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		res, err := n.homing.homes.Takeover(cctx, op.Region, op.Ranges)
		cancel()
		if err != nil {
			n.logger.Warn("takeover failed", "from", op.Region, "ranges", len(op.Ranges), "error", err)
		}
		a.core.TakeoverDone(op.Round, res, err)
	case homing.OpRefreshDirectory:
		n.refreshDirectory(ctx)
	case homing.OpRefreshRegions:
		// Every node of this region (which leads the ranges now) and of the
		// other surviving regions (which redirect producers here) learns of
		// it at once, not at its next heartbeat.
		for _, r := range op.Regions {
			n.tasks.Go(func(ctx context.Context) {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				if err := n.refreshRegion(cctx, r); err != nil {
					n.logger.Debug("refresh after takeover", "region", r, "error", err)
				}
			})
		}
	}
}

// note logs and counts what the core reports.
func (a *failoverAgent) note(notes []homing.TakeoverNote) {
	n := a.n
	granted := 0
	for _, nt := range notes {
		switch {
		case nt.Down:
			n.logger.Warn("home region may be down: every node's liveness has expired", "region", nt.Region, "ranges", nt.Ranges)
		case nt.Granted:
			granted++
			n.logger.Warn("took over the home", "stream", nt.Range.Key.Stream, "range", nt.Range.Key.Range,
				"from", nt.Region, "epoch", nt.Range.Epoch+1, "start_offset", nt.Range.StartOffset)
		}
	}
	if granted > 0 {
		n.metrics.takeovers.Add(context.Background(), int64(granted))
	}
}

// candidate is this copy as a takeover candidate (regionTails). A copy
// relearning its commit index after the machine's crash is passed over:
// its committed end may be below what it published, and below where the
// log it holds leaves the range's timeline (a divergent tail its fence
// would not show). A copy holding a divergent tail (takeoverTail), or one
// that heard of an epoch it cannot place yet (heardUnplaced), bars its
// region from taking the range.
func (d *rangeDriver) candidate() copyCandidate {
	c := copyCandidate{tail: d.committed.Load(), barred: d.heardUnplaced()}
	if d.rep != nil {
		c.relearning = d.rep.Relearning()
	}
	var fence *uint64
	if f := d.fenceNow(); f != nil {
		fence = &f.offset
	}
	if _, fine := takeoverTail(c.tail, fence); !fine {
		c.barred = true
	}
	return c
}

// heardUnplaced reports whether this copy heard, from a home's replicator
// heartbeat, of an epoch newer than both its log's and the directory's:
// one whose start it does not know yet. Its fence then waits for the
// store's answer (timeline.go: a heartbeat's epoch does not fence), so a
// divergent tail past that start would not show in its candidate tail;
// it is no takeover candidate until the store places the epoch (one round
// trip, asked at once). Its region's agent then takes nothing at it, and
// the other regions' agents, which may rank this region best from its
// DescribeStream, take the range at their own tails after failoverGrace.
// Without this, a region that was home, lost the range with a tail of its
// own and then heard the new home's heartbeat could win a takeover past
// that tail, whose start the new home's gate refuses for good
// (rangecore.StartDivergedBelow).
func (d *rangeDriver) heardUnplaced() bool {
	if d.rep == nil {
		return false
	}
	return d.highestEpoch.Load() > max(d.role().epoch, d.rep.HighestEpoch())
}

// takeoverTail is a copy's tail as a candidate to take its range over (or
// to start it after a planned rehome): its committed end, unless the copy
// holds a divergent tail, i.e. its timeline fence (timeline.go: the lowest
// start of an epoch newer than its log's; nil when none) is below its
// committed end. From the fence on, such a copy holds records of an older
// epoch that the range's log replaced (a returning old home's unreplicated
// tail, or a mirror that was ahead of the region that took over); taking
// the range at its end would keep them below the new epoch's start and
// drop what the intervening epoch acked there. It is no candidate (false)
// until it forks (the home's first batch moves that tail to its orphan
// log). Found by the simulator (notes/simfaults.md, product bug 2).
func takeoverTail(committed uint64, fence *uint64) (uint64, bool) {
	if fence != nil && *fence < committed {
		return 0, false
	}
	return committed, true
}

// surveyTails reads, all at once, each other region's tails of a stream
// that asks names (Remote: a region none of whose nodes answered is
// absent) and this region's of keys (Local: a key missing is one this
// region is no candidate for), every one from all the region's nodes
// (regionTails: its best copies). Each may wait Config.TailSurveyTimeout
// for a node that does not answer.
func (a *failoverAgent) surveyTails(ctx context.Context, asks []homing.TailAsk, keys []homing.RangeKey) homing.TailReport {
	own := a.n.cfg.Region
	all := slices.Clone(asks)
	for _, k := range keys {
		if q := (homing.TailAsk{Region: own, Stream: k.Stream}); !slices.Contains(all, q) {
			all = append(all, q)
		}
	}
	type surveyed struct {
		tails    []uint64
		ok       []bool
		answered bool
	}
	got := make([]surveyed, len(all))
	var wg sync.WaitGroup
	for i, q := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := &got[i]
			g.tails, g.ok, g.answered = a.n.regionTails(ctx, q.Region, q.Stream)
		}()
	}
	wg.Wait()
	rep := homing.TailReport{Remote: map[string]map[string][]uint64{}, Local: map[homing.RangeKey]uint64{}}
	ownOf := map[string]surveyed{}
	for i, q := range all {
		switch g := got[i]; {
		case !g.answered:
		case q.Region == own:
			ownOf[q.Stream] = g
		default:
			if rep.Remote[q.Region] == nil {
				rep.Remote[q.Region] = map[string][]uint64{}
			}
			rep.Remote[q.Region][q.Stream] = g.tails
		}
	}
	for _, k := range keys {
		if g := ownOf[k.Stream]; int(k.Range) < len(g.ok) && g.ok[k.Range] {
			rep.Local[k] = g.tails[k.Range]
		}
	}
	return rep
}
