package sim

import (
	"context"
	"fmt"
	"slices"

	"github.com/geolog/geolog/homing"
)

// agent is a region's failover agent: the real decision core
// (homing.Takeover), driven as regionsvc's failoverAgent drives it, on
// the region's lowest live node (standing in for its catalogue leader),
// every failoverScanMs. Its ops are carried out at once: liveness reads
// and takeovers are MemStore calls (cancelled when the node cannot reach
// the store), a tails survey reads the copies regionsvc reads: every
// node of each region that answers (survey).
// Refreshes are left to the heartbeats. It is offered every range homed
// outside its region (the home directory), so a range taken over can be
// taken over again (second.go).
type agent struct {
	h      *homeWorld
	region int
	core   *homing.Takeover
}

func newAgent(h *homeWorld, g int) (*agent, error) {
	regions := make([]string, h.w.opt.Regions)
	for i := range regions {
		regions[i] = regionName(i)
	}
	settle := int64(leaseTTLMs+maxOffsetMs) * 1e6
	if h.w.opt.mutateNoSettle {
		settle = 0
	}
	core, err := homing.NewTakeover(homing.TakeoverConfig{Region: regionName(g), Regions: regions,
		SettleNanos: settle, GraceNanos: 3e9, MaxOffsetNanos: maxOffsetMs * 1e6})
	return &agent{h: h, region: g, core: core}, err
}

// node is the node the agent runs on: the region's lowest live one.
func (a *agent) node() *node {
	for _, n := range a.h.w.regionNodes(a.region) {
		if n.up {
			return n
		}
	}
	return nil
}

// scan runs one round: a tick, then the core's ops until it asks for
// nothing more (regionsvc's failoverAgent.scan).
func (a *agent) scan() {
	h, w := a.h, a.h.w
	n := a.node()
	tk := homing.TakeoverTick{NowNanos: w.nodeNanos(n), Leading: n != nil, Streams: map[string][]string{"sim": a.order()}}
	if n != nil {
		v := n.core.View()
		tk.ServeUntilNanos, tk.StoreUnreached, tk.ReachedSinceNanos = v.ServeUntilNanos, v.Failures > 0, v.ReachedSinceNanos
		for _, home := range h.homes {
			if home.Region != regionName(a.region) {
				tk.Homes = append(tk.Homes, home) // the directory: homed elsewhere
			}
		}
	}
	a.core.Tick(tk)
	for i := 0; i < 100 && w.err == nil; i++ {
		ops, _ := a.core.Ready()
		if len(ops) == 0 {
			return
		}
		for _, op := range ops {
			if op.Kind.Awaited() && !a.core.Current(op.Round) {
				continue
			}
			a.do(n, op)
		}
	}
}

// order is the failover preference order: the regions after this one's
// home, in turn.
func (a *agent) order() []string {
	out := []string{}
	for i := 1; i <= a.h.w.opt.Regions; i++ {
		out = append(out, regionName(i%a.h.w.opt.Regions))
	}
	return out
}

// ctx is the context of a store call from n: cancelled (the store
// answers unavailable) when n cannot reach it.
func (a *agent) ctx(n *node) context.Context {
	if n == nil || a.h.unreachable(n) {
		c, cancel := context.WithCancel(context.Background())
		cancel()
		return c
	}
	return context.Background()
}

// do carries out one op and feeds its answer back.
func (a *agent) do(n *node, op homing.TakeoverOp) {
	h, w := a.h, a.h.w
	switch op.Kind {
	case homing.OpReadLiveness:
		live, err := h.store.Liveness(a.ctx(n), op.Region)
		a.core.LivenessRead(op.Round, live, err)
	case homing.OpSurveyTails:
		a.core.TailsRead(op.Round, a.survey(n, op))
	case homing.OpTakeover:
		if w.opt.mutateShortStart {
			for i := range op.Ranges {
				op.Ranges[i].StartOffset -= min(op.Ranges[i].StartOffset, 1)
			}
		}
		res, err := h.store.Takeover(a.ctx(n), homing.TakeoverRequest{From: op.Region, To: regionName(a.region),
			NowNanos: w.nodeNanos(n), MaxOffsetNanos: maxOffsetMs * 1e6, Ranges: op.Ranges})
		if err == nil {
			for _, o := range res.Ranges {
				if o.Outcome == homing.Granted {
					h.granted(int(o.Key.Range), o.Home)
				}
			}
		}
		a.core.TakeoverDone(op.Round, res, err)
	}
}

