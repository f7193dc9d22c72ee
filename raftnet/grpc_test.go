package raftnet

import (
	"errors"
	"net"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// sendAll sends count messages of each of groups groups from a to b,
// numbering them per (a, b) in send order, and fails on any refusal.
func sendAll(t *testing.T, a *testNode, to NodeID, groups, count int) {
	t.Helper()
	seq := uint64(0)
	for i := range count {
		for g := range groups {
			seq++
			typ := raftpb.MsgHeartbeat
			if i%2 == 1 {
				typ = raftpb.MsgApp
			}
			if err := a.tr.Send(GroupID(g+1), msg(typ, a.id, to, seq)); err != nil {
				t.Fatalf("send %d→%d seq %d: %v", a.id, to, seq, err)
			}
		}
	}
}

// checkFIFO checks that what r got from each sender is in send order.
func checkFIFO(t *testing.T, r *recorder) {
	t.Helper()
	last := map[NodeID]uint64{}
	for _, m := range r.received() {
		if m.index <= last[m.from] {
			t.Fatalf("from node %d: seq %d after %d", m.from, m.index, last[m.from])
		}
		last[m.from] = m.index
	}
}

func TestThreeNodesManyGroups(t *testing.T) {
	const groups, perGroup = 300, 6
	nodes := []*testNode{startNode(t, 1, "", nil), startNode(t, 2, "", nil), startNode(t, 3, "", nil)}
	connect(t, nodes...)
	var wg sync.WaitGroup
	for _, a := range nodes {
		for _, b := range nodes {
			if a == b {
				continue
			}
			wg.Go(func() { sendAll(t, a, b.id, groups, perGroup) })
		}
	}
	wg.Wait()
	want := 2 * groups * perGroup
	for _, n := range nodes {
		waitFor(t, 30*time.Second, "all messages", func() bool { return n.rec.count() == want })
		checkFIFO(t, n.rec)
		perGroupCount := map[GroupID]int{}
		for _, m := range n.rec.received() {
			perGroupCount[m.group]++
		}
		if len(perGroupCount) != groups {
			t.Fatalf("node %d: messages of %d groups, want %d", n.id, len(perGroupCount), groups)
		}
	}
	for _, n := range nodes {
		s := n.tr.Stats()
		if s.MessagesSent != uint64(want) || s.MessagesReceived != uint64(want) || s.MessagesDropped() != 0 {
			t.Fatalf("node %d stats: %+v", n.id, s)
		}
		if s.StreamsOpened != 2 {
			t.Fatalf("node %d opened %d streams, want one per peer", n.id, s.StreamsOpened)
		}
	}
}

func TestBatchingUnderLoad(t *testing.T) {
	const count = 20000
	mod := func(c *Config) { c.QueueMessagesMax = count }
	a, b := startNode(t, 1, "", mod), startNode(t, 2, "", mod)
	connect(t, a, b)
	for i := range count {
		if err := a.tr.Send(GroupID(i%500+1), appMsg(1, 2, uint64(i+1), 64)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 20*time.Second, "delivery", func() bool { return b.rec.count() == count })
	checkFIFO(t, b.rec)
	s := a.tr.Stats()
	t.Logf("%d messages in %d batches (%.1f per batch)", s.MessagesSent, s.BatchesSent, float64(s.MessagesSent)/float64(s.BatchesSent))
	if s.BatchesSent*4 > s.MessagesSent {
		t.Fatalf("%d batches for %d messages: not batching", s.BatchesSent, s.MessagesSent)
	}
	if got := b.tr.Stats().BatchesReceived; got != s.BatchesSent {
		t.Fatalf("received %d batches, sent %d", got, s.BatchesSent)
	}
}

func TestBatchBounds(t *testing.T) {
	mod := func(c *Config) { c.BatchMessagesMax = 7; c.BatchBytesMax = 4096 }
	a, b := startNode(t, 1, "", mod), startNode(t, 2, "", mod)
	connect(t, a, b)
	var mu sync.Mutex
	var sizes []int
	b.rec.onMessages = func(_ NodeID, msgs []GroupMessage) {
		mu.Lock()
		sizes = append(sizes, len(msgs))
		mu.Unlock()
	}
	for i := range 500 {
		// One oversized message among small ones travels alone.
		size := 100
		if i == 250 {
			size = 10000
		}
		if err := a.tr.Send(1, appMsg(1, 2, uint64(i+1), size)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "delivery", func() bool { return b.rec.count() == 500 })
	mu.Lock()
	defer mu.Unlock()
	for _, n := range sizes {
		if n > 7 {
			t.Fatalf("batch of %d messages, bound 7", n)
		}
	}
}

func TestQueueOverflowDropsAndReports(t *testing.T) {
	// A listener that accepts and never answers: the peer stays in its
	// handshake while Send fills the queue.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	var conns []net.Conn
	var connsMu sync.Mutex
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			connsMu.Lock()
			conns = append(conns, c)
			connsMu.Unlock()
		}
	}()
	defer func() {
		connsMu.Lock()
		defer connsMu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}()
	a := startNode(t, 1, "", func(c *Config) {
		c.QueueMessagesMax = 8
		c.HandshakeTimeout = 300 * time.Millisecond
		c.ReconnectBackoffMin = 5 * time.Second // long enough to observe the backoff state
		c.ReconnectBackoffMax = 5 * time.Second
	})
	if err := a.tr.Send(1, msg(raftpb.MsgHeartbeat, 1, 2, 1)); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("send without an address: %v", err)
	}
	if err := a.tr.SetPeer(2, lis.Addr().String()); err != nil {
		t.Fatal(err)
	}
	full := 0
	for g := range 20 {
		// MsgApp: a heartbeat would find the reserve (TestControlReserve).
		err := a.tr.Send(GroupID(g+1), appMsg(1, 2, uint64(g+1), 0))
		switch {
		case err == nil:
		case errors.Is(err, ErrQueueFull):
			full++
		default:
			t.Fatalf("send %d: %v", g, err)
		}
	}
	if full != 12 {
		t.Fatalf("%d refused as full, want 12", full)
	}
	// The handshake times out: the 8 queued messages are dropped and their
	// groups reported once each.
	waitFor(t, 5*time.Second, "unreachable report", func() bool { return len(a.rec.unreachableGroups(2)) == 8 })
	got := a.rec.unreachableGroups(2)
	slices.Sort(got)
	if !slices.Equal(got, []GroupID{1, 2, 3, 4, 5, 6, 7, 8}) {
		t.Fatalf("reported groups %v", got)
	}
	// Backing off: Send refuses at once.
	if err := a.tr.Send(1, msg(raftpb.MsgHeartbeat, 1, 2, 99)); !errors.Is(err, ErrPeerUnreachable) {
		t.Fatalf("send while backing off: %v", err)
	}
	s := a.tr.Stats()
	if s.DroppedQueueFull != 12 || s.DroppedStreamBroken != 8 || s.DroppedUnreachable != 2 || s.MessagesSent != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestPeerRestartReconnects(t *testing.T) {
	a, b := startNode(t, 1, "", nil), startNode(t, 2, "", nil)
	connect(t, a, b)
	sendAll(t, a, 2, 10, 1)
	waitFor(t, 5*time.Second, "first delivery", func() bool { return b.rec.count() == 10 })

	// The peer goes away while the stream is idle: the sender notices
	// without sending anything, and keeps trying.
	b.stop()
	waitFor(t, 5*time.Second, "the idle stream's end noticed", func() bool { return a.tr.Stats().StreamsFailed >= 1 })

	// It comes back on the same address: the sender reconnects by itself,
	// so nothing sent after that is lost.
	b2 := startNode(t, 2, b.addr, nil)
	waitFor(t, 10*time.Second, "reconnect", func() bool { return a.tr.Stats().StreamsOpened == 2 })
	dropped := a.tr.Stats().MessagesDropped()
	for g := range 5 {
		if err := a.tr.Send(GroupID(g+1), msg(raftpb.MsgApp, 1, 2, uint64(100+g))); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 5*time.Second, "delivery after restart", func() bool { return b2.rec.count() == 5 })
	checkFIFO(t, b2.rec)
	if got := a.tr.Stats().MessagesDropped(); got != dropped {
		t.Fatalf("%d messages dropped after reconnecting", got-dropped)
	}

	// And a restart under traffic: Raft keeps sending; refusals and
	// reports are expected while the peer is away; delivery resumes.
	b2.stop()
	b3 := startNode(t, 2, b.addr, nil)
	seq := uint64(1000)
	waitFor(t, 10*time.Second, "delivery after a restart under traffic", func() bool {
		seq++
		_ = a.tr.Send(1, msg(raftpb.MsgHeartbeat, 1, 2, seq)) // refused while reconnecting
		return b3.rec.count() > 0
	})
	checkFIFO(t, b3.rec)
}

func TestUnknownGroupCounted(t *testing.T) {
	a, b := startNode(t, 1, "", nil), startNode(t, 2, "", nil)
	b.rec.knownGroups = map[GroupID]bool{1: true, 2: true}
	connect(t, a, b)
	for g := range 10 {
		if err := a.tr.Send(GroupID(g+1), msg(raftpb.MsgHeartbeat, 1, 2, uint64(g+1))); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 5*time.Second, "delivery", func() bool { return b.tr.Stats().MessagesReceived == 10 })
	if got := b.tr.Stats().UnknownGroupMessages; got != 8 {
		t.Fatalf("unknown group messages %d, want 8", got)
	}
	if b.rec.count() != 2 {
		t.Fatalf("handler kept %d", b.rec.count())
	}
}

func TestSendRefusesInvalid(t *testing.T) {
	a := startNode(t, 1, "", func(c *Config) { c.MessageBytesMax = 1024 })
	if err := a.tr.SetPeer(2, "127.0.0.1:1"); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		group GroupID
		m     *raftpb.Message
		want  error
	}{
		"group 0":            {0, msg(raftpb.MsgApp, 1, 2, 1), ErrInvalidMessage},
		"local type":         {1, msg(raftpb.MsgHup, 1, 2, 1), ErrInvalidMessage},
		"storage type":       {1, msg(raftpb.MsgStorageAppend, 1, 2, 1), ErrInvalidMessage},
		"snap via Send":      {1, snapMsg(1, 2, 5), ErrInvalidMessage},
		"wrong from":         {1, msg(raftpb.MsgApp, 3, 2, 1), ErrInvalidMessage},
		"transfer from none": {1, msg(raftpb.MsgTransferLeader, 0, 2, 1), ErrInvalidMessage},
		"to self":            {1, msg(raftpb.MsgApp, 1, 1, 1), ErrInvalidMessage},
		"to none":            {1, msg(raftpb.MsgApp, 1, 0, 1), ErrInvalidMessage},
		"too large":          {1, appMsg(1, 2, 1, 2000), ErrMessageTooLarge},
		"nil":                {1, nil, ErrInvalidMessage},
	}
	for name, c := range cases {
		if err := a.tr.Send(c.group, c.m); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	if got := a.tr.Stats().DroppedInvalid; got != uint64(len(cases)) {
		t.Fatalf("DroppedInvalid %d, want %d", got, len(cases))
	}
	// A follower forwards MsgTransferLeader with From naming the
	// transferee, not itself: that is carried (queued; or refused as
	// unreachable if a case above started the peer and its dial to the
	// dead address already failed), not refused as invalid.
	if err := a.tr.Send(1, msg(raftpb.MsgTransferLeader, 3, 2, 0)); err != nil && !errors.Is(err, ErrPeerUnreachable) {
		t.Fatalf("forwarded MsgTransferLeader: %v", err)
	}
	if got := a.tr.Stats().DroppedInvalid; got != uint64(len(cases)) {
		t.Fatalf("forwarded MsgTransferLeader counted invalid: DroppedInvalid %d, want %d", got, len(cases))
	}
}

func TestCloseRefuses(t *testing.T) {
	a, b := startNode(t, 1, "", nil), startNode(t, 2, "", nil)
	connect(t, a, b)
	sendAll(t, a, 2, 3, 1)
	waitFor(t, 5*time.Second, "delivery", func() bool { return b.rec.count() == 3 })
	if err := a.tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.tr.Send(1, msg(raftpb.MsgApp, 1, 2, 9)); !errors.Is(err, ErrClosed) {
		t.Fatalf("send after close: %v", err)
	}
	if err := a.tr.SendSnapshot(1, snapMsg(1, 2, 9), &bodySource{size: 10}); !errors.Is(err, ErrClosed) {
		t.Fatalf("snapshot after close: %v", err)
	}
	if err := a.tr.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

func TestPeerAddressChange(t *testing.T) {
	a, b, c := startNode(t, 1, "", nil), startNode(t, 2, "", nil), startNode(t, 3, "", nil)
	connect(t, a, b)
	sendAll(t, a, 2, 1, 1)
	waitFor(t, 5*time.Second, "delivery", func() bool { return b.rec.count() == 1 })
	// Point node 2's address at node 3: node 3 refuses the stream as
	// misaddressed, so nothing for 2 ever reaches 3's handler.
	if err := a.tr.SetPeer(2, c.addr); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "misaddressed stream refused", func() bool {
		_ = a.tr.Send(1, msg(raftpb.MsgHeartbeat, 1, 2, 50)) // refused while backing off
		return c.tr.Stats().StreamsRejected > 0
	})
	if c.rec.count() != 0 {
		t.Fatal("node 3 took messages addressed to node 2")
	}
	a.tr.RemovePeer(2)
	if err := a.tr.Send(1, msg(raftpb.MsgHeartbeat, 1, 2, 51)); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("send after RemovePeer: %v", err)
	}
}

