package regionsvc

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
)

// Pending hints (strayhint.go, step 1). A hint whose attempts ran out
// (node X unreachable for longer than the ~15 s they span) is kept in the
// node's bounded set of pending hints, keyed by target node, stream,
// incarnation and range (a second hint for the same replica replaces
// none: it is the same news). One node task (retryPendingHints) tries
// them again every pendingHintRetry, and at once when a peer's liveness
// changes (a node coming back up), one call at a time; a node that does
// not answer is skipped for the rest of that round. A hint leaves the set
// when it is answered (whatever the receiver decides), refused for good,
// when its target left the region (decommissioned), or when its range or
// stream is gone here. Past pendingHintsMax the oldest is dropped, with a
// log line and a count (dropped): its node's stray sweep remains.

const (
	// pendingHintsMax bounds the pending hints of one node.
	pendingHintsMax = 4096
	// pendingHintRetry is the time between two rounds of retries.
	pendingHintRetry = 30 * time.Second
)

// pendingHintKey names one pending hint.
type pendingHintKey struct {
	node       uint64
	stream     string
	metaOffset uint64
	r          uint32
}

// pendingHint is one pending hint; seq orders them by age.
type pendingHint struct {
	req *geologinternalv1.ReplicaRemovedRequest
	seq uint64
}

// pendingHints is the bounded set of pending hints.
type pendingHints struct {
	max     int
	mu      sync.Mutex
	hints   map[pendingHintKey]pendingHint
	seq     uint64
	dropped atomic.Uint64 // hints dropped at the cap
}

func newPendingHints(limit int) *pendingHints {
	return &pendingHints{max: max(limit, 1), hints: map[pendingHintKey]pendingHint{}}
}

func pendingKeyOf(node uint64, req *geologinternalv1.ReplicaRemovedRequest) pendingHintKey {
	return pendingHintKey{node: node, stream: req.GetStream(), metaOffset: req.GetStreamMetaOffset(), r: req.GetRange()}
}

// add keeps req for node pending; it returns the key of the hint it
// dropped to make room, if any (ok).
func (p *pendingHints) add(node uint64, req *geologinternalv1.ReplicaRemovedRequest) (dropped pendingHintKey, ok bool) {
	key := pendingKeyOf(node, req)
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, dup := p.hints[key]; dup {
		return dropped, false
	}
	if len(p.hints) >= p.max {
		var oldest uint64
		for k, h := range p.hints {
			if !ok || h.seq < oldest {
				dropped, oldest, ok = k, h.seq, true
			}
		}
		delete(p.hints, dropped)
		p.dropped.Add(1)
	}
	p.seq++
	p.hints[key] = pendingHint{req: req, seq: p.seq}
	return dropped, ok
}

// remove forgets key.
func (p *pendingHints) remove(key pendingHintKey) {
	p.mu.Lock()
	delete(p.hints, key)
	p.mu.Unlock()
}

// size is the number of pending hints.
func (p *pendingHints) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.hints)
}

// snapshot copies the pending hints.
func (p *pendingHints) snapshot() map[pendingHintKey]*geologinternalv1.ReplicaRemovedRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[pendingHintKey]*geologinternalv1.ReplicaRemovedRequest, len(p.hints))
	for k, h := range p.hints {
		out[k] = h.req
	}
	return out
}

// prune drops the hints keep rejects; it returns how many.
func (p *pendingHints) prune(keep func(pendingHintKey) bool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := 0
	for key := range p.hints {
		if !keep(key) {
			delete(p.hints, key)
			k++
		}
	}
	return k
}

// addPendingHint keeps req for node id pending (sendRemovedHint).
func (n *Node) addPendingHint(id uint64, req *geologinternalv1.ReplicaRemovedRequest) {
	if dropped, ok := n.pendingHints.add(id, req); ok {
		n.logger.Warn("pending replica removal hint dropped: too many pending; the node's stray sweep remains", "node", dropped.node,
			"stream", dropped.stream, "range", dropped.r, "dropped_total", n.pendingHints.dropped.Load())
	}
}

// pendingHintEvery is pendingHintRetry, or the test's override.
func (n *Node) pendingHintEvery() time.Duration {
	if n.cfg.hintPendingRetry > 0 {
		return n.cfg.hintPendingRetry
	}
	return pendingHintRetry
}

// retryPendingHints is the node task that retries the pending hints.
func (n *Node) retryPendingHints(ctx context.Context) {
	t := time.NewTicker(n.pendingHintEvery())
	defer t.Stop()
	for {
		var changed <-chan struct{}
		if n.region != nil {
			changed = n.livenessChanged()
		}
		select {
		case <-t.C:
		case <-changed:
		case <-ctx.Done():
			return
		}
		if n.pendingHints.size() > 0 {
			n.retryPendingRound(ctx)
		}
	}
}

// retryPendingRound is one round of retryPendingHints.
func (n *Node) retryPendingRound(ctx context.Context) {
	n.pendingHints.prune(n.pendingHintWanted)
	unreachable := map[uint64]bool{}
	for key, req := range n.pendingHints.snapshot() {
		if ctx.Err() != nil {
			return
		}
		if unreachable[key.node] {
			continue
		}
		err := n.callRemovedHint(ctx, key.node, req)
		if err != nil && hintRetriable(err) {
			unreachable[key.node] = true
			continue
		}
		n.pendingHints.remove(key)
		n.logger.Info("pending replica removal hint delivered", "stream", key.stream, "range", key.r, "node", key.node, "error", err)
	}
}

// pendingHintWanted reports whether a pending hint is still worth
// sending: its node is of the region, and this node still has the
// stream's incarnation and range.
func (n *Node) pendingHintWanted(key pendingHintKey) bool {
	if !n.isRegionPeer(key.node) {
		return false
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	st, ok := n.streams[key.stream]
	return ok && st.spec.MetaOffset == key.metaOffset && int(key.r) < len(st.ranges)
}
