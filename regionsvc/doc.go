// Package regionsvc is the geolog region node: the gRPC Log service, the
// stream catalogue, and one driver per range.
//
// # Range driver contract
//
// Each range is owned by one goroutine (rangeDriver.run) that alone writes to
// the range's segment store and alone touches its idempotence table. It
// selects over its inbox, fsync completions, a maintenance ticker and stop:
//
//  1. Validate and encode a request's frame on the caller's goroutine
//     (parallel across connections); the driver only patches offset, epoch
//     and append time into it.
//  2. For an idempotent batch, consult the dedup table first: a gap or an
//     overlap is refused; an exact duplicate is answered with the original
//     offsets, but never before the original is durable.
//  3. Assign offsets densely from the store's tail, append the frame (one
//     write), record the batch in the dedup table, and queue the request as
//     pending. Drain whatever else is queued before asking for an fsync, so
//     one fsync covers all of it (group commit).
//  4. A separate sync goroutine runs one fsync round at a time. Only after a
//     round completes does the driver publish the new committed offset and
//     ack the pending requests it covers, in offset order.
//  5. Readers never go through the driver: they read the store directly,
//     bounded by the published committed offset (and, on a copy that holds
//     a divergent tail, by its timeline fence: timeline.go), so nothing
//     unacked is ever visible. A read past that bound is never a final
//     error unless the home confirms the range ends before it
//     (readpast.go).
//  6. An I/O error or a failed fsync stops the range's appends: every
//     pending request gets a retriable UNAVAILABLE (its outcome is unknown;
//     an idempotent retry after restart resolves it), nothing more is
//     acked; its committed prefix is still read (readFailure). A full disk
//     (segment.ErrNoSpace) stops nothing: appends get a retriable
//     UNAVAILABLE while it lasts, the log writer retries with backoff, a
//     full leader hands leadership on, and appends resume once space is
//     freed. Corruption found on open or on read, lost segments included,
//     stops the range with CORRUPTION (reads too); nothing on disk is
//     deleted. See docs/disk-faults.md.
//  7. On shutdown the driver fsyncs what it wrote, acks it, and refuses what
//     is still queued with a retriable SHUTTING_DOWN.
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
// The dedup table is derived from the log: on open, every batch header is
// replayed into it (segment.Config.OnRecover), so a duplicate sent after a
// crash and restart still gets its original offsets.
package regionsvc
