package regionsvc

import (
	"context"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
)

// The reservation of a split (docs/split.md, "The catalogue"). A split's
// marker names the map version it makes and its children's ids, so two
// splits of one stream must never take the same version: before the
// marker is proposed, the catalogue leader commits a catalogue record
// "split-reserve" holding the decision. Every node applies it in
// catalogue order and keeps it in the stream's definition
// (streamSpec.SplitReserved) until the split's own record supersedes it;
// a reservation is taken only if it is the next split of the map and no
// other stands. The proposer reads the outcome back from its applied
// catalogue: of two racing splits (two nodes that both believed they led
// the catalogue), exactly one finds its decision there, and the other
// answers SPLIT_IN_PROGRESS having written nothing.
//
// A reservation whose split did not finish (its proposer died, lost its
// leadership or its range's lease) stands until the same split is asked
// for again, which continues it: the marker is written once (a log that
// holds it already is answered from it), the children's homes are
// created once, and the record is idempotent.

// opSplitReserve is the catalogue record of a split's reservation.
const opSplitReserve = "split-reserve"

// reservedSplit returns the split the stream's definition reserves and
// has not recorded yet.
func (s streamSpec) reservedSplit() (batch.Split, bool) {
	if s.SplitReserved == nil || s.SplitReserved.MapVersion <= s.rangeMap().Version {
		return batch.Split{}, false
	}
	return *s.SplitReserved, true
}

// reserveSplit reserves the split of range r of spec's stream at hash
// boundary at (0: the midpoint) and returns its decision: the reservation
// that stands if it is the same split (at 0 matches any boundary), a new
// one if none stands. It commits the record through this node, which must
// lead the catalogue (NOT_LEADER otherwise).
func (n *Node) reserveSplit(ctx context.Context, spec streamSpec, r uint32, at uint64) (batch.Split, error) {
	if res, ok := spec.reservedSplit(); ok {
		if res.Parent == r && (at == 0 || at == res.At) {
			// An unfinished split, asked for again. (The reservation
			// came from disk: it must still be the map's next split.)
			if want, err := splitDecision(spec.Name, spec.rangeMap(), res.Parent, res.At); err != nil || want != res {
				return batch.Split{}, apierr.New(apierr.Internal, "stream %q: the reserved split of range %d is not the map's next split", spec.Name, r)
			}
			return res, nil
		}
		return batch.Split{}, apierr.New(apierr.SplitInProgress, "stream %q: the split of range %d (map version %d) is under way", spec.Name, res.Parent, res.MapVersion)
	}
	dec, err := splitDecision(spec.Name, spec.rangeMap(), r, at)
	if err != nil {
		return batch.Split{}, err
	}
	if err := n.claimSplit(ctx, spec, dec); err != nil {
		return batch.Split{}, err
	}
	rec := metaRecord{Op: opSplitReserve, Spec: streamSpec{Name: spec.Name, MetaOffset: spec.MetaOffset}, Reserve: &dec}
	if err := n.commitMeta(ctx, rec); err != nil {
		return batch.Split{}, err
	}
	n.mu.RLock()
	st, ok := n.streams[spec.Name]
	n.mu.RUnlock()
	if !ok || st.spec.MetaOffset != spec.MetaOffset {
		return batch.Split{}, apierr.New(apierr.StreamNotFound, "stream %q was deleted while it split", spec.Name)
	}
	if got, ok := st.spec.reservedSplit(); !ok || got != dec {
		return batch.Split{}, apierr.New(apierr.SplitInProgress, "stream %q: another split reserved map version %d first", spec.Name, dec.MapVersion)
	}
	return dec, nil
}

// claimSplit claims dec's map version in the lease store, with homing on
// (homing/splitclaim.go): the ranges of a stream may be homed in several
// regions, each reserving its splits in its own catalogue, and the claim
// keeps two of them from splitting at one version (the children's ids
// follow from it). A version claimed by another region answers
// SPLIT_IN_PROGRESS (retriable) until this region's map has that split.
//
// Without a lease store (homes fixed at creation) nothing orders the
// splits of regions: a stream homed in several regions does not split.
func (n *Node) claimSplit(ctx context.Context, spec streamSpec, dec batch.Split) error {
	stream := spec.Name
	if n.homing == nil {
		for _, h := range spec.Homes {
			if h != "" && h != spec.Homes[0] {
				return apierr.New(apierr.InvalidArgument, "stream %q is homed in more than one region (%s and %s): its splits need the lease store to order them across regions",
					stream, spec.Homes[0], h)
			}
		}
		return nil
	}
	err := n.homing.homes.ClaimSplit(ctx, stream, dec.MapVersion, dec.Parent, dec.At, n.cfg.Now().UnixNano())
	if err != nil {
		return apierr.Wrap(apierr.As(homingErr(err)).Code, err, "stream %q range %d: claiming map version %d", stream, dec.Parent, dec.MapVersion)
	}
	return nil
}

// applySplitReserve applies a catalogue "split-reserve" record, on the
// catalogue driver's goroutine. The reservation is taken if it is the
// decision this node's map gives for its parent and boundary (a record
// from the log is checked like anything read) and no other stands.
func (n *Node) applySplitReserve(at uint64, rec metaRecord) {
	n.mu.Lock()
	st, ok := n.streams[rec.Spec.Name]
	if !ok || st.spec.MetaOffset != rec.Spec.MetaOffset || rec.Reserve == nil {
		n.mu.Unlock()
		return // a deleted stream, or a newer one of the name
	}
	dec := *rec.Reserve
	if cur, ok := st.spec.reservedSplit(); ok {
		n.mu.Unlock()
		if cur != dec {
			n.logger.Info("split reservation refused: another stands", "stream", rec.Spec.Name, "range", dec.Parent,
				"holder", cur.Parent, "version", cur.MapVersion, "catalogue_offset", at)
		}
		return
	}
	if want, err := splitDecision(rec.Spec.Name, st.spec.rangeMap(), dec.Parent, dec.At); err != nil || want != dec {
		n.mu.Unlock()
		n.logger.Info("split reservation refused: not the next split of the map", "stream", rec.Spec.Name, "range", dec.Parent,
			"version", dec.MapVersion, "catalogue_offset", at, "error", err)
		return
	}
	s := st.spec
	s.SplitReserved = &dec
	n.streams[s.Name] = &streamState{spec: s, ranges: st.ranges}
	specs := n.specsLocked()
	n.mu.Unlock()
	if err := saveCatalog(n.cfg.fsys(), n.cfg.DataDir, specs, at); err != nil {
		n.logger.Error("save applied catalogue", "error", err)
	}
	n.logger.Info("split reserved", "stream", s.Name, "range", dec.Parent, "version", dec.MapVersion, "at", dec.At, "catalogue_offset", at)
}
