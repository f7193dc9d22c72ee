package regionsvc

import (
	"context"
	"slices"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/backoff"
	"github.com/geolog/geolog/internal/rpcerr"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"github.com/geolog/geolog/raftnet"
	"go.etcd.io/raft/v3/raftpb"
)

// A removed replica is told (issue 12). A node removed from a range's
// configuration while it could not hear the leader (partitioned, or
// quiesced and left out) never applies its own removal: the leader stops
// sending to it once the change commits. Its configuration still names it
// a voter; quiesced, it keeps its leader id for ever, so the stray sweep
// (strays.go) never suspects it, and it serves its stale prefix and holds
// its subscribers. So:
//
//  1. The leader's driver, applying a configuration that no longer names
//     node X (confApplied: a removal, or the end of a joint configuration
//     X was outgoing in), hands X's node a hint (hintRemoved): RPC
//     ReplicaHints.ReplicaRemoved naming the stream, its catalogue offset
//     and the range. It never blocks the driver: the hint is sent by a
//     node task, up to strayHintAttemptsMax times with backoff (X may be
//     partitioned at that moment), at most strayHintSendersMax in flight.
//     A hint whose attempts run out is kept pending and retried at a low
//     rate until it is answered (hintpending.go): X may stay cut off for
//     longer than the retries, and nothing else would tell it.
//  2. X trusts nothing in the hint (with TLS only nodes of the region may
//     call; peerauth.go). It looks the range up locally; a hint for a
//     range it has no replica of (or one outside its configuration that
//     holds nothing), of another incarnation of the stream, or within
//     strayHintCheckGap of the range's last hinted check, is ignored. A
//     replica that applied its own removal is checked too: it keeps its
//     copy and a leader that no longer speaks to it, so no sweep
//     suspects it. Otherwise it runs the sweep's trusted check at once
//     (checkHintedStray): DescribeReplicas at the range's leader (step 2
//     of strays.go). An answer that names X, or no answer from a leader,
//     ends the matter: a forged hint costs one question.
//  3. The leader said X is no member: X's replica forgets its (stale)
//     leader, so that step 3's check "raft knows no leader" means what it
//     means in the sweep, and is flagged a stray (reads and subscriptions
//     there end with a retriable NOT_LEADER). After strayHintSettle (two
//     election timeouts: a leader re-adding X would have spoken to it) it
//     asks again and carries out steps 3-4 (removeStray): condemned,
//     emptied, reopened passive. If raft knows a leader again by then (X
//     was hearing its own removal as the hint came: the append that
//     carries it names the leader), it forgets it and tries again, up to
//     strayHintRoundsMax rounds; a leader re-adding X speaks every round.
//
// With sweeping turned off (RebalanceConfig.StrayCheckInterval negative)
// hints are ignored too: no stray is removed on this node.

const (
	// strayHintAttemptsMax bounds the attempts to deliver one hint;
	// strayHintRetryMin doubling to strayHintRetryMax the waits between.
	strayHintAttemptsMax = 8
	strayHintRetryMin    = 250 * time.Millisecond
	strayHintRetryMax    = 4 * time.Second
	// strayHintCallTimeout bounds one attempt.
	strayHintCallTimeout = 3 * time.Second
	// strayHintSendersMax bounds the hints in flight from this node;
	// past it a hint is dropped (the sweep remains).
	strayHintSendersMax = 32
	// strayHintChecksMax bounds the hinted checks under way at this node;
	// past it a hint is refused UNAVAILABLE (its sender retries).
	strayHintChecksMax = 16
	// strayHintCheckGap is the least time between two hinted checks of
	// one range.
	strayHintCheckGap = 2 * time.Second
	// strayStreamNameBytesMax bounds the stream name a hint may carry.
	strayStreamNameBytesMax = 1024
)

// strayHints is the node's bounds on hints (see above).
type strayHints struct {
	senders chan struct{}
	checks  chan struct{}
}

func newStrayHints() strayHints {
	return strayHints{senders: make(chan struct{}, strayHintSendersMax), checks: make(chan struct{}, strayHintChecksMax)}
}

// confApplied runs on d's driver goroutine when its replica applied a new
// configuration (replica.Config.OnConfChange): it updates noReplica, and
// a leader hints the nodes the change removed (step 1).
func (d *rangeDriver) confApplied(prev, next *raftpb.ConfState) {
	d.noteMembership(next)
	if d.cfg.repl.onRemoved == nil || d.rep == nil || !d.rep.IsLeader() {
		return
	}
	for _, id := range removedNodes(prev, next) {
		if id != d.cfg.repl.nodeID {
			d.cfg.repl.onRemoved(d, id)
		}
	}
}

// noteMembership sets noReplica from conf: this node is neither a voter
// nor a learner of it. A replica that leaves ends the subscriptions
// waiting on it (subscribe.go).
func (d *rangeDriver) noteMembership(conf *raftpb.ConfState) {
	id := d.cfg.repl.nodeID
	member := slices.Contains(conf.GetVoters(), id) || slices.Contains(conf.GetLearners(), id)
	if d.noReplica.Swap(!member) != !member && !member {
		d.notify()
	}
}

