package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

const rehomeUsage = `usage: rehome <stream> <range|all> <region> [--json]
  Moves the ranges' homes to region with zero loss (the home stops admitting,
  the region's mirror catches up, the lease moves at epoch+1). Needs homing
  (nodes run with --lease-store). Send it to any node of the stream's regions.`

// rehome runs a planned move of homes (Admin.Rehome).
func (e *env) rehome(ctx context.Context, args []string) error {
	fs := e.flagSet("rehome")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 3 {
		return usagef("%s", rehomeUsage)
	}
	req := &geologv1.RehomeRequest{Stream: pos[0], Region: pos[2]}
	if pos[1] == "all" {
		req.AllRanges = true
	} else {
		r, err := strconv.ParseUint(pos[1], 10, 32)
		if err != nil {
			return usagef("range %q is not a number nor \"all\"", pos[1])
		}
		req.Ranges = []uint32{uint32(r)}
	}
	a, err := e.adminDialer()
	if err != nil {
		return err
	}
	defer a.close()
	var resp *geologv1.RehomeResponse
	// A rehome waits for mirrors to catch up: give it more than a call.
	err = a.call(ctx, max(e.timeout, 2*time.Minute), func(ctx context.Context, ac geologv1.AdminClient) error {
		var err error
		resp, err = ac.Rehome(ctx, req)
		return err
	})
	if err != nil {
		return err
	}
	failed := 0
	for _, r := range resp.GetRanges() {
		if r.GetStatus() != "moved" && r.GetStatus() != "already home" {
			failed++
		}
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(resp.GetRanges()); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "RANGE\tFROM\tTO\tEPOCH\tSTART OFFSET\tPAUSE\tSTATUS")
		for _, r := range resp.GetRanges() {
			pause := "-"
			if r.GetPauseMicros() > 0 {
				pause = (time.Duration(r.GetPauseMicros()) * time.Microsecond).Round(100 * time.Microsecond).String()
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%s\t%s\n", r.GetRange(), r.GetFromRegion(), r.GetToRegion(), r.GetEpoch(), r.GetStartOffset(), pause, r.GetStatus())
		}
		tw.Flush()
	}
	if failed > 0 {
		fmt.Fprintf(e.stderr, "geolog rehome: %d of %d ranges were not moved\n", failed, len(resp.GetRanges()))
		return errReported
	}
	return nil
}
