package chaos

import (
	"fmt"
	"slices"
	"time"
)

// Shape is the cluster a scenario needs.
type Shape struct {
	// Regions of the cluster and of the scenario's stream, default
	// [us eu ap].
	Regions []string `json:"regions,omitempty"`
	// NodesPerRegion, default 3.
	NodesPerRegion int `json:"nodes_per_region,omitempty"`
	// WANLatency and WANJitter of every link between regions, default 20ms
	// and 2ms (lower than scripts/cluster.sh's 40–75 ms: the faults are the
	// point, not the distance).
	WANLatency Duration `json:"wan_latency,omitempty"`
	WANJitter  Duration `json:"wan_jitter,omitempty"`
	// ClientLinks puts the SDK clients behind links with ClientLatency
	// (default 10ms), so the reply-dropping fault has replies to drop.
	ClientLinks   bool     `json:"client_links,omitempty"`
	ClientLatency Duration `json:"client_latency,omitempty"`
	// LeaseStore turns homing on: PostgreSQL (scripts/pg.sh) behind links
	// "<region>->pg", and every node runs with --lease-store (its region's
	// link), --lease-ttl LeaseTTL (default 3s), --lease-heartbeat (a third
	// of it) and --max-clock-offset MaxClockOffset (default 250ms).
	// "{lease-store}" in NodeFlags becomes the node's URL too. An attached
	// cluster must run with homing (its own TTL is used).
	LeaseStore     bool     `json:"lease_store,omitempty"`
	LeaseTTL       Duration `json:"lease_ttl,omitempty"`
	MaxClockOffset Duration `json:"max_clock_offset,omitempty"`
	// SpareNodes are nodes per region planned (ids after NodesPerRegion,
	// certificates issued) but not started: a join fault starts one with
	// --join (LocalCluster only).
	SpareNodes int `json:"spare_nodes,omitempty"`
	// NodeFlags are added to every geologd command line.
	NodeFlags []string `json:"node_flags,omitempty"`
}

// defaults returns s with its defaults set.
func (s *Shape) defaults() Shape {
	c := *s
	c.setDefaults()
	return c
}

func (s *Shape) setDefaults() {
	if len(s.Regions) == 0 {
		s.Regions = []string{"us", "eu", "ap"}
	}
	if s.NodesPerRegion <= 0 {
		s.NodesPerRegion = 3
	}
	if s.WANLatency == 0 {
		s.WANLatency = D(20 * time.Millisecond)
	}
	if s.WANJitter == 0 {
		s.WANJitter = D(2 * time.Millisecond)
	}
	if s.ClientLinks && s.ClientLatency == 0 {
		s.ClientLatency = D(10 * time.Millisecond)
	}
	if s.LeaseStore && s.LeaseTTL == 0 {
		s.LeaseTTL = D(3 * time.Second)
	}
	if s.LeaseStore && s.MaxClockOffset == 0 {
		s.MaxClockOffset = D(250 * time.Millisecond)
	}
}

// Workload is what the clients do during a scenario.
type Workload struct {
	// Ranges of the stream, default 4; KeysPerRange keys are written to
	// each, default 3.
	Ranges       uint32 `json:"ranges,omitempty"`
	KeysPerRange int    `json:"keys_per_range,omitempty"`
	// Producers, default 2, each an idempotent client.Producer whose
	// client knows one region's nodes (round robin over ProducerRegions,
	// default the regions: a producer whose region dies waits out its
	// delivery timeout, so region faults produce from the others);
	// each writes every key in turn at RatePerProducer records/s (default
	// 100) with values of ValueBytes (default 64).
	Producers       int      `json:"producers,omitempty"`
	ProducerRegions []string `json:"producer_regions,omitempty"`
	RatePerProducer float64  `json:"rate_per_producer,omitempty"`
	ValueBytes      int      `json:"value_bytes,omitempty"`
	// InflightBatchesMax per range, default 5 (pipelining on).
	InflightBatchesMax int `json:"inflight_batches_max,omitempty"`
	// DeliveryTimeout of a record, default 30s: a record not acked by
	// then is an ambiguous (info) operation.
	DeliveryTimeout Duration `json:"delivery_timeout,omitempty"`
	// Home is where ranges are homed: a region or "spread", default the
	// first region.
	Home string `json:"home,omitempty"`
	// TailReadInterval is how often each range is read at the home with
	// consistency "home" for the linearizability checker, default 200ms.
	TailReadInterval Duration `json:"tail_read_interval,omitempty"`
	// Group runs a consumer group on the stream (group.go), none by
	// default.
	Group GroupWorkload `json:"group,omitzero"`
}

