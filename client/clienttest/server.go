// Package clienttest provides an in-memory geolog Log server for tests of
// clients, tools and benchmarks, in the spirit of net/http/httptest.
//
// The server keeps one in-memory log per range and implements the append
// contract that the real server has: idempotent appends keyed by (producer
// id, range) with a dedup window of the last DedupWindowBatches batches per
// producer (a duplicate gets its original offsets, a gap gets
// ERROR_CODE_SEQUENCE_GAP, a batch past 0 from a producer id the range
// does not know gets ERROR_CODE_PRODUCER_STATE_LOST), AppendStream answering a range's requests in
// order, and Read/Subscribe of the committed log. Faults can be injected per
// append request and per subscribe reply: error replies, dropped streams
// (before or after the request is applied), delays and holds.
//
// StartCluster runs several such nodes in one process that share one log
// per range, as the replicas of a region's Raft groups do: only each range's
// designated leader node appends, the others answer ERROR_CODE_NOT_LEADER
// with the leader's address as leader_hint (unless hints are turned off),
// any node serves reads, and a test can move leadership and kill and restart
// nodes.
//
// It is test support, not a server: nothing is durable and there is one
// region.
package clienttest

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// Config configures a Server; zero fields take the documented defaults.
type Config struct {
	// RecordBytesMax bounds a record's key+value bytes; default 1 MiB.
	RecordBytesMax int
	// DedupWindowBatches is how many recent batches per producer and range
	// can be answered as duplicates; default 16.
	DedupWindowBatches int
	// SubscribeRecordsMax bounds the records in one Subscribe reply;
	// default 100.
	SubscribeRecordsMax int
	// AcceptAnyFirstSequence makes the fake accept any base sequence as
	// the first batch of a producer id it does not know (a lenient server);
	// by default a new id must start at 0, as regionsvc's does.
	AcceptAnyFirstSequence bool
	// RecordsFormOnly makes the fake act as a server that predates the
	// batch form: it ignores AppendRequest.batch (a field unknown to it) and
	// so answers EMPTY_BATCH to an append without records.
	RecordsFormOnly bool
	// TLS, if set, makes the fake serve TLS (require client certificates
	// in it for mutual TLS); default plaintext.
	TLS *tls.Config
	// ServeFrames makes the fake answer a read or subscription asking for
	// the frame form (want_frames, without a key) with frames, as a node
	// does; by default it answers records, as a node that predates the
	// form.
	ServeFrames bool
	// DamageFrames, with ServeFrames, changes the frames of each reply
	// before they are sent (to test how a client takes bad ones).
	DamageFrames func(frames []byte) []byte
}

// Fault is what to do to one request. The zero Fault does nothing.
type Fault struct {
	// Hold, if not nil, delays processing until it is closed (or the
	// stream ends). Later requests of the stream queue up behind it.
	Hold <-chan struct{}
	// Delay delays processing.
	Delay time.Duration
	// Network delays the reply as a network's round trip would: after
	// Delay, and left out of the time the reply reports the fake spent
	// on the request (AppendResponse.timing, when asked for).
	Network time.Duration
	// Err fails the request with this error without applying it: as
	// AppendResponse.error on AppendStream, as the status otherwise. Use
	// an *apierr.Error.
	Err error
	// DropStream ends the stream with UNAVAILABLE before applying.
	DropStream bool
	// DropAfterApply applies the request, then ends the stream with
	// UNAVAILABLE without replying (an ack lost in transit).
	DropAfterApply bool
	// SkipReply applies an AppendStream request but never answers it; the
	// stream stays up.
	SkipReply bool
}

// AppendFaultFunc decides the fault for the n-th (1-based) append request
// since it was set.
type AppendFaultFunc func(n int64, req *geologv1.AppendRequest) Fault

// SubscribeFaultFunc decides the fault for the n-th (1-based) subscribe
// reply since it was set; Err and DropStream end the subscription.
type SubscribeFaultFunc func(n int64) Fault

// ReadFaultFunc decides the error (nil: none) the n-th (1-based) Read since
// it was set fails with. Use an *apierr.Error.
type ReadFaultFunc func(n int64) error

// BatchInfo records one applied (non-duplicate) batch.
type BatchInfo struct {
	ProducerID   uint64
	BaseSequence uint64
	RecordCount  int
	BaseOffset   uint64
}

