package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/cursors"
)

// GroupResult is what CheckGroup found in a scenario's consumer group.
type GroupResult struct {
	// Ran is false without a group.
	Ran bool
	// Processed counts records of the final log some member processed;
	// Redelivered those processed more than once (at least once allows
	// it); Unprocessed those no member processed (a violation).
	Processed, Redelivered, Unprocessed int
	// Regressions are cursor-stream records that did not raise their
	// register, or a group epoch that went back (invariant 7);
	// StaleCommits are commits accepted from a member outside its
	// incarnation or of a range it did not own (old generation).
	Regressions, StaleCommits int
	// Violations are CheckLog's findings, as text.
	Violations []string
	// Rebalances are, per member fault whose victim owned ranges, the
	// time from the fault to the last of those ranges assigned again;
	// Unrebalanced counts faults after which some range never was.
	Rebalances   []time.Duration
	Unrebalanced int
	// Unverified says what could not be checked.
	Unverified []string
}

// Violated reports a safety violation.
func (g GroupResult) Violated() bool {
	return g.Unprocessed > 0 || g.Regressions > 0 || g.StaleCommits > 0
}

// CheckGroup judges the consumer group of h: every record of the final
// log processed at least once; the group's cursor log free of regressions
// and of commits from old generations; rebalance times of member faults.
func CheckGroup(h *History) GroupResult {
	g := h.Group
	if g == nil {
		return GroupResult{}
	}
	res := GroupResult{Ran: true}
	times := map[string]int{}
	for _, p := range g.Processed {
		times[p.Value]++
	}
	for _, o := range h.Reads {
		if !o.Final || o.Region != h.FinalHome(o.Range) {
			continue
		}
		switch n := times[o.Value]; {
		case n == 0:
			res.Unprocessed++
		case n > 1:
			res.Redelivered++
			res.Processed++
		default:
			res.Processed++
		}
	}
	if !g.CaughtUp {
		res.Unverified = append(res.Unverified, "the members had not processed every acked record when the harness stopped waiting")
	}
	if !g.CursorLogRead {
		res.Unverified = append(res.Unverified, "the group's range of the cursor stream was not checked: "+g.CursorLogErr)
	}
	for _, v := range g.CursorLog {
		if strings.Contains(v, "does not raise") || strings.Contains(v, "went back") {
			res.Regressions++
		} else {
			res.StaleCommits++
		}
	}
	res.Violations = g.CursorLog
	res.Rebalances, res.Unrebalanced = rebalances(h)
	return res
}

// rebalances measures, for each member fault whose victim owned ranges,
// the time from the fault until every one of them was assigned again.
func rebalances(h *History) (out []time.Duration, unrebalanced int) {
	for _, ev := range h.Faults {
		if ev.Err != "" || len(ev.MemberRanges) == 0 {
			continue
		}
		last, all := ev.Start, true
		for _, r := range ev.MemberRanges {
			at := int64(-1)
			for _, a := range h.Group.Assigned {
				if a.At >= ev.Start && slices.Contains(a.Ranges, r) && (at < 0 || a.At < at) {
					at = a.At
				}
			}
			if at < 0 {
				all = false
				break
			}
			last = max(last, at)
		}
		if !all {
			unrebalanced++
			continue
		}
		out = append(out, time.Duration(last-ev.Start))
	}
	slices.Sort(out)
	return out, unrebalanced
}

// errCursorLogCompacted: the cursor range's log has holes (compaction by
// key dropped records), and cursors.CheckLog needs it whole.
var errCursorLogCompacted = errors.New("the cursor log was compacted (run the nodes with --cursor-compaction-lag past the scenario)")

// checkCursorRange reads range rng of the cursor stream (consistency
// home) and returns what cursors.CheckLog finds, and how many records
// it read.
func checkCursorRange(ctx context.Context, c *client.Client, rng uint32) ([]string, int, error) {
	var recs []cursors.Record
	for from := uint64(0); ; {
		res, err := c.Read(ctx, cursorStream, rng, from, client.ReadOptions{MaxRecords: 5000, Consistency: client.ConsistencyHome})
		if err != nil {
			return nil, 0, err
		}
		for _, r := range res.Records {
			if r.Offset != uint64(len(recs)) {
				return nil, 0, errCursorLogCompacted
			}
			recs = append(recs, cursors.Record{Key: r.Key, Value: r.Value, Tombstone: r.Tombstone})
		}
		if res.NextOffset >= res.TailOffset || res.NextOffset <= from && len(res.Records) == 0 {
			break
		}
		from = res.NextOffset
	}
	var out []string
	for _, v := range cursors.CheckLog(recs) {
		out = append(out, fmt.Sprint(v))
	}
	return out, len(recs), nil
}