func (w *Workload) setDefaults(shape Shape) {
	if w.Ranges == 0 {
		w.Ranges = 4
	}
	if w.KeysPerRange <= 0 {
		w.KeysPerRange = 3
	}
	if w.Producers <= 0 {
		w.Producers = 2
	}
	if len(w.ProducerRegions) == 0 {
		w.ProducerRegions = shape.Regions
	}
	if w.RatePerProducer <= 0 {
		w.RatePerProducer = 100
	}
	if w.ValueBytes <= 0 {
		w.ValueBytes = 64
	}
	if w.InflightBatchesMax <= 0 {
		w.InflightBatchesMax = 5
	}
	if w.DeliveryTimeout <= 0 {
		w.DeliveryTimeout = D(30 * time.Second)
	}
	if w.Home == "" {
		w.Home = shape.Regions[0]
	}
	if w.TailReadInterval <= 0 {
		w.TailReadInterval = D(200 * time.Millisecond)
	}
	w.Group.setDefaults(shape)
}

// homeOf is range r's home region as created.
func (w *Workload) homeOf(r uint32, regions []string) string {
	if w.Home == "spread" {
		return regions[int(r)%len(regions)]
	}
	return w.Home
}

// Scenario is one chaos run: a cluster shape, a workload, a fault schedule
// and a duration. It is data (JSON) so that runs can be listed, stored and
// replayed: geolog-chaos --print writes the built-in list.
type Scenario struct {
	Name        string   `json:"name"`
	Description string   `json:"description"`
	Shape       Shape    `json:"shape"`
	Workload    Workload `json:"workload"`
	Faults      []Fault  `json:"faults"`
	// Duration is how long the workload runs; faults start only inside
	// it and are reverted at its end at the latest.
	Duration Duration `json:"duration"`
	// Pending, when set, says why the scenario cannot run yet: it is
	// listed, and skipped.
	Pending string `json:"pending,omitempty"`
}

// Validate checks the scenario's faults and names.
func (s Scenario) Validate() error {
	if s.Name == "" || s.Duration <= 0 {
		return fmt.Errorf("chaos: a scenario needs a name and a positive duration")
	}
	for i, f := range s.Faults {
		if err := f.Validate(); err != nil {
			return fmt.Errorf("chaos: scenario %s fault %d: %w", s.Name, i, err)
		}
	}
	return nil
}

// Scenarios is the full list that make chaos runs: minutes on the local
// 3×3 cluster (or the terraform/local one).
func Scenarios() []Scenario {
	full := Shape{}
	homing := Shape{LeaseStore: true}
	return []Scenario{
		leaderKillLoop(full, 60*time.Second),
		zombieLeader(full, 45*time.Second),
		leaderIsolated(full, 45*time.Second),
		regionLinkCut(full, 50*time.Second),
		ambiguousAckKill(full, 45*time.Second),
		degradedNodes(full, 50*time.Second),
		homeLeaseStoreCut(homing, 35*time.Second),
		regionKillAndReturn(homing, 15*time.Second, 40*time.Second),
		homeRegionPartitioned(homing, 40*time.Second),
		plannedRehome(homing, 38*time.Second),
		memberKillLoop(full, 40*time.Second),
		memberPartitioned(full, 40*time.Second),
		coordinatorFailover(full, 40*time.Second),
		splitUnderLoad(full, 30*time.Second),
		joinAndDrain(Shape{Regions: []string{"us"}}, 40*time.Second),
		killThenReplace(Shape{Regions: []string{"us"}}, 45*time.Second),
	}
}

// Slice is the short fixed-seed slice that make test runs: six scenarios
// on small clusters, one of them with homing (a one-node home region killed
// and returned), one with a consumer group under member and coordinator
// faults, one splitting ranges under load, about three and a half minutes
// on two cores.
func Slice() []Scenario {
	region := Shape{Regions: []string{"us"}}
	two := Shape{Regions: []string{"us", "eu"}, NodesPerRegion: 1}
	twoHoming := two
	twoHoming.LeaseStore = true
	return []Scenario{
		leaderKillLoop(region, 20*time.Second),
		zombieLeader(region, 17*time.Second),
		regionLinkCut(two, 20*time.Second),
		splitUnderLoad(region, 21*time.Second),
		consumerFaults(region, 25*time.Second),
		regionKillAndReturn(twoHoming, 8*time.Second, 22*time.Second),
	}
}

