package homing

import (
	"errors"
	"math"
	"slices"
)

// CoreConfig configures a Core. Durations are in nanoseconds (the core reads
// no clock; readings come in with its calls).
type CoreConfig struct {
	NodeID uint64
	Region string
	// HeartbeatIntervalNanos: time between the sends of two heartbeats.
	HeartbeatIntervalNanos int64
	// RetryIntervalNanos: time from a failed heartbeat's send to the next.
	RetryIntervalNanos int64
	// LivenessTTLNanos: a heartbeat sent at clock t extends the lease to
	// t + TTL.
	LivenessTTLNanos int64
	// MaxOffsetNanos: the maximum clock offset between any two nodes. A
	// node acks only until its expiration minus this, by its own clock.
	MaxOffsetNanos int64
}

func (c CoreConfig) validate() error {
	if err := validateNodeID(c.NodeID); err != nil {
		return err
	}
	if err := validateRegion("node", c.Region); err != nil {
		return err
	}
	if c.HeartbeatIntervalNanos <= 0 || c.RetryIntervalNanos <= 0 || c.MaxOffsetNanos < 0 {
		return invalidf("heartbeat and retry intervals must be positive, the max clock offset not negative")
	}
	// A node must be able to renew before it stops serving, with a retry
	// to spare: TTL - offset > interval + retry.
	if c.LivenessTTLNanos-c.MaxOffsetNanos <= c.HeartbeatIntervalNanos+c.RetryIntervalNanos {
		return invalidf("liveness TTL %dns must exceed max clock offset %dns + heartbeat interval %dns + retry interval %dns",
			c.LivenessTTLNanos, c.MaxOffsetNanos, c.HeartbeatIntervalNanos, c.RetryIntervalNanos)
	}
	return nil
}

// Core is a node's liveness lease and its view of the ranges homed in its
// region: a deterministic state machine with no goroutines, clock or I/O.
// One goroutine (the driver, or a test) owns it:
//
//   - Next(now) returns the heartbeat to send, if one is due and none is in
//     flight (at most one is).
//   - Done(req, res, err) takes the store's answer to it.
//   - View() returns an immutable snapshot that any goroutine may use to
//     decide whether to ack (View.Check).
//   - Wake() tells when Next may next return a heartbeat.
type Core struct {
	cfg CoreConfig

	epoch        uint64 // liveness epoch; 0 until registered
	expiration   int64  // newest expiration written and acknowledged at epoch
	homesVersion uint64
	homes        map[RangeKey]Home // replaced, never mutated: views share it
	// homesFloor is the highest homes version this core has held, kept
	// across a lost liveness epoch: homes older than it are never taken
	// again (a heartbeat that read the store before an Install committed
	// must not bring back what the Install replaced).
	homesFloor uint64

	inflight bool
	nextAt   int64 // Next returns a heartbeat once now >= nextAt
	lastErr  error // the last heartbeat's error; nil after a success
	failures int   // consecutive failed heartbeats
	// reachedSince is the send time of the first heartbeat of the current
	// run of answered ones (0 while the last one failed, or before any).
	reachedSince int64
}

// NewCore returns a core that registers the node on its first heartbeat.
func NewCore(cfg CoreConfig) (*Core, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Core{cfg: cfg, homes: map[RangeKey]Home{}}, nil
}

// Next returns the heartbeat to send at clock reading now, if one is due.
// The caller must have published View() since the last Done: the request
// reports the published homes version as seen (Liveness.HomesSeen), which a
// planned rehome relies on.
func (c *Core) Next(now int64) (HeartbeatRequest, bool) {
	if c.inflight || now < c.nextAt {
		return HeartbeatRequest{}, false
	}
	c.inflight = true
	req := HeartbeatRequest{
		NodeID:     c.cfg.NodeID,
		Region:     c.cfg.Region,
		Epoch:      c.epoch,
		NowNanos:   now,
		HomesSeen:  c.homesVersion,
		HomesKnown: c.homesVersion,
	}
	if c.epoch != 0 {
		req.ExpirationNanos = satAdd(now, c.cfg.LivenessTTLNanos)
	}
	return req, true
}

// Force makes the next heartbeat due at once (a refresh).
func (c *Core) Force() { c.nextAt = math.MinInt64 }

// Forced reports whether a heartbeat is due at once whatever the clock.
func (c *Core) Forced() bool { return c.nextAt == math.MinInt64 }

// Wake returns the clock reading at which Next will return a heartbeat;
// math.MaxInt64 while one is in flight.
func (c *Core) Wake() int64 {
	if c.inflight {
		return math.MaxInt64
	}
	return c.nextAt
}

