package regionsvc

import (
	"context"
	"errors"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/keyspace"
)

// Splits in mirror regions (docs/split.md "Mirrors"). The home region's
// replicator ships a parent's split marker as it ships any frame, so every
// mirror's copy of the parent ends at the split offset. The mirror region
// then records the split in its own catalogue, from the marker in its own
// log rather than from a message of the home's: whatever the mirror missed
// while it was down or cut off, the marker reaches it with the rest of
// the parent's log, and a node that restarts finds it in its log again.
//
//  1. Every range driver notes, once its replica's log holds a split marker
//     (rangeDriver.splitSeen), that it may need a record.
//  2. Every node looks, every mirrorSplitInterval, at the ranges of its
//     node that are mirrors here (homed in another region, as its view of
//     the homes says), noted in step 1, and not yet split in the
//     catalogue's map. The catalogue leader takes step 3 for them; any
//     other node asks the catalogue leader to, for those whose mirror
//     group it leads (split_forward.go).
//  3. For each whose replica applied the marker, it proposes the catalogue
//     record "split" (catalogueSplit: the same record the home region
//     writes), once the marker's decision is the next split of the map
//     and names the children the map would: every region's copy then has
//     the same children, with the same ids, opened on the parent's voters
//     here. A marker of a later map version waits for the earlier split's
//     marker (of another range of the stream) to be recorded first.
//  4. The children's groups open on every node of the region (applySplit),
//     and the home's replicator tasks for the children, which retried
//     while the mirror did not hold them, feed them from offset 0: the
//     same frames at the same offsets as in the home.
//
// The home region never takes this path: its record follows the children's
// homes (split_admin.go), which a mirror does not write.
//
// A catalogue leader that holds no replica of the parent (a region larger
// than the replication factor) does not see the marker: the parent's
// mirror-group leader asks it to record the split (split_forward.go).

// mirrorSplitInterval is how often a node looks for mirror ranges whose
// marker is applied and whose split is not recorded.
const mirrorSplitInterval = 500 * time.Millisecond

// mirrorSplitTimeout bounds one record's proposal and apply.
const mirrorSplitTimeout = 10 * time.Second

// recordMirrorSplits is the node's loop of step 2 (a stopper task): on
// the catalogue leader, step 3 for every candidate; on any other node,
// the forwarded request of each candidate whose mirror group it leads
// (split_forward.go), retried with backoff until recorded.
func (n *Node) recordMirrorSplits(ctx context.Context) {
	t := time.NewTicker(mirrorSplitInterval)
	defer t.Stop()
	retries := mirrorSplitRetries{}
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		if !n.replicated() || n.region.meta.rep == nil {
			continue
		}
		cands := n.mirrorSplitCandidates()
		retries.keepOnly(cands)
		leads := n.leadsCatalogue()
		for _, c := range cands {
			switch {
			case leads:
				n.recordMirrorSplitHere(ctx, c)
			case c.d.rep.LeaderID() == n.cfg.NodeID && retries.due(c, n.cfg.Now()):
				err := n.forwardMirrorSplitOnce(ctx, c)
				retries.done(c, err, n.cfg.Now())
			}
		}
	}
}

// recordMirrorSplitHere is step 3 for c on the catalogue leader, bounded
// by mirrorSplitTimeout.
func (n *Node) recordMirrorSplitHere(ctx context.Context, c mirrorSplitCandidate) {
	cctx, cancel := context.WithTimeout(ctx, mirrorSplitTimeout)
	err := n.recordMirrorSplit(cctx, c.stream, c.rng, c.d)
	cancel()
	if err != nil && ctx.Err() == nil {
		n.logger.Warn("mirror split not recorded yet", "stream", c.stream, "range", c.rng, "error", err)
	}
}

// mirrorSplitCandidate is a mirror range whose log holds a split marker
// that the catalogue's map does not show.
type mirrorSplitCandidate struct {
	stream string
	rng    uint32
	d      *rangeDriver
}

// mirrorSplitCandidates returns step 2's ranges.
func (n *Node) mirrorSplitCandidates() []mirrorSplitCandidate {
	n.mu.RLock()
	defer n.mu.RUnlock()
	var out []mirrorSplitCandidate
	for name, st := range n.streams {
		var m []bool // the stream's split ranges, built on its first candidate
		for r, d := range st.ranges {
			if d == nil || d.rep == nil || !d.splitSeen.Load() {
				continue
			}
			if role := d.role(); role.home || role.region == "" || role.region == n.cfg.Region {
				continue // the home's own split, or a home not settled here yet
			}
			if m == nil {
				rm := st.spec.rangeMap()
				m = make([]bool, len(rm.Ranges))
				for i, rr := range rm.Ranges {
					m[i] = rr.IsSplit()
				}
			}
			if r < len(m) && !m[r] {
				out = append(out, mirrorSplitCandidate{stream: name, rng: uint32(r), d: d})
			}
		}
	}
	return out
}

