package replicator

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/geolog/geolog/batch"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/hashicorp/go-hclog"
	"github.com/klauspost/compress/zstd"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/status"
)

// TaskConfig configures a Task. Zero values take the documented defaults;
// NewTask validates the rest.
type TaskConfig struct {
	// Stream and Range name the range. Required (Range 0 is a range).
	Stream string
	Range  uint32
	// SourceRegion is this (the home) region, DestinationRegion the
	// mirror's. Required and distinct.
	SourceRegion      string
	DestinationRegion string
	// SourceNodeID is this node's Raft id in the source region, sent in
	// heartbeats (optional).
	SourceNodeID uint64
	// RetainFrom, if set, returns the home's compaction floor (the lowest
	// offset any mirror region still needs from this log; ok false:
	// unknown), sent in heartbeats so that mirrors keep their logs from
	// there too (Heartbeat.RetainFrom). regionsvc passes its mirrorFloor.
	RetainFrom func() (offset uint64, ok bool)
	// Epoch is the home epoch this region holds the range under. Required.
	// A task serves one epoch: the node starts a new task after a homing
	// change.
	Epoch uint64
	// Source is the range's committed log on this (leader) node. Required.
	Source Source
	// Dialer opens streams to the destination. Required.
	Dialer Dialer
	// Addrs returns the destination region's node addresses (host:port),
	// read before each connect. Required. NOT_LEADER hints are followed
	// first; otherwise the task tries the addresses in turn, staying with
	// one while it works.
	Addrs func() []string
	// Now is the clock stamped on heartbeats (home time), default time.Now.
	Now func() time.Time
	// Seed seeds the reconnect jitter, default 0 (a fixed seed: jitter is
	// for spreading tasks apart, which their different ranges do too).
	Seed uint64
	// Compression of batches, default zstd (CompressionZstd);
	// CompressionNone turns it off.
	Compression Compression
	// ZstdLevel, default zstd.SpeedFastest: on chat-like JSON records it
	// compresses 2.8:1 against SpeedDefault's 3.1:1 at 1.4 times the
	// throughput (BenchmarkReplicate). The encoder of each level is shared
	// by every task of the process.
	ZstdLevel zstd.EncoderLevel
	// HeartbeatInterval is how often an idle stream sends a heartbeat,
	// default 250 ms. It bounds how stale a mirror's lag view gets.
	HeartbeatInterval time.Duration
	// HandshakeTimeout bounds opening a stream until the mirror answers the
	// open, default 5 s.
	HandshakeTimeout time.Duration
	// Window and backoff settings; see CursorConfig for the defaults
	// (8 MiB and 32 requests in flight, 1 MiB batches, 50 ms to 5 s
	// backoff, 3 hints followed at once).
	WindowBytes       int
	WindowRequestsMax int
	BatchBytesMax     int
	BackoffMin        time.Duration
	BackoffMax        time.Duration
	HintsFollowMax    int
	// Logger defaults to a null logger; the task names it "replicator".
	Logger hclog.Logger
	// TracerProvider, if set, traces each batch shipped, from its read
	// to the mirror's answer (tracing.go); default none.
	TracerProvider trace.TracerProvider
}

// Task ships one range to one destination region: the driver of a Cursor.
// Run owns the cursor on one goroutine; a session's two goroutines own the
// gRPC stream (one receives, one compresses and sends) and talk to Run
// through its inbox. See doc.go for the contract.
type Task struct {
	cfg    TaskConfig
	core   *Cursor
	logger hclog.Logger
	enc    *zstd.Encoder
	inbox  chan taskEvent

	ran     atomic.Bool
	sess    *session
	gen     uint64
	addr    string  // the address of the current or last stream
	pending *Action // the Connect waiting for its delay
	rearm   bool    // pending changed: (re)start the connect timer
	tail    uint64

	mu    sync.Mutex // guards stats and lag, read by other goroutines
	stats TaskStats
	lag   *Lag
	ships *shipSpans // nil: tracing off
}

