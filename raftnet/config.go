package raftnet

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/credentials"
)

// snapshotChunkBytesLimit is the largest body chunk any receiver accepts,
// whatever the sender's Config says; Config.SnapshotChunkBytes must not
// exceed it. A constant of the wire (raft.proto says so).
const snapshotChunkBytesLimit = 4 << 20

// inboundPeersMax bounds how many distinct sending nodes a receiver keeps
// ordering state for (one small struct each). A region has a handful of
// nodes; the bound only stops a misbehaving client from growing the map.
const inboundPeersMax = 4096

// Config configures a GRPCTransport. Zero values take the documented
// defaults; NewGRPCTransport validates the rest. Limits that a receiver
// enforces (BatchMessagesMax, MessageBytesMax, SnapshotBytesMax) must be
// the same on every node of a region.
type Config struct {
	// NodeID is this node's Raft peer id. Required.
	NodeID NodeID
	// Handler takes in what peers send and hears outcomes. Required.
	Handler Handler
	// ClientTLS configures outgoing connections: RootCAs to verify peers,
	// and Certificates to present for mutual TLS. Default: plaintext.
	ClientTLS *tls.Config
	// ClientCredentials, when set, secure outgoing connections instead of
	// ClientTLS (credentials that reload their certificates, for example).
	ClientCredentials credentials.TransportCredentials
	// AuthorizePeer, when set, is asked whether the caller of an inbound
	// stream or snapshot (its certificate is in ctx) may speak for node
	// from, before anything of it is accepted. An error refuses it with
	// ErrUnauthorized (PERMISSION_DENIED). Default: everyone may.
	AuthorizePeer func(ctx context.Context, from NodeID) error
	// ServerTLS, when set, makes ServerOptions include it as the server's
	// credentials (set ClientAuth to tls.RequireAndVerifyClientCert for
	// mutual TLS). Leave it nil when the grpc.Server is built elsewhere with
	// the node's own credentials (one port serving Log and RaftTransport).
	ServerTLS *tls.Config
	// Logger defaults to a null logger; the transport names it "raftnet".
	Logger hclog.Logger
	// CheckMessage, if set, validates what the transport cannot: the
	// payload of every message received (a Raft member's entries), after
	// the checks of contract step 8 and before the Handler sees it. It
	// runs on the receiving goroutine; an error ends the stream as
	// malformed (ErrMalformed), as any other invalid batch. Default: no
	// further check.
	CheckMessage func(group GroupID, m *raftpb.Message) error

	// QueueMessagesMax bounds the messages queued for one peer, default
	// 4096. Send refuses more with ErrQueueFull.
	QueueMessagesMax int
	// QueueBytesMax bounds the encoded bytes queued for one peer, default
	// 64 MiB. A single message larger than this is still queued on an empty
	// queue, so that MessageBytesMax alone bounds message size.
	QueueBytesMax int
	// QueueReserveMessages and QueueReserveBytes, default 1024 and 1 MiB,
	// are a peer queue's headroom for control messages (heartbeats, votes
	// and pre-votes, their answers, MsgTimeoutNow, MsgAppResp): once the
	// queue is at QueueMessagesMax or QueueBytesMax, Send refuses anything
	// else with ErrQueueFull but still queues these until the queue is at
	// the bounds plus the reserve (then ErrReserveFull). A slow peer, or a
	// large catch-up, then costs appends, not leadership or elections.
	QueueReserveMessages, QueueReserveBytes int
	// BatchMessagesMax bounds the messages in one RaftBatch, default 1024.
	BatchMessagesMax int
	// BatchBytesMax bounds the encoded message bytes in one RaftBatch,
	// default 4 MiB; a single larger message travels alone.
	BatchBytesMax int
	// MessageBytesMax bounds one encoded Raft message, default 32 MiB (an
	// append batch of 16 MiB is one Raft entry).
	MessageBytesMax int

	// HandshakeTimeout bounds opening a stream and its hello, default 5 s.
	HandshakeTimeout time.Duration
	// ReconnectBackoffMin is the first wait after a failed stream, default
	// 50 ms; each further failure doubles it up to ReconnectBackoffMax,
	// default 5 s. Each wait is jittered to [w/2, w). An established stream
	// resets it.
	ReconnectBackoffMin time.Duration
	ReconnectBackoffMax time.Duration
	// KeepaliveInterval is how often an idle connection is pinged, default
	// 10 s; a ping unanswered for KeepaliveTimeout (default 5 s) breaks it.
	// The server must permit it: see ServerOptions.
	KeepaliveInterval time.Duration
	KeepaliveTimeout  time.Duration

	// SnapshotChunkBytes is the body chunk size, default 1 MiB, at most
	// 4 MiB.
	SnapshotChunkBytes int
	// SnapshotBytesMax bounds one snapshot body, default 4 GiB; both sides
	// enforce it.
	SnapshotBytesMax int64
	// SnapshotTimeout bounds one snapshot transfer, from dial to
	// acknowledgement, default 10 min.
	SnapshotTimeout time.Duration
	// SnapshotsInflightMax bounds the snapshots being sent at once and,
	// separately, those being received, default 4. More are refused with
	// ErrSnapshotsBusy.
	SnapshotsInflightMax int
}

