package placement

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// apply carries out moves and transfers on reg as a driver would once
// they finish: the target joins, the source leaves (and loses the
// leadership, which goes to the target).
func apply(reg *Region, moves []Move, transfers []Transfer) {
	at := map[RangeID]int{}
	for i, r := range reg.Ranges {
		at[r.ID] = i
	}
	for _, m := range moves {
		r := &reg.Ranges[at[m.Range]]
		r.Replicas = without(r.Replicas, m.From)
		if m.To != 0 {
			r.Replicas = append(r.Replicas, m.To)
		}
		if r.Leader == m.From {
			r.Leader = m.To
		}
	}
	for _, t := range transfers {
		reg.Ranges[at[t.Range]].Leader = t.To
	}
}

// converge plans and applies until the plans are empty, failing after
// rounds plans (no convergence).
func converge(t *testing.T, reg *Region, movesMax, rounds int) (moves int) {
	t.Helper()
	for i := 0; i < rounds; i++ {
		ms := Plan(*reg, Config{MovesMax: movesMax})
		ts := LeaderTransfers(*reg, movesMax)
		if len(ms) == 0 && len(ts) == 0 {
			return moves
		}
		checkPlan(t, *reg, ms, movesMax)
		apply(reg, ms, ts)
		moves += len(ms)
	}
	t.Fatalf("no convergence after %d plans", rounds)
	return 0
}

// checkPlan checks one plan's own rules: at most movesMax moves, one per
// range, targets live and not already replicas, sources replicas.
func checkPlan(t *testing.T, reg Region, ms []Move, movesMax int) {
	t.Helper()
	if len(ms) > movesMax {
		t.Fatalf("%d moves, more than the bound %d", len(ms), movesMax)
	}
	state := map[uint64]NodeState{}
	for _, n := range reg.Nodes {
		state[n.ID] = n.State
	}
	seen := map[RangeID]bool{}
	for _, m := range ms {
		if seen[m.Range] {
			t.Fatalf("two moves of %v in one plan: %v", m.Range, ms)
		}
		seen[m.Range] = true
		var r Range
		for _, x := range reg.Ranges {
			if x.ID == m.Range {
				r = x
			}
		}
		if r.Moving {
			t.Fatalf("move of %v, whose earlier move is under way", m.Range)
		}
		if st, ok := state[m.To]; !ok || st != Live {
			t.Fatalf("move %+v to a node that is not live", m)
		}
		if slices.Contains(r.Replicas, m.To) || (m.From != 0 && !slices.Contains(r.Replicas, m.From)) {
			t.Fatalf("move %+v does not fit replicas %v", m, r.Replicas)
		}
	}
}

// region returns n nodes over zones (round robin) and ranges of rf
// replicas placed by Choose one after another, each led by its first.
func region(t *testing.T, nodes int, zones []string, ranges, rf int) Region {
	t.Helper()
	var reg Region
	for i := 1; i <= nodes; i++ {
		reg.Nodes = append(reg.Nodes, Node{ID: uint64(i), Zone: zones[(i-1)%len(zones)]})
	}
	for i := 0; i < ranges; i++ {
		ids, err := Choose(reg, rf)
		if err != nil {
			t.Fatal(err)
		}
		reg.Ranges = append(reg.Ranges, Range{ID: RangeID{"s", uint32(i)}, Replicas: ids, Leader: ids[i%len(ids)],
			SizeBytes: int64(1+i%7) << 20, ReplicationFactor: rf})
	}
	return reg
}

// counts returns replicas and leaders per live node.
func counts(reg Region) (replicas, leaders map[uint64]int) {
	replicas, leaders = map[uint64]int{}, map[uint64]int{}
	for _, n := range reg.Nodes {
		if n.State == Live {
			replicas[n.ID], leaders[n.ID] = 0, 0
		}
	}
	for _, r := range reg.Ranges {
		for _, id := range r.Replicas {
			replicas[id]++
		}
		leaders[r.Leader]++
	}
	return replicas, leaders
}

// within checks that every live node's count is within frac of the mean.
func within(t *testing.T, what string, c map[uint64]int, frac float64) {
	t.Helper()
	total := 0
	for _, n := range c {
		total += n
	}
	mean := float64(total) / float64(len(c))
	for id, n := range c {
		if d := float64(n) - mean; d > frac*mean || -d > frac*mean {
			t.Fatalf("node %d has %d %s, the mean is %.1f: more than %.0f%% off (%v)", id, n, what, mean, frac*100, c)
		}
	}
}

