package cli

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/geolog/geolog/client"
)

func (e *env) streams(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usagef("streams needs a subcommand: create, list, describe, alter or delete")
	}
	switch sub, args := args[0], args[1:]; sub {
	case "create":
		return e.streamsCreate(ctx, args)
	case "list":
		return e.streamsList(ctx, args)
	case "describe":
		return e.streamsDescribe(ctx, args)
	case "delete":
		return e.streamsDelete(ctx, args)
	case "alter":
		return e.streamsAlter(ctx, args)
	default:
		return usagef("unknown streams subcommand %q (want create, list, describe, alter or delete)", sub)
	}
}

// streamsDelete deletes a stream in every region of it.
func (e *env) streamsDelete(ctx context.Context, args []string) error {
	fs := e.flagSet("streams delete")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("usage: streams delete <name>")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.DeleteStream(ctx, pos[0]); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "deleted stream %s\n", pos[0])
	return nil
}

func (e *env) streamsCreate(ctx context.Context, args []string) error {
	fs := e.flagSet("streams create")
	ranges := fs.Uint("ranges", 1, "number of hash ranges")
	regions := fs.String("regions", "", "comma-separated regions (default: the server's)")
	home := fs.String("home", "", "home region of the ranges: one of --regions, or spread (range i in region i mod count); default: the region of the node that takes the request if listed, else the first")
	age := fs.Duration("retention-age", 0, "delete records older than this (0 keeps them)")
	size := fs.Int64("retention-bytes", 0, "bound each range's size (0: no bound)")
	holdBytes, holdAge := mirrorHoldFlags(fs)
	replication := fs.Uint("replication-factor", 0, "replicas of each range in each region: 1, 3 or 5 (0: the region's default, 3)")
	cleanup := fs.String("cleanup", "delete", "delete (retention only), compact (keep the newest record of each key; records need keys) or compact,delete")
	delRet := fs.Duration("delete-retention", 0, "with --cleanup compact: how long a tombstone stays readable (0: the server's default, 24h)")
	minLag := fs.Duration("min-compaction-lag", 0, "with --cleanup compact: never compact records younger than this (0: the server's default, 1m)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("usage: streams create <name> [--ranges N] [--regions a,b] [--home REGION|spread] [--retention-age D] [--retention-bytes N] [--mirror-hold-bytes N] [--mirror-hold-age D] [--replication-factor 1|3|5] [--cleanup delete|compact|compact,delete] [--delete-retention D] [--min-compaction-lag D]")
	}
	policy, err := parseCleanup(*cleanup)
	if err != nil {
		return err
	}
	if policy == client.CleanupDelete && (*delRet != 0 || *minLag != 0) {
		return usagef("--delete-retention and --min-compaction-lag need --cleanup compact")
	}
	if *delRet < 0 || *minLag < 0 {
		return usagef("--delete-retention and --min-compaction-lag must not be negative")
	}
	if *ranges == 0 || *ranges > 1<<16 {
		return usagef("--ranges must be in [1, 65536]")
	}
	if *age < 0 || *size < 0 {
		return usagef("retention must not be negative")
	}
	var regs []string
	for _, r := range strings.Split(*regions, ",") {
		if r = strings.TrimSpace(r); r != "" {
			regs = append(regs, r)
		}
	}
	*home = strings.TrimSpace(*home)
	if *home != "" && *home != "spread" && len(regs) > 0 && !slices.Contains(regs, *home) {
		return usagef("--home %s is not one of --regions %s (or spread)", *home, strings.Join(regs, ","))
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	defer c.Close()
	info, err := c.CreateStream(ctx, client.StreamConfig{
		Name: pos[0], RangeCount: uint32(*ranges), Regions: regs, HomeRegion: *home, ReplicationFactor: uint32(*replication),
		RetentionAge: *age, RetentionBytes: *size, MirrorHoldBytes: *holdBytes, MirrorHoldAge: *holdAge,
		Cleanup: policy, DeleteRetention: *delRet, MinCompactionLag: *minLag,
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "created stream %s with %d ranges in %s, cleanup %s\n", info.Name, info.RangeCount, regionsText(info.Regions), cleanupText(*info))
	if len(info.RangeHomes) > 0 {
		fmt.Fprintf(e.stdout, "range homes: %s\n", rangeHomesText(info.RangeHomes))
	}
	return nil
}

// parseCleanup parses --cleanup: delete, compact, or both comma-separated.
func parseCleanup(s string) (client.Cleanup, error) {
	var del, comp bool
	for _, p := range strings.Split(s, ",") {
		switch strings.TrimSpace(p) {
		case "delete":
			del = true
		case "compact":
			comp = true
		default:
			return 0, usagef("--cleanup %q: want delete, compact or compact,delete", s)
		}
	}
	switch {
	case comp && del:
		return client.CleanupCompactDelete, nil
	case comp:
		return client.CleanupCompact, nil
	}
	return client.CleanupDelete, nil
}

// cleanupText renders a stream's cleanup policy as --cleanup takes it.
func cleanupText(s client.StreamInfo) string {
	switch s.Cleanup {
	case client.CleanupCompact:
		return "compact"
	case client.CleanupCompactDelete:
		return "compact,delete"
	}
	return "delete"
}

// rangeHomesText renders homes as "0=us 1=eu 2=ap".
func rangeHomesText(homes []string) string {
	parts := make([]string, len(homes))
	for i, h := range homes {
		parts[i] = fmt.Sprintf("%d=%s", i, h)
	}
	return strings.Join(parts, " ")
}

func regionsText(rs []string) string {
	if len(rs) == 0 {
		return "-"
	}
	return strings.Join(rs, ",")
}

func durationText(d time.Duration) string {
	if d == 0 {
		return "forever"
	}
	return d.String()
}

func bytesLimitText(n int64) string {
	if n == 0 {
		return "unbounded"
	}
	return fmt.Sprint(n)
}

// streamJSON is the --json form of a stream.
type streamJSON struct {
	Name           string   `json:"name"`
	RangeCount     uint32   `json:"range_count"`
	Regions        []string `json:"regions"`
	RetentionAge   string   `json:"retention_age"`
	RetentionBytes int64    `json:"retention_bytes"`
	Created        string   `json:"created,omitempty"`
	Cleanup        string   `json:"cleanup"`
	// DeleteRetention and MinCompactionLag: "" for the server's defaults.
	DeleteRetention  string `json:"delete_retention,omitempty"`
	MinCompactionLag string `json:"min_compaction_lag,omitempty"`
	// MirrorHoldBytes and MirrorHoldAge: left out for the defaults (twice
	// the retention), -1 and a negative age for no bound.
	MirrorHoldBytes int64  `json:"mirror_hold_bytes,omitempty"`
	MirrorHoldAge   string `json:"mirror_hold_age,omitempty"`
}

func toStreamJSON(s client.StreamInfo) streamJSON {
	j := streamJSON{Name: s.Name, RangeCount: s.RangeCount, Regions: s.Regions,
		RetentionAge: s.RetentionAge.String(), RetentionBytes: s.RetentionBytes, Cleanup: cleanupText(s)}
	if s.DeleteRetention != 0 {
		j.DeleteRetention = s.DeleteRetention.String()
	}
	if s.MinCompactionLag != 0 {
		j.MinCompactionLag = s.MinCompactionLag.String()
	}
	j.MirrorHoldBytes = s.MirrorHoldBytes
	if s.MirrorHoldAge != 0 {
		j.MirrorHoldAge = s.MirrorHoldAge.String()
	}
	if !s.Created.IsZero() {
		j.Created = s.Created.UTC().Format(time.RFC3339)
	}
	return j
}

func (e *env) streamsList(ctx context.Context, args []string) error {
	fs := e.flagSet("streams list")
	out := outputFlags(fs, "print JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := out.check(); err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("usage: streams list [--json]")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	defer c.Close()
	list, err := c.ListStreams(ctx)
	if err != nil {
		return err
	}
	if out.structured() {
		items := make([]streamJSON, 0, len(list))
		for _, s := range list {
			items = append(items, toStreamJSON(s))
		}
		return out.write(e.stdout, items)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tRANGES\tREGIONS\tRETENTION-AGE\tRETENTION-BYTES\tCLEANUP\tCREATED")
	for _, s := range list {
		created := "-"
		if !s.Created.IsZero() {
			created = s.Created.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.RangeCount, regionsText(s.Regions),
			durationText(s.RetentionAge), bytesLimitText(s.RetentionBytes), cleanupText(s), created)
	}
	return tw.Flush()
}

// rangeJSON is the --json form of a range.
type rangeJSON struct {
	Range       uint32 `json:"range"`
	HashStart   string `json:"hash_start"`
	HashEnd     string `json:"hash_end"`
	StartOffset uint64 `json:"start_offset"`
	TailOffset  uint64 `json:"tail_offset"`
	SizeBytes   int64  `json:"size_bytes"`
	HomeRegion  string `json:"home_region"`
	Epoch       uint64 `json:"epoch"`
	Leader      string `json:"leader,omitempty"`
	HomeLeader  string `json:"home_leader,omitempty"`
	Status      string `json:"status"`
	// Epochs is the range's epoch history, oldest first.
	Epochs []client.EpochStart `json:"epochs"`
}

func (e *env) streamsDescribe(ctx context.Context, args []string) error {
	fs := e.flagSet("streams describe")
	output := outputFlags(fs, "print JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := output.check(); err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("usage: streams describe <name> [--json]")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	defer c.Close()
	d, err := c.DescribeStream(ctx, pos[0])
	if err != nil {
		return err
	}
	if output.structured() {
		out := struct {
			Stream streamJSON  `json:"stream"`
			Ranges []rangeJSON `json:"ranges"`
		}{Stream: toStreamJSON(d.Stream), Ranges: []rangeJSON{}}
		for _, r := range d.Ranges {
			out.Ranges = append(out.Ranges, rangeJSON{
				Range: r.Range, HashStart: fmt.Sprintf("%016x", r.HashStart), HashEnd: fmt.Sprintf("%016x", r.HashEnd),
				StartOffset: r.StartOffset, TailOffset: r.TailOffset, SizeBytes: r.SizeBytes,
				HomeRegion: r.HomeRegion, Epoch: r.Epoch, Leader: r.Leader, HomeLeader: r.HomeLeader, Status: r.Status, Epochs: r.Epochs,
			})
		}
		return output.write(e.stdout, out)
	}
	s := d.Stream
	fmt.Fprintf(e.stdout, "stream %s: %d ranges, regions %s, retention %s / %s bytes, cleanup %s\n\n",
		s.Name, s.RangeCount, regionsText(s.Regions), durationText(s.RetentionAge), bytesLimitText(s.RetentionBytes), cleanupText(s))
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RANGE\tHASH-SLICE\tSTART\tTAIL\tSIZE\tSTATUS\tHOME\tEPOCH\tEPOCH STARTS")
	for _, r := range d.Ranges {
		status := r.Status
		if status == "" {
			status = "-"
		}
		fmt.Fprintf(tw, "%d\t%016x-%016x\t%d\t%d\t%s\t%s\t%s\t%d\t%s\n", r.Range, r.HashStart, r.HashEnd,
			r.StartOffset, r.TailOffset, humanBytes(r.SizeBytes), status, orDash(r.HomeRegion), r.Epoch, epochStartsText(r.Epochs))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if d.EpochsUnavailable != "" {
		fmt.Fprintf(e.stderr, "warning: epoch histories incomplete: %s\n", d.EpochsUnavailable)
	}
	return nil
}

// epochStartsText renders an epoch history as "1@0:us,2@25:eu(takeover)":
// epoch, start offset, home region and how a later epoch began.
func epochStartsText(es []client.EpochStart) string {
	if len(es) == 0 {
		return "-"
	}
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = fmt.Sprintf("%d@%d:%s", e.Epoch, e.StartOffset, orDash(e.HomeRegion))
		if e.Kind != "" && e.Kind != "create" {
			parts[i] += "(" + e.Kind + ")"
		}
	}
	return strings.Join(parts, ",")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// humanBytes renders n in B, KiB, MiB, GiB or TiB with one decimal.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	v := float64(n)
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		v /= unit
		if v < unit || u == "TiB" {
			return fmt.Sprintf("%.1f%s", v, u)
		}
	}
	panic("unreachable")
}

// streamsAlter changes a stream's retention in every region of it.
func (e *env) streamsAlter(ctx context.Context, args []string) error {
	fs := e.flagSet("streams alter")
	age := fs.Duration("retention-age", 0, "delete records older than this (0: no bound by age)")
	size := fs.Int64("retention-bytes", 0, "bound each range's size (0: no bound)")
	holdBytes, holdAge := mirrorHoldFlags(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || !slices.ContainsFunc([]string{"retention-age", "retention-bytes", "mirror-hold-bytes", "mirror-hold-age"}, func(f string) bool { return isSet(fs, f) }) {
		return usagef("usage: streams alter <name> [--retention-age D] [--retention-bytes N] [--mirror-hold-bytes N] [--mirror-hold-age D] (at least one)")
	}
	if *age < 0 || *size < 0 {
		return usagef("--retention-age and --retention-bytes must not be negative")
	}
	var change client.StreamChange
	if isSet(fs, "retention-age") {
		change.RetentionAge = age
	}
	if isSet(fs, "retention-bytes") {
		change.RetentionBytes = size
	}
	if isSet(fs, "mirror-hold-bytes") {
		change.MirrorHoldBytes = holdBytes
	}
	if isSet(fs, "mirror-hold-age") {
		change.MirrorHoldAge = holdAge
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	defer c.Close()
	s, err := c.AlterStream(ctx, pos[0], change)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "altered stream %s: retention %s / %s (applied at each range's next maintenance round)\n",
		s.Name, durationText(s.RetentionAge), bytesLimitText(s.RetentionBytes))
	return nil
}

// mirrorHoldFlags defines --mirror-hold-bytes and --mirror-hold-age on fs.
func mirrorHoldFlags(fs *flag.FlagSet) (*int64, *time.Duration) {
	return fs.Int64("mirror-hold-bytes", 0, "how far (bytes of the home's log) a mirror region may fall behind and still hold the home's retention back (0: twice --retention-bytes, -1: no bound)"),
		fs.Duration("mirror-hold-age", 0, "how long a mirror region may lag and still hold the home's retention back (0: twice --retention-age, negative: no bound)")
}