func (c *Config) setDefaults() error {
	if c.NodeID == 0 {
		return errors.New("raftnet: Config.NodeID is required")
	}
	if c.Handler == nil {
		return errors.New("raftnet: Config.Handler is required")
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	setInt(&c.QueueMessagesMax, 4096)
	setInt(&c.QueueBytesMax, 64<<20)
	setInt(&c.QueueReserveMessages, 1024)
	setInt(&c.QueueReserveBytes, 1<<20)
	setInt(&c.BatchMessagesMax, 1024)
	setInt(&c.BatchBytesMax, 4<<20)
	setInt(&c.MessageBytesMax, 32<<20)
	setDuration(&c.HandshakeTimeout, 5*time.Second)
	setDuration(&c.ReconnectBackoffMin, 50*time.Millisecond)
	setDuration(&c.ReconnectBackoffMax, 5*time.Second)
	setDuration(&c.KeepaliveInterval, 10*time.Second)
	setDuration(&c.KeepaliveTimeout, 5*time.Second)
	setInt(&c.SnapshotChunkBytes, 1<<20)
	if c.SnapshotBytesMax <= 0 {
		c.SnapshotBytesMax = 4 << 30
	}
	setDuration(&c.SnapshotTimeout, 10*time.Minute)
	setInt(&c.SnapshotsInflightMax, 4)

	if c.ReconnectBackoffMin > c.ReconnectBackoffMax {
		return fmt.Errorf("raftnet: ReconnectBackoffMin %s exceeds ReconnectBackoffMax %s", c.ReconnectBackoffMin, c.ReconnectBackoffMax)
	}
	if c.SnapshotChunkBytes > snapshotChunkBytesLimit {
		return fmt.Errorf("raftnet: SnapshotChunkBytes %d exceeds the wire limit %d", c.SnapshotChunkBytes, snapshotChunkBytesLimit)
	}
	return nil
}

func setInt(v *int, def int) {
	if *v <= 0 {
		*v = def
	}
}

func setDuration(v *time.Duration, def time.Duration) {
	if *v <= 0 {
		*v = def
	}
}

// recvMsgBytesMax is the largest gRPC message a receiver must accept: the
// larger of a batch at its byte bound and a lone message at MessageBytesMax
// (the sender never mixes the two), plus framing of up to BatchMessagesMax
// messages (group id and length: at most 24 bytes each) and of the batch;
// or one snapshot chunk.
func (c *Config) recvMsgBytesMax() int {
	const framingBytes = 1024
	batch := max(c.BatchBytesMax, c.MessageBytesMax) + c.BatchMessagesMax*24 + framingBytes
	return max(batch, snapshotChunkBytesLimit+framingBytes)
}
