// Package regionsvc is the geolog region node: the gRPC Log service, the
// stream catalogue, and one driver per range.
//
// # Range driver contract
//
// Every range, and the catalogue (the "_meta" range), is a Raft group over
// the region's nodes (package replica); a region of one node is a Raft
// group of one voter, which commits an entry once its own write of it is
// durable. There is one write path. Each range is owned by one goroutine
// (rangeDriver.runReplicated) that alone steps its replica, which alone
// touches the range's idempotence table; the replica's log writer and
// commit-mark writer write the segment store beside it (replica's doc.go
// has the replica's own contract). The driver selects over its inbox,
// Raft messages, the log writer's completions, the node's tick (only while
// its replica is not quiesced: an idle range wakes for nothing but its own
// events, quiesce.go), the node's liveness changes, a maintenance ticker
// and stop, and hands each event to the loop's body, rangecore.Driver,
// which decides what it does (the Ready cycles and their acks, quiescence,
// the campaign after a leader found down, the start-up hold) with no
// goroutine, channel or clock of its own; the simulator (package sim)
// runs the same Driver on its virtual network, disks and clock:
//
//  1. Validate and encode a request's frame on the caller's goroutine
//     (parallel across connections); the leader only patches offset, epoch
//     and append time into it.
//  2. Propose it (replica.Propose): the replica consults its dedup table
//     first (a gap or an overlap is refused; an exact duplicate is answered
//     with the original offsets, never before the original is committed),
//     assigns offsets densely from its log's tail and hands the entry to
//     Raft. Drain whatever else is queued before the Ready cycle, so that
//     one log write (one fdatasync) covers all of it (group commit).
//  3. Ack once Raft commits the entry (a majority has it durably; in a
//     group of one, the node's own write). The follower ack that completes
//     a quorum is answered as soon as it is stepped (replica's
//     AnswerCommitted), with no Ready cycle in between; the leader's own
//     write, when it completes the quorum, in the Ready cycle that steps
//     it, before more proposals are taken in. Acks given during a Ready
//     cycle are sent at that cycle's end, after the committed offset it
//     reached is published (rangecore.Driver.Ready): in a group of one, whose write carries
//     the commit mark, a reader told of a record finds it; in a larger
//     group the ack may come before this node's copy is applied and
//     published (read-your-writes: min_offset or home reads).
//  4. Readers never go through the driver: they read the store directly,
//     bounded by the published committed offset (and, on a copy that holds
//     a divergent tail, by its timeline fence: timeline.go), so nothing
//     unacked is ever visible. A read past that bound is never a final
//     error unless the home confirms the range ends before it
//     (readpast.go).
//  5. An I/O error or a failed fsync stops the replica: every pending
//     request gets a retriable error (its outcome is unknown; an
//     idempotent retry resolves it), nothing more is acked; its committed
//     prefix is still read. A full disk (segment.ErrNoSpace) stops nothing:
//     appends get a retriable UNAVAILABLE while it lasts, the log writer
//     retries with backoff, a full leader hands leadership on, and appends
//     resume once space is freed. Corruption found on open or on read,
//     lost segments included, stops the range with CORRUPTION (reads too);
//     nothing on disk is deleted. See docs/disk-faults.md.
//  6. On shutdown the driver hands leadership away if it can, writes what
//     its log writer left queued, and refuses what is still queued with a
//     retriable SHUTTING_DOWN.
//
// # Callers
//
// With Config.TLS set, every gRPC call is authorized before its handler
// runs (peerauth.go, docs/security.md): the caller's certificate names a
// node or a client principal (package pki); node-to-node services (Raft,
// Mirror, RefreshHomes, anything outside geolog.v1, and requests with the
// internal forwarded/propagated headers) take nodes only, Raft nodes of
// this region only; Raft and Mirror streams are bound to the node their
// certificate names. Without Config.TLS nothing is checked.
//
// # Compaction by key
//
// A range of a stream whose cleanup policy compacts by key also decides
// (on its home leader), applies and carries out compactions on its
// maintenance tick; the node's one cleaner rewrites segments in the
// background. compaction.go lists the steps; package compact and
// docs/compaction.md give the rule.
//
// # Idempotence
//
// The replica's dedup table is derived from the log: on open, every batch
// header is replayed into it (segment.Config.OnRecover hands them over), so
// a duplicate sent after a crash and restart still gets its original
// offsets.
package regionsvc
