package regionsvc

import (
	"context"
	"errors"
	"io"
	"math"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/internal/appendwire"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Bounds on requests.
const (
	// streamInflightMax bounds the unanswered requests of one AppendStream.
	streamInflightMax = 1024
	// minOffsetWaitMax bounds a min_offset read without a deadline.
	minOffsetWaitMax = 30 * time.Second
)

// logServer implements geologv1.LogServer on a Node. It returns plain
// errors; the server's interceptors (rpcerr) map them to statuses.
type logServer struct {
	geologv1.UnimplementedLogServer
	node *Node
}

// prepareAppend validates req and encodes its frame, within the node's
// bounds: the principal's quota (its request too when streamed: a unary
// request's was taken as it arrived) and the bytes of appends in flight,
// which the op holds until it is answered (op.held). Errors are
// *apierr.Error.
func (n *Node) prepareAppend(ctx context.Context, req *geologv1.AppendRequest, streamed bool) (*rangeDriver, *appendOp, error) {
	if err := appendwire.Over(req); err != nil {
		return nil, nil, err
	}
	rd, keys, err := n.rangeAndCount(ctx, req.GetStream(), req.GetRange())
	if err != nil {
		return nil, nil, err
	}
	if isInternalStream(req.GetStream()) {
		return nil, nil, apierr.New(apierr.PermissionDenied, "stream %q is the node's own: use the Consumer service", req.GetStream())
	}
	if !rd.isHome() {
		return nil, nil, n.notHome(rd)
	}
	epoch, err := n.admit(rd)
	if err != nil {
		return nil, nil, err
	}
	var op *appendOp
	if len(req.GetBatch()) > 0 || len(req.GetRecords()) == 0 {
		op, err = n.producedAppend(ctx, req, keys, rd.cfg.compaction != nil, streamed)
	} else {
		op, err = n.encodedAppend(ctx, req, keys, rd.cfg.compaction != nil, streamed)
	}
	if err != nil {
		return nil, nil, err
	}
	op.epoch = epoch
	return rd, op, nil
}

// encodedAppend validates the records of an append in the compatibility
// form (AppendRequest.records), admits it (admitAppendBytes) and encodes
// its frame.
func (n *Node) encodedAppend(ctx context.Context, req *geologv1.AppendRequest, keys keyRouter, compacted, streamed bool) (*appendOp, error) {
	recs := req.GetRecords()
	if len(recs) > recordsPerBatchMax {
		return nil, apierr.New(apierr.BatchTooLarge, "%d records in one batch, over the maximum of %d", len(recs), recordsPerBatchMax)
	}
	if req.GetProducerId() != 0 && req.GetBaseSequence() > math.MaxUint64-uint64(len(recs)) {
		return nil, apierr.New(apierr.InvalidArgument, "base_sequence %d overflows", req.GetBaseSequence())
	}
	brecs, size, err := n.batchRecords(req, keys, compacted)
	if err != nil {
		return nil, err
	}
	if err := n.admitAppendBytes(ctx, size, streamed); err != nil {
		return nil, err
	}
	h := batch.Header{Type: batch.TypeData}
	if req.GetProducerId() != 0 {
		h.ProducerID = req.GetProducerId()
		h.BaseSequence = req.GetBaseSequence()
	}
	frame := batch.Encode(make([]byte, 0, size), h, brecs)
	return &appendOp{
		producerID:   h.ProducerID,
		baseSequence: h.BaseSequence,
		recordCount:  uint32(len(recs)),
		frame:        frame,
		held:         int64(size),
	}, nil
}

// batchRecords validates an append's records, each of whose keys must
// belong to the range (an empty key goes anywhere; a compacted stream
// takes no keyless records), and returns them as batch records with the
// encoded batch's size.
func (n *Node) batchRecords(req *geologv1.AppendRequest, keys keyRouter, compacted bool) ([]batch.Record, int, error) {
	recs := req.GetRecords()
	brecs := make([]batch.Record, len(recs))
	size := batch.HeaderSize
	headers, tombstones := 0, 0
	for i, r := range recs {
		if len(r.GetHeaders()) > headersPerRecordMax {
			return nil, 0, apierr.New(apierr.InvalidArgument, "record %d has %d headers, over the maximum of %d", i, len(r.GetHeaders()), headersPerRecordMax)
		}
		if headers += len(r.GetHeaders()); headers > headersPerBatchMax {
			return nil, 0, apierr.New(apierr.BatchTooLarge, "over %d record headers in one batch", headersPerBatchMax)
		}
		if k := r.GetKey(); len(k) > 0 {
			if !keys.owns(req.GetRange(), k) {
				home := keys.rangeOf(k)
				return nil, 0, apierr.New(apierr.InvalidArgument, "record %d: its key belongs to range %d of %s, not range %d", i, home, req.GetStream(), req.GetRange())
			}
		}
		recBytes := len(r.GetKey()) + len(r.GetValue())
		var hdrs []batch.RecordHeader
		if len(r.GetHeaders()) > 0 {
			hdrs = make([]batch.RecordHeader, len(r.GetHeaders()))
			for j, h := range r.GetHeaders() {
				hdrs[j] = batch.RecordHeader{Key: h.GetKey(), Value: h.GetValue()}
				recBytes += len(h.GetKey()) + len(h.GetValue())
			}
		}
		if recBytes > n.cfg.RecordBytesMax {
			return nil, 0, apierr.New(apierr.RecordTooLarge, "record %d is %d bytes, over the maximum of %d", i, recBytes, n.cfg.RecordBytesMax)
		}
		if err := checkRecordForCleanup(i, r, compacted); err != nil {
			return nil, 0, err
		}
		brecs[i] = batch.Record{Key: r.GetKey(), Value: r.GetValue(), Headers: hdrs, ProducerTimeUnixNanos: r.GetProducerTimeUnixNanos(),
			Tombstone: r.GetTombstone()}
		size += batch.EncodedRecordSize(brecs[i])
		if r.GetTombstone() {
			tombstones++
		}
		if size > n.cfg.BatchBytesMax {
			return nil, 0, apierr.New(apierr.BatchTooLarge, "batch is over the maximum of %d bytes", n.cfg.BatchBytesMax)
		}
	}
	if tombstones > 0 {
		// In a frame holding a tombstone every record carries an
		// attributes byte; EncodedRecordSize counted the tombstones' only.
		size += len(recs) - tombstones
		if size > n.cfg.BatchBytesMax {
			return nil, 0, apierr.New(apierr.BatchTooLarge, "batch is over the maximum of %d bytes", n.cfg.BatchBytesMax)
		}
	}
	return brecs, size, nil
}

// admitAppendBytes takes an append of size bytes from the principal's
// quota and from the node's budget of appends in flight (released when
// the append is answered), or refuses it with OVERLOADED.
func (n *Node) admitAppendBytes(ctx context.Context, size int, streamed bool) error {
	l := n.limits
	requests := int64(0)
	if streamed {
		requests = 1
	}
	p := l.quotas.principal(ctx)
	if wait := l.quotas.take(p, requests, int64(size)); wait > 0 {
		return l.overloaded(ctx, "quota", wait, "%s is over its quota; retry in %v", p, wait)
	}
	if !l.appends.tryAcquire(int64(size)) {
		return l.overloaded(ctx, "appends", jittered(overloadRetryAfter), "node holds %d bytes of appends in flight", l.appends.inUse())
	}
	return nil
}

// appendAsync validates and submits req; done is called exactly once, from
// some goroutine, with the reply (errors ride in its Error field).
func (n *Node) appendAsync(ctx context.Context, req *geologv1.AppendRequest, streamed bool, done func(*geologv1.AppendResponse)) {
	id, received := req.GetRequestId(), time.Now()
	tr := n.startAppendTrace(ctx, req.GetStream(), req.GetRange(), appendRecordCount(req), streamed) // nil: tracing off
	rd, op, err := n.prepareAppend(ctx, req, streamed)
	if err != nil {
		n.metrics.appendResult(ctx, appendResult{err: err})
		tr.answered(appendResult{err: err})
	}
	if err != nil {
		done(&geologv1.AppendResponse{RequestId: id, Error: rpcerr.DetailOf(err)})
		return
	}
	op.trace, op.receivedAt = tr, received
	op.reply = func(r appendResult) {
		var timing *geologv1.AppendTiming
		if r.err == nil && !r.duplicate && !r.committedAt.IsZero() {
			st := stagesOf(op.receivedAt, op.queuedAt, op.proposedAt, r.durableAt, r.committedAt, time.Now())
			n.metrics.appendStagesDone(st)
			tr.stages(st)
			if req.GetWantTiming() {
				timing = st.timing()
			}
		}
		tr.answered(r)
		n.limits.appends.release(op.held)
		n.metrics.appendResult(ctx, r)
		if r.err != nil {
			done(&geologv1.AppendResponse{RequestId: id, Error: rpcerr.DetailOf(n.withForkPoint(rd, r.err))})
			return
		}
		done(&geologv1.AppendResponse{
			RequestId:           id,
			BaseOffset:          r.baseOffset,
			RecordCount:         r.recordCount,
			Epoch:               r.epoch,
			AppendTimeUnixNanos: r.appendTimeUnixNanos,
			Duplicate:           r.duplicate,
			Timing:              timing,
		})
	}
	rd.submit(ctx, op)
}

func (s *logServer) Append(ctx context.Context, req *geologv1.AppendRequest) (*geologv1.AppendResponse, error) {
	ch := make(chan *geologv1.AppendResponse, 1)
	s.node.appendAsync(ctx, req, false, func(r *geologv1.AppendResponse) { ch <- r })
	select {
	case r := <-ch:
		if r.Error != nil {
			return nil, rpcerr.FromDetail(r.Error)
		}
		return r, nil
	case <-ctx.Done():
		// The append may still complete; an idempotent retry resolves it.
		return nil, apierr.Wrap(apierr.Timeout, ctx.Err(), "append")
	}
}

func (s *logServer) AppendStream(stream geologv1.Log_AppendStreamServer) error {
	ctx := stream.Context()
	// replies never blocks a driver: at most streamInflightMax requests are
	// unanswered (the sem), and replies has room for all of them.
	replies := make(chan *geologv1.AppendResponse, streamInflightMax)
	sem := make(chan struct{}, streamInflightMax)
	recvErr := make(chan error, 1)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				recvErr <- ctx.Err()
				return
			}
			s.node.appendAsync(ctx, req, true, func(r *geologv1.AppendResponse) { replies <- r })
		}
	}()
	for {
		select {
		case r := <-replies:
			<-sem
			if err := stream.Send(r); err != nil {
				return err
			}
		case <-s.node.closing:
			// Answer what is outstanding (every driver answers all it holds
			// as it stops), then end the stream so the server can stop.
			if err := drainReplies(ctx, stream, replies, sem); err != nil {
				return err
			}
			return apierr.New(apierr.ShuttingDown, "node is shutting down")
		case err := <-recvErr:
			if ctx.Err() != nil {
				// The client cancelled the call or went away: say so
				// (CANCELED or DEADLINE_EXCEEDED), as gRPC does for a
				// unary call; it is not the server's failure.
				return status.FromContextError(ctx.Err()).Err()
			}
			if !errors.Is(err, io.EOF) {
				return err
			}
			// The client half-closed: answer what is outstanding, then end.
			return drainReplies(ctx, stream, replies, sem)
		}
	}
}

