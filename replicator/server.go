package replicator

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/internal/rpcerr"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"github.com/hashicorp/go-hclog"
	"github.com/klauspost/compress/zstd"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
)

// ServerConfig configures a Server. Zero values take the documented
// defaults; NewServer validates the rest.
type ServerConfig struct {
	// Region is this node's region. Required: streams meant for another
	// region, or coming from this one, are refused.
	Region string
	// Store finds the ranges this node mirrors. Required.
	Store MirrorStore
	// Now is the local clock for lag, default time.Now.
	Now func() time.Time
	// Logger defaults to a null logger; the server names it
	// "replicator-server".
	Logger hclog.Logger
	// ServerTLS, when set, makes ServerOptions include it as credentials.
	ServerTLS *tls.Config
	// AuthorizeSource, when set, is asked whether the caller of a stream
	// (its certificate is in ctx) may speak for the source it names: its
	// region, and the home leader's node id its heartbeats carry (0: not
	// given). It runs after the open is validated and before anything of
	// the stream reaches the MirrorStore; an error ends the stream with
	// PERMISSION_DENIED. Default: everyone may.
	AuthorizeSource func(ctx context.Context, sourceRegion string, leaderNodeID uint64) error
	// UncompressedBytesMax bounds one batch's frames, default
	// batch.FrameBytesMax (a lone largest frame must fit). Sources' batches
	// stay below it: their BatchBytesMax is smaller, and a frame larger than
	// that travels alone.
	UncompressedBytesMax int
	// DecoderConcurrency bounds the batches decompressed at once (each
	// decoder state holds a zstd window), default GOMAXPROCS.
	DecoderConcurrency int
	// RangesMax bounds the ranges the server keeps state for (a lock and a
	// Lag each), default 65,536. A range's state outlives its streams, so
	// that its lag keeps growing while the link is down; when the table is
	// full, the state of a range without a stream that heard from its home
	// least recently is dropped, and an open finding no such range is
	// refused with OVERLOADED.
	RangesMax int
	// KeepaliveMinInterval is the most frequent client ping the server
	// permits, default 5 s (half the dialer's default interval).
	KeepaliveMinInterval time.Duration
}

func (c *ServerConfig) setDefaults() error {
	if c.Region == "" {
		return errors.New("replicator: ServerConfig.Region is required")
	}
	if c.Store == nil {
		return errors.New("replicator: ServerConfig.Store is required")
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	setInt(&c.UncompressedBytesMax, batch.FrameBytesMax)
	setInt(&c.DecoderConcurrency, runtime.GOMAXPROCS(0))
	setInt(&c.RangesMax, 1<<16)
	setDuration(&c.KeepaliveMinInterval, 5*time.Second)
	if c.UncompressedBytesMax < batch.HeaderSize {
		return fmt.Errorf("replicator: UncompressedBytesMax %d is below a frame header", c.UncompressedBytesMax)
	}
	return nil
}

// Server is the destination side: the Mirror service of a node. It
// validates every request, serializes the requests of each range, compares
// overlaps and hands exact extensions to the range's MirrorRange. One per
// node; register it on the node's cross-region grpc.Server.
type Server struct {
	geologinternalv1.UnimplementedMirrorServer

	cfg    ServerConfig
	logger hclog.Logger
	dec    *zstd.Decoder
	closed atomic.Bool

	mu     sync.Mutex
	ranges map[rangeKey]*rangeState

	stats serverCounters
}

// rangeState is the server's state of one range: the lock that serializes
// its requests, and its lag.
type rangeState struct {
	key     rangeKey
	mu      sync.Mutex // held around each request's check and apply
	streams int        // open streams; guarded by Server.mu
	// lagMu guards lag and lastHeard. It is not mu, so that Lag never
	// waits behind an Apply (a blocked mirror is when lag matters most).
	lagMu     sync.Mutex
	lag       *Lag
	lastHeard time.Time
}

type serverCounters struct {
	streams, requests, refusals, gaps, batches, frameBytes, wireBytes, duplicates, forks, skips atomic.Uint64
}

// ServerStats are a server's counters since it was created.
type ServerStats struct {
	// Streams counts streams opened (answered without a refusal).
	Streams uint64
	// Requests counts the requests received on open streams (opens not
	// included).
	Requests uint64
	// Refusals counts refused requests (opens included).
	Refusals uint64
	// Gaps counts the batches among them refused for starting past the
	// applied end (each costs the source a round trip: it rewinds).
	Gaps uint64
	// Batches counts batches acknowledged; FrameBytes their frame bytes;
	// WireBytes their payload bytes as received.
	Batches    uint64
	FrameBytes uint64
	WireBytes  uint64
	// Duplicates counts batches that were wholly below the applied end
	// and identical: acknowledged without applying anything.
	Duplicates uint64
	// Forks counts divergent tails cut (Forker.Fork).
	Forks uint64
	// Skips counts mirrors moved to their home's log start
	// (Skipper.SkipTo).
	Skips uint64
}

var _ geologinternalv1.MirrorServer = (*Server)(nil)

// NewServer validates cfg and returns a server.
func NewServer(cfg ServerConfig) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	dec, err := newDecoder(cfg.DecoderConcurrency, cfg.UncompressedBytesMax)
	if err != nil {
		return nil, err
	}
	return &Server{
		cfg:    cfg,
		logger: cfg.Logger.Named("replicator-server").With("region", cfg.Region),
		dec:    dec,
		ranges: make(map[rangeKey]*rangeState),
	}, nil
}

