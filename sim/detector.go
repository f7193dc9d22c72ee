package sim

import (
	"math/rand/v2"
	"time"

	"github.com/geolog/geolog/internal/backoff"
)

// The failure detector (driver.go's peerDown) is modelled on the
// product's, raftnet.GRPCTransport.PeerDown: each node has, towards each
// peer of its region, the sender of raftnet's peer.run, and the peer is
// down once an attempt to open a stream to it failed after the last one
// that worked, up again once a stream opens. watchLinks moves every
// sender on, each virtual millisecond, as the product's would:
//
//  1. A node's transport starts with its process: a peer it never sent
//     to is not down (a fresh transport has no sender for it). Its first
//     send starts the sender, which dials at once.
//  2. A dial to a peer whose process is down, the link not cut, is
//     refused at once: the peer is down. One across a cut loses its SYN,
//     retried as the kernel does 1 s and 3 s on (a cut healed meanwhile
//     connects then), and fails at the handshake timeout: down. A dial
//     that reaches a live peer opens the stream: up, and the peer's own
//     sender back, if backing off, redials at once (raftnet's heardFrom).
//  3. An open stream breaks at once when its peer's process dies (its
//     kernel closes the connection), unless the link is cut (the FIN is
//     lost; then as below). Across a cut it breaks once data is unacked
//     for the keepalive timeout (gRPC sets TCP_USER_TIMEOUT to it): from
//     the first send after the cut, or from the keepalive ping of an idle
//     stream (at a random phase of its interval). A cut healed before
//     then leaves the stream up. A stream that breaks leaves the peer up.
//  4. After a stream broke or a dial failed, the sender backs off
//     (internal/backoff.Delay from ReconnectBackoffMin doubling to
//     ReconnectBackoffMax, reset only by a stream that stayed up for the
//     max) and dials again.
//
// So a crashed peer is found down a backoff after the crash (3-5 virtual
// ms from a stream that was up a while), a cut-off one a keepalive
// timeout plus a handshake timeout after the cut (some 1,000 virtual ms),
// a cut shorter than the keepalive timeout breaks no open stream (only a
// dial begun during it may fail), and a peer that came back is up once
// either side dials it. Not modelled: the messages the
// product's Send refuses while its sender backs off (the simulated network
// carries them), gRPC's own reconnect backoff under ours, snapshot
// streams.
//
// The product's delays (raftnet.Config's defaults) are scaled by the
// simulator's tick (tickMs) to regionsvc's (TickInterval, 100 ms): Raft's
// timers run ten times faster here, and the detector's delays stand to
// them as in the product (a crash found in a few percent of an election
// timeout, a cut in some ten election timeouts).
const (
	productTick         = 100 * time.Millisecond // regionsvc.Config.TickInterval's default
	handshakeTimeout    = 5 * time.Second        // raftnet.Config.HandshakeTimeout
	reconnectBackoffMin = 50 * time.Millisecond  // raftnet.Config.ReconnectBackoffMin
	reconnectBackoffMax = 5 * time.Second        // raftnet.Config.ReconnectBackoffMax
	keepaliveInterval   = 10 * time.Second       // raftnet.Config.KeepaliveInterval
	keepaliveTimeout    = 5 * time.Second        // raftnet.Config.KeepaliveTimeout
	synRetry1           = 1 * time.Second        // Linux's SYN retransmissions (initial RTO 1 s, doubling)
	synRetry2           = 3 * time.Second
	// backoffAttemptMax is raftnet's slowestAttempt: the wait no longer
	// grows past it.
	backoffAttemptMax = 64
	// detectorTag seeds each node's detector jitter apart from the run's
	// other draws ("detect").
	detectorTag = 0x646574656374
)

// scaledMs is product duration d in virtual ms (rounded up).
func scaledMs(d time.Duration) int64 {
	v := d * tickMs * time.Millisecond / productTick
	return int64((v + time.Millisecond - 1) / time.Millisecond)
}

type linkPhase int

const (
	linkIdle    linkPhase = iota // never sent to (this incarnation)
	linkDialing                  // opening a stream (at: when the dial began)
	linkOpen                     // the stream is up (at: when it opened)
	linkBackoff                  // waiting to dial again (at: when)
)

// peerLink is a node's sender towards one peer (raftnet's peer).
type peerLink struct {
	phase linkPhase
	at    int64
	down  bool // what PeerDown answers
	// known: a dial towards the peer failed or opened, or the peer opened
	// one to this node while this sender ran (PeerKnown answers it).
	known    bool
	failures int // the backoff's attempt
	// peerGen is the incarnation of the peer the open stream reaches.
	peerGen int
	// synLost: the dial under way met a cut (its SYN waits for a retry).
	synLost bool
	// cutAt is when the open stream was first seen across a cut (0: not
	// cut); pingAt when its keepalive pings then; unacked when it was
	// first sent on since the cut (0: not yet).
	cutAt, pingAt, unacked int64
	lastSent               int64 // the last send to the peer (linkSent)
}

// peerLinks is a node's transport as its failure detector sees it.
type peerLinks struct {
	gen   int        // the node's incarnation they belong to
	rng   *rand.Rand // the node's detector jitter (backoff, keepalive phase)
	peers []peerLink // by Raft id - 1
}

