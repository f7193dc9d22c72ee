package replicator

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/backoff"
)

// CursorConfig configures a Cursor. Zero values take the documented
// defaults; NewCursor validates the rest.
type CursorConfig struct {
	// Epoch is the home epoch the source holds the range under. Required.
	Epoch uint64
	// Rand draws the reconnect jitter. Required: seed it, so that a run
	// replays.
	Rand *rand.Rand
	// WindowBytes bounds the frame bytes (uncompressed) sent and not yet
	// acknowledged, default 8 MiB. A single frame larger than the window
	// still travels, alone.
	WindowBytes int
	// WindowRequestsMax bounds the requests (batches and heartbeats) sent
	// and not yet answered, default 32.
	WindowRequestsMax int
	// BatchBytesMax bounds the frame bytes read for one batch, default
	// 1 MiB (a single larger frame travels alone). At most WindowBytes.
	BatchBytesMax int
	// BackoffMin is the first reconnect wait, default 50 ms; each failed
	// attempt doubles it up to BackoffMax, default 5 s. Each wait is
	// jittered to [w/2, w] (backoff.Delay). A response that is not a refusal resets it.
	BackoffMin time.Duration
	BackoffMax time.Duration
	// HintsFollowMax bounds the NOT_LEADER hints followed at once, without
	// a wait, in a row without a stream coming up, default 3; after that the
	// backoff applies to hints too.
	HintsFollowMax int
}

func (c *CursorConfig) setDefaults() error {
	if c.Epoch == 0 {
		return errors.New("replicator: CursorConfig.Epoch is required")
	}
	if c.Rand == nil {
		return errors.New("replicator: CursorConfig.Rand is required")
	}
	setInt(&c.WindowBytes, 8<<20)
	setInt(&c.WindowRequestsMax, 32)
	setInt(&c.BatchBytesMax, 1<<20)
	setDuration(&c.BackoffMin, 50*time.Millisecond)
	setDuration(&c.BackoffMax, 5*time.Second)
	setInt(&c.HintsFollowMax, 3)
	if c.BatchBytesMax > c.WindowBytes {
		return fmt.Errorf("replicator: BatchBytesMax %d exceeds WindowBytes %d", c.BatchBytesMax, c.WindowBytes)
	}
	if c.BackoffMin > c.BackoffMax {
		return fmt.Errorf("replicator: BackoffMin %s exceeds BackoffMax %s", c.BackoffMin, c.BackoffMax)
	}
	return nil
}

func setInt(v *int, def int) {
	if *v <= 0 {
		*v = def
	}
}

func setDuration(v *time.Duration, def time.Duration) {
	if *v <= 0 {
		*v = def
	}
}

// ActionKind says what an Action asks the driver to do.
type ActionKind uint8

const (
	// ActionConnect: drop the current stream (if any), wait Delay, open a
	// new one (to Hint if set, else to the next destination address) and
	// report Connected, OpenRefused or StreamFailed.
	ActionConnect ActionKind = iota + 1
	// ActionRead: read committed frames from From (the frame holding From
	// first) up to MaxBytes, and send them as one batch if their size is at
	// most FitBytes, then report ReadDone; report ReadBlocked if they do not
	// fit, ReadEmpty if there were none, ReadFailed on an error.
	ActionRead
	// ActionHeartbeat: send a heartbeat-only request.
	ActionHeartbeat
	// ActionStop: the task is over (Err says why); drop the stream.
	ActionStop
)

func (k ActionKind) String() string {
	switch k {
	case ActionConnect:
		return "connect"
	case ActionRead:
		return "read"
	case ActionHeartbeat:
		return "heartbeat"
	case ActionStop:
		return "stop"
	default:
		return fmt.Sprintf("action(%d)", uint8(k))
	}
}