// removedNodes are the nodes prev names (voters, outgoing voters,
// learners) and next does not.
func removedNodes(prev, next *raftpb.ConfState) []uint64 {
	var out []uint64
	for _, ids := range [][]uint64{prev.GetVoters(), prev.GetVotersOutgoing(), prev.GetLearners(), prev.GetLearnersNext()} {
		for _, id := range ids {
			if !confNames(next, id) && !slices.Contains(out, id) {
				out = append(out, id)
			}
		}
	}
	return out
}

// flagStray marks d a confirmed stray (or condemned): reads and
// subscriptions there end with a retriable NOT_LEADER (readable) until
// its replica hears a leader (ready clears it). Driver goroutine.
func (d *rangeDriver) flagStray() {
	if !d.strayFlagged.Swap(true) {
		d.notify()
	}
}

// metaOffsetOf is the catalogue offset of the creation of the stream
// whose range has group g (groupFor's inverse).
func metaOffsetOf(g raftnet.GroupID) uint64 { return uint64(g>>16) - 1 }

// hintRemoved is the leader's step 1 for node id, on d's driver
// goroutine: it starts a task that delivers the hint.
func (n *Node) hintRemoved(d *rangeDriver, id uint64) {
	if d.cfg.repl.groupID == metaGroupID {
		return // the catalogue's members are the region's nodes (members_voters.go)
	}
	req := &geologinternalv1.ReplicaRemovedRequest{Region: n.cfg.Region, NodeId: n.cfg.NodeID, Stream: d.cfg.stream,
		StreamMetaOffset: metaOffsetOf(d.cfg.repl.groupID), Range: d.cfg.rangeID}
	select {
	case n.strayHints.senders <- struct{}{}:
	default:
		n.logger.Warn("replica removal hint dropped: too many in flight", "stream", d.cfg.stream, "range", d.cfg.rangeID, "node", id)
		return
	}
	if !n.tasks.Go(func(ctx context.Context) {
		defer func() { <-n.strayHints.senders }()
		n.sendRemovedHint(ctx, id, req)
	}) {
		<-n.strayHints.senders
	}
}

// sendRemovedHint delivers req to node id, retrying with backoff.
func (n *Node) sendRemovedHint(ctx context.Context, id uint64, req *geologinternalv1.ReplicaRemovedRequest) {
	var last error
	attempts := strayHintAttemptsMax
	if n.cfg.hintAttempts > 0 {
		attempts = n.cfg.hintAttempts
	}
	for attempt := 0; attempt < attempts; attempt++ {
		if attempt > 0 {
			if backoff.Sleep(ctx, backoff.Delay(attempt-1, strayHintRetryMin, strayHintRetryMax, nil)) != nil {
				return
			}
		}
		last = n.callRemovedHint(ctx, id, req)
		if last == nil {
			n.logger.Debug("replica removal hint delivered", "stream", req.GetStream(), "range", req.GetRange(), "node", id, "attempts", attempt+1)
			return
		}
		if !hintRetriable(last) {
			n.logger.Info("replica removal hint refused", "stream", req.GetStream(), "range", req.GetRange(), "node", id, "error", last)
			return
		}
	}
	n.logger.Info("replica removal hint not delivered yet; kept pending", "stream", req.GetStream(), "range", req.GetRange(),
		"node", id, "error", last)
	n.addPendingHint(id, req)
}

// hintRetriable reports whether a hint that failed with err may be
// delivered later (the node was unreachable or busy). Any other answer
// is the receiver's decision: the hint was delivered.
func hintRetriable(err error) bool {
	code := rpcerr.CodeOf(err)
	return code == apierr.Unavailable || code == apierr.Timeout || rpcerr.IsRetriable(err)
}

// callRemovedHint is one attempt of sendRemovedHint.
func (n *Node) callRemovedHint(ctx context.Context, id uint64, req *geologinternalv1.ReplicaRemovedRequest) error {
	if n.testPeerBlocked(id) {
		return apierr.New(apierr.Unavailable, "node %d is cut off (test)", id)
	}
	addr := n.peerAddr(id)
	if addr == "" {
		return apierr.New(apierr.NodeNotFound, "node %d is not a node of the region", id)
	}
	conn, err := n.peerConn(addr)
	if err != nil {
		return apierr.Wrap(apierr.Unavailable, err, "hint to node %d", id)
	}
	cctx, cancel := context.WithTimeout(ctx, strayHintCallTimeout)
	defer cancel()
	_, err = geologinternalv1.NewReplicaHintsClient(conn).ReplicaRemoved(cctx, req)
	return rpcErr(err)
}

// hintServer serves ReplicaHints.
type hintServer struct {
	geologinternalv1.UnimplementedReplicaHintsServer
	node *Node
}

// ReplicaRemoved implements ReplicaHints' ReplicaRemoved (step 2).
func (s *hintServer) ReplicaRemoved(_ context.Context, req *geologinternalv1.ReplicaRemovedRequest) (*geologinternalv1.ReplicaRemovedResponse, error) {
	checking, err := s.node.takeRemovedHint(req)
	if err != nil {
		return nil, err
	}
	return &geologinternalv1.ReplicaRemovedResponse{Checking: checking}, nil
}

