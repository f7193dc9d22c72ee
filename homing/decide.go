package homing

import (
	"math"
	"slices"
)

// The decisions every Store implementation makes, as pure functions of the
// rows it read inside one serializable transaction (or under its lock) and
// the caller's clock readings. Both stores call these, so the SQL store and
// its in-memory twin cannot disagree on semantics; only reading and writing
// rows differs.

// mayBeLive reports whether node l may still hold a valid lease at clock
// reading nowNanos (another node's clock): l stops acking at its expiration
// minus maxOffset by its own clock, and the two clocks differ by at most
// maxOffset, so l is certainly past its expiration only once nowNanos >
// expiration + maxOffset. The second margin leaves room for an ack decided
// just before the holder's deadline to reach the wire.
// Undrained lists the nodes (liveness ids) that may still act on a homes
// version below drainVersion: those that may be live and confirmed
// neither in their heartbeat (HomesSeen) nor to the caller (seen). Once
// it is empty, no node of the region admits or acks what the version
// stopped.
func Undrained(nodes []Liveness, drainVersion uint64, seen map[uint64]uint64, nowNanos, maxOffsetNanos int64) []uint64 {
	var out []uint64
	for _, l := range nodes {
		if max(l.HomesSeen, seen[l.NodeID]) < drainVersion && mayBeLive(l, nowNanos, maxOffsetNanos) {
			out = append(out, l.NodeID)
		}
	}
	return out
}

func mayBeLive(l Liveness, nowNanos, maxOffsetNanos int64) bool {
	return nowNanos <= satAdd(l.ExpirationNanos, maxOffsetNanos)
}

