package regionsvc

import (
	"time"

	"github.com/geolog/geolog/apierr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// The bound on a mirror's hold (docs/operator-guide.md, "A mirror region
// behind the home's log start"). The home leader keeps its log from the
// lowest applied end of its mirrors (mirrorFloor), and the mirrors' leaders
// keep theirs from that floor too (Heartbeat.RetainFrom): without a bound,
// one region down for days would keep every other region's disks filling
// at the write rate until appends stop. So, like a Pulsar backlog quota, a
// stream bounds how far behind a mirror may fall and still hold: past the
// bound the mirror is released, retention proceeds as if it were not
// there, and the mirror, once retention deleted what it lacks, is behind
// the home's log start (RegionProgress.behind_log_start, the gauge
// geolog.replication.mirrors_behind_start).
//
// A released mirror holds again as soon as it is back within the bound
// (it caught up): the release is worked out afresh at every compaction
// round, never recorded.

// mirrorHoldDefaultFactor is the default bound as a multiple of the
// retention of the same kind: a mirror may trail by twice what retention
// keeps, so the disks of the home and of the other mirrors hold at most
// twice the retention on its account. A mirror released by it, once back,
// skips to the home's log start (replicator.Skipper, replica.ProposeSkip)
// and follows from there: it loses what retention deleted, not its copy.
const mirrorHoldDefaultFactor = 2

// mirrorHold is a stream's bound on a mirror's hold: bytes of the home's
// log from the mirror's applied end to the home's committed end, and the
// mirror's time lag. Zero means no bound of that kind.
type mirrorHold struct {
	bytes int64
	age   time.Duration
}

// mirrorHold resolves s's settings: 0 the default (mirrorHoldDefaultFactor
// times the retention of the kind, none without one), negative none.
func (s streamSpec) mirrorHold() mirrorHold {
	var h mirrorHold
	switch {
	case s.MirrorHoldBytes > 0:
		h.bytes = s.MirrorHoldBytes
	case s.MirrorHoldBytes == 0 && s.RetentionBytes > 0:
		h.bytes = mirrorHoldDefaultFactor * s.RetentionBytes
	}
	switch {
	case s.MirrorHoldAgeMillis > 0:
		h.age = time.Duration(s.MirrorHoldAgeMillis) * time.Millisecond
	case s.MirrorHoldAgeMillis == 0 && s.RetentionAgeMillis > 0:
		h.age = mirrorHoldDefaultFactor * time.Duration(s.RetentionAgeMillis) * time.Millisecond
	}
	return h
}

// exceeded says whether a mirror bytesBehind and timeLag behind its home
// is past the bound.
func (h mirrorHold) exceeded(bytesBehind int64, timeLag time.Duration) bool {
	return (h.bytes > 0 && bytesBehind > h.bytes) || (h.age > 0 && timeLag > h.age)
}

// checkMirrorHold validates a mirror hold setting: -1 (none), 0 (the
// default) or a bound within the retention's limits.
func checkMirrorHold(bytes, ms int64) error {
	switch {
	case bytes < -1 || bytes > retentionBytesMax:
		return apierr.New(apierr.InvalidArgument, "mirror_hold_max_bytes %d is outside -1..%d (-1: no bound, 0: twice the retention)", bytes, int64(retentionBytesMax))
	case ms < -1 || ms > retentionAgeMillisMax:
		return apierr.New(apierr.InvalidArgument, "mirror_hold_max_ms %d is outside -1..%d (-1: no bound, 0: twice the retention)", ms, int64(retentionAgeMillisMax))
	}
	return nil
}

// retentionInfo is s's retention as the API carries it.
func (s streamSpec) retentionInfo() *geologv1.RetentionPolicy {
	return &geologv1.RetentionPolicy{MaxAgeMs: s.RetentionAgeMillis, MaxBytes: s.RetentionBytes,
		MirrorHoldMaxBytes: s.MirrorHoldBytes, MirrorHoldMaxMs: s.MirrorHoldAgeMillis}
}

// mirrorFloor is the lowest offset the mirrors of a home range have yet to
// apply, as the replicator tasks on this node (its leader) know it: log
// compaction keeps everything from there on. A mirror past the stream's
// hold bound counts for nothing (it is released: see above); when every
// mirror is, the floor is the committed end, so that the heartbeats tell
// the other mirrors' leaders to let go too. A node that does not lead the
// range knows no floor and holds back nothing (see notes/README.md: a
// follower that compacted past a mirror's position and then becomes leader
// cannot ship that part; the mirror's task then reports it behind the
// home's log start).
func (n *Node) mirrorFloor(stream string, rng uint32) (uint64, bool) {
	repl := n.repl.Load()
	if repl == nil {
		return 0, false
	}
	progress := repl.progress(stream, rng, n.cfg.Now())
	if len(progress) == 0 {
		return 0, false
	}
	floor, held := uint64(0), false
	for _, p := range progress {
		if p.HoldReleased {
			continue
		}
		if !held || p.AppliedEndOffset < floor {
			floor, held = p.AppliedEndOffset, true
		}
	}
	if !held {
		return repl.committedEnd(stream, rng), true
	}
	return floor, true
}

// setMirrorHold gives d spec's mirror hold bound.
func (d *rangeDriver) setMirrorHold(spec streamSpec) {
	h := spec.mirrorHold()
	d.hold.Store(&h)
}

// mirrorHold is d's mirror hold bound (none before the node set it).
func (d *rangeDriver) mirrorHold() mirrorHold {
	if h := d.hold.Load(); h != nil {
		return *h
	}
	return mirrorHold{}
}

// holdState works out, on the home leader of d, whether a mirror at appliedEnd
// (known: the mirror answered this task at least once; else appliedEnd is
// 0, the task's worst case) with timeLag is behind d's log start, and
// whether it is released: past the hold bound, or behind the start, where
// holding keeps nothing it can use.
//
// hold is d's bound (d.mirrorHold(); a parameter so that tests set it).
func holdState(d *rangeDriver, hold mirrorHold, appliedEnd uint64, known bool, timeLag time.Duration) (released, behindStart bool) {
	if d == nil || d.store == nil {
		return false, false
	}
	behindStart = known && appliedEnd < d.store.StartOffset()
	return behindStart || hold.exceeded(d.store.SizeFrom(appliedEnd), timeLag), behindStart
}

// knownRegions are the other regions the node's configuration names: the
// hold gauges report 0 for each (a series to alert on from the start).
func (n *Node) knownRegions() []string {
	regions := make([]string, 0, len(n.cfg.Regions))
	for region := range n.cfg.Regions {
		if region != n.cfg.Region {
			regions = append(regions, region)
		}
	}
	return regions
}
