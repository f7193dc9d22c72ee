package regionsvc

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	geologv1 "github.com/geolog/geolog/proto/geologv1"

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

// failoverScanInterval is how often the agent looks. It reads a region's
// liveness records only when they could have expired by then (see
// regionDead), so a short interval costs no lease-store reads and the
// takeover follows the last expiry within it.
const failoverScanInterval = 50 * time.Millisecond

// failoverGrace is how long the agent of a region that is not the best
// candidate waits, once a home region is dead, before taking over itself.
const failoverGrace = 3 * time.Second

type failoverAgent struct {
	n *Node
	// deadSince is when each home region was first seen dead.
	deadSince map[string]time.Time
	// aliveUntil is, per region, the first instant at which every node of
	// it may be dead by its liveness records as last read (latest
	// expiration plus the max clock offset): no need to read them before.
	aliveUntil map[string]time.Time
	// liveSince is when this node's own lease last became valid after it
	// had none (zero while it has none).
	liveSince time.Time
}

func newFailoverAgent(n *Node) *failoverAgent {
	return &failoverAgent{n: n, deadSince: map[string]time.Time{}, aliveUntil: map[string]time.Time{}}
}

// settle is how long the agent's own lease must have held before it
// judges other regions by their liveness: a lease TTL plus the max clock
// offset.
func (a *failoverAgent) settle() time.Duration {
	return a.n.cfg.LeaseTTL + a.n.cfg.MaxClockOffset
}