// takeRemovedHint checks a hint's form and starts a check of its range,
// if one is due; checking reports whether it did.
func (n *Node) takeRemovedHint(req *geologinternalv1.ReplicaRemovedRequest) (checking bool, err error) {
	if !n.replicated() {
		return false, apierr.New(apierr.Unavailable, "the node is not replicated")
	}
	if req.GetRegion() != n.cfg.Region || req.GetStream() == "" || len(req.GetStream()) > strayStreamNameBytesMax {
		return false, apierr.New(apierr.InvalidArgument, "a replica hint of region %q for a stream name of %d bytes; this is region %q",
			clip([]byte(req.GetRegion())), len(req.GetStream()), n.cfg.Region)
	}
	if n.strayCheckInterval() < 0 {
		return false, nil // sweeping is off: no stray is removed here
	}
	key := strayKey{req.GetStream(), req.GetRange()}
	n.mu.RLock()
	st, ok := n.streams[key.stream]
	var d *rangeDriver
	if ok && st.spec.MetaOffset == req.GetStreamMetaOffset() && int(key.r) < len(st.ranges) {
		d = st.ranges[key.r]
	}
	n.mu.RUnlock()
	if d == nil || d.rep == nil || (d.noReplica.Load() && d.store.Size() == 0) {
		// Nothing here to check, or nothing to remove: a replica outside
		// its configuration that holds no data (never a member, or
		// emptied). One that applied its own removal still holds its
		// copy, and knows a leader that no longer speaks to it: no sweep
		// suspects it, so the hint is its way out.
		return false, nil
	}
	now := time.Now().UnixNano()
	last := d.strayHintAt.Load()
	if now-last < int64(strayHintCheckGap) {
		return false, nil
	}
	select {
	case n.strayHints.checks <- struct{}{}:
	default:
		return false, apierr.New(apierr.Unavailable, "too many replica hints under way")
	}
	if !d.strayHintAt.CompareAndSwap(last, now) {
		<-n.strayHints.checks
		return false, nil // a concurrent hint took it
	}
	if !n.tasks.Go(func(ctx context.Context) {
		defer func() { <-n.strayHints.checks }()
		n.checkHintedStray(ctx, key, d, req.GetNodeId())
	}) {
		<-n.strayHints.checks
		return false, apierr.New(apierr.ShuttingDown, "node is shutting down")
	}
	return true, nil
}

// checkHintedStray is step 2 and 3 for range key, d being this node's
// replica of it when the hint came; from is the node the hint names as
// its sender (logs only).
func (n *Node) checkHintedStray(ctx context.Context, key strayKey, d *rangeDriver, from uint64) {
	if _, stray := n.askStray(ctx, key); !stray {
		return // a member, or no leader answered: the hint changes nothing
	}
	n.logger.Info("replica removed from its range, as hinted: removing it", "stream", key.stream, "range", key.r, "hinted_by", from)
	// A replica that hears its removal as the hint comes learns the
	// leader again from the append that carries it, after it forgot it:
	// a leader that stopped sending is forgotten for good on the next
	// round, one that re-adds the node keeps speaking (every round).
	for round := 0; round < strayHintRoundsMax; round++ {
		if !n.forgetHintedLeader(ctx, d) || backoff.Sleep(ctx, n.strayHintSettle()) != nil {
			return
		}
		voters, stray := n.askStray(ctx, key)
		if !stray {
			return // re-added meanwhile, or no answer: the sweep finds it if it is a stray
		}
		if err := n.removeStray(ctx, key, d, voters); err != nil {
			n.logger.Warn("stray replica not removed", "stream", key.stream, "range", key.r, "error", err)
			return
		}
		if n.localRange(key.stream, key.r) != d {
			return // removed (or the stream changed meanwhile)
		}
	}
}

// strayHintRoundsMax bounds the rounds of checkHintedStray.
const strayHintRoundsMax = 3

// forgetHintedLeader makes d's replica, confirmed a stray by its range's
// leader, forget its leader and flags it (step 3).
func (n *Node) forgetHintedLeader(ctx context.Context, d *rangeDriver) bool {
	cctx, cancel := context.WithTimeout(ctx, strayAskTimeout)
	defer cancel()
	return d.exec(cctx, func() {
		d.rep.ForgetLeader()
		d.flagStray()
	}) == nil
}

// strayHintSettle is two election timeouts: a leader re-adding this node
// speaks to it within that.
func (n *Node) strayHintSettle() time.Duration {
	return 2 * time.Duration(max(n.cfg.ElectionTicks, 1)) * n.cfg.TickInterval
}

// testPeerBlocked reports whether a test cut this node off from peer
// (Raft messages from it are dropped, hints to it fail).
func (n *Node) testPeerBlocked(peer uint64) bool {
	f := n.testBlockPeer.Load()
	return f != nil && (*f)(peer)
}
