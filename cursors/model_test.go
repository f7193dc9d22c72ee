package cursors

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestAssignModel holds Assign to its contract on random inputs: every
// range assigned once, shares balanced, and no balanced assignment keeps
// more ranges with their previous member (checked against a brute force
// over which members get the larger shares).
func TestAssignModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 3000; iter++ {
		n := uint32(rng.IntN(40) + 1)
		m := rng.IntN(7) + 1
		var members []string
		for i := 0; i < m; i++ {
			members = append(members, fmt.Sprintf("m%02d", rng.IntN(20)))
		}
		slices.Sort(members)
		members = slices.Compact(members)
		// A random previous assignment: some ranges to some members
		// (possibly to members that left, or past the range count).
		prev := map[string][]uint32{}
		for r := uint32(0); r < n+3; r++ {
			if rng.IntN(4) > 0 {
				owner := fmt.Sprintf("m%02d", rng.IntN(20))
				prev[owner] = append(prev[owner], r)
			}
		}
		got := Assign(members, prev, n)
		checkAssignment(t, members, prev, n, got)
		// Deterministic.
		again := Assign(members, prev, n)
		for _, id := range members {
			if !slices.Equal(got[id], again[id]) {
				t.Fatalf("not deterministic for %s: %v vs %v", id, got[id], again[id])
			}
		}
	}
}

func checkAssignment(t *testing.T, members []string, prev map[string][]uint32, n uint32, got map[string][]uint32) {
	t.Helper()
	seen := make([]bool, n)
	lo, hi := int(n), 0
	kept := 0
	for _, id := range members {
		rs := got[id]
		if !slices.IsSorted(rs) {
			t.Fatalf("%s: %v not sorted", id, rs)
		}
		lo, hi = min(lo, len(rs)), max(hi, len(rs))
		for _, r := range rs {
			if r >= n || seen[r] {
				t.Fatalf("range %d assigned twice or out of bounds: %v", r, got)
			}
			seen[r] = true
			if slices.Contains(prev[id], r) {
				kept++
			}
		}
	}
	for r, ok := range seen {
		if !ok {
			t.Fatalf("range %d unassigned: %v", r, got)
		}
	}
	if hi-lo > 1 {
		t.Fatalf("unbalanced: %v", got)
	}
	if best := bestKept(members, prev, n); kept != best {
		t.Fatalf("kept %d ranges in place, a balanced assignment can keep %d (members %v, prev %v, got %v)", kept, best, members, prev, got)
	}
}

// bestKept is the most ranges any balanced assignment keeps with their
// previous member, by brute force over which members get the larger
// share: each member keeps at most min(its previous ranges, its share).
func bestKept(members []string, prev map[string][]uint32, n uint32) int {
	m := len(members)
	base, extra := int(n)/m, int(n)%m
	owned := make([]int, m)
	claimed := map[uint32]bool{}
	for i, id := range members {
		for _, r := range prev[id] {
			if r < n && !claimed[r] {
				claimed[r] = true
				owned[i]++
			}
		}
	}
	best := 0
	for mask := 0; mask < 1<<m; mask++ {
		ones := 0
		for i := 0; i < m; i++ {
			if mask&(1<<i) != 0 {
				ones++
			}
		}
		if ones != extra {
			continue
		}
		sum := 0
		for i := 0; i < m; i++ {
			share := base
			if mask&(1<<i) != 0 {
				share++
			}
			sum += min(owned[i], share)
		}
		best = max(best, sum)
	}
	return best
}

// TestGroupModel drives the group protocol with simulated members that
// follow it (join, heartbeat, release what they are told to, crash, leave,
// restart statically) and coordinator failovers, for many seeds, checking
// after every step that:
//
//   - no range is ever owned by two members, nor consumed by two live
//     member processes (a process consumes a range from the reply that
//     granted it until it releases it);
//   - the group epoch never decreases, and every grant moves a member to
//     a new, higher epoch;
//   - a commit is accepted exactly when its member owns the range in its
//     current incarnation;
//   - replaying every record proposed so far into a fresh State gives the
//     coordinator's state;
//   - once nothing changes for a while, every range is owned, and every
//     member owns exactly its target.
func TestGroupModel(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runGroupModel(t, seed) })
	}
}