func satAdd(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// heartbeatDecision is what a heartbeat writes.
type heartbeatDecision struct {
	next     Liveness
	write    bool // write next (insert if the record was missing)
	insert   bool
	extended bool
}

// decideHeartbeat: cur is the node's record, nil if it has none.
func decideHeartbeat(cur *Liveness, req HeartbeatRequest) (heartbeatDecision, error) {
	if cur == nil {
		// Register. A node that believed it had an epoch but has no record
		// (a lease store restored from an old backup) starts above that
		// epoch, so that whatever it acked before is void.
		epoch := uint64(1)
		if req.Epoch != 0 {
			epoch = req.Epoch + 1
		}
		next := Liveness{NodeID: req.NodeID, Region: req.Region, Epoch: epoch}
		return heartbeatDecision{next: next, write: true, insert: true}, nil
	}
	if cur.Region != req.Region {
		return heartbeatDecision{}, newError(ErrRegionMismatch, "node %d is registered in region %s, not %s", req.NodeID, cur.Region, req.Region)
	}
	if req.Epoch == 0 || req.Epoch != cur.Epoch {
		return heartbeatDecision{next: *cur}, nil
	}
	next := *cur
	// Expirations never move back: a delayed, older heartbeat must not
	// shorten a lease the node may already be acting on.
	next.ExpirationNanos = max(cur.ExpirationNanos, req.ExpirationNanos)
	// HomesSeen is the current process's published version, even if lower
	// than before (a restarted process has seen nothing yet).
	next.HomesSeen = req.HomesSeen
	return heartbeatDecision{next: next, write: true, extended: true}, nil
}

// createDecision: cur is the range's record, nil if none. An existing record
// wins (CreateHomes is idempotent and never moves a range).
func decideCreate(cur *Home, spec HomeSpec) (Home, bool) {
	if cur != nil {
		return *cur, false
	}
	return Home{Key: spec.Key, Region: spec.Region, Epoch: 1, StartOffset: spec.StartOffset}, true
}

// takeoverPlan is what a takeover writes.
type takeoverPlan struct {
	result  TakeoverResult
	granted []Home // new home records (also in result)
}

// decideTakeover: fromNodes are every liveness record of req.From; cur maps
// each requested range to its record (missing: no record).
//
// No epoch is granted while any node of the home region may be live; the
// takeover then increments every From node's liveness epoch, so a returning
// node's heartbeats fail and it learns that its view of its homes is void.
func decideTakeover(req TakeoverRequest, fromNodes []Liveness, cur map[RangeKey]Home) (takeoverPlan, error) {
	for _, l := range fromNodes {
		if mayBeLive(l, req.NowNanos, req.MaxOffsetNanos) {
			return takeoverPlan{}, newError(ErrHomeLive,
				"node %d of region %s may be live until %s + max offset (now %s)",
				l.NodeID, l.Region, fmtNanos(l.ExpirationNanos), fmtNanos(req.NowNanos))
		}
	}
	var plan takeoverPlan
	plan.result.Ranges = make([]RangeOutcome, len(req.Ranges))
	for i, r := range req.Ranges {
		h, ok := cur[r.Key]
		out := RangeOutcome{Key: r.Key, Home: h}
		switch {
		case !ok:
			out.Outcome, out.Home = OutcomeNotFound, Home{Key: r.Key}
		case h.Region != req.From:
			out.Outcome = OutcomeWrongRegion
		case h.Epoch != r.Epoch:
			out.Outcome = OutcomeEpochMismatch
		default:
			out.Outcome = Granted
			out.Home = Home{Key: r.Key, Region: req.To, Epoch: h.Epoch + 1, StartOffset: r.StartOffset, PrevRegion: req.From}
			plan.granted = append(plan.granted, out.Home)
		}
		plan.result.Ranges[i] = out
	}
	if len(plan.granted) > 0 {
		for _, l := range fromNodes {
			l.Epoch++
			plan.result.Fenced = append(plan.result.Fenced, l)
		}
	}
	return plan, nil
}

func checkCurrent(cur *Home, key RangeKey, epoch uint64) error {
	if cur == nil {
		return newError(ErrRangeNotFound, "range %s", key)
	}
	if cur.Epoch != epoch {
		return newError(ErrEpochMismatch, "range %s is at epoch %d, not %d", key, cur.Epoch, epoch)
	}
	return nil
}

// decidePrepareRehome announces a planned move: the home stops acking the
// range once its nodes see the record. fromVersion is the home region's
// homes version before this change; changed reports whether to write next
// and bump that version (a repeated prepare to the same target changes
// nothing).
func decidePrepareRehome(cur *Home, req RehomeRequest, fromVersion uint64) (next Home, changed bool, err error) {
	if err := checkCurrent(cur, req.Key, req.Epoch); err != nil {
		return Home{}, false, err
	}
	if cur.Region == req.To {
		return Home{}, false, invalidf("range %s is already homed in %s", req.Key, req.To)
	}
	switch cur.MovingTo {
	case req.To:
		return *cur, false, nil
	case "":
	default:
		return Home{}, false, newError(ErrEpochMismatch, "range %s is already moving to %s", req.Key, cur.MovingTo)
	}
	next = *cur
	next.MovingTo = req.To
	next.DrainVersion = fromVersion + 1
	return next, true, nil
}

// decideCompleteRehome moves a prepared range to its target at epoch+1, once
// every node of the old home either confirmed a homes version that shows
// the move (HomesSeen, written by its heartbeat, or seen[node], which it
// reported to the caller directly), or may no longer be live.
func decideCompleteRehome(cur *Home, req RehomeRequest, fromNodes []Liveness, seen map[uint64]uint64) (Home, error) {
	if err := checkCurrent(cur, req.Key, req.Epoch); err != nil {
		return Home{}, err
	}
	if cur.MovingTo != req.To {
		if cur.MovingTo == "" {
			return Home{}, newError(ErrEpochMismatch, "range %s has no planned move to %s (prepare it first)", req.Key, req.To)
		}
		return Home{}, newError(ErrEpochMismatch, "range %s is moving to %s, not %s", req.Key, cur.MovingTo, req.To)
	}
	if ids := Undrained(fromNodes, cur.DrainVersion, seen, req.NowNanos, req.MaxOffsetNanos); len(ids) > 0 {
		l := fromNodes[slices.IndexFunc(fromNodes, func(l Liveness) bool { return l.NodeID == ids[0] })]
		return Home{}, newError(ErrNotDrained, "node %d of region %s has seen homes version %d, the move needs %d",
			l.NodeID, l.Region, max(l.HomesSeen, seen[l.NodeID]), cur.DrainVersion)
	}
	return Home{Key: req.Key, Region: req.To, Epoch: cur.Epoch + 1, StartOffset: req.StartOffset, PrevRegion: cur.Region}, nil
}

// decideCancelRehome abandons a planned move (the home resumes acking once
// its nodes see the record). changed is false if there was none.
func decideCancelRehome(cur *Home, req RehomeRequest) (next Home, changed bool, err error) {
	if err := checkCurrent(cur, req.Key, req.Epoch); err != nil {
		return Home{}, false, err
	}
	if cur.MovingTo == "" {
		return *cur, false, nil
	}
	next = *cur
	next.MovingTo = ""
	next.DrainVersion = 0
	return next, true, nil
}