// TestIdleGroupsCostNothing shows that groups cost the transport nothing:
// after messages of 1,000 groups, the goroutines are those of one peer, and
// nothing is sent while the groups are idle (no per-group timer).
func TestIdleGroupsCostNothing(t *testing.T) {
	a, b := startNode(t, 1, "", nil), startNode(t, 2, "", nil)
	connect(t, a, b)
	sendAll(t, a, 2, 1, 1)
	waitFor(t, 5*time.Second, "warm-up", func() bool { return b.rec.count() == 1 })
	base := runtime.NumGoroutine()

	sendAll(t, a, 2, 1000, 1)
	waitFor(t, 5*time.Second, "1,000 groups", func() bool { return b.rec.count() == 1001 })
	// gRPC may run a short-lived goroutine now and then; poll, don't sleep.
	waitFor(t, 5*time.Second, "goroutines back to the baseline", func() bool { return runtime.NumGoroutine() <= base })

	before := a.tr.Stats()
	time.Sleep(200 * time.Millisecond) // idle on purpose: nothing may happen
	after := a.tr.Stats()
	if after.BatchesSent != before.BatchesSent || after.MessagesSent != before.MessagesSent {
		t.Fatalf("idle transport sent: %+v → %+v", before, after)
	}
	a.tr.mu.RLock()
	defer a.tr.mu.RUnlock()
	if n := len(a.tr.peers); n != 1 {
		t.Fatalf("%d peers, want 1", n)
	}
}

