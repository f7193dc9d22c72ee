package regionsvc

import (
	"context"
	"errors"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/cursors"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// fetchBehindWaitMax bounds how long a fetch waits for this node's copy of
// the group to reach the member's epoch before answering UNAVAILABLE.
const fetchBehindWaitMax = 5 * time.Second

// Fetch streams a range to a member of a group (consumer.proto): a
// Subscribe whose every reply is preceded by the fencing check against
// this node's copy of the group, and which ends as soon as that copy shows
// the member lost the range.
func (s *consumerServer) Fetch(req *geologv1.FetchRequest, stream geologv1.Consumer_FetchServer) error {
	return s.node.fetch(stream.Context(), req, stream.Send)
}

func (n *Node) fetch(ctx context.Context, req *geologv1.FetchRequest, send func(*geologv1.FetchResponse) error) error {
	if err := checkCursorName(req.GetGroup()); err != nil {
		return err
	}
	rd, err := n.rangeOf(ctx, req.GetStream(), req.GetRange())
	if err == nil {
		err = rd.readable()
	}
	if err != nil {
		return err
	}
	cr, err := n.cursors.rangeForRead(ctx, req.GetGroup(), true)
	if errors.Is(err, errNoCursorStream) {
		return apierr.New(apierr.UnknownMember, "member %q is not a member of group %q; join again", req.GetMemberId(), req.GetGroup())
	}
	if err != nil {
		return err
	}
	if e := cr.d.relearning(); e != nil {
		return e // its group state may be older than one it fenced on
	}
	check := func() error {
		var err error
		cr.read(func(s *cursors.State) {
			err = s.CheckFetch(req.GetGroup(), req.GetMemberId(), req.GetMemberEpoch(), req.GetStream(), req.GetRange())
		})
		return err
	}
	if err := waitFetchCheck(ctx, cr, check); err != nil {
		return err
	}
	_, maxBytes := clampRead(0, req.GetMaxBytes())
	lim := readLimits{maxRecords: readRecordsDefault, maxBytes: maxBytes, frames: req.GetWantFrames()}
	next := req.GetFromOffset()
	for {
		changed, fenced := rd.changed(), cr.appliedChanged()
		if err := check(); err != nil && !errors.Is(err, cursors.ErrBehind) {
			return err
		}
		out, after, err := rd.read(nil, next, lim)
		if err != nil {
			return err
		}
		if out.count > 0 {
			next = after
			if err := send(&geologv1.FetchResponse{Records: out.recs, Frames: out.frames, NextOffset: next, TailOffset: rd.readTail()}); err != nil {
				return err
			}
			continue
		}
		if after > next {
			// Holes only (a compacted stretch): past them, so that a
			// split range's end is reached after them.
			next = after
			continue
		}
		select {
		case <-changed:
		case <-fenced:
		case <-ctx.Done():
			return apierr.As(ctx.Err())
		case <-n.closing:
			return apierr.New(apierr.ShuttingDown, "node is shutting down")
		}
	}
}

// waitFetchCheck waits until this node's copy of the group can judge the
// request (it reached the member's epoch), then returns its verdict.
func waitFetchCheck(ctx context.Context, cr *cursorRange, check func() error) error {
	wctx, cancel := context.WithTimeout(ctx, fetchBehindWaitMax)
	defer cancel()
	for {
		ch := cr.appliedChanged()
		err := check()
		if !errors.Is(err, cursors.ErrBehind) {
			return err
		}
		select {
		case <-ch:
		case <-wctx.Done():
			if ctx.Err() != nil {
				return apierr.As(ctx.Err())
			}
			return apierr.New(apierr.Unavailable, "this node's copy of the group has not reached the member's epoch yet (it lags the coordinator); retry here or at another node")
		}
	}
}
