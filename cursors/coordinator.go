package cursors

import (
	"slices"
	"time"
)

// Session and rebalance timeout bounds and defaults.
const (
	SessionTimeoutDefault   = 10 * time.Second
	SessionTimeoutMin       = 500 * time.Millisecond
	SessionTimeoutMax       = 5 * time.Minute
	RebalanceTimeoutDefault = 30 * time.Second
	RebalanceTimeoutMin     = 500 * time.Millisecond
	RebalanceTimeoutMax     = 10 * time.Minute
)

// Coordinator is the group protocol of one range of the cursor stream, as
// its coordinator (the range's leader in its home region) runs it: joins,
// heartbeats and leaves go through a Batch, and it keeps the members'
// sessions, which are soft state: a new coordinator starts every member's
// session afresh (a member then has a full session timeout to reach it).
// Deterministic; not safe for concurrent use.
type Coordinator struct {
	sessions map[sessionKey]*session
	// SplitsOf, if set, gives the splits of a stream's range map: the
	// coordinator then assigns over the map (split.go).
	SplitsOf SplitsOf
}

type sessionKey struct{ group, member string }

type session struct {
	// lastHeard is when the member was last heard from; expires when its
	// session ends; revokeBy, if set, when it must have released told,
	// the ranges it was last asked to release (unix nanos).
	lastHeard, expires, revokeBy int64
	told                         []uint32
}

// NewCoordinator returns a coordinator with no sessions.
func NewCoordinator() *Coordinator {
	return &Coordinator{sessions: map[sessionKey]*session{}}
}

// Reset forgets every session (a new term of leadership: sessions start
// afresh at the next Expire).
func (c *Coordinator) Reset() { clear(c.sessions) }

// LastHeard returns when the coordinator last heard from a member.
func (c *Coordinator) LastHeard(group, member string) (time.Time, bool) {
	s, ok := c.sessions[sessionKey{group, member}]
	if !ok || s.lastHeard == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, s.lastHeard), true
}

// heard starts or extends a member's session.
func (c *Coordinator) heard(b *Batch, group string, m *Member) *session {
	k := sessionKey{group, m.ID}
	s := c.sessions[k]
	if s == nil {
		s = &session{}
		c.sessions[k] = s
	}
	s.lastHeard = b.nowUnixNanos
	s.expires = b.nowUnixNanos + int64(m.SessionTimeoutMillis)*int64(time.Millisecond)
	return s
}

// JoinRequest makes a member join a group.
type JoinRequest struct {
	Group, MemberID, InstanceID, Stream string
	RangeCount                          uint32
	// Zero timeouts take the defaults.
	SessionTimeout, RebalanceTimeout time.Duration
}

// HeartbeatRequest is a member's heartbeat, with the ranges it still owns.
type HeartbeatRequest struct {
	Group, MemberID string
	MemberEpoch     uint64
	Owned           []uint32
}

// LeaveRequest makes a member leave (Temporary: a static member's
// restart).
type LeaveRequest struct {
	Group, MemberID string
	MemberEpoch     uint64
	Temporary       bool
}

// Assignment is what a member is told: its epoch and the ranges to
// consume, with their committed positions.
type Assignment struct {
	MemberID                string
	MemberEpoch, GroupEpoch uint64
	Stream                  string
	Ranges                  []uint32
	Positions               []Position
}

func (req *JoinRequest) check() error {
	for _, n := range []struct {
		what, name string
		optional   bool
	}{{"group", req.Group, false}, {"member id", req.MemberID, false}, {"instance id", req.InstanceID, true}} {
		if err := checkName(n.what, n.name, n.optional); err != nil {
			return err
		}
	}
	if err := checkStream(req.Stream); err != nil {
		return err
	}
	if req.RangeCount == 0 || req.RangeCount > RangesMax {
		return errInvalid("range count %d: must be in [1, %d]", req.RangeCount, RangesMax)
	}
	if req.SessionTimeout == 0 {
		req.SessionTimeout = SessionTimeoutDefault
	}
	if req.RebalanceTimeout == 0 {
		req.RebalanceTimeout = RebalanceTimeoutDefault
	}
	if req.SessionTimeout < SessionTimeoutMin || req.SessionTimeout > SessionTimeoutMax {
		return errInvalid("session timeout %v: must be in [%v, %v]", req.SessionTimeout, SessionTimeoutMin, SessionTimeoutMax)
	}
	if req.RebalanceTimeout < RebalanceTimeoutMin || req.RebalanceTimeout > RebalanceTimeoutMax {
		return errInvalid("rebalance timeout %v: must be in [%v, %v]", req.RebalanceTimeout, RebalanceTimeoutMin, RebalanceTimeoutMax)
	}
	return nil
}