// Action is one thing the driver must do, in the order Ready returns them.
type Action struct {
	Kind ActionKind
	// Connect: how long to wait first, the address to try (a NOT_LEADER
	// hint; empty: the driver's choice) and why the last stream ended.
	Delay time.Duration
	Hint  string
	// Read: where to start, how much to read, and how much may be sent.
	From     uint64
	MaxBytes int
	FitBytes int
	// Connect and Stop: the cause (nil for the first connect).
	Err error
}

func (a Action) String() string {
	switch a.Kind {
	case ActionConnect:
		s := fmt.Sprintf("connect delay=%s", a.Delay)
		if a.Hint != "" {
			s += " hint=" + a.Hint
		}
		if a.Err != nil {
			s += fmt.Sprintf(" err=%q", a.Err)
		}
		return s
	case ActionRead:
		return fmt.Sprintf("read from=%d max=%d fit=%d", a.From, a.MaxBytes, a.FitBytes)
	case ActionStop:
		return fmt.Sprintf("stop err=%q", a.Err)
	default:
		return a.Kind.String()
	}
}

// Phase is where a Cursor is in its life.
type Phase uint8

const (
	// PhaseIdle: not started.
	PhaseIdle Phase = iota
	// PhaseConnecting: a stream is being opened (or waited for).
	PhaseConnecting
	// PhaseStreaming: the mirror answered the open; batches flow.
	PhaseStreaming
	// PhaseStopped: fenced or stopped; nothing more happens.
	PhaseStopped
)

func (p Phase) String() string {
	return [...]string{"idle", "connecting", "streaming", "stopped"}[p]
}

// inflightRequest is a request sent and not yet answered.
type inflightRequest struct {
	end       uint64 // batch: its end offset
	bytes     int    // batch: its frame bytes
	heartbeat bool
	// stale marks a batch sent before a rewind: its answer (a gap refusal,
	// most likely) says nothing about the new position.
	stale bool
}

// Cursor is the source side of one (range, destination region): a
// deterministic state machine with no goroutine, clock or socket. The
// driver feeds it events (Start, Connected, Response, Refused, ...) and
// executes the Actions Ready returns. See doc.go for the contract.
type Cursor struct {
	cfg CursorConfig

	phase Phase
	tail  uint64 // the source's committed end, as last told
	next  uint64 // the next offset to read
	acked uint64 // the mirror's applied end, highest reported on this stream

	inflight      []inflightRequest // FIFO: answers come in request order
	inflightBytes int
	inflightPeak  int  // the highest inflightBytes ever
	reading       bool // a Read is outstanding
	blockedBytes  int  // the last read did not fit: wait for this much room
	sentSinceTick bool

	attempts int // failed connects in a row
	hints    int // hints followed in a row without a stream coming up
	// resending: this stream resumed below the mirror's applied end (see
	// Resend); until the mirror answers a batch, its applied end does not
	// move the cursor.
	resending bool

	actions []Action
	err     error // why the cursor stopped
}

// NewCursor validates cfg and returns an idle cursor.
func NewCursor(cfg CursorConfig) (*Cursor, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &Cursor{cfg: cfg}, nil
}

// Start begins: the first action is a Connect without delay.
func (c *Cursor) Start() {
	if c.phase != PhaseIdle {
		return
	}
	c.phase = PhaseConnecting
	c.actions = append(c.actions, Action{Kind: ActionConnect})
}

// Stop ends the cursor for err (the owner's reason).
func (c *Cursor) Stop(err error) { c.stop(err) }

func (c *Cursor) stop(err error) {
	if c.phase == PhaseStopped {
		return
	}
	c.phase = PhaseStopped
	c.err = err
	c.resetStream()
	c.actions = append(c.actions, Action{Kind: ActionStop, Err: err})
}

// Err is why the cursor stopped, or nil.
func (c *Cursor) Err() error { return c.err }

// TailAdvanced tells the cursor the source's committed end.
func (c *Cursor) TailAdvanced(end uint64) {
	c.tail = max(c.tail, end)
}

