package homing

import (
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"testing"
)

// TestTakeoverRandomInputs drives the failover core with seeded random
// ticks (lead gained and lost, own lease lapsing), liveness answers (live,
// expired, errors), surveys and takeover answers, carrying out ops the way
// a driver does (an awaited op of a dropped round is skipped). For every
// takeover the core asks for it checks the safety rules from first
// principles:
//
//   - the node leads and holds a lease that has held for the settle time;
//   - the region's liveness read in the same round answered, non-empty,
//     with every record past its expiration plus the max offset;
//   - each range is homed in that region by the directory of the round's
//     tick, at the requested epoch, not moving, with a local replica, and
//     starts at this node's tail;
//   - unless the grace since the region was first seen dead is over, no
//     surveyed region's mirror is further ahead.
func TestTakeoverRandomInputs(t *testing.T) {
	taken := 0
	for seed := int64(1); seed <= 100; seed++ {
		n, err := randomTakeover(rand.New(rand.NewSource(seed)))
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		taken += n
	}
	if taken == 0 {
		t.Fatal("no run took anything: the checks above say little")
	}
	t.Logf("%d takeover requests checked", taken)
}

func randomTakeover(rng *rand.Rand) (int, error) {
	const settle, grace, offset = 1000, 300, 50
	c, err := NewTakeover(TakeoverConfig{Region: "eu", Regions: []string{"us", "eu", "ap"},
		SettleNanos: settle, GraceNanos: grace, MaxOffsetNanos: offset, ChunkRangesMax: 2})
	if err != nil {
		return 0, err
	}
	streams := map[string][]string{"chat": {"eu", "ap", "us"}, "logs": {"ap", "eu", "us"}}
	dir := map[RangeKey]Home{}
	for r := range 3 {
		for _, s := range []string{"chat", "logs"} {
			k := RangeKey{Stream: s, Range: uint32(r)}
			dir[k] = Home{Key: k, Region: []string{"us", "ap"}[rng.Intn(2)], Epoch: 1}
		}
	}
	var (
		now, liveSince int64
		leading        bool
		roundNow       int64
		roundDir       map[RangeKey]Home
		deadRead       = map[string]bool{} // this round: liveness said dead
		firstDead      = map[string]int64{}
		lastRemote     map[string]map[string][]uint64
		lastLocal      map[RangeKey]uint64
		checked        int
	)
	for step := 0; step < 300; step++ {
		now += int64(rng.Intn(100))
		lead := rng.Intn(20) > 0
		serve := now + 500
		if rng.Intn(15) == 0 {
			serve = 0
		}
		if !lead {
			clear(firstDead)
		} else if serve == 0 {
			liveSince = 0
		} else if liveSince == 0 {
			liveSince = now
		}
		if rng.Intn(10) == 0 { // the directory changes: a range moves or starts moving
			k := RangeKey{Stream: []string{"chat", "logs"}[rng.Intn(2)], Range: uint32(rng.Intn(3))}
			h := dir[k]
			h.Region, h.Epoch, h.MovingTo = []string{"us", "ap", "eu"}[rng.Intn(3)], h.Epoch+1, ""
			if rng.Intn(4) == 0 {
				h.MovingTo = "eu"
			}
			dir[k] = h
		}
		tk := TakeoverTick{NowNanos: now, Leading: lead, ServeUntilNanos: serve, Streams: streams}
		for _, h := range dir {
			tk.Homes = append(tk.Homes, h)
		}
		leading = lead
		busy := c.Busy()
		c.Tick(tk)
		if !busy && c.Busy() {
			roundNow, roundDir, deadRead = now, cloneDir(dir), map[string]bool{}
		}
		for {
			ops, _ := c.Ready()
			if len(ops) == 0 {
				break
			}
			for _, op := range ops {
				if rng.Intn(40) == 0 {
					c.LeaderChanged(false)
					leading = false
					clear(firstDead)
				}
				if op.Kind.Awaited() && !c.Current(op.Round) {
					continue
				}
				switch op.Kind {
				case OpReadLiveness:
					var live []Liveness
					var err error
					switch rng.Intn(5) {
					case 0:
						err = errors.New("store down")
					case 1:
						live = []Liveness{{NodeID: 1, ExpirationNanos: roundNow + int64(rng.Intn(200))}}
					default:
						live = []Liveness{{NodeID: 1, ExpirationNanos: roundNow - offset - 1 - int64(rng.Intn(500))}}
					}
					dead := err == nil && len(live) > 0 && roundNow > live[0].ExpirationNanos+offset
					deadRead[op.Region] = dead
					if dead {
						if _, ok := firstDead[op.Region]; !ok {
							firstDead[op.Region] = roundNow
						}
					} else {
						delete(firstDead, op.Region)
					}
					c.LivenessRead(op.Round, live, err)
				case OpSurveyTails:
					lastRemote, lastLocal = map[string]map[string][]uint64{}, map[RangeKey]uint64{}
					for _, a := range op.Asks {
						if rng.Intn(4) == 0 {
							continue // unreachable
						}
						if lastRemote[a.Region] == nil {
							lastRemote[a.Region] = map[string][]uint64{}
						}
						lastRemote[a.Region][a.Stream] = []uint64{uint64(rng.Intn(5)), uint64(rng.Intn(5)), uint64(rng.Intn(5))}
					}
					for _, k := range op.Keys {
						if rng.Intn(5) > 0 {
							lastLocal[k] = uint64(rng.Intn(5))
						}
					}
					c.TailsRead(op.Round, TailReport{Remote: lastRemote, Local: lastLocal})
				case OpTakeover:
					checked++
					if err := checkTakeover(op, leading, roundNow, liveSince, settle, grace, roundDir, deadRead, firstDead, lastRemote, lastLocal, streams); err != nil {
						return checked, err
					}
					var res TakeoverResult
					for _, r := range op.Ranges {
						o := RangeOutcome{Key: r.Key, Outcome: OutcomeEpochMismatch}
						if rng.Intn(2) == 0 && dir[r.Key].Epoch == r.Epoch {
							o.Outcome = Granted
							dir[r.Key] = Home{Key: r.Key, Region: "eu", Epoch: r.Epoch + 1, StartOffset: r.StartOffset}
						}
						res.Ranges = append(res.Ranges, o)
					}
					var err error
					if rng.Intn(6) == 0 {
						err = errors.New("timeout")
					}
					c.TakeoverDone(op.Round, res, err)
				}
			}
		}
	}
	return checked, nil
}

