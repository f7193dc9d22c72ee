package homing

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Config configures a Homes driver. Zero values take the documented
// defaults.
type Config struct {
	// NodeID is this node's id (non-zero). Required.
	NodeID uint64
	// Region is this node's region. Required.
	Region string
	// Store is the lease store. Required. The driver does not close it.
	Store Store
	// Now is the node's clock, default time.Now. Only wall-clock readings
	// are used (UnixNano): they are compared with other nodes' readings.
	Now func() time.Time
	// HeartbeatInterval is the time between heartbeats, default 1s.
	HeartbeatInterval time.Duration
	// RetryInterval is the time from a failed heartbeat to the next,
	// default HeartbeatInterval/4.
	RetryInterval time.Duration
	// LivenessTTL is how far a heartbeat extends the lease, default 5s. It
	// must exceed MaxClockOffset + HeartbeatInterval + RetryInterval.
	LivenessTTL time.Duration
	// MaxClockOffset is the maximum offset between any two nodes' clocks,
	// default 500ms (CockroachDB's default). The same value must be used
	// cluster-wide.
	MaxClockOffset time.Duration
	// HeartbeatTimeout bounds one heartbeat, default
	// DefaultHeartbeatTimeout(HeartbeatInterval, LivenessTTL,
	// MaxClockOffset).
	HeartbeatTimeout time.Duration
	// RefreshWaitersMax bounds the Refresh calls waiting at once, default
	// 1024; more fail at once with ErrStoreUnavailable.
	RefreshWaitersMax int
	// ManualHeartbeats: heartbeats are sent only by Refresh, never by the
	// timer. For tests and tools that drive the clock themselves.
	ManualHeartbeats bool
	// Logger defaults to a null logger.
	Logger hclog.Logger
}

func (c *Config) setDefaults() {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = time.Second
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = max(c.HeartbeatInterval/4, time.Millisecond)
	}
	if c.LivenessTTL == 0 {
		c.LivenessTTL = 5 * time.Second
	}
	if c.MaxClockOffset == 0 {
		c.MaxClockOffset = 500 * time.Millisecond
	}
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = DefaultHeartbeatTimeout(c.HeartbeatInterval, c.LivenessTTL, c.MaxClockOffset)
	}
	if c.RefreshWaitersMax == 0 {
		c.RefreshWaitersMax = 1024
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
}

// DefaultHeartbeatTimeout is how long one heartbeat may take unless
// Config.HeartbeatTimeout says otherwise: half of the time a lease can be
// served (TTL minus the max clock offset), and at least the interval.
//
// A heartbeat's answer is worth waiting for while the lease it brings (from
// its send time) still has time to run. Cutting it off at the interval, as
// the first version did, threw such answers away: a store slowed by load
// (or a busy machine running the node) past the interval never renewed
// anything although each answer would have extended the lease by seconds,
// the more so as an abandoned attempt closes its connection and the next
// one must open another. Half of the servable lease still leaves time for
// a second attempt, on a fresh connection, when one hangs. With the
// defaults (1 s, 5 s, 500 ms) it is 2.25 s. Other lease-store calls whose
// answers are as short-lived (a node's reads of its ranges' homes, the
// liveness a failover judges by) are bounded by the same.
func DefaultHeartbeatTimeout(interval, ttl, maxOffset time.Duration) time.Duration {
	return max(interval, (ttl-maxOffset)/2)
}

func (c *Config) coreConfig() CoreConfig {
	return CoreConfig{
		NodeID:                 c.NodeID,
		Region:                 c.Region,
		HeartbeatIntervalNanos: int64(c.HeartbeatInterval),
		RetryIntervalNanos:     int64(c.RetryInterval),
		LivenessTTLNanos:       int64(c.LivenessTTL),
		MaxOffsetNanos:         int64(c.MaxClockOffset),
	}
}