func leaderKillLoop(shape Shape, d time.Duration) Scenario {
	return Scenario{
		Name:        "leader-kill-loop",
		Description: "SIGKILL the home leader of a range (a different range each time) every 6s, restart it 1.5s later",
		Shape:       shape,
		Workload:    Workload{Home: "spread"},
		Faults: []Fault{{Kind: KindKill, Target: Target{Node: "home:leader", RotateRanges: true},
			Start: D(4 * time.Second), Duration: D(1500 * time.Millisecond), Every: D(6 * time.Second)}},
		Duration: D(d),
	}
}

func zombieLeader(shape Shape, d time.Duration) Scenario {
	return Scenario{
		Name:        "zombie-leader",
		Description: "SIGSTOP range 0's home leader for 4s (past the election timeout), then SIGCONT: the old leader must not ack under its stale term",
		Shape:       shape,
		Workload:    Workload{Home: "spread"},
		Faults: []Fault{{Kind: KindPause, Target: Target{Node: "home:leader"},
			Start: D(4 * time.Second), Duration: D(4 * time.Second), Every: D(9 * time.Second)}},
		Duration: D(d),
	}
}

func leaderIsolated(shape Shape, d time.Duration) Scenario {
	return Scenario{
		Name:        "leader-isolated",
		Description: "cut range 0's home leader off from its followers (Raft links, blackhole) for 5s while clients still reach it",
		Shape:       shape,
		Workload:    Workload{Home: "spread"},
		Faults: []Fault{{Kind: KindPartition, Target: Target{A: "home:leader", B: "home:followers"},
			Start: D(4 * time.Second), Duration: D(5 * time.Second), Every: D(12 * time.Second)}},
		Duration: D(d),
	}
}

func regionLinkCut(shape Shape, d time.Duration) Scenario {
	return Scenario{
		Name:        "region-link-cut",
		Description: "partition the WAN between the first two regions for 6s and heal: mirrors fall behind and catch up, redirected appends stall and resume",
		Shape:       shape,
		Workload:    Workload{Home: "spread"},
		Faults: []Fault{{Kind: KindPartition, Target: Target{A: "home", B: "mirror"},
			Start: D(4 * time.Second), Duration: D(6 * time.Second), Every: D(12 * time.Second)}},
		Duration: D(d),
	}
}

func ambiguousAckKill(shape Shape, d time.Duration) Scenario {
	shape.ClientLinks = true
	return Scenario{
		Name: "ambiguous-ack-kill",
		Description: "reset the clients' links to the home leader (dropping acks in flight) and SIGKILL it, with a 400ms delivery timeout: " +
			"retries must dedup, timed-out records may land at most once",
		Shape:    shape,
		Workload: Workload{Home: "us", DeliveryTimeout: D(400 * time.Millisecond)},
		Faults: []Fault{{Kind: KindKill, Target: Target{Node: "home:leader", RotateRanges: true}, Params: Params{DropReplies: true},
			Start: D(4 * time.Second), Duration: D(2 * time.Second), Every: D(7 * time.Second)}},
		Duration: D(d),
	}
}

func degradedNodes(shape Shape, d time.Duration) Scenario {
	return Scenario{
		Name: "degraded",
		Description: "a slow disk (200ms fsync) on a home follower, clock skew on the leader, a WAN latency spike, " +
			"replication from the home stopped, then a failing disk on a follower",
		Shape:    shape,
		Workload: Workload{Home: "us"},
		Faults: []Fault{
			{Kind: KindDisk, Target: Target{Node: "home:follower"}, Params: Params{FsyncDelay: D(200 * time.Millisecond)},
				Start: D(3 * time.Second), Duration: D(8 * time.Second)},
			{Kind: KindClockSkew, Target: Target{Node: "home:leader"}, Params: Params{ClockSkew: D(-3 * time.Second)},
				Start: D(5 * time.Second), Duration: D(15 * time.Second)},
			{Kind: KindLatency, Target: Target{A: "home", B: "mirror"}, Params: Params{Latency: D(250 * time.Millisecond), Jitter: D(50 * time.Millisecond)},
				Start: D(12 * time.Second), Duration: D(8 * time.Second)},
			{Kind: KindReplicatorStop, Target: Target{A: "home"},
				Start: D(22 * time.Second), Duration: D(8 * time.Second)},
			{Kind: KindDisk, Target: Target{Node: "home:follower"}, Params: Params{FsyncFail: true},
				Start: D(33 * time.Second), Duration: D(5 * time.Second)},
		},
		Duration: D(d),
	}
}

