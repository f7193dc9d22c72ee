package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/geolog/geolog/homing"
)

// Planned rehomes (Regions > 1). One run in two of those without a
// planned failover moves every range homed in a region to another one
// through the real coordinator core (homing.Rehome) on MemStore's batch
// moves (PrepareRehomes, CompleteRehomes, CancelRehome), driven as
// regionsvc's rehomeDriver drives it: the coordinator runs on the target
// region's lowest live node; a stop installs the prepare's homes on every
// reachable node of the old home (homing.Core.Install, RefreshHomes with
// homes) or heartbeats them (then again, to confirm), and reports the
// final tails: a range's leader once every append it proposed is answered
// (replica.Pending), by a ReadIndex (regionsvc's finalTail), the others
// their committed end; a confirm heartbeats; the drained tails are the
// old home leader's ReadIndex; the waits for the target's copy poll the
// coordinator's own copy's committed end, none while it relearns or
// holds a divergent tail (reached; bounded at 3 s, as a driver's
// context). One
// stop in two sees a leader change of a range of the old home (a Raft
// leadership transfer), one in four a node of the old home crash. A run
// whose first move completed early enough moves the ranges on again.
//
// Checks, at each complete: the new epoch is above the old; no acked
// record lies at or past the new epoch's start (a planned rehome loses
// nothing: the final tail covers every ack); and the other checks of the
// run go on across the move (acks only by the current home at its epoch,
// every acked record in the log at its offset, epochs never go back,
// mirrors are the home's prefix, readers never see the log go back).

// rehomeTailWaitMs bounds a wait for the target's copy (a driver's
// context deadline).
const rehomeTailWaitMs = 3000

// rehomeAbandonMs is how long after the faults end a move still under
// way is abandoned.
const rehomeAbandonMs = 1000

// RehomeResult counts what planned rehomes did (part of HomingResult).
type RehomeResult struct {
	// Started counts the moves started, Moved the ranges moved, Cancelled
	// those given back, StopLeaderChanges and StopCrashes the faults
	// injected during stops, Cut the committed records past a final tail
	// (never acked; the old home forks them off).
	Started, Moved, Cancelled, StopLeaderChanges, StopCrashes, Cut int
	// CancelRetries counts cancels that failed and were retried.
	CancelRetries int
	// DivergentWaits counts waits for the target's copy to reach the
	// final tails (OpAwaitTails after a stop, whose end the new epoch
	// starts at) that found a copy holding a divergent tail whose raw
	// committed end reached the tail awaited: the product's read
	// (reached) waits for it to fork and catch up,
	// Options.mut.rehomeDivergent ends the wait there
	// (TestRehomeWaitsForDivergentTarget). Not in String, so that
	// the pinned schedule digests stay as they were.
	DivergentWaits int
}

func (r RehomeResult) String() string {
	return fmt.Sprintf("; rehomes: %d started, %d ranges moved, %d cancelled (%d cancels retried), %d leader changes and %d crashes during stops, %d unacked records past a final tail",
		r.Started, r.Moved, r.Cancelled, r.CancelRetries, r.StopLeaderChanges, r.StopCrashes, r.Cut)
}

func (r RehomeResult) add(o RehomeResult) RehomeResult {
	r.Started += o.Started
	r.Moved += o.Moved
	r.Cancelled += o.Cancelled
	r.StopLeaderChanges += o.StopLeaderChanges
	r.StopCrashes += o.StopCrashes
	r.Cut += o.Cut
	r.CancelRetries += o.CancelRetries
	r.DivergentWaits += o.DivergentWaits
	return r
}