// Join adds a member to a group (creating the group), or starts a new
// incarnation of a member id already in it, or, for an instance id already
// in it, replaces that member, which hands its ranges over without a
// rebalance. The new member gets the free ranges of its target at once.
func (c *Coordinator) Join(b *Batch, req JoinRequest) (Assignment, error) {
	if err := req.check(); err != nil {
		return Assignment{}, err
	}
	if held := b.group(req.Group); held != nil && held.Live() {
		if held.Stream != req.Stream || held.RangeCount != req.RangeCount {
			return Assignment{}, errInvalid("group %q consumes stream %s (%d ranges); the member names %s (%d ranges)",
				req.Group, held.Stream, held.RangeCount, req.Stream, req.RangeCount)
		}
		if held.Member(req.MemberID) == nil && (req.InstanceID == "" || held.memberByInstance(req.InstanceID) == nil) &&
			len(held.Members) >= MembersMax {
			return Assignment{}, errLimit("group %q has %d members, at most %d", req.Group, len(held.Members), MembersMax)
		}
	} else if held == nil && len(b.s.groups)+b.newGroups >= b.s.limits.GroupsMax {
		return Assignment{}, errLimit("this cursor range holds %d groups, at most %d", len(b.s.groups)+b.newGroups, b.s.limits.GroupsMax)
	}
	g := b.mutGroup(req.Group)
	if !g.Live() {
		g.Stream, g.RangeCount, g.Deleted = req.Stream, req.RangeCount, false
	}
	g.Epoch = b.nextEpoch(g.Epoch)
	m := Member{ID: req.MemberID, InstanceID: req.InstanceID, Epoch: g.Epoch, JoinEpoch: g.Epoch,
		SessionTimeoutMillis: uint32(req.SessionTimeout.Milliseconds()), RebalanceTimeoutMillis: uint32(req.RebalanceTimeout.Milliseconds())}
	rebalance := true
	if old := g.Member(req.MemberID); old != nil {
		// A new incarnation of the same id: the old one is fenced and its
		// ranges are free.
		c.forget(g.Name, old.ID)
		g.removeMember(old.ID)
	} else if req.InstanceID != "" {
		if old := g.memberByInstance(req.InstanceID); old != nil {
			m.Target, m.Owned, m.Revoking = old.Target, old.Owned, old.Revoking
			c.forget(g.Name, old.ID)
			g.removeMember(old.ID)
			rebalance = false
		}
	}
	g.addMember(m)
	if rebalance {
		c.retarget(b, g)
	}
	c.heard(b, g.Name, g.Member(req.MemberID))
	c.grants(b, g)
	mm := g.Member(req.MemberID)
	c.toldToRelease(b, g.Name, mm)
	return c.assignment(b, g, mm), nil
}

// Heartbeat extends a member's session, takes the ranges it released,
// and moves it toward its target.
func (c *Coordinator) Heartbeat(b *Batch, req HeartbeatRequest) (Assignment, error) {
	held := b.group(req.Group)
	if _, err := checkMember(held, req.Group, req.MemberID, req.MemberEpoch); err != nil {
		return Assignment{}, err
	}
	owned := slices.Clone(req.Owned)
	slices.Sort(owned)
	owned = slices.Compact(owned)
	// Stage a copy only if something changes: most heartbeats change
	// nothing, and a staged group is a record to write.
	probe := held.clone()
	pm := probe.Member(req.MemberID)
	c.heard(b, probe.Name, pm)
	changed := pm.Away
	pm.Away = false
	if c.assignableChanged(b, probe) {
		// A parent was finished (its split offset committed): its
		// children take its place (split.go).
		probe.Epoch = b.nextEpoch(probe.Epoch)
		c.retarget(b, probe)
		changed = true
	}
	changed = c.reconcile(b, probe, pm, owned) || changed
	if !changed {
		return c.assignment(b, held, held.Member(req.MemberID)), nil
	}
	g := b.mutGroup(req.Group)
	*g = *probe
	return c.assignment(b, g, g.Member(req.MemberID)), nil
}

