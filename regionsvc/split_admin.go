package regionsvc

import (
	"context"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/homing"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// Admin.SplitRange (docs/split.md). A split runs on the catalogue leader
// of the range's home region, in four steps, each of which a retry of the
// same split repeats harmlessly:
//
//  1. reserve the stream's next map version in the catalogue
//     (split_reserve.go): a racing split of the stream gets
//     SPLIT_IN_PROGRESS;
//  2. write the split marker into the parent's log through its range
//     leader's append path (lease and epoch checks included), here or on
//     the range leader by a forwarded SplitRange marked as the marker
//     step; a log that holds the reserved marker already answers with its
//     offset;
//  3. with homing on, home the children in the lease store where the
//     parent is, at the epoch the marker was admitted under (one
//     transaction, homing.Store.SplitHomes);
//  4. commit the catalogue's split record (split_apply.go): every node
//     opens the children and routes by the new map.
//
// A node that does not lead the catalogue forwards the request to the one
// that does, and answers once its own catalogue applied the split.

// splitStepKey marks a SplitRange forwarded to the parent's range leader
// for step 2 only (the marker of the split the catalogue reserved).
const splitStepKey = "x-geolog-split-step"

// splitStepMarker is splitStepKey's value for step 2.
const splitStepMarker = "marker"

// splitMarkerAttemptsMax bounds the range leaders step 2 is tried at
// (leaderships move while a split runs).
const splitMarkerAttemptsMax = 8

// SplitRange splits a range at a hash boundary.
func (s *adminServer) SplitRange(ctx context.Context, req *geologv1.SplitRangeRequest) (*geologv1.SplitRangeResponse, error) {
	n := s.node
	if !n.replicated() {
		return nil, apierr.New(apierr.Unavailable, "the node is not open")
	}
	if isSplitMarkerStep(ctx) {
		res, err := n.splitMarkerReserved(ctx, req.GetStream(), req.GetRange())
		if err != nil {
			return nil, err
		}
		return splitResponse(res), nil
	}
	res, err := n.splitRange(ctx, req.GetStream(), req.GetRange(), req.GetAt())
	if err != nil {
		return nil, err
	}
	return splitResponse(res), nil
}

func splitResponse(res splitResult) *geologv1.SplitRangeResponse {
	d := res.decision
	return &geologv1.SplitRangeResponse{SplitOffset: res.offset, Epoch: res.epoch, At: d.At, Left: d.Left, Right: d.Right, RangeMapVersion: d.MapVersion}
}

func isSplitMarkerStep(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get(splitStepKey)
	return isForwarded(ctx) && len(v) == 1 && v[0] == splitStepMarker
}

// forwardSplit runs the split on the catalogue leader and waits until this
// node applied it.
func (n *Node) forwardSplit(ctx context.Context, stream string, r uint32, at uint64) (splitResult, error) {
	var resp *geologv1.SplitRangeResponse
	err := n.forwardToCatalogueLeader(ctx, func(ctx context.Context, conn *grpc.ClientConn) error {
		var err error
		resp, err = geologv1.NewAdminClient(conn).SplitRange(ctx, &geologv1.SplitRangeRequest{Stream: stream, Range: r, At: at})
		return err
	})
	if err != nil {
		return splitResult{}, err
	}
	var dec batch.Split
	err = n.waitCatalogue(ctx, stream, "split", func(st *streamState, ok bool) (bool, error) {
		if !ok {
			return false, apierr.New(apierr.StreamNotFound, "stream %q was deleted while it split", stream)
		}
		m := st.spec.rangeMap()
		if m.Version < resp.GetRangeMapVersion() {
			return false, nil
		}
		p, _ := m.Get(r)
		dec = batch.Split{MapVersion: resp.GetRangeMapVersion(), Parent: r, HashStart: p.HashStart, HashEnd: p.HashEnd,
			At: resp.GetAt(), Left: resp.GetLeft(), Right: resp.GetRight()}
		return true, nil
	})
	return splitResult{offset: resp.GetSplitOffset(), epoch: resp.GetEpoch(), decision: dec}, err
}

// splitMarker is step 2: the reserved split dec's marker in the parent's
// log, written by its range leader (here or by a forwarded request).
func (n *Node) splitMarker(ctx context.Context, stream string, dec batch.Split) (splitResult, error) {
	var last error
	for attempt := 0; attempt < splitMarkerAttemptsMax; attempt++ {
		if attempt > 0 {
			select {
			case <-time.After(time.Duration(attempt) * 50 * time.Millisecond):
			case <-ctx.Done():
				return splitResult{}, apierr.Wrap(apierr.Timeout, ctx.Err(), "split of stream %q range %d: %v", stream, dec.Parent, last)
			}
		}
		st, err := n.lookupStream(ctx, stream)
		if err != nil {
			return splitResult{}, err
		}
		d := st.ranges[dec.Parent]
		lead := d.rep.LeaderID()
		var res splitResult
		switch {
		case lead == n.cfg.NodeID:
			res, err = n.splitMarkerHere(ctx, stream, dec)
		case lead != 0 && n.peerAddr(lead) != "":
			res, err = n.forwardSplitMarker(ctx, n.peerAddr(lead), stream, dec)
		default:
			err = apierr.New(apierr.Unavailable, "stream %q range %d has no leader yet", stream, dec.Parent)
		}
		if err == nil || !apierr.As(err).Retriable {
			return res, err
		}
		last = err
	}
	return splitResult{}, last
}

// forwardSplitMarker asks the range leader at addr for step 2.
func (n *Node) forwardSplitMarker(ctx context.Context, addr, stream string, dec batch.Split) (splitResult, error) {
	conn, err := n.peerConn(addr)
	if err != nil {
		return splitResult{}, apierr.Wrap(apierr.Unavailable, err, "forward to %s", addr)
	}
	fctx := metadata.AppendToOutgoingContext(ctx, forwardedKey, "1", splitStepKey, splitStepMarker)
	resp, err := geologv1.NewAdminClient(conn).SplitRange(fctx, &geologv1.SplitRangeRequest{Stream: stream, Range: dec.Parent, At: dec.At})
	if err != nil {
		return splitResult{}, rpcErr(err)
	}
	if resp.GetRangeMapVersion() != dec.MapVersion || resp.GetLeft() != dec.Left || resp.GetAt() != dec.At {
		return splitResult{}, apierr.New(apierr.Internal, "range leader %s wrote another split", addr)
	}
	return splitResult{offset: resp.GetSplitOffset(), epoch: resp.GetEpoch(), decision: dec}, nil
}

// splitMarkerReserved is step 2 as forwarded to this node: the split is
// the one this node's catalogue holds reserved for range r (it waits
// until its catalogue has applied the reservation).
func (n *Node) splitMarkerReserved(ctx context.Context, stream string, r uint32) (splitResult, error) {
	var dec batch.Split
	err := n.waitCatalogue(ctx, stream, "split reservation", func(st *streamState, ok bool) (bool, error) {
		if !ok {
			return false, apierr.New(apierr.StreamNotFound, "stream %q not found", stream)
		}
		var held bool
		dec, held = st.spec.reservedSplit()
		return held && dec.Parent == r, nil
	})
	if err != nil {
		return splitResult{}, err
	}
	return n.splitMarkerHere(ctx, stream, dec)
}

// splitMarkerHere writes dec's marker through this node, the parent's
// range leader in its home region. A log that holds it already answers
// with its offset; one that holds another split's is an internal error
// (the reservation is what keeps that from happening).
func (n *Node) splitMarkerHere(ctx context.Context, stream string, dec batch.Split) (splitResult, error) {
	st, err := n.lookupStream(ctx, stream)
	if err != nil {
		return splitResult{}, err
	}
	d := st.ranges[dec.Parent]
	if !d.isHome() {
		return splitResult{}, n.notHome(d)
	}
	epoch, err := n.admit(d)
	if err != nil {
		return splitResult{}, err
	}
	var have struct {
		dec            batch.Split
		offset         uint64
		applied, inLog bool
		err            error
	}
	if err := d.exec(ctx, func() {
		have.dec, have.offset, have.applied, have.err = d.rep.SplitApplied()
		have.inLog = d.rep.SplitPending()
	}); err != nil {
		return splitResult{}, err
	}
	switch {
	case have.err != nil:
		return splitResult{}, apierr.Wrap(apierr.Internal, have.err, "stream %q range %d", stream, dec.Parent)
	case have.applied && have.dec == dec:
		return splitResult{offset: have.offset, epoch: epoch, decision: dec}, nil
	case have.applied:
		return splitResult{}, apierr.New(apierr.Internal, "stream %q range %d holds the marker of another split (version %d)", stream, dec.Parent, have.dec.MapVersion)
	case have.inLog:
		return splitResult{}, apierr.New(apierr.Unavailable, "stream %q range %d: a split marker is in its log, not yet applied", stream, dec.Parent)
	}
	return d.proposeSplit(ctx, epoch, dec)
}

// splitHomes is step 3: with homing on, the children's home records,
// where the parent is homed, at the epoch res was admitted under.
func (n *Node) splitHomes(ctx context.Context, stream string, res splitResult) error {
	if n.homing == nil {
		return nil
	}
	key := homing.RangeKey{Stream: stream, Range: res.decision.Parent}
	children := [2]uint32{res.decision.Left, res.decision.Right}
	if _, err := n.homing.homes.SplitHomes(ctx, key, res.epoch, children, n.cfg.Now().UnixNano()); err != nil {
		return apierr.Wrap(apierr.As(homingErr(err)).Code, err, "stream %q range %d split at offset %d; its children's homes", stream, key.Range, res.offset)
	}
	return nil
}