// rehomer drives one planned rehome at a time.
type rehomer struct {
	h        *homeWorld
	at       int64 // when the next move starts (-1: none)
	from, to int
	core     *homing.Rehome
	op       *homing.RehomeOp  // the awaited op under way
	since    int64             // when it started
	stop     *stopState        // OpStop, OpDrainedTails
	cancels  []homing.RehomeOp // cancels to retry
	// abandoned: the move under way was abandoned as the run ends.
	abandoned bool
	// notes are the core's notes (kept for a test's eyes).
	notes []homing.RehomeNote
	// results are the finished moves' outcomes.
	results []homing.RangeRehomeResult
	// stopped: the move under way stopped the old home (its waits
	// are for the final tails); divergentOp is the wait last counted in
	// DivergentWaits.
	stopped     bool
	divergentOp *homing.RehomeOp
}

// stopState is a stop (or a drained-tails read) under way: the nodes that
// answered, the final tails reported, the leaders' tails awaited.
type stopState struct {
	tails   map[homing.RangeKey]uint64
	seen    map[uint64]uint64
	failed  bool
	waiting map[homing.RangeKey]*finalTail
	errs    map[homing.RangeKey]error
	// unreported are the ranges whose leader failed to report (their
	// followers' reports are dropped: leaderFailed); followerTails keeps
	// them (the product's behaviour, a mutation).
	unreported    map[homing.RangeKey]bool
	followerTails bool
}

// finalTail is a leader's final tail under way: it waits for its appends
// in flight, then for its ReadIndex.
type finalTail struct {
	n      *node
	find   func() *node // finds n when it is not known yet
	gen    int
	asked  bool
	done   bool
	tail   uint64
	failed bool
}

func newRehomer(h *homeWorld) *rehomer {
	rh := &rehomer{h: h, at: -1}
	if h.failAt < 0 && h.rng.IntN(2) == 0 {
		rh.at = 300 + h.rng.Int64N(1200)
		rh.to = 1 + h.rng.IntN(h.w.opt.Regions-1)
	}
	return rh
}

// coordinator is the node the coordinator runs on: the target region's
// lowest live node.
func (rh *rehomer) coordinator() *node {
	for _, n := range rh.h.w.regionNodes(rh.to) {
		if n.up {
			return n
		}
	}
	return nil
}

func (rh *rehomer) nanos() int64 { return rh.h.w.nodeNanos(rh.coordinator()) }

// ctx is a store call's context: cancelled (unavailable) when the
// coordinator cannot reach the store.
func (rh *rehomer) ctx() context.Context {
	c := rh.coordinator()
	if c == nil || rh.h.unreachable(c) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx
	}
	return context.Background()
}

// reaches reports whether the coordinator reaches node n (an RPC).
func (rh *rehomer) reaches(n *node) bool {
	g := rh.h.w.geo
	return n.up && !g.partitioned(n.region) && !g.partitioned(rh.to) && !g.offWAN(n) && rh.coordinator() != nil
}

// step starts a due move, carries on the op under way, and runs the
// core's next ops.
func (rh *rehomer) step() {
	w := rh.h.w
	rh.retryCancels()
	if rh.core == nil {
		if rh.at < 0 || w.now != rh.at || w.now >= int64(w.opt.Steps) {
			return
		}
		rh.start()
		if rh.core == nil {
			return
		}
	}
	if w.now >= int64(w.opt.Steps)+rehomeAbandonMs && !rh.abandoned {
		// The run ends: a move still under way is abandoned (the core
		// cancels what it prepared and starts what moved), so that the
		// final checks meet settled homes.
		rh.abandoned = true
		rh.op, rh.stop = nil, nil
		rh.core.Abandon(rh.nanos(), errors.New("sim: the run ends"))
	}
	if rh.op != nil && !rh.poll() {
		return
	}
	for i := 0; i < 100 && rh.op == nil && w.err == nil; i++ {
		ops, notes := rh.core.Ready()
		rh.notes = append(rh.notes, notes...)
		if len(ops) == 0 {
			break
		}
		for _, op := range ops {
			rh.do(op)
		}
	}
	if rh.op == nil && rh.core.Done() {
		rh.finish()
	}
}