// TaskStats are a task's counters and state.
type TaskStats struct {
	Phase Phase
	// Addr is the destination address of the current or last stream.
	Addr string
	// Next, Acked and Tail: see CursorStatus.
	Next, Acked, Tail uint64
	// InflightBytes and InflightRequests are now; InflightBytesMax is the
	// highest InflightBytes seen at any point.
	InflightBytes, InflightRequests int
	InflightBytesMax                int
	// Batches, FrameBytes and WireBytes count the batches sent, their frame
	// bytes and their payload bytes on the wire (after compression).
	Batches    uint64
	FrameBytes uint64
	WireBytes  uint64
	Heartbeats uint64
	// Streams counts the streams opened (answered); Refusals the refusals
	// received.
	Streams  uint64
	Refusals uint64
	// LastError is the cause of the last reconnect or stop.
	LastError string
	// BehindSourceStart says the last read from the Source was below its
	// log's start (it failed with ErrOutOfRange): retention at the home
	// deleted records the mirror has yet to receive, and the task cannot
	// ship them. It clears at the next read that succeeds: when the
	// Source says where its log starts (SourceStarter), at once, as the
	// task ships from there, flagged, and the mirror skips (Skips counts
	// those batches).
	BehindSourceStart bool
	Skips             uint64
}

// taskEvent is what a session reports to Run.
type taskEvent struct {
	gen  uint64
	kind taskEventKind
	resp *geologinternalv1.ReplicateResponse
	err  error
}

type taskEventKind uint8

const (
	evConnected taskEventKind = iota + 1
	evResponse
	evFailed
)