// survey reads the tails op asks for on node n (the agent's), as
// regionsvc's failoverAgent does: each region's from every node of it
// that answers n (regionTails: its own region's over the region's
// network, the others' over the WAN, none while n is cut off it),
// combined as regionsvc's regionCandidates combines them (regionTail).
func (a *agent) survey(n *node, op homing.TakeoverOp) homing.TailReport {
	h := a.h
	rep := homing.TailReport{Remote: map[string]map[string][]uint64{}, Local: map[homing.RangeKey]uint64{}}
	if n == nil {
		return rep
	}
	if !h.unreachable(n) {
		for _, ask := range op.Asks {
			if t := a.remoteTails(n, regionIndex(ask.Region)); t != nil {
				rep.Remote[ask.Region] = map[string][]uint64{"sim": t}
			}
		}
	}
	local := h.answering(n, n.region)
	for _, k := range op.Keys {
		if tail, ok := a.candidateTail(local, n.region, int(k.Range)); ok {
			rep.Local[k] = tail
		}
	}
	return rep
}

// remoteTails is region g's tail of every range as regionsvc's tailsOf
// reads it from node n: 0 for a range the region is no candidate for;
// nil when no node answers (down, or cut off the WAN).
func (a *agent) remoteTails(n *node, g int) []uint64 {
	ns := a.h.answering(n, g)
	if len(ns) == 0 {
		return nil
	}
	out := make([]uint64, a.h.w.opt.Ranges)
	for r := range out {
		out[r], _ = a.candidateTail(ns, g, r)
	}
	return out
}

// candidateTail is region g's tail of range r from the copies on ns
// (regionTail), counting a region barred by a divergent copy
// (Result.DivergentTakers) and a candidate whose group may still commit
// past its tail at the old epoch (Result.InFlightTakers: a verbatim apply
// in flight, frames in a leader's log past its committed end (a new leader
// commits its predecessor's entries with its first own), or a copy behind
// what its group holds (seed 227). A candidate all the same, as in
// regionsvc: the new home raises the epoch's start to its log's end
// before its first frame (epochstart.go).
func (a *agent) candidateTail(ns []*node, g, r int) (uint64, bool) {
	h := a.h
	for _, m := range ns {
		if h.hidesDivergent(r, m) {
			h.res.RelearningTakers++
			break
		}
	}
	tail, ok, barred := h.regionTail(ns, r, h.w.opt.mut.takerDivergent)
	if barred {
		h.res.DivergentTakers++
	}
	if ok && a.inFlight(g, r, tail) {
		h.res.InFlightTakers++
	}
	return tail, ok
}

// answering is the nodes of region g whose DescribeStream reaches node n
// (regionsvc's regionTails asks them all at once): n itself; in its own
// region, the live nodes neither of them cut off the region; in another,
// the live nodes on the WAN (the caller checks n's own reach).
func (h *homeWorld) answering(n *node, g int) []*node {
	w := h.w
	var out []*node
	for _, m := range w.regionNodes(g) {
		switch {
		case !m.up:
		case m == n:
			out = append(out, m)
		case g == n.region:
			if !w.cut(g, m.id) && !w.cut(g, n.id) {
				out = append(out, m)
			}
		case !h.unreachable(m):
			out = append(out, m)
		}
	}
	return out
}