// Event says what a heartbeat's answer changed.
type Event struct {
	// Extended: the lease was extended.
	Extended bool
	// Registered: the node learned its liveness epoch (first heartbeat).
	Registered bool
	// LostEpoch: the node's liveness epoch was incremented by a takeover;
	// every home it knew is void. OldEpoch is the epoch it had.
	LostEpoch bool
	OldEpoch  uint64
	// HomesChanged: the set of homes (or their epochs) changed.
	HomesChanged bool
	// Err is the heartbeat's error, if it failed.
	Err error
}

// Done takes the answer to the heartbeat req that Next returned.
func (c *Core) Done(req HeartbeatRequest, res HeartbeatResult, err error) Event {
	if !c.inflight {
		panic("homing: Core.Done without a heartbeat in flight")
	}
	c.inflight = false
	if err != nil {
		c.lastErr = err
		c.failures++
		c.reachedSince = 0
		c.nextAt = satAdd(req.NowNanos, c.cfg.RetryIntervalNanos)
		return Event{Err: err}
	}
	c.lastErr = nil
	c.failures = 0
	if c.reachedSince == 0 {
		c.reachedSince = req.NowNanos
	}
	var ev Event
	l := res.Liveness
	switch {
	case res.Extended && l.Epoch == c.epoch:
		// The request's expiration, not the record's: the record may hold
		// a later one from an attempt whose answer was lost, which this
		// node cannot know it may rely on.
		c.expiration = max(c.expiration, req.ExpirationNanos)
		c.nextAt = satAdd(req.NowNanos, c.cfg.HeartbeatIntervalNanos)
		ev.Extended = true
	case c.epoch == 0:
		c.epoch = l.Epoch
		c.Force()
		ev.Registered = true
	case l.Epoch != c.epoch:
		// A takeover fenced this node: its homes may have moved, and what
		// it knew of them is void. Start over at the new epoch (CockroachDB
		// does the same when it finds its liveness epoch incremented).
		ev.LostEpoch, ev.OldEpoch = true, c.epoch
		c.epoch = l.Epoch
		c.expiration = 0
		ev.HomesChanged = len(c.homes) > 0
		c.homes = map[RangeKey]Home{}
		c.homesVersion = 0
		c.Force()
		return ev
	default:
		// Not extended at an unchanged epoch: not produced by a Store;
		// retry.
		c.nextAt = satAdd(req.NowNanos, c.cfg.RetryIntervalNanos)
	}
	// Versions only grow in the store, so an answer below what the core
	// holds was read before something the core already took (an Install
	// while this heartbeat was in flight): keep the newer homes.
	if res.HomesChanged && res.HomesVersion >= c.homesFloor {
		ev.HomesChanged = c.setHomes(res.HomesVersion, res.Homes)
	}
	return ev
}

// Install takes a snapshot of the region's homes read by a committed store
// transaction at version (a planned rehome's prepare or complete, handed
// over by its coordinator), as if a heartbeat had brought it: the lease is
// not extended. It is taken only if version is newer than what the core
// has held (false otherwise). The caller must publish View() at once, before
// anything else acts on it (driver contract, step 3): the next heartbeat
// then reports version as seen.
func (c *Core) Install(version uint64, homes []Home) (changed, taken bool) {
	if version <= c.homesFloor { // the floor is at least homesVersion
		return false, false
	}
	return c.setHomes(version, homes), true
}

// setHomes replaces the homes with those of version; changed reports
// whether the set or an epoch differs.
func (c *Core) setHomes(version uint64, list []Home) bool {
	homes := make(map[RangeKey]Home, len(list))
	for _, h := range list {
		homes[h.Key] = h
	}
	changed := !sameHomes(c.homes, homes)
	c.homes = homes
	c.homesVersion = version
	c.homesFloor = max(c.homesFloor, version)
	return changed
}

func sameHomes(a, b map[RangeKey]Home) bool {
	if len(a) != len(b) {
		return false
	}
	for k, h := range a {
		if b[k] != h {
			return false
		}
	}
	return true
}

// View returns an immutable snapshot of what the node may serve.
func (c *Core) View() *View {
	v := &View{
		NodeID:        c.cfg.NodeID,
		Region:        c.cfg.Region,
		LivenessEpoch: c.epoch,
		HomesVersion:  c.homesVersion,
		homes:         c.homes,
		LastErr:       c.lastErr,
		Failures:      c.failures,

		ReachedSinceNanos: c.reachedSince,
	}
	if c.expiration > 0 {
		v.ExpirationNanos = c.expiration
		v.ServeUntilNanos = c.expiration - c.cfg.MaxOffsetNanos
	}
	return v
}