// NewTask validates cfg and returns a task; Run runs it.
func NewTask(cfg TaskConfig) (*Task, error) {
	switch {
	case cfg.Stream == "":
		return nil, errors.New("replicator: TaskConfig.Stream is required")
	case cfg.SourceRegion == "" || cfg.DestinationRegion == "" || cfg.SourceRegion == cfg.DestinationRegion:
		return nil, fmt.Errorf("replicator: TaskConfig needs two distinct regions, got %q and %q", cfg.SourceRegion, cfg.DestinationRegion)
	case cfg.Source == nil || cfg.Dialer == nil || cfg.Addrs == nil:
		return nil, errors.New("replicator: TaskConfig.Source, Dialer and Addrs are required")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Compression == 0 {
		cfg.Compression = CompressionZstd
	}
	if cfg.Compression != CompressionZstd && cfg.Compression != CompressionNone {
		return nil, fmt.Errorf("replicator: unknown compression %v", cfg.Compression)
	}
	if cfg.ZstdLevel == 0 {
		cfg.ZstdLevel = zstd.SpeedFastest
	}
	setDuration(&cfg.HeartbeatInterval, 250*time.Millisecond)
	setDuration(&cfg.HandshakeTimeout, 5*time.Second)
	core, err := NewCursor(CursorConfig{
		Epoch:             cfg.Epoch,
		Rand:              rand.New(rand.NewPCG(cfg.Seed, uint64(cfg.Range))),
		WindowBytes:       cfg.WindowBytes,
		WindowRequestsMax: cfg.WindowRequestsMax,
		BatchBytesMax:     cfg.BatchBytesMax,
		BackoffMin:        cfg.BackoffMin,
		BackoffMax:        cfg.BackoffMax,
		HintsFollowMax:    cfg.HintsFollowMax,
	})
	if err != nil {
		return nil, err
	}
	var enc *zstd.Encoder
	if cfg.Compression == CompressionZstd {
		if enc, err = sharedEncoder(cfg.ZstdLevel); err != nil {
			return nil, err
		}
	}
	t := &Task{
		cfg:  cfg,
		core: core,
		logger: cfg.Logger.Named("replicator").With("stream", cfg.Stream, "range", cfg.Range,
			"to", cfg.DestinationRegion, "epoch", cfg.Epoch),
		enc: enc,
		// Answers never outnumber requests in flight; the slack takes the
		// connect and failure reports.
		inbox: make(chan taskEvent, core.cfg.WindowRequestsMax+4),
		lag:   NewLag(cfg.Now()),
		ships: newShipSpans(cfg),
	}
	return t, nil
}

// Run ships until ctx ends (it then returns ctx.Err()) or the mirror fences
// the source (it returns an error wrapping ErrFenced). A Task runs once.
func (t *Task) Run(ctx context.Context) error {
	if t.ran.Swap(true) {
		return errors.New("replicator: Task.Run called twice")
	}
	defer t.endSession()
	ticker := time.NewTicker(t.cfg.HeartbeatInterval)
	defer ticker.Stop()
	var connectTimer *time.Timer
	var connectC <-chan time.Time
	defer func() {
		if connectTimer != nil {
			connectTimer.Stop()
		}
	}()

	tailCh := t.cfg.Source.TailChanged()
	t.tail = t.cfg.Source.CommittedEnd()
	t.core.TailAdvanced(t.tail)
	t.core.Start()
	for {
		if err := t.step(); err != nil {
			t.publish()
			return err
		}
		if t.rearm {
			t.rearm = false
			if connectTimer != nil {
				connectTimer.Stop()
			}
			connectTimer = time.NewTimer(t.pending.Delay)
			connectC = connectTimer.C
		}
		t.publish()
		select {
		case <-ctx.Done():
			t.core.Stop(ctx.Err())
			t.publish()
			return ctx.Err()
		case <-ticker.C:
			t.core.Tick()
		case <-tailCh:
			tailCh = t.cfg.Source.TailChanged()
			t.tail = max(t.tail, t.cfg.Source.CommittedEnd())
			t.core.TailAdvanced(t.tail)
		case <-connectC:
			connectC, connectTimer = nil, nil
			a := *t.pending
			t.pending = nil
			t.startSession(ctx, a)
		case ev := <-t.inbox:
			t.handle(ev)
		}
	}
}

// step executes the cursor's actions until it has none; it returns the
// cursor's error once it stopped.
func (t *Task) step() error {
	for {
		acts := t.core.Ready()
		if len(acts) == 0 {
			return nil
		}
		for _, a := range acts {
			switch a.Kind {
			case ActionConnect:
				t.endSession()
				if a.Err != nil {
					t.noteError(a.Err)
					t.logger.Debug("reconnecting", "delay", a.Delay, "hint", a.Hint, "error", a.Err)
				}
				t.pending, t.rearm = &a, true
			case ActionRead:
				t.read(a)
			case ActionHeartbeat:
				t.send(outgoing{req: t.request(nil)})
				t.mu.Lock()
				t.stats.Heartbeats++
				t.mu.Unlock()
			case ActionStop:
				t.endSession()
				t.noteError(a.Err)
				if errors.Is(a.Err, ErrFenced) {
					t.logger.Warn("fenced: stopping", "error", a.Err)
				}
				return a.Err
			}
		}
	}
}

// read executes a Read action: read, check, send, report.
func (t *Task) read(a Action) {
	from := a.From
	frames, err := t.cfg.Source.ReadFrames(from, a.MaxBytes, t.tail)
	behind := errors.Is(err, ErrOutOfRange)
	if ss, ok := t.cfg.Source.(SourceStarter); ok && behind {
		// Retention deleted [a.From, start) here before the mirror had
		// it: ship from the start, flagged, and the mirror skips to it.
		if start := ss.StartOffset(); start > a.From {
			from = start
			frames, err = t.cfg.Source.ReadFrames(from, a.MaxBytes, t.tail)
		}
	}
	skip := from != a.From
	t.mu.Lock()
	t.stats.BehindSourceStart = errors.Is(err, ErrOutOfRange) // a skip's read from the start clears it
	t.mu.Unlock()
	if err != nil {
		t.logger.Warn("source read failed", "from", from, "error", err)
		t.core.ReadFailed(err)
		return
	}
	if len(frames) == 0 && skip {
		t.skipMarker(a.From, from)
		return
	}
	if len(frames) == 0 {
		t.core.ReadEmpty()
		return
	}
	first, end, count, err := scanFrames(frames)
	if err == nil && first > from && frameCompacted(frames) {
		// The home compacted [from, first) away: the batch covers that
		// hole too, so that it continues where the mirror stands.
		first = from
	}
	if err == nil && (first > from || end <= from) {
		err = fmt.Errorf("%w: source returned [%d, %d) for a read from %d", ErrOutOfRange, first, end, from)
	}
	if err != nil {
		t.logger.Error("source returned bad frames", "from", a.From, "error", err)
		t.core.ReadFailed(err)
		return
	}
	if len(frames) > a.FitBytes {
		t.core.ReadBlocked(len(frames))
		return
	}
	req := t.request(&geologinternalv1.MirrorBatch{
		FirstOffset:       first,
		EndOffset:         end,
		FrameCount:        count,
		UncompressedBytes: uint64(len(frames)),
		FromSourceStart:   skip,
	})
	t.send(outgoing{req: req, frames: frames})
	t.ships.sent(first, end, len(frames))
	if skip {
		t.mu.Lock()
		t.stats.Skips++
		t.mu.Unlock()
		t.logger.Warn("mirror is behind this log's start: shipping from the start, the mirror skips", "from", a.From, "start", first)
		first = a.From // the cursor ships on from where it stood; the batch covers the skipped offsets
	}
	t.core.ReadDone(first, end, len(frames))
}

// skipMarker ships a batch of no frames flagged from_source_start at
// start, the source's log start and committed tail: retention deleted the
// whole log (an idle stream under age retention), from where the mirror
// stood (from) on, so no frame can carry the flag; the mirror skips to
// start without waiting for the next record (TestTaskSkipsToEmptySource).
func (t *Task) skipMarker(from, start uint64) {
	t.send(outgoing{req: t.request(&geologinternalv1.MirrorBatch{FirstOffset: start, EndOffset: start, FromSourceStart: true})})
	t.ships.sent(start, start, 0)
	t.mu.Lock()
	t.stats.Skips++
	t.mu.Unlock()
	t.logger.Warn("mirror is behind this log's start and the log is empty: the mirror skips to it", "from", from, "start", start)
	t.core.ReadDone(from, start, 0)
}

// scanFrames walks concatenated frames by their length and header fields
// (the source verified their CRCs; the mirror verifies them again) and
// returns the offsets they cover and their count.
func scanFrames(frames []byte) (first, end uint64, count uint32, err error) {
	for p := 0; p < len(frames); count++ {
		size, err := batch.FrameSize(frames[p:])
		if err != nil || size > len(frames)-p || size < batch.HeaderSize {
			return 0, 0, 0, fmt.Errorf("%w: frame at byte %d: %v", batch.ErrCorrupt, p, err)
		}
		f := frames[p : p+size]
		if p == 0 {
			first = frameBase(f)
		} else if frameBase(f) != end && !(frameCompacted(f) && frameBase(f) > end) {
			return 0, 0, 0, fmt.Errorf("%w: frame at %d follows end %d", batch.ErrCorrupt, frameBase(f), end)
		}
		end = frameNext(f)
		p += size
	}
	if end <= first {
		return 0, 0, 0, fmt.Errorf("%w: frames cover no offset", batch.ErrCorrupt)
	}
	return first, end, count, nil
}

// outgoing is a request queued for a session's sender, with the frames it
// compresses into the batch's payload (nil for a heartbeat).
type outgoing struct {
	req    *geologinternalv1.ReplicateRequest
	frames []byte
}

// request builds a request around b (nil: heartbeat only) with a fresh
// heartbeat. The home time is read before the tail, so that the tail
// claimed for that time is at least the tail then (lag errs high).
func (t *Task) request(b *geologinternalv1.MirrorBatch) *geologinternalv1.ReplicateRequest {
	now := t.cfg.Now()
	t.tail = max(t.tail, t.cfg.Source.CommittedEnd())
	hb := Heartbeat{CommittedEnd: t.tail, HomeTimeUnixNanos: now.UnixNano(), Epoch: t.cfg.Epoch, LeaderNodeID: t.cfg.SourceNodeID}
	if t.cfg.RetainFrom != nil {
		hb.RetainFrom, hb.RetainFromKnown = t.cfg.RetainFrom()
	}
	t.mu.Lock()
	t.lag.Heartbeat(hb, now)
	t.mu.Unlock()
	req := &geologinternalv1.ReplicateRequest{
		Heartbeat: &geologinternalv1.HomeHeartbeat{
			CommittedEndOffset: hb.CommittedEnd,
			HomeTimeUnixNanos:  hb.HomeTimeUnixNanos,
			HomeEpoch:          hb.Epoch,
			LeaderNodeId:       hb.LeaderNodeID,
		},
		Batch: b,
	}
	if hb.RetainFromKnown {
		req.Heartbeat.RetainFromOffset = &hb.RetainFrom
	}
	return req
}

// send queues o for the current session's sender. The queue has room for
// every request the cursor allows in flight, so this never blocks.
func (t *Task) send(o outgoing) {
	if t.sess == nil {
		panic("replicator: send without a session")
	}
	select {
	case t.sess.sendq <- o:
	default:
		panic("replicator: send queue overflow: more requests than the window allows")
	}
}

// handle feeds one session report to the cursor.
func (t *Task) handle(ev taskEvent) {
	if t.sess == nil || ev.gen != t.sess.gen {
		return // from a session already given up
	}
	switch ev.kind {
	case evConnected:
		if d := ev.resp.GetError(); d != nil {
			t.countRefusal()
			t.core.OpenRefused(fromDetail(d))
			return
		}
		t.logger.Debug("stream open", "addr", t.addr, "applied_end", ev.resp.GetAppliedEndOffset())
		applied := ev.resp.GetAppliedEndOffset()
		at, resend := ResumeAt(applied, ev.resp.LogEpoch, t.cfg.Epoch, t.epochStart)
		t.mu.Lock()
		t.stats.Streams++
		// The mirror needs this log from at on (its end, or the resend's
		// start): what the lag says is the compaction floor (regionsvc's
		// mirrorFloor), which must not pass a divergent mirror's fork point
		// before the resend reached it.
		t.lag.Applied(at)
		t.mu.Unlock()
		t.sess.startSender(t)
		if resend && at < applied {
			t.logger.Info("mirror's log ends in an older epoch: resending from this log's epoch change", "mirror_epoch", ev.resp.GetLogEpoch(),
				"applied_end", applied, "from", at)
		}
		t.core.Connected(at, ev.resp.GetHighestEpoch())
		if resend {
			t.core.Resend()
		}
	case evResponse:
		d := ev.resp.GetError()
		if d != nil {
			t.countRefusal()
			r := fromDetail(d)
			if errors.Is(r, ErrGap) {
				t.logger.Info("mirror expects an earlier offset: rewinding", "expected", r.ExpectedOffset())
			}
			t.ships.failed(r)
			t.core.Refused(r)
			return
		}
		t.mu.Lock()
		t.lag.Applied(ev.resp.GetAppliedEndOffset())
		t.mu.Unlock()
		t.ships.applied(ev.resp.GetAppliedEndOffset())
		t.core.Response(ev.resp.GetAppliedEndOffset(), ev.resp.GetHighestEpoch())
	case evFailed:
		t.ships.failed(ev.err)
		t.core.StreamFailed(classify(ev.err))
	}
}

func (t *Task) countRefusal() {
	t.mu.Lock()
	t.stats.Refusals++
	t.mu.Unlock()
}

// classify turns a stream error carrying an ErrorDetail into a Refusal.
func classify(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, d := range st.Details() {
		if ed, ok := d.(*geologv1.ErrorDetail); ok {
			return fromDetail(ed)
		}
	}
	return err
}

func (t *Task) noteError(err error) {
	if err == nil {
		return
	}
	t.mu.Lock()
	t.stats.LastError = err.Error()
	t.mu.Unlock()
}

// pickAddr chooses where the next stream goes: the hint if there is one,
// the last address if the last stream ended without an error to blame on
// it, else the next address in the list.
func (t *Task) pickAddr(a Action) string {
	if a.Hint != "" {
		if _, _, err := net.SplitHostPort(a.Hint); err == nil {
			return a.Hint
		}
		t.logger.Warn("ignoring a leader hint that is not host:port", "hint", a.Hint)
	}
	addrs := t.cfg.Addrs()
	if len(addrs) == 0 {
		return ""
	}
	i := slices.Index(addrs, t.addr)
	switch {
	case i < 0:
		return addrs[0]
	case a.Err == nil:
		return addrs[i]
	default:
		return addrs[(i+1)%len(addrs)]
	}
}

// Stats returns the task's counters; safe from any goroutine.
func (t *Task) Stats() TaskStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stats
}

