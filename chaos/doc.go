// Package chaos runs geolog on real processes under injected faults and
// checks what the clients saw (DESIGN.md, test layers: "chaos runs on real
// processes ... checked by a history checker").
//
// A Scenario is data (JSON): a cluster Shape, a Workload, a schedule of
// Faults and a duration. Run starts (or attaches to) a Cluster, creates a
// fresh stream, runs the workload while an injector applies the faults,
// heals everything, reads every copy of every range to the end, and checks
// the History. cmd/geolog-chaos runs lists of scenarios and prints a table;
// make chaos runs Scenarios(), make test runs Slice() (TestSlice).
//
// # Run contract
//
//  1. The workload starts before the first fault and stops after the last
//     is reverted; faults only start inside the scenario's duration.
//  2. Every append is one Op: invoked before Produce, completed in its
//     callback: OK with offset and epoch, Fail only for errors that refuse
//     a record before appending it, Info (unknown) for everything else.
//  3. Readers record every record they see (Observation): consumers in
//     every region, the tail readers at the home, the final reads.
//  4. After the faults the harness heals every link, resumes and restarts
//     every node and clears every failpoint, flushes the producers (what
//     is still unacked becomes Info), then reads each range at its home
//     (with homing: where the cluster says it is now) with consistency
//     "home", and every mirror until its copy equals the home's (a
//     returning home forks its divergent tail off only when the new
//     home's replicator reaches it) or 90 s pass. With homing it then
//     reads the orphan log of every node (Admin ListOrphans, ReadOrphans).
//  5. Checks: CheckQueue (lost, duplicated, inconsistent, out of order,
//     unexpected, gaps, stale epochs) and CheckLinearizable (porcupine, per
//     range). Any anomaly or an Illegal history fails the scenario; a check
//     that could not complete (home final read failed, porcupine timed
//     out) makes it UNVERIFIED, never PASS.
//
// # Consumer groups
//
// A scenario with Workload.Group runs group members (client.GroupConsumer,
// in the harness's process, each with its own client behind its own gate)
// beside the producers; they record every record they receive and each
// OnAssigned. Faults: member-kill (Abandon, a new member Duration later),
// member-partition (the member's connections reset and refused for
// Duration), and kill "cursors:leader" (the group's coordinator, the
// leader of its range of _cursors in that range's home region). After the
// final reads the members run until they processed every record of the
// final home logs (a minute at most), then close; the group's range of
// _cursors is read at its home and replayed by cursors.CheckLog.
// CheckGroup's columns: records never processed, cursor regressions and
// commits accepted from old generations (all must be 0), and per member
// fault the time until every range the victim owned was assigned again.
//
// # Splits, joins and drains
//
// A split fault (KindSplit) splits a range through Admin SplitRange while
// the workload runs. The workload follows: producers refresh their range
// map (an ack names the range it landed in), a consumer's Subscribe reads
// the parent to its split offset, then the children (recorded under the
// child's range id); once it has read the parent to its end it hands over
// to one consumer per child, each from its own position, and a tail
// reader that reaches a parent's end starts one per child. After the
// faults the harness reads the stream's range map (DescribeStream): the
// final reads cover every range id, children included (homed with their
// parent), and History.Spans records each range's hash slice and split
// offset. The checkers then also judge: per producer and key, acks follow
// sequence numbers in (range, offset) order (a child's id is above every
// id the stream had, so a key's records in its parent come first); every
// acked and finally read record is in a range whose slice holds its key's
// hash, and below its range's split offset (Inconsistent otherwise). Loss
// and duplicates need nothing more: a value seen at two positions is a
// duplicate whichever ranges hold them.
//
// Join (KindJoin) starts a spare node of the shape (Shape.SpareNodes) with
// --join (LocalCluster only; its Raft traffic does not ride the WAN
// emulator); drain (KindDrain) drains a node and, with
// Params.Decommission, waits until it holds no replica, decommissions it
// and stops it, as the cluster's operator (Admin SetNodeState with the
// superuser's certificate: the harness's own principal is admin of its
// streams only). A scenario with either ends by describing every range's
// replicas in every region (Admin DescribeReplicas), waiting up to a
// minute for moves under way: each range must have exactly the
// replication factor of voters and no learner (anomaly "replicas").
//
// # Homing in the checks
//
// A record acked by a home that then died (or lost the lease store) and
// never shipped is, after the failover, in the old home's orphan log, at
// its offset and epoch, not in the log: the checkers judge every ack and
// observation of such a divergent tail against the orphan logs
// (checkorphans.go). Such an acked record counts as "orphaned" (the RPO
// suffered) only if a fault took its home region away under that epoch
// (FaultEvent.HomeEpochs); otherwise it is lost. Porcupine checks the final
// timeline: orphaned acks, and home reads of the divergent tail invoked
// before the new home's first ack, are left out; such a read invoked later
// is stale, kept, and found. Stale-epoch anomalies: an ack under an epoch
// older than one whose ack had already returned when the append was
// invoked (invariant 5), and, under a lease-store outage of its home, an
// ack under the home's epoch returned between cut + lease TTL and the heal
// (the node must stop max-clock-offset before its lease may expire, which
// is the slack the reply has to reach the client).
//
// # Choices
//
//   - Raft links inside a region go through the WAN emulator too
//     (LocalCluster): per ordered pair of nodes a link "us:n1->us:n2", and
//     each node's --peers names its peers at those links. Partitioning
//     nodes of one region is then a cut of links, like any other, and
//     clients keep reaching every node directly (leader hints name link
//     addresses; the harness's clients dial the node behind them). The
//     alternative, a proxy per region in front of every node, would put
//     client traffic on the Raft path.
//   - The replicator is stopped by cutting, in reset mode, the WAN links
//     the home leader's replicator tasks dial (home → mirror region): no
//     debug endpoint in the node, and the tasks see what a dead peer does.
//   - Disk and clock faults use the node's failpoints (internal/failpoint,
//     geologd --debug-failpoints): a delayed or failing fdatasync under
//     every range store (vfs.WithFaults) and a skew added to Config.Now.
//     Until homing lands the clock feeds append times, retention and lag
//     only; with leases it will feed expiry.
//   - Ambiguous acks: KindKill with DropReplies resets the clients' links
//     to the node (dropping acks inside the proxy) just before SIGKILL;
//     a short delivery timeout turns some in-flight records into Info ops.
//   - Failover is measured from the moment a leader fault is applied to
//     the first ack of an append to that range invoked after it; for a
//     fault that takes a whole home region away (every node killed, or
//     cut off from the lease store), per range homed there, to the first
//     ack under a newer epoch (the takeover's).
//   - The lease store is reached by each region through its own WAN link
//     "<region>->pg" (LocalCluster; terraform/local with chaos_links), so
//     a region can lose it alone; "stop" mode stops PostgreSQL (pg.sh).
//   - Producers of region faults run in the surviving regions
//     (Workload.ProducerRegions): a client knows its region's addresses
//     only, and one whose region died would wait out its delivery timeout.
//   - A tail reader re-reads the last record it holds with every read; if
//     it changed (a fork under it), it starts over from 0 as a new source.
//   - make chaos provisions one cluster through terraform/local
//     (scripts/chaos_tf.sh) and attaches to it (EnvCluster): pid files
//     "PID STARTTIME", links found by name in the WAN's list, the lease
//     store's script from the env file. CHAOS_PROVISION=local starts a
//     LocalCluster per scenario; the slice in make test always does.
package chaos