// start begins a move of every range homed in the chosen old home.
func (rh *rehomer) start() {
	h := rh.h
	rh.from = h.homeIdx[0]
	if rh.to == rh.from {
		rh.to = (rh.to + 1) % h.w.opt.Regions
	}
	var ranges []homing.Home
	for _, home := range h.homes {
		if regionIndex(home.Region) == rh.from && home.MovingTo == "" {
			ranges = append(ranges, home)
		}
	}
	if len(ranges) == 0 {
		rh.at = -1 // nothing to move (a move cancelled is still settling)
		return
	}
	core, err := homing.NewRehome(homing.RehomeConfig{From: regionName(rh.from), To: regionName(rh.to), Ranges: ranges,
		MaxOffsetNanos: maxOffsetMs * 1e6})
	if err != nil {
		h.w.err = err
		return
	}
	rh.core, rh.stopped = core, false
	h.res.Rehomes.Started++
}

// finish ends a move; one more follows if there is time.
func (rh *rehomer) finish() {
	w := rh.h.w
	rh.results = append(rh.results, rh.core.Results()...)
	rh.core, rh.at = nil, -1
	if w.now+1200 < int64(w.opt.Steps) && rh.h.rng.IntN(2) == 0 {
		rh.at = w.now + 100 + rh.h.rng.Int64N(300)
		rh.to = rh.h.rng.IntN(w.opt.Regions)
	}
}

// do carries out one op: at once, or it becomes the op under way.
func (rh *rehomer) do(op homing.RehomeOp) {
	h, c := rh.h, rh.core
	switch op.Kind {
	case homing.OpReadTails:
		tails, ok := rh.leaderTails(rh.from, op.Keys)
		c.TailsRead(rh.nanos(), tails, ok)
	case homing.OpPrepare:
		b, err := h.store.PrepareRehomes(rh.ctx(), op.Reqs)
		if err == nil {
			rh.noteHomes(op.Reqs, b, false)
		}
		c.Prepared(rh.nanos(), b, err)
	case homing.OpDrainLiveness:
		live, err := h.store.Liveness(rh.ctx(), op.Region)
		c.LivenessRead(rh.nanos(), live, err)
	case homing.OpConfirm:
		st := rh.refresh(rh.from, nil, nil, true)
		c.Confirmed(rh.nanos(), st.seen)
	case homing.OpComplete:
		now := rh.nanos()
		for i := range op.Reqs {
			op.Reqs[i].NowNanos = now
		}
		b, err := h.store.CompleteRehomes(rh.ctx(), op.Reqs, op.Seen)
		if err == nil {
			rh.noteHomes(op.Reqs, b, true)
		}
		c.Completed(rh.nanos(), b, err)
	case homing.OpCancel:
		rh.cancel(op)
	case homing.OpStart:
		rh.refresh(rh.to, op.Homes, nil, false)
		c.Started(rh.nanos())
	case homing.OpRelease:
		rh.refresh(rh.from, op.Homes, nil, false)
	default: // awaited over virtual time: OpAwaitTails, OpStop, OpDrainedTails, OpWait
		rh.op, rh.since = &op, h.w.now
		switch op.Kind {
		case homing.OpStop:
			rh.stopped = true
			rh.stopFaults(op.Keys)
			rh.stop = rh.refresh(rh.from, op.Homes, op.Keys, op.Homes == nil)
		case homing.OpDrainedTails:
			rh.stop = rh.leaderFinals(op.Keys)
		}
	}
}

// cancel gives a range back to its old home; a cancel that fails (the
// store or the coordinator's region out) is retried every 100 ms, as an
// operator would: regionsvc's driver logs it and leaves the range stopped
// until a rehome completes or is cancelled (see notes/simfaults.md).
func (rh *rehomer) cancel(op homing.RehomeOp) {
	h := rh.h
	home, err := h.store.CancelRehome(rh.ctx(), homing.RehomeRequest{Key: op.Key, Epoch: op.Epoch})
	if err != nil {
		h.res.Rehomes.CancelRetries++
		rh.cancels = append(rh.cancels, op)
		return
	}
	h.res.Rehomes.Cancelled++
	h.homes[op.Key.Range] = home
}