func cloneDir(m map[RangeKey]Home) map[RangeKey]Home {
	out := make(map[RangeKey]Home, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func checkTakeover(op TakeoverOp, leading bool, now, liveSince, settle, grace int64, dir map[RangeKey]Home, deadRead map[string]bool,
	firstDead map[string]int64, remote map[string]map[string][]uint64, local map[RangeKey]uint64, streams map[string][]string) error {
	from := op.Region
	switch {
	case !leading:
		return errors.New("a takeover while not leading")
	case liveSince == 0 || now-liveSince < settle:
		return fmt.Errorf("a takeover at %d with a lease held since %d (settle %d)", now, liveSince, settle)
	case !deadRead[from]:
		return fmt.Errorf("a takeover from %s, which this round did not read as dead", from)
	}
	for _, r := range op.Ranges {
		h, ok := dir[r.Key]
		mine, serves := local[r.Key]
		switch {
		case !ok || h.Region != from || h.Epoch != r.Epoch || h.MovingTo != "":
			return fmt.Errorf("%s taken from %s@%d, but the directory has %+v", r.Key, from, r.Epoch, h)
		case !serves || r.StartOffset != mine:
			return fmt.Errorf("%s taken from %d, local tail %d (%v)", r.Key, r.StartOffset, mine, serves)
		}
		if now-firstDead[from] >= grace {
			continue
		}
		for _, g := range streams[r.Key.Stream] {
			if g == "eu" || g == from {
				continue
			}
			if rt := remote[g][r.Key.Stream]; int(r.Key.Range) < len(rt) && rt[r.Key.Range] > mine &&
				slices.Contains(streams[r.Key.Stream], g) {
				return fmt.Errorf("%s taken within the grace though %s is ahead (%d > %d)", r.Key, g, rt[r.Key.Range], mine)
			}
		}
	}
	return nil
}
