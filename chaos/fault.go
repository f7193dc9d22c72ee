package chaos

import (
	"fmt"
	"strings"
	"time"
)

// Kind is what a Fault does.
type Kind string

// The fault kinds. Each names the Target fields and Params it reads.
const (
	// KindKill SIGKILLs Target.Node and restarts it (same flags, same data)
	// Duration later. Params.DropReplies first resets the clients' links to
	// the node, so replies already on their way are lost as well.
	KindKill Kind = "kill"
	// KindPause SIGSTOPs Target.Node and SIGCONTs it Duration later: a
	// node that stalls past the election timeout and then carries on (a
	// zombie leader when it led).
	KindPause Kind = "pause"
	// KindPartition cuts every link between Target.A and Target.B (one
	// way with Target.OneWay) for Duration, then heals them. Params.CutMode
	// is "blackhole" (default: a partition, TCP connections stall) or
	// "reset" (connections are reset and refused).
	KindPartition Kind = "partition"
	// KindLatency sets the one-way latency (and jitter) of the links
	// between Target.A and Target.B to Params.Latency (Params.Jitter) for
	// Duration, then restores what they had.
	KindLatency Kind = "latency"
	// KindDisk slows (Params.FsyncDelay) or fails (Params.FsyncFail) every
	// fdatasync of Target.Node's range stores for Duration, through the
	// node's failpoints. A failed fdatasync is final for a store (the
	// fsyncgate rule), so after a failing disk the node is restarted.
	KindDisk Kind = "disk"
	// KindClockSkew adds Params.ClockSkew to Target.Node's clock for
	// Duration, through the node's failpoints.
	KindClockSkew Kind = "clock-skew"
	// KindReplicatorStop stops the replication from Target.A (a home
	// region) to Target.B (a mirror region, or every other region when
	// empty) for Duration: the links from A to B are cut in reset mode, so
	// the home leader's replicator tasks fail, retry and fail again until
	// the links heal. Only the direction the replicator dials is cut:
	// appends redirected from B to A still pass.
	KindReplicatorStop Kind = "replicator-stop"
	// KindLeaseStoreOutage takes the lease store away for Duration:
	// Params.StoreMode "cut" (default) cuts the links between Target.A (a
	// region; every region when empty) and the store; "stop" stops the
	// store's server (scripts/pg.sh stop) and starts it again.
	KindLeaseStoreOutage Kind = "lease-store-outage"
	// KindRehome is a planned move of range Target.Range (every range
	// with Params.AllRanges) to the region Target.A (e.g. "next", "eu")
	// through the Admin Rehome RPC: zero loss, a short pause, which the
	// event records. It lasts as long as the RPC; Duration is ignored.
	// Needs homing.
	KindRehome Kind = "rehome"
	// KindMemberKill crashes a member of the scenario's consumer group
	// (Workload.Group; round robin over the live members): no commit, no
	// leave, so the coordinator gives its ranges away after its session.
	// A new member (a new id) starts Duration later. No target.
	KindMemberKill Kind = "member-kill"
	// KindMemberPartition cuts a group member off from every node for
	// Duration (its connections reset, new ones refused): it fences itself
	// after a session without answers, its ranges move, and it joins again
	// once healed. No target.
	KindMemberPartition Kind = "member-partition"
	// KindSplit splits range Target.Range at its midpoint through the
	// Admin SplitRange RPC, asked of the nodes of the range's home region
	// in turn (following leader hints), as `geolog ranges split` does. It
	// lasts as long as the RPC; Duration is ignored. The workload follows
	// (producers refresh their range map, readers read the parent to its
	// split offset, then the children) and the final reads cover every
	// range of the stream's map at the end (docs/split.md).
	KindSplit Kind = "split"
	// KindJoin starts a spare node (Shape.SpareNodes) in region Target.A
	// with --join: it joins the running region and the rebalancer moves
	// replicas onto it. It lasts until the node answers; Duration is
	// ignored. Needs a cluster that can start nodes (LocalCluster).
	KindJoin Kind = "join"
	// KindDrain drains Target.Node (Admin SetNodeState DRAINING): it takes
	// no new replica and the rebalancer moves its replicas away. With
	// Params.Decommission it then waits (up to Duration, default 2m)
	// until the node holds no replica, decommissions it and stops its
	// process. Permanent: nothing is reverted.
	KindDrain Kind = "drain"
)

