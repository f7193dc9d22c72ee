package regionsvc

import (
	"context"
	"time"

	"github.com/geolog/geolog/apierr"
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
// the same split asked for again. Load-based splitting is later work.

// autoSplitsPerRoundMax bounds the splits one node starts in one look, so
// that a node whose ranges all grew past the threshold at once (the
// threshold lowered, say) spreads its splits over several intervals.
const autoSplitsPerRoundMax = 4

// autoSplitTimeout bounds one split.
const autoSplitTimeout = 30 * time.Second

// autoSplitRanges is the node's loop (a stopper task; only with
// SplitRangeBytes set).
func (n *Node) autoSplitRanges(ctx context.Context) {
	t := time.NewTicker(n.cfg.MaintenanceInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		for _, c := range n.autoSplitCandidates(n.cfg.SplitRangeBytes, autoSplitsPerRoundMax) {
			cctx, cancel := context.WithTimeout(ctx, autoSplitTimeout)
			res, err := n.splitRange(cctx, c.stream, c.rng, 0)
			cancel()
			switch {
			case err == nil:
				n.logger.Info("range split by size", "stream", c.stream, "range", c.rng, "bytes", c.bytes, "split_offset", res.offset,
					"left", res.decision.Left, "right", res.decision.Right)
			case ctx.Err() != nil:
				return
			case apierr.As(err).Code == apierr.SplitInProgress:
				n.logger.Debug("automatic split waits for another split of the stream", "stream", c.stream, "range", c.rng)
			default:
				n.logger.Warn("automatic split failed; tried again at the next look", "stream", c.stream, "range", c.rng, "error", err)
			}
		}
	}
}

// autoSplitCandidate is a range over the size threshold.
type autoSplitCandidate struct {
	stream string
	rng    uint32
	bytes  int64
}

// autoSplitCandidates returns up to limit ranges led here in their home
// region, not split, whose logs retain more than thresholdBytes.
func (n *Node) autoSplitCandidates(thresholdBytes int64, limit int) []autoSplitCandidate {
	n.mu.RLock()
	defer n.mu.RUnlock()
	var out []autoSplitCandidate
	for name, st := range n.streams {
		if isInternalStream(name) || name == metaStreamName {
			continue
		}
		var m []bool // the stream's split ranges, built on its first candidate
		for r, d := range st.ranges {
			if d == nil || d.store == nil || d.rep == nil || d.failure.Load() != nil ||
				!d.isHome() || d.rep.LeaderID() != n.cfg.NodeID {
				continue
			}
			size := d.store.Size()
			if size <= thresholdBytes {
				continue
			}
			if m == nil {
				rm := st.spec.rangeMap()
				m = make([]bool, len(rm.Ranges))
				for i, rr := range rm.Ranges {
					m[i] = rr.IsSplit()
				}
			}
			if r < len(m) && !m[r] {
				out = append(out, autoSplitCandidate{stream: name, rng: uint32(r), bytes: size})
				if len(out) == limit {
					return out
				}
			}
		}
	}
	return out
}
