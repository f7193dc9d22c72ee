package regionsvc

import (
	"context"
	"errors"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/replica"
)

// The orphan log through the Admin API (DESIGN.md "Divergent tails"): a
// fork (multiregion.go, mirrorRange.Fork) moves the records a failed home
// acked but never replicated out of the range's log, with their original
// offsets and epoch; operators list them and republish what they want
// kept (geolog orphans).

// orphanReadRecordsMax bounds one ReadOrphans answer.
const orphanReadRecordsMax = 5000

func (s *adminServer) ListOrphans(ctx context.Context, req *geologv1.ListOrphansRequest) (*geologv1.ListOrphansResponse, error) {
	var resp *geologv1.ListOrphansResponse
	var err error
	switch req.GetScope() {
	case geologv1.OrphanScope_ORPHAN_SCOPE_UNSPECIFIED, geologv1.OrphanScope_ORPHAN_SCOPE_NODE:
		var forks []*geologv1.OrphanFork
		if forks, err = s.node.localOrphans(ctx, req.GetStream()); err == nil {
			resp = &geologv1.ListOrphansResponse{Forks: forks}
		}
	case geologv1.OrphanScope_ORPHAN_SCOPE_CLUSTER:
		resp, err = s.node.clusterOrphans(ctx, req.GetStream())
	default:
		err = apierr.New(apierr.InvalidArgument, "unknown orphan scope %d", req.GetScope())
	}
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// localOrphans lists the forks this node's replicas of the stream hold.
func (n *Node) localOrphans(ctx context.Context, stream string) ([]*geologv1.OrphanFork, error) {
	st, err := n.lookupStream(ctx, stream)
	if err != nil {
		return nil, err
	}
	var forks []*geologv1.OrphanFork
	for r, d := range st.ranges {
		if d.rep == nil {
			continue
		}
		for _, f := range d.rep.Orphans() {
			forks = append(forks, &geologv1.OrphanFork{
				Range: uint32(r), ForkIndex: f.Index, ForkOffset: f.At, Epoch: f.Epoch,
				Records: f.Records, FirstOffset: f.FirstOffset, NextOffset: f.NextOffset,
				Bytes: int64(f.Bytes), TimeUnixNanos: f.TimeUnixNanos,
			})
		}
	}
	return forks, nil
}

func (s *adminServer) ReadOrphans(ctx context.Context, req *geologv1.ReadOrphansRequest) (*geologv1.ReadOrphansResponse, error) {
	resp, err := s.node.readOrphans(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (n *Node) readOrphans(ctx context.Context, req *geologv1.ReadOrphansRequest) (*geologv1.ReadOrphansResponse, error) {
	d, err := n.rangeOf(ctx, req.GetStream(), req.GetRange())
	if err != nil {
		return nil, err
	}
	if d.rep == nil {
		return nil, apierr.New(apierr.Unavailable, "stream %s range %d is not served here: its orphan log is not open", req.GetStream(), req.GetRange())
	}
	var fork *replica.ForkRecord
	for _, f := range d.rep.Orphans() {
		if f.Index == req.GetForkIndex() {
			f := f
			fork = &f
		}
	}
	if fork == nil {
		return nil, apierr.New(apierr.InvalidArgument, "stream %s range %d has no fork at index %d on this node (geolog orphans list)", req.GetStream(), req.GetRange(), req.GetForkIndex())
	}
	from := max(req.GetFromOffset(), fork.FirstOffset)
	resp := &geologv1.ReadOrphansResponse{NextOffset: from, EndOffset: fork.NextOffset}
	if from >= fork.NextOffset {
		resp.NextOffset = fork.NextOffset
		return resp, nil
	}
	maxRecords := int(req.GetMaxRecords())
	if maxRecords <= 0 || maxRecords > orphanReadRecordsMax {
		maxRecords = orphanReadRecordsMax
	}
	frames, err := d.rep.ReadOrphans(fork.Index, from, 4<<20)
	if err != nil {
		if errors.Is(err, replica.ErrOrphansCorrupt) {
			return nil, apierr.New(apierr.Corruption, "orphan log of %s/%d: %v", req.GetStream(), req.GetRange(), err)
		}
		return nil, apierr.New(apierr.Internal, "read the orphan log of %s/%d: %v", req.GetStream(), req.GetRange(), err)
	}
	for len(frames) > 0 && len(resp.Records) < maxRecords {
		size, err := batch.FrameSize(frames)
		if err != nil || size > len(frames) {
			return nil, apierr.New(apierr.Corruption, "orphan log of %s/%d: bad frame: %v", req.GetStream(), req.GetRange(), err)
		}
		h, recs, err := batch.Decode(frames[:size])
		if err != nil {
			return nil, apierr.New(apierr.Corruption, "orphan log of %s/%d: %v", req.GetStream(), req.GetRange(), err)
		}
		frames = frames[size:]
		if h.Type != batch.TypeData {
			continue // a compaction marker: no record of a producer's
		}
		for i, r := range recs {
			off := h.Offset(&recs[i])
			if off < from || len(resp.Records) >= maxRecords {
				continue
			}
			sr := &geologv1.StoredRecord{Offset: off, Key: r.Key, Value: r.Value, ProducerTimeUnixNanos: r.ProducerTimeUnixNanos,
				AppendTimeUnixNanos: h.AppendTimeUnixNanos, Epoch: h.Epoch, Tombstone: r.Tombstone}
			for _, hd := range r.Headers {
				sr.Headers = append(sr.Headers, &geologv1.Header{Key: hd.Key, Value: hd.Value})
			}
			resp.Records = append(resp.Records, sr)
			resp.NextOffset = off + 1
		}
	}
	return resp, nil
}
