package wan

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// conn is one proxied connection: the accepted client socket, the upstream
// socket once dialled, and a pipe per direction. Four goroutines run it: a
// reader and a writer per direction (serve's own goroutine is the last
// writer).
type conn struct {
	link   *Link
	id     uint64
	client *net.TCPConn
	// ctx is cancelled by abort; every wait of the connection's goroutines
	// selects on it, and it cancels a dial in progress.
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	upstream *net.TCPConn
	pipes    [2]*pipe
	aborted  bool // abort ran, or serve closed the sockets
}

func newConn(l *Link, client *net.TCPConn, id uint64) *conn {
	ctx, cancel := context.WithCancel(context.Background())
	return &conn{link: l, id: id, client: client, ctx: ctx, cancel: cancel}
}

// serve holds the connection while the link is cut, dials upstream, runs the
// two pipes and closes both sockets when they end.
func (c *conn) serve() {
	l := c.link
	defer l.wg.Done()
	defer l.forget(c)
	defer c.cancel()
	// A new connection on a blackholed link is held before the dial, as a
	// SYN into a partition is: its bytes wait in the socket buffers.
	if !l.waitOpen(c.ctx.Done()) {
		c.abort()
		return
	}
	d := net.Dialer{Timeout: l.cfg.DialTimeout}
	raw, err := d.DialContext(c.ctx, "tcp", l.cfg.Upstream)
	if err != nil {
		if c.ctx.Err() == nil {
			l.dialErrors.Add(1)
			l.logger.Debug("upstream dial failed", "conn", c.id, "error", err)
		}
		c.abort()
		return
	}
	up := raw.(*net.TCPConn)
	c.mu.Lock()
	if c.aborted {
		// Cut(CutReset) or Close raced the dial.
		c.mu.Unlock()
		resetTCP(up)
		return
	}
	c.upstream = up
	c.pipes[toUpstream] = newPipe(c, toUpstream, c.client, up)
	c.pipes[fromUpstream] = newPipe(c, fromUpstream, up, c.client)
	pipes := c.pipes
	c.mu.Unlock()

	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); pipes[toUpstream].readLoop() }()
	go func() { defer wg.Done(); pipes[fromUpstream].readLoop() }()
	go func() { defer wg.Done(); pipes[toUpstream].writeLoop() }()
	pipes[fromUpstream].writeLoop()
	wg.Wait()

	c.mu.Lock()
	if !c.aborted {
		// Both directions ended with a delivered EOF.
		c.aborted = true
		_ = c.client.Close()
		_ = up.Close()
	}
	c.mu.Unlock()
	// No goroutine touches the queues any more.
	for _, p := range pipes {
		p.mu.Lock()
		p.q.free()
		p.mu.Unlock()
	}
}

// abort resets both sockets and stops the connection's goroutines. Safe to
// call more than once and from any goroutine.
func (c *conn) abort() {
	c.mu.Lock()
	if c.aborted {
		c.mu.Unlock()
		return
	}
	c.aborted = true
	up := c.upstream
	c.mu.Unlock()
	c.cancel()
	resetTCP(c.client)
	if up != nil {
		resetTCP(up)
	}
}

// heldBytes returns the bytes the connection has read and not delivered.
func (c *conn) heldBytes() int64 {
	c.mu.Lock()
	pipes := c.pipes
	c.mu.Unlock()
	var n int64
	for _, p := range pipes {
		if p != nil {
			p.mu.Lock()
			n += p.q.queuedBytes()
			p.mu.Unlock()
		}
	}
	return n
}

// pipe is one direction of a connection: a reader goroutine fills the
// delay queue from src, a writer goroutine drains what is due into dst.
type pipe struct {
	c        *conn
	dir      int
	src, dst *net.TCPConn
	rng      *rand.Rand // the reader's only

	mu         sync.Mutex
	q          delayQueue
	writerIdle bool // the writer waits on wake with nothing pending

	wake chan struct{} // cap 1: bytes or the end arrived for an idle writer
	room chan struct{} // cap 1: the writer released bytes
}

func newPipe(c *conn, dir int, src, dst *net.TCPConn) *pipe {
	return &pipe{
		c:    c,
		dir:  dir,
		src:  src,
		dst:  dst,
		rng:  rand.New(rand.NewPCG(c.link.cfg.Seed, c.id<<1|uint64(dir))),
		wake: make(chan struct{}, 1),
		room: make(chan struct{}, 1),
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// readLoop reads src into the queue, stamping each read with its due time,
// until src ends or the connection is aborted. It reads nothing while the
// link is cut, nor while the queue holds BufferBytesMax.
func (p *pipe) readLoop() {
	l := p.c.link
	done := p.c.ctx.Done()
	limit := int64(l.cfg.BufferBytesMax)
	for {
		if !l.waitOpen(done) {
			return
		}
		p.mu.Lock()
		for p.q.queuedBytes() >= limit {
			p.mu.Unlock()
			select {
			case <-p.room:
			case <-done:
				return
			}
			p.mu.Lock()
		}
		buf := p.q.space()
		p.mu.Unlock()

		n, err := p.src.Read(buf)
		now := time.Now()
		if n > 0 {
			due := l.due(p.dir, now, n, p)
			p.mu.Lock()
			p.q.push(n, due)
			wake := p.writerIdle
			p.writerIdle = false
			p.mu.Unlock()
			if wake {
				signal(p.wake)
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			// The end travels like data: a FIN (or RST) arrives one
			// latency after it was read, behind the bytes before it.
			end := now.Add(time.Duration(l.latencyNanos.Load()))
			p.mu.Lock()
			p.q.finish(err, end)
			p.writerIdle = false
			p.mu.Unlock()
			signal(p.wake)
			return
		}
	}
}

// writeLoop writes due bytes to dst in order, and at the stream's end
// half-closes dst (EOF) or aborts the connection (a read error). It writes
// nothing while the link is cut.
func (p *pipe) writeLoop() {
	l := p.c.link
	done := p.c.ctx.Done()
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if !l.waitOpen(done) {
			return
		}
		p.mu.Lock()
		bufs, next, end := p.q.take(time.Now())
		endErr := p.q.endErr
		p.writerIdle = len(bufs) == 0 && !end && next.IsZero()
		p.mu.Unlock()

		switch {
		case len(bufs) > 0:
			nb := net.Buffers(bufs)
			written, err := nb.WriteTo(p.dst)
			p.mu.Lock()
			p.q.release(int(written))
			p.mu.Unlock()
			l.bytes[p.dir].Add(uint64(written))
			signal(p.room)
			if err != nil {
				p.c.abort()
				return
			}
		case end:
			if endErr != nil {
				// The source was reset (or failed): reset the destination.
				p.c.abort()
				return
			}
			if err := p.dst.CloseWrite(); err != nil {
				p.c.abort()
			}
			return
		case next.IsZero():
			select {
			case <-p.wake:
			case <-done:
				return
			}
		default:
			wait := time.Until(next)
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			select {
			case <-timer.C:
			case <-done:
				return
			}
		}
	}
}
