package regionsvc

import (
	"context"
	"errors"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/homing"
	"github.com/geolog/geolog/rangecore"
)

// Where an epoch starts (docs/design.md "Where an epoch starts";
// homing/raisestart.go). A takeover records the taker's committed end as
// the new epoch's start, but more of its log may still commit after that
// reading, at the old epoch: a verbatim mirror apply already proposed, or
// entries a new Raft leader's predecessor left uncommitted. So the new
// home's range leader admits no frame of its epoch E until it has
// confirmed where its log ends and the recorded start is that end:
//
//  1. It holds E's appends, and proposes no mirrored frame older than E
//     any more (the gate's floor; the mirror's CheckHome refuses them too
//     once the node's role shows the new home).
//  2. A ReadIndex confirms its leadership and everything committed; once
//     nothing of its own is pending, its log is committed to its end L
//     (a leader's log past its committed end is its own proposals).
//  3. The node compares L with the recorded start S (its lease): equal,
//     done; above, it raises S to L in the lease store (RaiseStart,
//     compare-and-set); below, the log has not reached the epoch's start
//     yet and the appends are refused, retriable.
//  4. Back on the driver, in the same leader term with the log still at
//     L, the held appends are proposed: E's first frame lands at L.
//
// A leader whose log already holds a frame of E (HighestEpoch) needs no
// confirmation; nor does epoch 1, which nothing precedes. (HighestEpoch
// never goes down: a replica that once held an uncommitted frame of E,
// later replaced by older entries, skips the gate. That needs a leader
// whose role lags to commit older mirrored frames after another leader
// of the region confirmed E and proposed its first frame; left, see
// notes/epochstart.md.) The old home's
// frames between S and L stay in the log: the same records in every copy
// that holds them (the old home shipped them), their acks kept.

// startGate is a range leader's confirmation of its epoch's start
// (rangecore.StartGate, which holds the decisions; driver goroutine only).
type startGate = rangecore.StartGate[*appendOp]

// errStartInFlight: the log had entries past its committed end when the
// confirmation looked (an apply or a proposal in flight).
var errStartInFlight = rangecore.ErrStartInFlight

// gateLeader is what the gate reads of the replica.
func (d *rangeDriver) gateLeader() rangecore.Leader {
	return rangecore.Leader{IsLeader: d.rep.IsLeader(), Term: d.rep.LeaderTerm(), HighestEpoch: d.rep.HighestEpoch(),
		Committed: d.rep.Committed(), Pending: d.rep.Pending()}
}

// gateAppend holds or refuses op while the range's epoch start is not
// confirmed (see the top of this file); true: op was taken. Called by
// propose, on the driver goroutine.
func (d *rangeDriver) gateAppend(op *appendOp) bool {
	if d.cfg.confirmStart == nil {
		return false
	}
	g := &d.gate
	if op.verbatim {
		if g.Floor() == 0 {
			return false // never home here at a gated epoch
		}
		h, err := batch.DecodeHeader(op.frame)
		if err != nil || g.AdmitMirrored(h.Epoch) == rangecore.Pass {
			return false // the replica validates the frame itself
		}
		op.reply(appendResult{err: apierr.New(apierr.StaleEpoch, "stream %s range %d: a mirrored frame of epoch %d, this region is home at epoch %d",
			d.cfg.stream, d.cfg.rangeID, h.Epoch, g.Floor())})
		return true
	}
	if op.epoch <= 1 {
		return false // nothing precedes epoch 1 (and no replica read per append)
	}
	switch v, start := g.Admit(op, op.epoch, d.gateLeader()); v {
	case rangecore.Pass:
		return false
	case rangecore.RefuseFull:
		op.reply(appendResult{err: apierr.New(apierr.Unavailable, "stream %s range %d: %d appends wait for the start of epoch %d to be confirmed",
			d.cfg.stream, d.cfg.rangeID, g.Held(), op.epoch)})
	default:
		if start {
			d.confirmStart(op.epoch)
		}
	}
	return true
}

// confirmStart runs one round of the confirmation of epoch's start: a
// ReadIndex, then (off the driver goroutine) the node's comparison with the
// recorded start and its raise, then gateDone on the driver goroutine.
func (d *rangeDriver) confirmStart(epoch uint64) {
	term := d.rep.LeaderTerm()
	d.rep.ReadIndex(func(end uint64, err error) {
		if err = d.gate.Indexed(term, err, d.gateLeader()); err != nil {
			d.gateDone(epoch, term, end, err)
			return
		}
		logStart, firstEpoch := d.firstRetained(end)
		logEpoch := d.rep.HighestEpoch()
		go func() {
			err := d.cfg.confirmStart(d, epoch, end, logStart, firstEpoch, logEpoch)
			if xerr := d.exec(context.Background(), func() { d.gateDone(epoch, term, end, err) }); xerr != nil {
				d.logger.Debug("epoch start confirmed as the range closed", "epoch", epoch, "error", xerr)
			}
		}()
	})
}

// firstRetained is where the log's retained part starts and the epoch of
// its first frame (0: none below end, or unreadable).
func (d *rangeDriver) firstRetained(end uint64) (start, epoch uint64) {
	start = d.store.StartOffset()
	if start >= end {
		return start, 0
	}
	f, err := d.store.ReadFrames(start, 1, end)
	if err != nil || len(f) == 0 {
		return start, 0
	}
	h, err := batch.DecodeHeader(f)
	if err != nil {
		return start, 0
	}
	return start, h.Epoch
}

