package raftnet

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/geolog/geolog/internal/grpcdial"

	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"github.com/hashicorp/go-hclog"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
)

// GRPCTransport is the production Transport: one long-lived gRPC stream per
// destination node carries the messages of all groups, batched; its server
// side is registered on the node's grpc.Server (see Register). Its cost is
// per peer node (one queue, one sender goroutine, one connection), never
// per group.
type GRPCTransport struct {
	cfg    Config
	self   NodeID
	h      Handler
	logger hclog.Logger
	stats  counters

	// ctx is cancelled by Close; snapshot transfers run under it.
	ctx    context.Context
	cancel context.CancelFunc
	// closed makes Send and SendSnapshot fail fast once Close began.
	closed atomic.Bool

	// mu guards the address book, the peers and closing; snapshotsWG.Add
	// happens under it so that Close's Wait cannot race a late Add.
	mu          sync.RWMutex
	addrs       map[NodeID]string
	peers       map[NodeID]*peer
	snapshotsWG sync.WaitGroup

	// deliverMu is held for reading around every Handler.HandleMessages
	// call; Close takes it for writing to wait them out and set
	// deliverClosed, after which none starts.
	deliverMu     sync.RWMutex
	deliverClosed bool

	inboundMu sync.Mutex
	inbound   map[NodeID]*inboundPeer

	snapshotSendSlots chan struct{}
	snapshotRecvSlots chan struct{}
}

// inboundPeer orders deliveries from one sending node across its streams:
// delivery happens under mu, and only while gen is still the stream's own,
// so once a newer stream from that node is accepted nothing from an older
// one is delivered after it.
type inboundPeer struct {
	mu  sync.Mutex
	gen uint64
	// refusedGen is the generation EndInbound ended (0: none).
	refusedGen uint64
}

var _ Transport = (*GRPCTransport)(nil)

// NewGRPCTransport validates cfg and returns a transport with an empty
// address book. It starts no goroutine: a peer's sender starts with the first
// message for it.
func NewGRPCTransport(cfg Config) (*GRPCTransport, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &GRPCTransport{
		cfg:               cfg,
		self:              cfg.NodeID,
		h:                 cfg.Handler,
		logger:            cfg.Logger.Named("raftnet").With("node", uint64(cfg.NodeID)),
		ctx:               ctx,
		cancel:            cancel,
		addrs:             make(map[NodeID]string),
		peers:             make(map[NodeID]*peer),
		inbound:           make(map[NodeID]*inboundPeer),
		snapshotSendSlots: make(chan struct{}, cfg.SnapshotsInflightMax),
		snapshotRecvSlots: make(chan struct{}, cfg.SnapshotsInflightMax),
	}
	return t, nil
}

// Register registers the RaftTransport service on s, which the caller owns,
// serves and stops (the node serves Log and RaftTransport on one port). s
// should be built with ServerOptions.
func (t *GRPCTransport) Register(s grpc.ServiceRegistrar) {
	geologinternalv1.RegisterRaftTransportServer(s, &server{t: t})
}

// ServerOptions are the grpc.Server options the receiving side needs: a
// receive bound that fits a full batch or snapshot chunk, a keepalive policy
// that permits this transport's pings, and Config.ServerTLS as credentials
// when set. A server that also serves other services should take the larger
// of the receive bounds.
func (t *GRPCTransport) ServerOptions() []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(t.cfg.recvMsgBytesMax()),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             t.cfg.KeepaliveInterval / 2,
			PermitWithoutStream: true,
		}),
	}
	if t.cfg.ServerTLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(t.cfg.ServerTLS)))
	}
	return opts
}

// SetPeer sets the address (host:port) of node. Changing the address of a
// node with a live peer replaces the peer: its queue is dropped and reported
// through Handler.ReportUnreachable, and the next Send dials the new address.
func (t *GRPCTransport) SetPeer(node NodeID, addr string) error {
	if node == 0 || node == t.self {
		return fmt.Errorf("raftnet: SetPeer: invalid node %d", node)
	}
	if addr == "" {
		return fmt.Errorf("raftnet: SetPeer: empty address for node %d", node)
	}
	t.mu.Lock()
	if t.closed.Load() {
		t.mu.Unlock()
		return ErrClosed
	}
	old := t.addrs[node]
	t.addrs[node] = addr
	var stale *peer
	if old != addr {
		stale = t.peers[node]
		delete(t.peers, node)
	}
	t.mu.Unlock()
	if stale != nil {
		stale.stop(true)
	}
	return nil
}

