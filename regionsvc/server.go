package regionsvc

import (
	"context"
	"errors"
	"io"
	"math"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc/metadata"
)

// Bounds on requests.
const (
	// recordsPerBatchMax bounds the records of one append.
	recordsPerBatchMax = 1 << 17
	// headersPerRecordMax bounds the headers of one record.
	headersPerRecordMax = 256
	// streamInflightMax bounds the unanswered requests of one AppendStream.
	streamInflightMax = 1024
	// minOffsetWaitMax bounds a min_offset read without a deadline.
	minOffsetWaitMax = 30 * time.Second
)

// logServer implements geologv1.LogServer on a Node. Every error it returns
// goes through apierr.ToStatus, here and nowhere else.
type logServer struct {
	geologv1.UnimplementedLogServer
	node *Node
}

// prepareAppend validates req and encodes its frame. Errors are *apierr.Error.
func (n *Node) prepareAppend(ctx context.Context, req *geologv1.AppendRequest) (*rangeDriver, *appendOp, error) {
	rd, err := n.rangeOf(ctx, req.GetStream(), req.GetRange())
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
	recs := req.GetRecords()
	if len(recs) == 0 {
		return nil, nil, apierr.New(apierr.EmptyBatch, "append to %s/%d carries no records", req.GetStream(), req.GetRange())
	}
	if len(recs) > recordsPerBatchMax {
		return nil, nil, apierr.New(apierr.BatchTooLarge, "%d records in one batch, over the maximum of %d", len(recs), recordsPerBatchMax)
	}
	if req.GetProducerId() != 0 && req.GetBaseSequence() > math.MaxUint64-uint64(len(recs)) {
		return nil, nil, apierr.New(apierr.InvalidArgument, "base_sequence %d overflows", req.GetBaseSequence())
	}
	brecs := make([]batch.Record, len(recs))
	size := batch.HeaderSize
	for i, r := range recs {
		if len(r.GetHeaders()) > headersPerRecordMax {
			return nil, nil, apierr.New(apierr.InvalidArgument, "record %d has %d headers, over the maximum of %d", i, len(r.GetHeaders()), headersPerRecordMax)
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
			return nil, nil, apierr.New(apierr.RecordTooLarge, "record %d is %d bytes, over the maximum of %d", i, recBytes, n.cfg.RecordBytesMax)
		}
		if err := checkRecordForCleanup(i, r, rd.cfg.compaction != nil); err != nil {
			return nil, nil, err
		}
		brecs[i] = batch.Record{Key: r.GetKey(), Value: r.GetValue(), Headers: hdrs, ProducerTimeUnixNanos: r.GetProducerTimeUnixNanos(),
			Tombstone: r.GetTombstone()}
		size += batch.EncodedRecordSize(brecs[i])
		if size > n.cfg.BatchBytesMax {
			return nil, nil, apierr.New(apierr.BatchTooLarge, "batch is over the maximum of %d bytes", n.cfg.BatchBytesMax)
		}
	}
	h := batch.Header{Type: batch.TypeData}
	if req.GetProducerId() != 0 {
		h.ProducerID = req.GetProducerId()
		h.BaseSequence = req.GetBaseSequence()
	}
	frame := batch.Encode(make([]byte, 0, size), h, brecs)
	return rd, &appendOp{
		producerID:   h.ProducerID,
		baseSequence: h.BaseSequence,
		recordCount:  uint32(len(recs)),
		frame:        frame,
		epoch:        epoch,
	}, nil
}

// appendAsync validates and submits req; done is called exactly once, from
// some goroutine, with the reply (errors ride in its Error field).
func (n *Node) appendAsync(ctx context.Context, req *geologv1.AppendRequest, done func(*geologv1.AppendResponse)) {
	id := req.GetRequestId()
	rd, op, err := n.prepareAppend(ctx, req)
	if err != nil {
		n.metrics.appendResult(ctx, appendResult{err: err})
	}
	if err != nil {
		done(&geologv1.AppendResponse{RequestId: id, Error: apierr.As(err).Detail()})
		return
	}
	op.reply = func(r appendResult) {
		n.metrics.appendResult(ctx, r)
		if r.err != nil {
			done(&geologv1.AppendResponse{RequestId: id, Error: apierr.As(n.withForkPoint(rd, r.err)).Detail()})
			return
		}
		done(&geologv1.AppendResponse{
			RequestId:           id,
			BaseOffset:          r.baseOffset,
			RecordCount:         r.recordCount,
			Epoch:               r.epoch,
			AppendTimeUnixNanos: r.appendTimeUnixNanos,
			Duplicate:           r.duplicate,
		})
	}
	rd.submit(ctx, op)
}

func (s *logServer) Append(ctx context.Context, req *geologv1.AppendRequest) (*geologv1.AppendResponse, error) {
	ch := make(chan *geologv1.AppendResponse, 1)
	s.node.appendAsync(ctx, req, func(r *geologv1.AppendResponse) { ch <- r })
	select {
	case r := <-ch:
		if r.Error != nil {
			return nil, apierr.ToStatus(apierr.FromDetail(r.Error))
		}
		return r, nil
	case <-ctx.Done():
		// The append may still complete; an idempotent retry resolves it.
		return nil, apierr.ToStatus(apierr.New(apierr.Timeout, "append: %v", ctx.Err()))
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
			s.node.appendAsync(ctx, req, func(r *geologv1.AppendResponse) { replies <- r })
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
			return apierr.ToStatus(apierr.New(apierr.ShuttingDown, "node is shutting down"))
		case err := <-recvErr:
			if !errors.Is(err, io.EOF) {
				return apierr.ToStatus(apierr.As(err))
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
			return apierr.ToStatus(apierr.As(ctx.Err()))
		}
	}
	return nil
}

