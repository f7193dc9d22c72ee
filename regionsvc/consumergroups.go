package regionsvc

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/cursors"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// Operator RPCs of the Consumer service: reset, list, describe (with lag).

func (s *consumerServer) ResetGroup(ctx context.Context, req *geologv1.ResetGroupRequest) (*geologv1.ResetGroupResponse, error) {
	resp, err := s.node.resetGroup(ctx, req)
	return resp, err
}

func (n *Node) resetGroup(ctx context.Context, req *geologv1.ResetGroupRequest) (*geologv1.ResetGroupResponse, error) {
	if err := checkCursorName(req.GetGroup()); err != nil {
		return nil, err
	}
	fwd := req
	targets := make([]cursors.Position, 0, len(req.GetResolved()))
	if isForwarded(ctx) {
		for _, p := range req.GetResolved() {
			targets = append(targets, cursors.Position{Range: p.GetRange(), Offset: p.GetOffset()})
		}
	} else {
		resolved, err := n.resolveReset(ctx, req)
		if err != nil {
			return nil, err
		}
		targets = resolved
		fwd = &geologv1.ResetGroupRequest{Group: req.GetGroup(), Stream: req.GetStream(), Ranges: req.GetRanges()}
		for _, t := range resolved {
			fwd.Resolved = append(fwd.Resolved, &geologv1.CursorPosition{Stream: req.GetStream(), Range: t.Range, Offset: t.Offset})
		}
	}
	cr, err := n.cursors.rangeFor(ctx, req.GetGroup())
	if err != nil {
		return nil, err
	}
	v, err := n.coordinate(ctx, cr, func(b *cursors.Batch, _ *cursors.Coordinator) (any, error) {
		ps, err := b.Reset(req.GetGroup(), req.GetStream(), targets)
		return &geologv1.ResetGroupResponse{Positions: positionsToProto(ps)}, err
	}, func(ctx context.Context, c geologv1.ConsumerClient) (any, error) { return c.ResetGroup(ctx, fwd) })
	if err != nil {
		return nil, err
	}
	return v.(*geologv1.ResetGroupResponse), nil
}

// resolveReset turns a reset's target (earliest, latest, a time or an
// offset) into an offset per range, on this node's copy of the stream.
func (n *Node) resolveReset(ctx context.Context, req *geologv1.ResetGroupRequest) ([]cursors.Position, error) {
	if err := validateStreamNameOrInternal(req.GetStream()); err != nil {
		return nil, err
	}
	st, err := n.lookupStream(ctx, req.GetStream())
	if err != nil {
		return nil, err
	}
	ranges := slices.Clone(req.GetRanges())
	if len(ranges) == 0 {
		for r := range st.spec.RangeCount {
			ranges = append(ranges, r)
		}
	}
	if len(ranges) > cursors.RangesMax {
		return nil, apierr.New(apierr.InvalidArgument, "%d ranges named, at most %d", len(ranges), cursors.RangesMax)
	}
	out := make([]cursors.Position, 0, len(ranges))
	for _, r := range ranges {
		if r >= st.spec.RangeCount {
			return nil, apierr.New(apierr.RangeNotFound, "stream %q has %d ranges; range %d does not exist", req.GetStream(), st.spec.RangeCount, r)
		}
		off, err := resetTarget(ctx, st.ranges[r], req)
		if err != nil {
			return nil, err
		}
		out = append(out, cursors.Position{Range: r, Offset: off})
	}
	return out, nil
}

func resetTarget(ctx context.Context, rd *rangeDriver, req *geologv1.ResetGroupRequest) (uint64, error) {
	if f := rd.failure.Load(); f != nil {
		return 0, f
	}
	if e := rd.relearning(); e != nil {
		return 0, e // "latest" would be below what it served
	}
	switch to := req.GetTo().(type) {
	case *geologv1.ResetGroupRequest_ToEarliest:
		return rd.store.StartOffset(), nil
	case *geologv1.ResetGroupRequest_ToLatest:
		return rd.committed.Load(), nil
	case *geologv1.ResetGroupRequest_ToTimeUnixNanos:
		return rd.offsetForTime(to.ToTimeUnixNanos)
	case *geologv1.ResetGroupRequest_ToOffset:
		if start := rd.store.StartOffset(); to.ToOffset < start {
			return 0, outOfRange(to.ToOffset, start, rd.committed.Load())
		}
		return to.ToOffset, checkOffsetInRange(ctx, rd, to.ToOffset)
	default:
		return 0, apierr.New(apierr.InvalidArgument, "a reset needs a target: earliest, latest, a time or an offset")
	}
}