// RemovePeer forgets node: its address, its connection, and its queue (dropped
// and reported through Handler.ReportUnreachable).
func (t *GRPCTransport) RemovePeer(node NodeID) {
	t.mu.Lock()
	p := t.peers[node]
	delete(t.peers, node)
	delete(t.addrs, node)
	t.mu.Unlock()
	if p != nil {
		p.stop(true)
	}
}

// Send implements Transport. The message is encoded here, on the caller's
// goroutine, so the queue's byte bound is exact and the caller may reuse msg
// at once.
func (t *GRPCTransport) Send(group GroupID, msg *raftpb.Message) error {
	err := t.send(group, msg)
	if err != nil {
		t.stats.countSendRefusal(err)
	}
	return err
}

func (t *GRPCTransport) send(group GroupID, msg *raftpb.Message) error {
	if t.closed.Load() {
		return ErrClosed
	}
	data, err := encodeMessage(t.self, group, msg, false, t.cfg.MessageBytesMax)
	if err != nil {
		return err
	}
	p, err := t.peer(NodeID(msg.GetTo()))
	if err != nil {
		return err
	}
	return p.enqueue(group, data, isControl(msg.GetType()))
}

// PeerDown reports whether the last attempt to open a stream to node failed
// and none has opened since: a failure detector far quicker than an election
// timeout for a peer whose process died (its port refuses connections at
// once) or stopped answering (the handshake times out). A node never
// contacted is not down. Drivers use it to stop pointing clients at a dead
// leader and to let its followers elect a successor without waiting out
// Raft's leader lease (RawNode.ForgetLeader).
func (t *GRPCTransport) PeerDown(node NodeID) bool {
	t.mu.RLock()
	p := t.peers[node]
	t.mu.RUnlock()
	return p != nil && p.down.Load()
}

// PeerKnown reports whether the transport has a verdict on node: a stream
// to it opened or failed to open, or it opened one to this node. A node
// this one never sent to has none, and PeerDown answers false for it; a
// caller choosing where to put data (the rebalancer picking a move's
// target) must not read that as "up". Probe starts the dial that gives a
// verdict.
func (t *GRPCTransport) PeerKnown(node NodeID) bool {
	t.mu.RLock()
	p := t.peers[node]
	t.mu.RUnlock()
	return p != nil && p.known.Load()
}

// Probe starts a sender towards node if it has none, so that the
// transport reaches a verdict on it (PeerKnown) without a message to send:
// the sender dials at once and keeps an idle stream, whose keepalive finds
// a later cut. A node without an address is left alone.
func (t *GRPCTransport) Probe(node NodeID) {
	if node == t.self {
		return
	}
	_, _ = t.peer(node)
}

// peer returns the peer for node, starting it on first use.
func (t *GRPCTransport) peer(node NodeID) (*peer, error) {
	t.mu.RLock()
	p := t.peers[node]
	t.mu.RUnlock()
	if p != nil {
		return p, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed.Load() {
		return nil, ErrClosed
	}
	if p := t.peers[node]; p != nil {
		return p, nil // started by a concurrent Send
	}
	addr, ok := t.addrs[node]
	if !ok {
		return nil, fmt.Errorf("%w: node %d has no address", ErrUnknownNode, node)
	}
	p, err := newPeer(t, node, addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPeerUnreachable, err)
	}
	t.peers[node] = p
	go p.run()
	return p, nil
}

