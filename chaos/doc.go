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
//     with consistency "home" and at every mirror up to the home's tail.
//  5. Checks: CheckQueue (lost, duplicated, inconsistent, out of order,
//     unexpected, gaps) and CheckLinearizable (porcupine, per range). Any
//     anomaly or an Illegal history fails the scenario; a check that could
//     not complete (home final read failed, porcupine timed out) makes it
//     UNVERIFIED, never PASS.
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
//     the first ack of an append to that range invoked after it.
//   - The lease-store faults (links "<region>->pg" to a PostgreSQL started
//     with scripts/pg.sh, or pg.sh stop/start) exist; the scenarios that
//     need homing in the node are listed with Pending set.
package chaos