// recordMirrorSplit is step 3 for range r: the catalogue's record of the
// split whose marker its replica applied, if that is the map's next split.
func (n *Node) recordMirrorSplit(ctx context.Context, stream string, r uint32, d *rangeDriver) error {
	var dec batch.Split
	var offset uint64
	var applied bool
	var rerr error
	if err := d.exec(ctx, func() { dec, offset, applied, rerr = d.rep.SplitApplied() }); err != nil {
		return err
	}
	if rerr != nil {
		return apierr.Wrap(apierr.Internal, rerr, "stream %q range %d", stream, r)
	}
	if !applied {
		return nil // written, not applied yet (or truncated away): the next look
	}
	st, err := n.lookupStream(ctx, stream)
	if err != nil {
		return err
	}
	recorded, err := checkMirrorSplit(stream, st.spec.rangeMap(), r, dec, offset)
	switch {
	case errors.Is(err, errEarlierSplitPending):
		return nil // an earlier split of the stream is not recorded here yet; its marker comes
	case err != nil:
		return err
	case recorded:
		return nil // recorded meanwhile
	}
	if err := n.catalogueSplit(ctx, stream, r, splitResult{offset: offset, decision: dec}); err != nil {
		return err
	}
	n.logger.Info("mirror split recorded", "stream", stream, "range", r, "split_offset", offset, "version", dec.MapVersion,
		"left", dec.Left, "right", dec.Right)
	return nil
}

// errEarlierSplitPending is a split marker of a later map version than the
// map's next: the stream's earlier split (of another range) is not
// recorded in this region yet. Its marker comes; retry.
var errEarlierSplitPending = errors.New("regionsvc: an earlier split of the stream is not recorded here yet")

// checkMirrorSplit checks the split of range r that a marker at offset
// with decision dec describes against the catalogue's map m: recorded if m
// shows that very split already; an error if m cannot take it now
// (UNAVAILABLE wrapping errEarlierSplitPending: a later split than the
// map's next), or ever (RANGE_SPLIT: r split otherwise; INVALID_ARGUMENT:
// not the map's next split, or not a split of r's bounds, or not the ids
// the map would give).
func checkMirrorSplit(stream string, m keyspace.RangeMap, r uint32, dec batch.Split, offset uint64) (recorded bool, err error) {
	p, ok := m.Get(r)
	switch {
	case !ok:
		return false, apierr.New(apierr.RangeNotFound, "stream %q has no range %d", stream, r)
	case dec.Parent != r:
		return false, apierr.New(apierr.InvalidArgument, "stream %q range %d: a split marker of range %d", stream, r, dec.Parent)
	case p.IsSplit():
		if right, _ := m.Get(p.Right); p.Left == dec.Left && p.Right == dec.Right && p.SplitOffset == offset && right.HashStart == dec.At {
			return true, nil
		}
		return false, apierr.New(apierr.RangeSplit, "stream %q range %d split at offset %d into %d and %d; the marker says offset %d into %d and %d at %d",
			stream, r, p.SplitOffset, p.Left, p.Right, offset, dec.Left, dec.Right, dec.At)
	case dec.MapVersion > m.Version+1:
		return false, apierr.Wrap(apierr.Unavailable, errEarlierSplitPending, "stream %q range %d: split of map version %d, the map is at %d",
			stream, r, dec.MapVersion, m.Version)
	case dec.MapVersion <= m.Version:
		return false, apierr.New(apierr.InvalidArgument, "stream %q range %d: split marker of map version %d, the map is at %d and does not show it",
			stream, r, dec.MapVersion, m.Version)
	case p.HashStart != dec.HashStart || p.HashEnd != dec.HashEnd:
		return false, apierr.New(apierr.InvalidArgument, "stream %q range %d: the marker's bounds [%d, %d] are not the map's [%d, %d]",
			stream, r, dec.HashStart, dec.HashEnd, p.HashStart, p.HashEnd)
	}
	if left, right := m.NextIDs(); left != dec.Left || right != dec.Right {
		return false, apierr.New(apierr.InvalidArgument, "stream %q range %d: the marker names children %d and %d, the map's next are %d and %d",
			stream, r, dec.Left, dec.Right, left, right)
	}
	if _, err := m.Split(r, dec.At, offset); err != nil {
		return false, apierr.Wrap(apierr.InvalidArgument, err, "stream %q range %d: split at %d", stream, r, dec.At)
	}
	return false, nil
}
