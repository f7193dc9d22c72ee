// Package homing decides which region may append to each range, at which
// epoch, and until when: epoch-based range homes hung off node liveness, in
// a lease store that is CockroachDB in production and PostgreSQL here.
//
// # Model
//
// Liveness: one record per node (node id, region, liveness epoch,
// expiration). Each node heartbeats its own record every HeartbeatInterval,
// writing "my clock now + LivenessTTL" as its expiration, conditional on
// its liveness epoch being unchanged. That is one small transaction per
// node per interval: the lease store's load is O(nodes), not O(ranges)
// (CockroachDB's epoch-based range leases).
//
// Homes: one record per (stream, range): home region, homing epoch (the
// fencing number, +1 on every change of home), the offset where the epoch
// began (the fork point), the previous region, and a planned move in
// progress. A region's homes carry a version (bumped by every change to
// the set of ranges homed there), so a heartbeat re-reads them only when
// they changed, in the same transaction that extends the lease.
//
// A node may ack appends to range R at epoch E while both hold:
//
//  1. its view, confirmed by its latest successful heartbeat, has R homed in
//     its region at E, with no planned move announced; and
//  2. its clock reads less than that heartbeat's expiration minus
//     MaxClockOffset (View.ServeUntilNanos).
//
// When the store is unreachable nothing renews (2), so a node stops acking
// at its last expiration minus the offset, with ErrLeaseExpired (also
// matching ErrStoreUnavailable).
//
// Failover (Takeover): another region may move ranges away from region F
// at epoch+1 only when every node of F may no longer be live: by the
// taker's clock, later than each F node's stored expiration plus the max
// offset. Clocks differ by at most the offset, so by then every F node's
// own clock is past its expiration and it has stopped acking (the second
// margin covers an ack decided just before the deadline). In the same
// transaction the takeover increments the liveness epochs of F's nodes (a
// returning node's heartbeat fails, it learns its homes are void and
// starts over), rewrites the ranges at epoch+1 with their fork offsets,
// records each grant in the range's history and bumps both regions'
// versions. Many ranges move in one transaction.
//
// Planned rehome (PrepareRehome, CompleteRehome, CancelRehome): a
// compare-and-set on the epoch in two steps. Prepare marks the range as
// moving and bumps the home region's version; each home node stops acking
// it when its heartbeat brings the new version, and reports on its next
// heartbeat that it had published that version (Liveness.HomesSeen).
// Complete moves the range to the target at epoch+1 once every node of the
// old home has reported so or may no longer be live (ErrNotDrained until
// then); the caller makes sure the target caught up to the tail first and
// passes that tail as the new epoch's start offset. So no node of the old
// home acks under E once E+1 exists, without anyone waiting for a lease to
// run out, and the store still sees O(nodes) writes.
//
// Where an epoch starts (RaiseStart, raisestart.go): a grant's start
// offset is where the new home's log was read, which more of the old
// epoch may still pass. Before its first frame of the epoch the new
// home's range leader confirms its log's end and raises the recorded start
// to it: a compare-and-set on the epoch and the start it read, only
// upward, in the home record and the epoch's history, bumping the home
// region's version.
//
// The batch forms (BatchRehomer) also return each changed region's homes
// at its new version, read in the same transaction. A coordinator hands
// them to the nodes of that region (Homes.Install): the old home stops at
// once, without a heartbeat, and reports the version it now acts on
// straight back; CompleteRehomes takes those reports as confirmations
// (the node will not go back to older homes: a core never takes homes
// older than what it has held). The new home starts as soon as the
// complete commits, the same way. Heartbeats still confirm for nodes the
// coordinator could not reach.
//
// Invariant 5 ("at most one home per epoch; no ack under an epoch older
// than the newest granted") follows: every grant is a serializable
// compare-and-set on the range's epoch, and it is made only when no node of
// the old home may still act on the old epoch.
//
// # Pieces
//
//   - decide.go: the decisions as pure functions of the rows a transaction
//     read and the caller's clock readings. Both stores call them.
//   - Store: the I/O seam. SQLStore (pgx pool; every call one SERIALIZABLE
//     transaction through cockroach-go's crdbpgxv5.ExecuteTx, made correct on
//     PostgreSQL too: see SQLStore) and MemStore, its in-memory twin for unit
//     tests and the simulator. The datadriven scripts in testdata/ run on
//     both and must give the same output.
//   - Core: a node's lease and view as a deterministic state machine (no
//     goroutines, no clock, no I/O): Next(now) gives the heartbeat to send,
//     Done takes the answer, View() is an immutable snapshot with Check.
//   - Homes: the driver, one goroutine per node that owns a Core.
//   - Takeover (takeover.go): a region's failover decision as a
//     deterministic core: which ranges of a dead region it takes, when,
//     from which tail. regionsvc's failover agent drives it.
//   - Rehome (rehome.go): the coordinator of a planned rehome of a group of
//     ranges as a deterministic core: prepare, stop, drain, catch-up,
//     complete, start; cancels what fails. regionsvc's rehome drives it.
//     Both are tested by datadriven scripts (testdata/cores) that answer
//     their requests in any order, so every interleaving can be forced.
//   - Migrate: versioned, idempotent migrations (schema_migrations) applied
//     by OpenSQL. README.md documents the CockroachDB multi-region setup.
//   - pgtest: a private PostgreSQL for tests (scripts/pg.sh).
//
// # Driver contract
//
// A driver (Homes, or a simulator stepping a Core itself) does, in a loop:
//
//  1. Read the clock and call Core.Next(now) only after publishing the View
//     of the last Done: the request reports the published homes version as
//     seen, and a planned rehome relies on that report being true.
//  2. Send at most one heartbeat at a time; bound it with a timeout. The
//     expiration it carries comes from the clock read before sending, so a
//     late answer only shortens the lease.
//  3. Feed the answer (or the error) to Core.Done, or a snapshot to
//     Core.Install, and publish Core.View() at once, before anything else
//     acts on the outcome.
//  4. Ack an append only after View.Check (or Lease) at the clock reading
//     taken when the ack is decided, with the epoch it returned stamped on
//     the batch; never from a cached "yes". Replicas still reject batches
//     of an epoch older than the newest they have seen: a lease alone is not
//     a lock.
//  5. On Event.LostEpoch (the node was fenced by a takeover), everything the
//     node knew about its homes is void; the core has dropped it and
//     re-registers at the new epoch with the next heartbeat, which is due
//     at once.
//  6. Use the same MaxClockOffset on every node and keep clocks within it
//     (NTP); a node whose offset may exceed it must stop serving.
//
// # Takeover driver contract
//
// A failover agent (one per region, on the node that leads the region's
// catalogue) owns one Takeover and, every scan interval:
//
//  1. Reads its clock and calls Tick with it, whether it leads now, its own
//     View.ServeUntilNanos and the home directory of the ranges it mirrors
//     (with each stream's regions in preference order).
//  2. Carries out Ready's ops in order and gives each answer to the method
//     its kind names, with the op's Round; an op it cannot carry out is
//     answered with an error, never left unanswered (the core would wait
//     for it, and Tick starts no round while one waits).
//  3. Reads liveness with the store timeout of a heartbeat, asks the
//     surveyed regions at once, and reports only the local ranges it can
//     serve (a replica, not failed): the core takes nothing else.
//  4. Sends each takeover with a clock reading taken just before (Homes.
//     Takeover does), so a late answer only makes the judgement safer.
//  5. Calls LeaderChanged(false) as soon as it stops leading (between ops
//     too): the core drops the round and forgets what it judged. An op
//     that awaits an answer and is no longer of the Current round is not
//     carried out.
//
// # Rehome driver contract
//
// A coordinator (a node of the target region) owns one Rehome per group of
// ranges sharing an old home and, until Done:
//
//  1. Carries out Ready's ops in order; at most one awaits an answer and
//     it comes last. It gives the answer with a clock reading taken when
//     the answer came (the phase durations are made of them).
//  2. Runs the lease-store writes (prepare, complete, cancel) one at a time
//     on the node, retrying transient failures for a bounded time; each is
//     a compare-and-set, so a retry after an ambiguous commit fails
//     harmlessly.
//  3. Stamps each complete request with a clock reading taken just before
//     sending it.
//  4. Reports, for the stop, the highest final tail a leader of the old
//     home reported per range (a leader's, read after it took the stop
//     and its appends in flight were answered; never a follower's
//     committed end, which may lag what the leader acked: a range no
//     leader reported is left out, and the core asks the leader of now),
//     every node's confirmed homes version, and an error if any node did
//     not answer: the core then waits for the old home to drain before
//     trusting the tails.
//  5. Runs cancels with a context the caller's cancellation does not end,
//     and logs a failed cancel (the range stays stopped until a rehome
//     completes or is cancelled).
//  6. Once the caller gave up, calls Abandon instead of carrying out the
//     next awaited op, then carries out what Ready returns (cancels, the
//     start of what moved, the release of the old home).
//
// # Errors
//
// Every error matches one of the package's sentinels (errors.Is) and carries
// an *apierr.Error with its API code and retriability (apierr.As,
// IsRetriable): ErrNotHome, ErrLeaseExpired, ErrStoreUnavailable and
// ErrHomeLive are retriable; ErrInvalidArgument, ErrEpochMismatch and
// ErrRangeNotFound are final. ErrAmbiguousCommit means a write may have been
// applied: read back before retrying (every write is a compare-and-set, so a
// blind retry fails harmlessly with ErrEpochMismatch).
package homing
