package regionsvc

import (
	"context"
	"errors"
	"math"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// producedAppend validates an append in the batch form (AppendRequest.batch:
// a frame the producer built) in place and admits it (admitAppendBytes).
// The frame becomes the op's frame as it came: no record is decoded into a
// message or encoded again, and nothing is allocated per record. An append
// that carries neither records nor a batch is refused here as EMPTY_BATCH.
func (n *Node) producedAppend(ctx context.Context, req *geologv1.AppendRequest, keys keyRouter, compacted, streamed bool) (*appendOp, error) {
	frame := req.GetBatch()
	switch {
	case len(frame) == 0:
		return nil, apierr.New(apierr.EmptyBatch, "append to %s/%d carries no records", req.GetStream(), req.GetRange())
	case len(req.GetRecords()) > 0:
		return nil, apierr.New(apierr.InvalidArgument, "append carries both records and a batch")
	case len(frame) > n.cfg.BatchBytesMax:
		return nil, apierr.New(apierr.BatchTooLarge, "batch is %d bytes, over the maximum of %d", len(frame), n.cfg.BatchBytesMax)
	}
	// The frame is the request's own: proto.Unmarshal copies a bytes field
	// out of gRPC's (pooled) receive buffer, so the replica may stamp it
	// in place (batch.Patch) and keep it.
	h, err := n.checkProduced(req, frame, keys, compacted)
	if err != nil {
		return nil, err
	}
	if err := n.admitAppendBytes(ctx, len(frame), streamed); err != nil {
		return nil, err
	}
	return &appendOp{
		producerID:   h.ProducerID,
		baseSequence: h.BaseSequence,
		recordCount:  h.RecordCount,
		frame:        frame,
		held:         int64(len(frame)),
	}, nil
}

// checkProduced checks a produced frame (batch.ValidateProduced) and its
// records against the rules and bounds of batchRecords, and its header
// against the request's producer fields. Errors are *apierr.Error; a frame
// that is not well formed is INVALID_ARGUMENT wrapping the batch error
// (batch.ErrShort, batch.ErrCorrupt, batch.ErrNotProduced).
func (n *Node) checkProduced(req *geologv1.AppendRequest, frame []byte, keys keyRouter, compacted bool) (batch.Header, error) {
	// The record count is read before the records are walked (the CRC and
	// the walk then vouch for it): a frame over the bound costs no walk.
	if h, err := batch.PeekHeader(frame); err == nil && h.RecordCount > recordsPerBatchMax {
		return batch.Header{}, apierr.New(apierr.BatchTooLarge, "%d records in one batch, over the maximum of %d", h.RecordCount, recordsPerBatchMax)
	}
	rc := recordChecker{n: n, req: req, keys: keys, compacted: compacted}
	h, err := batch.ValidateProduced(frame, rc.check)
	if err != nil {
		var refused *apierr.Error // a record's rule (recordChecker)
		if errors.As(err, &refused) {
			return batch.Header{}, refused
		}
		return batch.Header{}, apierr.Wrap(apierr.InvalidArgument, err, "append batch")
	}
	switch {
	case h.RecordCount == 0:
		return batch.Header{}, apierr.New(apierr.EmptyBatch, "append to %s/%d carries no records", req.GetStream(), req.GetRange())
	case h.ProducerID != req.GetProducerId() || h.BaseSequence != req.GetBaseSequence():
		return batch.Header{}, apierr.New(apierr.InvalidArgument, "batch is under producer %d from sequence %d, the request under producer %d from sequence %d",
			h.ProducerID, h.BaseSequence, req.GetProducerId(), req.GetBaseSequence())
	case h.ProducerID == 0 && h.BaseSequence != 0:
		return batch.Header{}, apierr.New(apierr.InvalidArgument, "batch has base_sequence %d without a producer id", h.BaseSequence)
	case h.BaseSequence > math.MaxUint64-uint64(h.RecordCount):
		return batch.Header{}, apierr.New(apierr.InvalidArgument, "base_sequence %d overflows", h.BaseSequence)
	}
	return h, nil
}

// recordChecker applies batchRecords' rules to the records of a produced
// frame as batch.ValidateProduced shows them.
type recordChecker struct {
	n         *Node
	req       *geologv1.AppendRequest
	keys      keyRouter
	compacted bool
	headers   int // record headers seen so far
}

func (c *recordChecker) check(i int, r batch.RecordView) error {
	if r.HeaderCount > headersPerRecordMax {
		return apierr.New(apierr.InvalidArgument, "record %d has %d headers, over the maximum of %d", i, r.HeaderCount, headersPerRecordMax)
	}
	if c.headers += r.HeaderCount; c.headers > headersPerBatchMax {
		return apierr.New(apierr.BatchTooLarge, "over %d record headers in one batch", headersPerBatchMax)
	}
	if len(r.Key) > 0 {
		if !c.keys.owns(c.req.GetRange(), r.Key) {
			home := c.keys.rangeOf(r.Key)
			return apierr.New(apierr.InvalidArgument, "record %d: its key belongs to range %d of %s, not range %d", i, home, c.req.GetStream(), c.req.GetRange())
		}
	} else if c.compacted {
		return apierr.New(apierr.KeyRequired, "record %d has no key: the stream is compacted by key", i)
	}
	if r.PayloadBytes > c.n.cfg.RecordBytesMax {
		return apierr.New(apierr.RecordTooLarge, "record %d is %d bytes, over the maximum of %d", i, r.PayloadBytes, c.n.cfg.RecordBytesMax)
	}
	return nil
}

// appendRecordCount returns the records an append carries, in either form;
// a batch's count is read from its header unchecked (for tracing only).
func appendRecordCount(req *geologv1.AppendRequest) int {
	if len(req.GetRecords()) > 0 {
		return len(req.GetRecords())
	}
	h, err := batch.PeekHeader(req.GetBatch())
	if err != nil {
		return 0
	}
	return int(h.RecordCount)
}
