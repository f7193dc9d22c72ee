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
	out := make(map[string][]uint32, len(members))
	if len(members) == 0 {
		return out
	}
	n := len(members)
	base, extra := int(rangeCount)/n, int(rangeCount)%n
	taken := make([]bool, rangeCount)
	kept := make(map[string][]uint32, n)
	for _, m := range members {
		for _, r := range prev[m] {
			if r < rangeCount && !taken[r] {
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
	next := uint32(0)
	for _, m := range members {
		for len(out[m]) < quota[m] {
			for taken[next] {
				next++
			}
			taken[next] = true
			out[m] = append(out[m], next)
		}
		slices.Sort(out[m])
	}
	return out
}
