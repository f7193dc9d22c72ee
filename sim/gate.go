package sim

import (
	"context"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/homing"
	"github.com/geolog/geolog/rangecore"
	"github.com/geolog/geolog/replica"
)

// The epoch start gate, run by the product's own core (rangecore.StartGate,
// which regionsvc's range driver drives in regionsvc/epochstart.go): a new
// home's range leader holds the appends of its epoch, runs a ReadIndex,
// has its node compare the log's end with the recorded start
// (rangecore.CheckStart, then MemStore.RaiseStart if it is above), and
// proposes what it held once that is confirmed in the same leader term
// with the log still there. Here the node's part runs a virtual store round
// trip (0-3 ms) after the ReadIndex answer, as regionsvc's runs on a
// goroutine of its own and comes back to the driver by exec. A crash loses
// the gate and what it held, as a process's does (the producers retry).
// Options.mut.noStartGate turns the gate off.

// gateOp is a client append the gate passes, holds or refuses: run admits
// it again (the lease check at its epoch, then the gate) and proposes it.
type gateOp struct {
	epoch   uint64
	propose func(epoch uint64)
	refuse  func(err error)
}

// gateLeader is what the gate reads of n's replica of range r.
func gateLeader(rep *replica.Replica) rangecore.Leader {
	return rangecore.Leader{IsLeader: rep.IsLeader(), Term: rep.LeaderTerm(), HighestEpoch: rep.HighestEpoch(),
		Committed: rep.Committed(), Pending: rep.Pending()}
}

// proposeGated admits op on n's replica of range r (the lease check:
// regionsvc's admit when it arrives, its leaseCheck when it is proposed),
// then the start gate, then proposes it.
func (w *world) proposeGated(n *node, r int, op *gateOp) {
	epoch, err := w.admit(n, r)
	if err == nil && op.epoch != 0 && epoch != op.epoch {
		err = apierr.New(apierr.Unavailable, "%v range %d: admitted at epoch %d, the lease is at %d now", n, r, op.epoch, epoch)
	}
	if err != nil {
		op.refuse(err)
		return
	}
	op.epoch = epoch
	if w.homing == nil || w.opt.mut.noStartGate || epoch <= 1 {
		op.propose(epoch)
		return
	}
	h, g := w.homing, &n.gates[r]
	switch v, start := g.Admit(op, epoch, gateLeader(n.replicas[r])); v {
	case rangecore.Pass:
		op.propose(epoch)
	case rangecore.RefuseFull:
		op.refuse(apierr.New(apierr.Unavailable, "%v range %d: %d appends wait for epoch %d's start", n, r, g.Held(), epoch))
	default:
		if start {
			h.confirmRound(n, r, epoch)
		}
	}
}

// confirmRound runs one round of the confirmation of epoch's start on n's
// leader of range r: a ReadIndex, then the node's part, then gateDone.
func (h *homeWorld) confirmRound(n *node, r int, epoch uint64) {
	rep, gen := n.replicas[r], n.gen
	term := rep.LeaderTerm()
	rep.ReadIndex(func(end uint64, err error) {
		if !n.up || n.gen != gen {
			return
		}
		if err = n.gates[r].Indexed(term, err, gateLeader(rep)); err == nil {
			logStart, first := firstRetained(n, r, end)
			logEpoch := rep.HighestEpoch()
			h.w.later(n, 1+h.w.rng.Int64N(3), func() {
				h.checkStart(n, r, epoch, end, logStart, first, logEpoch, func(err error) { h.gateDone(n, r, epoch, term, end, err) })
			})
			return
		}
		h.w.later(n, 0, func() { h.gateDone(n, r, epoch, term, end, err) })
	})
}

// gateDone ends a round (regionsvc's gateDone): another round, or the held
// appends proposed (admitted again) or refused.
func (h *homeWorld) gateDone(n *node, r int, epoch, term, end uint64, err error) {
	retry, held, err := n.gates[r].Done(epoch, term, end, err, gateLeader(n.replicas[r]))
	if retry {
		h.res.StartWaits++
		h.confirmRound(n, r, epoch)
		return
	}
	if err == nil {
		h.confirmed(r, epoch)
	}
	for _, op := range held {
		if err != nil {
			h.res.StartWaits++
			op.refuse(err)
			continue
		}
		h.w.proposeGated(n, r, op)
	}
}

// confirmed notes for the checks that range r's epoch start was confirmed
// by a home leader.
func (h *homeWorld) confirmed(r int, epoch uint64) {
	g := h.gates()
	if home := h.homes[r]; home.Epoch == epoch {
		g.confirmed[r] = epoch
		g.had[[2]uint64{uint64(r), epoch}] = true
	}
}

