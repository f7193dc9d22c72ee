package regionsvc

import (
	"github.com/geolog/geolog/raftnet"
)

// Idle ranges cost nothing: quiescence (replica/quiesce.go) and node
// liveness.
//
// A range driver selects on the node's shared tick only while its replica
// is not quiesced. A leader tries to quiesce on each tick, before ticking:
// once its group is idle (every follower holds and knows every entry,
// nothing in flight, no transfer or campaign planned), it sends each
// follower one quiesce heartbeat and stops ticking, and the followers
// that step it caught up stop too. Ten thousand idle ranges then send no
// heartbeats and wake no goroutine; a proposal, a read or any message
// other than the quiesce heartbeat wakes the group (the replica decides).
//
// A quiesced follower cannot time its leader out, so the node watches its
// peers instead: the ticker polls the transport's failure detector
// (raftnet.GRPCTransport.PeerDown: the peer's process is gone, its port
// refuses, or the handshake times out; an idle stream to a peer cut off
// without a word breaks within the keepalive time, KeepaliveInterval plus
// KeepaliveTimeout) and, when any peer's state changes, closes the
// liveness channel every driver selects on. A node decommissioned (gone
// from the region's node list; the transport forgets its peer and would
// report it up) counts as down for good, there and in rangeDriver.peerDown,
// so a follower quiesced under a leader on it wakes too. A quiesced
// follower whose leader's node is down then wakes, forgets the leader and
// campaigns on its next ticks (rangecore.Driver's watchLeader); a
// quiesced leader wakes on any change (a follower it did not wait for is
// back, or its peers are gone and CheckQuorum must run). A follower never quiesces under a leader whose
// node is down already. This is CockroachDB's rule: a quiesced replica
// relies on node liveness, not on Raft's election timeout, to notice a
// dead leader.

// livenessWatch is the node's view of its peers' liveness (ticker
// goroutine), and the channel closed when it changes (guarded by Node.mu).
type livenessWatch struct {
	down map[uint64]bool
	ch   chan struct{}
}

// watchLiveness runs on every tick: it closes the liveness channel when a
// peer's state (up or down, as the transport finds it) changed since the
// last tick.
func (n *Node) watchLiveness() {
	rg := n.region
	if rg.liveness.down == nil {
		rg.liveness.down = map[uint64]bool{}
	}
	changed := false
	members := n.memberAddrs() // joined nodes too (members.go)
	for id := range members {
		if id == n.cfg.NodeID {
			continue
		}
		down := rg.transport.PeerDown(raftnet.NodeID(id))
		if was, ok := rg.liveness.down[id]; !ok || down != was {
			rg.liveness.down[id] = down // every member, up ones too: one that leaves is seen below
			changed = changed || down != was
		}
	}
	for id, down := range rg.liveness.down {
		// A node decommissioned (gone from the list, its peer removed
		// from the transport, which then reports it up) is down for good:
		// a follower quiesced under it wakes (wakeIfLeaderDown, peerDown).
		if _, ok := members[id]; !ok && !down {
			rg.liveness.down[id] = true
			changed = true
		}
	}
	if !changed {
		return
	}
	n.mu.Lock()
	close(rg.liveness.ch)
	rg.liveness.ch = make(chan struct{})
	n.mu.Unlock()
}

// livenessChanged returns the channel closed at the next change of a
// peer's liveness.
func (n *Node) livenessChanged() <-chan struct{} {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.region.liveness.ch
}

// tickIfAwake returns the node's tick channel, or nil while the replica
// is quiesced (a nil channel never receives: the driver's select ignores
// the tick). It publishes the state for tests and metrics.
func (d *rangeDriver) tickIfAwake() <-chan struct{} {
	if d.dormant != nil {
		return nil // not admitted yet (openpace.go): no tick, no campaign
	}
	q := d.rep.Quiesced()
	d.noteQuiesced(q) // openpace.go
	if q {
		return nil
	}
	return d.cfg.repl.tick()
}
