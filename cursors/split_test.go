package cursors

import (
	"slices"
	"testing"
	"time"
)

// splitHarness runs a coordinator over a state, applying each batch.
type splitHarness struct {
	t      *testing.T
	s      *State
	c      *Coordinator
	now    time.Time
	splits []Split
}

func (h *splitHarness) run(fn func(b *Batch) error) {
	h.t.Helper()
	h.now = h.now.Add(time.Millisecond)
	b := h.s.Begin(h.now, 1)
	if err := fn(b); err != nil {
		h.t.Fatal(err)
	}
	for _, r := range b.Records() {
		if err := h.s.Apply(r); err != nil {
			h.t.Fatal(err)
		}
	}
}

func (h *splitHarness) heartbeat(member string, owned []uint32) Assignment {
	h.t.Helper()
	var a Assignment
	h.run(func(b *Batch) error {
		m := h.s.Group("g").Member(member)
		var err error
		a, err = h.c.Heartbeat(b, HeartbeatRequest{Group: "g", MemberID: member, MemberEpoch: m.Epoch, Owned: owned})
		return err
	})
	return a
}

func (h *splitHarness) commit(member string, rng uint32, offset uint64) {
	h.t.Helper()
	h.run(func(b *Batch) error {
		m := h.s.Group("g").Member(member)
		_, err := b.Commit(CommitRequest{Cursor: "g", MemberID: member, MemberEpoch: m.Epoch,
			Positions: []Position{{Stream: "s", Range: rng, Offset: offset}}})
		return err
	})
}

// TestAssignAcrossSplit: range 1 of a 2-range stream split at offset 40
// into 2 and 3. The children are not assigned while the group's position
// on range 1 is below 40 (nor with none); once a member commits 40, a
// heartbeat retargets: range 1 leaves the assignment, and once its owner
// released it the children are granted with positions at offset 0. A
// child that splits in turn (3 into 4 and 5) waits for 3 the same way.
func TestAssignAcrossSplit(t *testing.T) {
	h := &splitHarness{t: t, s: NewState(Limits{}), c: NewCoordinator(), now: time.Unix(100, 0),
		splits: []Split{{Parent: 1, SplitOffset: 40, Left: 2, Right: 3}}}
	h.c.SplitsOf = func(stream string) []Split {
		if stream != "s" {
			return nil
		}
		return h.splits
	}
	var a Assignment
	h.run(func(b *Batch) error {
		var err error
		a, err = h.c.Join(b, JoinRequest{Group: "g", MemberID: "a", Stream: "s", RangeCount: 2})
		return err
	})
	if !slices.Equal(a.Ranges, []uint32{0, 1}) {
		t.Fatalf("joined with %v, want [0 1]", a.Ranges)
	}
	h.commit("a", 1, 39)
	if a = h.heartbeat("a", a.Ranges); !slices.Equal(a.Ranges, []uint32{0, 1}) {
		t.Fatalf("range 1 at 39 of 40: assigned %v, want [0 1]", a.Ranges)
	}
	h.commit("a", 1, 40)
	if a = h.heartbeat("a", a.Ranges); !slices.Equal(a.Ranges, []uint32{0}) {
		t.Fatalf("range 1 finished: told %v, want [0] (release 1)", a.Ranges)
	}
	a = h.heartbeat("a", []uint32{0})
	if !slices.Equal(a.Ranges, []uint32{0, 2, 3}) {
		t.Fatalf("after releasing 1: %v, want [0 2 3]", a.Ranges)
	}
	for _, r := range []uint32{2, 3} {
		i := slices.IndexFunc(a.Positions, func(p Position) bool { return p.Range == r })
		if i < 0 || a.Positions[i].Offset != 0 {
			t.Fatalf("child %d: positions %+v, want offset 0", r, a.Positions)
		}
	}
	// A second member shares the children and range 0, never range 1.
	h.run(func(b *Batch) error {
		_, err := h.c.Join(b, JoinRequest{Group: "g", MemberID: "b", Stream: "s", RangeCount: 2})
		return err
	})
	h.splits = append(h.splits, Split{Parent: 3, SplitOffset: 7, Left: 4, Right: 5})
	ga := h.heartbeat("a", []uint32{0, 2, 3})
	gb := h.heartbeat("b", nil)
	ga = h.heartbeat("a", ga.Ranges)
	gb = h.heartbeat("b", gb.Ranges)
	all := append(slices.Clone(ga.Ranges), gb.Ranges...)
	slices.Sort(all)
	if !slices.Equal(all, []uint32{0, 2, 3}) {
		t.Fatalf("two members, 3 split but not finished: a %v b %v, want [0 2 3] between them", ga.Ranges, gb.Ranges)
	}
}