// checkStart is the node's part of a confirmation (regionsvc's
// Node.confirmStart): its lease against the log's end, through
// rangecore.CheckStart, raising the recorded start if it says so, or
// raising it to where the log diverges (rangecore.DivergeAt, from the
// store's epoch history) and forking the log there; done gets the answer
// (once the fork is applied, when there is one).
func (h *homeWorld) checkStart(n *node, r int, epoch, end, logStart, first, logEpoch uint64, done func(error)) {
	lease, err := n.core.View().Lease(rangeKey(r), h.w.nodeNanos(n))
	if err != nil {
		done(apierr.New(apierr.Unavailable, "%v range %d: no lease at epoch %d: %v", n, r, epoch, err))
		return
	}
	divergeAt := uint64(rangecore.NoFence)
	if lease.Epoch == epoch && logEpoch+1 < epoch && !h.w.opt.mut.homeNoFork {
		if h.unreachable(n) {
			done(apierr.New(apierr.Unavailable, "%v range %d: the lease store is unreachable", n, r))
			return
		}
		recs, err := h.store.History(context.Background(), rangeKey(r))
		if err != nil {
			done(apierr.New(apierr.Unavailable, "%v range %d: epoch history: %v", n, r, err))
			return
		}
		divergeAt = rangecore.DivergeAt(logEpoch, epoch, homing.EpochStarts(recs))
	}
	switch rangecore.CheckStart(lease.Epoch, lease.StartOffset, epoch, end, logStart, first, divergeAt) {
	case rangecore.StartNotHome:
		done(apierr.New(apierr.Unavailable, "%v range %d: the lease is at epoch %d, not %d", n, r, lease.Epoch, epoch))
	case rangecore.StartBelow:
		done(apierr.New(apierr.Unavailable, "%v range %d: the log ends at %d, below epoch %d's start %d", n, r, end, epoch, lease.StartOffset))
	case rangecore.StartDivergedBelow:
		h.res.DivergedBelow++
		done(apierr.New(apierr.Unavailable, "%v range %d: the log diverges at %d, below epoch %d's start %d", n, r, divergeAt, epoch, lease.StartOffset))
	case rangecore.StartRaise:
		done(h.raiseStart(n, r, epoch, lease.StartOffset, end))
	case rangecore.StartFork:
		if divergeAt != lease.StartOffset {
			if err := h.raiseStart(n, r, epoch, lease.StartOffset, divergeAt); err != nil {
				done(err)
				return
			}
		}
		h.forkDivergent(n, r, epoch, divergeAt, done)
	default:
		done(nil)
	}
}

// forkDivergent forks n's log of range r at at to epoch (regionsvc's
// Node.forkDivergent): the new home's own divergent tail goes to the
// orphan log. done gets rangecore.ErrStartInFlight once it is applied
// (the gate confirms again on the forked log), or the fork's error.
func (h *homeWorld) forkDivergent(n *node, r int, epoch, at uint64, done func(error)) {
	rep, gen := n.replicas[r], n.gen
	h.w.tracef("%s range %d: new home forks its divergent tail at %d to epoch %d (committed %d)", traceName(n), r, at, epoch, rep.Committed())
	h.res.HomeForks++
	rep.ProposeFork(at, epoch, func(fr replica.ForkResult) {
		if !n.up || n.gen != gen {
			return
		}
		if fr.Err != nil {
			done(fr.Err)
			return
		}
		done(rangecore.ErrStartInFlight)
	})
}

// firstRetained is where n's log of range r retains from and the epoch of
// its first frame (0: none below end, or unreadable), as regionsvc's
// firstRetained tells.
func firstRetained(n *node, r int, end uint64) (start, epoch uint64) {
	st := n.stores[r]
	start = st.StartOffset()
	if start >= end {
		return start, 0
	}
	f, err := st.ReadFrames(start, 1, end)
	if err != nil || len(f) == 0 {
		return start, 0
	}
	hd, err := batch.DecodeHeader(f)
	if err != nil {
		return start, 0
	}
	return start, hd.Epoch
}

// mirroredStale reports whether n's range r refuses a mirrored frame of
// epoch: its gate held appends of a newer epoch (regionsvc's gateAppend).
func (w *world) mirroredStale(n *node, r int, epoch uint64) bool {
	return n.gates != nil && n.gates[r].AdmitMirrored(epoch) == rangecore.RefuseStale
}

// later runs fn on n after delay virtual ms, unless n crashed meanwhile.
func (w *world) later(n *node, delay int64, fn func()) {
	w.push(&event{at: w.now + delay, kind: evFunc, to: n.id, region: n.region, fromGen: n.gen, fn: fn})
}