// checkSpread checks that every range has rf distinct replicas on live
// nodes spanning min(rf, zones) zones.
func checkSpread(t *testing.T, reg Region, zones int) {
	t.Helper()
	zone := map[uint64]string{}
	for _, n := range reg.Nodes {
		if n.State == Live {
			zone[n.ID] = n.Zone
		}
	}
	for _, r := range reg.Ranges {
		z := map[string]bool{}
		ids := map[uint64]bool{}
		for _, id := range r.Replicas {
			zn, ok := zone[id]
			if !ok {
				t.Fatalf("%v has a replica on node %d, which is not live: %v", r.ID, id, r.Replicas)
			}
			z[zn], ids[id] = true, true
		}
		if len(ids) != r.ReplicationFactor || len(r.Replicas) != r.ReplicationFactor {
			t.Fatalf("%v has replicas %v, want %d distinct", r.ID, r.Replicas, r.ReplicationFactor)
		}
		if want := min(r.ReplicationFactor, zones); len(z) != want {
			t.Fatalf("%v spans %d zones (%v), want %d", r.ID, len(z), r.Replicas, want)
		}
	}
}

func TestChooseSpreadsOverZonesThenLoad(t *testing.T) {
	reg := Region{Nodes: []Node{{ID: 1, Zone: "a"}, {ID: 2, Zone: "a"}, {ID: 3, Zone: "b"}, {ID: 4, Zone: "c"}, {ID: 5, Zone: "c", State: Draining}}}
	ids, err := Choose(reg, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, []uint64{1, 3, 4}) {
		t.Fatalf("chose %v, want one node per zone, lowest ids first: [1 3 4]", ids)
	}
	// Node 1 now holds a replica more: zone a's other node is chosen.
	reg.Ranges = []Range{{ID: RangeID{"s", 0}, Replicas: ids, ReplicationFactor: 3}}
	if ids, _ := Choose(reg, 3); !slices.Equal(ids, []uint64{2, 3, 4}) {
		t.Fatalf("chose %v, want [2 3 4]", ids)
	}
	if _, err := Choose(Region{Nodes: reg.Nodes[:2]}, 3); !errors.Is(err, ErrNotEnoughNodes) {
		t.Fatalf("three replicas on two live nodes: %v, want ErrNotEnoughNodes", err)
	}
}

// TestGrowThreeToSix: 300 ranges on three nodes, one per zone; three more
// nodes join (one per zone). Planning and applying, eight moves at a time,
// ends with replicas and leaders within 20% of even, every range still on
// three zones, having moved no more than half the replicas.
func TestGrowThreeToSix(t *testing.T) {
	zones := []string{"a", "b", "c"}
	reg := region(t, 3, zones, 300, 3)
	for i := 4; i <= 6; i++ {
		reg.Nodes = append(reg.Nodes, Node{ID: uint64(i), Zone: zones[(i-1)%3]})
	}
	moves := converge(t, &reg, 8, 1000)
	replicas, leaders := counts(reg)
	within(t, "replicas", replicas, 0.2)
	within(t, "leaders", leaders, 0.2)
	checkSpread(t, reg, 3)
	if moves > 450 {
		t.Fatalf("%d moves to balance 900 replicas over twice the nodes (450 is the least)", moves)
	}
}

// TestDecommissionAndDeath: a decommissioned node and a dead one lose
// every replica; each range is back to three live replicas over three
// zones; the ranges with two replicas gone are repaired first.
func TestDecommissionAndDeath(t *testing.T) {
	zones := []string{"a", "b", "c"}
	reg := region(t, 6, zones, 60, 3)
	reg.Nodes[0].State = Decommissioned // node 1, zone a
	reg.Nodes[1].State = Dead           // node 2, zone b
	l := newLoad(reg)
	serving := map[RangeID]int{}
	twoGone := 0
	for _, r := range reg.Ranges {
		serving[r.ID] = l.liveReplicas(r)
		if serving[r.ID] == 1 {
			twoGone++
		}
	}
	if twoGone == 0 {
		t.Fatal("no range lost two replicas: the test wants some")
	}
	first := Plan(reg, Config{MovesMax: twoGone + 10})
	for i, m := range first {
		if m.Reason != Repair {
			t.Fatalf("move %+v before the repairs are done", m)
		}
		if want := 1 + boolInt(i >= twoGone); serving[m.Range] != want {
			t.Fatalf("move %d repairs %v with %d serving replicas, want %d: the ranges with one go first (%v)", i, m.Range, serving[m.Range], want, first)
		}
	}
	converge(t, &reg, 4, 1000)
	checkSpread(t, reg, 3)
	// Zones a and b have one live node each, which must hold every
	// range's replica in its zone; zone c's two nodes share theirs.
	replicas, _ := counts(reg)
	if replicas[4] != 60 || replicas[5] != 60 || replicas[3]+replicas[6] != 60 || replicas[3]-replicas[6] > 1 || replicas[6]-replicas[3] > 1 {
		t.Fatalf("replicas per node %v, want 60 on nodes 4 and 5 and 30 each on 3 and 6", replicas)
	}
}

