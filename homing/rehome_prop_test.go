package homing

import (
	"errors"
	"fmt"
	"math/rand"
	"testing"
)

// TestRehomeRandomAnswers drives the rehome core with seeded random
// answers (errors, missing tails, nodes that do not confirm, a caller that
// gives up) and checks, for every run, what the scripts check by example:
// the core finishes; every prepared range ends moved or cancelled (once),
// and nothing else is cancelled; nothing cancelled is completed; a moved
// range starts at or past every tail the old home reported for it, and
// the target was awaited to exactly that tail; the old home is released
// once, at the end, iff something was prepared.
func TestRehomeRandomAnswers(t *testing.T) {
	var total rehomeStats
	for seed := int64(1); seed <= 2000; seed++ {
		rng := rand.New(rand.NewSource(seed))
		if err := randomRehome(rng, &total); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
	// The runs must cover every path, or the checks above say little.
	if total.moved == 0 || total.cancelled == 0 || total.drainWaits == 0 || total.retries == 0 || total.abandoned == 0 {
		t.Fatalf("the random runs missed a path: %+v", total)
	}
	t.Logf("%+v", total)
}

type rehomeStats struct{ moved, cancelled, drainWaits, retries, abandoned int }

func randomRehome(rng *rand.Rand, st *rehomeStats) error {
	n := 1 + rng.Intn(4)
	cfg := RehomeConfig{From: "us", To: "eu", MaxOffsetNanos: 500}
	for r := range n {
		cfg.Ranges = append(cfg.Ranges, Home{Key: chat(r), Region: "us", Epoch: 1})
	}
	c, err := NewRehome(cfg)
	if err != nil {
		return err
	}
	fail := errors.New("random failure")
	maybe := func(p float64) error {
		if rng.Float64() < p {
			return fail
		}
		return nil
	}
	var (
		now       int64
		prepared  = map[RangeKey]bool{}
		cancelled = map[RangeKey]int{}
		reported  = map[RangeKey]uint64{}
		awaited   = map[RangeKey]uint64{}
		released  int
	)
	// tails are reports of the old home's tails; final ones (after the
	// stop) bind the start offset.
	tails := func(keys []RangeKey, pMissing float64, final bool) map[RangeKey]uint64 {
		out := map[RangeKey]uint64{}
		for _, k := range keys {
			if rng.Float64() >= pMissing {
				out[k] = uint64(rng.Intn(100))
				if final {
					reported[k] = max(reported[k], out[k])
				}
			}
		}
		return out
	}
	for step := 0; ; step++ {
		if step > 10_000 {
			return errors.New("no end after 10000 steps")
		}
		ops, _ := c.Ready()
		if len(ops) == 0 {
			if !c.Done() {
				return errors.New("stopped with nothing to do")
			}
			break
		}
		if released > 0 {
			return errors.New("an op after the release")
		}
		for _, op := range ops {
			now += int64(rng.Intn(50))
			if op.Kind.Awaited() && (rng.Float64() < 0.01 || step > 300) {
				c.Abandon(now, fail)
				st.abandoned++
				break
			}
			switch op.Kind {
			case OpReadTails:
				c.TailsRead(now, tails(op.Keys, 0.2, false), rng.Intn(4) > 0)
			case OpAwaitTails:
				errs := map[RangeKey]error{}
				for k, tl := range op.Tails {
					if c.phase == phaseCatchUp {
						awaited[k] = tl
					}
					if err := maybe(0.1); err != nil {
						errs[k] = err
					}
				}
				c.TailsAwaited(now, errs)
			case OpPrepare:
				var b RehomeBatch
				for _, q := range op.Reqs {
					var e error
					if rng.Intn(8) == 0 {
						e = fail
					} else {
						prepared[q.Key] = true
					}
					b.Homes = append(b.Homes, Home{Key: q.Key, Epoch: q.Epoch, MovingTo: "eu", DrainVersion: 11})
					b.Errs = append(b.Errs, e)
				}
				if rng.Intn(10) == 0 {
					clear(prepared)
					c.Prepared(now, RehomeBatch{}, fail)
				} else {
					c.Prepared(now, b, nil)
				}
			case OpStop:
				c.Stopped(now, tails(op.Keys, 0.2, true), map[uint64]uint64{1: 11}, maybe(0.3))
			case OpDrainedTails:
				errs := map[RangeKey]error{}
				for _, k := range op.Keys {
					if err := maybe(0.1); err != nil {
						errs[k] = err
					}
				}
				got := tails(op.Keys, 0, true)
				for k := range errs {
					delete(got, k)
				}
				c.DrainedTails(now, got, errs)
			case OpDrainLiveness:
				seen := uint64(10 + rng.Intn(2))
				c.LivenessRead(now, []Liveness{{NodeID: 1, ExpirationNanos: now + 1000, HomesSeen: 11}, {NodeID: 2, ExpirationNanos: now + 1000, HomesSeen: seen}}, maybe(0.1))
			case OpConfirm:
				c.Confirmed(now, map[uint64]uint64{2: uint64(10 + rng.Intn(2))})
			case OpWait:
				st.drainWaits++
				now = max(now, op.AtNanos)
				c.Tick(now)
			case OpComplete:
				var b RehomeBatch
				for _, q := range op.Reqs {
					if cancelled[q.Key] > 0 {
						return errors.New("completing a cancelled range " + q.Key.String())
					}
					if q.StartOffset < reported[q.Key] || q.StartOffset != awaited[q.Key] {
						return fmt.Errorf("complete of %s from %d: reported %d, awaited %d", q.Key, q.StartOffset, reported[q.Key], awaited[q.Key])
					}
					var e error
					switch rng.Intn(6) {
					case 0:
						e = newError(ErrNotDrained, "not drained")
						st.retries++
					case 1:
						e = fail
					}
					b.Homes = append(b.Homes, Home{Key: q.Key, Region: "eu", Epoch: q.Epoch + 1, StartOffset: q.StartOffset})
					b.Errs = append(b.Errs, e)
				}
				if rng.Intn(10) == 0 {
					c.Completed(now, RehomeBatch{}, fail)
				} else {
					c.Completed(now, b, nil)
				}
			case OpCancel:
				cancelled[op.Key]++
				st.cancelled++
			case OpStart:
				c.Started(now)
			case OpRelease:
				released++
			}
		}
	}
	anyPrepared := len(prepared) > 0
	if (released == 1) != anyPrepared || released > 1 {
		return errors.New("release count does not match the prepare")
	}
	for _, r := range c.Results() {
		if r.Moved {
			st.moved++
		}
		switch {
		case !prepared[r.Key] && (r.Moved || cancelled[r.Key] > 0):
			return errors.New("a range never prepared moved or was cancelled: " + r.Key.String())
		case prepared[r.Key] && r.Moved == (cancelled[r.Key] == 1):
			return errors.New("a prepared range is not moved xor cancelled once: " + r.Key.String())
		case r.Moved && r.StartOffset < reported[r.Key]:
			return errors.New("moved below a reported tail: " + r.Key.String())
		case !r.Moved && r.Err == nil:
			return errors.New("a range stayed without a reason: " + r.Key.String())
		}
	}
	return nil
}
