package homing

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var (
	invSeeds = flag.Int("homing.seeds", 100, "seeds of TestInvariantRandomized")
	invSeed  = flag.Int64("homing.seed", 0, "replay one seed of TestInvariantRandomized")
)

// TestInvariantRandomized is a seeded model check of invariant 5 over Cores
// and the in-memory store: nodes in three regions with clocks skewed within
// the max offset heartbeat (or are cut off from the store, or restart),
// while takeovers and planned rehomes run. After every step, every node that
// would ack a range must be in the range's current home region at its
// current epoch: no ack under an epoch older than the newest granted, at
// most one home per epoch. A failing seed is printed; replay it with
// -homing.seed=N.
func TestInvariantRandomized(t *testing.T) {
	first, n := int64(1), int64(*invSeeds)
	if *invSeed != 0 {
		first, n = *invSeed, 1
	}
	for seed := first; seed < first+n; seed++ {
		if err := runInvariantSeed(seed, 250); err != nil {
			t.Fatalf("seed %d: %v (replay: go test ./homing -run TestInvariantRandomized -homing.seed=%d)", seed, err, seed)
		}
	}
}

type simNode struct {
	id       uint64
	region   string
	skew     int64 // clock = true time + skew
	cut      bool  // cannot reach the store
	core     *Core
	inflight *HeartbeatRequest
}

func runInvariantSeed(seed int64, steps int) error {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x9e3779b97f4a7c15))
	ctx := context.Background()
	const offset = int64(500 * time.Millisecond)
	cfg := CoreConfig{HeartbeatIntervalNanos: int64(time.Second), RetryIntervalNanos: int64(250 * time.Millisecond),
		LivenessTTLNanos: int64(4 * time.Second), MaxOffsetNanos: offset}
	store := NewMemStore()
	regions := []string{"us", "eu", "ap"}
	var nodes []*simNode
	for i := range 7 {
		n := &simNode{id: uint64(i + 1), region: regions[i%3], skew: rng.Int64N(offset+1) - offset/2}
		c := cfg
		c.NodeID, c.Region = n.id, n.region
		core, err := NewCore(c)
		if err != nil {
			return err
		}
		n.core = core
		nodes = append(nodes, n)
	}
	var keys []RangeKey
	var specs []HomeSpec
	for r := range uint32(6) {
		k := RangeKey{Stream: "s", Range: r}
		keys = append(keys, k)
		specs = append(specs, HomeSpec{Key: k, Region: regions[rng.IntN(3)]})
	}
	if _, err := store.CreateHomes(ctx, specs); err != nil {
		return err
	}
	now := int64(time.Hour) // true time
	var log []string
	fail := func(format string, args ...any) error {
		tail := log
		if len(tail) > 15 {
			tail = tail[len(tail)-15:]
		}
		return fmt.Errorf("%s\nlast steps:\n  %s", fmt.Sprintf(format, args...), joinLines(tail))
	}
	for step := range steps {
		now += rng.Int64N(int64(700 * time.Millisecond))
		n := nodes[rng.IntN(len(nodes))]
		clock := now + n.skew
		switch p := rng.IntN(100); {
		case p < 55: // heartbeat, if due; the answer may come back later
			if n.inflight == nil {
				if req, ok := n.core.Next(clock); ok {
					n.inflight = &req
				}
			}
			if n.inflight != nil && rng.IntN(3) > 0 {
				req := *n.inflight
				n.inflight = nil
				var res HeartbeatResult
				var err error
				if n.cut {
					err = newError(ErrStoreUnavailable, "cut")
				} else {
					res, err = store.Heartbeat(ctx, req)
				}
				n.core.Done(req, res, err)
				log = append(log, fmt.Sprintf("%d: n%d heartbeat sent %d err=%v", step, n.id, req.NowNanos, err))
			}
		case p < 63:
			n.cut = !n.cut
			log = append(log, fmt.Sprintf("%d: n%d cut=%v", step, n.id, n.cut))
		case p < 66: // restart: a new process with an empty view
			c := cfg
			c.NodeID, c.Region = n.id, n.region
			n.core, _ = NewCore(c)
			n.inflight = nil
			log = append(log, fmt.Sprintf("%d: n%d restarts", step, n.id))
		case p < 80: // takeover by n's region of everything homed in another
			from := regions[rng.IntN(3)]
			if from == n.region || n.cut {
				continue
			}
			homes, _, _ := store.RegionHomes(ctx, from)
			if len(homes) == 0 {
				continue
			}
			req := TakeoverRequest{From: from, To: n.region, NowNanos: clock, MaxOffsetNanos: offset}
			for _, h := range homes {
				req.Ranges = append(req.Ranges, TakeoverRange{Key: h.Key, Epoch: h.Epoch, StartOffset: uint64(step)})
			}
			res, err := store.Takeover(ctx, req)
			log = append(log, fmt.Sprintf("%d: n%d takeover %s->%s at %d: granted %d err=%v", step, n.id, from, n.region, clock, res.Granted(), err))
		default: // a planned rehome step on a random range
			k := keys[rng.IntN(len(keys))]
			hs, _ := store.Homes(ctx, []RangeKey{k})
			h := hs[0]
			to := regions[rng.IntN(3)]
			req := RehomeRequest{Key: k, Epoch: h.Epoch, To: to, StartOffset: uint64(step), NowNanos: clock, MaxOffsetNanos: offset}
			var err error
			switch rng.IntN(3) {
			case 0:
				_, err = store.PrepareRehome(ctx, req)
			case 1:
				req.To = h.MovingTo
				if req.To == "" {
					req.To = to
				}
				_, err = store.CompleteRehome(ctx, req)
			default:
				_, err = store.CancelRehome(ctx, req)
			}
			log = append(log, fmt.Sprintf("%d: rehome %s epoch %d to %s: %v", step, k, h.Epoch, req.To, err))
		}

		// Invariant 5, at this instant, by every node's own clock.
		current, _ := store.Homes(ctx, keys)
		for _, m := range nodes {
			v := m.core.View()
			for i, k := range keys {
				e, err := v.Check(k, now+m.skew)
				if err != nil {
					continue
				}
				if m.region != current[i].Region || e != current[i].Epoch {
					return fail("step %d: n%d (%s) may ack %s at epoch %d, but it is homed in %s at epoch %d",
						step, m.id, m.region, k, e, current[i].Region, current[i].Epoch)
				}
			}
		}
	}
	// One record per epoch, consecutive; the stream's history is the
	// ranges' in order.
	var perRange []EpochRecord
	for _, k := range keys {
		hist, _ := store.History(ctx, k)
		for i, r := range hist {
			if r.Epoch != uint64(i+1) {
				return fail("%s history %+v", k, hist)
			}
		}
		perRange = append(perRange, hist...)
	}
	if all, err := store.StreamHistory(ctx, "s"); err != nil || !slices.Equal(all, perRange) {
		return fail("stream history %+v (%v), the ranges' %+v", all, err, perRange)
	}
	return nil
}

func joinLines(s []string) string {
	out := ""
	for i, l := range s {
		if i > 0 {
			out += "\n  "
		}
		out += l
	}
	return out
}