// Server is the fake, or one node of a fake cluster. Its methods are safe
// for concurrent use.
type Server struct {
	geologv1.UnimplementedLogServer
	cfg  Config
	addr string

	// lifeMu guards the listener and gRPC server, which Kill and Restart
	// replace. It is never held together with mu.
	lifeMu sync.Mutex
	lis    net.Listener
	grpc   *grpc.Server

	// cluster is nil for a standalone server; index is the node's index
	// in it.
	cluster *Cluster
	index   int

	// mu is shared by a cluster's nodes: it guards the shared logs
	// (streams) and the cluster's leadership as well as the fields below.
	mu      *sync.Mutex
	streams map[string]*fakeStream
	// down is set while a cluster node is killed: nothing is applied.
	down bool
	// frozen, when not nil, caps the tails this node reads at (see
	// FreezeReads); a range missing from it reads as empty.
	frozen         map[rangeKey]uint64
	appendFault    AppendFaultFunc
	appendN        int64
	subscribeFault SubscribeFaultFunc
	subscribeN     int64
	readFault      ReadFaultFunc
	readN          int64
	appendRequests int64
	duplicates     int64
	outstandingMax map[rangeKey]int
	outstandingNow map[rangeKey]int
	appendStreamsN int64
	subscriptionsN int64
	gapReplies     int64
	notLeaderN     int64
}

type rangeKey struct {
	stream string
	rng    uint32
}

type fakeStream struct {
	info   *geologv1.StreamInfo
	ranges []*fakeRange
}

type fakeRange struct {
	// epoch is the homing epoch new records get (0 means 1; see Fork).
	epoch     uint64
	records   []*geologv1.StoredRecord
	sizeBytes int64
	producers map[uint64]*producerState
	batches   []BatchInfo
	notify    chan struct{} // closed and replaced on every append
}

type producerState struct {
	nextSeq uint64
	window  []dedupEntry
}

type dedupEntry struct {
	baseSeq    uint64
	count      uint32
	baseOffset uint64
	appendTime int64
}

// Start serves a fake on a loopback port.
func Start(cfg Config) (*Server, error) {
	s := newServer(cfg.withDefaults(), &sync.Mutex{}, make(map[string]*fakeStream))
	if err := s.serve("127.0.0.1:0"); err != nil {
		return nil, err
	}
	return s, nil
}

func (cfg Config) withDefaults() Config {
	if cfg.RecordBytesMax == 0 {
		cfg.RecordBytesMax = 1 << 20
	}
	if cfg.DedupWindowBatches == 0 {
		cfg.DedupWindowBatches = 16
	}
	if cfg.SubscribeRecordsMax == 0 {
		cfg.SubscribeRecordsMax = 100
	}
	return cfg
}

func newServer(cfg Config, mu *sync.Mutex, streams map[string]*fakeStream) *Server {
	return &Server{
		cfg:            cfg,
		mu:             mu,
		streams:        streams,
		outstandingMax: make(map[rangeKey]int),
		outstandingNow: make(map[rangeKey]int),
	}
}

// serve listens on addr and serves there, replacing a stopped gRPC server.
func (s *Server) serve(addr string) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(64 << 20),
		grpc.MaxSendMsgSize(64 << 20),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
	}
	if s.cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.cfg.TLS)))
	}
	// The same error boundary as a node's: handlers return plain errors.
	opts = append(opts, rpcerr.ServerOptions(nil)...)
	g := grpc.NewServer(opts...)
	geologv1.RegisterLogServer(g, s)
	s.lifeMu.Lock()
	s.lis, s.grpc = lis, g
	s.lifeMu.Unlock()
	if s.addr == "" {
		// Set once, before the server is shared; a restart listens on the
		// same address.
		s.addr = lis.Addr().String()
	}
	go func() { _ = g.Serve(lis) }()
	return nil
}

// Addr returns the host:port the fake listens on (for a cluster node, also
// while it is killed).
func (s *Server) Addr() string { return s.addr }

// Close stops the fake, ending every stream. On a cluster node it is Kill.
func (s *Server) Close() {
	s.mu.Lock()
	s.down = true
	s.mu.Unlock()
	s.lifeMu.Lock()
	g := s.grpc
	s.lifeMu.Unlock()
	g.Stop()
}

// SetAppendFault installs f (nil removes it) and restarts its count.
func (s *Server) SetAppendFault(f AppendFaultFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.appendFault, s.appendN = f, 0
}

// SetSubscribeFault installs f (nil removes it) and restarts its count.
func (s *Server) SetSubscribeFault(f SubscribeFaultFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subscribeFault, s.subscribeN = f, 0
}

