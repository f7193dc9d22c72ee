package raftnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/geolog/geolog/internal/backoff"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"github.com/hashicorp/go-hclog"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
)

// peerState is where a peer's sender is in its connect cycle.
type peerState int

const (
	// stateConnecting: a stream is being opened; Send queues.
	stateConnecting peerState = iota
	// stateConnected: the stream is up; Send queues, the sender drains.
	stateConnected
	// stateBackoff: the last stream failed; Send refuses with
	// ErrPeerUnreachable until the next attempt begins.
	stateBackoff
)

// queuedMessage is one encoded message waiting for its peer's stream.
type queuedMessage struct {
	group GroupID
	data  []byte
}

// isControl reports whether a message of type typ may use a peer queue's
// reserve (Config.QueueReserveMessages, QueueReserveBytes) once the queue is
// at its bound: the small messages that keep leadership and elections alive
// and acknowledge appends. None carries entries, so each is tens of bytes.
// MsgAppResp is one: a follower's queue to its leader also carries the
// appends of the ranges the follower leads, and an acknowledgement lost to
// that bulk stalls the leader's commit and its window of appends in flight
// until a heartbeat round recovers it; there is at most one per append
// received, so they cannot flood the reserve. Client-driven messages
// (MsgProp, MsgReadIndex and its answer, MsgTransferLeader) are not: their
// volume is the clients', and they would crowd out the heartbeats.
func isControl(typ raftpb.MessageType) bool {
	switch typ {
	case raftpb.MsgHeartbeat, raftpb.MsgHeartbeatResp,
		raftpb.MsgVote, raftpb.MsgVoteResp, raftpb.MsgPreVote, raftpb.MsgPreVoteResp,
		raftpb.MsgTimeoutNow, raftpb.MsgAppResp:
		return true
	}
	return false
}

// peer is the outbound side towards one node: a bounded FIFO queue filled
// by Send and one sender goroutine (run) that owns the stream and drains the
// queue into batches. While the sender is busy in a Send on the stream, new
// messages pile up and leave together in the next batch: batching needs no
// timer.
type peer struct {
	t      *GRPCTransport
	id     NodeID
	addr   string
	logger hclog.Logger
	conn   *grpc.ClientConn
	client geologinternalv1.RaftTransportClient

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed when run returns
	wake   chan struct{} // capacity 1: "the queue is not empty"
	redial chan struct{} // capacity 1: "the peer is up: end the backoff"

	// down is set once a stream to the peer failed to open after the last
	// one that worked (or before any worked): the peer's process is gone,
	// stopped or cut off. Cleared when a stream opens. See PeerDown.
	down atomic.Bool
	// known is set once a stream to the peer opened or failed to open, or
	// the peer opened one to this node: from then on down is a verdict.
	// Before, the peer is neither up nor down as far as this node knows.
	known atomic.Bool

	mu         sync.Mutex
	state      peerState
	stopped    bool
	queue      []queuedMessage
	queueBytes int
	// lostAtStop is the batch that was being sent when the peer was
	// stopped; run leaves it for stop to report.
	lostAtStop []queuedMessage
}

func newPeer(t *GRPCTransport, id NodeID, addr string) (*peer, error) {
	conn, err := t.dial(addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(t.ctx)
	return &peer{
		t:      t,
		id:     id,
		addr:   addr,
		logger: t.logger.With("peer", uint64(id), "addr", addr),
		conn:   conn,
		client: geologinternalv1.NewRaftTransportClient(conn),
		ctx:    ctx,
		cancel: cancel,
		done:   make(chan struct{}),
		wake:   make(chan struct{}, 1),
		redial: make(chan struct{}, 1),
		state:  stateConnecting,
	}, nil
}

// enqueue appends one encoded message unless the peer is backing off or the
// queue is at a bound: QueueMessagesMax and QueueBytesMax for any message,
// those plus the reserve for a control message (isControl), so that
// heartbeats and votes still get through a queue full of appends, and the
// queue still has a bound. The queue stays one FIFO: a control message
// waits behind the appends queued before it, but it is not dropped. It
// never blocks beyond the queue lock.
func (p *peer) enqueue(group GroupID, data []byte, control bool) error {
	p.mu.Lock()
	switch {
	case p.stopped:
		p.mu.Unlock()
		return fmt.Errorf("%w: node %d is being removed", ErrPeerUnreachable, p.id)
	case p.state == stateBackoff:
		p.mu.Unlock()
		return fmt.Errorf("%w: node %d", ErrPeerUnreachable, p.id)
	case p.atBound(len(data), 0, 0):
		if !control {
			p.mu.Unlock()
			return fmt.Errorf("%w: node %d", ErrQueueFull, p.id)
		}
		if p.atBound(len(data), p.t.cfg.QueueReserveMessages, p.t.cfg.QueueReserveBytes) {
			p.mu.Unlock()
			return fmt.Errorf("%w: node %d, and its reserve for control messages too", ErrReserveFull, p.id)
		}
		p.t.stats.reserveAccepted.Add(1)
	}
	p.queue = append(p.queue, queuedMessage{group: group, data: data})
	p.queueBytes += len(data)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default: // already signalled
	}
	return nil
}

