package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/geolog/geolog/client"
)

// rangesNodesMax bounds the nodes `geolog ranges` asks (the client's own
// address bound).
const rangesNodesMax = client.AddrsMax

// mirrorState is the State a mirror leader gives its own region's progress
// ("mirror", or "mirror: why" such as "mirror: no heartbeat yet"; see
// regionsvc's rangeReplication); a home leader reports its replicator
// tasks' phases instead ("connecting", "streaming", "ended", ...).
const mirrorState = "mirror"

func isMirrorState(state string) bool {
	return state == mirrorState || strings.HasPrefix(state, mirrorState+":")
}

// nodeReport is one node's answer to DescribeStream.
type nodeReport struct {
	addr string
	desc *client.StreamDescription
	err  error
}

// regionView is what is known of one region's copy of a range.
type regionView struct {
	// home marks the range's home region: its applied end is the tail.
	home bool
	// known is false when no answering node reported on this region.
	known        bool
	appliedEnd   uint64
	offsetLag    uint64
	timeLag      time.Duration
	heartbeatAge time.Duration
	state        string
	lastError    string
	// source is the address of the node whose report this is.
	source string
}

// rangeView is one range as merged from every node's report.
type rangeView struct {
	rng  uint32
	home string
	// epoch, tail and leader are the home leader's; known says whether a
	// home leader answered.
	known   bool
	epoch   uint64
	tail    uint64
	leader  string
	regions map[string]regionView
	// groups is each consumer group's position and lag in the range, as
	// the answering node's copy of the stream shows it (groups.go).
	groups map[string]client.RangeLag
}

// mergeRanges merges the reports of every node (failed ones are skipped)
// into one view per range of a stream with rangeCount ranges placed in
// regions.
//
// A node reports replication for a range only when it leads it: the home
// region's leader lists every mirror (its replicator tasks: applied end as
// acked, lag behind the tail it committed), and a mirror region's leader
// lists its own region (State "mirror...": its applied end, lag behind the
// tail the home's heartbeats announced). The home leader gives the tail,
// epoch and leader, and its figures win for every mirror it lists: it
// knows the tail, while a mirror that has not heard of new records yet
// reports no offset lag. A mirror leader's own report fills in a region
// the home leader's report does not cover (the home leader did not answer,
// or is not among the addresses). Where the home leader answered, a
// mirror's offset lag is at least the tail shown minus its applied end (a
// replicator's own figure trails by what arrived since it last shipped).
// When several nodes claim the same role
// (a leadership change between the calls), the most advanced report wins.
// A node of a single-region stream that names itself leader is the home
// leader (there are no mirrors to report on). Ranges and regions nobody
// reported on stay unknown.
func mergeRanges(regions []string, rangeCount uint32, reports []nodeReport) []rangeView {
	type pick struct {
		ri   client.RangeInfo
		addr string
	}
	homes := make([]*pick, rangeCount)
	selves := make([]map[string]*pick, rangeCount)
	views := make([]rangeView, rangeCount)
	for _, rep := range reports {
		if rep.err != nil || rep.desc == nil {
			continue
		}
		for _, ri := range rep.desc.Ranges {
			if ri.Range >= rangeCount {
				continue
			}
			v := &views[ri.Range]
			if v.home == "" {
				v.home = ri.HomeRegion
			}
			if self := selfProgress(ri); self != nil {
				if self.Region == ri.HomeRegion {
					continue
				}
				m := selves[ri.Range]
				if m == nil {
					m = map[string]*pick{}
					selves[ri.Range] = m
				}
				if old := m[self.Region]; old == nil || selfProgress(old.ri).AppliedEnd < self.AppliedEnd {
					m[self.Region] = &pick{ri, rep.addr}
				}
				continue
			}
			if isHomeLeaderReport(ri, rep.addr, len(regions)) {
				old := homes[ri.Range]
				if old == nil || old.ri.Epoch < ri.Epoch || (old.ri.Epoch == ri.Epoch && old.ri.TailOffset < ri.TailOffset) {
					homes[ri.Range] = &pick{ri, rep.addr}
				}
			}
		}
	}
	for i := range views {
		v := &views[i]
		v.rng = uint32(i)
		v.regions = make(map[string]regionView, len(regions))
		if h := homes[i]; h != nil {
			v.known, v.epoch, v.tail, v.leader = true, h.ri.Epoch, h.ri.TailOffset, h.ri.Leader
			for _, p := range h.ri.Replication {
				if p.Region != v.home {
					v.regions[p.Region] = progressView(p, h.addr)
				}
			}
		}
		for region, s := range selves[i] {
			if _, ok := v.regions[region]; !ok {
				v.regions[region] = progressView(*selfProgress(s.ri), s.addr)
			}
		}
		if v.known {
			// A replicator's offset lag is behind the tail as it last
			// shipped; the tail shown is the home leader's now. Keep the
			// two consistent on screen: lag is at least tail - applied.
			for region, rv := range v.regions {
				if v.tail > rv.appliedEnd && v.tail-rv.appliedEnd > rv.offsetLag {
					rv.offsetLag = v.tail - rv.appliedEnd
					v.regions[region] = rv
				}
			}
		}
		if v.home != "" {
			v.regions[v.home] = regionView{home: true, known: v.known, appliedEnd: v.tail, source: v.leader}
		}
	}
	return views
}

