// Package cursors holds the pure cores of consumer cursors and consumer
// groups: the record format of the internal cursor stream, the State a
// range of that stream applies its log into, the Batch through which a
// coordinator validates requests before proposing them, the group protocol
// (Coordinator) and the sticky assignor (Assign). No goroutines, no
// clocks, no I/O: time comes in with each Batch, and the driver
// (regionsvc/cursors*.go) owns everything else. See docs/consumers.md for
// the design.
//
// # Records
//
// The cursor stream "_cursors" holds two kinds of records (record.go):
// one per (cursor, stream, range) position, keyed by exactly that, and
// one per group, keyed by the group's name, holding the whole group state.
// A coordinator writes a record only when it changes something, and every
// record it writes for a key supersedes the ones before it, so keeping the
// newest record per key (compaction by key) keeps exactly the state. A
// deleted position is a tombstone; a deleted group is a group record
// marked deleted, which keeps its epoch.
//
// # Commits
//
// A position is a max-register ordered by (generation, offset): a commit
// not above the held position changes nothing, and is no error. Applying
// any record again, in any order relative to later ones, is harmless; so a
// commit stranded in an orphan log after a failover can be merged back.
// A reset writes one generation above the cursor's highest on the stream;
// a commit carrying an older generation than held is refused (the whole
// request), so a consumer that read the cursor before the reset cannot
// undo it.
//
// # Groups
//
// A group's members each own a set of ranges; the coordinator computes a
// target assignment (Assign: balanced, fewest moves) on every membership
// change and moves each member toward its target: a member is asked to
// release what it owns outside its target (its answers list only the rest;
// asking writes nothing), and once it reports them released (it stops,
// commits, and heartbeats without them) they are free; a member with
// nothing left to release is granted the free ranges of its target, in the
// same batch that freed them (by a release, a leave or a removal), so that
// it learns of them at its next heartbeat. A range is therefore never
// owned by two members, and a grant never waits for an unrelated member.
// Every grant raises the group epoch and moves the member to it. Commits are fenced: the member must be known, in the
// incarnation the request's epoch belongs to ([JoinEpoch, Epoch]), and
// own the range. Group epochs carry the coordinator's homing epoch in
// their high bits (epochShift), so after a region failover every epoch the
// new home issues is above every epoch the old home issued.
//
// Sessions are the coordinator's soft state: a member that is not heard
// from for its session timeout, or does not release within its rebalance
// timeout, is removed (Expire) and its ranges are free. A new coordinator
// gives every member a full session from its first look.
//
// # Driver contract
//
//  1. Every replica of a cursor-stream range applies the range's committed
//     records, in log order, into its State (State.Apply), and rebuilds the
//     State from the log's start when the log is cut (a fork).
//  2. The coordinator (the range's leader in its home region) serialises
//     batches: it opens one (State.Begin) only once its State has applied
//     every entry committed before its own next proposal (after a change of
//     leadership or a failed proposal: a read barrier, then the apply), runs
//     the waiting requests through it in arrival order, proposes its
//     Records as one append, and answers the requests only once that append
//     is committed and applied. A request that failed in the batch is
//     answered at once; it changed nothing.
//  3. The coordinator runs Expire on a ticker, as a batch of its own.
//  4. On any change of leadership it calls Coordinator.Reset (or makes a
//     new Coordinator): sessions start afresh.
package cursors
