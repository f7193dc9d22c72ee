package chaos

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/keyspace"
)

// rangeMap describes the stream in region and returns, when any of its
// ranges split, every range's span and the home of every range id
// (as described; a child without one is homed where its parent is). A
// stream whose ranges never split gives nil spans and homes unchanged.
func (wl *workload) rangeMap(ctx context.Context, region string, homes []string) ([]RangeSpan, []string, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	d, err := wl.clients[region].DescribeStream(cctx, wl.stream)
	if err != nil {
		return nil, homes, err
	}
	if !slices.ContainsFunc(d.Ranges, func(r client.RangeInfo) bool { return len(r.Children) > 0 }) {
		return nil, homes, nil
	}
	all := slices.Clone(homes)
	var spans []RangeSpan
	for _, r := range d.Ranges {
		if int(r.Range) >= len(all) {
			all = append(all, make([]string, int(r.Range)+1-len(all))...)
		}
		if all[r.Range] == "" {
			all[r.Range] = r.HomeRegion
		}
		spans = append(spans, RangeSpan{Range: r.Range, HashStart: r.HashStart, HashEnd: r.HashEnd,
			Children: r.Children, SplitOffset: r.SplitOffset})
	}
	// Children are described after their parents (ids grow).
	for _, r := range d.Ranges {
		if all[r.Range] == "" && r.Parent != keyspace.NoRange && int(r.Parent) < len(all) {
			all[r.Range] = all[r.Parent]
		}
	}
	for id, h := range all {
		if h == "" {
			return nil, homes, fmt.Errorf("chaos: range map of %s: no range %d, or no home for it", wl.stream, id)
		}
	}
	return spans, all, nil
}