// Register registers the Mirror service on s, which the caller owns,
// serves and stops, with rpcerr's StreamServerInterceptor in its chain:
// Replicate returns plain errors.
func (s *Server) Register(r grpc.ServiceRegistrar) {
	geologinternalv1.RegisterMirrorServer(r, s)
}

// ServerOptions are the grpc.Server options the Mirror service needs: a
// receive bound that fits the largest batch, a keepalive policy that
// permits the dialer's pings, and ServerTLS when set. A server that also
// serves other services takes the larger of the receive bounds.
func (s *Server) ServerOptions() []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(s.cfg.UncompressedBytesMax + 64<<10),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             s.cfg.KeepaliveMinInterval,
			PermitWithoutStream: true,
		}),
	}
	if s.cfg.ServerTLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.cfg.ServerTLS)))
	}
	return opts
}

// Close makes the server refuse new streams and end the open ones at their
// next request (with SHUTTING_DOWN). The grpc.Server belongs to the caller.
func (s *Server) Close() {
	s.closed.Store(true)
}

// Stats returns the counters so far.
func (s *Server) Stats() ServerStats {
	return ServerStats{
		Streams:    s.stats.streams.Load(),
		Requests:   s.stats.requests.Load(),
		Refusals:   s.stats.refusals.Load(),
		Gaps:       s.stats.gaps.Load(),
		Batches:    s.stats.batches.Load(),
		FrameBytes: s.stats.frameBytes.Load(),
		WireBytes:  s.stats.wireBytes.Load(),
		Duplicates: s.stats.duplicates.Load(),
		Forks:      s.stats.forks.Load(),
		Skips:      s.stats.skips.Load(),
	}
}

// Lag returns the lag of a range this server has heard of, at the server's
// clock: how far its mirror trails the home (see Lag). A range whose
// stream is down keeps its state, so its lag keeps growing. Only the node
// leading the range's mirror group hears from the home; ask it.
func (s *Server) Lag(stream string, rng uint32) (LagStatus, bool) {
	s.mu.Lock()
	st := s.ranges[rangeKey{stream, rng}]
	s.mu.Unlock()
	if st == nil {
		return LagStatus{}, false
	}
	st.lagMu.Lock()
	defer st.lagMu.Unlock()
	return st.lag.Status(s.cfg.Now()), true
}