// gateDone ends a round of the confirmation: the held appends are
// proposed if the log is still where it was confirmed, in the same term;
// a round that found something in flight runs again; else they are
// refused with err (retriable).
func (d *rangeDriver) gateDone(epoch, term, end uint64, err error) {
	retry, held, err := d.gate.Done(epoch, term, end, err, d.gateLeader())
	if retry {
		// Again from the driver loop, not from inside the replica's
		// answer to a ReadIndex (which may be where this runs).
		go func() { _ = d.exec(context.Background(), func() { d.confirmStart(epoch) }) }()
		return
	}
	for _, op := range held {
		if err != nil {
			op.reply(appendResult{err: d.hintAddress(err)})
			continue
		}
		d.propose(op)
	}
}

// refuseHeld answers the appends held by the gate when the range stops.
func (d *rangeDriver) refuseHeld() {
	for _, op := range d.gate.Stop() {
		op.reply(appendResult{err: apierr.New(apierr.ShuttingDown, "node is shutting down")})
	}
}

// confirmStart is the node's part of a range leader's start confirmation
// (rangeDriverConfig.confirmStart): the range's log ends at end, its
// highest epoch is logEpoch, and its retained part starts at logStart with
// a frame of firstEpoch (0: none); the recorded start of epoch must be
// end, raised to it if it is lower. A log that holds a divergent tail
// (rangecore.DivergeAt, from the range's epoch history when epochs lie
// between logEpoch and epoch) is not confirmed over it: the start is
// raised to where it diverges, the log forked there (its tail to the
// orphan log), and the gate runs another round. Off the driver goroutine:
// it may read and write the lease store.
func (n *Node) confirmStart(d *rangeDriver, epoch, end, logStart, firstEpoch, logEpoch uint64) error {
	lease, err := n.homing.homes.Lease(d.cfg.stream, d.cfg.rangeID)
	if err != nil {
		return homingErr(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), n.storeTimeout())
	defer cancel()
	key := homing.RangeKey{Stream: d.cfg.stream, Range: d.cfg.rangeID}
	divergeAt := uint64(rangecore.NoFence)
	if lease.Epoch == epoch && logEpoch+1 < epoch {
		recs, err := n.homing.store.History(ctx, key)
		if err != nil {
			return homingErr(err)
		}
		divergeAt = rangecore.DivergeAt(logEpoch, epoch, homing.EpochStarts(recs))
	}
	to := end
	switch rangecore.CheckStart(lease.Epoch, lease.StartOffset, epoch, end, logStart, firstEpoch, divergeAt) {
	case rangecore.StartNotHome:
		return n.notHome(d)
	case rangecore.StartOK:
		return nil
	case rangecore.StartBelow:
		return apierr.New(apierr.Unavailable, "stream %s range %d: the log ends at %d, below the start %d of epoch %d: it appends once it reaches it",
			d.cfg.stream, d.cfg.rangeID, end, lease.StartOffset, epoch)
	case rangecore.StartDivergedBelow:
		d.logger.Warn("epoch start not confirmed: the log diverges from the range's below it", "epoch", epoch, "start_offset", lease.StartOffset,
			"diverge_offset", divergeAt, "log_epoch", logEpoch, "log_end", end)
		return apierr.New(apierr.Unavailable, "stream %s range %d: the log diverges at %d, below the start %d of epoch %d",
			d.cfg.stream, d.cfg.rangeID, divergeAt, lease.StartOffset, epoch)
	case rangecore.StartKeep:
		d.logger.Warn("epoch start not confirmed: the log was deleted past it", "epoch", epoch, "start_offset", lease.StartOffset, "log_start", logStart, "log_end", end)
		return nil
	case rangecore.StartFork:
		to = divergeAt
	}
	if to != lease.StartOffset {
		_, err = n.homing.homes.RaiseStart(ctx, key, epoch, lease.StartOffset, to)
	}
	if err == nil && to < end {
		return n.forkDivergent(ctx, d, epoch, to, end, logEpoch)
	}
	switch {
	case errors.Is(err, homing.ErrStartMoved):
		// Another leader raised it first: learn where, for the next try.
		if rerr := n.homing.homes.Refresh(ctx); rerr != nil {
			d.logger.Debug("refresh after a lost start raise", "error", rerr)
		}
	case errors.Is(err, homing.ErrEpochMismatch), errors.Is(err, homing.ErrNotHome):
		return n.notHome(d) // the range moved on, or is moving: retriable elsewhere
	}
	return homingErr(err)
}

// forkDivergent forks a new home's log at at, where it leaves the range's
// timeline (its frames of logEpoch from there to end are the tail its
// region held when it lost the range before, the range's offsets there
// being the intervening epoch's), to epoch: the tail goes to the orphan
// log, acks kept there, and the log continues at at. It answers
// errStartInFlight so that the gate confirms again on the forked log.
func (n *Node) forkDivergent(ctx context.Context, d *rangeDriver, epoch, at, end, logEpoch uint64) error {
	d.logger.Warn("new home's log holds a divergent tail: forking it off before the epoch's first frame", "epoch", epoch,
		"fork_offset", at, "log_end", end, "log_epoch", logEpoch)
	if _, err := d.forkAt(ctx, at, epoch); err != nil {
		return err
	}
	return errStartInFlight
}
