package regionsvc

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/cursors"
	"github.com/geolog/geolog/internal/backoff"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// consumerServer implements geologv1.ConsumerServer on a Node (see
// consumer.proto for each RPC's contract). It returns plain errors; the
// server's interceptors (rpcerr) map them to statuses.
type consumerServer struct {
	geologv1.UnimplementedConsumerServer
	node *Node
}

// Group protocol settings of a node.
const (
	// groupHeartbeatIntervalDefault is the heartbeat interval members are
	// told, by default.
	groupHeartbeatIntervalDefault = 500 * time.Millisecond
	// commitTailWaitMax bounds the wait for a copy of a range that lags an
	// offset a commit names.
	commitTailWaitMax = time.Second
)

func (s *consumerServer) CommitCursors(ctx context.Context, req *geologv1.CommitCursorsRequest) (*geologv1.CommitCursorsResponse, error) {
	resp, err := s.node.commitCursors(ctx, req)
	return resp, err
}

func (n *Node) commitCursors(ctx context.Context, req *geologv1.CommitCursorsRequest) (*geologv1.CommitCursorsResponse, error) {
	if len(req.GetPositions()) > cursors.CommitPositionsMax {
		return nil, apierr.New(apierr.InvalidArgument, "%d positions in one commit, at most %d", len(req.GetPositions()), cursors.CommitPositionsMax)
	}
	creq := cursors.CommitRequest{Cursor: req.GetCursor(), MemberID: req.GetMemberId(), MemberEpoch: req.GetMemberEpoch(),
		Positions: make([]cursors.Position, len(req.GetPositions()))}
	for i, p := range req.GetPositions() {
		creq.Positions[i] = positionFromProto(p)
	}
	if err := checkCursorName(creq.Cursor); err != nil {
		return nil, err
	}
	if req.GetMerge() {
		if !isForwarded(ctx) {
			return nil, apierr.New(apierr.InvalidArgument, "merge is for nodes merging back an orphan log")
		}
		return n.mergeCursor(ctx, creq.Cursor, creq.Positions, req)
	}
	if !isForwarded(ctx) {
		if err := n.checkPositions(ctx, creq.Positions); err != nil {
			return nil, err
		}
	}
	cr, err := n.cursors.rangeFor(ctx, creq.Cursor)
	if err != nil {
		return nil, err
	}
	v, err := n.coordinate(ctx, cr, func(b *cursors.Batch, _ *cursors.Coordinator) (any, error) {
		return commitResponse(b.Commit(creq))
	}, func(ctx context.Context, c geologv1.ConsumerClient) (any, error) { return c.CommitCursors(ctx, req) })
	if err != nil {
		return nil, err
	}
	return v.(*geologv1.CommitCursorsResponse), nil
}

func checkCursorName(name string) error {
	if name == "" || len(name) > cursors.NameBytesMax {
		return apierr.New(apierr.InvalidArgument, "cursor or group name must be 1 to %d bytes (got %d)", cursors.NameBytesMax, len(name))
	}
	return nil
}

// checkPositions checks positions against this node's copies of their
// streams: the stream exists here, the range exists, and the offset is not
// past the range's committed tail (waiting up to commitTailWaitMax for a
// copy that lags it).
func (n *Node) checkPositions(ctx context.Context, ps []cursors.Position) error {
	streams := map[string]*streamState{}
	for _, p := range ps {
		st, ok := streams[p.Stream]
		if !ok {
			if err := validateStreamNameOrInternal(p.Stream); err != nil {
				return err
			}
			var err error
			if st, err = n.lookupStream(ctx, p.Stream); err != nil {
				return err
			}
			streams[p.Stream] = st
		}
		if p.Range >= uint32(len(st.ranges)) {
			return apierr.New(apierr.RangeNotFound, "stream %q has %d ranges; range %d does not exist", p.Stream, len(st.ranges), p.Range)
		}
		if err := checkOffsetInRange(ctx, st.ranges[p.Range], p.Offset); err != nil {
			return err
		}
	}
	return nil
}

