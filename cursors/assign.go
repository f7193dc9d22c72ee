package cursors

import (
	"slices"
	"sort"
)

// Assign computes a group's target assignment of rangeCount ranges to
// members (sorted ids), given each member's previous target: balanced
// (every member gets rangeCount/len(members) ranges, the first
// rangeCount%len(members) of them one more) and sticky (no assignment
// that is balanced moves fewer ranges away from their previous target
// member). Deterministic: the same input gives the same output.
//
// The members that had the most ranges get the larger shares, each keeps
// its lowest previous ranges up to its share, and the ranges left over go,
// lowest first, to the members still under their share, in id order.
// Keeping min(previous, share) per member is the most any balanced
// assignment keeps, and larger shares to larger previous sets maximise
// that sum.
func Assign(members []string, prev map[string][]uint32, rangeCount uint32) map[string][]uint32 {
	ranges := make([]uint32, rangeCount)
	for i := range ranges {
		ranges[i] = uint32(i)
	}
	return AssignRanges(members, prev, ranges)
}

// AssignRanges is Assign over the given ranges (sorted, unique, each
// below RangesMax) rather than 0..rangeCount-1: those a group may be
// assigned (split.go).
func AssignRanges(members []string, prev map[string][]uint32, ranges []uint32) map[string][]uint32 {
	out := make(map[string][]uint32, len(members))
	if len(members) == 0 {
		return out
	}
	n := len(members)
	base, extra := len(ranges)/n, len(ranges)%n
	idsMax := uint32(0)
	if len(ranges) > 0 {
		idsMax = ranges[len(ranges)-1] + 1
	}
	assignable := make([]bool, idsMax)
	for _, r := range ranges {
		assignable[r] = true
	}
	taken := make([]bool, idsMax)
	kept := make(map[string][]uint32, n)
	for _, m := range members {
		for _, r := range prev[m] {
			if r < idsMax && assignable[r] && !taken[r] {
				taken[r] = true
				kept[m] = append(kept[m], r)
			}
		}
		slices.Sort(kept[m])
	}
	order := slices.Clone(members)
	sort.SliceStable(order, func(i, j int) bool {
		if len(kept[order[i]]) != len(kept[order[j]]) {
			return len(kept[order[i]]) > len(kept[order[j]])
		}
		return order[i] < order[j]
	})
	quota := make(map[string]int, n)
	for i, m := range order {
		quota[m] = base
		if i < extra {
			quota[m]++
		}
	}
	clear(taken)
	for _, m := range members {
		k := kept[m][:min(len(kept[m]), quota[m])]
		for _, r := range k {
			taken[r] = true
		}
		out[m] = slices.Clone(k)
	}
	next := 0
	for _, m := range members {
		for len(out[m]) < quota[m] {
			for taken[ranges[next]] {
				next++
			}
			taken[ranges[next]] = true
			out[m] = append(out[m], ranges[next])
		}
		slices.Sort(out[m])
	}
	return out
}