// SetReadFault installs f (nil removes it) and restarts its count.
func (s *Server) SetReadFault(f ReadFaultFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.readFault, s.readN = f, 0
}

// MustCreateStream creates a stream with one region, panicking on error.
func (s *Server) MustCreateStream(name string, rangeCount uint32) {
	if _, err := s.CreateStream(context.Background(), &geologv1.CreateStreamRequest{Name: name, RangeCount: rangeCount}); err != nil {
		panic(err)
	}
}

// ForgetProducers drops every producer's dedup state, as a server does
// when it expires idle producers.
func (s *Server) ForgetProducers() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.streams {
		for _, r := range st.ranges {
			clear(r.producers)
		}
	}
}

// Records returns a copy of a range's log.
func (s *Server) Records(stream string, rng uint32) []*geologv1.StoredRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.rangeLocked(stream, rng)
	if err != nil {
		return nil
	}
	return append([]*geologv1.StoredRecord(nil), r.records...)
}

// Batches returns the batches applied to a range, in offset order.
func (s *Server) Batches(stream string, rng uint32) []BatchInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.rangeLocked(stream, rng)
	if err != nil {
		return nil
	}
	return append([]BatchInfo(nil), r.batches...)
}

// Stats are counters of the fake (of one node, in a cluster).
type Stats struct {
	AppendRequests   int64 // requests received, duplicates and failures included
	Duplicates       int64 // requests answered as duplicates
	AppendStreams    int64 // AppendStream calls
	Subscriptions    int64 // Subscribe calls
	GapReplies       int64 // requests answered with ERROR_CODE_SEQUENCE_GAP or PRODUCER_STATE_LOST
	NotLeaderReplies int64 // requests answered with ERROR_CODE_NOT_LEADER
}

// Stats returns the fake's counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{AppendRequests: s.appendRequests, Duplicates: s.duplicates, AppendStreams: s.appendStreamsN,
		Subscriptions: s.subscriptionsN, GapReplies: s.gapReplies, NotLeaderReplies: s.notLeaderN}
}

// OutstandingMax returns the most AppendStream requests of one range that
// were received but not yet answered at one time, over all streams.
func (s *Server) OutstandingMax(stream string, rng uint32) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.outstandingMax[rangeKey{stream, rng}]
}

// Outstanding returns the AppendStream requests of one range received but
// not yet answered now.
func (s *Server) Outstanding(stream string, rng uint32) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.outstandingNow[rangeKey{stream, rng}]
}

func (s *Server) rangeLocked(stream string, rng uint32) (*fakeRange, error) {
	st, ok := s.streams[stream]
	if !ok {
		return nil, apierr.New(apierr.StreamNotFound, "stream %q not found", stream)
	}
	if rng >= uint32(len(st.ranges)) {
		return nil, apierr.New(apierr.RangeNotFound, "stream %q has no range %d", stream, rng)
	}
	return st.ranges[rng], nil
}

func (s *Server) nextAppendFault(req *geologv1.AppendRequest) Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.appendRequests++
	if s.appendFault == nil {
		return Fault{}
	}
	s.appendN++
	return s.appendFault(s.appendN, req)
}