// TestDrainKeepsServingUntilMoved: a draining node's replicas move away
// (Drain), and its leaderships go first.
func TestDrainKeepsServingUntilMoved(t *testing.T) {
	zones := []string{"a", "b", "c"}
	reg := region(t, 6, zones, 30, 3)
	reg.Nodes[3].State = Draining // node 4
	ts := LeaderTransfers(reg, 100)
	for _, r := range reg.Ranges {
		if r.Leader == 4 && !slices.ContainsFunc(ts, func(x Transfer) bool { return x.Range == r.ID && x.From == 4 }) {
			t.Fatalf("%v led by the draining node 4 is not transferred: %v", r.ID, ts)
		}
	}
	ms := Plan(reg, Config{MovesMax: 100})
	for _, m := range ms {
		if m.Reason != Drain || m.From != 4 {
			t.Fatalf("move %+v while draining node 4 (only drains expected first)", m)
		}
	}
	converge(t, &reg, 5, 1000)
	for _, r := range reg.Ranges {
		if slices.Contains(r.Replicas, 4) || r.Leader == 4 {
			t.Fatalf("%v still on the drained node 4: %v leader %d", r.ID, r.Replicas, r.Leader)
		}
	}
}

// TestMovingRangesAreLeftAlone: a range with a move under way takes part
// in no plan, even when its replica is on a dead node.
func TestMovingRangesAreLeftAlone(t *testing.T) {
	reg := region(t, 4, []string{"a", "b", "c", "d"}, 4, 3)
	reg.Nodes[0].State = Dead
	for i := range reg.Ranges {
		reg.Ranges[i].Moving = true
	}
	if ms := Plan(reg, Config{MovesMax: 10}); len(ms) != 0 {
		t.Fatalf("planned %v for ranges that are all moving", ms)
	}
}

// TestPlanIsDeterministic: the same snapshot gives the same plan, whatever
// the order of its nodes and ranges.
func TestPlanIsDeterministic(t *testing.T) {
	reg := region(t, 5, []string{"a", "b"}, 40, 3)
	reg.Nodes = append(reg.Nodes, Node{ID: 6, Zone: "c"}, Node{ID: 7, Zone: "c"})
	want := Plan(reg, Config{MovesMax: 6})
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20; i++ {
		rnd.Shuffle(len(reg.Nodes), func(a, b int) { reg.Nodes[a], reg.Nodes[b] = reg.Nodes[b], reg.Nodes[a] })
		rnd.Shuffle(len(reg.Ranges), func(a, b int) { reg.Ranges[a], reg.Ranges[b] = reg.Ranges[b], reg.Ranges[a] })
		if got := Plan(reg, Config{MovesMax: 6}); !slices.Equal(got, want) {
			t.Fatalf("shuffled input planned %v, want %v", got, want)
		}
	}
}

// TestRandomRegionsConverge: random regions (nodes, zones, states, ranges
// of replication factor 1, 3 or 5 placed anywhere) converge, and end with
// every range on distinct live nodes spanning as many zones as it can and
// replicas per live node differing by at most a few.
func TestRandomRegionsConverge(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(seed, 7))
			zones := []string{"a", "b", "c", "d"}[:1+rnd.IntN(4)]
			rf := []int{1, 3, 5}[rnd.IntN(3)]
			var reg Region
			live := 0
			for i := 1; i <= 2+rnd.IntN(10); i++ {
				st := Live
				if rnd.IntN(5) == 0 {
					st = NodeState(1 + rnd.IntN(3))
				}
				if st == Live {
					live++
				}
				reg.Nodes = append(reg.Nodes, Node{ID: uint64(i), Zone: zones[rnd.IntN(len(zones))], State: st})
			}
			if live < rf {
				t.Skip("fewer live nodes than the replication factor")
			}
			for i := 0; i < rnd.IntN(80); i++ {
				var ids []uint64
				for _, p := range rnd.Perm(len(reg.Nodes))[:min(rf, len(reg.Nodes))] {
					ids = append(ids, reg.Nodes[p].ID)
				}
				reg.Ranges = append(reg.Ranges, Range{ID: RangeID{"s", uint32(i)}, Replicas: ids, Leader: ids[0],
					SizeBytes: rnd.Int64N(1 << 30), ReplicationFactor: rf})
			}
			converge(t, &reg, 1+rnd.IntN(8), 5000)
			liveZones := map[string]bool{}
			for _, n := range reg.Nodes {
				if n.State == Live {
					liveZones[n.Zone] = true
				}
			}
			checkSpread(t, reg, len(liveZones))
		})
	}
}