// TestSendNeverBlocksOnStuckReceiver: a receiver whose handler is stuck
// stops reading, flow control stops the sender's stream, the queue fills,
// and Send keeps returning at once (ErrQueueFull) instead of blocking.
func TestSendNeverBlocksOnStuckReceiver(t *testing.T) {
	a := startNode(t, 1, "", func(c *Config) { c.QueueMessagesMax = 256 })
	b := startNode(t, 2, "", nil)
	connect(t, a, b)
	block := make(chan struct{})
	b.rec.block = block
	unblock := sync.OnceFunc(func() { close(block) })
	t.Cleanup(unblock) // before the nodes stop (cleanups run last-in first-out)

	m := appMsg(1, 2, 1, 1024)
	// The sends run beside a watchdog: a Send that blocks would never
	// return while the receiver is stuck, so the loop ending at all shows
	// that none did. The minute is slack for a busy machine, not a goal.
	start := time.Now()
	full := 0
	done := make(chan error, 1)
	go func() {
		for i := 0; i < 100_000 && full < 1000; i++ {
			err := a.tr.Send(GroupID(i%100+1), m)
			switch {
			case errors.Is(err, ErrQueueFull):
				full++
			case err != nil:
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		unblock()
		t.Fatalf("Send blocked behind a stuck receiver (sends still running after %s)", time.Since(start))
	}
	if full < 1000 {
		t.Fatalf("queue never filled (%d refusals)", full)
	}
	t.Logf("%d sends refused with ErrQueueFull in %s", full, time.Since(start))
	unblock()
	sent := a.tr.Stats().MessagesSent
	waitFor(t, 20*time.Second, "drain", func() bool {
		return b.tr.Stats().MessagesReceived == a.tr.Stats().MessagesSent && a.tr.Stats().MessagesSent > sent
	})
}

// TestCloseLeavesNoGoroutines: after traffic, a snapshot and a reconnect,
// closing the transports and stopping the servers ends every goroutine the
// package started.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	base := runtime.NumGoroutine()
	func() {
		a, b := startNode(t, 1, "", nil), startNode(t, 2, "", nil)
		connect(t, a, b)
		sendAll(t, a, 2, 50, 2)
		sendAll(t, b, 1, 50, 2)
		if err := a.tr.SendSnapshot(1, snapMsg(1, 2, 5), &bodySource{size: 1 << 20}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "traffic", func() bool {
			return a.rec.count() == 100 && b.rec.count() == 100 && len(a.rec.snapshotReports()) == 1
		})
		a.stop()
		b.stop()
	}()
	waitFor(t, 10*time.Second, "goroutines to end", func() bool { return runtime.NumGoroutine() <= base })
}

// TestPeerDownDetector: a peer whose process is gone is reported down after
// one failed redial, well before any Raft timeout; a node never contacted is
// not down; a peer that reaches us again is up at once.
func TestPeerDownDetector(t *testing.T) {
	a, b := startNode(t, 1, "", nil), startNode(t, 2, "", nil)
	connect(t, a, b)
	if a.tr.PeerDown(2) || a.tr.PeerDown(3) {
		t.Fatal("a peer never contacted is reported down")
	}
	sendAll(t, a, 2, 1, 1)
	waitFor(t, 5*time.Second, "first delivery", func() bool { return b.rec.count() == 1 })
	if a.tr.PeerDown(2) {
		t.Fatal("a connected peer is reported down")
	}
	b.stop()
	waitFor(t, 5*time.Second, "peer found down", func() bool { return a.tr.PeerDown(2) })
	b2 := startNode(t, 2, b.addr, nil)
	if err := b2.tr.SetPeer(1, a.addr); err != nil {
		t.Fatal(err)
	}
	if err := b2.tr.Send(1, msg(raftpb.MsgHeartbeat, 2, 1, 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "peer up after it reached us", func() bool { return !a.tr.PeerDown(2) })
}

// TestPeerKnownProbe: the transport has no verdict on a node it never
// dialled nor heard from (PeerKnown false, and PeerDown's false then means
// nothing); Probe dials without a message to send and gives one: up for
// a live peer, down for an address that refuses. Probing itself or a node
// without an address does nothing.
func TestPeerKnownProbe(t *testing.T) {
	a, b := startNode(t, 1, "", nil), startNode(t, 2, "", nil)
	connect(t, a, b)
	if a.tr.PeerKnown(2) || a.tr.PeerKnown(3) {
		t.Fatal("a verdict on a peer never contacted")
	}
	a.tr.Probe(2)
	waitFor(t, 5*time.Second, "a verdict on the live peer", func() bool { return a.tr.PeerKnown(2) })
	if a.tr.PeerDown(2) || b.rec.count() != 0 {
		t.Fatalf("probed live peer: down %v, %d messages delivered", a.tr.PeerDown(2), b.rec.count())
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := l.Addr().String()
	l.Close()
	if err := a.tr.SetPeer(3, gone); err != nil {
		t.Fatal(err)
	}
	if a.tr.PeerKnown(3) {
		t.Fatal("a verdict on a peer given an address only")
	}
	a.tr.Probe(3)
	waitFor(t, 5*time.Second, "a verdict on the refusing address", func() bool { return a.tr.PeerKnown(3) && a.tr.PeerDown(3) })
	a.tr.Probe(1)
	a.tr.Probe(9)
	if a.tr.PeerKnown(1) || a.tr.PeerKnown(9) {
		t.Fatal("a verdict on itself or on a node without an address")
	}
}

// TestInboundStreamEndsBackoff: a sender backing off from a peer that went
// away redials at once when that peer opens a stream to us, instead of
// finishing its backoff (here at least 15 s: a restarted node would
// otherwise not hear its followers' answers for that long).
func TestInboundStreamEndsBackoff(t *testing.T) {
	// The backoff is jittered to [d/2, d): 30 s at least.
	slow := func(c *Config) { c.ReconnectBackoffMin, c.ReconnectBackoffMax = time.Minute, time.Minute }
	a, b := startNode(t, 1, "", slow), startNode(t, 2, "", slow)
	connect(t, a, b)
	sendAll(t, a, 2, 1, 1)
	waitFor(t, 5*time.Second, "first delivery", func() bool { return b.rec.count() == 1 })
	b.stop()
	waitFor(t, 5*time.Second, "the stream's end noticed", func() bool { return a.tr.Stats().StreamsFailed >= 1 })
	start := time.Now()
	b2 := startNode(t, 2, b.addr, slow)
	if err := b2.tr.SetPeer(1, a.addr); err != nil {
		t.Fatal(err)
	}
	if err := b2.tr.Send(1, msg(raftpb.MsgHeartbeat, 2, 1, 1)); err != nil {
		t.Fatal(err)
	}
	// Well under the 30 s the backoff takes at least, with room for a busy
	// machine.
	waitFor(t, 25*time.Second, "outbound stream reopened without waiting out the backoff", func() bool {
		return a.tr.Stats().StreamsOpened >= 2
	})
	t.Logf("reconnected %v after the peer came back (backoff 30 s or more)", time.Since(start))
	if err := a.tr.Send(1, msg(raftpb.MsgApp, 1, 2, 7)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "delivery after the peer came back", func() bool { return b2.rec.count() == 1 })
}