// apply appends req under the dedup contract; in a cluster only on the
// range's leader.
func (s *Server) apply(req *geologv1.AppendRequest) (*geologv1.AppendResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		// A killed node's handlers may outlive its listener; they must
		// not append.
		return nil, apierr.New(apierr.Unavailable, "node is down")
	}
	r, err := s.rangeLocked(req.GetStream(), req.GetRange())
	if err != nil {
		return nil, err
	}
	if err := s.leaderCheckLocked(req.GetStream(), req.GetRange()); err != nil {
		s.notLeaderN++
		return nil, err
	}
	var recs []*geologv1.Record
	if s.cfg.RecordsFormOnly {
		recs = req.GetRecords()
	} else if recs, err = AppendRecords(req); err != nil {
		return nil, err
	}
	n := uint32(len(recs))
	if n == 0 {
		return nil, apierr.New(apierr.EmptyBatch, "empty batch")
	}
	for _, rec := range recs {
		if size := len(rec.GetKey()) + len(rec.GetValue()); size > s.cfg.RecordBytesMax {
			return nil, apierr.New(apierr.RecordTooLarge, "record of %d bytes exceeds %d", size, s.cfg.RecordBytesMax)
		}
	}
	pid, base := req.GetProducerId(), req.GetBaseSequence()
	var ps *producerState
	if pid != 0 {
		ps = r.producers[pid]
		if ps == nil {
			ps = &producerState{}
			if s.cfg.AcceptAnyFirstSequence {
				ps.nextSeq = base
			} else if base != 0 {
				s.gapReplies++
				return nil, apierr.New(apierr.ProducerStateLost, "producer %d is unknown to this range; its batch starts at %d, not 0", pid, base)
			}
		}
		if base < ps.nextSeq {
			for _, e := range ps.window {
				if e.baseSeq == base && e.count == n {
					s.duplicates++
					return &geologv1.AppendResponse{
						RequestId: req.GetRequestId(), BaseOffset: e.baseOffset, RecordCount: n,
						Epoch: 1, AppendTimeUnixNanos: e.appendTime, Duplicate: true,
					}, nil
				}
			}
			if len(ps.window) == 0 || base < ps.window[0].baseSeq {
				return nil, apierr.New(apierr.DuplicateOutOfWindow, "sequence %d is older than the dedup window", base)
			}
			e := apierr.New(apierr.SequenceGap, "sequence %d does not start a known batch", base)
			e.ExpectedSequence = ps.nextSeq
			s.gapReplies++
			return nil, e
		}
		if base > ps.nextSeq {
			e := apierr.New(apierr.SequenceGap, "expected sequence %d, got %d", ps.nextSeq, base)
			e.ExpectedSequence = ps.nextSeq
			s.gapReplies++
			return nil, e
		}
	}
	now := time.Now().UnixNano()
	if len(r.records) > 0 {
		// Append times never decrease in offset order.
		now = max(now, r.records[len(r.records)-1].GetAppendTimeUnixNanos())
	}
	baseOffset := uint64(len(r.records))
	epoch := max(r.epoch, 1)
	for i, rec := range recs {
		r.records = append(r.records, &geologv1.StoredRecord{
			Offset:                baseOffset + uint64(i),
			Key:                   rec.GetKey(),
			Value:                 rec.GetValue(),
			Headers:               rec.GetHeaders(),
			ProducerTimeUnixNanos: rec.GetProducerTimeUnixNanos(),
			AppendTimeUnixNanos:   now,
			Epoch:                 epoch,
			Tombstone:             rec.GetTombstone(),
		})
		r.sizeBytes += int64(len(rec.GetKey()) + len(rec.GetValue()))
	}
	r.batches = append(r.batches, BatchInfo{ProducerID: pid, BaseSequence: base, RecordCount: int(n), BaseOffset: baseOffset})
	if ps != nil {
		ps.nextSeq = base + uint64(n)
		ps.window = append(ps.window, dedupEntry{baseSeq: base, count: n, baseOffset: baseOffset, appendTime: now})
		if len(ps.window) > s.cfg.DedupWindowBatches {
			ps.window = ps.window[len(ps.window)-s.cfg.DedupWindowBatches:]
		}
		r.producers[pid] = ps
	}
	close(r.notify)
	r.notify = make(chan struct{})
	return &geologv1.AppendResponse{
		RequestId: req.GetRequestId(), BaseOffset: baseOffset, RecordCount: n, Epoch: epoch, AppendTimeUnixNanos: now,
	}, nil
}

// Fork makes the range's log continue at offset at under homing epoch
// epoch, as after a region failover: the records from at on are gone (the
// real server moves them to an orphan log), the new home's records values
// follow at once (keyed "fork"), new appends get epoch, and producers
// start afresh. Every node of a cluster serves the new log; a live
// subscription past its tail ends with OFFSET_PAST_LOCAL_TAIL, others
// carry on (drop them with a fault to make the client resubscribe).
func (s *Server) Fork(stream string, rng uint32, at, epoch uint64, values ...[]byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.rangeLocked(stream, rng)
	if err != nil {
		return err
	}
	if at > uint64(len(r.records)) {
		return fmt.Errorf("clienttest: fork at %d past the tail %d", at, len(r.records))
	}
	r.records = r.records[:at:at]
	r.epoch = epoch
	r.producers = make(map[uint64]*producerState)
	now := time.Now().UnixNano()
	if at > 0 {
		now = max(now, r.records[at-1].GetAppendTimeUnixNanos())
	}
	for i, v := range values {
		r.records = append(r.records, &geologv1.StoredRecord{Offset: at + uint64(i), Key: []byte("fork"), Value: v,
			AppendTimeUnixNanos: now, Epoch: epoch})
	}
	close(r.notify)
	r.notify = make(chan struct{})
	return nil
}

