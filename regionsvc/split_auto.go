package regionsvc

import (
	"context"
	"slices"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/keyspace"
)

// Automatic splits by size (docs/split.md "Automatic split"). With
// Config.SplitRangeBytes set, every MaintenanceInterval each node looks at
// the ranges it leads in their home region: one whose log retains more
// bytes than the threshold, and that has not split, is split at its hash
// midpoint through the same four steps as Admin.SplitRange (splitRange:
// forwarded to the catalogue leader, reserved, marker, homes, record), so
// the split is fenced, ordered and idempotent as an operator's is. A
// split that fails (a leadership moved, another split of the stream
// holds the reservation) is tried again at the next look if the range is
// still over the threshold: a reservation left standing is finished by
// the same split asked for again. Splits by load: split_load.go.

// autoSplitsPerRoundMax bounds the splits one node starts in one look, so
// that a node whose ranges all grew past the threshold at once (the
// threshold lowered, say) spreads its splits over several intervals.
const autoSplitsPerRoundMax = 4

// autoSplitTimeout bounds one split.
const autoSplitTimeout = 30 * time.Second

// autoSplitRanges is the node's loop (a stopper task; only with
// SplitRangeBytes or SplitRangeRecordsPerSecond set).
func (n *Node) autoSplitRanges(ctx context.Context) {
	t := time.NewTicker(n.cfg.MaintenanceInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		for _, c := range n.autoSplitPlan(time.Now()) {
			cctx, cancel := context.WithTimeout(ctx, autoSplitTimeout)
			res, err := n.splitRange(cctx, c.stream, c.rng, c.at)
			cancel()
			switch {
			case err == nil:
				n.logger.Info("range split by "+c.reason, "stream", c.stream, "range", c.rng, "bytes", c.bytes, "split_offset", res.offset,
					"at", res.decision.At, "left", res.decision.Left, "right", res.decision.Right)
			case ctx.Err() != nil:
				return
			case apierr.As(err).Code == apierr.SplitInProgress:
				n.logger.Debug("automatic split waits for another split of the stream", "stream", c.stream, "range", c.rng)
			default:
				n.logger.Warn("automatic split failed; tried again at the next look", "stream", c.stream, "range", c.rng, "reason", c.reason, "error", err)
			}
		}
	}
}

// autoSplitCandidate is a range to split: over the size threshold (at 0,
// the midpoint) or over the load threshold (at from its sampled keys).
type autoSplitCandidate struct {
	stream string
	rng    uint32
	at     uint64
	reason string // "size" or "load"
	bytes  int64
}

// autoSplitPlan returns the splits of one look, at most
// autoSplitsPerRoundMax: by size first, then by load.
func (n *Node) autoSplitPlan(now time.Time) []autoSplitCandidate {
	led := n.ledHomeRanges()
	var out []autoSplitCandidate
	if n.cfg.SplitRangeBytes > 0 {
		out = autoSplitBySize(led, n.cfg.SplitRangeBytes, autoSplitsPerRoundMax)
	}
	if n.cfg.SplitRangeRecordsPerSecond > 0 {
		for _, c := range n.loadSplits.look(now, led, n.cfg.SplitRangeRecordsPerSecond, autoSplitsPerRoundMax-len(out)) {
			if !slices.ContainsFunc(out, func(o autoSplitCandidate) bool { return o.stream == c.stream && o.rng == c.rng }) {
				out = append(out, c)
			}
		}
	}
	return out
}

// autoSplitBySize returns up to limit ranges of led whose logs retain
// more than thresholdBytes.
func autoSplitBySize(led []ledRange, thresholdBytes int64, limit int) []autoSplitCandidate {
	var out []autoSplitCandidate
	for _, lr := range led {
		if size := lr.d.store.Size(); size > thresholdBytes && len(out) < limit {
			out = append(out, autoSplitCandidate{stream: lr.stream, rng: lr.rng, reason: "size", bytes: size})
		}
	}
	return out
}

// ledRange is a range this node leads in its home region that has not
// split, with the hashes it owns.
type ledRange struct {
	stream string
	rng    uint32
	lo, hi uint64
	d      *rangeDriver
	// reserved: a split of this range is reserved and not finished; asked
	// for again at boundary 0, it is finished at its own boundary.
	reserved bool
}

// ledHomeRanges returns the ranges of user streams this node leads in
// their home region, not split and serving.
func (n *Node) ledHomeRanges() []ledRange {
	n.mu.RLock()
	defer n.mu.RUnlock()
	var out []ledRange
	for name, st := range n.streams {
		if isInternalStream(name) || name == metaStreamName {
			continue
		}
		var rm *keyspace.RangeMap // built on the stream's first led range
		res, reserved := st.spec.reservedSplit()
		for r, d := range st.ranges {
			if d == nil || d.store == nil || d.rep == nil || d.failure.Load() != nil ||
				!d.isHome() || d.rep.LeaderID() != n.cfg.NodeID {
				continue
			}
			if rm == nil {
				m := st.spec.rangeMap()
				rm = &m
			}
			if rr, ok := rm.Get(uint32(r)); ok && !rr.IsSplit() {
				out = append(out, ledRange{stream: name, rng: uint32(r), lo: rr.HashStart, hi: rr.HashEnd, d: d,
					reserved: reserved && res.Parent == uint32(r)})
			}
		}
	}
	return out
}