// Connected reports that the stream is open: the mirror has applied every
// offset below appliedEnd and has seen epochs up to highestEpoch. Shipping
// resumes at appliedEnd.
func (c *Cursor) Connected(appliedEnd, highestEpoch uint64) {
	if c.phase != PhaseConnecting {
		return // a late report of a stream already given up
	}
	if highestEpoch > c.cfg.Epoch {
		c.stop(fmt.Errorf("%w: mirror has seen epoch %d, source holds %d", ErrFenced, highestEpoch, c.cfg.Epoch))
		return
	}
	c.phase = PhaseStreaming
	c.resetStream()
	c.next, c.acked = appliedEnd, appliedEnd
	c.hints = 0
	c.resending = false
}

// Resend reports that the offset the stream was Connected at lies below
// the mirror's applied end, because the mirror's log ends in an older
// epoch than the source's: what it holds past that offset may be another
// home's divergent tail, which the mirror finds (and forks off) only by
// comparing the batches sent from there (DESIGN.md "Divergent tails").
// Until the mirror answers one of them, the applied end it reports (to a
// heartbeat, say) counts that tail: it neither acknowledges offsets nor
// moves the cursor past what it has sent. Without this, a heartbeat
// answered before the first batch went out moved the cursor to the
// mirror's end, the batch that followed started inside the divergent
// tail, and the mirror forked there, keeping the old home's records below
// it in its log (found by the chaos scenario home-region-partitioned).
func (c *Cursor) Resend() {
	if c.phase == PhaseStreaming {
		c.resending = true
	}
}

// ResumeAt decides where shipping resumes on a stream the mirror opened
// with applied (its applied end) and logEpoch (the epoch its log ends in,
// nil if it did not say), for a source at homeEpoch: from is the offset
// to pass to Connected, and resend whether to call Resend after it. A
// mirror whose log ends in an older epoch than the source's may hold
// another home's divergent tail past where this log left that epoch, so
// shipping resumes at epochStart(logEpoch, applied) (the first offset
// below applied this log holds in an epoch after logEpoch; offsets below
// the source's log start count as older) and in resend mode, even when
// that is the applied end itself: the mirror's leader may hold an old
// home's uncommitted tail past it, which commits after this answer (sim
// seed 1700391). Otherwise it resumes at applied. The Task and the
// simulator's replicator both call it, each with its own search.
func ResumeAt(applied uint64, logEpoch *uint64, homeEpoch uint64, epochStart func(after, end uint64) uint64) (from uint64, resend bool) {
	if logEpoch == nil || *logEpoch >= homeEpoch || applied == 0 {
		return applied, false
	}
	return min(epochStart(*logEpoch, applied), applied), true
}

// OpenRefused reports that the mirror refused the open request; the stream
// is over.
func (c *Cursor) OpenRefused(r *Refusal) {
	if c.phase != PhaseConnecting {
		return
	}
	c.refusedFinal(r)
}

// StreamFailed reports that the stream, or the attempt to open it, ended
// without a refusal (a transport error, io.EOF, a handshake timeout). A
// NOT_LEADER status with a hint is followed like a refusal.
func (c *Cursor) StreamFailed(err error) {
	if c.phase != PhaseConnecting && c.phase != PhaseStreaming {
		return
	}
	var r *Refusal
	if errors.As(err, &r) {
		c.refusedFinal(r)
		return
	}
	var ae *apierr.Error
	if errors.As(err, &ae) && ae.Code != apierr.Internal {
		c.refusedFinal(fromAPI(ae))
		return
	}
	c.reconnect(err, "")
}