// dial returns a client connection to addr with the transport's credentials,
// keepalive and reconnect backoff. It does not connect until first used.
func (t *GRPCTransport) dial(addr string) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	switch {
	case t.cfg.ClientCredentials != nil:
		creds = t.cfg.ClientCredentials
	case t.cfg.ClientTLS != nil:
		creds = credentials.NewTLS(t.cfg.ClientTLS)
	}
	// gRPC's own reconnect backoff follows ours; its default (1 s growing
	// to 120 s) would keep a restarted peer away for minutes.
	conn, err := grpcdial.Dial(addr, grpcdial.Config{
		Credentials:   creds,
		KeepaliveTime: t.cfg.KeepaliveInterval, KeepaliveTimeout: t.cfg.KeepaliveTimeout, PermitWithoutStream: true,
		BackoffMin: t.cfg.ReconnectBackoffMin, BackoffMax: t.cfg.ReconnectBackoffMax, BackoffMultiplier: 2,
		ConnectTimeout: t.cfg.HandshakeTimeout,
		SendBytesMax:   t.cfg.recvMsgBytesMax(),
		RecvBytesMax:   1 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("raftnet: dial %s: %w", addr, err)
	}
	return conn, nil
}

// Stats implements Transport.
func (t *GRPCTransport) Stats() Stats {
	s := t.stats.snapshot()
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, p := range t.peers {
		messages, bytes := p.queued()
		s.QueuedMessages += uint64(messages)
		s.QueuedBytes += uint64(bytes)
	}
	return s
}

// Close implements Transport. It stops every peer (queued messages are
// discarded without a report), cancels snapshot transfers and waits for
// them (their failures are reported while Close runs), and waits for
// HandleMessages calls in progress; none starts after Close returns.
// Inbound streams stay open until the caller stops its grpc.Server, but
// refuse everything. An inbound snapshot's body fails with ErrClosed at its
// next chunk. Close is idempotent.
func (t *GRPCTransport) Close() error {
	t.mu.Lock()
	if t.closed.Swap(true) {
		t.mu.Unlock()
		return nil
	}
	peers := t.peers
	t.peers = make(map[NodeID]*peer)
	t.mu.Unlock()

	t.deliverMu.Lock()
	t.deliverClosed = true
	t.deliverMu.Unlock()

	for _, p := range peers {
		p.stop(false)
	}
	t.cancel()
	t.snapshotsWG.Wait()
	return nil
}

// server is the RaftTransport service of one GRPCTransport.
type server struct {
	geologinternalv1.UnimplementedRaftTransportServer
	t *GRPCTransport
}

// Stream serves one inbound message stream: hello, then batches.
func (s *server) Stream(stream grpc.BidiStreamingServer[geologinternalv1.RaftBatch, geologinternalv1.RaftBatchAck]) error {
	err := s.t.serveStream(stream)
	if err != nil && err != io.EOF {
		return toStatus(err)
	}
	return nil
}

// Snapshot serves one inbound snapshot.
func (s *server) Snapshot(stream grpc.ClientStreamingServer[geologinternalv1.SnapshotChunk, geologinternalv1.SnapshotAck]) error {
	return toStatus(s.t.receiveSnapshot(stream))
}

func (t *GRPCTransport) serveStream(stream grpc.BidiStreamingServer[geologinternalv1.RaftBatch, geologinternalv1.RaftBatchAck]) error {
	if t.closed.Load() {
		return ErrClosed
	}
	batch := new(geologinternalv1.RaftBatch)
	if err := stream.RecvMsg(batch); err != nil {
		return err
	}
	from := NodeID(batch.GetFromNode())
	switch {
	case from == 0 || from == t.self || len(batch.GetMessages()) != 0:
		t.stats.streamsRejected.Add(1)
		return fmt.Errorf("%w: hello from node %d with %d messages", ErrMalformed, from, len(batch.GetMessages()))
	case NodeID(batch.GetToNode()) != t.self:
		t.stats.streamsRejected.Add(1)
		t.logger.Warn("refusing stream addressed to another node", "from", uint64(from), "to", batch.GetToNode())
		return fmt.Errorf("%w: stream for node %d reached node %d", ErrWrongNode, batch.GetToNode(), t.self)
	}
	// Before acceptInbound: a stream accepted supersedes the node's
	// current one, which a caller that may not speak for it must not do.
	if err := t.authorize(stream.Context(), from); err != nil {
		t.stats.streamsRejected.Add(1)
		return err
	}
	in, gen, err := t.acceptInbound(from)
	if err != nil {
		t.stats.streamsRejected.Add(1)
		return err
	}
	if err := stream.Send(&geologinternalv1.RaftBatchAck{NodeId: uint64(t.self)}); err != nil {
		return err
	}
	t.logger.Debug("inbound stream open", "from", uint64(from))
	t.mu.RLock()
	if p := t.peers[from]; p != nil {
		p.heardFrom()
	}
	t.mu.RUnlock()
	lim := batchLimits{messagesMax: t.cfg.BatchMessagesMax, messageBytesMax: t.cfg.MessageBytesMax, check: t.cfg.CheckMessage}
	for {
		batch.Reset()
		if err := stream.RecvMsg(batch); err != nil {
			return err
		}
		msgs, size, err := decodeBatch(batch, from, t.self, lim)
		if err != nil {
			t.stats.streamsRejected.Add(1)
			t.logger.Warn("refusing inbound stream", "from", uint64(from), "error", err)
			return err
		}
		if err := t.deliver(in, gen, from, msgs, size); err != nil {
			t.stats.streamsRejected.Add(1)
			return err
		}
	}
}

