package raftnet

import (
	"errors"
	"fmt"
	"io"

	"go.etcd.io/raft/v3/raftpb"
)

// NodeID names a node; it is the node's Raft peer id in every group it
// belongs to. 0 (raft.None) is never valid.
type NodeID uint64

// GroupID names one Raft group (one range of one stream in one region). The
// caller maps streams and ranges to group ids; 0 is never valid.
type GroupID uint64

// GroupMessage is one Raft message of one group.
type GroupMessage struct {
	Group   GroupID
	Message *raftpb.Message
}

// Transport moves Raft messages between nodes. Both implementations, the
// gRPC one (GRPCTransport) and the in-memory twin of the simulator
// (MemTransport), keep the contract in doc.go. All methods are safe for
// concurrent use.
type Transport interface {
	// Send queues msg of group for msg.To and returns at once; it never
	// blocks on the network. It does not retain msg. A non-nil error means
	// msg was dropped (and counted); the caller should then call
	// RawNode.ReportUnreachable(msg.To). Messages accepted here may still be
	// lost later; those lost for a known reason are reported through
	// Handler.ReportUnreachable.
	Send(group GroupID, msg *raftpb.Message) error
	// SendSnapshot starts moving a MsgSnap and its body to msg.To and returns
	// at once. The transport owns body from the call on and closes it exactly
	// once, also when SendSnapshot returns an error. When it returns nil, the
	// outcome is reported exactly once through Handler.ReportSnapshot.
	SendSnapshot(group GroupID, msg *raftpb.Message, body io.ReadCloser) error
	// Stats returns the counters so far.
	Stats() Stats
	// Close stops the transport; Send and SendSnapshot then fail with
	// ErrClosed.
	Close() error
}

// Handler is the node's side of a transport: it takes in what peers send and
// hears what became of what this node sent. The transport calls it from its
// own goroutines (the simulator's from inside MemNetwork.Deliver); no method
// may block for long or call back into the transport's Close. The usual
// implementation routes each call to the owning group's driver inbox and
// drops (and counts) when that inbox is full.
type Handler interface {
	// HandleMessages hands over one batch sent by node from, in the order it
	// was sent. Calls for one sending node never overlap. The handler owns
	// msgs and the messages in it. It returns how many of msgs it dropped
	// because their group is not hosted here; the transport counts them in
	// Stats.UnknownGroupMessages.
	HandleMessages(from NodeID, msgs []GroupMessage) (unknownGroupCount int)
	// HandleSnapshot takes in a MsgSnap of group sent by node from, with its
	// body. body returns io.EOF only after the whole body arrived intact
	// (length and CRC-32C checked); any other error means the snapshot is
	// unusable. A nil return acknowledges the snapshot to the sender; an
	// error (wrap ErrUnknownGroup for a group not hosted here) fails it.
	HandleSnapshot(from NodeID, group GroupID, msg *raftpb.Message, body io.Reader) error
	// ReportUnreachable says that messages this node had accepted for node
	// to, of the listed groups (each once, in no particular order), were lost
	// for a known reason (a stream broke, the peer was removed). The caller
	// calls RawNode.ReportUnreachable(to) in each group. groups is the
	// handler's to keep. It is called from a transport goroutine, or from
	// inside SetPeer and RemovePeer (gRPC) or Deliver (simulator).
	ReportUnreachable(to NodeID, groups []GroupID)
	// ReportSnapshot gives the outcome of a SendSnapshot that returned nil:
	// err is nil once the receiver acknowledged it. The caller calls
	// RawNode.ReportSnapshot(to, SnapshotFinish or SnapshotFailure).
	ReportSnapshot(to NodeID, group GroupID, err error)
}