// TestChooseEachSpreads fails if a new stream's ranges do not spread over
// every live node, or land on a node that is not live.
func TestChooseEachSpreads(t *testing.T) {
	reg := Region{Nodes: []Node{{ID: 1}, {ID: 2}, {ID: 3}, {ID: 4}, {ID: 5, State: Draining}}}
	for i := 0; i < 6; i++ { // six ranges of RF 3 on nodes 1-3
		reg.Ranges = append(reg.Ranges, Range{ID: RangeID{"old", uint32(i)}, Replicas: []uint64{1, 2, 3}, ReplicationFactor: 3})
	}
	got, err := ChooseEach(reg, 3, 4)
	if err != nil {
		t.Fatal(err)
	}
	count := map[uint64]int{}
	for _, reps := range got {
		for _, id := range reps {
			count[id]++
		}
	}
	if count[5] != 0 || count[4] != 4 {
		t.Fatalf("replicas per node %v: want every range on the empty node 4, none on draining 5", count)
	}
	if _, err := ChooseEach(reg, 5, 1); !errors.Is(err, ErrNotEnoughNodes) {
		t.Fatalf("rf 5 on 4 live nodes: %v", err)
	}
}

// TestPlanRemovesExcessVoter: a range left with more voters than its
// replication factor (two moves of it that overlapped) loses one, and
// only one per plan: the one on a dead node before a draining one, a
// draining one before a live one, among live ones not the leader and the
// most loaded; planning on never takes it below the factor. It fails if
// the planner leaves an over-replicated range alone.
func TestPlanRemovesExcessVoter(t *testing.T) {
	nodes := []Node{{ID: 1}, {ID: 2}, {ID: 3}, {ID: 4}, {ID: 5}, {ID: 6}}
	rng := func(leader uint64, replicas ...uint64) Range {
		return Range{ID: RangeID{"s", 0}, Replicas: replicas, Leader: leader, ReplicationFactor: 3}
	}
	// Extra ranges that make node 5 the most loaded live node.
	filler := []Range{
		{ID: RangeID{"f", 0}, Replicas: []uint64{1, 5, 6}, Leader: 1, ReplicationFactor: 3},
		{ID: RangeID{"f", 1}, Replicas: []uint64{3, 5, 6}, Leader: 3, ReplicationFactor: 3},
	}
	cases := []struct {
		name  string
		state map[uint64]NodeState
		r     Range
		want  uint64
	}{
		{"draining goes first", map[uint64]NodeState{6: Draining}, rng(2, 2, 3, 4, 5, 6), 6},
		{"dead before draining", map[uint64]NodeState{6: Draining, 3: Dead}, rng(2, 2, 3, 4, 5, 6), 3},
		{"decommissioned before draining", map[uint64]NodeState{6: Draining, 4: Decommissioned}, rng(2, 2, 4, 5, 6), 4},
		{"the most loaded live node", nil, rng(2, 2, 3, 4, 5), 5},
		{"not the leader while another will do", nil, rng(5, 2, 3, 4, 5), 3},
		{"the leader if it is the draining one", map[uint64]NodeState{6: Draining}, rng(6, 2, 3, 4, 6), 6},
	}
	for _, c := range cases {
		reg := Region{Nodes: slices.Clone(nodes), Ranges: append([]Range{c.r}, filler...)}
		for i := range reg.Nodes {
			reg.Nodes[i].State = c.state[reg.Nodes[i].ID]
		}
		ms := Plan(reg, Config{MovesMax: 4})
		if len(ms) == 0 || ms[0] != (Move{Range: c.r.ID, From: c.want, Reason: Excess}) {
			t.Fatalf("%s: %v, want the removal of node %d", c.name, ms, c.want)
		}
		for _, m := range ms[1:] {
			if m.Range == c.r.ID {
				t.Fatalf("%s: a second move of the range in one plan: %v", c.name, ms)
			}
		}
	}
	// Five voters, factor three: two plans remove two, then nothing more.
	reg := Region{Nodes: slices.Clone(nodes), Ranges: []Range{rng(1, 1, 2, 3, 4, 5)}}
	for i := 0; i < 4; i++ {
		apply(&reg, Plan(reg, Config{MovesMax: 4}), nil)
	}
	if got := reg.Ranges[0].Replicas; len(got) != 3 {
		t.Fatalf("five voters of factor three planned down to %v", got)
	}
}
