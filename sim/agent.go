package sim

import (
	"context"
	"fmt"

	"github.com/geolog/geolog/homing"
)

// agent is a region's failover agent: the real decision core
// (homing.Takeover), driven as regionsvc's failoverAgent drives it, on
// the region's lowest live node (standing in for its catalogue leader),
// every failoverScanMs. Its ops are carried out at once: liveness reads
// and takeovers are MemStore calls (cancelled when the node cannot reach
// the store), a tails survey reads each answering region's range leaders'
// committed ends. Refreshes are left to the heartbeats. It is offered
// every range homed outside its region (the home directory), so a range
// taken over can be taken over again (second.go).
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
		rep := homing.TailReport{Remote: map[string]map[string][]uint64{}, Local: map[homing.RangeKey]uint64{}}
		for _, ask := range op.Asks {
			if g := regionIndex(ask.Region); !w.geo.partitioned(g) && !w.geo.partitioned(a.region) {
				rep.Remote[ask.Region] = map[string][]uint64{"sim": a.tails(g)}
			}
		}
		for _, k := range op.Keys {
			if tail, ok := a.tail(a.region, int(k.Range)); ok {
				rep.Local[k] = tail
			}
		}
		a.core.TailsRead(op.Round, rep)
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

// tails is region g's committed end per range, by its leaders (0 where
// none leads).
func (a *agent) tails(g int) []uint64 {
	w := a.h.w
	out := make([]uint64, w.opt.Ranges)
	for r := range out {
		out[r], _ = a.tail(g, r)
	}
	return out
}

// tail is region g's committed end of range r, by its leader, and
// whether the region may take the range over (a candidate). A copy whose
// log ends in an epoch older than the range's and runs past where the
// range's log left that epoch holds a divergent tail (it has not forked
// yet): it is no candidate. Taking over at its tail would keep the
// divergent records below the new epoch's start and lose what the
// intervening epoch acked there (found by the simulator, seed 46 of the
// first runs with second takeovers: regionsvc's failoverAgent.localTails
// and remoteTails report the raw committed end; see notes/simfaults.md).
// Options.mut.takerDivergent reports the raw end, as they do.
func (a *agent) tail(g, r int) (uint64, bool) {
	w := a.h.w
	l := w.leaderOf(g, r)
	if l == nil {
		return 0, false
	}
	rep := l.replicas[r]
	c := rep.Committed()
	if rep.Relearning() {
		return 0, false // its committed end may be behind (candidateTail)
	}
	if !w.opt.mut.takerDivergent && a.h.divergent(r, l) {
		a.h.res.DivergentTakers++
		return 0, false
	}
	if rep.Pending() > 0 || l.stores[r].NextOffset() > c {
		// A verbatim apply in flight, or frames in the leader's log past
		// its committed end (a new leader commits its predecessor's
		// entries with its first own), may commit past the tail read now,
		// at the old epoch (seed 227). A candidate all the same, as in
		// regionsvc: the new home raises the epoch's start to its log's
		// end before its first frame (epochstart.go).
		a.h.res.InFlightTakers++
	}
	return c, true
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
