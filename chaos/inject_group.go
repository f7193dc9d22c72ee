package chaos

import (
	"context"
	"fmt"

	"github.com/geolog/geolog/keyspace"
)

// cursorStream is the node's internal stream of cursors and groups.
const cursorStream = "_cursors"

// memberFault applies a member-kill or member-partition to the group's
// next victim (round robin over the live members).
func (in *injector) memberFault(f Fault, mark func(), ev *FaultEvent) (func(context.Context) error, error) {
	in.mu.Lock()
	g, rep := in.group, in.memberFaults
	in.memberFaults++
	in.mu.Unlock()
	if g == nil {
		return nil, fmt.Errorf("%w: %s needs a consumer group (workload.group.members)", ErrUnsupported, f.Kind)
	}
	fault := g.kill
	if f.Kind == KindMemberPartition {
		fault = g.partition
	}
	what, owned, revert, err := fault(rep, mark)
	if err != nil {
		return nil, err
	}
	ev.What, ev.MemberRanges = what, owned
	return revert, nil
}

// cursorTarget is the group's range of the cursor stream and the region
// it is homed in now, as a node of the group's region describes it.
func (in *injector) cursorTarget(ctx context.Context) (string, uint32, error) {
	if in.group == nil {
		return "", 0, fmt.Errorf("%w: \"cursors\" needs a consumer group (workload.group.members)", ErrUnsupported)
	}
	c, err := newClient(in.cl, in.group.gw.Region)
	if err != nil {
		return "", 0, err
	}
	defer c.Close()
	d, err := c.DescribeStream(ctx, cursorStream)
	if err != nil {
		return "", 0, fmt.Errorf("chaos: describe %s: %w", cursorStream, err)
	}
	rng := keyspace.RangeForKey([]byte(in.group.hist.Group), d.Stream.RangeCount)
	if int(rng) >= len(d.Ranges) || d.Ranges[rng].HomeRegion == "" {
		return "", 0, fmt.Errorf("chaos: %s/%d has no home", cursorStream, rng)
	}
	return d.Ranges[rng].HomeRegion, rng, nil
}
