package client

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/backoff"
	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// Cursors are named positions in streams, stored by geolog itself (see
// consumer.proto and docs/consumers.md). Plain cursors are committed and
// read directly: a chat device's per-conversation read receipt is one
// (name "device-42/conv-9", the conversation's range). Consumer groups
// (GroupConsumer) keep theirs under the group's name.

// CursorPosition is a cursor's position in one range: Offset is the next
// offset to process (every offset below it was processed).
type CursorPosition struct {
	Stream string
	Range  uint32
	Offset uint64
	// Epoch is the homing epoch of the record at Offset-1, as read
	// (StoredRecord.Epoch); 0 if not known.
	Epoch uint64
	// Generation is the cursor's reset generation: commit with the one
	// you read (0 for a cursor never reset).
	Generation uint64
	// Metadata is opaque, at most 1024 bytes.
	Metadata []byte
	// CommitTime is when the coordinator took the commit (replies only).
	CommitTime time.Time
}

// CommitResult is one committed position's outcome: the stored position
// after the commit, and whether the commit raised it (a commit at or
// below the stored position changes nothing and is no error).
type CommitResult struct {
	Position CursorPosition
	Applied  bool
}

// PositionAfter is the position that marks rec processed: its offset + 1,
// with its epoch.
func PositionAfter(stream string, rec StoredRecord) CursorPosition {
	return CursorPosition{Stream: stream, Range: rec.Range, Offset: rec.Offset + 1, Epoch: rec.Epoch}
}

func (p CursorPosition) toProto() *geologv1.CursorPosition {
	return &geologv1.CursorPosition{Stream: p.Stream, Range: p.Range, Offset: p.Offset, Epoch: p.Epoch, Generation: p.Generation, Metadata: p.Metadata}
}

func positionFromProto(p *geologv1.CursorPosition) CursorPosition {
	out := CursorPosition{Stream: p.GetStream(), Range: p.GetRange(), Offset: p.GetOffset(), Epoch: p.GetEpoch(),
		Generation: p.GetGeneration(), Metadata: p.GetMetadata()}
	if ns := p.GetCommitTimeUnixNanos(); ns != 0 {
		out.CommitTime = time.Unix(0, ns)
	}
	return out
}

func positionsFromProto(ps []*geologv1.CursorPosition) []CursorPosition {
	out := make([]CursorPosition, len(ps))
	for i, p := range ps {
		out[i] = positionFromProto(p)
	}
	return out
}

// callConsumer runs one Consumer call the way call runs a Log call.
func (c *Client) callConsumer(ctx context.Context, retry bool, fn func(ctx context.Context, cc geologv1.ConsumerClient) error) error {
	return c.callConn(ctx, retry, func(ctx context.Context, _ geologv1.LogClient, conn *grpc.ClientConn) error {
		return fn(ctx, geologv1.NewConsumerClient(conn))
	})
}

// CommitCursors raises positions of a cursor without members. The reply
// comes once the commit is durable. Commits are max-registers, so
// retriable errors are retried (RetriesMax). Offsets past a range's tail,
// unknown streams or ranges, and a generation older than the cursor's
// (CodeStaleCursorGeneration: an operator reset it; read it again) are
// final errors that change nothing.
func (c *Client) CommitCursors(ctx context.Context, cursor string, positions ...CursorPosition) ([]CommitResult, error) {
	return c.commitCursors(ctx, cursor, "", 0, positions)
}