// EndInbound ends the current inbound stream from node from at its next
// batch, as malformed (INVALID_ARGUMENT), delivering nothing more of it:
// for the Handler's owner, when a member found a message it delivered
// invalid (the transport checks the form of messages, a member their
// consistency with its log). The node's next stream is accepted as usual.
func (t *GRPCTransport) EndInbound(from NodeID) {
	t.inboundMu.Lock()
	in := t.inbound[from]
	t.inboundMu.Unlock()
	if in == nil {
		return
	}
	in.mu.Lock()
	in.refusedGen = in.gen
	in.mu.Unlock()
}

// authorize asks Config.AuthorizePeer whether the caller may speak for
// node from.
func (t *GRPCTransport) authorize(ctx context.Context, from NodeID) error {
	if t.cfg.AuthorizePeer == nil {
		return nil
	}
	if err := t.cfg.AuthorizePeer(ctx, from); err != nil {
		t.logger.Warn("refusing inbound stream: the caller may not speak for the node it names", "from", uint64(from), "error", err)
		return fmt.Errorf("%w: node %d: %v", ErrUnauthorized, from, err)
	}
	return nil
}

// acceptInbound makes a new stream from node from the current one and
// returns its generation.
func (t *GRPCTransport) acceptInbound(from NodeID) (*inboundPeer, uint64, error) {
	t.inboundMu.Lock()
	in := t.inbound[from]
	if in == nil {
		if len(t.inbound) >= inboundPeersMax {
			t.inboundMu.Unlock()
			return nil, 0, fmt.Errorf("%w: more than %d sending nodes", ErrMalformed, inboundPeersMax)
		}
		in = new(inboundPeer)
		t.inbound[from] = in
	}
	t.inboundMu.Unlock()
	// Taking in.mu waits for a delivery of the older stream in progress;
	// after the bump, that stream delivers nothing more.
	in.mu.Lock()
	in.gen++
	gen := in.gen
	in.mu.Unlock()
	return in, gen, nil
}

// deliver hands one decoded batch to the handler, unless the stream was
// superseded or the transport closed.
func (t *GRPCTransport) deliver(in *inboundPeer, gen uint64, from NodeID, msgs []GroupMessage, size int) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.gen != gen {
		return fmt.Errorf("%w: from node %d", ErrSuperseded, from)
	}
	if in.refusedGen == gen {
		t.logger.Warn("ending inbound stream: a member refused a message it carried", "from", uint64(from))
		return fmt.Errorf("%w: a member refused a message of the stream from node %d", ErrMalformed, from)
	}
	t.deliverMu.RLock()
	defer t.deliverMu.RUnlock()
	if t.deliverClosed {
		return ErrClosed
	}
	t.stats.messagesReceived.Add(uint64(len(msgs)))
	t.stats.batchesReceived.Add(1)
	t.stats.bytesReceived.Add(uint64(size))
	if unknown := t.h.HandleMessages(from, msgs); unknown > 0 {
		t.stats.unknownGroupMessages.Add(uint64(unknown))
	}
	return nil
}
