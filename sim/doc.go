// Package sim is geolog's deterministic simulator of a region: the real
// replica code (package replica) over the real segment store (package
// segment) on an in-memory disk that loses unsynced writes on a crash
// (vfs.Mem), a virtual network that drops, delays, reorders, duplicates and
// partitions, a virtual clock, and idempotent producers that retry at random.
// After every step it checks DESIGN.md's invariants 1-4 and 8 (no node
// publishes a lower committed end than it published before, across its
// crashes: the region has no forks) and that all replicas agree on the
// committed log where what they retain overlaps.
//
// Half the seeds compact: tiny segments and aggressive retention (by size,
// and on some by age), applied as Raft log compaction every 20 ms, so that
// crashed and cut-off replicas fall behind the leader's compaction point and
// catch up by snapshot (segment transfer, as its own network event, lost and
// reported like the others). A replica's committed records are checked from
// its log's start, wherever compaction or a snapshot put it.
//
// Everything runs on one goroutine and every choice comes from one seeded
// *rand.Rand, including etcd raft's election jitter (raft reads
// crypto/rand.Reader, which Run replaces for its duration), so a seed replays
// exactly: `make sim SEED=<n>`.
//
// # What a run does
//
//  1. Start Nodes nodes, each with its own vfs.Mem, hosting one replica of
//     every range (Ranges Raft groups of Nodes voters).
//  2. For Steps virtual milliseconds: tick Raft every 10 ms, deliver due
//     messages, run every replica's Ready cycle, run each replica's log
//     writer (WriteLog) a virtual disk latency after its Ready cycles
//     queued writes (0-2 ms, now and then 5-35 ms; Raft steps on
//     meanwhile, as beside a driver's log-writer goroutine), let
//     producers send, retry and receive replies, and inject faults:
//     message loss, delay and duplication, lost replies (ambiguous acks),
//     partitions of a node, and crashes (the disk keeps only what was synced; queued log writes are
//     lost) with restarts, including crashes inside a log fsync (the
//     replica sees the Sync fail, then the node dies: nothing that waited
//     for that write may have left before).
//  3. Heal everything and run until every producer's batches are acked.
//  4. After every step and at the end, check the invariants.
package sim