// checkOffsetInRange refuses an offset past the range's committed tail on
// this node, after waiting a little for a copy that lags.
func checkOffsetInRange(ctx context.Context, rd *rangeDriver, offset uint64) error {
	if f := rd.readFailure(); f != nil {
		return f
	}
	if offset <= rd.committed.Load() {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, commitTailWaitMax)
	defer cancel()
	if rd.waitCommitted(wctx, offset) == nil {
		return nil
	}
	if e := rd.relearning(); e != nil {
		return e // its tail may be below the position: retriable, never out of range
	}
	e := apierr.As(outOfRange(offset, rd.store.StartOffset(), rd.committed.Load()))
	e.Message = "a position past the range's tail: " + e.Message
	return e
}

// validateStreamNameOrInternal accepts user stream names and the node's
// internal streams.
func validateStreamNameOrInternal(name string) error {
	if isInternalStream(name) {
		return nil
	}
	return validateStreamName(name)
}

func positionFromProto(p *geologv1.CursorPosition) cursors.Position {
	return cursors.Position{Stream: p.GetStream(), Range: p.GetRange(), Offset: p.GetOffset(), Epoch: p.GetEpoch(),
		Generation: p.GetGeneration(), Metadata: p.GetMetadata()}
}

func positionToProto(p cursors.Position) *geologv1.CursorPosition {
	return &geologv1.CursorPosition{Stream: p.Stream, Range: p.Range, Offset: p.Offset, Epoch: p.Epoch, Generation: p.Generation,
		Metadata: p.Metadata, CommitTimeUnixNanos: p.CommitTimeUnixNanos}
}

func positionsToProto(ps []cursors.Position) []*geologv1.CursorPosition {
	out := make([]*geologv1.CursorPosition, len(ps))
	for i, p := range ps {
		out[i] = positionToProto(p)
	}
	return out
}

func (s *consumerServer) GetCursors(ctx context.Context, req *geologv1.GetCursorsRequest) (*geologv1.GetCursorsResponse, error) {
	resp, err := s.node.getCursors(ctx, req)
	return resp, err
}

func (n *Node) getCursors(ctx context.Context, req *geologv1.GetCursorsRequest) (*geologv1.GetCursorsResponse, error) {
	if err := checkCursorName(req.GetCursor()); err != nil {
		return nil, err
	}
	cr, err := n.cursors.rangeForRead(ctx, req.GetCursor(), confirmRead(req.GetConsistency()))
	if errors.Is(err, errNoCursorStream) {
		return &geologv1.GetCursorsResponse{}, nil
	}
	if err != nil {
		return nil, err
	}
	var ps []cursors.Position
	if err := n.cursorRead(ctx, cr, req.GetConsistency(), func(s *cursors.State) {
		ps = s.Positions(req.GetCursor(), req.GetStream())
	}); err != nil {
		return nil, err
	}
	return &geologv1.GetCursorsResponse{Positions: positionsToProto(ps)}, nil
}

// cursorRead runs fn on a cursor range's local state, as consistent as
// asked: CONSISTENCY_HOME waits until the state has applied the home's
// confirmed tail (every commit acknowledged before the call), and runs fn
// on a state that still holds it (readAfter: the applier may have rebuilt
// the state from the log's start since the wait, after a fork).
func (n *Node) cursorRead(ctx context.Context, cr *cursorRange, c geologv1.Consistency, fn func(s *cursors.State)) error {
	if e := cr.d.relearning(); e != nil && !confirmRead(c) {
		return e // its state may be older than one it answered before
	}
	end, err := n.cursorReadEnd(ctx, cr, c)
	if err != nil {
		return err
	}
	return cr.readAfter(ctx, end, fn)
}

