package replicator

import "time"

// Heartbeat is what a home says of a range with every request: its
// committed tail at its clock's time, and its epoch.
type Heartbeat struct {
	// CommittedEnd is the home's committed tail: offsets below it are
	// committed in the home region.
	CommittedEnd uint64
	// HomeTimeUnixNanos is the home leader's wall clock, read before
	// CommittedEnd (so the tail it reports is at least the tail at that
	// time, and lag computed from it errs on the high side).
	HomeTimeUnixNanos int64
	// Epoch is the home's epoch.
	Epoch uint64
	// LeaderNodeID is the sending home leader's Raft id in its region (0:
	// unknown).
	LeaderNodeID uint64
	// RetainFrom, when RetainFromKnown, is the home's compaction floor:
	// the lowest offset any mirror region still needs (TaskConfig.RetainFrom).
	// A mirror keeps its log from there, so that, should it become the
	// home, it holds every other mirror's resend point (notes/simgaps.md
	// P3).
	RetainFrom      uint64
	RetainFromKnown bool
}

// lagPendingMax is the default bound on the heartbeats a Lag keeps while
// the mirror has not yet applied up to their tails.
const lagPendingMax = 64

// Lag tracks how far a mirror trails its home, from the heartbeats the home
// sends and the applied end the mirror reaches. It is a deterministic core:
// no clock, no goroutine; callers pass the local time in. Not safe for
// concurrent use.
//
// Offset lag is the latest heartbeat's committed tail minus the applied end.
// Time lag is now - t_sync, where t_sync is the home time of the newest
// heartbeat whose tail the mirror had fully applied: the mirror is known to
// hold everything the home had committed at t_sync, and nothing is known
// about later. A stalled link delivers no heartbeats, so t_sync stands
// still and the time lag grows with the local clock; it never reads zero.
//
// # Clock offset
//
// t_sync is read from the home's clock and now from the mirror's; the time
// lag is off by the offset between the two (up to the cluster's configured
// maximum clock offset, either way). To bound the error on the low side,
// TimeLag is also never less than the time since the mirror received the
// heartbeat that set t_sync, measured on its own monotonic clock (that part
// misses only the heartbeat's transit time). Across a change of home (a
// higher epoch) the clock changes too, so t_sync may move back once.
type Lag struct {
	// PendingMax bounds the heartbeats kept while the mirror is behind their
	// tails, default 64. When full, the newest is overwritten: t_sync then
	// advances later than it could, so the lag errs high, never low.
	PendingMax int

	created       time.Time // local: lag is counted from here until a sync
	epoch         uint64
	heartbeats    uint64
	homeTail      uint64
	lastRecvLocal time.Time
	applied       uint64
	synced        bool
	syncEpoch     uint64 // the epoch of the home whose clock t_sync is on
	syncHomeNanos int64
	syncRecvLocal time.Time
	pending       []pendingBeat
}

// pendingBeat is a heartbeat whose tail the mirror had not applied yet.
// Pending beats form a chain increasing in both tail and home time: a beat
// with a higher tail and an earlier time than another can never give a
// later t_sync, so it is dropped.
type pendingBeat struct {
	tail      uint64
	homeNanos int64
	recvLocal time.Time
}

// NewLag returns a tracker created at local time now: until a heartbeat's
// tail is applied, the time lag counts from now.
func NewLag(now time.Time) *Lag { return &Lag{created: now} }

// Heartbeat records hb, received at local time now. A heartbeat of an epoch
// lower than one already seen is ignored and reported false: it comes from a
// fenced home.
func (l *Lag) Heartbeat(hb Heartbeat, now time.Time) bool {
	switch {
	case hb.Epoch < l.epoch:
		return false
	case hb.Epoch > l.epoch:
		// A new home: its tail replaces the old one's, and its clock may be
		// behind the old one's, so t_sync may move back once.
		l.epoch = hb.Epoch
		l.homeTail = hb.CommittedEnd
		l.pending = l.pending[:0]
	default:
		l.homeTail = max(l.homeTail, hb.CommittedEnd)
	}
	l.heartbeats++
	l.lastRecvLocal = now
	if hb.CommittedEnd <= l.applied {
		l.sync(hb.HomeTimeUnixNanos, now)
		return true
	}
	l.addPending(pendingBeat{tail: hb.CommittedEnd, homeNanos: hb.HomeTimeUnixNanos, recvLocal: now})
	return true
}

