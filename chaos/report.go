package chaos

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/anishathalye/porcupine"
)

// Status is a result's one-word verdict: SKIP, ERROR, FAIL (a safety
// violation), UNVERIFIED (no violation found, but a check could not
// complete) or PASS.
func (r Result) Status() string {
	switch {
	case r.Skipped != "":
		return "SKIP"
	case r.Err != nil:
		return "ERROR"
	case !r.Safe():
		return "FAIL"
	case !r.Verified():
		return "UNVERIFIED"
	}
	return "PASS"
}

// WriteTable prints one row per result, then the details of every result
// that is not a plain PASS.
func WriteTable(w io.Writer, results []Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintln(tw, "scenario\tresult\tsecs\tacked\tdedup\tambiguous\tlost\torphaned\tdup\torder\tincons\tunexp\tgap\tstale\tsplit\tlinear\tfailover p50/p99\tmax lag\tgroup unproc/regress/stale\trebalance p50/p99\t")
	for _, r := range results {
		if r.Skipped != "" || r.Err != nil {
			fmt.Fprintf(tw, "%s\t%s\t%.0f\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t\n", r.Scenario, r.Status(), r.Elapsed.Seconds())
			continue
		}
		q := r.Queue
		orphaned := "n/a"
		if r.Orphaned >= 0 {
			orphaned = fmt.Sprint(r.Orphaned)
		}
		failover := "-"
		if len(r.Failovers) > 0 || r.Unrecovered > 0 {
			failover = fmt.Sprintf("%s/%s", ms(percentile(r.Failovers, 0.5)), ms(percentile(r.Failovers, 0.99)))
			if r.Unrecovered > 0 {
				failover += fmt.Sprintf(" (%d unrecovered)", r.Unrecovered)
			}
		}
		if len(r.RehomePauses) > 0 {
			// A planned move is no failover: its pause takes the column.
			pauses := durations(r.RehomePauses)
			failover = fmt.Sprintf("pause %s/%s", ms(percentile(pauses, 0.5)), ms(percentile(pauses, 0.99)))
		}
		lag := "-"
		if r.MaxLag >= 0 {
			lag = ms(r.MaxLag)
		}
		group, rebalance := groupCells(r.Group)
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%d\t%d\t%d (%d in)\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t\n",
			r.Scenario, r.Status(), r.Elapsed.Seconds(), q.Acked, q.Deduplicated, q.Ambiguous, q.AmbiguousPresent,
			q.Counts[Lost], orphaned, q.Counts[Duplicated], q.Counts[OutOfOrder], q.Counts[Inconsistent],
			q.Counts[Unexpected], q.Counts[Gap], q.Counts[Stale], q.Counts[SplitRead], linearCell(r.Linear), failover, lag, group, rebalance)
	}
	tw.Flush()
	for _, r := range results {
		notes := r.notes()
		if len(notes) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s (%s):\n", r.Scenario, r.Status())
		for _, n := range notes {
			fmt.Fprintf(w, "  %s\n", n)
		}
	}
}

func (r Result) notes() []string {
	var out []string
	if r.Skipped != "" {
		return []string{r.Skipped}
	}
	if r.Err != nil {
		return []string{"error: " + r.Err.Error()}
	}
	for _, a := range r.Queue.Anomalies {
		out = append(out, a.String())
	}
	out = append(out, r.Linear.Details...)
	if q := r.Queue; q.OrphanRecords > 0 {
		out = append(out, fmt.Sprintf("orphan logs: %d records, %d of them acknowledged (the orphaned column); the linearizability check left out %d orphaned acks and %d reads of divergent tails",
			q.OrphanRecords, q.Orphaned, r.Linear.OrphanedAcks, r.Linear.OrphanReads))
	}
	if n := len(r.RehomePauses); n > 0 {
		out = append(out, fmt.Sprintf("planned rehome: %d range moves, pause p50 %s, p99 %s, max %s", n,
			ms(percentile(durations(r.RehomePauses), 0.5)), ms(percentile(durations(r.RehomePauses), 0.99)), ms(r.RehomePauses[n-1].Std())))
	}
	if len(r.Queue.Unverified) > 0 {
		out = append(out, "home final read incomplete (loss not judged): "+strings.Join(r.Queue.Unverified, ", "))
	}
	if len(r.Queue.Unconverged) > 0 {
		out = append(out, "mirror copies behind the home at the end (liveness): "+strings.Join(r.Queue.Unconverged, ", "))
	}
	out = append(out, r.Group.notes()...)
	if len(r.ConsumersBehind) > 0 {
		out = append(out, "consumers behind at the end (liveness): "+strings.Join(r.ConsumersBehind, ", "))
	}
	for _, e := range r.FaultErrors {
		out = append(out, "fault: "+e)
	}
	if len(out) > 0 && r.HistoryPath != "" {
		out = append(out, "history: "+r.HistoryPath)
	}
	return out
}

func linearCell(l LinearResult) string {
	switch l.Result {
	case porcupine.Ok:
		return fmt.Sprintf("ok (%d ops)", l.Ops)
	case porcupine.Illegal:
		return "ILLEGAL"
	}
	return "unknown"
}

func ms(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	if d >= 10*time.Second {
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return fmt.Sprintf("%dms", d.Milliseconds())
}

func durations(ds []Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Std()
	}
	return out
}

// groupCells are the consumer group's columns: unprocessed records,
// cursor regressions and stale commits; rebalance times.
func groupCells(g GroupResult) (string, string) {
	if !g.Ran {
		return "-", "-"
	}
	rebalance := "-"
	if len(g.Rebalances) > 0 || g.Unrebalanced > 0 {
		rebalance = fmt.Sprintf("%s/%s", ms(percentile(g.Rebalances, 0.5)), ms(percentile(g.Rebalances, 0.99)))
		if g.Unrebalanced > 0 {
			rebalance += fmt.Sprintf(" (%d not)", g.Unrebalanced)
		}
	}
	return fmt.Sprintf("%d/%d/%d", g.Unprocessed, g.Regressions, g.StaleCommits), rebalance
}

func (g GroupResult) notes() []string {
	if !g.Ran {
		return nil
	}
	var out []string
	if g.Unprocessed > 0 {
		out = append(out, fmt.Sprintf("group: %d records of the final log never processed by a member", g.Unprocessed))
	}
	for _, v := range g.Violations {
		out = append(out, "group cursor log: "+v)
	}
	for _, u := range g.Unverified {
		out = append(out, "group unverified: "+u)
	}
	return out
}
