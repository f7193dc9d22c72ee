// Package replica is one member of a range's Raft group (go.etcd.io/raft/v3):
// the Raft state machine, the range's segment store as the Raft log, and the
// range's idempotent-producer table.
//
// The Raft log is the message log: each Raft entry is stored once, as one
// frame of the segment store, carrying its term and index. A data entry is a
// record batch whose offsets the leader assigned when it proposed it; a
// leader's empty entry and a configuration change are control frames that
// take no offset. Offsets are therefore dense and identical on every replica:
// they are fixed before replication and replicated verbatim.
//
// # Driver contract
//
// A Replica has no goroutines and reads no clock but Config.Now. One
// goroutine (the range driver, or the simulator) owns it and calls, in any
// interleaving: Tick on its ticker, Step for each message from a peer,
// Propose for each append, and ProcessReady whenever HasReady. A second
// goroutine, the log writer, calls WriteLog whenever LogWrites receives
// (the simulator calls it after a virtual disk latency); the driver wakes
// for ProcessReady when LogWritten receives. WriteLog makes the commit
// mark durable with the entries it writes (a mark frame after them, one
// fdatasync for both); a commit no log mark covers is recorded in the
// state's mark record, unsynced, before it is published (commitmark.go;
// after a machine's crash the replica relearns its commit index:
// relearn.go). A replica shutting down gracefully saves a clean mark
// (SaveCleanMark) before Close. Raft runs with AsyncStorageWrites
// (logwriter.go says what the goroutines share).
// ProcessReady does, in this order:
//
//  1. Step what WriteLog delivered to this replica's Raft
//     (MsgStorageAppendResp, a leader's own MsgAppResp): entries now
//     durable here, and what they commit.
//  2. Save the hard state when its term or vote changed, synchronously:
//     term and vote alone, in place, where the StateStore can
//     (FileState.SaveTermVote: an election needs no new disk space), the
//     whole state otherwise (the commit index rides along; on its own it
//     is made durable by the commit mark in the log, step 5).
//  3. Send what Raft lets go at once: a leader's appends and heartbeats go
//     out before its own write, so its followers write in parallel with it
//     (Raft thesis 10.2.1). (Config.Send must not block.)
//  4. Queue the Ready's entries for WriteLog, encoded as frames, with the
//     messages that must wait until they are durable (a follower's acks, a
//     vote): WriteLog appends everything queued, fsyncs once, then sends
//     those. The idempotence table, append times and the log's tail (where
//     a new leader's proposals continue) follow the entries as they are
//     queued. Entries that overwrite this replica's uncommitted tail (a new
//     leader's), and a snapshot, are written here instead, after everything
//     queued: truncate, rebuild the idempotence table from the log, append,
//     fsync.
//  5. Apply committed entries (Raft hands them over once they are durable
//     here): answer the proposals they settle, apply configuration changes
//     (saving the configuration durably), and want a commit mark covering
//     them (the next WriteLog carries it); publish the committed offset
//     once a mark covers it, the log's or the state's record
//     (commitmark.go: a replica restarted by a process's crash publishes
//     at once what it published before).
//  6. Answer the proposals of the current term that Raft's commit index
//     covers: a quorum has them durably, this replica's own write may still
//     be in flight.
//
// A driver may stop ticking a replica while Quiesced reports true
// (quiesce.go): an idle leader quiesces, on a tick, instead of ticking
// (Quiesce), and its followers follow on its quiesce heartbeat. Anything
// that needs the clock again (a proposal, a read, a message other than
// the quiesce heartbeat) ends it; a quiesced follower's driver must wake it
// (Unquiesce) when its leader's node is down, since it cannot time the
// leader out.
//
// The driver also calls AnswerCommitted after each Step: the follower ack
// that completes a quorum is answered as it is stepped, without waiting
// for the next Ready cycle (step 6 on its own).
//
// With Config.HoldCommits, step 3 holds a leader's appends that only carry
// a new commit index to a caught-up follower while appends come
// continuously (commithold.go: the next append carries it); the driver
// calls SendHeldCommits once HeldCommitsWait has passed. With
// Config.MergeAppends, step 3 first merges the appends of the Ready to one
// follower that continue one another into one message (appendmerge.go).
//
// Around the Ready cycles, the driver also (snapshot.go, compact.go):
//
//   - hands the transport each MsgSnap ProcessReady gives Config.SendSnapshot
//     (with a body that streams this leader's log), and hands every outcome
//     the transport reports back through ReportSnapshot: Raft pauses the
//     follower until it hears one, so none may be dropped;
//   - for a snapshot received, lets the transport's goroutine read and stage
//     its body (ReceiveSnapshot: validated, fsynced beside the log, nothing
//     replaced), then calls StepSnapshot and ProcessReady on its own
//     goroutine; the Ready that carries the snapshot installs it before its
//     entries (persist snapshot, then entries), and a Ready that does not
//     discards the staging;
//   - calls Compact between Ready cycles to apply retention as log
//     compaction.
//
// A full disk (segment.ErrNoSpace from the log) is not a failure: WriteLog
// returns the error, keeps what it took queued (the frames the log took
// stay in it; the torn one was cut off) and delivers none of its
// messages, so this replica acks nothing it could not write (a follower
// sends no MsgAppResp, a leader does not count itself); Propose answers a
// retriable UNAVAILABLE (DiskFull) meanwhile. The driver calls WriteLog
// again after a backoff even if LogWrites does not receive; the first one
// that succeeds delivers everything held and clears DiskFull. A truncation
// or snapshot install that meets a full disk (appendSync) still stops the
// replica.
//
// A producer's ack therefore comes only after a quorum of the region has the
// batch fsynced (a follower acks an append only after its WriteLog's fsync;
// a leader counts its own copy the same way). A proposal is answered with success only if the entry that
// commits at its offset is the one it proposed (same term); if another entry
// commits there, or a later leader's first entry commits without it, the
// proposal fails with a retriable NOT_LEADER, and an idempotent retry is
// safe. A leader that lost its quorum never acks: nothing it proposes alone
// can commit. It does not keep its proposers waiting either (liveness.go):
// once it has heard from no quorum for an election timeout it fails what
// is pending with a retriable NOT_LEADER (the outcome is unknown: a quorum
// may hold it) and refuses new appends until a quorum answers; a leader
// that steps down fails what is pending at once. A replica that stops (an
// error from its log or state store) steps and ticks no more, as a crashed
// one; if it led, it first sends its most caught-up follower a
// MsgTimeoutNow, so the group elects without waiting for a timeout, and
// its refusals name the new leader (StoppedAppendError). Followers of a
// leader that fell silent do not wait for Raft's randomised timer (one to
// two election timeouts): the first of them by id campaigns one tick after
// an election timeout, the others a tick apart, and a follower that lost
// its leader campaigns again every few ticks while none is elected
// (succession.go); pre-vote and CheckQuorum still keep a leader the others
// hear from being challenged.
//
// Idempotence survives leader changes because the table is derived from the
// log: every replica records every batch as it queues it for its log
// (written or not: a replica that becomes leader knows every batch of its
// log before it accepts a retry), and rebuilds the table after a
// truncation. Proposals are never forwarded (their offsets are the
// proposer's): a replica that lost leadership refuses them. Compaction keeps it: the table as of the compaction
// point (the producer base) is saved with the compaction point and travels
// in snapshots, and the table is the base plus the log after it.
//
// # Compaction and snapshots
//
// The stream's retention policy runs on every replica as Raft log
// compaction (Compact): only whole sealed segments whose entries are all
// applied here are deleted, after the compaction point (SnapshotIndex and
// term, the offset and append time after it, the producer base) is saved
// in the state. Raft sees the log start after the compaction point; frames
// at or below it that are still on disk serve readers only. A leader holds
// compaction back, within Config.CompactionHoldBackBytesMax, for followers
// it can reach that lag; one behind the leader's first index gets a
// snapshot: the leader's retained log up to its applied index, streamed as
// segment frames (snapshot.go), which replaces the follower's log through
// segment.Store.Install (crash-safe at every step; installSnapshot lists
// them). A snapshot no newer than the follower's commit index is ignored.
//
// # Forks
//
// After a failover the range may hold a divergent tail: records past the
// offset where the new home continued. ProposeFork (fork.go) moves them,
// on every replica alike, into the range's orphan log (orphans.go, the
// directory OrphanDirName beside the segments) and truncates the log to
// the fork offset, which then continues there at the fork's epoch. The
// fork entry becomes the compaction point (Raft never asks for the entries
// it removed; a follower that needs them gets a snapshot, which carries
// the orphan log too), and its frame in the log ends the gap in Raft
// indexes and describes it. While a fork is proposed or unapplied, the
// leader takes no appends and Compact deletes nothing; a follower holds
// back data entries that follow a fork entry it has not applied. A crash
// at any step leaves the pre-fork state (the entry applies again, never
// orphaning twice) or a recorded one that New completes.
//
// # Determinism
//
// etcd raft draws election jitter from crypto/rand.Reader; the simulator
// replaces that reader with a seeded stream so a run replays exactly.
package replica
