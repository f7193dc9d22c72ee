package raftnet

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
)

// stuckNode is a raftNode whose inbound side can be stopped: while stuck,
// HandleMessages blocks, so the node stops reading its streams (a process
// that hangs, or a network that stops delivering without breaking the
// connection). Its own ticks and sends go on.
type stuckNode struct {
	*raftNode
	mu    sync.Mutex
	stuck chan struct{} // non-nil while stuck; closed to release
}

func (s *stuckNode) stick() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stuck = make(chan struct{})
}

func (s *stuckNode) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stuck != nil {
		close(s.stuck)
		s.stuck = nil
	}
}

func (s *stuckNode) HandleMessages(from NodeID, msgs []GroupMessage) int {
	s.mu.Lock()
	stuck := s.stuck
	s.mu.Unlock()
	if stuck != nil {
		<-stuck
	}
	return s.raftNode.HandleMessages(from, msgs)
}

// TestStuckPeerDoesNotStallQuorum: one node of three stops reading its
// streams. Its peers' senders to it block in gRPC's flow control, their
// queues to it fill up to their bound and further messages to it are
// dropped and counted, and the groups, whose quorum is the other two
// nodes, keep committing one proposal after another as before: no Send
// on a Ready path waits for the stuck node. Once it reads again it
// catches up.
func TestStuckPeerDoesNotStallQuorum(t *testing.T) {
	const (
		groups           = 4
		queueMessagesMax = 64
		queueBytesMax    = 1 << 20
		reserveMax       = 16 // heartbeats, votes, acks past the bound
		reserveBytesMax  = 64 << 10
	)
	var nodes []*raftNode
	var tns []*testNode
	stuck := &stuckNode{}
	for _, id := range voters {
		n := newRaftNode(t, NodeID(id), groups)
		var h Handler = n
		if id == 3 {
			stuck.raftNode = n
			h = stuck
		}
		tn := startNode(t, NodeID(id), "", func(c *Config) {
			c.Handler = h
			c.QueueMessagesMax = queueMessagesMax
			c.QueueBytesMax = queueBytesMax
			c.QueueReserveMessages = reserveMax
			c.QueueReserveBytes = reserveBytesMax
		})
		n.tr = tn.tr
		nodes = append(nodes, n)
		tns = append(tns, tn)
	}
	connect(t, tns...)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Go(func() {
			tick := time.NewTicker(20 * time.Millisecond) // see TestRaftOverGRPC
			defer tick.Stop()
			for {
				select {
				case <-done:
					return
				case <-tick.C:
					n.tick(t)
				}
			}
		})
	}
	t.Cleanup(func() { stuck.release(); close(done); wg.Wait() }) // before the transports close

	value := strings.Repeat("v", 4<<10) // fills the stuck node's flow-control window quickly
	proposed := 0
	// round proposes one value in every group on its leader among on and
	// waits until every node of on applied it: one commit per group, one
	// at a time.
	round := func(on []*raftNode, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		proposed++
		want := fmt.Sprintf("%d-%s", proposed, value)
		waitFor(t, within, fmt.Sprintf("round %d committed on nodes %d-%d", proposed, on[0].id, on[len(on)-1].id), func() bool {
			all := true
			for g := range groups {
				id := GroupID(g + 1)
				if slices.Contains(on[0].state(id), want) && slices.Equal(on[0].state(id), on[len(on)-1].state(id)) {
					continue
				}
				all = false
				if !slices.Contains(on[0].state(id), want) && !slices.Contains(on[len(on)-1].state(id), want) {
					for _, n := range on {
						n.propose(id, want) // re-proposed after an election; the state is a list
					}
				}
			}
			return all
		})
		return time.Since(start)
	}
	round(nodes, time.Minute) // every group elected a leader

	stuck.stick()
	// The stuck node loses what it led (CheckQuorum: it hears no answers);
	// nodes 1 and 2 elect among themselves.
	waitFor(t, time.Minute, "every group led by node 1 or 2", func() bool {
		for g := range groups {
			if !ledBy(nodes[0], GroupID(g+1)) && !ledBy(nodes[1], GroupID(g+1)) {
				return false
			}
		}
		return true
	})
	// A Send that waited for the stuck node would hold its node's lock,
	// and with it every round, for good: the watchdog fails the test and
	// frees the node so that it can end. Two minutes is slack for a busy
	// machine; the rounds take seconds.
	watchdog := time.AfterFunc(2*time.Minute, func() {
		t.Errorf("rounds with node 3 stuck still running after 2 minutes: a Send waits for the stuck node")
		stuck.release()
	})
	var times []time.Duration
	for len(times) < 50 || dropped(tns[:2]) == 0 {
		if len(times) == 2000 {
			t.Fatalf("no message to the stuck node dropped after %d rounds: %+v %+v", len(times), tns[0].tr.Stats(), tns[1].tr.Stats())
		}
		// A round takes about six ticks (this harness processes Readies
		// on ticks).
		times = append(times, round(nodes[:2], 30*time.Second))
		for _, tn := range tns[:2] {
			s := tn.tr.Stats()
			// Node 1 or 2 queues for two peers: at most two queues' bound
			// and reserve.
			if s.QueuedMessages > 2*(queueMessagesMax+reserveMax) || s.QueuedBytes > 2*(queueBytesMax+reserveBytesMax) {
				t.Fatalf("node %d queues %d messages, %d bytes: over the bound", tn.id, s.QueuedMessages, s.QueuedBytes)
			}
		}
	}
	if !watchdog.Stop() {
		return // failed above
	}
	slices.Sort(times)
	t.Logf("%d rounds with node 3 stuck: p50 %s, max %s; dropped (queue full) %d; node 1 %+v",
		len(times), times[len(times)/2], times[len(times)-1], dropped(tns[:2]), tns[0].tr.Stats())

	stuck.release()
	waitFor(t, time.Minute, "node 3 to catch up", func() bool { return converged(nodes, groups, proposed) })
}

func ledBy(n *raftNode, g GroupID) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.groups[g].rn.BasicStatus().RaftState == raft.StateLeader
}

// dropped sums the messages the nodes refused because a queue was full.
func dropped(tns []*testNode) uint64 {
	var sum uint64
	for _, tn := range tns {
		sum += tn.tr.Stats().DroppedQueueFull
	}
	return sum
}
