package cursors

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestCompactedLogKeepsState: the cursor stream is compacted by key (the
// newest record of each key below a point stays, and tombstones older than
// the delete retention go), and a State rebuilt from the compacted log is
// the State the whole log gave. Random commits, resets, deletes, merges of
// positions from an orphan log, joins, heartbeats, leaves, expiries and
// group deletes, with compactions at random points (each composing with
// the ones before), through a new coordinator now and then.
func TestCompactedLogKeepsState(t *testing.T) {
	for seed := uint64(1); seed <= 60; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runCompactionModel(t, seed) })
	}
}

// compactionSim is one range of the cursor stream, its log (compacted
// now and then) and the State that applied every record as it came.
type compactionSim struct {
	t       *testing.T
	rng     *rand.Rand
	s       *State
	c       *Coordinator
	now     time.Time
	log     []Record
	epochs  map[string]uint64 // member id -> epoch, for live members
	held    []Position        // positions shipped late (an orphan log)
	heldFor []string
	nextID  int
}

func runCompactionModel(t *testing.T, seed uint64) {
	sim := &compactionSim{t: t, rng: rand.New(rand.NewPCG(seed, 11)), s: NewState(Limits{}), c: NewCoordinator(),
		now: time.Unix(1_700_000_000, 0), epochs: map[string]uint64{}}
	compactions := 0
	for step := 0; step < 600; step++ {
		sim.now = sim.now.Add(time.Duration(sim.rng.IntN(400)) * time.Millisecond)
		b := sim.s.Begin(sim.now, 1)
		sim.op(b)
		for _, e := range sim.c.Expire(b) {
			delete(sim.epochs, e.MemberID)
		}
		for _, r := range b.Records() {
			if err := sim.s.Apply(r); err != nil {
				t.Fatalf("apply: %v", err)
			}
			sim.log = append(sim.log, r)
		}
		if sim.rng.IntN(40) == 0 {
			sim.log = compactLog(sim.log, sim.rng.IntN(len(sim.log)+1), sim.rng.IntN(len(sim.log)+1))
			compactions++
			sim.check(step)
		}
	}
	sim.log = compactLog(sim.log, len(sim.log), len(sim.log))
	sim.check(-1)
	if compactions == 0 {
		t.Fatal("no compaction ran")
	}
}

// op runs one random request through b, as the coordinator would.
func (sim *compactionSim) op(b *Batch) {
	cursor := fmt.Sprintf("c%d", sim.rng.IntN(3))
	group := fmt.Sprintf("g%d", sim.rng.IntN(2))
	rg := uint32(sim.rng.IntN(4))
	switch k := sim.rng.IntN(20); {
	case k < 5:
		res, err := b.Commit(CommitRequest{Cursor: cursor, Positions: []Position{{Stream: "s", Range: rg, Offset: uint64(sim.rng.IntN(1000))}}})
		if err == nil && sim.rng.IntN(4) == 0 {
			sim.held, sim.heldFor = append(sim.held, res[0].Position), append(sim.heldFor, cursor)
		}
	case k < 6:
		_, _ = b.Reset(cursor, "s", []Position{{Range: rg, Offset: uint64(sim.rng.IntN(1000))}})
	case k < 7:
		_, _ = b.Delete(cursor)
	case k < 8 && len(sim.held) > 0:
		i := sim.rng.IntN(len(sim.held))
		if _, err := b.Merge(sim.heldFor[i], []Position{sim.held[i]}); err != nil {
			sim.t.Fatalf("merge: %v", err)
		}
	case k < 10:
		sim.nextID++
		id := fmt.Sprintf("%s-m%d", group, sim.nextID)
		a, err := sim.c.Join(b, JoinRequest{Group: group, MemberID: id, Stream: "s", RangeCount: 4,
			SessionTimeout: 2 * time.Second, RebalanceTimeout: 3 * time.Second})
		if err == nil {
			sim.epochs[id] = a.MemberEpoch
		}
	case k < 15:
		sim.memberOp(b, group, rg)
	case k < 16:
		_, _ = b.Delete(group) // refused while the group has members
	case k < 17:
		sim.c = NewCoordinator()
	}
}

// memberOp has a live member of group heartbeat, commit a range or leave.
func (sim *compactionSim) memberOp(b *Batch, group string, rg uint32) {
	g := b.Group(group)
	if g == nil || !g.Live() {
		return
	}
	m := g.Members[sim.rng.IntN(len(g.Members))]
	epoch, ok := sim.epochs[m.ID]
	if !ok {
		return
	}
	switch sim.rng.IntN(4) {
	case 0:
		if sim.c.Leave(b, LeaveRequest{Group: group, MemberID: m.ID, MemberEpoch: epoch}) == nil {
			delete(sim.epochs, m.ID)
		}
	case 1:
		_, _ = b.Commit(CommitRequest{Cursor: group, MemberID: m.ID, MemberEpoch: epoch,
			Positions: []Position{{Stream: "s", Range: rg, Offset: uint64(sim.rng.IntN(1000))}}})
	default:
		a, err := sim.c.Heartbeat(b, HeartbeatRequest{Group: group, MemberID: m.ID, MemberEpoch: epoch, Owned: m.Assigned()})
		if err == nil {
			sim.epochs[m.ID] = a.MemberEpoch
		}
	}
}

// check rebuilds a State from the (compacted) log and compares it with
// the State that applied every record.
func (sim *compactionSim) check(step int) {
	rebuilt := NewState(Limits{})
	for _, r := range sim.log {
		if err := rebuilt.Apply(r); err != nil {
			sim.t.Fatalf("apply the compacted log: %v", err)
		}
	}
	if got, want := dumpState(rebuilt), dumpState(sim.s); got != want {
		sim.t.Fatalf("step %d: the compacted log (%d records) gives\n%s\nthe whole log gave\n%s", step, len(sim.log), got, want)
	}
}

// compactLog is compaction by key as package compact applies it: below
// point, only the newest record of each key stays, and a tombstone below
// cutoff (min(cutoff, point)) goes too. Records at or past point stay.
func compactLog(log []Record, point, cutoff int) []Record {
	cutoff = min(cutoff, point)
	newest := map[string]int{}
	for i, r := range log[:point] {
		newest[string(r.Key)] = i
	}
	var out []Record
	for i, r := range log {
		if i < point && (newest[string(r.Key)] != i || (r.Tombstone && i < cutoff)) {
			continue
		}
		out = append(out, r)
	}
	return out
}

// dumpState prints everything a State holds, sorted.
func dumpState(s *State) string {
	var out strings.Builder
	names := make([]string, 0, len(s.cursors))
	for c := range s.cursors {
		names = append(names, c)
	}
	slices.Sort(names)
	for _, c := range names {
		for _, p := range s.cursors[c] {
			fmt.Fprintf(&out, "position %s %+v\n", c, p)
		}
	}
	groups := make([]string, 0, len(s.groups))
	for g := range s.groups {
		groups = append(groups, g)
	}
	slices.Sort(groups)
	for _, g := range groups {
		fmt.Fprintf(&out, "group %+v\n", *s.groups[g])
	}
	positions, ngroups := s.Counts()
	fmt.Fprintf(&out, "%d positions, %d groups, live %v\n", positions, ngroups, s.LiveGroups())
	return out.String()
}