// drainReplies sends replies until no request is outstanding.
func drainReplies(ctx context.Context, stream geologv1.Log_AppendStreamServer, replies <-chan *geologv1.AppendResponse, sem chan struct{}) error {
	for len(sem) > 0 {
		select {
		case r := <-replies:
			<-sem
			if err := stream.Send(r); err != nil {
				return err
			}
		case <-ctx.Done():
			return apierr.As(ctx.Err())
		}
	}
	return nil
}

func (s *logServer) Read(ctx context.Context, req *geologv1.ReadRequest) (*geologv1.ReadResponse, error) {
	rd, err := s.node.readRangeOf(ctx, req.GetStream(), req.GetRange(), req.Key)
	if err != nil {
		return nil, err
	}
	// Only reads that wait get a bound on the wait; a local read (the common
	// case) takes no timer.
	wctx := ctx
	if c := req.GetConsistency(); c == geologv1.Consistency_CONSISTENCY_HOME || c == geologv1.Consistency_CONSISTENCY_MIN_OFFSET {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			wctx, cancel = context.WithTimeout(ctx, minOffsetWaitMax)
			defer cancel()
		}
	}
	// homeTail is the home's confirmed tail, for a home read (readpast.go).
	var homeTail *uint64
	switch req.GetConsistency() {
	case geologv1.Consistency_CONSISTENCY_UNSPECIFIED, geologv1.Consistency_CONSISTENCY_LOCAL:
	case geologv1.Consistency_CONSISTENCY_HOME:
		md, _ := metadata.FromIncomingContext(ctx)
		ask := homeTailAsk{forwarded: len(md.Get(forwardedKey)) > 0, final: len(md.Get(finalTailKey)) > 0}
		tail, err := s.node.homeTailFor(wctx, rd, ask)
		if err != nil {
			return nil, err
		}
		if ask.forwarded || ask.final {
			// Another node asks for the confirmed tail only.
			return &geologv1.ReadResponse{NextOffset: req.GetFromOffset(), StartOffset: rd.store.StartOffset(), TailOffset: tail}, nil
		}
		if err := rd.waitCommitted(wctx, tail); err != nil {
			return nil, err
		}
		homeTail = &tail
	case geologv1.Consistency_CONSISTENCY_MIN_OFFSET:
		if err := rd.waitCommitted(wctx, req.GetMinOffset()); err != nil {
			return nil, err
		}
	default:
		return nil, apierr.New(apierr.InvalidArgument, "unknown consistency %d", req.GetConsistency())
	}
	maxRecords, maxBytes := clampRead(req.GetMaxRecords(), req.GetMaxBytes())
	if err := s.node.holdReadReply(ctx, maxBytes); err != nil {
		return nil, err
	}
	lim := readLimits{maxRecords: maxRecords, maxBytes: maxBytes, frames: req.GetWantFrames()}
	var out readOut
	var next uint64
	if homeTail != nil {
		out, next, err = rd.readAtHomeTail(req.Key, req.GetFromOffset(), *homeTail, lim)
	} else {
		out, next, err = s.node.readLocal(wctx, rd, req.Key, req.GetFromOffset(), lim)
	}
	if err != nil {
		return nil, err
	}
	s.node.limits.quotas.charge(s.node.limits.quotas.principal(ctx), out.quotaBytes())
	return &geologv1.ReadResponse{
		Records:     out.recs,
		Frames:      out.frames,
		NextOffset:  next,
		StartOffset: rd.store.StartOffset(),
		TailOffset:  rd.readTail(),
	}, nil
}

