package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/geolog/geolog/client"
)

const groupsUsage = `usage:
  groups list [--stream S] [--json]
  groups describe <group> [--json]
  groups delete <group>
  groups reset <group> [--stream S] [--range N]... --to-earliest | --to-latest | --to-time RFC3339 | --to-offset N`

// groups runs the groups subcommands.
func (e *env) groups(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usagef("%s", groupsUsage)
	}
	switch args[0] {
	case "list":
		return e.groupsList(ctx, args[1:])
	case "describe":
		return e.groupsDescribe(ctx, args[1:])
	case "delete":
		return e.groupsDelete(ctx, args[1:])
	case "reset":
		return e.groupsReset(ctx, args[1:])
	default:
		return usagef("unknown groups command %q\n%s", args[0], groupsUsage)
	}
}

func (e *env) groupsList(ctx context.Context, args []string) error {
	fs := e.flagSet("groups list")
	stream := fs.String("stream", "", "only groups consuming this stream")
	out := outputFlags(fs, "print JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := out.check(); err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("usage: groups list [--stream S] [--json]")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	defer c.Close()
	groups, err := c.ListGroups(ctx, *stream)
	if err != nil {
		return err
	}
	if out.structured() {
		return out.write(e.stdout, groups)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tSTREAM\tSTATE\tMEMBERS\tEPOCH")
	for _, g := range groups {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", g.Group, orDash(g.Stream), g.State, g.Members, epochString(g.Epoch))
	}
	return tw.Flush()
}

// epochString prints a group epoch as H.N (the cursor range's homing
// epoch, the count within it), as the server's messages do.
func epochString(e uint64) string {
	const shift = 40
	return fmt.Sprintf("%d.%d", e>>shift, e&(1<<shift-1))
}

func (e *env) groupsDescribe(ctx context.Context, args []string) error {
	fs := e.flagSet("groups describe")
	out := outputFlags(fs, "print JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := out.check(); err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("usage: groups describe <group> [--json]")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	defer c.Close()
	d, err := c.DescribeGroup(ctx, pos[0])
	if err != nil {
		return err
	}
	if out.structured() {
		return out.write(e.stdout, d)
	}
	return printGroup(e.stdout, d)
}

func printGroup(w io.Writer, d *client.GroupDescription) error {
	fmt.Fprintf(w, "group %s  stream %s  state %s  epoch %s  coordinator %s %s\n", d.Group, orDash(d.Stream), orDash(d.State),
		epochString(d.Epoch), orDash(d.CoordinatorRegion), d.Coordinator)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(d.Members) > 0 {
		fmt.Fprintln(tw, "MEMBER\tINSTANCE\tEPOCH\tRANGES\tREVOKING\tHEARTBEAT")
		for _, m := range d.Members {
			hb := "-"
			if m.LastHeartbeatAge >= 0 {
				hb = m.LastHeartbeatAge.Round(time.Millisecond).String() + " ago"
			}
			if m.Away {
				hb += " (away)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", m.MemberID, orDash(m.InstanceID), epochString(m.Epoch), rangeList(m.Ranges), rangeList(m.Revoking), hb)
		}
		fmt.Fprintln(tw)
	}
	if len(d.Ranges) > 0 {
		fmt.Fprintln(tw, "RANGE\tCOMMITTED\tTAIL\tLAG\tLAG TIME\tOWNER")
		var total uint64
		for _, r := range d.Ranges {
			committed := "-"
			if r.HasPosition {
				committed = fmt.Sprint(r.Committed)
			}
			total += r.LagRecords
			fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%s\t%s\n", r.Range, committed, r.Tail, r.LagRecords, r.Lag.Round(time.Millisecond), orDash(r.Owner))
		}
		fmt.Fprintf(tw, "total\t\t\t%d\t\t\n", total)
	}
	for _, p := range d.OtherPositions {
		fmt.Fprintf(tw, "position %s/%d\t%d\tgeneration %d\n", p.Stream, p.Range, p.Offset, p.Generation)
	}
	return tw.Flush()
}

func rangeList(rs []uint32) string {
	if len(rs) == 0 {
		return "-"
	}
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprint(r)
	}
	return strings.Join(parts, ",")
}

func (e *env) groupsDelete(ctx context.Context, args []string) error {
	fs := e.flagSet("groups delete")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("usage: groups delete <group>")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	defer c.Close()
	n, err := c.DeleteGroup(ctx, pos[0])
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "deleted %s (%d positions)\n", pos[0], n)
	return nil
}

func (e *env) groupsReset(ctx context.Context, args []string) error {
	fs := e.flagSet("groups reset")
	stream := fs.String("stream", "", "the stream to reset (default: the group's)")
	var ranges uintList
	fs.Var(&ranges, "range", "a range to reset (repeatable; default: every range)")
	earliest := fs.Bool("to-earliest", false, "to each range's first retained offset")
	latest := fs.Bool("to-latest", false, "to each range's tail")
	toTime := fs.String("to-time", "", "to the first offset appended at or after this RFC 3339 time")
	toOffset := fs.Int64("to-offset", -1, "to this offset in every range")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("%s", groupsUsage)
	}
	to, err := resetTarget(*earliest, *latest, *toTime, *toOffset)
	if err != nil {
		return err
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	defer c.Close()
	if *stream == "" {
		d, err := c.DescribeGroup(ctx, pos[0])
		if err != nil {
			return err
		}
		if d.Stream == "" {
			return usagef("group %s has no stream of its own: give --stream", pos[0])
		}
		*stream = d.Stream
	}
	ps, err := c.ResetGroup(ctx, pos[0], *stream, to, ranges...)
	if err != nil {
		if client.CodeOf(err) == client.CodeGroupNotEmpty {
			return fmt.Errorf("%w (stop its members first: a reset is refused while the group has live members)", err)
		}
		return err
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RANGE\tOFFSET\tGENERATION")
	for _, p := range ps {
		fmt.Fprintf(tw, "%d\t%d\t%d\n", p.Range, p.Offset, p.Generation)
	}
	return tw.Flush()
}

// resetTarget checks that exactly one target was given.
func resetTarget(earliest, latest bool, toTime string, toOffset int64) (client.ResetTo, error) {
	var targets []client.ResetTo
	if earliest {
		targets = append(targets, client.ResetToEarliest())
	}
	if latest {
		targets = append(targets, client.ResetToLatest())
	}
	if toTime != "" {
		t, err := time.Parse(time.RFC3339Nano, toTime)
		if err != nil {
			return client.ResetTo{}, usagef("--to-time: %v", err)
		}
		targets = append(targets, client.ResetToTime(t))
	}
	if toOffset >= 0 {
		targets = append(targets, client.ResetToOffset(uint64(toOffset)))
	}
	if len(targets) != 1 {
		return client.ResetTo{}, usagef("give exactly one of --to-earliest, --to-latest, --to-time, --to-offset")
	}
	return targets[0], nil
}

// uintList is a repeatable range flag.
type uintList []uint32

func (l *uintList) String() string { return fmt.Sprint(*l) }
func (l *uintList) Set(v string) error {
	var n uint32
	if _, err := fmt.Sscan(v, &n); err != nil {
		return errors.New("not a range number")
	}
	*l = append(*l, n)
	return nil
}

// groupFlags adds consume's group flags to fs.
func groupFlags(fs *flag.FlagSet) *groupOpts {
	g := &groupOpts{}
	fs.StringVar(&g.group, "group", "", "consume as a member of this consumer group (from its committed positions; commits what it printed)")
	fs.StringVar(&g.member, "member", "", "with --group: the member id (default: random)")
	fs.StringVar(&g.instance, "instance", "", "with --group: a static instance id")
	fs.DurationVar(&g.session, "session", 10*time.Second, "with --group: the session timeout")
	fs.StringVar(&g.start, "start", "earliest", "with --group: where ranges without a committed position start: earliest or latest")
	return g
}

// consumeGroup consumes stream as a member of a group until ctx ends or
// --max records were printed, then closes the member (commit and leave).
func (e *env) consumeGroup(ctx context.Context, stream string, g *groupOpts, pr *recordPrinter) error {
	if g.start != "earliest" && g.start != "latest" {
		return usagef("--start is earliest or latest")
	}
	if pr.max < 0 {
		return usagef("--max must not be negative")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	defer c.Close()
	opts := []client.GroupOpt{client.SessionTimeout(g.session),
		client.OnAssigned(func(r []uint32) { fmt.Fprintf(e.stderr, "assigned ranges %s\n", rangeList(r)) }),
		client.OnRevoked(func(r []uint32) { fmt.Fprintf(e.stderr, "released ranges %s\n", rangeList(r)) }),
		client.OnLost(func(r []uint32) { fmt.Fprintf(e.stderr, "lost ranges %s (fenced; joining again)\n", rangeList(r)) })}
	if g.member != "" {
		opts = append(opts, client.GroupMemberID(g.member))
	}
	if g.instance != "" {
		opts = append(opts, client.GroupInstanceID(g.instance))
	}
	if g.start == "latest" {
		opts = append(opts, client.StartFrom(client.StartLatest))
	}
	gc, err := c.NewGroupConsumer(stream, g.group, opts...)
	if err != nil {
		return err
	}
	defer gc.Close()
	for rec, err := range gc.Records(ctx) {
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if !pr.print(rec) {
			gc.Mark(rec) // the loop ends here: the last record counts too
			return nil
		}
	}
	return nil
}

// groupOpts are consume's group settings.
type groupOpts struct {
	group, member, instance, start string
	session                        time.Duration
}

// rangeGroups fills in each range's consumer groups (those consuming
// stream) and returns their names; a failure to ask is reported and
// leaves the groups out.
func (e *env) rangeGroups(ctx context.Context, stream string, views []rangeView) []string {
	c, err := e.client()
	if err != nil {
		return nil
	}
	defer c.Close()
	groups, err := c.ListGroups(ctx, stream)
	if err != nil {
		if client.CodeOf(err) != client.CodeUnavailable {
			fmt.Fprintf(e.stderr, "geolog ranges: consumer groups: %v (left out)\n", err)
		}
		return nil
	}
	var names []string
	for _, g := range groups {
		d, err := c.DescribeGroup(ctx, g.Group)
		if err != nil {
			fmt.Fprintf(e.stderr, "geolog ranges: group %s: %v (left out)\n", g.Group, err)
			continue
		}
		names = append(names, g.Group)
		for _, rl := range d.Ranges {
			for i := range views {
				if views[i].rng == rl.Range {
					if views[i].groups == nil {
						views[i].groups = map[string]client.RangeLag{}
					}
					views[i].groups[g.Group] = rl
				}
			}
		}
	}
	return names
}

// printRangeGroups prints each group's position and lag per range:
// "812 lag 3/120ms" (committed offset, records and time behind).
func printRangeGroups(w io.Writer, groups []string, views []rangeView) error {
	if len(groups) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprint(tw, "RANGE")
	for _, g := range groups {
		fmt.Fprintf(tw, "\tgroup %s", g)
	}
	fmt.Fprintln(tw)
	for _, v := range views {
		fmt.Fprintf(tw, "%d", v.rng)
		for _, g := range groups {
			rl, ok := v.groups[g]
			switch {
			case !ok:
				fmt.Fprint(tw, "\t?")
			case !rl.HasPosition:
				fmt.Fprintf(tw, "\t- lag %d/%s", rl.LagRecords, rl.Lag.Round(time.Millisecond))
			default:
				fmt.Fprintf(tw, "\t%d lag %d/%s", rl.Committed, rl.LagRecords, rl.Lag.Round(time.Millisecond))
			}
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// rangeGroupJSON is a group's position and lag in a range (--json).
type rangeGroupJSON struct {
	Committed  *uint64 `json:"committed"`
	LagRecords uint64  `json:"lag_records"`
	LagMs      int64   `json:"lag_ms"`
	Owner      string  `json:"owner,omitempty"`
}

func groupsJSON(groups map[string]client.RangeLag) map[string]rangeGroupJSON {
	if len(groups) == 0 {
		return nil
	}
	out := make(map[string]rangeGroupJSON, len(groups))
	for name, rl := range groups {
		j := rangeGroupJSON{LagRecords: rl.LagRecords, LagMs: rl.Lag.Milliseconds(), Owner: rl.Owner}
		if rl.HasPosition {
			c := rl.Committed
			j.Committed = &c
		}
		out[name] = j
	}
	return out
}