// Stats are a transport's counters since it was created. Message and byte
// counts are of Raft messages (bytes = encoded raftpb.Message lengths, not
// counting framing); snapshot body bytes are counted apart.
type Stats struct {
	// MessagesSent counts messages handed to the network in a batch.
	MessagesSent uint64
	// BatchesSent counts batches (one RaftBatch on the wire; one
	// HandleMessages call in the simulator).
	BatchesSent uint64
	// BytesSent counts the encoded bytes of MessagesSent.
	BytesSent uint64
	// DroppedQueueFull counts messages Send refused because the peer's queue
	// was at its bound (Config.QueueMessagesMax, QueueBytesMax): appends,
	// proposals and the other messages that may not use the reserve.
	DroppedQueueFull uint64
	// DroppedReserveFull counts control messages (heartbeats, votes, their
	// answers, MsgTimeoutNow, MsgAppResp) Send refused because the peer's
	// queue was at its bound plus its reserve for them
	// (QueueReserveMessages, QueueReserveBytes).
	DroppedReserveFull uint64
	// ReserveAccepted counts control messages Send accepted while the peer's
	// queue was at its bound: each would have been dropped without the
	// reserve.
	ReserveAccepted uint64
	// DroppedUnreachable counts messages Send refused because the peer was
	// unknown, unreachable (backing off after a failure) or the transport was
	// closed.
	DroppedUnreachable uint64
	// DroppedStreamBroken counts accepted messages lost when a stream broke
	// or a peer was removed (queued, or in the batch being sent). Each was
	// reported through Handler.ReportUnreachable.
	DroppedStreamBroken uint64
	// DroppedInvalid counts messages Send refused as invalid or too large.
	DroppedInvalid uint64

	// MessagesReceived counts messages delivered to Handler.HandleMessages.
	MessagesReceived uint64
	// BatchesReceived counts HandleMessages calls.
	BatchesReceived uint64
	// BytesReceived counts the encoded bytes of MessagesReceived.
	BytesReceived uint64
	// UnknownGroupMessages counts received messages (and snapshots) the
	// handler dropped because their group is not hosted here.
	UnknownGroupMessages uint64
	// StreamsRejected counts inbound streams ended because what they carried
	// was malformed, misaddressed or superseded.
	StreamsRejected uint64

	// StreamsOpened counts outbound streams established (hello answered).
	StreamsOpened uint64
	// StreamsFailed counts outbound stream attempts and streams that ended
	// in an error.
	StreamsFailed uint64

	// SnapshotsSent counts snapshots the receiver acknowledged.
	SnapshotsSent uint64
	// SnapshotsSendFailed counts snapshots reported as failed to the sender.
	SnapshotsSendFailed uint64
	// SnapshotBytesSent counts body bytes of SnapshotsSent.
	SnapshotBytesSent uint64
	// SnapshotsReceived counts snapshots the handler accepted.
	SnapshotsReceived uint64
	// SnapshotsReceiveFailed counts inbound snapshots refused or failed.
	SnapshotsReceiveFailed uint64
	// SnapshotBytesReceived counts body bytes of SnapshotsReceived.
	SnapshotBytesReceived uint64

	// QueuedMessages and QueuedBytes are gauges, not counters: the
	// messages (and their encoded bytes) accepted by Send and not yet
	// handed to the network, over all peers, when Stats was called. Each
	// peer's share is bounded by Config.QueueMessagesMax plus
	// QueueReserveMessages and QueueBytesMax plus QueueReserveBytes (gRPC);
	// the simulator's transport, whose queues are the network's, reports 0.
	QueuedMessages, QueuedBytes uint64
}

// MessagesDropped is the number of messages Send accepted or refused that
// never reached the network.
func (s Stats) MessagesDropped() uint64 {
	return s.DroppedQueueFull + s.DroppedReserveFull + s.DroppedUnreachable + s.DroppedStreamBroken + s.DroppedInvalid
}

var (
	// ErrClosed is returned once the transport is closed.
	ErrClosed = errors.New("raftnet: transport closed")
	// ErrUnknownNode is returned by Send for a node with no address (gRPC)
	// or not on the network (simulator).
	ErrUnknownNode = errors.New("raftnet: unknown node")
	// ErrQueueFull is returned by Send when the peer's queue is at its bound.
	ErrQueueFull = errors.New("raftnet: peer queue full")
	// ErrReserveFull is returned by Send for a control message when the
	// peer's queue is at its bound plus its reserve for control messages.
	// It wraps ErrQueueFull.
	ErrReserveFull = fmt.Errorf("%w, reserve too", ErrQueueFull)
	// ErrPeerUnreachable is returned by Send while the peer is unreachable:
	// its last stream failed and the transport is backing off (gRPC), or the
	// link is cut (simulator).
	ErrPeerUnreachable = errors.New("raftnet: peer unreachable")
	// ErrInvalidMessage is returned for a message the transport will not
	// carry: zero group, wrong sender, local or unknown type, MsgSnap through
	// Send, or anything but MsgSnap through SendSnapshot.
	ErrInvalidMessage = errors.New("raftnet: invalid message")
	// ErrMessageTooLarge is returned for a message over MessageBytesMax.
	ErrMessageTooLarge = errors.New("raftnet: message too large")
	// ErrMalformed is what a receiver answers to bytes that do not decode or
	// do not validate; the stream ends.
	ErrMalformed = errors.New("raftnet: malformed input")
	// ErrWrongNode is what a receiver answers to a stream addressed to
	// another node id (the sender's address book is wrong).
	ErrWrongNode = errors.New("raftnet: addressed to another node")
	// ErrSuperseded ends an inbound stream once a newer one from the same
	// node has started.
	ErrSuperseded = errors.New("raftnet: stream superseded by a newer one")
	// ErrUnknownGroup is what a Handler wraps when a snapshot's group is not
	// hosted on its node.
	ErrUnknownGroup = errors.New("raftnet: unknown group")
	// ErrSnapshotsBusy is returned when the snapshots in flight are at their
	// bound; Raft retries the snapshot later.
	ErrSnapshotsBusy = errors.New("raftnet: too many snapshots in flight")
	// ErrSnapshotTooLarge fails a snapshot whose body exceeds
	// SnapshotBytesMax.
	ErrSnapshotTooLarge = errors.New("raftnet: snapshot body too large")
	// ErrSnapshotCorrupt fails a snapshot whose body arrived truncated, out
	// of sequence, or with a wrong length or CRC.
	ErrSnapshotCorrupt = errors.New("raftnet: snapshot body corrupt")
	// ErrUnauthorized is what a receiver answers to a stream or snapshot
	// whose caller may not speak for the node it names (Config.AuthorizePeer).
	ErrUnauthorized = errors.New("raftnet: caller may not speak for this node")
	// ErrDropped fails a snapshot the simulated network lost.
	ErrDropped = errors.New("raftnet: dropped by the network")
)