// Leave removes a member, or marks a static member away (Temporary).
// Leaving again, or as a member the group does not know, is no error.
func (c *Coordinator) Leave(b *Batch, req LeaveRequest) error {
	held := b.group(req.Group)
	if held == nil || held.Deleted || held.Member(req.MemberID) == nil {
		return nil
	}
	if _, err := checkMember(held, req.Group, req.MemberID, req.MemberEpoch); err != nil {
		return err
	}
	g := b.mutGroup(req.Group)
	m := g.Member(req.MemberID)
	if req.Temporary && m.InstanceID != "" {
		m.Away = true
		return nil
	}
	c.forget(g.Name, m.ID)
	g.removeMember(m.ID)
	g.Epoch = b.nextEpoch(g.Epoch)
	c.retarget(b, g)
	c.grants(b, g)
	return nil
}

// Expired is a member Expire removed, and why.
type Expired struct {
	Group, MemberID, Reason string
}

// Expire removes the members whose session ended, and those that did not
// release the ranges they were asked to within their rebalance timeout.
// A member without a session (a new coordinator) gets one now.
func (c *Coordinator) Expire(b *Batch) []Expired {
	var out []Expired
	for _, name := range b.liveGroups() {
		held := b.group(name)
		var gone []Expired
		for i := range held.Members {
			m := &held.Members[i]
			s := c.sessions[sessionKey{name, m.ID}]
			if s == nil {
				// A new coordinator: a full session from now; a release
				// the old one may have asked for is timed from when this
				// one asks (the member's next heartbeat).
				s = c.heard(b, name, m)
				s.lastHeard = 0
			}
			switch {
			case b.nowUnixNanos >= s.expires:
				gone = append(gone, Expired{name, m.ID, "session timed out"})
			case s.revokeBy != 0 && len(intersect(m.Revoking, s.told)) > 0 && b.nowUnixNanos >= s.revokeBy:
				gone = append(gone, Expired{name, m.ID, "ranges not released within the rebalance timeout"})
			}
		}
		if len(gone) == 0 {
			continue
		}
		g := b.mutGroup(name)
		for _, e := range gone {
			c.forget(name, e.MemberID)
			g.removeMember(e.MemberID)
		}
		g.Epoch = b.nextEpoch(g.Epoch)
		c.retarget(b, g)
		c.grants(b, g)
		out = append(out, gone...)
	}
	return out
}

