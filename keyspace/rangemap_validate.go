package keyspace

import "fmt"

// Validate checks that m is a range map as NewRangeMap and Split build
// them, so that a map from disk or the network can be trusted: Lookup,
// Ancestors and Split on a map that passes never panic nor loop. It
// checks that the originals tile the hash space as RangeForHash does;
// that ranges Initial+2k and Initial+2k+1 are the left and right children
// of one earlier range whose slice they tile at a boundary that leaves
// neither empty; that every split range names them and every other range
// names none; and that Version counts the splits.
func (m RangeMap) Validate() error {
	n := len(m.Ranges)
	switch {
	case m.Initial == 0 || m.Initial > RangesMax || n > RangesMax:
		return fmt.Errorf("%w: %d initial ranges, %d in all (at most %d)", ErrBadMap, m.Initial, n, RangesMax)
	case n < int(m.Initial) || (n-int(m.Initial))%2 != 0:
		return fmt.Errorf("%w: %d ranges from %d initial ones", ErrBadMap, n, m.Initial)
	case m.Version != uint64(n-int(m.Initial))/2:
		return fmt.Errorf("%w: version %d after %d splits", ErrBadMap, m.Version, (n-int(m.Initial))/2)
	}
	for i, r := range m.Ranges {
		if err := m.validRange(uint32(i), r); err != nil {
			return err
		}
	}
	return nil
}

// validRange checks range i of m (see Validate).
func (m RangeMap) validRange(i uint32, r Range) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: range %d: %s", ErrBadMap, i, fmt.Sprintf(format, args...))
	}
	if r.ID != i {
		return bad("has id %d", r.ID)
	}
	if r.HashStart > r.HashEnd {
		return bad("owns no hash")
	}
	if i < m.Initial {
		if r.Parent != NoRange || r.HashStart != HashStart(i, m.Initial) || r.HashEnd != HashEnd(i, m.Initial) {
			return bad("is not original range %d of %d", i, m.Initial)
		}
	} else {
		first := i - (i-m.Initial)%2 // the left child of the pair
		if r.Parent >= first {
			return bad("has parent %d, not an earlier range", r.Parent)
		}
		p := m.Ranges[r.Parent]
		if p.Left != first || p.Right != first+1 {
			return bad("parent %d names children %d and %d", r.Parent, p.Left, p.Right)
		}
		if i == first && r.HashStart != p.HashStart || i != first && r.HashEnd != p.HashEnd {
			return bad("does not share its parent's bounds")
		}
		if i == first && (int(i)+1 >= len(m.Ranges) || r.HashEnd == ^uint64(0) || m.Ranges[i+1].HashStart != r.HashEnd+1) {
			return bad("does not meet its sibling")
		}
	}
	switch {
	case r.Left == NoRange && r.Right == NoRange:
		if r.SplitOffset != 0 {
			return bad("has a split offset and no children")
		}
	case r.Left < m.Initial || uint64(r.Right) != uint64(r.Left)+1 || (r.Left-m.Initial)%2 != 0 || int(r.Right) >= len(m.Ranges):
		return bad("has children %d and %d", r.Left, r.Right)
	case m.Ranges[r.Left].Parent != i || m.Ranges[r.Right].Parent != i:
		return bad("its children %d and %d name another parent", r.Left, r.Right)
	}
	return nil
}