// The homing scenarios run with a lease store (Shape.LeaseStore: lease TTL
// 3s, max clock offset 250ms on the local cluster), every range homed in
// us at first.

func homeLeaseStoreCut(shape Shape, d time.Duration) Scenario {
	return Scenario{
		Name: "home-lease-store-cut",
		Description: "cut the home region off from the lease store for 3×TTL under load: it must stop acking before its lease may expire " +
			"(no ack under its epoch from cut+TTL until the heal); another region takes over; after the heal the old home mirrors it, " +
			"its unreplicated tail (if any) in the orphan log",
		Shape:    shape,
		Workload: Workload{Home: "us", Producers: 3},
		Faults: []Fault{{Kind: KindLeaseStoreOutage, Target: Target{A: "home"}, Params: Params{StoreMode: "cut"},
			Start: D(8 * time.Second), Duration: D(9 * time.Second)}},
		Duration: D(d),
	}
}

func regionKillAndReturn(shape Shape, down, d time.Duration) Scenario {
	regions := shape.Regions
	if len(regions) == 0 {
		regions = (&Shape{}).defaults().Regions
	}
	return Scenario{
		Name: "region-kill-and-return",
		Description: "SIGKILL every node of the home region under load (producers in the other regions), wait for a takeover at epoch+1, " +
			"restart the region: it returns as a mirror and forks its divergent tail (what it acked in the 1.5 s its replication was " +
			"stopped before the kill) into the orphan log; every acked record is in the " +
			"final log at its offset or in an orphan log (the orphaned column); failover = kill → first ack under the new epoch",
		Shape:    shape,
		Workload: Workload{Home: regions[0], ProducerRegions: regions[1:]},
		Faults: []Fault{
			// The home stops shipping 1.5 s before it dies: what it acks
			// meanwhile is the divergent tail its return forks off.
			{Kind: KindReplicatorStop, Target: Target{A: "home"}, Start: D(6500 * time.Millisecond), Duration: D(3 * time.Second)},
			{Kind: KindKill, Target: Target{Node: "home:all"}, Start: D(8 * time.Second), Duration: D(down)},
		},
		Duration: D(d),
	}
}

func homeRegionPartitioned(shape Shape, d time.Duration) Scenario {
	return Scenario{
		Name: "home-region-partitioned",
		Description: "partition the home region from the other regions and from the lease store for 3×TTL while its own producers and " +
			"home readers still reach it (split brain): it must stop acking, and answering home reads, before its lease may expire; " +
			"another region takes over; after the heal the old home forks off what it acked and never shipped",
		Shape:    shape,
		Workload: Workload{Home: "us", Producers: 3},
		Faults: []Fault{
			{Kind: KindPartition, Target: Target{A: "home", B: "eu"}, Start: D(8 * time.Second), Duration: D(9 * time.Second)},
			{Kind: KindPartition, Target: Target{A: "home", B: "ap"}, Start: D(8 * time.Second), Duration: D(9 * time.Second)},
			{Kind: KindLeaseStoreOutage, Target: Target{A: "home"}, Params: Params{StoreMode: "cut"},
				Start: D(8 * time.Second), Duration: D(9 * time.Second)},
		},
		Duration: D(d),
	}
}

func plannedRehome(shape Shape, d time.Duration) Scenario {
	return Scenario{
		Name: "planned-rehome",
		Description: "move every range's home to the next region (us → eu → ap → us ...) every 7s under load with Admin.Rehome: " +
			"zero loss, zero duplicates, nothing orphaned; the column shows the pause the moves reported",
		Shape:    shape,
		Workload: Workload{Home: "us", Producers: 3},
		Faults: []Fault{{Kind: KindRehome, Target: Target{A: "next"}, Params: Params{AllRanges: true},
			Start: D(5 * time.Second), Every: D(7 * time.Second)}},
		Duration: D(d),
	}
}