// retryCancels retries the cancels that failed, every 100 ms.
func (rh *rehomer) retryCancels() {
	if len(rh.cancels) == 0 || rh.h.w.now%100 != 0 {
		return
	}
	ops := rh.cancels
	rh.cancels = nil
	for _, op := range ops {
		rh.cancel(op)
	}
}

// noteHomes takes the store's answer to a prepare or a complete: the
// simulator's truth of each range's home (a complete moves it).
func (rh *rehomer) noteHomes(reqs []homing.RehomeRequest, b homing.RehomeBatch, complete bool) {
	h := rh.h
	for i, req := range reqs {
		if i >= len(b.Errs) || i >= len(b.Homes) || b.Errs[i] != nil {
			continue
		}
		r := int(req.Key.Range)
		if !complete {
			h.homes[r] = b.Homes[i]
			continue
		}
		h.rehomed(r, b.Homes[i])
		if h.w.err != nil {
			return
		}
	}
}

// leaderTails reads region g's leaders' committed ends of keys.
func (rh *rehomer) leaderTails(g int, keys []homing.RangeKey) (map[homing.RangeKey]uint64, bool) {
	out := map[homing.RangeKey]uint64{}
	for _, k := range keys {
		if l := rh.h.w.leaderOf(g, int(k.Range)); l != nil && rh.reaches(l) {
			out[k] = l.replicas[k.Range].Committed()
		}
	}
	return out, len(out) > 0
}

// stopFaults: one stop in two moves a range's leadership in the old home
// (a leader change during the stop), one in four crashes a node of it.
func (rh *rehomer) stopFaults(keys []homing.RangeKey) {
	h, w := rh.h, rh.h.w
	if len(keys) == 0 {
		return
	}
	r := int(keys[h.rng.IntN(len(keys))].Range)
	if l := w.leaderOf(rh.from, r); l != nil && h.rng.IntN(2) == 0 {
		to := 1 + h.rng.IntN(w.opt.Nodes)
		if to != l.id {
			l.replicas[r].TransferLeadership(uint64(to))
			h.res.Rehomes.StopLeaderChanges++
		}
	}
	if h.rng.IntN(4) == 0 {
		if n := w.node(rh.from, 1+h.rng.IntN(w.opt.Nodes)); n.up {
			w.crash(n)
			h.res.Rehomes.StopCrashes++
		}
	}
}

// refresh is RefreshHomes on every node of region g the coordinator
// reaches: install homes if set, else a heartbeat (and a second one with
// confirm); the homes version each acts on, and, for keys, the final
// tails: a leader's once its appends in flight are answered (poll); a
// follower's committed end at once only under rehomeFollowerTails.
func (rh *rehomer) refresh(g int, homes *homing.RegionHomes, keys []homing.RangeKey, confirm bool) *stopState {
	h, w := rh.h, rh.h.w
	st := &stopState{tails: map[homing.RangeKey]uint64{}, seen: map[uint64]uint64{}, waiting: map[homing.RangeKey]*finalTail{},
		errs: map[homing.RangeKey]error{}, unreported: map[homing.RangeKey]bool{}, followerTails: w.opt.mut.rehomeFollowerTails}
	for _, n := range w.regionNodes(g) {
		if !rh.reaches(n) {
			st.failed = true
			continue
		}
		if homes != nil {
			n.core.Install(homes.Version, homes.Homes)
		} else {
			h.heartbeatNow(n)
			if confirm {
				h.heartbeatNow(n)
			}
		}
		v := n.core.View()
		st.seen[v.NodeID] = v.HomesVersion
		for _, k := range keys {
			rep := n.replicas[k.Range]
			if rep.IsLeader() {
				st.waiting[k] = &finalTail{n: n, gen: n.gen}
			} else if st.followerTails {
				// regionsvc's followers report nothing (leaderFinalTails).
				st.tails[k] = max(st.tails[k], rep.Committed())
			}
		}
	}
	return st
}

