package replicator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
)

// errHandshakeTimeout reports a mirror that did not answer the open in
// time.
var errHandshakeTimeout = errors.New("replicator: no answer to the open")

// errNoAddress reports an empty destination address list.
var errNoAddress = errors.New("replicator: no destination address")

// session is one Replicate stream of a Task: a receiver goroutine (run)
// that opens the stream, sends the open and reports every answer to the
// task's inbox, and a sender goroutine that compresses and sends what Run
// queues. Run ends a session by cancelling it and waiting for both.
type session struct {
	gen uint64
	// ctx is the stream's: cancelled by Run ending the session, and by the
	// handshake timer.
	ctx    context.Context
	cancel context.CancelFunc
	// ended is closed by Run when it ends the session: reports then have
	// no reader. (Not ctx: a session cancelled by its handshake timer
	// still reports why.)
	ended chan struct{}
	sendq chan outgoing
	wg    sync.WaitGroup
	// stream is set by run before it reports evConnected, and read by the
	// sender, which Run starts on that report.
	stream   ReplicateStream
	timedOut atomic.Bool
}

// startSession opens a stream for a Connect action.
func (t *Task) startSession(ctx context.Context, a Action) {
	addr := t.pickAddr(a)
	t.addr = addr
	if addr == "" {
		t.core.StreamFailed(errNoAddress)
		return
	}
	t.gen++
	s := &session{gen: t.gen, sendq: make(chan outgoing, t.core.cfg.WindowRequestsMax+1), ended: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(ctx)
	t.sess = s
	open := t.request(nil)
	open.Open = &geologinternalv1.ReplicateOpen{
		Stream:            t.cfg.Stream,
		Range:             t.cfg.Range,
		SourceRegion:      t.cfg.SourceRegion,
		DestinationRegion: t.cfg.DestinationRegion,
		HomeEpoch:         t.cfg.Epoch,
	}
	s.wg.Add(1)
	go s.run(t, addr, open)
}

// endSession cancels the current session and waits for its goroutines.
func (t *Task) endSession() {
	if t.sess == nil {
		return
	}
	t.ships.failed(nil)
	close(t.sess.ended)
	t.sess.cancel()
	t.sess.wg.Wait()
	t.sess = nil
}

func (s *session) post(t *Task, ev taskEvent) {
	ev.gen = s.gen
	select {
	case t.inbox <- ev:
	case <-s.ended:
	}
}

// run opens the stream and receives until it ends.
func (s *session) run(t *Task, addr string, open *geologinternalv1.ReplicateRequest) {
	defer s.wg.Done()
	timer := time.AfterFunc(t.cfg.HandshakeTimeout, func() {
		s.timedOut.Store(true)
		s.cancel()
	})
	stream, err := t.cfg.Dialer.Open(s.ctx, addr)
	if err != nil {
		timer.Stop()
		if s.timedOut.Load() {
			err = fmt.Errorf("%w within %s: %w", errHandshakeTimeout, t.cfg.HandshakeTimeout, err)
		}
		s.post(t, taskEvent{kind: evFailed, err: fmt.Errorf("open stream to %s: %w", addr, err)})
		return
	}
	var resp *geologinternalv1.ReplicateResponse
	if err = stream.Send(open); err == nil {
		resp, err = stream.Recv()
	} else if _, rerr := stream.Recv(); rerr != nil {
		err = rerr // Send reports io.EOF; Recv has the cause
	}
	timer.Stop()
	if err != nil {
		if s.timedOut.Load() {
			err = fmt.Errorf("%w within %s from %s", errHandshakeTimeout, t.cfg.HandshakeTimeout, addr)
		}
		s.post(t, taskEvent{kind: evFailed, err: err})
		return
	}
	s.stream = stream
	s.post(t, taskEvent{kind: evConnected, resp: resp})
	if resp.GetError() != nil {
		return // the server ends the stream after a refused open
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			s.post(t, taskEvent{kind: evFailed, err: err})
			return
		}
		s.post(t, taskEvent{kind: evResponse, resp: resp})
	}
}

// startSender starts the sender once the stream is open.
func (s *session) startSender(t *Task) {
	s.wg.Add(1)
	go s.sender(t)
}

// sender compresses and sends queued requests in order. A failed Send ends
// it; the receiver then reports why the stream ended.
func (s *session) sender(t *Task) {
	defer s.wg.Done()
	for {
		var o outgoing
		select {
		case <-s.ctx.Done():
			return
		case o = <-s.sendq:
		}
		if b := o.req.GetBatch(); b != nil {
			b.Payload, b.Compression = compress(t.enc, t.cfg.Compression, o.frames)
			t.mu.Lock()
			t.stats.Batches++
			t.stats.FrameBytes += uint64(len(o.frames))
			t.stats.WireBytes += uint64(len(b.Payload))
			t.mu.Unlock()
		}
		if err := s.stream.Send(o.req); err != nil {
			return
		}
	}
}