// regionTail is a region's tail of range r from its copies on ns, as
// regionsvc's regionCandidates combines them: the highest committed end
// of a copy that is the range's log (its node a voter or a learner in the
// configuration it applied) and not relearning its commit index, and
// whether the region is a candidate at all (such a copy answered, and
// none holds a divergent tail: barred).
//
// A copy relearning after its machine's crash is passed over: its
// committed end may be below what it published and below where its log
// leaves the range's timeline, so that the divergent check below would
// pass a divergent tail and the new home's start gate then raise the
// start over it (Options.mut.takerRelearning counts it all the same:
// TestTakerRelearningIsChecked; the product's gate then forks the tail
// off at the intervening epoch's start, rangecore.DivergeAt, so the
// checks report it only with homeNoFork too).
// A copy whose log ends in an epoch older than the range's and runs past
// where the range's log left that epoch holds a divergent tail (it has
// not forked yet), and bars its region: taking over at its tail would
// keep the divergent records below the new epoch's start and lose what
// the intervening epoch acked there (found by the simulator, seed 46 of
// the first runs with second takeovers, when regionsvc's agent reported
// the raw committed end; see notes/simfaults.md). takeDivergent
// (Options.mut.takerDivergent, rehomeDivergent) counts it as any copy.
//
// The region's best copy, not the agent's node's: a follower's committed
// end may lag its leader's, and a replica added back empty holds nothing
// (seed 6681378: a takeover "from 0" against the region's 92).
// Options.mut.takerOwnCopy reads only the first of ns (the agent's node,
// or the coordinator's), as regionsvc's agent did.
func (h *homeWorld) regionTail(ns []*node, r int, takeDivergent bool) (tail uint64, ok, barred bool) {
	mut := h.w.opt.mut
	if mut.takerOwnCopy && len(ns) > 1 {
		ns = ns[:1]
	}
	for _, m := range ns {
		rep := m.replicas[r]
		conf := rep.Conf()
		switch {
		case !slices.Contains(conf.GetVoters(), uint64(m.id)) && !slices.Contains(conf.GetLearners(), uint64(m.id)):
			// Not the range's log (a replica removed, as it applied
			// its configuration): RangeInfo.not_member.
		case rep.Relearning() && !mut.takerRelearning:
		case !takeDivergent && h.divergent(r, m):
			barred = true
		default:
			tail, ok = max(tail, rep.Committed()), true
		}
	}
	if barred {
		return 0, false, true
	}
	return tail, ok, false
}

// inFlight reports whether region g's group of range r may still commit
// past tail at the old epoch: a live copy has an append in flight or
// frames in its log past tail.
func (a *agent) inFlight(g, r int, tail uint64) bool {
	for _, n := range a.h.w.regionNodes(g) {
		if n.up && (n.replicas[r].Pending() > 0 || n.stores[r].NextOffset() > tail) {
			return true
		}
	}
	return false
}

// divergent reports whether node n's copy of range r holds a divergent
// tail: its log ends in an epoch older than the range's and runs past
// where the range's log left that epoch (regionsvc's takeoverTail: its
// timeline fence is below its committed end). Such a copy is no takeover
// candidate, and a planned rehome's target waits for it to fork and
// catch up: no offset of it may be continued from until it forks.
func (h *homeWorld) divergent(r int, n *node) bool {
	rep := n.replicas[r]
	e := rep.HighestEpoch()
	return e < h.homes[r].Epoch && rep.Committed() > h.epochStart(r, e)
}

// hidesDivergent reports whether node n's copy of range r relearns its
// commit index with a divergent tail its lowered committed end hides:
// its log ends in an epoch older than the range's and runs past where
// the range's log left that epoch, while its committed end (what its
// durable marks cover, replica's relearn.go) is at or below it, so that
// divergent passes it (Result.Homing.RelearningTakers: the window
// Options.mut.takerRelearning needs).
func (h *homeWorld) hidesDivergent(r int, n *node) bool {
	rep := n.replicas[r]
	if !rep.Relearning() {
		return false
	}
	e := rep.HighestEpoch()
	at := h.epochStart(r, e)
	return e < h.homes[r].Epoch && rep.Committed() <= at && n.stores[r].NextOffset() > at
}

// regionIndex is the index of region name "r<g>".
func regionIndex(name string) int {
	var g int
	fmt.Sscanf(name, "r%d", &g)
	return g
}

// trackReach notes since when each node has been up and able to reach
// the store.
func (h *homeWorld) trackReach() {
	for i, n := range h.w.nodes {
		switch {
		case !n.up || h.unreachable(n):
			h.reachSince[i] = -1
		case h.reachSince[i] < 0:
			h.reachSince[i] = h.w.now
		}
	}
}

// checkNeeded fails the run if a range is taken from a home region one of
// whose nodes has been up and able to reach the store for a lease TTL
// plus the max clock offset, and so might have renewed its lease (an
// unnecessary failover: the agent took a home that was about to renew,
// as after a lease-store outage without the settle wait).
func (h *homeWorld) checkNeeded(r int, from string) error {
	g := regionIndex(from)
	for i, n := range h.w.regionNodes(g) {
		since := h.reachSince[g*h.w.opt.Nodes+i]
		if since >= 0 && h.w.now-since > leaseTTLMs+maxOffsetMs+heartbeatRetryMs {
			return fmt.Errorf("range %d: taken over from %s while %v had been up and reaching the store for %d ms (an unnecessary failover)", r, from, n, h.w.now-since)
		}
	}
	return nil
}