// selfProgress returns a mirror leader's report of its own region, or nil.
func selfProgress(ri client.RangeInfo) *client.RegionProgress {
	for i := range ri.Replication {
		if isMirrorState(ri.Replication[i].State) {
			return &ri.Replication[i]
		}
	}
	return nil
}

// isHomeLeaderReport tells whether ri, answered by the node at addr, comes
// from the range's leader in its home region.
func isHomeLeaderReport(ri client.RangeInfo, addr string, regionCount int) bool {
	if len(ri.Replication) > 0 {
		return true // only home leaders report on other regions
	}
	return regionCount <= 1 && ri.Leader != "" && ri.Leader == addr
}

func progressView(p client.RegionProgress, source string) regionView {
	return regionView{known: true, appliedEnd: p.AppliedEnd, offsetLag: p.OffsetLag, timeLag: p.TimeLag,
		heartbeatAge: p.HeartbeatAge, state: p.State, lastError: p.LastError, source: source}
}

// describeEach calls DescribeStream on every address at once, each through
// its own single-address client (no retries at another node: the point is
// each node's own view).
func (e *env) describeEach(ctx context.Context, addrs []string, stream string) []nodeReport {
	reports := make([]nodeReport, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		reports[i].addr = addr
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := e.clientFor(addr, client.RetriesMax(0))
			if err != nil {
				reports[i].err = err
				return
			}
			defer c.Close()
			reports[i].desc, reports[i].err = c.DescribeStream(ctx, stream)
		}()
	}
	wg.Wait()
	return reports
}