// waitFault applies a fault's hold and delay; false if ctx ended first.
func waitFault(ctx context.Context, f Fault) bool {
	if f.Hold != nil {
		select {
		case <-f.Hold:
		case <-ctx.Done():
			return false
		}
	}
	if d := f.Delay + f.Network; d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// timeSpent is the reply's timing for a request the fake received at
// received and answered now: all of it, as the ack stage, but the fault's
// network time; nil unless the request asked for it.
func timeSpent(req *geologv1.AppendRequest, received time.Time, f Fault) *geologv1.AppendTiming {
	if !req.GetWantTiming() {
		return nil
	}
	return &geologv1.AppendTiming{AckNanos: uint64(max(time.Since(received)-f.Network, 0))}
}

var errDropped = status.Error(codes.Unavailable, "clienttest: stream dropped by fault injection")

// Append implements geologv1.LogServer.
func (s *Server) Append(ctx context.Context, req *geologv1.AppendRequest) (*geologv1.AppendResponse, error) {
	f := s.nextAppendFault(req)
	if !waitFault(ctx, f) {
		return nil, apierr.New(apierr.Timeout, "request cancelled")
	}
	switch {
	case f.Err != nil:
		return nil, f.Err
	case f.DropStream:
		return nil, errDropped
	}
	resp, err := s.apply(req)
	if err != nil {
		return nil, err
	}
	if f.DropAfterApply {
		return nil, errDropped
	}
	resp.RequestId = 0
	return resp, nil
}

// AppendStream implements geologv1.LogServer. A receiver goroutine reads
// requests as they come (so the fake can count what a client has in flight)
// and the handler answers them in order.
func (s *Server) AppendStream(stream geologv1.Log_AppendStreamServer) error {
	ctx := stream.Context()
	s.mu.Lock()
	s.appendStreamsN++
	s.mu.Unlock()
	reqs := make(chan *geologv1.AppendRequest, 1024)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				close(reqs)
				return
			}
			s.outstanding(req, +1)
			select {
			case reqs <- req:
			case <-ctx.Done():
				s.outstanding(req, -1)
				return
			}
		}
	}()
	defer func() {
		// Uncount what was received but never answered.
		for {
			select {
			case req, ok := <-reqs:
				if !ok {
					return
				}
				s.outstanding(req, -1)
			default:
				return
			}
		}
	}()
	for {
		var req *geologv1.AppendRequest
		select {
		case r, ok := <-reqs:
			if !ok {
				return nil // client closed its side
			}
			req = r
		case <-ctx.Done():
			return ctx.Err()
		}
		released := false
		release := func() { // once: the request is no longer in flight
			if !released {
				released = true
				s.outstanding(req, -1)
			}
		}
		err := s.serveStreamRequest(ctx, stream, req, release)
		release()
		if err != nil {
			return err
		}
	}
}

// serveStreamRequest answers req; release, called before the answer is
// sent, uncounts it from what is in flight: once the client has the
// answer it may send another, which must not be counted beside this one.
func (s *Server) serveStreamRequest(ctx context.Context, stream geologv1.Log_AppendStreamServer, req *geologv1.AppendRequest, release func()) error {
	received := time.Now()
	f := s.nextAppendFault(req)
	if !waitFault(ctx, f) || ctx.Err() != nil {
		// A real server fails the requests of a stream whose client went
		// away; it does not apply them later.
		return status.Error(codes.Canceled, "stream cancelled")
	}
	var resp *geologv1.AppendResponse
	switch {
	case f.DropStream:
		return errDropped
	case f.Err != nil:
		resp = &geologv1.AppendResponse{RequestId: req.GetRequestId(), Error: rpcerr.DetailOf(f.Err)}
	default:
		var err error
		resp, err = s.apply(req)
		if err != nil {
			resp = &geologv1.AppendResponse{RequestId: req.GetRequestId(), Error: rpcerr.DetailOf(err)}
		}
		if f.DropAfterApply {
			return errDropped
		}
		if f.SkipReply {
			return nil
		}
		if resp.GetError() == nil && !resp.GetDuplicate() {
			resp.Timing = timeSpent(req, received, f)
		}
	}
	release()
	return stream.Send(resp)
}