// Lag returns the mirror's lag as the home sees it, at local time now: the
// heartbeats are the ones this task sent, the applied ends the mirror's
// answers, so both times are on the home's clock. Safe from any goroutine.
func (t *Task) Lag(now time.Time) LagStatus {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lag.Status(now)
}

// publish copies the cursor's state into the stats.
func (t *Task) publish() {
	st := t.core.Status()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stats.Phase = st.Phase
	t.stats.Addr = t.addr
	t.stats.Next, t.stats.Acked, t.stats.Tail = st.Next, st.Acked, st.Tail
	t.stats.InflightBytes, t.stats.InflightRequests = st.InflightBytes, st.InflightRequests
	t.stats.InflightBytesMax = st.InflightBytesMax
}

// epochStart is the first offset below end whose frame in the source's log
// has an epoch above after (end when there is none): epochs never decrease
// along a log, so a binary search over offsets finds it. Offsets below the
// log's start (compacted) count as older.
func (t *Task) epochStart(after, end uint64) uint64 {
	end = min(end, t.cfg.Source.CommittedEnd())
	lo, hi := uint64(0), end
	for lo < hi {
		mid := lo + (hi-lo)/2
		f, err := t.cfg.Source.ReadFrames(mid, 1, end)
		if err != nil || len(f) == 0 {
			lo = mid + 1 // below the start, or unreadable: not past the change
			continue
		}
		h, err := batch.DecodeHeader(f)
		if err != nil {
			lo = mid + 1
			continue
		}
		if h.Epoch > after {
			hi = min(mid, h.BaseOffset) // the frame holding mid may start before it
			if h.BaseOffset < lo {
				lo = h.BaseOffset
			}
		} else {
			lo = h.NextOffset()
		}
	}
	return lo
}