// Forget drops the state of a range (the node no longer mirrors it: the
// range became homed here, or the stream was deleted).
func (s *Server) Forget(stream string, rng uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := rangeKey{stream, rng}
	if st := s.ranges[k]; st != nil && st.streams == 0 {
		delete(s.ranges, k)
	}
}

// acquire returns the state of k with one more stream on it.
func (s *Server) acquire(k rangeKey) (*rangeState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.ranges[k]; st != nil {
		st.streams++
		return st, nil
	}
	if len(s.ranges) >= s.cfg.RangesMax {
		var victim *rangeState
		for _, st := range s.ranges {
			// lastHeard is read without st.lagMu: a range with no stream
			// has no request in progress that could write it.
			if st.streams == 0 && (victim == nil || st.lastHeard.Before(victim.lastHeard)) {
				victim = st
			}
		}
		if victim == nil {
			return nil, apierr.New(apierr.Overloaded, "mirror server: %d ranges with open streams", len(s.ranges))
		}
		delete(s.ranges, victim.key)
	}
	now := s.cfg.Now()
	st := &rangeState{key: k, streams: 1, lag: NewLag(now), lastHeard: now}
	s.ranges[k] = st
	return st, nil
}

func (s *Server) release(st *rangeState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st.streams--
}

// Replicate implements geologinternalv1.MirrorServer: one stream of one
// range (see mirror.proto). Its errors are plain (a *Refusal, an
// *apierr.Error): the gRPC server maps them with rpcerr's interceptors.
func (s *Server) Replicate(stream grpc.BidiStreamingServer[geologinternalv1.ReplicateRequest, geologinternalv1.ReplicateResponse]) error {
	err := s.serve(stream)
	if err == nil || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

func (s *Server) serve(stream grpc.BidiStreamingServer[geologinternalv1.ReplicateRequest, geologinternalv1.ReplicateResponse]) error {
	ctx := stream.Context()
	req := new(geologinternalv1.ReplicateRequest)
	if err := stream.RecvMsg(req); err != nil {
		return err
	}
	if s.closed.Load() {
		return s.refuse(stream, nil, apierr.New(apierr.ShuttingDown, "mirror server is closed"), 0, 0)
	}
	open, err := checkOpen(req, s.cfg.Region)
	if err != nil {
		return s.refuse(stream, nil, err, 0, 0)
	}
	logger := s.logger.With("stream", open.stream, "range", open.rng, "from", open.sourceRegion, "epoch", open.epoch)
	if s.cfg.AuthorizeSource != nil {
		if err := s.cfg.AuthorizeSource(ctx, open.sourceRegion, open.hb.LeaderNodeID); err != nil {
			s.stats.refusals.Add(1)
			logger.Warn("refusing stream: the caller may not speak for its source", "leader_node", open.hb.LeaderNodeID, "error", err)
			return apierr.Wrap(apierr.PermissionDenied, err, "mirror stream from region %s", open.sourceRegion)
		}
	}
	mr, err := s.cfg.Store.Open(ctx, open.stream, open.rng)
	if err != nil {
		return s.refuse(stream, logger, err, 0, 0)
	}
	// Only the range's home, at the current epoch, may raise the epoch a
	// mirror fences with, or cut its log: checked before anything is
	// recorded (and again with every request, in handleGroup).
	if err := checkHome(mr, open); err != nil {
		return s.refuse(stream, logger, err, 0, 0)
	}
	st, err := s.acquire(rangeKey{open.stream, open.rng})
	if err != nil {
		return s.refuse(stream, logger, err, 0, 0)
	}
	defer s.release(st)

	applied, highest, err := s.handleOpen(st, mr, open)
	if err != nil {
		return s.refuse(stream, logger, err, applied, highest)
	}
	if err := stream.Send(openAnswer(mr, applied, highest)); err != nil {
		return err
	}
	s.stats.streams.Add(1)
	logger.Debug("stream open", "applied_end", applied)
	return s.serveGroups(stream, logger, st, mr, open, applied, highest)
}

// openAnswer is the answer to an open: the mirror's applied end, the
// highest epoch it has seen and the epoch of its last applied frame (see
// the fields' docs), or, when that frame is gone (retention deleted the
// log up to the applied end), the epoch the mirror's LogEpocher keeps.
func openAnswer(mr MirrorRange, applied, highest uint64) *geologinternalv1.ReplicateResponse {
	answer := &geologinternalv1.ReplicateResponse{AppliedEndOffset: applied, HighestEpoch: highest}
	if e := mirrorLogEpoch(mr, applied); e != 0 {
		answer.LogEpoch = &e
	}
	return answer
}

// mirrorLogEpoch is the epoch mr's log ends in at applied (0: unknown):
// that of its frame at applied-1 or, when that frame is gone (retention
// deleted the log up to the applied end), what its LogEpocher keeps.
func mirrorLogEpoch(mr MirrorRange, applied uint64) uint64 {
	if applied == 0 {
		return 0
	}
	if f, err := mr.ReadFrames(applied-1, 1, applied); err == nil && len(f) >= batch.HeaderSize {
		if h, err := batch.DecodeHeader(f); err == nil {
			return h.Epoch
		}
	}
	if le, ok := mr.(LogEpocher); ok {
		return le.LogEpoch()
	}
	return 0
}

// serveGroups applies an open stream's requests, group by group, and
// answers each, until the stream or the server ends. Requests are read
// ahead of the applies: those that arrived while one group was applied are
// applied together (see handleGroup), so a burst waits for one commit round
// in this region, not one per request.
func (s *Server) serveGroups(stream grpc.BidiStreamingServer[geologinternalv1.ReplicateRequest, geologinternalv1.ReplicateResponse],
	logger hclog.Logger, st *rangeState, mr MirrorRange, open openRequest, applied, highest uint64) error {
	ctx := stream.Context()
	reqs := s.readAhead(ctx, stream)
	group := make([]*geologinternalv1.ReplicateRequest, 0, groupRequestsMax)
	for {
		var recvErr error
		var err error
		if group, recvErr, err = nextGroup(ctx, reqs, group[:0]); err != nil {
			return err
		}
		if s.closed.Load() {
			return s.refuse(stream, logger, apierr.New(apierr.ShuttingDown, "mirror server is closed"), applied, highest)
		}
		answers := s.handleGroup(ctx, st, mr, open, group)
		for _, a := range answers {
			applied, highest = a.applied, a.highest
			if a.err != nil {
				if rerr := s.refuse(stream, logger, a.err, a.applied, a.highest); a.final || rerr != nil {
					return rerr
				}
				continue
			}
			if err := stream.Send(&geologinternalv1.ReplicateResponse{AppliedEndOffset: a.applied, HighestEpoch: a.highest}); err != nil {
				return err
			}
		}
		if recvErr != nil {
			return recvErr
		}
	}
}

// nextGroup waits for the next request and appends it to group, with the
// requests already read behind it, up to groupRequestsMax. err ends the
// stream at once (the first receive failed, or ctx ended); recvErr, a
// failed receive behind the group, ends it once the group is answered.
func nextGroup(ctx context.Context, reqs <-chan received, group []*geologinternalv1.ReplicateRequest) (_ []*geologinternalv1.ReplicateRequest, recvErr, err error) {
	select {
	case r := <-reqs:
		if r.err != nil {
			return group, nil, r.err
		}
		group = append(group, r.req)
	case <-ctx.Done():
		return group, nil, ctx.Err()
	}
	for len(group) < groupRequestsMax {
		select {
		case r := <-reqs:
			if r.err != nil {
				return group, r.err, nil
			}
			group = append(group, r.req)
		default:
			return group, nil, nil
		}
	}
	return group, nil, nil
}

// groupRequestsMax bounds the requests applied together; a source keeps at
// most its window (32 by default) in flight.
const groupRequestsMax = 64

// received is one RecvMsg's outcome.
type received struct {
	req *geologinternalv1.ReplicateRequest
	err error
}

// readAhead receives the stream's requests on a goroutine of its own until
// an error (which it delivers last) or until ctx, the stream's context,
// ends when the handler returns.
func (s *Server) readAhead(ctx context.Context, stream grpc.BidiStreamingServer[geologinternalv1.ReplicateRequest, geologinternalv1.ReplicateResponse]) <-chan received {
	ch := make(chan received, groupRequestsMax)
	go func() {
		for {
			req := new(geologinternalv1.ReplicateRequest)
			err := stream.RecvMsg(req)
			if err == nil {
				s.stats.requests.Add(1)
			}
			select {
			case ch <- received{req, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
}

// refuse answers a request with the refusal for err. It returns nil, or
// the error sending failed with; whether the stream goes on is the
// caller's call.
func (s *Server) refuse(stream grpc.BidiStreamingServer[geologinternalv1.ReplicateRequest, geologinternalv1.ReplicateResponse], logger hclog.Logger, err error, applied, highest uint64) error {
	r := asRefusal(err)
	s.stats.refusals.Add(1)
	if logger == nil {
		logger = s.logger
	}
	switch {
	case errors.Is(r, ErrGap), errors.Is(r, ErrNotLeader):
		logger.Debug("refusing", "error", r)
	default:
		logger.Warn("refusing", "error", r)
	}
	return stream.Send(&geologinternalv1.ReplicateResponse{
		AppliedEndOffset: applied,
		HighestEpoch:     highest,
		Error:            rpcerr.Detail(r.API),
	})
}

// handleOpen fences and records the open's heartbeat.
func (s *Server) handleOpen(st *rangeState, mr MirrorRange, open openRequest) (applied, highest uint64, err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	applied, highest = mr.AppliedEnd(), mr.HighestEpoch()
	if err := s.heartbeat(st, mr, open.hb, applied); err != nil {
		return applied, highest, err
	}
	return applied, mr.HighestEpoch(), nil
}

// heartbeat fences hb's epoch and records it, in the mirror and in the
// range's lag; st.mu is held.
func (s *Server) heartbeat(st *rangeState, mr MirrorRange, hb Heartbeat, applied uint64) error {
	if h := mr.HighestEpoch(); hb.Epoch < h {
		return newRefusal(ErrStaleEpoch, "home epoch %d, mirror has seen %d", hb.Epoch, h)
	}
	if err := mr.RecordHeartbeat(hb); err != nil {
		return err
	}
	now := s.cfg.Now()
	st.lagMu.Lock()
	defer st.lagMu.Unlock()
	st.lag.Applied(applied)
	st.lag.Heartbeat(hb, now)
	st.lastHeard = now
	return nil
}

// applied records the range's new applied end in its lag.
func (s *Server) applied(st *rangeState, end uint64) {
	st.lagMu.Lock()
	defer st.lagMu.Unlock()
	st.lag.Applied(end)
}

// answer is the outcome of one request: the applied end and highest epoch
// to report, or a refusal; final says the stream ends with it.
type answer struct {
	applied, highest uint64
	err              error
	final            bool
}

// handleGroup serves requests received one after the other on a stream,
// with one apply for each run of batches that extend each other: the
// answers, in order, are what serving them one at a time would give (a
// gap refuses every batch of its run; an apply failure refuses the first
// batch of the run and ends the stream). The answers stop at the first
// final refusal.
func (s *Server) handleGroup(ctx context.Context, st *rangeState, mr MirrorRange, open openRequest, group []*geologinternalv1.ReplicateRequest) []answer {
	st.mu.Lock()
	defer st.mu.Unlock()
	g := &groupApply{s: s, ctx: ctx, st: st, mr: mr, group: group, answers: make([]answer, 0, len(group))}
	for i, req := range group {
		g.answers = append(g.answers, answer{})
		d, err := s.checkRequest(st, mr, open, req)
		if err != nil {
			return g.fail(i, err)
		}
		if d.frames != nil && !g.extend(d, len(req.GetBatch().GetPayload())) {
			return g.answers
		}
		g.runReqs = append(g.runReqs, i)
	}
	g.flush()
	return g.answers
}

// checkRequest checks a request after the open (its heartbeat, the home,
// its batch), decodes its batch if it has one, and feeds its heartbeat to
// the fence and the lag. An error is the request's final refusal.
func (s *Server) checkRequest(st *rangeState, mr MirrorRange, open openRequest, req *geologinternalv1.ReplicateRequest) (decodedBatch, error) {
	if req.GetOpen() != nil {
		return decodedBatch{}, newRefusal(ErrMalformed, "open repeated")
	}
	hb, err := checkHeartbeat(req, open.epoch)
	if err != nil {
		return decodedBatch{}, err
	}
	if hb.LeaderNodeID != open.hb.LeaderNodeID {
		// AuthorizeSource bound the stream to the open's leader.
		return decodedBatch{}, newRefusal(ErrMalformed, "heartbeat from leader node %d on a stream opened by node %d", hb.LeaderNodeID, open.hb.LeaderNodeID)
	}
	if err := checkHome(mr, open); err != nil {
		return decodedBatch{}, err
	}
	var d decodedBatch
	if b := req.GetBatch(); b != nil {
		// Decompression and frame checks depend on the request alone.
		if d, err = decodeBatch(b, open.epoch, s.cfg.UncompressedBytesMax, s.dec); err != nil {
			return decodedBatch{}, err
		}
		if d.fromSourceStart && d.end > hb.CommittedEnd {
			// The source's committed tail bounds what it can have read
			// (Task.request reads it after the batch): a skip past it is
			// to offsets the source never had.
			return decodedBatch{}, skipRefusal("batch from the home's start [%d, %d) past its committed tail %d", d.first, d.end, hb.CommittedEnd)
		}
	}
	// The heartbeat fences first, and reaches the lag before the apply: a
	// blocked apply then shows as offset lag at once.
	if err := s.heartbeat(st, mr, hb, mr.AppliedEnd()); err != nil {
		return decodedBatch{}, err
	}
	return d, nil
}

// groupApply is one handleGroup: the answers so far and the run of batches
// that extend each other, not yet applied.
type groupApply struct {
	s       *Server
	ctx     context.Context
	st      *rangeState
	mr      MirrorRange
	group   []*geologinternalv1.ReplicateRequest
	answers []answer

	run     decodedBatch
	runReqs []int // indexes (in group and answers) of the requests the run answers
	runWire int
	merged  bool // run.frames is a copy of its own (batches were merged into it)
}

func (g *groupApply) isBatch(i int) bool { return g.group[i].GetBatch() != nil }

// extend adds batch d, of wireBytes on the wire, to the run, or applies
// the run first when d does not extend it; false when the stream ends.
func (g *groupApply) extend(d decodedBatch, wireBytes int) bool {
	switch {
	case g.run.frames == nil:
		g.run = d
	case d.first == g.run.end && !d.fromSourceStart:
		if !g.merged {
			g.run.frames = append(make([]byte, 0, 2*(len(g.run.frames)+len(d.frames))), g.run.frames...)
			g.merged = true
		}
		g.run.frames = append(g.run.frames, d.frames...)
		g.run.end, g.run.frameCount = d.end, g.run.frameCount+d.frameCount
	default:
		if !g.flush() {
			return false
		}
		g.run = d
	}
	g.runWire += wireBytes
	return true
}

// fail ends the answers with request i's final refusal, after the run
// before it.
func (g *groupApply) fail(i int, err error) []answer {
	if !g.flush() {
		return g.answers
	}
	g.answers[i] = answer{applied: g.mr.AppliedEnd(), highest: g.mr.HighestEpoch(), err: err, final: true}
	return g.answers[:i+1]
}

// flush applies the run and fills its answers; false when the stream ends.
func (g *groupApply) flush() bool {
	if len(g.runReqs) == 0 {
		return true
	}
	defer func() { g.run, g.runReqs, g.runWire, g.merged = decodedBatch{}, g.runReqs[:0], 0, false }()
	s, mr := g.s, g.mr
	applied, highest := mr.AppliedEnd(), mr.HighestEpoch()
	var err error
	if g.run.frames != nil {
		applied, err = s.apply(g.ctx, mr, g.run)
		s.applied(g.st, applied)
		highest = mr.HighestEpoch()
	}
	if err == nil {
		for _, i := range g.runReqs {
			g.answers[i] = answer{applied: applied, highest: highest}
			if g.isBatch(i) {
				s.stats.batches.Add(1)
			}
		}
		s.stats.frameBytes.Add(uint64(len(g.run.frames)))
		s.stats.wireBytes.Add(uint64(g.runWire))
		return true
	}
	gap := errors.Is(err, ErrGap)
	for _, i := range g.runReqs {
		switch {
		case !g.isBatch(i):
			g.answers[i] = answer{applied: applied, highest: highest}
		case gap:
			// Each batch of the run starts past the applied end too.
			s.stats.gaps.Add(1)
			g.answers[i] = answer{applied: applied, highest: highest, err: err}
		default:
			g.answers[i] = answer{applied: applied, highest: highest, err: err, final: true}
			g.answers = g.answers[:i+1]
			return false
		}
	}
	return true
}

// apply brings d into mr: refuses a gap, compares an overlap, applies the
// rest. It returns the applied end after it (the current one on a gap).
func (s *Server) apply(ctx context.Context, mr MirrorRange, d decodedBatch) (uint64, error) {
	return s.applyOnce(ctx, mr, d, false)
}

// applyOnce is apply; forked says a fork was cut for this batch already
// (the retry after it must not cut another).
func (s *Server) applyOnce(ctx context.Context, mr MirrorRange, d decodedBatch, forked bool) (uint64, error) {
	applied := mr.AppliedEnd()
	if d.fromSourceStart {
		if err := s.skipTo(ctx, mr, d, applied); err != nil {
			return mr.AppliedEnd(), err
		}
		applied = d.first
		if d.skipMarker() {
			return applied, nil
		}
	}
	if d.first > applied {
		return applied, gapRefusal(d.first, applied)
	}
	suffix := 0
	if d.first < applied {
		// What the batch overlaps must be what the mirror holds: a read of
		// the batch's size covers an identical overlap, and ReadOverlap adds
		// the one stored frame that read may cut off where they differ.
		stored, err := ReadOverlap(mr, d.first, len(d.frames), min(applied, d.end))
		if err != nil {
			// Retention deleted what the batch overlaps here. If every
			// frame this mirror holds is of an older epoch than the batch,
			// none of it is the range's: the mirror resets at the batch's
			// start (P1 in notes/simgaps.md; a refusal would be resent
			// for ever).
			if fp, ok := resetPoint(d, applied, mirrorLogEpoch(mr, applied)); ok && !forked {
				if _, isForker := mr.(Forker); isForker {
					return s.forkAndApply(ctx, mr, d, fp, applied)
				}
			}
			return applied, apierr.Wrap(apierr.Unavailable, err, "read the mirror's frames from %d to compare", d.first)
		}
		if suffix, err = overlapSuffix(d, applied, stored); err != nil {
			var ref *Refusal
			_, ok := mr.(Forker)
			if !ok || !errors.As(err, &ref) || ref.fork == nil || forked {
				return applied, err
			}
			return s.forkAndApply(ctx, mr, d, *ref.fork, applied)
		}
		if suffix == len(d.frames) {
			s.stats.duplicates.Add(1)
			return applied, nil // a resend of what is applied: acknowledged as is
		}
	}
	end, err := mr.Apply(ctx, d.frames[suffix:])
	if err != nil {
		return mr.AppliedEnd(), err
	}
	if end < d.end {
		return end, apierr.New(apierr.Internal, "mirror applied to %d, batch ends at %d", end, d.end)
	}
	return end, nil
}

// skipTo moves mr's log to d.first, the home's log start, for a batch
// flagged from_source_start: only forward (the home's start is above the
// mirror's applied end, else ErrSkipRefused), and only through a Skipper.
// The batch itself is from the current home (fenced and checked as any),
// and its frames are the home's from its start, so the skip goes nowhere
// the home's log does not go.
func (s *Server) skipTo(ctx context.Context, mr MirrorRange, d decodedBatch, applied uint64) error {
	sk, ok := mr.(Skipper)
	switch {
	case d.first <= applied:
		return skipRefusal("batch from the home's start %d, the mirror's applied end %d is not below it", d.first, applied)
	case !ok:
		return skipRefusal("the mirror cannot skip from %d to the home's start %d", applied, d.first)
	}
	if err := s.orphanBeforeSkip(ctx, mr, d, applied); err != nil {
		return err
	}
	if err := sk.SkipTo(ctx, d.first); err != nil {
		return err
	}
	if end := mr.AppliedEnd(); end != d.first {
		return apierr.New(apierr.Internal, "mirror skipped to %d, its applied end is %d", d.first, end)
	}
	s.stats.skips.Add(1)
	s.logger.Warn("skipped to the home's log start: retention there deleted what this mirror had not received",
		"from", applied, "to", d.first)
	return nil
}

// orphanBeforeSkip moves what mr retains into its orphan log (a fork at
// its log's start, Forker) before a skip, when its log ends in an older
// epoch than the batch's first frame: then part of it may be an old
// home's divergent tail, which the home's frames would have shown (the
// usual resend from the epoch change, Task's evConnected) had its
// retention not deleted them. What cannot be told apart is kept, in the
// orphan log, not deleted. A mirror that is no Forker, LogEpocher and
// SourceStarter (its log's start) skips without it. A skip marker has no
// frame: the home's epoch stands in for the first frame's, which is never
// above it, so a mirror of an older epoch than the home's keeps its log
// in the orphan log then.
func (s *Server) orphanBeforeSkip(ctx context.Context, mr MirrorRange, d decodedBatch, applied uint64) error {
	fk, isForker := mr.(Forker)
	le, isLogEpocher := mr.(LogEpocher)
	st, isStarter := mr.(SourceStarter)
	if !isForker || !isLogEpocher || !isStarter {
		return nil
	}
	epoch := d.homeEpoch
	if !d.skipMarker() {
		h, err := batch.DecodeHeader(d.frames) // validated by decodeBatch
		if err != nil {
			return newRefusal(ErrMalformed, "first frame: %v", err)
		}
		epoch = h.Epoch
	}
	start, logEpoch := st.StartOffset(), le.LogEpoch()
	if logEpoch == 0 || logEpoch >= epoch || applied <= start {
		return nil // of the home's epoch already, or nothing retained
	}
	at, err := fk.Fork(ctx, start, epoch)
	if err != nil {
		return err
	}
	if at != start {
		return apierr.New(apierr.Internal, "mirror forked at %d, asked %d", at, start)
	}
	s.stats.forks.Add(1)
	s.logger.Warn("moved a mirror's log of an older epoch into the orphan log before skipping to the home's start",
		"from", start, "to", applied, "mirror_epoch", logEpoch, "epoch", epoch, "home_start", d.first)
	return nil
}

// forkAndApply cuts mr's divergent tail at fp (mr is a Forker) and applies
// d again, once.
func (s *Server) forkAndApply(ctx context.Context, mr MirrorRange, d decodedBatch, fp forkPoint, applied uint64) (uint64, error) {
	at, err := mr.(Forker).Fork(ctx, fp.at, fp.epoch)
	if err != nil {
		return mr.AppliedEnd(), err
	}
	s.stats.forks.Add(1)
	s.logger.Warn("cut a divergent tail into the orphan log", "fork_offset", fp.at, "epoch", fp.epoch,
		"mirror_epoch", fp.storedEpoch, "orphaned_to", applied, "applied_end", at)
	return s.applyOnce(ctx, mr, d, true)
}