// atBound reports whether a message of size bytes finds the queue at its
// bound plus extra messages and extraBytes; p.mu held. A message larger
// than the byte bound is still queued on an empty queue.
func (p *peer) atBound(size, extra, extraBytes int) bool {
	return len(p.queue) >= p.t.cfg.QueueMessagesMax+extra ||
		len(p.queue) > 0 && p.queueBytes+size > p.t.cfg.QueueBytesMax+extraBytes
}

// queued returns the messages and bytes waiting in the queue.
func (p *peer) queued() (messages, bytes int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue), p.queueBytes
}

// take moves the oldest queued messages, up to the batch bounds, to dst.
func (p *peer) take(dst []queuedMessage) []queuedMessage {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, size := 0, 0
	for n < len(p.queue) && n < p.t.cfg.BatchMessagesMax {
		l := len(p.queue[n].data)
		if n > 0 && size+l > p.t.cfg.BatchBytesMax {
			break
		}
		size += l
		n++
	}
	dst = append(dst, p.queue[:n]...)
	rest := copy(p.queue, p.queue[n:])
	clear(p.queue[rest:]) // let the sent bytes go
	p.queue = p.queue[:rest]
	p.queueBytes -= size
	return dst
}

// fail moves the peer to backoff and returns the queue, now dropped.
func (p *peer) fail() []queuedMessage {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.state = stateBackoff
	q := p.queue
	p.queue, p.queueBytes = nil, 0
	return q
}

func (p *peer) setState(s peerState) {
	p.mu.Lock()
	p.state = s
	p.mu.Unlock()
}

// run is the sender goroutine: open a stream, drain the queue into it until
// it fails, drop and report what was lost, back off, repeat, until stopped.
func (p *peer) run() {
	defer close(p.done)
	// failures counts the streams that failed since the last one that
	// stayed up: the backoff's attempt.
	failures := 0
	for {
		start := time.Now()
		established, lost, err := p.session()
		if p.ctx.Err() != nil {
			p.mu.Lock()
			p.lostAtStop = lost
			p.mu.Unlock()
			return
		}
		p.t.stats.streamsFailed.Add(1)
		lost = append(lost, p.fail()...)
		p.report(lost)
		if !established {
			p.down.Store(true)
			p.known.Store(true)
		}
		switch {
		case established:
			// Only a stream that stayed up a while resets the backoff, so
			// that a peer that answers the hello and then ends every stream
			// at once is not redialled at the fastest pace forever.
			if time.Since(start) >= p.t.cfg.ReconnectBackoffMax {
				failures = 0
			}
			p.logger.Warn("stream to peer broke", "error", err, "dropped", len(lost))
		case errors.Is(err, ErrWrongNode):
			// The address book is wrong: retrying will not fix it, but the
			// caller may, so keep trying at the slowest pace.
			failures = slowestAttempt
			p.logger.Error("peer address reaches another node", "error", err, "dropped", len(lost))
		default:
			p.logger.Debug("cannot open stream to peer", "error", err, "dropped", len(lost))
		}
		// Jittered so that nodes that lost a peer together do not redial it
		// in lockstep. The process-wide generator is fine here: this is I/O
		// timing in a driver, not a deterministic core (the simulator uses
		// MemNetwork, which has no timers).
		timer := time.NewTimer(backoff.Delay(failures, p.t.cfg.ReconnectBackoffMin, p.t.cfg.ReconnectBackoffMax, nil))
		failures = min(failures+1, slowestAttempt)
		select {
		case <-timer.C:
		case <-p.redial:
			timer.Stop()
			failures = 0
		case <-p.ctx.Done():
			timer.Stop()
			return
		}
		p.setState(stateConnecting)
	}
}

// heardFrom is called when the peer opened a stream to this node: it is up,
// so it is no longer down and a sender in backoff redials at once (a
// restarted node gets its followers' answers without waiting out a backoff
// that grew while it was gone).
func (p *peer) heardFrom() {
	p.down.Store(false)
	p.known.Store(true)
	select {
	case p.redial <- struct{}{}:
	default:
	}
}

// report counts lost messages and tells the handler which groups lost some.
func (p *peer) report(lost []queuedMessage) {
	if len(lost) == 0 {
		return
	}
	p.t.stats.droppedStreamBroken.Add(uint64(len(lost)))
	groups := uniqueGroups(lost, func(q queuedMessage) GroupID { return q.group })
	p.t.h.ReportUnreachable(p.id, groups)
}