func (s *Server) outstanding(req *geologv1.AppendRequest, delta int) {
	k := rangeKey{req.GetStream(), req.GetRange()}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.outstandingNow[k] += delta
	if s.outstandingNow[k] > s.outstandingMax[k] {
		s.outstandingMax[k] = s.outstandingNow[k]
	}
}

// Read implements geologv1.LogServer. CONSISTENCY_MIN_OFFSET waits until
// the node's tail reaches min_offset.
func (s *Server) Read(ctx context.Context, req *geologv1.ReadRequest) (*geologv1.ReadResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.readFault != nil {
		s.readN++
		if err := s.readFault(s.readN); err != nil {
			return nil, err
		}
	}
	r, err := s.rangeLocked(req.GetStream(), req.GetRange())
	if err != nil {
		return nil, err
	}
	k := rangeKey{req.GetStream(), req.GetRange()}
	for req.GetConsistency() == geologv1.Consistency_CONSISTENCY_MIN_OFFSET && s.tailLocked(k, r) < req.GetMinOffset() {
		notify := r.notify
		s.mu.Unlock()
		select {
		case <-notify:
			s.mu.Lock()
		case <-ctx.Done():
			s.mu.Lock()
			return nil, apierr.New(apierr.Timeout, "waiting for offset %d: %v", req.GetMinOffset(), ctx.Err())
		}
	}
	tail := s.tailLocked(k, r)
	from := req.GetFromOffset()
	if from > tail {
		return nil, pastTail(from, tail, uint64(len(r.records)))
	}
	maxRecords := int(req.GetMaxRecords())
	if maxRecords == 0 {
		maxRecords = 1000
	}
	maxBytes := int(req.GetMaxBytes())
	if maxBytes == 0 {
		maxBytes = 1 << 20
	}
	resp := &geologv1.ReadResponse{StartOffset: 0, TailOffset: tail}
	size := 0
	o := from
	for ; o < tail && len(resp.Records) < maxRecords; o++ {
		rec := r.records[o]
		if req.Key != nil && !bytes.Equal(rec.GetKey(), req.Key) {
			continue // a read by key skips other keys' records
		}
		n := len(rec.GetKey()) + len(rec.GetValue())
		if len(resp.Records) > 0 && size+n > maxBytes {
			break
		}
		size += n
		resp.Records = append(resp.Records, rec)
	}
	resp.NextOffset = o
	if s.wantsFrames(req.GetWantFrames(), req.Key) && len(resp.Records) > 0 {
		resp.Frames, resp.Records = s.framesOf(resp.Records), nil
	}
	return resp, nil
}

// Subscribe implements geologv1.LogServer.
func (s *Server) Subscribe(req *geologv1.SubscribeRequest, stream geologv1.Log_SubscribeServer) error {
	ctx := stream.Context()
	s.mu.Lock()
	s.subscriptionsN++
	r, err := s.rangeLocked(req.GetStream(), req.GetRange())
	if err != nil {
		s.mu.Unlock()
		return err
	}
	k := rangeKey{req.GetStream(), req.GetRange()}
	var next uint64
	switch st := req.GetStart().(type) {
	case *geologv1.SubscribeRequest_FromOffset:
		next = st.FromOffset
		if tail := s.tailLocked(k, r); next > tail {
			s.mu.Unlock()
			// As the real server: a subscription past a node's tail is
			// never final (it waits a while, then this).
			e := apierr.New(apierr.PastLocalTail, "offset %d is past this node's tail %d", next, tail)
			e.TailOffset = tail
			return e
		}
	case *geologv1.SubscribeRequest_FromTimeUnixNanos:
		next = uint64(sort.Search(int(s.tailLocked(k, r)), func(i int) bool {
			return r.records[i].GetAppendTimeUnixNanos() >= st.FromTimeUnixNanos
		}))
	}
	s.mu.Unlock()
	for {
		s.mu.Lock()
		tail := s.tailLocked(k, r)
		notify := r.notify
		if next > tail {
			// The log was forked below the subscription (Fork), or
			// the node stopped serving it: as the real server.
			s.mu.Unlock()
			e := apierr.New(apierr.PastLocalTail, "offset %d is past this node's tail %d", next, tail)
			e.TailOffset = tail
			return e
		}
		var recs []*geologv1.StoredRecord
		o := next
		for ; o < tail && len(recs) < s.cfg.SubscribeRecordsMax; o++ {
			if req.Key == nil || bytes.Equal(r.records[o].GetKey(), req.Key) {
				recs = append(recs, r.records[o])
			}
		}
		var f Fault
		if len(recs) > 0 && s.subscribeFault != nil {
			s.subscribeN++
			f = s.subscribeFault(s.subscribeN)
		}
		s.mu.Unlock()
		if len(recs) == 0 {
			next = o // past other keys' records
			select {
			case <-notify:
				continue
			case <-ctx.Done():
				return nil
			}
		}
		if !waitFault(ctx, f) {
			return nil
		}
		switch {
		case f.DropStream:
			return errDropped
		case f.Err != nil:
			return f.Err
		}
		next = o
		msg := &geologv1.SubscribeResponse{Records: recs, NextOffset: next, TailOffset: tail}
		if s.wantsFrames(req.GetWantFrames(), req.Key) {
			msg.Frames, msg.Records = s.framesOf(recs), nil
		}
		if err := stream.Send(msg); err != nil {
			return err
		}
	}
}