// cursorReadEnd is the offset a read at consistency c must see applied (0
// for a local read), waited for.
func (n *Node) cursorReadEnd(ctx context.Context, cr *cursorRange, c geologv1.Consistency) (uint64, error) {
	switch c {
	case geologv1.Consistency_CONSISTENCY_UNSPECIFIED, geologv1.Consistency_CONSISTENCY_LOCAL:
		return 0, nil
	case geologv1.Consistency_CONSISTENCY_HOME:
	default:
		return 0, apierr.New(apierr.InvalidArgument, "consistency %v is not one of LOCAL, HOME for cursors", c)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, minOffsetWaitMax)
		defer cancel()
	}
	// A range electing its leader has no home tail to give for a moment:
	// wait for one rather than fail the read.
	var tail uint64
	var err error
	for attempt := 0; ; attempt++ {
		if tail, err = n.homeTail(ctx, cr.d, false); err == nil || !rpcerr.IsRetriable(err) || attempt >= coordinateAttemptsMax {
			break
		}
		if backoff.Sleep(ctx, coordinateBackoff(attempt)) != nil {
			break
		}
	}
	if err != nil {
		return 0, err
	}
	if err := cr.d.waitCommitted(ctx, tail); err != nil {
		return 0, err
	}
	return tail, cr.waitApplied(ctx, tail)
}

func (s *consumerServer) JoinGroup(ctx context.Context, req *geologv1.JoinGroupRequest) (*geologv1.GroupAssignment, error) {
	resp, err := s.node.joinGroup(ctx, req)
	return resp, err
}

func (n *Node) joinGroup(ctx context.Context, req *geologv1.JoinGroupRequest) (*geologv1.GroupAssignment, error) {
	if err := checkCursorName(req.GetGroup()); err != nil {
		return nil, err
	}
	jreq := cursors.JoinRequest{Group: req.GetGroup(), MemberID: req.GetMemberId(), InstanceID: req.GetInstanceId(), Stream: req.GetStream(),
		RangeCount: req.GetRangeCount(), SessionTimeout: time.Duration(req.GetSessionTimeoutMs()) * time.Millisecond,
		RebalanceTimeout: time.Duration(req.GetRebalanceTimeoutMs()) * time.Millisecond}
	fwd := req
	if !isForwarded(ctx) {
		if err := validateStreamNameOrInternal(jreq.Stream); err != nil {
			return nil, err
		}
		st, err := n.lookupStream(ctx, jreq.Stream)
		if err != nil {
			return nil, err
		}
		jreq.RangeCount = st.spec.RangeCount
		fwd = cloneJoin(req, st.spec.RangeCount)
	}
	cr, err := n.cursors.rangeFor(ctx, jreq.Group)
	if err != nil {
		return nil, err
	}
	v, err := n.coordinate(ctx, cr, func(b *cursors.Batch, c *cursors.Coordinator) (any, error) {
		a, err := c.Join(b, jreq)
		return n.assignmentToProto(a), err
	}, func(ctx context.Context, c geologv1.ConsumerClient) (any, error) { return c.JoinGroup(ctx, fwd) })
	if err != nil {
		return nil, err
	}
	return v.(*geologv1.GroupAssignment), nil
}

func cloneJoin(req *geologv1.JoinGroupRequest, rangeCount uint32) *geologv1.JoinGroupRequest {
	return &geologv1.JoinGroupRequest{Group: req.GetGroup(), MemberId: req.GetMemberId(), InstanceId: req.GetInstanceId(), Stream: req.GetStream(),
		SessionTimeoutMs: req.GetSessionTimeoutMs(), RebalanceTimeoutMs: req.GetRebalanceTimeoutMs(), RangeCount: rangeCount}
}

func (n *Node) assignmentToProto(a cursors.Assignment) *geologv1.GroupAssignment {
	return &geologv1.GroupAssignment{MemberId: a.MemberID, MemberEpoch: a.MemberEpoch, GroupEpoch: a.GroupEpoch, Stream: a.Stream,
		Ranges: a.Ranges, Positions: positionsToProto(a.Positions), HeartbeatIntervalMs: uint32(n.cfg.GroupHeartbeatInterval.Milliseconds())}
}