// linksOf returns n's senders, new ones if n started since they were made
// (a restarted process has a fresh transport).
func (w *world) linksOf(n *node) *peerLinks {
	ls := &n.links
	if ls.rng == nil {
		ls.rng = rand.New(rand.NewPCG(uint64(w.opt.Seed), detectorTag+uint64(n.region*w.perRegion+n.id)))
	}
	if ls.gen != n.gen || len(ls.peers) != w.perRegion {
		ls.gen, ls.peers = n.gen, make([]peerLink, w.perRegion)
	}
	return ls
}

// linkSent is the hook of a Raft message from node from to node to of
// region g (sendRaft): a first send starts the sender.
func (w *world) linkSent(g, from, to int) {
	if from < 1 || from > w.perRegion || to < 1 || to > w.perRegion || from == to {
		return
	}
	n := w.node(g, from)
	if !n.up {
		return
	}
	l := &w.linksOf(n).peers[to-1]
	l.lastSent = w.now
	if l.phase == linkIdle {
		l.phase, l.at = linkDialing, w.now
	}
}

// linkStart starts n's sender towards its region's node id if it has
// none, as a first send would, without counting as one (no data unacked
// across a cut): the traffic of a group the simulator does not carry
// (moves.go observeDown: the catalogue's).
func (w *world) linkStart(n *node, id int) {
	if !n.up || id < 1 || id > w.perRegion || id == n.id {
		return
	}
	if l := &w.linksOf(n).peers[id-1]; l.phase == linkIdle {
		l.phase, l.at = linkDialing, w.now
	}
}

// watchLinks moves every live node's senders on to now (step, every
// virtual ms).
func (w *world) watchLinks() {
	for _, n := range w.nodes {
		if !n.up {
			continue
		}
		ls := w.linksOf(n)
		for i := range ls.peers {
			if i+1 != n.id {
				w.moveLink(n, ls, i+1)
			}
		}
	}
}

// moveLink moves n's sender towards peer id on to now.
func (w *world) moveLink(n *node, ls *peerLinks, id int) {
	l := &ls.peers[id-1]
	if l.phase == linkIdle || (l.phase == linkBackoff && w.now < l.at) {
		return // nothing moves: a sender never started, or backing off
	}
	p := w.node(n.region, id)
	cut := w.cut(n.region, n.id) || w.cut(n.region, id)
	if l.phase == linkBackoff && w.now >= l.at {
		l.phase, l.at, l.synLost = linkDialing, w.now, false
	}
	switch l.phase {
	case linkDialing:
		switch {
		case cut || (l.synLost && !synDue(w.now-l.at)):
			l.synLost = l.synLost || cut
			if w.now-l.at >= scaledMs(handshakeTimeout) {
				w.linkFailed(ls, l)
			}
		case !p.up:
			w.linkFailed(ls, l) // refused
		default:
			*l = peerLink{phase: linkOpen, at: w.now, peerGen: p.gen, failures: l.failures, lastSent: l.lastSent, known: true}
			w.heardFrom(p, n.id)
		}
	case linkOpen:
		w.moveOpen(n, ls, l, p, cut)
	}
}

// synDue reports whether a dial elapsed virtual ms old retries its SYN.
func synDue(elapsed int64) bool {
	return elapsed == scaledMs(synRetry1) || elapsed == scaledMs(synRetry2)
}

// moveOpen moves n's open stream to p on to now (cut: the link is cut).
func (w *world) moveOpen(n *node, ls *peerLinks, l *peerLink, p *node, cut bool) {
	if !cut {
		l.cutAt, l.unacked = 0, 0
		if !p.up || p.gen != l.peerGen {
			w.linkBroke(ls, l) // its kernel ended the stream, or the next segment met a reset
		}
		return
	}
	if l.cutAt == 0 {
		l.cutAt = w.now
		l.pingAt = w.now + ls.rng.Int64N(scaledMs(keepaliveInterval))
	}
	if l.unacked == 0 && l.lastSent >= l.cutAt {
		l.unacked = l.lastSent
	}
	from := l.pingAt
	if l.unacked != 0 {
		from = min(from, l.unacked)
	}
	if w.now >= from+scaledMs(keepaliveTimeout) {
		w.linkBroke(ls, l)
	}
}

// linkBroke ends an open stream: the sender backs off, the peer still up.
func (w *world) linkBroke(ls *peerLinks, l *peerLink) {
	if w.now-l.at >= scaledMs(reconnectBackoffMax) {
		l.failures = 0 // a stream that stayed up a while resets the backoff
	}
	w.backOff(ls, l)
}

// linkFailed ends a dial that failed: the peer is down.
func (w *world) linkFailed(ls *peerLinks, l *peerLink) {
	l.down, l.known = true, true
	w.backOff(ls, l)
}

func (w *world) backOff(ls *peerLinks, l *peerLink) {
	d := backoff.Delay(l.failures, reconnectBackoffMin, reconnectBackoffMax, ls.rng)
	l.phase, l.at = linkBackoff, w.now+scaledMs(d)
	l.failures = min(l.failures+1, backoffAttemptMax)
	l.cutAt, l.unacked = 0, 0
}

// heardFrom is raftnet's peer.heardFrom on p for node id, whose stream
// to p just opened: id is up, and p's sender towards it, if backing off,
// redials at once.
func (w *world) heardFrom(p *node, id int) {
	ls := w.linksOf(p)
	l := &ls.peers[id-1]
	l.down = false
	// The product's transport has a peer to tell only if its sender was
	// started.
	l.known = l.known || l.phase != linkIdle
	if l.phase == linkBackoff {
		l.failures, l.at = 0, w.now
	}
}
