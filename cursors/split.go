package cursors

import "slices"

// Groups across range splits (docs/split.md "Consumer groups and
// cursors"). A split range (the parent) ends at its split offset and its
// keys continue in two children, read from offset 0. Cursors are per
// (group, range), so each child has its own. The coordinator assigns over
// the stream's range map: a range is assignable while the group has not
// finished it (its committed position is below its split offset, or it
// has not split) and every range it descends from is finished. So a
// child is never handed to a member before the group committed its
// parent's last records, and per-key order holds across the split: no
// member reads a key's records in a child before the group processed the
// same key's records in the parent. When the member that owns a parent
// commits the split offset, the next heartbeat of any member retargets the
// group: the parent leaves the target and the children join it, handed
// over by the usual release and grant, fenced by epochs as any move.

// Split is a split range of a stream, as the stream's range map holds it.
type Split struct {
	Parent      uint32
	SplitOffset uint64
	Left, Right uint32
}

// SplitsOf returns the splits of a stream's range map (nil: none). The
// driver sets it to read its catalogue; a pure lookup, called within a
// batch.
type SplitsOf func(stream string) []Split

// splits returns g's stream's splits whose ranges a group can hold.
func (c *Coordinator) splits(g *Group) []Split {
	if c.SplitsOf == nil {
		return nil
	}
	var out []Split
	for _, s := range c.SplitsOf(g.Stream) {
		if s.Parent < RangesMax && s.Left < RangesMax && s.Right < RangesMax {
			out = append(out, s)
		}
	}
	return out
}

// assignable returns the ranges of g a member may be assigned, sorted:
// the stream's ranges as created when it has no split, else those the
// group has not finished whose ancestors it has (see the top of this
// file).
func (c *Coordinator) assignable(b *Batch, g *Group) []uint32 {
	splits := c.splits(g)
	ids := g.RangeCount
	for _, s := range splits {
		ids = max(ids, s.Left+1, s.Right+1)
	}
	ids = min(ids, RangesMax)
	parent := make(map[uint32]uint32, 2*len(splits))
	end := make(map[uint32]uint64, len(splits))
	for _, s := range splits {
		parent[s.Left], parent[s.Right] = s.Parent, s.Parent
		end[s.Parent] = s.SplitOffset
	}
	finished := func(r uint32) bool {
		off, split := end[r]
		if !split {
			return false
		}
		p, ok := b.position(g.Name, g.Stream, r)
		return ok && p.Offset >= off
	}
	out := make([]uint32, 0, ids)
	for r := uint32(0); r < ids; r++ {
		if finished(r) {
			continue
		}
		ready := true
		for a, ok := parent[r]; ok && ready; a, ok = parent[a] {
			ready = finished(a)
		}
		if ready {
			out = append(out, r)
		}
	}
	return out
}

// assignableChanged reports whether g's targets no longer cover exactly
// what is assignable (a parent was finished since they were computed).
func (c *Coordinator) assignableChanged(b *Batch, g *Group) bool {
	if len(g.Members) == 0 || len(c.splits(g)) == 0 {
		return false
	}
	var targets []uint32
	for _, m := range g.Members {
		targets = append(targets, m.Target...)
	}
	slices.Sort(targets)
	return !slices.Equal(targets, c.assignable(b, g))
}

// children returns the children of the splits of g's stream.
func (c *Coordinator) children(g *Group) map[uint32]bool {
	out := map[uint32]bool{}
	for _, s := range c.splits(g) {
		out[s.Left], out[s.Right] = true, true
	}
	return out
}