type simMember struct {
	id, instance string
	epoch        uint64
	// consuming is what the process consumes: granted by replies, dropped
	// when it releases.
	consuming []uint32
	alive     bool
	// lastOK is when the process sent its last heartbeat that was
	// answered: a session later, with no answer since, it stops
	// consuming on its own (the SDK does), before the coordinator can
	// give its ranges away.
	lastOK time.Time
}

type groupSim struct {
	t       *testing.T
	rng     *rand.Rand
	s       *State
	c       *Coordinator
	now     time.Time
	homing  uint64
	log     []Record
	ranges  uint32
	members map[string]*simMember
	nextID  int
	epoch   uint64 // highest group epoch seen
}

func runGroupModel(t *testing.T, seed uint64) {
	sim := &groupSim{t: t, rng: rand.New(rand.NewPCG(seed, 7)), s: NewState(Limits{}), c: NewCoordinator(),
		now: time.Unix(1_700_000_000, 0), homing: 1, ranges: uint32(rand.New(rand.NewPCG(seed, 8)).IntN(12) + 1),
		members: map[string]*simMember{}}
	for step := 0; step < 400; step++ {
		sim.step()
		sim.check()
	}
	// Quiesce: only heartbeats from live members, past every timeout.
	for i := 0; i < 200; i++ {
		sim.now = sim.now.Add(500 * time.Millisecond)
		sim.expire()
		for _, id := range sim.liveIDs() {
			sim.heartbeat(sim.members[id])
		}
		sim.check()
	}
	sim.checkSettled()
	if vs := CheckLog(sim.log); len(vs) > 0 {
		t.Fatalf("the coordinator's log breaks its promises: %v", vs)
	}
}