// leaderFinals starts reading the old home leaders' final tails of keys.
func (rh *rehomer) leaderFinals(keys []homing.RangeKey) *stopState {
	st := &stopState{tails: map[homing.RangeKey]uint64{}, waiting: map[homing.RangeKey]*finalTail{}, errs: map[homing.RangeKey]error{},
		unreported: map[homing.RangeKey]bool{}}
	for _, k := range keys {
		st.waiting[k] = &finalTail{find: func() *node { // the leader of now, once there is one
			if l := rh.h.w.leaderOf(rh.from, int(k.Range)); l != nil && rh.reaches(l) {
				return l
			}
			return nil
		}}
	}
	return st
}

// heartbeatNow makes node n heartbeat at once (RefreshHomes without
// homes).
func (h *homeWorld) heartbeatNow(n *node) {
	n.core.Force()
	h.heartbeat(n)
}

// poll carries on the op under way; true once it was answered.
func (rh *rehomer) poll() bool {
	w, op, c := rh.h.w, rh.op, rh.core
	late := w.now-rh.since > rehomeTailWaitMs
	switch op.Kind {
	case homing.OpWait:
		if rh.nanos() < op.AtNanos && !late {
			return false
		}
		rh.op = nil
		c.Tick(rh.nanos())
	case homing.OpAwaitTails:
		errs := map[homing.RangeKey]error{}
		for k, tail := range op.Tails {
			rh.noteDivergentWait(op, k, tail)
			if !rh.reached(k, tail) {
				errs[k] = fmt.Errorf("%s's copy of %v did not reach %d", regionName(rh.to), k, tail)
			}
		}
		if len(errs) > 0 && !late {
			return false
		}
		rh.op = nil
		c.TailsAwaited(rh.nanos(), errs)
	case homing.OpStop, homing.OpDrainedTails:
		if !rh.stop.advance(late) {
			return false
		}
		st := rh.stop
		rh.op, rh.stop = nil, nil
		if w.opt.mut.rehomeShortTail {
			for k, t := range st.tails {
				st.tails[k] = t - min(t, 1) // a stop that misreads the final tail
			}
		}
		if op.Kind == homing.OpStop {
			var err error
			if st.failed {
				err = fmt.Errorf("a node of %s did not answer the stop", regionName(rh.from))
			}
			c.Stopped(rh.nanos(), st.tails, st.seen, err)
		} else {
			c.DrainedTails(rh.nanos(), st.tails, st.errs)
		}
	}
	return true
}

// reached reports whether the target's copy of k reached tail, as
// regionsvc's waitRegionTails reads it on the coordinator, a node of the
// target: its own copy, if it may be continued from (not relearning its
// commit index, no divergent tail) and reached tail; else the region's
// best copy over the nodes answering it (homeWorld.regionTail), none
// while every copy relearns or one holds a divergent tail, which it must
// fork off before the range may continue from it. Seed 545 of the minute runs: range 1, rehomed to
// r1 at epoch 2, taken over by r0 at epoch 3 (fork point 38) while r1
// held epoch 2's log to 60, was rehomed back to r1 from r0's final tail
// 50 before r1 forked: r1's epoch 4 began on its epoch-2 records [38,
// 50), in place of epoch 3's. Options.mut.rehomeDivergent reads the raw
// committed end.
func (rh *rehomer) reached(k homing.RangeKey, tail uint64) bool {
	h := rh.h
	n := rh.coordinator()
	if n == nil {
		return false
	}
	if own, ok, _ := h.regionTail([]*node{n}, int(k.Range), h.w.opt.mut.rehomeDivergent); ok && own >= tail {
		return true
	}
	have, ok, _ := h.regionTail(h.answering(n, n.region), int(k.Range), h.w.opt.mut.rehomeDivergent)
	return ok && have >= tail
}