// liveGroups returns the names of the groups with members, as the batch
// sees them.
func (b *Batch) liveGroups() []string {
	names := b.s.LiveGroups()
	for name, g := range b.groups {
		if _, ok := b.s.live[name]; !ok && g.Live() {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

func (c *Coordinator) forget(group, member string) {
	delete(c.sessions, sessionKey{group, member})
}

// retarget recomputes the group's target assignment at its epoch, over
// the ranges it may assign (split.go).
func (c *Coordinator) retarget(b *Batch, g *Group) {
	ids := make([]string, len(g.Members))
	prev := make(map[string][]uint32, len(g.Members))
	for i, m := range g.Members {
		ids[i] = m.ID
		prev[m.ID] = m.Target
	}
	targets := AssignRanges(ids, prev, c.assignable(b, g))
	for i := range g.Members {
		g.Members[i].Target = targets[g.Members[i].ID]
	}
	g.AssignmentEpoch = g.Epoch
}

// reconcile moves member m toward its target, given the ranges it reports
// owning: what it owned outside its target and no longer reports is free;
// then grants. It reports whether the group changed.
func (c *Coordinator) reconcile(b *Batch, g *Group, m *Member, reported []uint32) bool {
	changed := false
	if released := minus(minus(m.Owned, m.Target), reported); len(released) > 0 {
		m.Owned = minus(m.Owned, released)
		changed = true
	}
	changed = c.grants(b, g) || changed
	c.toldToRelease(b, g.Name, m)
	return changed
}

// toldToRelease starts m's rebalance timeout when the answer it is about
// to get asks it to release ranges (the clock starts when it is told, not
// when the coordinator decided: a member is never removed for a release
// it did not know of).
func (c *Coordinator) toldToRelease(b *Batch, group string, m *Member) {
	s := c.sessionOf(b, group, m)
	if slices.Equal(s.told, m.Revoking) {
		return
	}
	s.told = slices.Clone(m.Revoking)
	s.revokeBy = 0
	if len(m.Revoking) > 0 {
		s.revokeBy = b.nowUnixNanos + int64(m.RebalanceTimeoutMillis)*int64(time.Millisecond)
	}
}

// grants asks every member to release what it owns outside its target
// (Revoking: derived, so asking changes nothing durable; a release not
// done within the member's rebalance timeout of its being told removes
// it, see toldToRelease and Expire), and
// grants each member that has nothing left to release the ranges of its
// target that no one owns, moving it to a new group epoch. A range freed
// by one member's heartbeat (or leave, or removal) is thereby granted in
// the same batch: its new owner learns of it at its next heartbeat, which
// then writes nothing. It reports whether any grant was made.
func (c *Coordinator) grants(b *Batch, g *Group) bool {
	granted := false
	for i := range g.Members {
		m := &g.Members[i]
		m.Revoking = minus(m.Owned, m.Target)
		if len(m.Revoking) > 0 {
			continue
		}
		var grant []uint32
		for _, r := range minus(m.Target, m.Owned) {
			if g.owner(r) == nil {
				grant = append(grant, r)
			}
		}
		if len(grant) > 0 {
			m.Owned = union(m.Owned, grant)
			g.Epoch = b.nextEpoch(g.Epoch)
			m.Epoch = g.Epoch
			granted = true
		}
	}
	return granted
}

// sessionOf returns a member's session, starting a full one if the
// coordinator has none yet (as Expire would).
func (c *Coordinator) sessionOf(b *Batch, group string, m *Member) *session {
	k := sessionKey{group, m.ID}
	if s := c.sessions[k]; s != nil {
		return s
	}
	s := &session{expires: b.nowUnixNanos + int64(m.SessionTimeoutMillis)*int64(time.Millisecond)}
	c.sessions[k] = s
	return s
}

// assignment is what member m of g is told.
func (c *Coordinator) assignment(b *Batch, g *Group, m *Member) Assignment {
	a := Assignment{MemberID: m.ID, MemberEpoch: m.Epoch, GroupEpoch: g.Epoch, Stream: g.Stream, Ranges: m.Assigned()}
	var children map[uint32]bool // of splits, once a range lacks a position
	for _, r := range a.Ranges {
		p, ok := b.position(g.Name, g.Stream, r)
		if ok {
			a.Positions = append(a.Positions, p)
			continue
		}
		if children == nil {
			children = c.children(g)
		}
		if children[r] {
			// A child of a split: the group read its parent to the end,
			// so it starts at the child's start, whatever the member's
			// policy for a range without a position.
			a.Positions = append(a.Positions, Position{Stream: g.Stream, Range: r})
		}
	}
	return a
}

// CheckFetch decides whether a member may fetch a range, against the
// state (a node's copy of the cursor range, which may lag): ErrBehind when
// the copy has not reached the member's epoch yet, else nil or the typed
// error (UNKNOWN_MEMBER, STALE_MEMBER_EPOCH, RANGE_NOT_ASSIGNED).
func (s *State) CheckFetch(group, member string, epoch uint64, stream string, rng uint32) error {
	g := s.groups[group]
	if g == nil || epoch > g.Epoch {
		return ErrBehind
	}
	m := g.Member(member)
	switch {
	case g.Deleted || m == nil:
		return errUnknownMember(group, member)
	case epoch < m.JoinEpoch:
		return errStaleMemberEpoch(group, member, epoch, m.Epoch)
	case stream != g.Stream || !m.Owns(rng):
		return errNotAssigned(group, member, stream, rng)
	}
	return nil
}