// The consumer scenarios run a consumer group of three members
// (Workload.Group) on the stream beside the usual workload; their columns
// are records never processed, cursor regressions and commits accepted
// from old generations (each must be 0), and the rebalance time of member
// faults (fault → every range the victim owned assigned again).

// consumerShape keeps the cursor stream whole for the checker: no
// compaction by key of _cursors during the scenario (its default least
// lag is a minute; an attached cluster's own setting holds there, and a
// compacted log leaves the check unverified).
func consumerShape(shape Shape) Shape {
	shape.NodeFlags = append(slices.Clone(shape.NodeFlags), "--cursor-compaction-lag", "1h")
	return shape
}

func memberKillLoop(shape Shape, d time.Duration) Scenario {
	shape = consumerShape(shape)
	return Scenario{
		Name: "member-kill-loop",
		Description: "crash a consumer-group member (no commit, no leave) every 6s, a new one starting 1s later: its ranges move " +
			"after its 3s session; every record processed at least once, no cursor regression, no commit from an old generation",
		Shape:    shape,
		Workload: Workload{Home: "spread", Ranges: 6, Group: GroupWorkload{Members: 3}},
		Faults: []Fault{{Kind: KindMemberKill, Start: D(6 * time.Second), Duration: D(time.Second),
			Every: D(6 * time.Second)}},
		Duration: D(d),
	}
}

func memberPartitioned(shape Shape, d time.Duration) Scenario {
	shape = consumerShape(shape)
	return Scenario{
		Name: "member-partitioned",
		Description: "cut a consumer-group member off from every node for 8s (past its 3s session): it fences itself, its ranges " +
			"move, its late commits are refused, and it joins again as a new incarnation after the heal",
		Shape:    shape,
		Workload: Workload{Home: "spread", Ranges: 6, Group: GroupWorkload{Members: 3}},
		Faults: []Fault{{Kind: KindMemberPartition, Start: D(6 * time.Second), Duration: D(8 * time.Second),
			Every: D(14 * time.Second)}},
		Duration: D(d),
	}
}

func coordinatorFailover(shape Shape, d time.Duration) Scenario {
	shape = consumerShape(shape)
	return Scenario{
		Name: "coordinator-failover",
		Description: "SIGKILL the group's coordinator (the leader of its cursor range, in that range's home region) every 8s, " +
			"restart it 2s later, while members commit and a member crashes: the new leader continues from the log, no position " +
			"goes back, no old generation commits",
		Shape:    shape,
		Workload: Workload{Home: "spread", Ranges: 6, Group: GroupWorkload{Members: 3}},
		Faults: []Fault{
			{Kind: KindKill, Target: Target{Node: "cursors:leader"}, Start: D(4 * time.Second), Duration: D(2 * time.Second),
				Every: D(8 * time.Second)},
			{Kind: KindMemberKill, Start: D(9 * time.Second), Duration: D(time.Second), Every: D(16 * time.Second)},
		},
		Duration: D(d),
	}
}

// consumerFaults is the slice's consumer scenario: the three consumer
// faults one after the other on one region, with 2s sessions.
func consumerFaults(shape Shape, d time.Duration) Scenario {
	shape = consumerShape(shape)
	return Scenario{
		Name:        "consumer-faults",
		Description: "a group member crashed, another partitioned past its session, then the coordinator killed",
		Shape:       shape,
		Workload:    Workload{Ranges: 4, Group: GroupWorkload{Members: 3, SessionTimeout: D(2 * time.Second)}},
		Faults: []Fault{
			// The group settles first (the first member takes every range,
			// then releases to the others).
			{Kind: KindMemberKill, Start: D(6 * time.Second), Duration: D(time.Second)},
			{Kind: KindMemberPartition, Start: D(11 * time.Second), Duration: D(5 * time.Second)},
			{Kind: KindKill, Target: Target{Node: "cursors:leader"}, Start: D(18 * time.Second), Duration: D(2 * time.Second)},
		},
		Duration: D(d),
	}
}