// splitAddrs splits a comma-separated address list, dropping blanks and
// duplicates.
func splitAddrs(list string) []string {
	var out []string
	for _, a := range strings.Split(list, ",") {
		if a = strings.TrimSpace(a); a != "" && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// rangesRegionJSON is the --json form of a regionView.
type rangesRegionJSON struct {
	Home             bool    `json:"home,omitempty"`
	AppliedEndOffset *uint64 `json:"applied_end_offset"`
	OffsetLag        *uint64 `json:"offset_lag"`
	TimeLagMs        *int64  `json:"time_lag_ms"`
	HeartbeatAgeMs   *int64  `json:"heartbeat_age_ms,omitempty"`
	State            string  `json:"state,omitempty"`
	LastError        string  `json:"last_error,omitempty"`
	Source           string  `json:"source,omitempty"`
}

// rangesJSON is the --json form of a rangeView; unknown figures are null.
type rangesJSON struct {
	Range      uint32                      `json:"range"`
	HomeRegion string                      `json:"home_region"`
	Epoch      *uint64                     `json:"epoch"`
	TailOffset *uint64                     `json:"tail_offset"`
	Leader     string                      `json:"leader,omitempty"`
	Regions    map[string]rangesRegionJSON `json:"regions"`
	// Groups: each consumer group's position and lag in the range.
	Groups map[string]rangeGroupJSON `json:"groups,omitempty"`
}

func (e *env) ranges(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "split" && len(args) > 1 {
		return e.rangesSplit(ctx, args[1:]) // ranges_split.go
	}
	fs := e.flagSet("ranges")
	out := outputFlags(fs, "print one JSON array")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := out.check(); err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("usage: ranges <stream> [--json]")
	}
	addrs := splitAddrs(e.addr)
	switch {
	case len(addrs) == 0:
		return usagef("--addr names no node")
	case len(addrs) > rangesNodesMax:
		return usagef("--addr names %d nodes, at most %d", len(addrs), rangesNodesMax)
	}
	reports := e.describeEach(ctx, addrs, pos[0])
	var first *client.StreamDescription
	var errs []error
	for _, r := range reports {
		switch {
		case r.err != nil:
			errs = append(errs, r.err)
			fmt.Fprintf(e.stderr, "geolog ranges: %s: %v (skipped)\n", r.addr, r.err)
		case first == nil:
			first = r.desc
		}
	}
	if first == nil {
		return errors.Join(errs...)
	}
	regions := first.Stream.Regions
	// A stream that split lists its children after the ranges it was
	// created with (docs/split.md).
	views := mergeRanges(regions, max(first.Stream.RangeCount, uint32(len(first.Ranges))), reports)
	for _, v := range views {
		for reg := range v.regions {
			if !slices.Contains(regions, reg) {
				regions = append(regions, reg) // a region the catalogue did not list: still show it
			}
		}
	}
	groups := e.rangeGroups(ctx, pos[0], views) // groups.go
	if out.structured() {
		return out.write(e.stdout, rangesToJSON(regions, views))
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprint(tw, "RANGE\tHOME\tEPOCH\tTAIL\tLEADER")
	for _, reg := range regions {
		fmt.Fprintf(tw, "\t%s", reg)
	}
	fmt.Fprintln(tw)
	for _, v := range views {
		epoch, tail, leader := "?", "?", "?"
		if v.known {
			epoch, tail, leader = fmt.Sprint(v.epoch), fmt.Sprint(v.tail), orDash(v.leader)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s", v.rng, orUnknown(v.home), epoch, tail, leader)
		for _, reg := range regions {
			fmt.Fprintf(tw, "\t%s", regionCell(v.regions[reg]))
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return printRangeGroups(e.stdout, groups, views)
}

// regionCell renders a region's copy of a range: "812 home", "790 lag
// 22/140ms" (applied end, offset lag, time lag), then the replicator's
// state when it is not the steady one, or "?" when no node reported on it.
func regionCell(rv regionView) string {
	switch {
	case !rv.known:
		return "?"
	case rv.home:
		return fmt.Sprintf("%d home", rv.appliedEnd)
	}
	s := fmt.Sprintf("%d lag %d/%s", rv.appliedEnd, rv.offsetLag, rv.timeLag.Round(time.Millisecond))
	if rv.state != "" && rv.state != "streaming" && rv.state != mirrorState {
		s += " " + rv.state
	}
	return s
}

func orUnknown(s string) string {
	if s == "" {
		return "?"
	}
	return s
}

func rangesToJSON(regions []string, views []rangeView) []rangesJSON {
	out := make([]rangesJSON, 0, len(views))
	for _, v := range views {
		j := rangesJSON{Range: v.rng, HomeRegion: v.home, Regions: make(map[string]rangesRegionJSON, len(regions))}
		if v.known {
			epoch, tail := v.epoch, v.tail
			j.Epoch, j.TailOffset, j.Leader = &epoch, &tail, v.leader
		}
		for _, reg := range regions {
			rv := v.regions[reg]
			rj := rangesRegionJSON{Home: rv.home, State: rv.state, LastError: rv.lastError, Source: rv.source}
			if rv.known {
				applied, lag, timeLag := rv.appliedEnd, rv.offsetLag, rv.timeLag.Milliseconds()
				rj.AppliedEndOffset, rj.OffsetLag, rj.TimeLagMs = &applied, &lag, &timeLag
				if !rv.home {
					hb := rv.heartbeatAge.Milliseconds()
					rj.HeartbeatAgeMs = &hb
				}
			}
			j.Regions[reg] = rj
		}
		j.Groups = groupsJSON(v.groups)
		out = append(out, j)
	}
	return out
}