// Homes is a node's homing driver: it owns a Core, heartbeats the node's
// liveness record, keeps the view of the ranges homed in its region, and
// publishes it for Check (see doc.go for the contract).
type Homes struct {
	cfg    Config
	logger hclog.Logger
	core   *Core // owned by the run goroutine

	view      atomic.Pointer[View]
	refreshCh chan chan error
	installCh chan installRequest
	changed   chan struct{}

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// Start validates cfg and starts the driver; the first heartbeat (which
// registers the node) is sent at once. Until a heartbeat succeeds, Check
// fails with ErrLeaseExpired.
func Start(cfg Config) (*Homes, error) {
	cfg.setDefaults()
	if cfg.Store == nil {
		return nil, invalidf("Config.Store is required")
	}
	if cfg.HeartbeatInterval < 0 || cfg.RetryInterval < 0 || cfg.LivenessTTL < 0 || cfg.MaxClockOffset < 0 || cfg.HeartbeatTimeout < 0 || cfg.RefreshWaitersMax < 0 {
		return nil, invalidf("durations and bounds must not be negative")
	}
	core, err := NewCore(cfg.coreConfig())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &Homes{
		cfg:       cfg,
		logger:    cfg.Logger.Named("homing").With("node", cfg.NodeID, "region", cfg.Region),
		core:      core,
		refreshCh: make(chan chan error, 16),
		installCh: make(chan installRequest),
		changed:   make(chan struct{}, 1),
		ctx:       ctx,
		cancel:    cancel,
		done:      make(chan struct{}),
	}
	h.view.Store(core.View())
	go h.run()
	return h, nil
}

func (h *Homes) now() int64 { return h.cfg.Now().UnixNano() }

// View returns the current snapshot.
func (h *Homes) View() *View { return h.view.Load() }

// Check returns the homing epoch at which this node may ack appends to the
// range now, or why it may not: ErrLeaseExpired (retriable; also
// ErrStoreUnavailable when the lease store is unreachable), ErrNotHome
// (retriable elsewhere or later), ErrInvalidArgument. It reads the clock and
// one atomic pointer; call it where the ack is decided.
func (h *Homes) Check(stream string, rangeID uint32) (uint64, error) {
	return h.view.Load().Check(RangeKey{Stream: stream, Range: rangeID}, h.now())
}

// CheckRead is Check for a linearizable read (see View.CheckRead).
func (h *Homes) CheckRead(stream string, rangeID uint32) (uint64, error) {
	return h.view.Load().CheckRead(RangeKey{Stream: stream, Range: rangeID}, h.now())
}

// CheckFinal is CheckRead for a planned rehome's final tail (see
// View.CheckFinal).
func (h *Homes) CheckFinal(stream string, rangeID uint32) (uint64, error) {
	return h.view.Load().CheckFinal(RangeKey{Stream: stream, Range: rangeID}, h.now())
}

// Lease is Check with the lease's deadline and start offset.
func (h *Homes) Lease(stream string, rangeID uint32) (Lease, error) {
	return h.view.Load().Lease(RangeKey{Stream: stream, Range: rangeID}, h.now())
}

// MayServeUntil returns the time until which this node may ack, by its own
// clock (the zero time if it may not).
func (h *Homes) MayServeUntil() time.Time {
	v := h.view.Load()
	if v.ServeUntilNanos == 0 {
		return time.Time{}
	}
	return time.Unix(0, v.ServeUntilNanos)
}

// Changed is signalled (coalesced, never blocking the driver) when the
// homes or the liveness epoch change, and when the lease is first extended.
func (h *Homes) Changed() <-chan struct{} { return h.changed }

// Refresh sends a heartbeat now (or right after the one in flight) and
// waits for it: when it returns nil, the lease was extended and the view
// reflects the store at a point after the call began.
func (h *Homes) Refresh(ctx context.Context) error {
	w := make(chan error, 1)
	select {
	case h.refreshCh <- w:
	case <-ctx.Done():
		return newErrorAlso(ErrStoreUnavailable, ctx.Err(), "refresh: %v", ctx.Err())
	case <-h.done:
		return newError(ErrClosed, "homes driver is closed")
	}
	select {
	case err := <-w:
		return err
	case <-ctx.Done():
		return newErrorAlso(ErrStoreUnavailable, ctx.Err(), "refresh: %v", ctx.Err())
	case <-h.done:
		return newError(ErrClosed, "homes driver is closed")
	}
}

type installRequest struct {
	snap RegionHomes
	done chan *View
}

// Install hands the driver a snapshot of this node's region's homes read by
// a committed store transaction (RehomeBatch.Regions): if it is newer than
// the view's, it becomes the view at once, without a heartbeat (the lease
// is not extended). It returns the view published afterwards: from then on
// the node acts on homes at least as new as its HomesVersion, and never on
// older ones (heartbeat answers read before the snapshot are ignored). A
// planned rehome uses it to stop the old home and start the new one without
// a lease-store round trip on their nodes.
func (h *Homes) Install(ctx context.Context, snap RegionHomes) (*View, error) {
	if snap.Region != h.cfg.Region {
		return nil, invalidf("homes of region %q handed to a node of region %q", snap.Region, h.cfg.Region)
	}
	for _, hm := range snap.Homes {
		if hm.Region != h.cfg.Region {
			return nil, invalidf("range %s is homed in %q, not in %q", hm.Key, hm.Region, h.cfg.Region)
		}
	}
	req := installRequest{snap: snap, done: make(chan *View, 1)}
	select {
	case h.installCh <- req:
	case <-ctx.Done():
		return nil, newErrorAlso(ErrStoreUnavailable, ctx.Err(), "install: %v", ctx.Err())
	case <-h.done:
		return nil, newError(ErrClosed, "homes driver is closed")
	}
	return <-req.done, nil // answered at once by the loop
}

// Takeover takes ranges homed in the failed region from over to this
// node's region (see Store.Takeover), with this node's clock and max clock
// offset, then refreshes so that this node's view has them.
func (h *Homes) Takeover(ctx context.Context, from string, ranges []TakeoverRange) (TakeoverResult, error) {
	res, err := h.cfg.Store.Takeover(ctx, TakeoverRequest{
		From: from, To: h.cfg.Region, NowNanos: h.now(), MaxOffsetNanos: int64(h.cfg.MaxClockOffset), Ranges: ranges,
	})
	if err != nil {
		return res, err
	}
	h.logger.Info("takeover", "from", from, "granted", res.Granted(), "requested", len(ranges), "fenced_nodes", len(res.Fenced))
	if res.Granted() > 0 {
		if rerr := h.Refresh(ctx); rerr != nil {
			h.logger.Warn("refresh after takeover failed", "error", rerr)
		}
	}
	return res, nil
}

// PrepareRehome starts a planned move of a range to region to (see
// Store.PrepareRehome).
func (h *Homes) PrepareRehome(ctx context.Context, key RangeKey, epoch uint64, to string) (Home, error) {
	return h.cfg.Store.PrepareRehome(ctx, RehomeRequest{Key: key, Epoch: epoch, To: to})
}

// CompleteRehome finishes a planned move once the old home is drained (see
// Store.CompleteRehome), with this node's clock, then refreshes.
func (h *Homes) CompleteRehome(ctx context.Context, key RangeKey, epoch uint64, to string, startOffset uint64) (Home, error) {
	home, err := h.cfg.Store.CompleteRehome(ctx, RehomeRequest{
		Key: key, Epoch: epoch, To: to, StartOffset: startOffset, NowNanos: h.now(), MaxOffsetNanos: int64(h.cfg.MaxClockOffset),
	})
	if err != nil {
		return home, err
	}
	h.logger.Info("rehomed", "range", key, "to", to, "epoch", home.Epoch, "start_offset", startOffset)
	if rerr := h.Refresh(ctx); rerr != nil {
		h.logger.Warn("refresh after rehome failed", "error", rerr)
	}
	return home, nil
}

// CancelRehome abandons a planned move (see Store.CancelRehome).
func (h *Homes) CancelRehome(ctx context.Context, key RangeKey, epoch uint64) (Home, error) {
	return h.cfg.Store.CancelRehome(ctx, RehomeRequest{Key: key, Epoch: epoch})
}

// Close stops the driver and waits for it (an in-flight heartbeat is
// cancelled). The view stays as it was: Check keeps answering by the clock,
// so a closed node stops acking at its lease's end at the latest.
func (h *Homes) Close() error {
	h.once.Do(h.cancel)
	<-h.done
	return nil
}

type heartbeatOutcome struct {
	req HeartbeatRequest
	res HeartbeatResult
	err error
}

// run is the driver loop: the only goroutine that touches h.core.
func (h *Homes) run() {
	defer close(h.done)
	results := make(chan heartbeatOutcome, 1)
	inflight := false
	var waiting, queued []chan error // for the heartbeat in flight; for the next one
	answer := func(ws []chan error, err error) {
		for _, w := range ws {
			w <- err // buffered, never blocks
		}
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if !inflight {
			if len(queued) > 0 {
				h.core.Force()
			}
			// With manual heartbeats only a forced one (a refresh, or the
			// follow-up to a registration) goes out.
			if !h.cfg.ManualHeartbeats || h.core.Forced() {
				// Contract step 1: the view published by the last Done is
				// what the next heartbeat reports as seen.
				if req, ok := h.core.Next(h.now()); ok {
					inflight = true
					waiting, queued = queued, nil
					go h.heartbeat(req, results)
				} else {
					wait := time.Duration(h.core.Wake() - h.now())
					timer.Reset(max(wait, 0))
				}
			}
		}
		select {
		case <-h.ctx.Done():
			if inflight {
				<-results // the store call sees the cancelled context
			}
			closed := newError(ErrClosed, "homes driver is closed")
			answer(waiting, closed)
			answer(queued, closed)
			return
		case out := <-results:
			inflight = false
			ev := h.core.Done(out.req, out.res, out.err)
			// Contract step 3: publish before anything else can observe
			// the outcome.
			prev := h.view.Load()
			h.view.Store(h.core.View())
			h.report(ev, prev)
			switch {
			case ev.Err != nil:
				answer(waiting, ev.Err)
			case ev.Extended:
				answer(waiting, nil)
			default:
				// Registered or fenced: the follow-up heartbeat (due at
				// once) is the one that extends the lease.
				queued = append(waiting, queued...)
			}
			waiting = nil
		case in := <-h.installCh:
			h.install(in)
		case w := <-h.refreshCh:
			if len(queued)+len(waiting) >= h.cfg.RefreshWaitersMax {
				w <- newError(ErrStoreUnavailable, "%d refreshes already waiting", len(queued)+len(waiting))
				continue
			}
			queued = append(queued, w)
		case <-timer.C:
		}
	}
}

// install takes a snapshot of the region's homes (on the driver loop).
func (h *Homes) install(in installRequest) {
	changed, taken := h.core.Install(in.snap.Version, in.snap.Homes)
	// Contract step 3: publish before anyone learns of it.
	h.view.Store(h.core.View())
	if taken {
		h.logger.Debug("homes installed", "homes_version", in.snap.Version, "ranges", len(in.snap.Homes), "changed", changed)
	}
	if changed {
		select {
		case h.changed <- struct{}{}:
		default:
		}
	}
	in.done <- h.view.Load()
}

func (h *Homes) heartbeat(req HeartbeatRequest, results chan<- heartbeatOutcome) {
	ctx, cancel := context.WithTimeout(h.ctx, h.cfg.HeartbeatTimeout)
	defer cancel()
	res, err := h.cfg.Store.Heartbeat(ctx, req)
	results <- heartbeatOutcome{req: req, res: res, err: err}
}

func (h *Homes) report(ev Event, prev *View) {
	v := h.view.Load()
	switch {
	case ev.Err != nil:
		if v.Failures == 1 || v.Failures%10 == 0 {
			h.logger.Warn("heartbeat failed", "failures", v.Failures, "serve_until", time.Unix(0, v.ServeUntilNanos), "error", ev.Err)
		}
	case ev.Registered:
		h.logger.Info("registered", "liveness_epoch", v.LivenessEpoch)
	case ev.LostEpoch:
		h.logger.Warn("liveness epoch was incremented by a takeover; homes dropped", "old_epoch", ev.OldEpoch, "liveness_epoch", v.LivenessEpoch)
	}
	if ev.HomesChanged {
		h.logger.Debug("homes changed", "homes_version", v.HomesVersion, "ranges", len(v.homes))
	}
	firstExtension := prev.ExpirationNanos == 0 && v.ExpirationNanos > 0
	if ev.HomesChanged || ev.LostEpoch || ev.Registered || firstExtension {
		select {
		case h.changed <- struct{}{}:
		default:
		}
	}
}