// Response reports the answer to the oldest request in flight that was not
// a refusal: the mirror's applied end and highest epoch after it.
func (c *Cursor) Response(appliedEnd, highestEpoch uint64) {
	if c.phase != PhaseStreaming {
		return
	}
	if len(c.inflight) == 0 {
		c.reconnect(fmt.Errorf("%w: response with no request in flight", ErrProtocol), "")
		return
	}
	head := c.pop()
	if highestEpoch > c.cfg.Epoch {
		c.stop(fmt.Errorf("%w: mirror has seen epoch %d, source holds %d", ErrFenced, highestEpoch, c.cfg.Epoch))
		return
	}
	if !head.heartbeat && !head.stale && appliedEnd < head.end {
		c.reconnect(fmt.Errorf("%w: batch to %d acknowledged with applied end %d", ErrProtocol, head.end, appliedEnd), "")
		return
	}
	c.attempts = 0
	if c.resending {
		if head.heartbeat || head.stale {
			return // the mirror has not compared anything of ours yet
		}
		c.resending = false
	}
	c.acked = max(c.acked, appliedEnd)
	// A mirror ahead of what was sent (another source of the same home
	// shipped more) needs none of it again.
	if !head.stale && !c.reading && c.acked > c.next {
		c.next = c.acked
	}
}

// Refused reports a refusal of the oldest request in flight. A gap rewinds
// on the same stream; any other refusal ends the stream (the server closes
// it), and STALE_EPOCH ends the cursor.
func (c *Cursor) Refused(r *Refusal) {
	if c.phase != PhaseStreaming {
		return
	}
	if len(c.inflight) == 0 {
		c.reconnect(fmt.Errorf("%w: refusal with no request in flight: %v", ErrProtocol, r), "")
		return
	}
	head := c.pop()
	if !errors.Is(r, ErrGap) {
		c.refusedFinal(r)
		return
	}
	if head.stale {
		return // an answer to a batch sent before the rewind
	}
	if head.heartbeat {
		c.reconnect(fmt.Errorf("%w: heartbeat refused as a gap", ErrProtocol), "")
		return
	}
	// Rewind to what the mirror expects. Everything still in flight was
	// sent after the refused batch, so it cannot extend the mirror either:
	// its answers are ignored, but its bytes count until they come.
	expected := r.ExpectedOffset()
	c.next, c.acked = expected, expected
	c.blockedBytes = 0
	for i := range c.inflight {
		c.inflight[i].stale = true
	}
}

// refusedFinal handles a refusal after which the stream is over.
func (c *Cursor) refusedFinal(r *Refusal) {
	switch {
	case errors.Is(r, ErrStaleEpoch):
		c.stop(fmt.Errorf("%w: %v", ErrFenced, r))
	case errors.Is(r, ErrNotLeader) && r.API.LeaderHint != "":
		c.reconnect(r, r.API.LeaderHint)
	default:
		c.reconnect(r, "")
	}
}

// ReadDone reports that the frames [first, end), bytes long, were read for
// the outstanding Read and sent as one batch (0 bytes: a skip marker, the
// source's whole log deleted up to end).
func (c *Cursor) ReadDone(first, end uint64, bytes int) {
	if c.phase != PhaseStreaming || !c.reading {
		panic(fmt.Sprintf("replicator: ReadDone without a Read outstanding (phase %v)", c.phase))
	}
	if end <= c.next || first > c.next || bytes < 0 {
		panic(fmt.Sprintf("replicator: ReadDone [%d, %d) of %d bytes for a read from %d", first, end, bytes, c.next))
	}
	c.reading = false
	c.blockedBytes = 0
	c.next = end
	c.inflight = append(c.inflight, inflightRequest{end: end, bytes: bytes})
	c.inflightBytes += bytes
	c.inflightPeak = max(c.inflightPeak, c.inflightBytes)
	c.sentSinceTick = true
}

// ReadEmpty reports that the outstanding Read found no committed frame:
// the cursor waits for the next TailAdvanced.
func (c *Cursor) ReadEmpty() {
	if !c.reading {
		panic("replicator: ReadEmpty without a Read outstanding")
	}
	c.reading = false
	c.tail = c.next
}

// ReadBlocked reports that the outstanding Read returned bytes that did
// not fit the window (a single frame larger than the room left) and were
// not sent: the cursor waits until that much room is free.
func (c *Cursor) ReadBlocked(bytes int) {
	if !c.reading {
		panic("replicator: ReadBlocked without a Read outstanding")
	}
	c.reading = false
	c.blockedBytes = bytes
}

