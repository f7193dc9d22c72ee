package console

import (
	"slices"
	"strings"

	"github.com/geolog/geolog/client"
)

// answer is one node's DescribeStream, tagged with the node's region.
type answer struct {
	region, addr string
	// c is the node's index in the collector's list.
	c    int
	desc *client.StreamDescription
	err  error
}

// mirrorState is the State a mirror leader gives its own region's
// progress ("mirror", or "mirror: why"); a home leader reports its
// replicator tasks' phases instead ("connecting", "streaming", ...).
const mirrorState = "mirror"

func isMirrorState(s string) bool { return s == mirrorState || strings.HasPrefix(s, mirrorState+":") }

// mergeRanges merges every node's report of a stream into one Range per
// range (the rules of `geolog ranges`, cli/ranges.go, with one thing more
// known here: which region each answer comes from).
//
//   - The home region is the one the most advanced report (highest
//     epoch) names.
//   - Epoch, tail and leader come from the home region's nodes: the home
//     leader's report (it lists the mirrors' progress) when one answered,
//     else the most advanced report of a home-region node (a follower's
//     tail trails the leader's, never passes it). Known is false when no
//     node of the home region answered.
//   - A mirror region's copy is as the home leader's replicator reports
//     it, else as that region's own leader reports itself (State
//     "mirror..."); its offset lag is at least the tail shown minus its
//     applied end, since the replicator's figure trails what arrived
//     since it last shipped. A region nobody reported on stays unknown.
func mergeRanges(regions []string, rangeCount uint32, answers []answer) []Range {
	out := make([]Range, rangeCount)
	for i := range out {
		out[i] = mergeRange(regions, uint32(i), answers)
	}
	return out
}

func mergeRange(regions []string, rng uint32, answers []answer) Range {
	type report struct {
		ri     *client.RangeInfo
		region string
	}
	var reports []report
	for _, a := range answers {
		if a.err != nil || a.desc == nil {
			continue
		}
		for i := range a.desc.Ranges {
			if a.desc.Ranges[i].Range == rng {
				reports = append(reports, report{&a.desc.Ranges[i], a.region})
				break
			}
		}
	}
	r := Range{Range: rng, Regions: map[string]RegionCopy{}}
	var homeEpoch uint64
	for _, rp := range reports {
		if r.Home == "" || rp.ri.Epoch > homeEpoch {
			r.Home, homeEpoch = rp.ri.HomeRegion, rp.ri.Epoch
		}
	}
	// The home region's best report: the home leader's first, then the
	// most advanced.
	var home *client.RangeInfo
	better := func(a, b *client.RangeInfo) bool {
		aLeads, bLeads := leadsHome(a), leadsHome(b)
		if aLeads != bLeads {
			return aLeads
		}
		if a.Epoch != b.Epoch {
			return a.Epoch > b.Epoch
		}
		return a.TailOffset > b.TailOffset
	}
	for _, rp := range reports {
		if rp.region == r.Home && (home == nil || better(rp.ri, home)) {
			home = rp.ri
		}
	}
	if home != nil {
		r.Known, r.Epoch, r.Tail, r.Leader, r.Status = true, home.Epoch, home.TailOffset, home.Leader, home.Status
		r.Regions[r.Home] = RegionCopy{Home: true, Known: true, AppliedEnd: home.TailOffset, State: "home"}
		for _, p := range home.Replication {
			if p.Region != r.Home && !isMirrorState(p.State) {
				r.Regions[p.Region] = copyOf(p)
			}
		}
	} else if r.Home != "" {
		r.Regions[r.Home] = RegionCopy{Home: true}
	}
	// Mirror leaders' reports of themselves fill in what the home leader
	// did not list; the most advanced wins when two claim the role.
	for _, rp := range reports {
		if rp.region == r.Home {
			continue
		}
		for _, p := range rp.ri.Replication {
			if !isMirrorState(p.State) || p.Region != rp.region {
				continue
			}
			if old, ok := r.Regions[p.Region]; ok && (!isMirrorState(old.State) || old.AppliedEnd >= p.AppliedEnd) {
				continue
			}
			r.Regions[p.Region] = copyOf(p)
		}
	}
	for region, c := range r.Regions {
		if c.Home || !c.Known {
			continue
		}
		if r.Known && r.Tail > c.AppliedEnd && r.Tail-c.AppliedEnd > c.OffsetLag {
			c.OffsetLag = r.Tail - c.AppliedEnd
			r.Regions[region] = c
		}
	}
	for _, region := range regions {
		if _, ok := r.Regions[region]; !ok {
			r.Regions[region] = RegionCopy{}
		}
	}
	return r
}

// leadsHome tells whether a home-region report comes from the home
// leader: only it reports on the mirrors. (In a stream of one region
// nothing tells a leader's report from a follower's; the most advanced
// one is taken.)
func leadsHome(ri *client.RangeInfo) bool {
	return slices.ContainsFunc(ri.Replication, func(p client.RegionProgress) bool { return !isMirrorState(p.State) })
}

func copyOf(p client.RegionProgress) RegionCopy {
	return RegionCopy{Known: true, AppliedEnd: p.AppliedEnd, OffsetLag: p.OffsetLag, TimeLagMs: p.TimeLag.Milliseconds(),
		State: p.State, LastError: p.LastError}
}