// CreateStream implements geologv1.LogServer.
func (s *Server) CreateStream(ctx context.Context, req *geologv1.CreateStreamRequest) (*geologv1.CreateStreamResponse, error) {
	if req.GetName() == "" || req.GetRangeCount() == 0 || req.GetRangeCount() > 1024 {
		return nil, apierr.New(apierr.InvalidArgument, "a name and a range count in [1, 1024] are required")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.streams[req.GetName()]; ok {
		// As the real server: a retry of the same create is answered
		// with the stream; another definition is refused.
		in := st.info
		sameRegions := len(req.GetRegions()) == 0 || slices.Equal(req.GetRegions(), in.GetRegions())
		if req.GetRangeCount() != in.GetRangeCount() || !sameRegions ||
			req.GetRetention().GetMaxAgeMs() != in.GetRetention().GetMaxAgeMs() || req.GetRetention().GetMaxBytes() != in.GetRetention().GetMaxBytes() {
			return nil, apierr.New(apierr.StreamExists, "stream %q exists with another definition", req.GetName())
		}
		return &geologv1.CreateStreamResponse{Stream: in}, nil
	}
	regions := req.GetRegions()
	if len(regions) == 0 {
		regions = []string{"local"}
	}
	st := &fakeStream{info: &geologv1.StreamInfo{
		Name:             req.GetName(),
		RangeCount:       req.GetRangeCount(),
		Regions:          regions,
		Retention:        req.GetRetention(),
		CreatedUnixNanos: time.Now().UnixNano(),
	}}
	for range req.GetRangeCount() {
		st.ranges = append(st.ranges, &fakeRange{producers: make(map[uint64]*producerState), notify: make(chan struct{})})
	}
	s.streams[req.GetName()] = st
	return &geologv1.CreateStreamResponse{Stream: st.info}, nil
}

// ListStreams implements geologv1.LogServer.
func (s *Server) ListStreams(ctx context.Context, req *geologv1.ListStreamsRequest) (*geologv1.ListStreamsResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &geologv1.ListStreamsResponse{}
	for _, st := range s.streams {
		resp.Streams = append(resp.Streams, st.info)
	}
	sort.Slice(resp.Streams, func(i, j int) bool { return resp.Streams[i].GetName() < resp.Streams[j].GetName() })
	return resp, nil
}

// DescribeStream implements geologv1.LogServer.
func (s *Server) DescribeStream(ctx context.Context, req *geologv1.DescribeStreamRequest) (*geologv1.DescribeStreamResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.streams[req.GetName()]
	if !ok {
		return nil, apierr.New(apierr.StreamNotFound, "stream %q not found", req.GetName())
	}
	resp := &geologv1.DescribeStreamResponse{Stream: st.info}
	n := st.info.GetRangeCount()
	for i, r := range st.ranges {
		resp.Ranges = append(resp.Ranges, &geologv1.RangeInfo{
			Range:       uint32(i),
			HashStart:   keyspace.HashStart(uint32(i), n),
			HashEnd:     keyspace.HashEnd(uint32(i), n),
			StartOffset: 0,
			TailOffset:  s.tailLocked(rangeKey{req.GetName(), uint32(i)}, r),
			SizeBytes:   r.sizeBytes,
			HomeRegion:  st.info.GetRegions()[0],
			Epoch:       1,
			Leader:      s.leaderAddrLocked(req.GetName(), uint32(i)),
			Status:      "ok",
		})
	}
	return resp, nil
}

// String describes the fake, for test logs.
func (s *Server) String() string { return fmt.Sprintf("clienttest.Server(%s)", s.Addr()) }

// tailLocked is the tail of range r (key k) as this node serves reads: the
// log's, or the one frozen by FreezeReads.
func (s *Server) tailLocked(k rangeKey, r *fakeRange) uint64 {
	tail := uint64(len(r.records))
	if s.frozen != nil {
		tail = min(tail, s.frozen[k])
	}
	return tail
}

// pastTail is the real server's answer to a read at from past this node's
// tail: OFFSET_OUT_OF_RANGE past the range's tail (final), else
// OFFSET_PAST_LOCAL_TAIL (retriable; a node that lags).
func pastTail(from, tail, rangeTail uint64) error {
	if from > rangeTail {
		e := apierr.New(apierr.OffsetOutOfRange, "offset %d is past the tail %d", from, rangeTail)
		e.TailOffset = rangeTail
		return e
	}
	e := apierr.New(apierr.PastLocalTail, "offset %d is past this node's tail %d", from, tail)
	e.TailOffset = tail
	return e
}

// FreezeReads makes the node serve reads (Read, Subscribe, the tails of
// DescribeStream) only up to each range's tail now, as a follower that stops
// applying would, until ThawReads.
func (s *Server) FreezeReads() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.frozen = make(map[rangeKey]uint64)
	for name, st := range s.streams {
		for i, r := range st.ranges {
			s.frozen[rangeKey{name, uint32(i)}] = uint64(len(r.records))
		}
	}
}