func (s *consumerServer) ListGroups(ctx context.Context, req *geologv1.ListGroupsRequest) (*geologv1.ListGroupsResponse, error) {
	resp, err := s.node.listGroups(ctx, req)
	return resp, err
}

func (n *Node) listGroups(ctx context.Context, req *geologv1.ListGroupsRequest) (*geologv1.ListGroupsResponse, error) {
	rs, err := n.cursors.existing(ctx, confirmRead(req.GetConsistency()))
	if errors.Is(err, errNoCursorStream) {
		return &geologv1.ListGroupsResponse{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := &geologv1.ListGroupsResponse{}
	for _, cr := range rs {
		if err := n.cursorRead(ctx, cr, req.GetConsistency(), func(s *cursors.State) {
			for _, name := range s.Groups() {
				g := s.Group(name)
				if req.GetStream() != "" && g.Stream != req.GetStream() {
					continue
				}
				out.Groups = append(out.Groups, &geologv1.GroupSummary{Group: name, Stream: g.Stream, Members: uint32(len(g.Members)),
					GroupEpoch: g.Epoch, State: groupState(g)})
			}
		}); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(out.Groups, func(a, b *geologv1.GroupSummary) int { return strings.Compare(a.Group, b.Group) })
	return out, nil
}

// groupState is "empty", "stable" or "reconciling".
func groupState(g *cursors.Group) string {
	if !g.Live() {
		return "empty"
	}
	owned := 0
	for _, m := range g.Members {
		if len(m.Revoking) > 0 || !slices.Equal(m.Owned, m.Target) {
			return "reconciling"
		}
		owned += len(m.Owned)
	}
	if owned != int(g.RangeCount) {
		return "reconciling"
	}
	return "stable"
}

func (s *consumerServer) DescribeGroup(ctx context.Context, req *geologv1.DescribeGroupRequest) (*geologv1.DescribeGroupResponse, error) {
	resp, err := s.node.describeGroup(ctx, req)
	return resp, err
}

func (n *Node) describeGroup(ctx context.Context, req *geologv1.DescribeGroupRequest) (*geologv1.DescribeGroupResponse, error) {
	if err := checkCursorName(req.GetGroup()); err != nil {
		return nil, err
	}
	cr, err := n.cursors.rangeForRead(ctx, req.GetGroup(), confirmRead(req.GetConsistency()))
	if errors.Is(err, errNoCursorStream) {
		return nil, apierr.New(apierr.GroupNotFound, "no group or cursor %q", req.GetGroup())
	}
	if err != nil {
		return nil, err
	}
	var g *cursors.Group
	var ps []cursors.Position
	if err := n.cursorRead(ctx, cr, req.GetConsistency(), func(s *cursors.State) {
		if held := s.Group(req.GetGroup()); held != nil && !held.Deleted {
			g = held
		}
		ps = s.Positions(req.GetGroup(), "")
	}); err != nil {
		return nil, err
	}
	if g == nil && len(ps) == 0 {
		return nil, apierr.New(apierr.GroupNotFound, "no group or cursor %q", req.GetGroup())
	}
	resp := &geologv1.DescribeGroupResponse{Group: req.GetGroup(), CoordinatorRegion: cr.d.role().region}
	if cr.d.rep != nil && cr.d.role().home {
		resp.Coordinator = n.clientAddr(n.cfg.Region, cr.d.rep.LeaderID()) // advertised
	}
	if g != nil {
		n.describeMembers(cr, g, resp)
	}
	for _, p := range ps {
		if g == nil || p.Stream != g.Stream {
			resp.OtherPositions = append(resp.OtherPositions, positionToProto(p))
		}
	}
	if g != nil && g.Stream != "" {
		if resp.Ranges, err = n.rangeLags(ctx, g, ps); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// describeMembers fills in a group's members; session ages only where the
// coordinator runs (-1 elsewhere).
func (n *Node) describeMembers(cr *cursorRange, g *cursors.Group, resp *geologv1.DescribeGroupResponse) {
	resp.Stream, resp.RangeCount, resp.GroupEpoch, resp.AssignmentEpoch, resp.State = g.Stream, g.RangeCount, g.Epoch, g.AssignmentEpoch, groupState(g)
	ages := cr.sessionAges(g)
	for _, m := range g.Members {
		age, ok := ages[m.ID]
		if !ok {
			age = -1
		}
		resp.Members = append(resp.Members, &geologv1.GroupMember{MemberId: m.ID, InstanceId: m.InstanceID, MemberEpoch: m.Epoch,
			JoinEpoch: m.JoinEpoch, Ranges: m.Assigned(), Revoking: m.Revoking, Target: m.Target, Away: m.Away,
			SessionTimeoutMs: m.SessionTimeoutMillis, LastHeartbeatAgeMs: age})
	}
}

// rangeLags is each range's position and lag for g's stream, against this
// node's copy of the stream (none if the stream is not placed here). A copy
// relearning its commit index knows no tail to measure from: the answer
// is refused (retriable), and the SDK asks another node.
func (n *Node) rangeLags(ctx context.Context, g *cursors.Group, ps []cursors.Position) ([]*geologv1.RangeLag, error) {
	st, err := n.lookupStream(ctx, g.Stream)
	now := n.cfg.Now()
	var out []*geologv1.RangeLag
	count := g.RangeCount
	if err == nil {
		count = max(count, uint32(len(st.ranges))) // a split's children too
	}
	for r := range count {
		rl := &geologv1.RangeLag{Range: r}
		if i := slices.IndexFunc(ps, func(p cursors.Position) bool { return p.Stream == g.Stream && p.Range == r }); i >= 0 {
			rl.Committed, rl.HasPosition, rl.Generation = ps[i].Offset, true, ps[i].Generation
		}
		for _, m := range g.Members {
			if m.Owns(r) {
				rl.Owner = m.ID
			}
		}
		if err == nil && int(r) < len(st.ranges) {
			if e := st.ranges[r].relearning(); e != nil {
				return nil, e
			}
			rl.TailOffset, rl.LagRecords, rl.LagMillis = rangeLag(st.ranges[r], rl.Committed, now)
		}
		out = append(out, rl)
	}
	return out, nil
}

// rangeLag is a position's lag on a copy of a range: the tail, how many
// records are past the position, and how old the oldest of them is.
func rangeLag(rd *rangeDriver, committed uint64, now time.Time) (tail, records uint64, millis int64) {
	if rd.store == nil {
		return 0, 0, 0
	}
	tail = rd.readTail() // a split range's ends at its split offset
	if committed >= tail {
		return tail, 0, 0
	}
	records = tail - committed
	from := max(committed, rd.store.StartOffset())
	if recs, _, err := rd.readRecords(from, 1, 1); err == nil && len(recs) > 0 {
		millis = max(0, now.Sub(time.Unix(0, recs[0].AppendTimeUnixNanos)).Milliseconds())
	}
	return tail, records, millis
}

// sessionAges returns how long ago the coordinator heard from each member
// of g, if it runs here.
func (cr *cursorRange) sessionAges(g *cursors.Group) map[string]int64 {
	ages, _ := cr.submitQuiet(func(_ *cursors.Batch, c *cursors.Coordinator) (any, error) {
		now := cr.cs.n.cfg.Now()
		out := map[string]int64{}
		for _, m := range g.Members {
			if at, ok := c.LastHeard(g.Name, m.ID); ok {
				out[m.ID] = now.Sub(at).Milliseconds()
			}
		}
		return out, nil
	})
	m, _ := ages.(map[string]int64)
	return m
}

// submitQuiet runs a read-only request on the coordinator if it runs
// here, with a short bound; nothing otherwise.
func (cr *cursorRange) submitQuiet(run func(b *cursors.Batch, c *cursors.Coordinator) (any, error)) (any, error) {
	if !cr.coordinatesHere() {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return cr.submit(ctx, run)
}