// kinds lists every Kind, for validation.
var kinds = []Kind{KindKill, KindPause, KindPartition, KindLatency, KindDisk, KindClockSkew, KindReplicatorStop, KindLeaseStoreOutage, KindRehome,
	KindMemberKill, KindMemberPartition, KindSplit, KindJoin, KindDrain}

// Target says what a fault hits. Selectors are resolved when the fault
// starts (a leader is whoever leads then):
//
//	region part   a region name, "home" (Range's home region now: with
//	              homing, as the cluster reports it), "cursors" (the home
//	              region of the consumer group's range of the cursor
//	              stream; "cursors:leader" is the group's coordinator,
//	              whatever Range says), "mirror" (the first
//	              of the stream's other regions), "next" (the region after
//	              the home in the stream's order), "client" (the SDK
//	              clients' side of client links), "pg" (the lease store)
//	node part     after a colon: "n2" (Raft id 2), "leader" (Range's
//	              leader in that region), "followers", "follower" (one,
//	              seeded), "any" (one, seeded), "all"
//
// e.g. "home:leader", "us:n2", "eu", "home:followers". A link side that is
// a region picks the WAN links between regions; two node sides of one
// region pick the intra-region (Raft) links between those nodes; "client"
// and a node pick the client links to that node. A node side against a
// region side picks only the WAN links into that node (a region's links out
// are shared by all its nodes).
type Target struct {
	// Node selects the node(s) of kill, pause, disk and clock-skew.
	Node string `json:"node,omitempty"`
	// A and B are the two sides of partition, latency, replicator-stop and
	// lease-store-outage; A is the destination of rehome.
	A string `json:"a,omitempty"`
	B string `json:"b,omitempty"`
	// OneWay restricts a link fault to the links from A to B.
	OneWay bool `json:"one_way,omitempty"`
	// Range is the range that "home", "mirror" and "leader" refer to.
	Range uint32 `json:"range,omitempty"`
	// RotateRanges makes the k-th repetition of the fault (see
	// Fault.Every) use range (Range + k) mod the stream's range count.
	RotateRanges bool `json:"rotate_ranges,omitempty"`
}

// Params are the kind-specific settings of a fault; each kind reads only
// its own (see the Kind constants).
type Params struct {
	CutMode     string   `json:"cut_mode,omitempty"`
	Latency     Duration `json:"latency,omitempty"`
	Jitter      Duration `json:"jitter,omitempty"`
	FsyncDelay  Duration `json:"fsync_delay,omitempty"`
	FsyncFail   bool     `json:"fsync_fail,omitempty"`
	ClockSkew   Duration `json:"clock_skew,omitempty"`
	DropReplies bool     `json:"drop_replies,omitempty"`
	StoreMode   string   `json:"store_mode,omitempty"`
	AllRanges   bool     `json:"all_ranges,omitempty"`
	// Decommission: a drain goes on to decommission the node.
	Decommission bool `json:"decommission,omitempty"`
	// Replaced: a kill longer than the nodes' dead-node time; just before
	// the node restarts, no range of the stream may still name it as a
	// replica (the rebalancer rebuilt them elsewhere), or the event
	// records the ranges that do (FaultEvent.NotReplaced).
	Replaced bool `json:"replaced,omitempty"`
}

// Fault is one fault of a scenario's schedule: it starts Start after the
// workload does, lasts Duration, and with Every repeats every Every (from
// one start to the next) while the scenario's fault window is open. A
// fault still active when the window closes is reverted then.
type Fault struct {
	Kind     Kind     `json:"kind"`
	Target   Target   `json:"target"`
	Params   Params   `json:"params,omitzero"`
	Start    Duration `json:"start"`
	Duration Duration `json:"duration"`
	Every    Duration `json:"every,omitempty"`
}

// String is a one-line summary: "kill home:leader r0 at 5s for 2s every 8s".
func (f Fault) String() string {
	var b strings.Builder
	b.WriteString(string(f.Kind))
	switch {
	case f.Target.Node != "":
		b.WriteString(" " + f.Target.Node)
	case f.Target.A != "" || f.Target.B != "":
		sep := "<->"
		if f.Target.OneWay {
			sep = "->"
		}
		b.WriteString(" " + f.Target.A + sep + f.Target.B)
	}
	if f.Target.RotateRanges {
		b.WriteString(" r*")
	} else if f.Target.Range != 0 {
		fmt.Fprintf(&b, " r%d", f.Target.Range)
	}
	fmt.Fprintf(&b, " at %v for %v", time.Duration(f.Start), time.Duration(f.Duration))
	if f.Every > 0 {
		fmt.Fprintf(&b, " every %v", time.Duration(f.Every))
	}
	return b.String()
}