// session opens one stream, says hello, then sends batches until the stream
// fails or the peer stops. It returns whether the hello was answered, the
// batch that was being sent when it failed (lost: it may or may not have
// arrived), and why it ended.
func (p *peer) session() (established bool, lost []queuedMessage, err error) {
	ctx, cancel := context.WithCancel(p.ctx)
	defer cancel()
	// The handshake is bounded by cancelling the stream; once the hello is
	// answered the timer is stopped, and if it fired first, Stop says so and
	// the stream is dead anyway.
	timer := time.AfterFunc(p.t.cfg.HandshakeTimeout, cancel)
	stream, err := p.client.Stream(ctx)
	if err != nil {
		timer.Stop()
		return false, nil, fromStatus(err)
	}
	self := uint64(p.t.self)
	if err := stream.Send(&geologinternalv1.RaftBatch{FromNode: self, ToNode: uint64(p.id)}); err != nil {
		timer.Stop()
		return false, nil, streamError(stream, err)
	}
	ack, err := stream.Recv()
	if !timer.Stop() {
		return false, nil, fmt.Errorf("%w: handshake with node %d timed out after %s",
			ErrPeerUnreachable, p.id, p.t.cfg.HandshakeTimeout)
	}
	if err != nil {
		return false, nil, fromStatus(err)
	}
	if NodeID(ack.GetNodeId()) != p.id {
		return false, nil, fmt.Errorf("%w: %s answered as node %d, not %d", ErrWrongNode, p.addr, ack.GetNodeId(), p.id)
	}
	p.setState(stateConnected)
	p.down.Store(false)
	p.known.Store(true)
	p.t.stats.streamsOpened.Add(1)
	p.logger.Debug("stream to peer open")

	// The server sends nothing after the ack, so a Recv returns only when
	// the stream ends: the server refused a batch, was superseded or closed,
	// or the connection broke. Waiting for it on a goroutine of its own
	// notices an idle stream's end at once, so the peer reconnects before
	// the next message instead of losing it to a dead stream. It is the only
	// Recv from here on; the deferred cancel ends it, and the session waits
	// for it so that a stopped peer leaves no goroutine behind.
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	recvDone := false
	defer func() {
		cancel()
		if !recvDone {
			<-ended
		}
	}()
	endErr := func(err error) error {
		recvDone = true
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%w: stream ended by peer", ErrPeerUnreachable)
		}
		return fromStatus(err)
	}

	batch := &geologinternalv1.RaftBatch{FromNode: self, ToNode: uint64(p.id)}
	var wire []*geologinternalv1.GroupMessage // reused: SendMsg encodes before returning
	var items []queuedMessage
	for {
		clear(items)
		items = p.take(items[:0])
		if len(items) == 0 {
			select {
			case <-p.wake:
				continue
			case err := <-ended:
				return true, nil, endErr(err)
			case <-ctx.Done():
				return true, nil, ctx.Err()
			}
		}
		for len(wire) < len(items) {
			wire = append(wire, new(geologinternalv1.GroupMessage))
		}
		batch.Messages = wire[:len(items)]
		size := 0
		for i, it := range items {
			wire[i].GroupId = uint64(it.group)
			wire[i].Message = it.data
			size += len(it.data)
		}
		err := stream.Send(batch)
		for i := range items {
			wire[i].Message = nil
		}
		if err != nil {
			if errors.Is(err, io.EOF) { // the stream ended: its status says why
				return true, items, endErr(<-ended)
			}
			return true, items, fromStatus(err)
		}
		p.t.stats.messagesSent.Add(uint64(len(items)))
		p.t.stats.batchesSent.Add(1)
		p.t.stats.bytesSent.Add(uint64(size))
	}
}

// streamError turns the error of a Send on a client stream into the
// stream's real outcome: Send reports io.EOF when the server ended the
// stream, and the status is then what Recv returns.
func streamError(stream grpc.BidiStreamingClient[geologinternalv1.RaftBatch, geologinternalv1.RaftBatchAck], err error) error {
	if errors.Is(err, io.EOF) {
		if _, rerr := stream.Recv(); rerr != nil && !errors.Is(rerr, io.EOF) {
			return fromStatus(rerr)
		}
		return fmt.Errorf("%w: stream ended by peer", ErrPeerUnreachable)
	}
	return fromStatus(err)
}

// stop ends the sender, closes the connection, and drops the queue and the
// batch in flight; with report they are reported as unreachable.
func (p *peer) stop(report bool) {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	p.cancel()
	<-p.done
	if err := p.conn.Close(); err != nil {
		p.logger.Debug("close connection", "error", err)
	}
	p.mu.Lock()
	lost := append(p.lostAtStop, p.queue...)
	p.lostAtStop, p.queue, p.queueBytes = nil, nil, 0
	p.mu.Unlock()
	if report {
		p.report(lost)
	} else {
		p.t.stats.droppedStreamBroken.Add(uint64(len(lost)))
	}
}

// slowestAttempt is a backoff attempt past which the wait no longer grows
// (ReconnectBackoffMax, however small ReconnectBackoffMin).
const slowestAttempt = 64