// noteDivergentWait counts (DivergentWaits, once per wait) a wait for
// the target's copy of k to reach its final tail that meets a copy whose
// raw committed end reached tail while it holds a divergent tail: the
// window Options.mut.rehomeDivergent needs. It only reads.
func (rh *rehomer) noteDivergentWait(op *homing.RehomeOp, k homing.RangeKey, tail uint64) {
	h := rh.h
	n := rh.coordinator()
	if n == nil || !rh.stopped || rh.divergentOp == op {
		return
	}
	r := int(k.Range)
	ns := h.answering(n, n.region)
	raw, ok, _ := h.regionTail(ns, r, true)
	if !ok || raw < tail {
		return
	}
	for _, m := range ns {
		if h.divergent(r, m) && m.replicas[r].Committed() >= tail {
			rh.divergentOp = op
			h.res.Rehomes.DivergentWaits++
			return
		}
	}
}

// advance moves the leaders' final tails on: a leader whose appends in
// flight are all answered asks for a ReadIndex. True once none waits.
func (st *stopState) advance(late bool) bool {
	keys := make([]homing.RangeKey, 0, len(st.waiting))
	for k := range st.waiting {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b homing.RangeKey) int { return int(a.Range) - int(b.Range) })
	for _, k := range keys {
		ft := st.waiting[k]
		if ft.n == nil && !late {
			if ft.n = ft.find(); ft.n == nil {
				continue
			}
			ft.gen = ft.n.gen
		}
		switch {
		case ft.n == nil:
			st.leaderFailed(k, fmt.Errorf("no reachable leader of %v", k))
			delete(st.waiting, k)
		case ft.done:
			if ft.failed {
				st.leaderFailed(k, fmt.Errorf("%v's final tail of %v failed", ft.n, k))
			} else {
				st.tails[k] = max(st.tails[k], ft.tail)
			}
			delete(st.waiting, k)
		case !ft.n.up || ft.n.gen != ft.gen || late:
			st.leaderFailed(k, fmt.Errorf("%v did not report its final tail of %v", ft.n, k))
			delete(st.waiting, k)
		case !ft.asked && ft.n.replicas[k.Range].Pending() == 0:
			ft.asked = true
			ft.n.replicas[k.Range].ReadIndex(func(end uint64, err error) {
				ft.done, ft.tail, ft.failed = true, end, err != nil
			})
		}
	}
	return len(st.waiting) == 0
}

// leaderFailed notes that the leader asked for k's final tail did not
// give it (it lost the lead during the stop, or crashed). The followers'
// committed ends may lag what that leader acked (a follower learns the
// commit index with the leader's next message), so they are not a final
// tail: the range counts as unreported, and the core asks the leader of
// now (OpDrainedTails). regionsvc's RefreshHomes reports the followers'
// ends and nothing from the failed leader, and the coordinator takes
// their highest as final: a planned rehome then starts the new home
// below acked records (mutations.rehomeFollowerTails; see
// notes/simfaults.md).
func (st *stopState) leaderFailed(k homing.RangeKey, err error) {
	st.errs[k] = err
	if !st.followerTails {
		delete(st.tails, k)
		st.unreported[k] = true
	}
}

// rehomed records a completed planned move of range r: its new home, at
// the next epoch from the final tail. Nothing acked may lie at or past
// that tail: a planned rehome loses nothing.
func (h *homeWorld) rehomed(r int, home homing.Home) {
	w := h.w
	if home.Epoch <= h.homes[r].Epoch {
		w.err = fmt.Errorf("range %d: a planned rehome granted epoch %d, not above %d", r, home.Epoch, h.homes[r].Epoch)
		return
	}
	for off, v := range w.acked[r] {
		if off >= home.StartOffset {
			w.err = fmt.Errorf("range %d: a planned rehome to %s starts epoch %d at %d, but %q was acked at %d (a planned rehome lost an acked record)",
				r, home.Region, home.Epoch, home.StartOffset, v, off)
			return
		}
	}
	if uint64(len(w.canonical[r])) > home.StartOffset {
		h.res.Rehomes.Cut += len(w.canonical[r]) - int(home.StartOffset)
	}
	h.res.Rehomes.Moved++
	h.move(r, home, true)
}