func (s *logServer) Subscribe(req *geologv1.SubscribeRequest, stream geologv1.Log_SubscribeServer) error {
	return s.node.subscribe(req, stream)
}

func (s *logServer) CreateStream(ctx context.Context, req *geologv1.CreateStreamRequest) (*geologv1.CreateStreamResponse, error) {
	info, err := s.node.createStream(ctx, req)
	if err != nil {
		return nil, err
	}
	return &geologv1.CreateStreamResponse{Stream: info}, nil
}

func (s *logServer) ListStreams(ctx context.Context, req *geologv1.ListStreamsRequest) (*geologv1.ListStreamsResponse, error) {
	return &geologv1.ListStreamsResponse{Streams: s.node.listStreams()}, nil
}

func (s *logServer) DescribeStream(ctx context.Context, req *geologv1.DescribeStreamRequest) (*geologv1.DescribeStreamResponse, error) {
	resp, err := s.node.describeStream(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (s *logServer) DeleteStream(ctx context.Context, req *geologv1.DeleteStreamRequest) (*geologv1.DeleteStreamResponse, error) {
	if err := s.node.deleteStream(ctx, req.GetName()); err != nil {
		return nil, err
	}
	return &geologv1.DeleteStreamResponse{}, nil
}

func (s *logServer) AlterStream(ctx context.Context, req *geologv1.AlterStreamRequest) (*geologv1.AlterStreamResponse, error) {
	spec, err := s.node.alterStream(ctx, req)
	if err != nil {
		return nil, err
	}
	return &geologv1.AlterStreamResponse{Stream: spec.info()}, nil
}