func (s *consumerServer) GroupHeartbeat(ctx context.Context, req *geologv1.GroupHeartbeatRequest) (*geologv1.GroupAssignment, error) {
	resp, err := s.node.groupHeartbeat(ctx, req)
	return resp, err
}

func (n *Node) groupHeartbeat(ctx context.Context, req *geologv1.GroupHeartbeatRequest) (*geologv1.GroupAssignment, error) {
	if err := checkCursorName(req.GetGroup()); err != nil {
		return nil, err
	}
	if len(req.GetOwnedRanges()) > cursors.RangesMax {
		return nil, apierr.New(apierr.InvalidArgument, "%d owned ranges, at most %d", len(req.GetOwnedRanges()), cursors.RangesMax)
	}
	hreq := cursors.HeartbeatRequest{Group: req.GetGroup(), MemberID: req.GetMemberId(), MemberEpoch: req.GetMemberEpoch(),
		Owned: slices.Clone(req.GetOwnedRanges())}
	cr, err := n.cursors.rangeFor(ctx, hreq.Group)
	if err != nil {
		return nil, err
	}
	v, err := n.coordinate(ctx, cr, func(b *cursors.Batch, c *cursors.Coordinator) (any, error) {
		a, err := c.Heartbeat(b, hreq)
		return n.assignmentToProto(a), err
	}, func(ctx context.Context, c geologv1.ConsumerClient) (any, error) { return c.GroupHeartbeat(ctx, req) })
	if err != nil {
		return nil, err
	}
	return v.(*geologv1.GroupAssignment), nil
}

func (s *consumerServer) LeaveGroup(ctx context.Context, req *geologv1.LeaveGroupRequest) (*geologv1.LeaveGroupResponse, error) {
	if err := checkCursorName(req.GetGroup()); err != nil {
		return nil, err
	}
	cr, err := s.node.cursors.rangeFor(ctx, req.GetGroup())
	if err != nil {
		return nil, err
	}
	lreq := cursors.LeaveRequest{Group: req.GetGroup(), MemberID: req.GetMemberId(), MemberEpoch: req.GetMemberEpoch(), Temporary: req.GetTemporary()}
	_, err = s.node.coordinate(ctx, cr, func(b *cursors.Batch, c *cursors.Coordinator) (any, error) {
		return &geologv1.LeaveGroupResponse{}, c.Leave(b, lreq)
	}, func(ctx context.Context, c geologv1.ConsumerClient) (any, error) { return c.LeaveGroup(ctx, req) })
	if err != nil {
		return nil, err
	}
	return &geologv1.LeaveGroupResponse{}, nil
}

func (s *consumerServer) DeleteGroup(ctx context.Context, req *geologv1.DeleteGroupRequest) (*geologv1.DeleteGroupResponse, error) {
	if err := checkCursorName(req.GetGroup()); err != nil {
		return nil, err
	}
	cr, err := s.node.cursors.rangeForRead(ctx, req.GetGroup(), true)
	if errors.Is(err, errNoCursorStream) {
		err = apierr.New(apierr.GroupNotFound, "no group or cursor %q", req.GetGroup())
	}
	if err != nil {
		return nil, err
	}
	v, err := s.node.coordinate(ctx, cr, func(b *cursors.Batch, _ *cursors.Coordinator) (any, error) {
		n, err := b.Delete(req.GetGroup())
		return &geologv1.DeleteGroupResponse{PositionsDeleted: uint32(n)}, err
	}, func(ctx context.Context, c geologv1.ConsumerClient) (any, error) { return c.DeleteGroup(ctx, req) })
	if err != nil {
		return nil, err
	}
	return v.(*geologv1.DeleteGroupResponse), nil
}