// View is an immutable snapshot of a node's lease and homes, safe for any
// goroutine.
type View struct {
	NodeID        uint64
	Region        string
	LivenessEpoch uint64
	// ExpirationNanos is the lease's expiration by this node's clock (0:
	// none yet), ServeUntilNanos that minus the max clock offset: the node
	// may ack while its clock reads less than ServeUntilNanos.
	ExpirationNanos int64
	ServeUntilNanos int64
	HomesVersion    uint64
	// LastErr is the last heartbeat's error (nil if it succeeded), Failures
	// the number of consecutive failed heartbeats.
	LastErr  error
	Failures int
	// ReachedSinceNanos is when the node's current run of answered
	// heartbeats began, by its clock (0 while its last heartbeat failed):
	// since when it has reached the lease store without a break.
	ReachedSinceNanos int64
	homes             map[RangeKey]Home
}

// Lease is what a node may do with one range: ack appends at Epoch while
// its clock reads less than UntilNanos.
type Lease struct {
	Epoch       uint64
	StartOffset uint64
	UntilNanos  int64
}

// Lease returns the range's lease at clock reading now, or why there is none:
// ErrLeaseExpired (also ErrStoreUnavailable when heartbeats are failing to
// reach the store) or ErrNotHome.
func (v *View) Lease(key RangeKey, now int64) (Lease, error) {
	if v.ServeUntilNanos == 0 || now >= v.ServeUntilNanos {
		if v.ServeUntilNanos == 0 {
			return Lease{}, newErrorAlso(ErrLeaseExpired, v.LastErr, "node %d has no valid liveness yet (epoch %d)%s", v.NodeID, v.LivenessEpoch, v.cause())
		}
		return Lease{}, newErrorAlso(ErrLeaseExpired, v.LastErr, "node %d may serve until %s (expiration minus max clock offset), now %s%s",
			v.NodeID, fmtNanos(v.ServeUntilNanos), fmtNanos(now), v.cause())
	}
	h, ok := v.homes[key]
	if !ok {
		if err := validateKey(key); err != nil {
			return Lease{}, err
		}
		return Lease{}, newError(ErrNotHome, "range %s is not homed in region %s (homes version %d)", key, v.Region, v.HomesVersion)
	}
	if h.MovingTo != "" {
		return Lease{}, newError(ErrNotHome, "range %s is moving from %s to %s (epoch %d)", key, v.Region, h.MovingTo, h.Epoch)
	}
	return Lease{Epoch: h.Epoch, StartOffset: h.StartOffset, UntilNanos: v.ServeUntilNanos}, nil
}

func (v *View) cause() string {
	if v.LastErr == nil {
		return ""
	}
	return "; last heartbeat failed: " + v.LastErr.Error()
}

// Check returns the epoch at which this node may ack appends to key now, or
// the typed reason it may not (see Lease).
func (v *View) Check(key RangeKey, now int64) (uint64, error) {
	l, err := v.Lease(key, now)
	return l.Epoch, err
}

// CheckRead returns the epoch at which this node may answer a
// linearizable (home) read of key now, or why it may not: as Check. A home
// whose lease may have expired must not: another region may have taken the
// range over and acked appends this log lacks. Nor may a range stopped
// here by a planned move (ErrNotHome, retriable: the read goes to the new
// home once the move is done, or here again once it is cancelled): its log
// is final, but once the move completes the target acks appends this log
// lacks, and this node learns of the complete only with the coordinator's
// release or its next heartbeat, up to a lease later if it was cut off
// right after the stop (the simulator's finding 4, notes/simfaults.md). A
// read is paused for the move as an append is. The coordinator's own read
// of the final tail is CheckFinal.
func (v *View) CheckRead(key RangeKey, now int64) (uint64, error) {
	return v.Check(key, now)
}

// CheckFinal returns the epoch at which this node may confirm the final
// tail of key for the coordinator of a planned rehome: as CheckRead, except
// that a range stopped here by the move still answers. Its log is final
// (nothing more is acked here), and the coordinator completes the move,
// after which the target acks, only once it has read that tail.
func (v *View) CheckFinal(key RangeKey, now int64) (uint64, error) {
	l, err := v.Lease(key, now)
	if err == nil {
		return l.Epoch, nil
	}
	if h, ok := v.homes[key]; ok && h.MovingTo != "" && errors.Is(err, ErrNotHome) {
		return h.Epoch, nil
	}
	return 0, err
}

// Home returns this region's home record for key, if the range is homed
// here.
func (v *View) Home(key RangeKey) (Home, bool) {
	h, ok := v.homes[key]
	return h, ok
}

// Homes returns the ranges homed in this node's region, sorted.
func (v *View) Homes() []Home {
	out := make([]Home, 0, len(v.homes))
	for _, h := range v.homes {
		out = append(out, h)
	}
	slices.SortFunc(out, func(a, b Home) int { return compareKeys(a.Key, b.Key) })
	return out
}