func (c *Client) commitCursors(ctx context.Context, cursor, member string, epoch uint64, positions []CursorPosition) ([]CommitResult, error) {
	req := &geologv1.CommitCursorsRequest{Cursor: cursor, MemberId: member, MemberEpoch: epoch, Positions: make([]*geologv1.CursorPosition, len(positions))}
	msgs := make([]geologv1.CursorPosition, len(positions)) // one allocation, not one per position
	for i, p := range positions {
		m := &msgs[i]
		m.Stream, m.Range, m.Offset, m.Epoch, m.Generation, m.Metadata = p.Stream, p.Range, p.Offset, p.Epoch, p.Generation, p.Metadata
		req.Positions[i] = m
	}
	var resp *geologv1.CommitCursorsResponse
	err := c.callCoordinator(ctx, cursor, func(ctx context.Context, cc geologv1.ConsumerClient, opts ...grpc.CallOption) (err error) {
		resp, err = cc.CommitCursors(ctx, req, append([]grpc.CallOption{commitCodecOption}, opts...)...)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("commit cursor %q: %w", cursor, err)
	}
	out := make([]CommitResult, len(resp.GetResults()))
	for i, r := range resp.GetResults() {
		out[i] = CommitResult{Position: positionFromProto(r.GetPosition()), Applied: r.GetApplied()}
	}
	return out, nil
}

// GetCursors returns a cursor's positions (on one stream if stream is
// set), sorted by stream and range. ConsistencyLocal (the default) reads
// the answering node's copy, which may lag the coordinator;
// ConsistencyHome sees every commit acknowledged before the call.
func (c *Client) GetCursors(ctx context.Context, cursor, stream string, consistency Consistency) ([]CursorPosition, error) {
	var resp *geologv1.GetCursorsResponse
	err := c.callConsumer(ctx, true, func(ctx context.Context, cc geologv1.ConsumerClient) (err error) {
		resp, err = cc.GetCursors(ctx, &geologv1.GetCursorsRequest{Cursor: cursor, Stream: stream, Consistency: consistency})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("get cursor %q: %w", cursor, err)
	}
	return positionsFromProto(resp.GetPositions()), nil
}

// GroupSummary is one group as ListGroups gives it.
type GroupSummary struct {
	Group, Stream string
	Members       int
	Epoch         uint64
	// State is "empty", "stable" or "reconciling".
	State string
}

// ListGroups lists the groups (consuming stream, if set) as the answering
// node's copy shows them.
func (c *Client) ListGroups(ctx context.Context, stream string) ([]GroupSummary, error) {
	var resp *geologv1.ListGroupsResponse
	err := c.callConsumer(ctx, true, func(ctx context.Context, cc geologv1.ConsumerClient) (err error) {
		resp, err = cc.ListGroups(ctx, &geologv1.ListGroupsRequest{Stream: stream})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list groups: %w", err)
	}
	out := make([]GroupSummary, len(resp.GetGroups()))
	for i, g := range resp.GetGroups() {
		out[i] = GroupSummary{Group: g.GetGroup(), Stream: g.GetStream(), Members: int(g.GetMembers()), Epoch: g.GetGroupEpoch(), State: g.GetState()}
	}
	return out, nil
}

// GroupDescription is a group's members, assignment and per-range lag.
type GroupDescription struct {
	Group, Stream          string
	RangeCount             uint32
	Epoch, AssignmentEpoch uint64
	State                  string
	Members                []GroupMember
	Ranges                 []RangeLag
	// CoordinatorRegion and Coordinator are where the group's cursor range
	// is homed and led, as the answering node knows.
	CoordinatorRegion, Coordinator string
	// OtherPositions are the cursor's positions on other streams.
	OtherPositions []CursorPosition
}

// GroupMember is one member of a group.
type GroupMember struct {
	MemberID, InstanceID     string
	Epoch, JoinEpoch         uint64
	Ranges, Revoking, Target []uint32
	Away                     bool
	SessionTimeout           time.Duration
	// LastHeartbeatAge is how long ago the coordinator heard from it; -1
	// when the answering node is not the coordinator.
	LastHeartbeatAge time.Duration
}

// RangeLag is a group's position and lag in one range, against the
// answering node's copy of the stream.
type RangeLag struct {
	Range       uint32
	Committed   uint64
	HasPosition bool
	Generation  uint64
	Owner       string
	Tail        uint64
	LagRecords  uint64
	// Lag is the age of the oldest record not yet processed (0 caught up).
	Lag time.Duration
}

// DescribeGroup describes a group (or a plain cursor: no members, its
// positions in OtherPositions). ConsistencyHome (the default here) reads
// after the coordinator's confirmed tail.
func (c *Client) DescribeGroup(ctx context.Context, group string) (*GroupDescription, error) {
	var resp *geologv1.DescribeGroupResponse
	err := c.callConsumer(ctx, true, func(ctx context.Context, cc geologv1.ConsumerClient) (err error) {
		resp, err = cc.DescribeGroup(ctx, &geologv1.DescribeGroupRequest{Group: group, Consistency: ConsistencyHome})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("describe group %q: %w", group, err)
	}
	d := &GroupDescription{Group: resp.GetGroup(), Stream: resp.GetStream(), RangeCount: resp.GetRangeCount(), Epoch: resp.GetGroupEpoch(),
		AssignmentEpoch: resp.GetAssignmentEpoch(), State: resp.GetState(), CoordinatorRegion: resp.GetCoordinatorRegion(),
		Coordinator: resp.GetCoordinator(), OtherPositions: positionsFromProto(resp.GetOtherPositions())}
	for _, m := range resp.GetMembers() {
		age := time.Duration(-1)
		if m.GetLastHeartbeatAgeMs() >= 0 {
			age = time.Duration(m.GetLastHeartbeatAgeMs()) * time.Millisecond
		}
		d.Members = append(d.Members, GroupMember{MemberID: m.GetMemberId(), InstanceID: m.GetInstanceId(), Epoch: m.GetMemberEpoch(),
			JoinEpoch: m.GetJoinEpoch(), Ranges: m.GetRanges(), Revoking: m.GetRevoking(), Target: m.GetTarget(), Away: m.GetAway(),
			SessionTimeout: time.Duration(m.GetSessionTimeoutMs()) * time.Millisecond, LastHeartbeatAge: age})
	}
	for _, r := range resp.GetRanges() {
		d.Ranges = append(d.Ranges, RangeLag{Range: r.GetRange(), Committed: r.GetCommitted(), HasPosition: r.GetHasPosition(),
			Generation: r.GetGeneration(), Owner: r.GetOwner(), Tail: r.GetTailOffset(), LagRecords: r.GetLagRecords(),
			Lag: time.Duration(r.GetLagMillis()) * time.Millisecond})
	}
	return d, nil
}

// DeleteGroup deletes a group or cursor and its positions; it returns
// how many positions it removed. CodeGroupNotEmpty while members are live.
// Not retried: a retry after an ambiguous failure would see
// CodeGroupNotFound.
func (c *Client) DeleteGroup(ctx context.Context, group string) (int, error) {
	var resp *geologv1.DeleteGroupResponse
	err := c.callConsumer(ctx, false, func(ctx context.Context, cc geologv1.ConsumerClient) (err error) {
		resp, err = cc.DeleteGroup(ctx, &geologv1.DeleteGroupRequest{Group: group})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("delete group %q: %w", group, err)
	}
	return int(resp.GetPositionsDeleted()), nil
}

// ResetTo is where ResetGroup moves a cursor: build it with
// ResetToEarliest, ResetToLatest, ResetToTime or ResetToOffset.
type ResetTo struct {
	req func(*geologv1.ResetGroupRequest)
}

// ResetToEarliest moves to each range's first retained offset.
func ResetToEarliest() ResetTo {
	return ResetTo{func(r *geologv1.ResetGroupRequest) { r.To = &geologv1.ResetGroupRequest_ToEarliest{ToEarliest: true} }}
}

// ResetToLatest moves to each range's tail (skipping everything).
func ResetToLatest() ResetTo {
	return ResetTo{func(r *geologv1.ResetGroupRequest) { r.To = &geologv1.ResetGroupRequest_ToLatest{ToLatest: true} }}
}

// ResetToTime moves to the first offset appended at or after t.
func ResetToTime(t time.Time) ResetTo {
	return ResetTo{func(r *geologv1.ResetGroupRequest) {
		r.To = &geologv1.ResetGroupRequest_ToTimeUnixNanos{ToTimeUnixNanos: t.UnixNano()}
	}}
}

// ResetToOffset moves every range to offset (which must be retained and
// not past the tail in each).
func ResetToOffset(offset uint64) ResetTo {
	return ResetTo{func(r *geologv1.ResetGroupRequest) { r.To = &geologv1.ResetGroupRequest_ToOffset{ToOffset: offset} }}
}

// ResetGroup moves a group's (or cursor's) positions on stream (the given
// ranges, or all) in a new generation; CodeGroupNotEmpty while the group
// has members. It returns the new positions.
func (c *Client) ResetGroup(ctx context.Context, group, stream string, to ResetTo, ranges ...uint32) ([]CursorPosition, error) {
	if to.req == nil {
		return nil, apierr.New(apierr.InvalidArgument, "reset group %q: no target", group)
	}
	req := &geologv1.ResetGroupRequest{Group: group, Stream: stream, Ranges: ranges}
	to.req(req)
	var resp *geologv1.ResetGroupResponse
	err := c.callConsumer(ctx, true, func(ctx context.Context, cc geologv1.ConsumerClient) (err error) {
		resp, err = cc.ResetGroup(ctx, req)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("reset group %q: %w", group, err)
	}
	return positionsFromProto(resp.GetPositions()), nil
}

// coordinatorHeader is regionsvc.CoordinatorHeader: a node that took a
// Consumer request names the node (of its region) that coordinated it.
const coordinatorHeader = "x-geolog-coordinator"

// cursorRangeHeader is regionsvc.CursorRangeHeader: with the coordinator,
// the cursor range of the name and the ranges' count, "index/count".
const cursorRangeHeader = "x-geolog-cursor-range"

// coordinatorsMax bounds the names whose coordinator a Client remembers.
const coordinatorsMax = 4096

// cursorRangesMax bounds the cursor range count a Client takes from a
// node (the bound of a stream's ranges).
const cursorRangesMax = 4096

// coordinators caches, per cursor range, the node that coordinated the
// last request of one of its names (the range of a name is
// keyspace.RangeForKey over the range count the nodes name), so that the
// next ones, of any name of the range, go there directly instead of
// through a forwarding node; per name when the node names no range. A
// hint only: a node that no longer coordinates forwards the request and
// names the new coordinator.
type coordinators struct {
	mu sync.Mutex
	m  map[string]string
	// ranges is the cursor ranges' count the nodes named (0: none yet);
	// byRange the coordinator of each range.
	ranges  uint32
	byRange map[uint32]string
}

func (cs *coordinators) get(name string) string {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.ranges > 0 {
		if addr := cs.byRange[keyspace.RangeForKey([]byte(name), cs.ranges)]; addr != "" {
			return addr
		}
	}
	return cs.m[name]
}

func (cs *coordinators) learn(name string, md metadata.MD) {
	v := md.Get(coordinatorHeader)
	if len(v) == 0 || checkAddr(v[0]) != nil {
		return
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if idx, count, ok := parseCursorRange(md.Get(cursorRangeHeader)); ok && keyspace.RangeForKey([]byte(name), count) == idx {
		if count != cs.ranges || cs.byRange == nil {
			cs.ranges, cs.byRange = count, map[uint32]string{}
		}
		cs.byRange[idx] = v[0]
		return
	}
	if cs.m == nil {
		cs.m = map[string]string{}
	}
	if _, ok := cs.m[name]; !ok && len(cs.m) >= coordinatorsMax {
		for k := range cs.m {
			delete(cs.m, k)
			break
		}
	}
	cs.m[name] = v[0]
}

// parseCursorRange parses a cursorRangeHeader value.
func parseCursorRange(v []string) (idx, count uint32, ok bool) {
	if len(v) == 0 {
		return 0, 0, false
	}
	i, n, found := strings.Cut(v[0], "/")
	x, err1 := strconv.ParseUint(i, 10, 32)
	y, err2 := strconv.ParseUint(n, 10, 32)
	if !found || err1 != nil || err2 != nil || y == 0 || y > cursorRangesMax || x >= y {
		return 0, 0, false
	}
	return uint32(x), uint32(y), true
}

func (cs *coordinators) forget(name, addr string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.m[name] == addr {
		delete(cs.m, name)
	}
	if cs.ranges > 0 {
		if r := keyspace.RangeForKey([]byte(name), cs.ranges); cs.byRange[r] == addr {
			delete(cs.byRange, r)
		}
	}
}

// coordinatorOverloadRetriesMax bounds the retries of a call at a
// coordinator that answers OVERLOADED before the call goes elsewhere.
const coordinatorOverloadRetriesMax = 20

// callCoordinatorAt runs a Consumer call for name at addr once; it learns
// the coordinator from the answer.
func (c *Client) callCoordinatorAt(ctx context.Context, addr, name string, fn func(ctx context.Context, cc geologv1.ConsumerClient, opts ...grpc.CallOption) error) error {
	_, conn, err := c.pool.api(addr)
	if err != nil {
		return err
	}
	actx, cancel := ctx, context.CancelFunc(func() {})
	if _, ok := ctx.Deadline(); !ok && c.cfg.requestTimeout > 0 {
		actx, cancel = context.WithTimeout(ctx, c.cfg.requestTimeout)
	}
	defer cancel()
	var md metadata.MD
	if err := fn(actx, geologv1.NewConsumerClient(conn), grpc.Header(&md)); err != nil {
		return rpcError(ctx, err)
	}
	c.coordinators.learn(name, md)
	return nil
}

// callCoordinator runs a Consumer call for name at the node that last
// coordinated it, once (again while it answers OVERLOADED), then (or
// without one) the way callConsumer does; it learns the coordinator from
// the answer.
func (c *Client) callCoordinator(ctx context.Context, name string, fn func(ctx context.Context, cc geologv1.ConsumerClient, opts ...grpc.CallOption) error) error {
	if addr := c.coordinators.get(name); addr != "" {
		for overloads := 0; ; overloads++ {
			err := c.callCoordinatorAt(ctx, addr, name, fn)
			if err == nil || !IsRetriable(err) {
				return err
			}
			// A coordinator that shed the call before running it is still
			// the coordinator: the same address again after the delay it
			// asked for (docs/api.md), not the bootstrap node, which would
			// forward the call back to it.
			if CodeOf(err) != CodeOverloaded || overloads >= coordinatorOverloadRetriesMax {
				break
			}
			if backoff.Sleep(ctx, retryDelay(err, overloads+1, c.cfg.backoffMin, c.cfg.backoffMax)) != nil {
				return err
			}
		}
		c.coordinators.forget(name, addr)
	}
	return c.callConsumer(ctx, true, func(ctx context.Context, cc geologv1.ConsumerClient) error {
		var md metadata.MD
		err := fn(ctx, cc, grpc.Header(&md))
		if err == nil {
			c.coordinators.learn(name, md)
		}
		return err
	})
}