// Applied records that the mirror has applied every offset below end. The
// applied end may move back (a mirror's divergent tail cut off); t_sync
// never does.
func (l *Lag) Applied(end uint64) {
	l.applied = end
	n := 0
	for n < len(l.pending) && l.pending[n].tail <= end {
		n++
	}
	if n == 0 {
		return
	}
	// The chain increases in time, so the last beat covered is the newest.
	b := l.pending[n-1]
	l.sync(b.homeNanos, b.recvLocal)
	l.pending = append(l.pending[:0], l.pending[n:]...)
}

// sync moves t_sync to homeNanos, a time of the current home's clock:
// forward only, but a new home's first sync may move it back.
func (l *Lag) sync(homeNanos int64, recvLocal time.Time) {
	if l.synced && l.syncEpoch == l.epoch && homeNanos <= l.syncHomeNanos {
		return
	}
	l.synced = true
	l.syncEpoch = l.epoch
	l.syncHomeNanos = homeNanos
	l.syncRecvLocal = recvLocal
}

func (l *Lag) addPending(b pendingBeat) {
	// Drop the beats the new one dominates (a tail at least as high, a
	// time no later); skip the new one if an older beat dominates it.
	kept := l.pending[:0]
	for _, p := range l.pending {
		if p.tail <= b.tail && p.homeNanos >= b.homeNanos {
			return // p dominates b: nothing changes
		}
		if p.tail >= b.tail && p.homeNanos <= b.homeNanos {
			continue
		}
		kept = append(kept, p)
	}
	l.pending = kept
	// Insert in tail order (heartbeats usually arrive in order: append).
	i := len(l.pending)
	for i > 0 && l.pending[i-1].tail > b.tail {
		i--
	}
	pendingMax := l.PendingMax
	if pendingMax <= 0 {
		pendingMax = lagPendingMax
	}
	if len(l.pending) >= pendingMax {
		if i < len(l.pending) {
			return // full and b is not the newest: dropping it errs high
		}
		l.pending[len(l.pending)-1] = b
		return
	}
	l.pending = append(l.pending, pendingBeat{})
	copy(l.pending[i+1:], l.pending[i:])
	l.pending[i] = b
}

// LagStatus is a Lag's view at one local time.
type LagStatus struct {
	// Known says a heartbeat has been received.
	Known bool
	// Synced says the mirror has applied the tail of some heartbeat; until
	// then TimeLag counts from the tracker's creation.
	Synced bool
	// Epoch is the highest home epoch heard from.
	Epoch uint64
	// HomeTail is the highest committed tail heard from the current home.
	HomeTail uint64
	// AppliedEnd is the mirror's applied end.
	AppliedEnd uint64
	// OffsetLag is HomeTail - AppliedEnd, or 0 when the mirror is ahead.
	OffsetLag uint64
	// SyncHomeTime is t_sync (zero when not Synced).
	SyncHomeTime time.Time
	// TimeLag is max(now - t_sync on the two clocks, now - local receipt
	// of the heartbeat that set t_sync): see the type's comment. Not
	// Synced: now - the tracker's creation.
	TimeLag time.Duration
	// HeartbeatAge is now - the local receipt of the latest heartbeat: how
	// long the link has been silent (since creation when none came).
	HeartbeatAge time.Duration
	// Heartbeats counts the heartbeats recorded.
	Heartbeats uint64
}

// Status returns the lag at local time now.
func (l *Lag) Status(now time.Time) LagStatus {
	s := LagStatus{
		Known:      l.heartbeats > 0,
		Synced:     l.synced,
		Epoch:      l.epoch,
		HomeTail:   l.homeTail,
		AppliedEnd: l.applied,
		Heartbeats: l.heartbeats,
	}
	if l.homeTail > l.applied {
		s.OffsetLag = l.homeTail - l.applied
	}
	if s.Known {
		s.HeartbeatAge = nonNegative(now.Sub(l.lastRecvLocal))
	} else {
		s.HeartbeatAge = nonNegative(now.Sub(l.created))
	}
	if !l.synced {
		s.TimeLag = nonNegative(now.Sub(l.created))
		return s
	}
	s.SyncHomeTime = time.Unix(0, l.syncHomeNanos)
	// now's wall reading against the home's wall clock; the receipt time
	// against now on the local monotonic clock.
	s.TimeLag = max(nonNegative(now.Sub(s.SyncHomeTime)), nonNegative(now.Sub(l.syncRecvLocal)))
	return s
}

func nonNegative(d time.Duration) time.Duration { return max(d, 0) }
