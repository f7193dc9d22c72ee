package raftnet

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// gatedProxy accepts connections and forwards them to target only once
// opened: until then a peer dialling it waits in its handshake, Send
// queues, and nothing leaves the queue (a peer that does not read).
type gatedProxy struct {
	lis    net.Listener
	gate   chan struct{}
	once   sync.Once
	mu     sync.Mutex
	conns  []net.Conn
	target string
}

func newGatedProxy(t *testing.T, target string) *gatedProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedProxy{lis: lis, gate: make(chan struct{}), target: target}
	go g.serve()
	t.Cleanup(func() {
		g.open()
		lis.Close()
		g.mu.Lock()
		defer g.mu.Unlock()
		for _, c := range g.conns {
			c.Close()
		}
	})
	return g
}

func (g *gatedProxy) open() { g.once.Do(func() { close(g.gate) }) }

func (g *gatedProxy) track(c net.Conn) {
	g.mu.Lock()
	g.conns = append(g.conns, c)
	g.mu.Unlock()
}

func (g *gatedProxy) serve() {
	for {
		c, err := g.lis.Accept()
		if err != nil {
			return
		}
		g.track(c)
		go func() {
			<-g.gate
			up, err := net.Dial("tcp", g.target)
			if err != nil {
				c.Close()
				return
			}
			g.track(up)
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			_, _ = io.Copy(c, up)
			c.Close()
		}()
	}
}

// TestControlReserve: a peer's queue is full of appends (the peer does not
// read). Further appends are dropped (ErrQueueFull), but heartbeats, votes,
// their answers, MsgTimeoutNow and MsgAppResp are still queued, into the
// reserve, up to its own bound (ErrReserveFull); once the peer reads, all
// that was queued arrives in send order.
func TestControlReserve(t *testing.T) {
	const (
		queueMax   = 16
		reserveMax = 8
	)
	b := startNode(t, 2, "", nil)
	proxy := newGatedProxy(t, b.addr)
	a := startNode(t, 1, "", func(c *Config) {
		c.QueueMessagesMax = queueMax
		c.QueueReserveMessages = reserveMax
		c.HandshakeTimeout = 2 * time.Minute // the gate holds the handshake
	})
	if err := a.tr.SetPeer(2, proxy.lis.Addr().String()); err != nil {
		t.Fatal(err)
	}
	index := uint64(0)
	send := func(m *raftpb.Message) error {
		index++
		idx := index
		m.Index = &idx
		return a.tr.Send(1, m)
	}
	var want []raftpb.MessageType
	for range queueMax {
		if err := send(appMsg(1, 2, 0, 64)); err != nil {
			t.Fatalf("append into an empty queue: %v", err)
		}
		want = append(want, raftpb.MsgApp)
	}
	if err := send(appMsg(1, 2, 0, 64)); !errors.Is(err, ErrQueueFull) || errors.Is(err, ErrReserveFull) {
		t.Fatalf("append into a full queue: %v, want ErrQueueFull", err)
	}
	index-- // dropped: not expected at the receiver
	control := []raftpb.MessageType{
		raftpb.MsgHeartbeat, raftpb.MsgHeartbeatResp, raftpb.MsgPreVote, raftpb.MsgPreVoteResp,
		raftpb.MsgVote, raftpb.MsgVoteResp, raftpb.MsgTimeoutNow, raftpb.MsgAppResp,
	}
	for i, typ := range control {
		m := msg(typ, 1, 2, 0)
		if typ == raftpb.MsgVote || typ == raftpb.MsgPreVote {
			m.LogTerm = m.Term
		}
		if err := send(m); err != nil {
			t.Fatalf("control message %d (%s) into a queue full of appends: %v", i, typ, err)
		}
		want = append(want, typ)
		// Bulk is still refused, reserve or not.
		if err := send(appMsg(1, 2, 0, 64)); !errors.Is(err, ErrQueueFull) || errors.Is(err, ErrReserveFull) {
			t.Fatalf("append into a full queue with reserve in use: %v", err)
		}
		index--
	}
	// The reserve is bounded too.
	if err := send(msg(raftpb.MsgHeartbeat, 1, 2, 0)); !errors.Is(err, ErrReserveFull) {
		t.Fatalf("heartbeat past the reserve: %v, want ErrReserveFull", err)
	}
	index--
	s := a.tr.Stats()
	if s.QueuedMessages != queueMax+reserveMax || s.DroppedQueueFull != 1+uint64(len(control)) ||
		s.DroppedReserveFull != 1 || s.ReserveAccepted != uint64(len(control)) {
		t.Fatalf("stats %+v", s)
	}

	proxy.open()
	waitFor(t, time.Minute, "queued messages delivered", func() bool { return b.rec.count() >= len(want) })
	got := b.rec.received()
	if len(got) != len(want) {
		t.Fatalf("received %d messages, want %d", len(got), len(want))
	}
	for i, r := range got {
		if r.typ != want[i] || r.index != uint64(i+1) {
			t.Fatalf("message %d: %s index %d, want %s index %d (send order)", i, r.typ, r.index, want[i], i+1)
		}
	}
	if s := a.tr.Stats(); s.QueuedMessages != 0 || s.MessagesSent != uint64(len(want)) {
		t.Fatalf("stats after delivery %+v", s)
	}
}

// TestControlReserveBytes: the reserve is bounded in bytes as well: a
// control message that would take the queue past QueueBytesMax plus
// QueueReserveBytes is refused with ErrReserveFull.
func TestControlReserveBytes(t *testing.T) {
	b := startNode(t, 2, "", nil)
	proxy := newGatedProxy(t, b.addr)
	a := startNode(t, 1, "", func(c *Config) {
		c.QueueBytesMax = 1024
		c.QueueReserveBytes = 256
		c.HandshakeTimeout = 2 * time.Minute
	})
	if err := a.tr.SetPeer(2, proxy.lis.Addr().String()); err != nil {
		t.Fatal(err)
	}
	if err := a.tr.Send(1, appMsg(1, 2, 1, 1000)); err != nil {
		t.Fatal(err)
	}
	if err := a.tr.Send(1, appMsg(1, 2, 2, 10)); !errors.Is(err, ErrQueueFull) || errors.Is(err, ErrReserveFull) {
		t.Fatalf("append past the byte bound: %v", err)
	}
	if err := a.tr.Send(1, msg(raftpb.MsgHeartbeat, 1, 2, 2)); err != nil {
		t.Fatalf("heartbeat past the byte bound: %v", err)
	}
	big := msg(raftpb.MsgHeartbeat, 1, 2, 3)
	big.Context = make([]byte, 300)
	if err := a.tr.Send(1, big); !errors.Is(err, ErrReserveFull) {
		t.Fatalf("heartbeat past the reserve's bytes: %v, want ErrReserveFull", err)
	}
	if s := a.tr.Stats(); s.QueuedMessages != 2 || s.QueuedBytes > 1024+256 || s.DroppedReserveFull != 1 {
		t.Fatalf("stats %+v", s)
	}
}