// splitUnderLoad splits ranges while producers append keyed records,
// consumers in every region subscribe and a consumer group consumes: range
// 0, then range 1, then range 2 (range 0's left child: a child splits
// again). Every range is homed in the first region (without a lease store
// a stream homed in several regions does not split). The checkers read
// the stream's range map at the end: per-key order across parent and
// children, no loss or duplicate in any range, nothing in a parent at or
// past its split offset, every key in a range that owns its hash.
func splitUnderLoad(shape Shape, d time.Duration) Scenario {
	shape = consumerShape(shape)
	regions := shape.Regions
	if len(regions) == 0 {
		regions = (&Shape{}).defaults().Regions
	}
	return Scenario{
		Name: "split-under-load",
		Description: "split range 0, then range 1, then range 0's left child (2) under keyed producers, consumers and a consumer group: " +
			"per-key order across parent and children, no loss, no duplicate, nothing past a split offset",
		Shape:    shape,
		Workload: Workload{Home: regions[0], Ranges: 2, KeysPerRange: 6, Group: GroupWorkload{Members: 2}},
		Faults: []Fault{
			{Kind: KindSplit, Target: Target{Range: 0}, Start: D(d / 6)},
			{Kind: KindSplit, Target: Target{Range: 1}, Start: D(d * 2 / 6)},
			{Kind: KindSplit, Target: Target{Range: 2}, Start: D(d * 3 / 6)},
		},
		Duration: D(d),
	}
}

// rebalanceFlags make the region's rebalancer act within seconds (its
// defaults are tens of seconds), as TestRegionGrowsThreeToSixProc runs it.
var rebalanceFlags = []string{"--rebalance-interval", "1s", "--rebalance-moves-max", "3", "--leader-balance-interval", "1s"}

// joinAndDrain grows a region by a node that joins with --join (the
// rebalancer moves replicas onto it), then drains and decommissions
// another node while producers, consumers and the tail readers run. The
// checkers as always, and every range must end with its replication
// factor of voters in every region (a move that never finished, or two
// concurrent moves of one range, leave a fourth).
func joinAndDrain(shape Shape, d time.Duration) Scenario {
	shape.SpareNodes = max(shape.SpareNodes, 1)
	shape.NodeFlags = append(slices.Clone(shape.NodeFlags), rebalanceFlags...)
	regions := shape.Regions
	if len(regions) == 0 {
		regions = (&Shape{}).defaults().Regions
	}
	return Scenario{
		Name: "join-and-drain",
		Description: "a fourth node joins the home region under load (--join), replicas move onto it; then node 2 is drained and " +
			"decommissioned while producers run: no loss, no duplicate, per-key order, every range ends with 3 voters",
		Shape:    shape,
		Workload: Workload{Home: regions[0], Ranges: 6, KeysPerRange: 2},
		Faults: []Fault{
			{Kind: KindJoin, Target: Target{A: regions[0]}, Start: D(4 * time.Second)},
			{Kind: KindDrain, Target: Target{Node: regions[0] + ":n2"}, Params: Params{Decommission: true},
				Start: D(d * 2 / 5), Duration: D(2 * time.Minute)},
		},
		Duration: D(d),
	}
}

// killThenReplace: a fourth node joins, then node 3 is killed for longer
// than the dead-node time (geologd --dead-node-after, 5s here): the
// rebalancer rebuilds its replicas on the others from the live voters:
// just before it restarts no range may name it (Params.Replaced). It
// returns at the end; every range must end with 3 voters, nothing lost.
func killThenReplace(shape Shape, d time.Duration) Scenario {
	shape.SpareNodes = max(shape.SpareNodes, 1)
	shape.NodeFlags = append(slices.Clone(shape.NodeFlags), append(slices.Clone(rebalanceFlags), "--dead-node-after", "5s")...)
	regions := shape.Regions
	if len(regions) == 0 {
		regions = (&Shape{}).defaults().Regions
	}
	return Scenario{
		Name: "kill-then-replace",
		Description: "a fourth node joins; node 3 is SIGKILLed for 25s, past the 5s dead-node time: its replicas are rebuilt on the " +
			"others under load; it returns at the end; no loss, every range ends with 3 voters",
		Shape:    shape,
		Workload: Workload{Home: regions[0], Ranges: 6, KeysPerRange: 2},
		Faults: []Fault{
			{Kind: KindJoin, Target: Target{A: regions[0]}, Start: D(3 * time.Second)},
			{Kind: KindKill, Target: Target{Node: regions[0] + ":n3"}, Params: Params{Replaced: true},
				Start: D(12 * time.Second), Duration: D(d - 15*time.Second)},
		},
		Duration: D(d),
	}
}