func (sim *groupSim) liveIDs() []string {
	var ids []string
	for id, m := range sim.members {
		if m.alive {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// run applies a batch's records to the state (they committed) and keeps
// them for the replay check.
func (sim *groupSim) commitBatch(b *Batch) {
	for _, r := range b.Records() {
		if err := sim.s.Apply(r); err != nil {
			sim.t.Fatalf("apply: %v", err)
		}
		sim.log = append(sim.log, r)
	}
}

func (sim *groupSim) step() {
	sim.now = sim.now.Add(time.Duration(sim.rng.IntN(800)) * time.Millisecond)
	live := sim.liveIDs()
	switch k := sim.rng.IntN(20); {
	case k < 2 || len(live) == 0:
		sim.join("")
	case k < 3:
		sim.join(fmt.Sprintf("pod-%d", sim.rng.IntN(3)))
	case k < 4: // crash: the process stops, its session runs out
		sim.members[live[sim.rng.IntN(len(live))]].alive = false
	case k < 5:
		sim.leave(sim.members[live[sim.rng.IntN(len(live))]])
	case k < 6:
		sim.c = NewCoordinator() // a new leader of the cursor range
	case k < 8:
		sim.commit(sim.members[live[sim.rng.IntN(len(live))]])
	default:
		sim.heartbeat(sim.members[live[sim.rng.IntN(len(live))]])
	}
	sim.expire()
}

func (sim *groupSim) join(instance string) {
	sim.nextID++
	id := fmt.Sprintf("m%03d", sim.nextID)
	if instance != "" {
		// The old process of this instance is gone (a restart).
		for _, m := range sim.members {
			if m.instance == instance {
				m.alive = false
			}
		}
	}
	b := sim.s.Begin(sim.now, sim.homing)
	a, err := sim.c.Join(b, JoinRequest{Group: "g", MemberID: id, InstanceID: instance, Stream: "s", RangeCount: sim.ranges,
		SessionTimeout: 3 * time.Second, RebalanceTimeout: 5 * time.Second})
	if err != nil {
		sim.t.Fatalf("join: %v", err)
	}
	sim.commitBatch(b)
	m := &simMember{id: id, instance: instance, alive: true}
	sim.members[id] = m
	sim.take(m, a)
}

// take makes a process act on an assignment: consume what it lists,
// release what it no longer lists.
func (sim *groupSim) take(m *simMember, a Assignment) {
	m.lastOK = sim.now
	m.epoch = a.MemberEpoch
	m.consuming = slices.Clone(a.Ranges)
}

func (sim *groupSim) heartbeat(m *simMember) {
	b := sim.s.Begin(sim.now, sim.homing)
	a, err := sim.c.Heartbeat(b, HeartbeatRequest{Group: "g", MemberID: m.id, MemberEpoch: m.epoch, Owned: m.consuming})
	if err != nil {
		// Removed (session, rebalance timeout, or replaced): the process
		// stops consuming and is done.
		m.alive, m.consuming = false, nil
		return
	}
	sim.commitBatch(b)
	sim.take(m, a)
}

func (sim *groupSim) leave(m *simMember) {
	b := sim.s.Begin(sim.now, sim.homing)
	temporary := m.instance != "" && sim.rng.IntN(2) == 0
	if err := sim.c.Leave(b, LeaveRequest{Group: "g", MemberID: m.id, MemberEpoch: m.epoch, Temporary: temporary}); err != nil {
		sim.t.Fatalf("leave: %v", err)
	}
	sim.commitBatch(b)
	m.alive, m.consuming = false, nil
}

// commit commits a range: accepted exactly when the member owns it in its
// current incarnation, as the state says.
func (sim *groupSim) commit(m *simMember) {
	r := uint32(sim.rng.IntN(int(sim.ranges)))
	g := sim.s.Group("g")
	owner := g != nil && !g.Deleted && g.Member(m.id) != nil && g.Member(m.id).Owns(r) &&
		m.epoch >= g.Member(m.id).JoinEpoch && m.epoch <= g.Member(m.id).Epoch
	b := sim.s.Begin(sim.now, sim.homing)
	_, err := b.Commit(CommitRequest{Cursor: "g", MemberID: m.id, MemberEpoch: m.epoch,
		Positions: []Position{{Stream: "s", Range: r, Offset: uint64(sim.now.UnixMilli())}}})
	if (err == nil) != owner {
		sim.t.Fatalf("commit of range %d by %s@%s: err %v, owner %t", r, m.id, EpochString(m.epoch), err, owner)
	}
	if err == nil && !slices.Contains(m.consuming, r) && !g.Member(m.id).Owns(r) {
		sim.t.Fatalf("a commit of a range not consumed nor owned was accepted")
	}
	sim.commitBatch(b)
}

func (sim *groupSim) expire() {
	b := sim.s.Begin(sim.now, sim.homing)
	sim.c.Expire(b)
	sim.commitBatch(b)
}

func (sim *groupSim) check() {
	t := sim.t
	g := sim.s.Group("g")
	if g == nil {
		return
	}
	if err := g.validate(); err != nil {
		t.Fatalf("invalid group: %v", err)
	}
	if g.Epoch < sim.epoch {
		t.Fatalf("group epoch went back: %s after %s", EpochString(g.Epoch), EpochString(sim.epoch))
	}
	sim.epoch = g.Epoch
	// No range consumed by two live processes.
	by := map[uint32]string{}
	for _, id := range sim.liveIDs() {
		if m := sim.members[id]; !sim.now.Before(m.lastOK.Add(3 * time.Second)) {
			m.consuming = nil // fenced itself: no answer for a session
		}
		for _, r := range sim.members[id].consuming {
			if other, ok := by[r]; ok {
				t.Fatalf("range %d consumed by %s and %s", r, other, id)
			}
			by[r] = id
			// A process consumes only what it owns in the durable state.
			if m := g.Member(id); m == nil || !m.Owns(r) {
				t.Fatalf("%s consumes range %d it does not own", id, r)
			}
		}
	}
	if sim.rng.IntN(40) != 0 {
		return
	}
	replay := NewState(Limits{})
	for _, r := range sim.log {
		if err := replay.Apply(r); err != nil {
			t.Fatal(err)
		}
	}
	if a, b := EncodeGroup(replay.Group("g")), EncodeGroup(g); !bytes.Equal(a.Value, b.Value) {
		t.Fatalf("replay differs")
	}
}

func (sim *groupSim) checkSettled() {
	g := sim.s.Group("g")
	if g == nil || !g.Live() {
		return
	}
	owned := 0
	for _, m := range g.Members {
		if !slices.Equal(m.Owned, m.Target) || len(m.Revoking) > 0 {
			sim.t.Fatalf("settled group: %s owns %v, target %v", m.ID, m.Owned, m.Target)
		}
		owned += len(m.Owned)
	}
	if owned != int(sim.ranges) {
		sim.t.Fatalf("settled group owns %d of %d ranges", owned, sim.ranges)
	}
}

// TestPositionModel holds positions to a map of max-registers under
// random commits, resets, deletes, and records held back and applied late
// (an orphan log merged back), with the State rebuilt from the log at
// random points.
func TestPositionModel(t *testing.T) {
	for seed := uint64(1); seed <= 100; seed++ {
		rng := rand.New(rand.NewPCG(seed, 3))
		s := NewState(Limits{})
		type key struct {
			cursor string
			rng    uint32
		}
		model := map[key][2]uint64{} // generation, offset
		var log, held []Record
		now := time.Unix(1_700_000_000, 0)
		for step := 0; step < 500; step++ {
			now = now.Add(time.Millisecond)
			cursor := fmt.Sprintf("c%d", rng.IntN(4))
			b := s.Begin(now, 1)
			switch k := rng.IntN(10); {
			case k < 7:
				r := uint32(rng.IntN(4))
				gen, off := uint64(rng.IntN(3)), uint64(rng.IntN(100))
				cur, ok := model[key{cursor, r}]
				_, err := b.Commit(CommitRequest{Cursor: cursor, Positions: []Position{{Stream: "s", Range: r, Generation: gen, Offset: off}}})
				if ok && gen < cur[0] {
					if err == nil {
						t.Fatalf("seed %d: a commit of an older generation was taken", seed)
					}
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if !ok || gen > cur[0] || (gen == cur[0] && off > cur[1]) {
					model[key{cursor, r}] = [2]uint64{gen, off}
				}
			case k < 8:
				r := uint32(rng.IntN(4))
				ps, err := b.Reset(cursor, "s", []Position{{Range: r, Offset: uint64(rng.IntN(100))}})
				if err != nil {
					t.Fatal(err)
				}
				model[key{cursor, r}] = [2]uint64{ps[0].Generation, ps[0].Offset}
			case k < 9:
				if _, err := b.Delete(cursor); err == nil {
					for k := range model {
						if k.cursor == cursor {
							delete(model, k)
						}
					}
				}
			default:
				// A late copy of earlier commits, merged back: the model
				// takes the max as well.
				for _, r := range held {
					d, _ := Decode(r)
					if d.Position.Deleted {
						continue
					}
					k := key{d.Cursor, d.Position.Range}
					cur, ok := model[k]
					p := d.Position
					if !ok || p.Generation > cur[0] || (p.Generation == cur[0] && p.Offset > cur[1]) {
						model[k] = [2]uint64{p.Generation, p.Offset}
					}
					if err := s.Apply(r); err != nil {
						t.Fatal(err)
					}
					log = append(log, r)
				}
				held = nil
				continue
			}
			for _, r := range b.Records() {
				if rng.IntN(20) == 0 {
					held = append(held, r) // shipped late
				}
				if err := s.Apply(r); err != nil {
					t.Fatal(err)
				}
				log = append(log, r)
			}
			if rng.IntN(50) == 0 {
				s = NewState(Limits{})
				for _, r := range log {
					if err := s.Apply(r); err != nil {
						t.Fatal(err)
					}
				}
			}
			for k, want := range model {
				p, ok := s.Position(k.cursor, "s", k.rng)
				if !ok || p.Generation != want[0] || p.Offset != want[1] {
					t.Fatalf("seed %d step %d: %v is %+v (held %t), model %v", seed, step, k, p, ok, want)
				}
			}
			if n, _ := s.Counts(); n != len(model) {
				t.Fatalf("seed %d: %d positions, model %d", seed, n, len(model))
			}
		}
	}
}

// TestCheckLog: CheckLog finds what the coordinator must never write.
func TestCheckLog(t *testing.T) {
	g := &Group{Name: "g", Stream: "s", RangeCount: 2, Epoch: 5, AssignmentEpoch: 5,
		Members: []Member{{ID: "a", Epoch: 5, JoinEpoch: 3, SessionTimeoutMillis: 1000, RebalanceTimeoutMillis: 1000, Target: []uint32{0}, Owned: []uint32{0}}}}
	pos := func(off, epoch uint64, member string, rng uint32) Record {
		return EncodePosition("g", Position{Stream: "s", Range: rng, Offset: off, MemberID: member, MemberEpoch: epoch})
	}
	older := g.clone()
	older.Epoch = 4
	log := []Record{
		EncodeGroup(g),
		pos(10, 5, "a", 0), // fine
		pos(10, 5, "a", 0), // does not raise
		pos(9, 5, "a", 0),  // goes back
		pos(11, 2, "a", 0), // an epoch before a's join
		pos(12, 5, "b", 0), // not a member
		pos(1, 5, "a", 1),  // a range a does not own
		EncodeGroup(older), // group epoch back
		pos(13, 4, "a", 0), // fine
	}
	vs := CheckLog(log)
	var got []int
	for _, v := range vs {
		got = append(got, v.Index)
	}
	if fmt.Sprint(got) != "[2 3 4 5 6 7]" {
		t.Fatalf("violations %v", vs)
	}
}

// TestBatchCut: one batch kept across proposals (Cut after each) writes
// records that, applied in order, give the state that one batch per
// proposal gives, and each cut holds only what was staged since the last.
func TestBatchCut(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	one := NewState(Limits{})
	kept := NewState(Limits{})
	b := kept.Begin(now, 1)
	c := NewCoordinator()
	c1 := NewCoordinator()
	var cuts [][]Record
	for round := 0; round < 5; round++ {
		fresh := one.Begin(now, 1)
		for _, bb := range []*Batch{fresh, b} {
			if _, err := bb.Commit(CommitRequest{Cursor: "c", Positions: []Position{{Stream: "s", Range: 0, Offset: uint64(10 * (round + 1))}}}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := c1.Join(fresh, JoinRequest{Group: "g", MemberID: fmt.Sprintf("m%d", round), Stream: "s", RangeCount: 4}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Join(b, JoinRequest{Group: "g", MemberID: fmt.Sprintf("m%d", round), Stream: "s", RangeCount: 4}); err != nil {
			t.Fatal(err)
		}
		for _, r := range fresh.Records() {
			if err := one.Apply(r); err != nil {
				t.Fatal(err)
			}
		}
		cut := b.Cut()
		if len(cut) != 2 {
			t.Fatalf("round %d cut %d records, want the round's 2", round, len(cut))
		}
		cuts = append(cuts, cut)
	}
	for _, cut := range cuts {
		for _, r := range cut {
			if err := kept.Apply(r); err != nil {
				t.Fatal(err)
			}
		}
	}
	if a, b := EncodeGroup(one.Group("g")), EncodeGroup(kept.Group("g")); !bytes.Equal(a.Value, b.Value) {
		t.Fatal("the group differs")
	}
	if p, _ := kept.Position("c", "s", 0); p.Offset != 50 {
		t.Fatalf("position %+v", p)
	}
}
