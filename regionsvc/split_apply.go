package regionsvc

import (
	"context"
	"slices"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/keyspace"
)

// The catalogue half of a split (docs/split.md): once the parent's marker
// is committed, the node that proposed it proposes a catalogue record
// "split" carrying the stream's definition with its new range map (one
// split more) and the children's first voters (the parent's, as
// CockroachDB starts a split's right-hand range on the left-hand range's
// replicas). Every node applies it in catalogue order (applySplit): it
// opens the children's Raft groups and routes keys by the new map. A
// record that is not the next split of the stream's map is skipped: an
// applied split is never applied twice, and two splits never take the
// same ids.

// opSplit is the catalogue record of a split.
const opSplit = "split"

// catalogueSplit proposes the catalogue record of the committed split res
// of range r and waits until this node applied it. Only the catalogue's
// leader proposes (NOT_LEADER otherwise: the split is committed in the
// range's log, and its record is still to be written).
func (n *Node) catalogueSplit(ctx context.Context, stream string, r uint32, res splitResult) error {
	st, err := n.lookupStream(ctx, stream)
	if err != nil {
		return err
	}
	spec := st.spec
	m, err := spec.rangeMap().Split(r, res.decision.At, res.offset)
	if err != nil {
		return apierr.Wrap(apierr.Internal, err, "stream %q: the split marker of range %d does not follow the catalogue's map", stream, r)
	}
	if m.Version != res.decision.MapVersion {
		return apierr.New(apierr.Internal, "stream %q: split of map version %d, the catalogue's map is at %d", stream, res.decision.MapVersion, m.Version-1)
	}
	spec.RangeMap = &m
	if reps := spec.replicasOf(r); reps != nil && len(spec.Replicas) == int(res.decision.Left) {
		spec.Replicas = append(slices.Clone(spec.Replicas), reps, slices.Clone(reps))
	}
	out, err := n.proposeMeta(ctx, metaRecord{Op: opSplit, Spec: spec})
	if err == nil {
		err = out.err
	}
	if err != nil {
		return err
	}
	return n.waitCatalogue(ctx, stream, "split", func(st *streamState, ok bool) (bool, error) {
		if !ok || st.spec.MetaOffset != spec.MetaOffset {
			return false, apierr.New(apierr.StreamNotFound, "stream %q was deleted while it split", stream)
		}
		return st.spec.rangeMap().Version >= m.Version, nil
	})
}

// applySplit applies a catalogue "split" record, on the catalogue
// driver's goroutine.
func (n *Node) applySplit(at uint64, spec streamSpec) {
	n.mu.RLock()
	st, ok := n.streams[spec.Name]
	n.mu.RUnlock()
	if !ok || st.spec.MetaOffset != spec.MetaOffset || spec.RangeMap == nil {
		return // a deleted stream, or a newer one of the name
	}
	cur, next := st.spec.rangeMap(), *spec.RangeMap
	if next.Version <= cur.Version {
		return // applied already
	}
	if !nextSplit(cur, next) {
		n.logger.Error("catalogue split record is not the next split of the stream; skipped", "stream", spec.Name, "offset", at,
			"version", next.Version, "have", cur.Version)
		return
	}
	s := st.spec
	s.RangeMap, s.Replicas = &next, spec.Replicas
	ranges := slices.Clone(st.ranges)
	for r := uint32(len(cur.Ranges)); r < uint32(len(next.Ranges)); r++ {
		ranges = append(ranges, n.openRange(s, s.MetaOffset, r))
	}
	n.mu.Lock()
	if n.streams[s.Name] != st {
		// Deleted or changed while the children opened: an alter is
		// the only other record this goroutine applies, and it ran
		// before; nothing else replaces st.
		n.logger.Error("stream changed while its split applied", "stream", s.Name)
	}
	n.streams[s.Name] = &streamState{spec: s, ranges: ranges}
	if p := next.Ranges[len(cur.Ranges)].Parent; int(p) < len(ranges) && ranges[p] != nil {
		ranges[p].learnSplitEnd(&next) // split_read.go
	}
	for r := len(cur.Ranges); r < len(ranges); r++ {
		n.region.groups[groupFor(s.MetaOffset, uint32(r))] = ranges[r]
	}
	specs := n.specsLocked()
	n.mu.Unlock()
	if err := saveCatalog(n.cfg.fsys(), n.cfg.DataDir, specs, at); err != nil {
		n.logger.Error("save applied catalogue", "error", err)
	}
	n.logger.Info("range split", "stream", s.Name, "version", next.Version, "ranges", len(next.Ranges), "catalogue_offset", at)
}

// nextSplit reports whether next is cur after one more split: a valid map
// that cur.Split gives for the parent, boundary and offset next names.
func nextSplit(cur, next keyspace.RangeMap) bool {
	if next.Validate() != nil || len(next.Ranges) != len(cur.Ranges)+2 {
		return false
	}
	left, right := next.Ranges[len(cur.Ranges)], next.Ranges[len(cur.Ranges)+1]
	p, ok := next.Get(left.Parent)
	if !ok {
		return false
	}
	want, err := cur.Split(left.Parent, right.HashStart, p.SplitOffset)
	return err == nil && want.Equal(next)
}
