package membership

import (
	"encoding/json"
	"errors"
	"testing"
)

func seeded(t *testing.T) *List {
	t.Helper()
	l := &List{}
	if err := l.Seed([]Node{{ID: 1, Addr: "a:1"}, {ID: 2, Addr: "a:2", Zone: "z2"}, {ID: 3, Addr: "a:3"}}); err != nil {
		t.Fatal(err)
	}
	return l
}

// TestJoinRules fails if a join the package doc refuses is accepted, or
// the refusal has the wrong sentinel.
func TestJoinRules(t *testing.T) {
	l := seeded(t)
	if err := l.Seed([]Node{{ID: 9, Addr: "a:9"}}); !errors.Is(err, ErrSeeded) {
		t.Fatalf("second seed: %v", err)
	}
	if changed, err := l.Join(Node{ID: 4, Addr: "a:4", Zone: "z4"}); err != nil || !changed {
		t.Fatalf("join 4: %v %v", changed, err)
	}
	if changed, err := l.Join(Node{ID: 4, Addr: "a:4", Zone: "z4"}); err != nil || changed {
		t.Fatalf("rejoin 4 at the same address: %v %v", changed, err)
	}
	cases := []struct {
		n    Node
		want error
	}{
		{Node{ID: 5, Addr: "a:2"}, ErrAddressInUse},
		{Node{ID: 4, Addr: "a:5"}, ErrIDInUse},
		{Node{ID: 0, Addr: "a:5"}, ErrBadNode},
		{Node{ID: 5, Addr: "no-port"}, ErrBadNode},
	}
	for _, c := range cases {
		if _, err := l.Join(c.n); !errors.Is(err, c.want) {
			t.Errorf("join %+v: %v, want %v", c.n, err, c.want)
		}
	}
	if _, err := l.SetState(3, Decommissioned); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Join(Node{ID: 3, Addr: "a:3"}); !errors.Is(err, ErrIDRetired) {
		t.Fatalf("reuse of decommissioned id: %v", err)
	}
	// A decommissioned node's address may be used by a new id.
	if _, err := l.Join(Node{ID: 6, Addr: "a:3"}); err != nil {
		t.Fatalf("new id at a decommissioned node's address: %v", err)
	}
	if got := l.Seeds(); len(got) != 3 || got[0] != 1 || got[2] != 3 {
		t.Fatalf("seeds %v", got)
	}
}

// TestStateRules fails if a state change the package doc refuses is
// accepted.
func TestStateRules(t *testing.T) {
	l := seeded(t)
	if _, err := l.SetState(7, Draining); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("unknown id: %v", err)
	}
	if _, err := l.SetState(1, State(9)); !errors.Is(err, ErrBadState) {
		t.Fatalf("bad state: %v", err)
	}
	for _, s := range []State{Draining, Live, Draining, Decommissioned} {
		if _, err := l.SetState(1, s); err != nil {
			t.Fatalf("to %v: %v", s, err)
		}
	}
	if _, err := l.SetState(1, Live); !errors.Is(err, ErrDecommissioned) {
		t.Fatalf("out of decommissioned: %v", err)
	}
	if changed, err := l.SetState(1, Decommissioned); err != nil || changed {
		t.Fatalf("decommission twice: %v %v", changed, err)
	}
}

// TestListRoundTrip fails if the JSON form loses a field or accepts a
// corrupt list.
func TestListRoundTrip(t *testing.T) {
	l := seeded(t)
	l.Join(Node{ID: 4, Addr: "a:4", Zone: "z"})
	l.SetState(2, Draining)
	b, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	var back List
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	b2, _ := json.Marshal(&back)
	if string(b) != string(b2) {
		t.Fatalf("round trip:\n%s\n%s", b, b2)
	}
	for _, bad := range []string{`[{"id":1,"addr":"a:1","state":"gone"}]`, `[{"id":0,"addr":"a:1","state":"live"}]`,
		`[{"id":1,"addr":"a:1","state":"live"},{"id":1,"addr":"a:2","state":"live"}]`} {
		if err := json.Unmarshal([]byte(bad), &back); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

// TestMerge fails if a merge loses a node only the older list has, takes
// the older list's fields over the newer's, or undoes a decommission.
func TestMerge(t *testing.T) {
	newer, older := seeded(t), seeded(t)
	newer.Join(Node{ID: 1, Addr: "a:1", Zone: "new"})
	older.Join(Node{ID: 4, Addr: "a:4"})
	older.SetState(2, Decommissioned)
	m := Merge(newer, older)
	if n, _ := m.Get(1); n.Zone != "new" {
		t.Errorf("node 1 %+v: want the newer zone", n)
	}
	if _, ok := m.Get(4); !ok {
		t.Error("node 4, only in the older list, lost")
	}
	if n, _ := m.Get(2); n.State != Decommissioned {
		t.Errorf("node 2 %+v: a decommission undone", n)
	}
	if n, _ := newer.Get(2); n.State != Live {
		t.Error("Merge changed its argument")
	}
}

// TestMoveRules: a member moves to a free address (marked Moved, and again
// is a no-op); an unknown id, a decommissioned one and another node's
// address are refused with their sentinels. It fails on any other outcome.
func TestMoveRules(t *testing.T) {
	l := &List{}
	if err := l.Seed([]Node{{ID: 1, Addr: "h:1"}, {ID: 2, Addr: "h:2"}, {ID: 3, Addr: "h:3"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.SetState(3, Decommissioned); err != nil {
		t.Fatal(err)
	}
	if changed, err := l.Move(Node{ID: 1, Addr: "h:9"}); !changed || err != nil {
		t.Fatalf("move 1: %v %v", changed, err)
	}
	if n, _ := l.Get(1); n.Addr != "h:9" || !n.Moved || !n.Seed || n.State != Live {
		t.Fatalf("moved node: %+v", n)
	}
	if changed, err := l.Move(Node{ID: 1, Addr: "h:9"}); changed || err != nil {
		t.Fatalf("move again: %v %v", changed, err)
	}
	for _, c := range []struct {
		n    Node
		want error
	}{
		{Node{ID: 7, Addr: "h:7"}, ErrUnknownNode},
		{Node{ID: 3, Addr: "h:8"}, ErrIDRetired},
		{Node{ID: 2, Addr: "h:9"}, ErrAddressInUse},
		{Node{ID: 2, Addr: "nohostport"}, ErrBadNode},
	} {
		if _, err := l.Move(c.n); !errors.Is(err, c.want) {
			t.Errorf("move %+v: %v, want %v", c.n, err, c.want)
		}
	}
}
