// Package raftnet moves Raft messages between geolog nodes. Every range is a
// Raft group (go.etcd.io/raft/v3) over its region's replicas, and a node
// hosts thousands of groups, so the transport multiplexes: one stream per
// pair of nodes carries the messages of all groups, and nothing in it costs
// anything per group.
//
// Two implementations keep one contract (the Transport and Handler
// interfaces): GRPCTransport, over the RaftTransport service of
// proto/geolog/internal/v1/raft.proto, and MemTransport on a MemNetwork, the
// in-memory twin the deterministic simulator steps.
//
// # Contract
//
//  1. Addressing. A message is addressed to (group, node): GroupID names the
//     group (the caller maps stream and range to it), NodeID is the Raft peer
//     id and names the node. 0 is never valid for either. The gRPC
//     transport finds nodes in an address book the caller keeps current
//     (SetPeer, RemovePeer).
//  2. Send never blocks. It validates and encodes the message on the
//     caller's goroutine (the caller may reuse the message at once) and
//     queues it for its peer. A peer's queue is bounded in messages and
//     bytes; when it is full, Send drops the message, counts it and returns
//     ErrQueueFull, except for control messages (heartbeats, votes and
//     pre-votes, their answers, MsgTimeoutNow, MsgAppResp), which may use a
//     reserve past the bound (QueueReserveMessages, QueueReserveBytes;
//     gRPC only, the simulator's link bound has none) and are dropped with
//     ErrReserveFull only once it is full too: a queue full of appends
//     costs appends, not leadership or elections. The queue is still one
//     FIFO (step 4). While a peer is unreachable (its last stream failed
//     and the transport is backing off, or the simulated link is cut) Send
//     returns ErrPeerUnreachable at once. On any error the caller calls
//     RawNode.ReportUnreachable(to): Raft tolerates loss.
//  3. Only messages that belong on the wire are carried: the sender is this
//     node (From; a forwarded MsgTransferLeader names the transferee
//     instead), the receiver another, the type is one Raft sends between
//     peers, and MsgSnap goes through SendSnapshot only. Send refuses
//     anything else with ErrInvalidMessage, so that a bad message never
//     poisons a stream.
//  4. Order. Per (from, to) pair of nodes, the messages delivered are a
//     subsequence of those sent, in send order (FIFO), across reconnects
//     too: a receiver delivers nothing from an older stream of a node once a
//     newer one is accepted. Delivery is at most once. (The simulator may
//     break this on purpose: LinkFaults.Reorder, DuplicateRate.)
//  5. Batching. One sender goroutine per peer drains the queue into one
//     RaftBatch per stream send, up to BatchMessagesMax and BatchBytesMax (a
//     single larger message travels alone). While a send is in progress new
//     messages accumulate, so batches grow with load without a timer.
//  6. Loss is reported. When a stream breaks, or a peer is removed, the
//     batch being sent and everything queued are dropped, counted, and
//     reported once through Handler.ReportUnreachable(to, groups) with the
//     distinct groups concerned. A batch already handed to gRPC can still be
//     lost silently; Raft's heartbeats and probes recover from that.
//  7. Reconnect. The receiver sends nothing after its hello answer, so the
//     sender's one pending Recv returns exactly when the stream ends: an
//     idle stream's end is noticed at once. The peer then backs off
//     (ReconnectBackoffMin doubling to ReconnectBackoffMax, each wait
//     jittered to [w/2, w)) and opens a new stream, whether or not there is
//     traffic. A stream is established once the receiver answers its hello,
//     which proves the receiver is the intended node; one that then stayed
//     up for ReconnectBackoffMax resets the backoff.
//  8. Receiving validates everything before the Handler sees it: the hello
//     and every batch must name this node as receiver (else ErrWrongNode,
//     FAILED_PRECONDITION) and the stream's sender; every message must decode
//     and pass the checks of step 3 with from = the sender and to = this
//     node, and Config.CheckMessage (the payload: a Raft member's entries);
//     batches are bounded in count and bytes. Anything else ends the
//     stream with ErrMalformed (INVALID_ARGUMENT) and is counted; nothing a
//     peer sends can make the receiver panic.
//  9. Handler.HandleMessages is called once per batch, never concurrently for
//     one sending node. It owns what it is given, must not block for long,
//     and returns how many messages it dropped for an unknown group (they
//     are counted in Stats.UnknownGroupMessages).
//  10. Snapshots. SendSnapshot takes a MsgSnap and an io.ReadCloser body,
//     returns at once, and reports the outcome exactly once through
//     Handler.ReportSnapshot (err nil = the receiver accepted it); the caller
//     then calls RawNode.ReportSnapshot. The transport owns and closes the
//     body. The body travels in chunks of SnapshotChunkBytes on a connection
//     of its own, followed by its length and CRC-32C; the receiver's
//     HandleSnapshot reads it as an io.Reader that returns io.EOF only once
//     all of it arrived intact. Bodies are bounded by SnapshotBytesMax, a
//     transfer by SnapshotTimeout, and the snapshots in flight each way by
//     SnapshotsInflightMax (more are refused with ErrSnapshotsBusy).
//  11. Everything is bounded: queues, batches, messages, snapshot chunks and
//     bodies, concurrent snapshots, backoff, handshakes, and the
//     receiver's per-sender state. Idle groups cost nothing: there is no
//     per-group state, goroutine or timer anywhere in the package.
//  12. Stats returns counters (sent, received, batches, bytes, drops by
//     reason, unknown groups, streams, snapshots) and what waits in the
//     peers' queues now (QueuedMessages, QueuedBytes). Telemetry is wired
//     outside, from Stats (regionsvc's geolog.raft.* metrics); the package
//     imports none. A peer that stops reading (stuck process, or a network
//     that stops delivering without breaking the connection) blocks only
//     its own sender goroutine in gRPC's flow control: its queue fills to
//     its bound (and reserve) and further messages to it are dropped and
//     counted (DroppedQueueFull, DroppedReserveFull), while
//     every other peer's queue, and every group whose quorum is elsewhere,
//     goes on (TestStuckPeerDoesNotStallQuorum).
//  13. Security: ClientTLS (or ClientCredentials) secures outgoing
//     connections; the server side is the grpc.Server's (ServerTLS feeds
//     ServerOptions). Mutual TLS is a setting of those. AuthorizePeer binds
//     a stream's or snapshot's claimed sender to its caller (the node's
//     certificate): it is asked before the stream is accepted, so a caller
//     that may not speak for a node can neither deliver in its name nor
//     supersede its real stream (ErrUnauthorized, PERMISSION_DENIED).
//  14. Close stops the peers and discards their queues (without a report),
//     cancels and waits out outgoing snapshots, and waits out HandleMessages
//     calls in progress; none starts after. The grpc.Server, and with it the
//     inbound streams, belong to the caller.
//
// # The simulator's network
//
// MemNetwork has no goroutines and no timers. Send queues; the simulator
// calls Deliver(rng) to run one round: messages sent since the last round
// are routed in send order, each drawing its fate from the seeded generator
// (lost, delayed by whole rounds, duplicated, reordered), per link; then what
// is due is delivered in a fixed order, and losses to cuts and crashed nodes
// are reported as the gRPC transport reports a broken stream. Links can be
// cut one way or both (Cut, Partition), nodes removed and re-added as new
// incarnations (a restart). The same calls with a generator in the same
// state make the same deliveries, and LinkStats balance exactly (sent +
// duplicated = delivered + dropped + in flight), so a simulator can check
// the network's accounting after every step.
package raftnet