// scan runs one round (on the homing loop).
func (a *failoverAgent) scan(ctx context.Context) {
	n := a.n
	if n.cfg.FailoverDisabled || !n.leadsCatalogue() {
		clear(a.deadSince)
		clear(a.aliveUntil)
		return
	}
	hs := n.homing
	now := n.cfg.Now()
	if v := hs.homes.View(); v.ServeUntilNanos == 0 || now.UnixNano() >= v.ServeUntilNanos {
		a.liveSince = time.Time{}
		return // not live itself: it could not serve what it took
	}
	if a.liveSince.IsZero() {
		a.liveSince = now
	}
	if now.Sub(a.liveSince) < a.settle() {
		// This node just gained (or regained) its lease: the store may
		// have been out for every region, whose homes renew now too. Their
		// expired liveness says nothing until they had a lease's time to
		// renew with the store back.
		return
	}
	byRegion := map[string][]homing.Home{}
	hs.dirMu.Lock()
	for _, h := range hs.dir {
		if h.Region != n.cfg.Region && h.MovingTo == "" {
			byRegion[h.Region] = append(byRegion[h.Region], h)
		}
	}
	hs.dirMu.Unlock()
	for from, homes := range byRegion {
		if !a.regionDead(ctx, from, now) {
			delete(a.deadSince, from)
			continue
		}
		if _, ok := a.deadSince[from]; !ok {
			a.deadSince[from] = now
			n.logger.Warn("home region may be down: every node's liveness has expired", "region", from, "ranges", len(homes))
		}
		graceOver := now.Sub(a.deadSince[from]) >= failoverGrace
		tails := a.surveyTails(ctx, from, homes) // region → stream → range tails
		var take []homing.TakeoverRange
		for _, h := range homes {
			spec, ok := n.streamSpec(h.Key.Stream)
			if !ok {
				continue
			}
			d, err := n.rangeOf(ctx, h.Key.Stream, h.Key.Range)
			if err != nil || d.rep == nil || d.failure.Load() != nil {
				continue
			}
			mine := d.committed.Load()
			best, bestTail := n.cfg.Region, mine
			order := orderRegions(spec.Regions, n.cfg.FailoverOrder)
			for _, r := range order {
				if r == n.cfg.Region || r == from {
					continue
				}
				rt := tails[r][spec.Name]
				if int(h.Key.Range) >= len(rt) {
					continue // unreachable: not a candidate
				}
				t := rt[h.Key.Range]
				if t > bestTail || (t == bestTail && slices.Index(order, r) < slices.Index(order, best)) {
					best, bestTail = r, t
				}
			}
			if best != n.cfg.Region && !graceOver {
				continue
			}
			take = append(take, homing.TakeoverRange{Key: h.Key, Epoch: h.Epoch, StartOffset: mine})
		}
		if len(take) == 0 {
			continue
		}
		tookOver := false
		for len(take) > 0 {
			chunk := take[:min(len(take), homing.RangesPerRequestMax)]
			take = take[len(chunk):]
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			res, err := hs.homes.Takeover(cctx, from, chunk)
			cancel()
			if err != nil {
				n.logger.Warn("takeover failed", "from", from, "ranges", len(chunk), "error", err)
				break
			}
			granted := 0
			for i, o := range res.Ranges {
				if o.Outcome == homing.Granted {
					granted++
					n.logger.Warn("took over the home", "stream", chunk[i].Key.Stream, "range", chunk[i].Key.Range,
						"from", from, "epoch", chunk[i].Epoch+1, "start_offset", chunk[i].StartOffset)
				}
			}
			n.metrics.takeovers.Add(context.Background(), int64(granted))
			if granted > 0 {
				tookOver = true
			}
		}
		// The directory is stale for what moved: read it again now.
		n.refreshDirectory(ctx)
		if tookOver {
			// Every node of this region (which leads the ranges now) and
			// of the other surviving regions (which redirect producers
			// here) learns of it at once, not at its next heartbeat.
			for _, r := range append([]string{n.cfg.Region}, slices.Collect(maps.Keys(n.cfg.Regions))...) {
				if r == from {
					continue
				}
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
}

// surveyTails asks, at once, every surviving region of the streams of
// homes (but this one and from) for its ranges' tails.
func (a *failoverAgent) surveyTails(ctx context.Context, from string, homes []homing.Home) map[string]map[string][]uint64 {
	n := a.n
	type ask struct{ region, stream string }
	asks := map[ask]bool{}
	for _, h := range homes {
		spec, ok := n.streamSpec(h.Key.Stream)
		if !ok {
			continue
		}
		for _, r := range spec.Regions {
			if r != n.cfg.Region && r != from {
				asks[ask{r, spec.Name}] = true
			}
		}
	}
	out := map[string]map[string][]uint64{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for q := range asks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := n.remoteTails(ctx, q.region, q.stream)
			mu.Lock()
			defer mu.Unlock()
			if out[q.region] == nil {
				out[q.region] = map[string][]uint64{}
			}
			out[q.region][q.stream] = t
		}()
	}
	wg.Wait()
	return out
}

// regionDead reports whether every node of region may be dead by the lease
// store (and the store answered).
func (a *failoverAgent) regionDead(ctx context.Context, region string, now time.Time) bool {
	n := a.n
	if now.Before(a.aliveUntil[region]) {
		return false
	}
	cctx, cancel := context.WithTimeout(ctx, n.storeTimeout())
	defer cancel()
	live, err := n.homing.store.Liveness(cctx, region)
	if err != nil || len(live) == 0 {
		return false
	}
	latest := int64(0)
	for _, l := range live {
		latest = max(latest, l.ExpirationNanos+int64(n.cfg.MaxClockOffset))
	}
	if now.UnixNano() <= latest {
		a.aliveUntil[region] = time.Unix(0, latest+1)
		return false
	}
	return true
}

// remoteTails asks region for the committed tails of a stream's ranges, as
// one of its nodes sees them; nil when no node answers.
func (n *Node) remoteTails(ctx context.Context, region, stream string) []uint64 {
	for _, addr := range n.cfg.Regions[region] {
		conn, err := n.peerConn(addr)
		if err != nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := geologv1.NewLogClient(conn).DescribeStream(cctx, &geologv1.DescribeStreamRequest{Name: stream})
		cancel()
		if err != nil {
			continue
		}
		out := make([]uint64, len(resp.GetRanges()))
		for _, ri := range resp.GetRanges() {
			if int(ri.GetRange()) < len(out) {
				out[ri.GetRange()] = ri.GetTailOffset()
			}
		}
		return out
	}
	return nil
}