// ReadFailed reports that the outstanding Read failed; the cursor drops the
// stream and retries after a backoff.
func (c *Cursor) ReadFailed(err error) {
	if !c.reading {
		panic("replicator: ReadFailed without a Read outstanding")
	}
	c.reading = false
	c.reconnect(fmt.Errorf("replicator: read from the source: %w", err), "")
}

// heartbeatSent counts a heartbeat-only request as sent.
func (c *Cursor) heartbeatSent() {
	c.inflight = append(c.inflight, inflightRequest{heartbeat: true})
	c.sentSinceTick = true
}

// Tick is called every heartbeat interval: a stream that sent nothing
// since the last tick sends a heartbeat.
func (c *Cursor) Tick() {
	if c.phase == PhaseStreaming && !c.sentSinceTick && len(c.inflight) < c.cfg.WindowRequestsMax {
		c.actions = append(c.actions, Action{Kind: ActionHeartbeat})
		c.heartbeatSent()
	}
	c.sentSinceTick = false
}

// Ready returns the actions to execute now, in order, and forgets them.
func (c *Cursor) Ready() []Action {
	if c.phase == PhaseStreaming && !c.reading && c.next < c.tail && len(c.inflight) < c.cfg.WindowRequestsMax {
		room := c.cfg.WindowBytes - c.inflightBytes
		switch {
		case len(c.inflight) == 0 || c.inflightBytes == 0:
			// Nothing in flight holds bytes: whatever the read returns may
			// go, even a frame larger than the window.
			c.read(c.cfg.BatchBytesMax, int(^uint(0)>>1))
		case room >= c.cfg.BatchBytesMax && room >= c.blockedBytes:
			c.read(c.cfg.BatchBytesMax, room)
		}
	}
	a := c.actions
	c.actions = nil
	return a
}

func (c *Cursor) read(maxBytes, fitBytes int) {
	c.reading = true
	c.actions = append(c.actions, Action{Kind: ActionRead, From: c.next, MaxBytes: maxBytes, FitBytes: fitBytes})
}

func (c *Cursor) pop() inflightRequest {
	h := c.inflight[0]
	c.inflight = c.inflight[1:]
	c.inflightBytes -= h.bytes
	if len(c.inflight) == 0 {
		c.inflight = nil // let the backing array go
	}
	return h
}

// reconnect drops the stream and asks for a new one after a backoff (none
// for a hint while hints are followed freely).
func (c *Cursor) reconnect(cause error, hint string) {
	c.phase = PhaseConnecting
	c.resetStream()
	var delay time.Duration
	if hint != "" && c.hints < c.cfg.HintsFollowMax {
		c.hints++
	} else {
		delay = backoff.Delay(c.attempts, c.cfg.BackoffMin, c.cfg.BackoffMax, c.cfg.Rand)
		c.attempts++
	}
	c.actions = append(c.actions, Action{Kind: ActionConnect, Delay: delay, Hint: hint, Err: cause})
}

func (c *Cursor) resetStream() {
	c.inflight = nil
	c.inflightBytes = 0
	c.reading = false
	c.blockedBytes = 0
	c.sentSinceTick = false
}

// CursorStatus is a snapshot of a Cursor.
type CursorStatus struct {
	Phase Phase
	// Next is the next offset to read; Acked the mirror's applied end as
	// last reported on the current stream; Tail the source's committed end.
	Next, Acked, Tail uint64
	// InflightBytes and InflightRequests are what is sent and unanswered;
	// InflightBytesMax is the highest InflightBytes ever.
	InflightBytes, InflightRequests int
	InflightBytesMax                int
	// Attempts counts failed connects in a row.
	Attempts int
}

// Status returns a snapshot of the cursor.
func (c *Cursor) Status() CursorStatus {
	return CursorStatus{
		Phase: c.phase, Next: c.next, Acked: c.acked, Tail: c.tail,
		InflightBytes: c.inflightBytes, InflightRequests: len(c.inflight),
		InflightBytesMax: c.inflightPeak, Attempts: c.attempts,
	}
}