func (s *logServer) Read(ctx context.Context, req *geologv1.ReadRequest) (*geologv1.ReadResponse, error) {
	rd, err := s.node.readRangeOf(ctx, req.GetStream(), req.GetRange(), req.Key)
	if err != nil {
		return nil, apierr.ToStatus(err)
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
		forwarded := len(md.Get(forwardedKey)) > 0
		tail, err := s.node.homeTail(wctx, rd, forwarded)
		if err != nil {
			return nil, apierr.ToStatus(err)
		}
		if forwarded {
			// Another node asks for the confirmed tail only.
			return &geologv1.ReadResponse{NextOffset: req.GetFromOffset(), StartOffset: rd.store.StartOffset(), TailOffset: tail}, nil
		}
		if err := rd.waitCommitted(wctx, tail); err != nil {
			return nil, apierr.ToStatus(err)
		}
		homeTail = &tail
	case geologv1.Consistency_CONSISTENCY_MIN_OFFSET:
		if err := rd.waitCommitted(wctx, req.GetMinOffset()); err != nil {
			return nil, apierr.ToStatus(err)
		}
	default:
		return nil, apierr.ToStatus(apierr.New(apierr.InvalidArgument, "unknown consistency %d", req.GetConsistency()))
	}
	maxRecords, maxBytes := clampRead(req.GetMaxRecords(), req.GetMaxBytes())
	var recs []*geologv1.StoredRecord
	var next uint64
	if homeTail != nil {
		recs, next, err = rd.readAtHomeTail(req.Key, req.GetFromOffset(), *homeTail, maxRecords, maxBytes)
	} else {
		recs, next, err = s.node.readLocal(wctx, rd, req.Key, req.GetFromOffset(), maxRecords, maxBytes)
	}
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &geologv1.ReadResponse{
		Records:     recs,
		NextOffset:  next,
		StartOffset: rd.store.StartOffset(),
		TailOffset:  rd.servableEnd(),
	}, nil
}

func (s *logServer) Subscribe(req *geologv1.SubscribeRequest, stream geologv1.Log_SubscribeServer) error {
	ctx := stream.Context()
	rd, err := s.node.readRangeOf(ctx, req.GetStream(), req.GetRange(), req.Key)
	if err != nil {
		return apierr.ToStatus(err)
	}
	var next uint64
	switch start := req.GetStart().(type) {
	case *geologv1.SubscribeRequest_FromOffset:
		next = start.FromOffset
	case *geologv1.SubscribeRequest_FromTimeUnixNanos:
		if next, err = rd.offsetForTime(start.FromTimeUnixNanos); err != nil {
			return apierr.ToStatus(err)
		}
	default:
		next = 0
	}
	_, maxBytes := clampRead(0, req.GetMaxBytes())
	var behind time.Time // since when next is past the servable end
	for {
		changed := rd.changed()
		recs, n, err := rd.read(req.Key, next, readRecordsDefault, maxBytes)
		var wait <-chan time.Time
		if apierr.CodeOf(err) == apierr.PastLocalTail {
			left, werr := rd.subscribeWait(next, &behind)
			if werr != nil {
				return apierr.ToStatus(werr)
			}
			if left > 0 {
				wait = time.After(left)
			}
			err = nil
		} else {
			behind = time.Time{}
		}
		if err != nil {
			return apierr.ToStatus(err)
		}
		if len(recs) == 0 && req.Key != nil {
			// A read by key skipped other keys' records: its subscriber
			// hears of its key only.
			next = max(next, n)
		}
		if n > next {
			// Records, or holes only (compaction by key): either way the
			// subscriber learns where to resume.
			next = n
			if err := stream.Send(&geologv1.SubscribeResponse{Records: recs, NextOffset: next, TailOffset: rd.servableEnd()}); err != nil {
				return err
			}
			continue
		}
		select {
		case <-changed:
		case <-wait:
		case <-ctx.Done():
			return apierr.ToStatus(apierr.As(ctx.Err()))
		case <-s.node.closing:
			return apierr.ToStatus(apierr.New(apierr.ShuttingDown, "node is shutting down"))
		}
	}
}

func (s *logServer) CreateStream(ctx context.Context, req *geologv1.CreateStreamRequest) (*geologv1.CreateStreamResponse, error) {
	info, err := s.node.createStream(ctx, req)
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &geologv1.CreateStreamResponse{Stream: info}, nil
}

func (s *logServer) ListStreams(ctx context.Context, req *geologv1.ListStreamsRequest) (*geologv1.ListStreamsResponse, error) {
	return &geologv1.ListStreamsResponse{Streams: s.node.listStreams()}, nil
}

func (s *logServer) DescribeStream(ctx context.Context, req *geologv1.DescribeStreamRequest) (*geologv1.DescribeStreamResponse, error) {
	resp, err := s.node.describeStream(ctx, req.GetName())
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return resp, nil
}
