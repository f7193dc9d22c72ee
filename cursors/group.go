package cursors

import (
	"slices"
	"sort"
	"strings"
)

// Group is the durable state of a consumer group, one record per change
// (doc.go, "Groups"). Everything fencing depends on is here: which member
// owns which ranges, at which member epoch.
type Group struct {
	Name string
	// Stream is the stream the members consume; RangeCount its ranges.
	Stream     string
	RangeCount uint32
	// Epoch is the group epoch: raised by every change that grants ranges
	// or changes membership. Its high bits carry the cursor range's homing
	// epoch (epochFloor), so an epoch issued after a region failover is
	// above every epoch the old home issued.
	Epoch uint64
	// AssignmentEpoch is the group epoch at which the members' targets
	// were last computed.
	AssignmentEpoch uint64
	// Members sorted by ID.
	Members []Member
	// Deleted marks a group removed by DeleteGroup; it keeps its epoch so
	// that a group created again under the name continues above it.
	Deleted bool
}

// Member is one member of a group.
type Member struct {
	// ID is chosen by the member (unique in the group); InstanceID, if
	// set, makes it a static member: a new member with the same instance
	// id takes its place and its ranges without a rebalance.
	ID, InstanceID string
	// Epoch is the group epoch of the member's last grant (its join, or
	// ranges it gained). JoinEpoch is the group epoch it joined at: a
	// request carrying an epoch below it comes from an older incarnation.
	Epoch, JoinEpoch uint64
	// SessionTimeoutMillis: the member is removed when the coordinator
	// hears nothing from it for this long. RebalanceTimeoutMillis: it is
	// removed when it has not released the ranges it was asked to revoke
	// within this long.
	SessionTimeoutMillis, RebalanceTimeoutMillis uint32
	// Away marks a static member that left for a restart: it keeps its
	// ranges until its session times out or its instance id rejoins.
	Away bool
	// Target is the member's share of the group's target assignment.
	Target []uint32
	// Owned are the ranges the member may fetch and commit: granted and
	// not yet released. Revoking is the part of Owned it was asked to
	// release.
	Owned, Revoking []uint32
}

// Assigned is what the member should be consuming: owned and not being
// revoked.
func (m *Member) Assigned() []uint32 {
	if len(m.Revoking) == 0 {
		return slices.Clone(m.Owned)
	}
	return minus(m.Owned, m.Revoking)
}

// Owns reports whether the member owns range r (being revoked included).
func (m *Member) Owns(r uint32) bool {
	_, ok := slices.BinarySearch(m.Owned, r)
	return ok
}

// clone returns a deep copy of g.
func (g *Group) clone() *Group {
	c := *g
	c.Members = make([]Member, len(g.Members))
	for i, m := range g.Members {
		m.Target = slices.Clone(m.Target)
		m.Owned = slices.Clone(m.Owned)
		m.Revoking = slices.Clone(m.Revoking)
		c.Members[i] = m
	}
	return &c
}

// Member returns the member with id, or nil.
func (g *Group) Member(id string) *Member {
	i, ok := sort.Find(len(g.Members), func(i int) int { return strings.Compare(id, g.Members[i].ID) })
	if !ok {
		return nil
	}
	return &g.Members[i]
}

// memberByInstance returns the member with instance id inst, or nil.
func (g *Group) memberByInstance(inst string) *Member {
	for i := range g.Members {
		if g.Members[i].InstanceID == inst {
			return &g.Members[i]
		}
	}
	return nil
}

// addMember inserts m in id order.
func (g *Group) addMember(m Member) {
	i, _ := sort.Find(len(g.Members), func(i int) int { return strings.Compare(m.ID, g.Members[i].ID) })
	g.Members = slices.Insert(g.Members, i, m)
}

// removeMember drops the member with id; its ranges become free.
func (g *Group) removeMember(id string) {
	g.Members = slices.DeleteFunc(g.Members, func(m Member) bool { return m.ID == id })
}

// owner returns the member owning range r, or nil: a range is free once
// no member owns it (one being revoked is still owned).
func (g *Group) owner(r uint32) *Member {
	for i := range g.Members {
		if g.Members[i].Owns(r) {
			return &g.Members[i]
		}
	}
	return nil
}

// Live reports whether the group has members.
func (g *Group) Live() bool { return len(g.Members) > 0 }

// minus returns the sorted set a \ b (both sorted).
func minus(a, b []uint32) []uint32 {
	var out []uint32
	for _, r := range a {
		if _, ok := slices.BinarySearch(b, r); !ok {
			out = append(out, r)
		}
	}
	return out
}

// intersect returns the sorted set a ∩ b (both sorted).
func intersect(a, b []uint32) []uint32 {
	var out []uint32
	for _, r := range a {
		if _, ok := slices.BinarySearch(b, r); ok {
			out = append(out, r)
		}
	}
	return out
}

// union returns the sorted set a ∪ b (both sorted).
func union(a, b []uint32) []uint32 {
	out := append(slices.Clone(a), b...)
	slices.Sort(out)
	return slices.Compact(out)
}