// ThawReads undoes FreezeReads: the node catches up at once.
func (s *Server) ThawReads() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.frozen = nil
	for _, st := range s.streams {
		for _, r := range st.ranges {
			// Wake this node's waiting readers; others recheck and wait on.
			close(r.notify)
			r.notify = make(chan struct{})
		}
	}
}

// leaderCheckLocked returns the NOT_LEADER error a cluster node that does
// not lead the range answers appends with; nil for the leader and for a
// standalone server.
func (s *Server) leaderCheckLocked(stream string, rng uint32) error {
	c := s.cluster
	if c == nil {
		return nil
	}
	leader := c.leaderLocked(stream, rng)
	if leader == s.index {
		return nil
	}
	e := apierr.New(apierr.NotLeader, "node %d does not lead %s/%d", s.index, stream, rng)
	if c.hints && leader >= 0 {
		e.LeaderHint = c.nodes[leader].addr
	}
	return e
}

// leaderAddrLocked is the address DescribeStream names as a range's leader.
func (s *Server) leaderAddrLocked(stream string, rng uint32) string {
	c := s.cluster
	if c == nil {
		return s.addr
	}
	if leader := c.leaderLocked(stream, rng); leader >= 0 {
		return c.nodes[leader].addr
	}
	return ""
}

// AppendRecords returns the records of an append in either form: records,
// or a batch (a produced frame, which it checks as the range leader does:
// batch.ValidateProduced, and its producer fields against the request's).
// A malformed batch, or one beside records, is INVALID_ARGUMENT.
func AppendRecords(req *geologv1.AppendRequest) ([]*geologv1.Record, error) {
	if len(req.GetBatch()) == 0 {
		return req.GetRecords(), nil
	}
	if len(req.GetRecords()) > 0 {
		return nil, apierr.New(apierr.InvalidArgument, "append carries both records and a batch")
	}
	h, err := batch.ValidateProduced(req.GetBatch(), nil)
	if err != nil {
		return nil, apierr.Wrap(apierr.InvalidArgument, err, "append batch")
	}
	if h.ProducerID != req.GetProducerId() || h.BaseSequence != req.GetBaseSequence() {
		return nil, apierr.New(apierr.InvalidArgument, "batch is under producer %d from %d, the request under %d from %d",
			h.ProducerID, h.BaseSequence, req.GetProducerId(), req.GetBaseSequence())
	}
	_, brecs, err := batch.Decode(req.GetBatch())
	if err != nil {
		return nil, apierr.Wrap(apierr.InvalidArgument, err, "append batch")
	}
	recs := make([]*geologv1.Record, len(brecs))
	for i, br := range brecs {
		r := &geologv1.Record{Key: br.Key, Value: br.Value, ProducerTimeUnixNanos: br.ProducerTimeUnixNanos, Tombstone: br.Tombstone}
		for _, h := range br.Headers {
			r.Headers = append(r.Headers, &geologv1.Header{Key: h.Key, Value: h.Value})
		}
		recs[i] = r
	}
	return recs, nil
}