// Validate checks that the fault names a known kind, the target fields and
// params the kind reads, and sane times.
func (f Fault) Validate() error {
	known := false
	for _, k := range kinds {
		known = known || k == f.Kind
	}
	if !known {
		return fmt.Errorf("chaos: unknown fault kind %q", f.Kind)
	}
	if f.Start < 0 || f.Duration < 0 || f.Every < 0 {
		return fmt.Errorf("chaos: %s: negative start, duration or period", f.Kind)
	}
	if f.Every > 0 && f.Every <= f.Duration {
		return fmt.Errorf("chaos: %s: every %v must exceed the duration %v", f.Kind, time.Duration(f.Every), time.Duration(f.Duration))
	}
	needNode := func() error {
		if f.Target.Node == "" {
			return fmt.Errorf("chaos: %s needs target.node", f.Kind)
		}
		return checkSelector(f.Target.Node)
	}
	needSides := func(bOptional bool) error {
		if f.Target.A == "" || (f.Target.B == "" && !bOptional) {
			return fmt.Errorf("chaos: %s needs target.a and target.b", f.Kind)
		}
		if err := checkSelector(f.Target.A); err != nil {
			return err
		}
		if f.Target.B == "" {
			return nil
		}
		return checkSelector(f.Target.B)
	}
	switch f.Kind {
	case KindKill, KindPause:
		return needNode()
	case KindDisk:
		if f.Params.FsyncDelay <= 0 && !f.Params.FsyncFail {
			return fmt.Errorf("chaos: disk needs params.fsync_delay or params.fsync_fail")
		}
		return needNode()
	case KindClockSkew:
		if f.Params.ClockSkew == 0 {
			return fmt.Errorf("chaos: clock-skew needs params.clock_skew")
		}
		return needNode()
	case KindPartition:
		if _, err := parseCutMode(f.Params.CutMode); err != nil {
			return err
		}
		return needSides(false)
	case KindLatency:
		if f.Params.Latency <= 0 {
			return fmt.Errorf("chaos: latency needs params.latency")
		}
		return needSides(false)
	case KindReplicatorStop:
		return needSides(true)
	case KindLeaseStoreOutage:
		switch f.Params.StoreMode {
		case "", "cut", "stop":
		default:
			return fmt.Errorf("chaos: lease-store-outage: store_mode %q (want cut or stop)", f.Params.StoreMode)
		}
		if f.Target.A != "" {
			return checkSelector(f.Target.A)
		}
		return nil
	case KindJoin:
		if f.Target.A == "" || strings.Contains(f.Target.A, ":") {
			return fmt.Errorf("chaos: join needs target.a, a region")
		}
		return nil
	case KindDrain:
		return needNode()
	case KindRehome:
		if f.Target.A == "" || strings.Contains(f.Target.A, ":") {
			return fmt.Errorf("chaos: rehome needs target.a, a region")
		}
		return nil
	}
	return nil
}

func parseCutMode(s string) (string, error) {
	switch s {
	case "", "blackhole":
		return "blackhole", nil
	case "reset":
		return "reset", nil
	}
	return "", fmt.Errorf("chaos: cut_mode %q (want blackhole or reset)", s)
}

// checkSelector checks a selector's syntax; whether it names something is
// known only against a cluster.
func checkSelector(sel string) error {
	region, node, hasNode := strings.Cut(sel, ":")
	if region == "" || (hasNode && node == "") {
		return fmt.Errorf("chaos: selector %q: want REGION or REGION:NODE", sel)
	}
	if !hasNode {
		return nil
	}
	switch node {
	case "leader", "followers", "follower", "any", "all":
		return nil
	}
	var id int
	if _, err := fmt.Sscanf(node, "n%d", &id); err != nil || id <= 0 || fmt.Sprintf("n%d", id) != node {
		return fmt.Errorf("chaos: selector %q: node part %q (want n<id>, leader, followers, follower, any or all)", sel, node)
	}
	return nil
}

// Duration is a time.Duration that reads and writes JSON as "1.5s".
type Duration time.Duration

// D is shorthand for Duration(d) in scenario literals.
func D(d time.Duration) Duration { return Duration(d) }

// Std returns d as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// MarshalText writes d as time.Duration.String does.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText parses what time.ParseDuration accepts.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}
