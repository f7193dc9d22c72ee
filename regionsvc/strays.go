package regionsvc

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/geolog/geolog/vfs"
	"go.etcd.io/raft/v3/raftpb"
)

// Stray replicas (CockroachDB's replica GC queue). A range's replica on
// a node stays where it is when the range's configuration drops the
// node: a node found dead whose replicas the rebalancer moved, or a
// source of a move that never heard its own removal (the leader stops
// sending to a removed node before that node learns the removal
// committed). Such a replica still holds the range's segments and Raft
// state, its own configuration may still name it a voter, and it
// campaigns for ever (PreVote and CheckQuorum keep the members from
// following it) and serves its stale prefix to readers.
//
// A removed replica that still knows a leader (quiesced when it was
// removed) is never a suspect: the leader hints it instead, and the hint
// runs steps 2-4 at once (strayhint.go).
//
// Every node sweeps its ranges every strayCheckInterval (collectStrays):
//
//  1. A range is a suspect when its replica knows no leader (the atomic
//     LeaderID, then raft's own Status on the driver goroutine) and
//     either its configuration names this node or its log holds data. A
//     member hears its leader (heartbeats, or a quiesce heartbeat), so a
//     healthy member is never a suspect; a passive replica that was never
//     a member holds nothing and is never one either. A suspect keeps
//     serving its committed prefix (a member cut off from its quorum is
//     one too); once its leader confirms it is no member (step 3, or a
//     hint), it is flagged (rangeDriver.strayFlagged): reads and
//     subscriptions there end with a retriable NOT_LEADER.
//  2. A range that is a suspect in strayConfirmSweeps sweeps in a row is
//     asked about: DescribeReplicas at its leader (rangeRouter). Only an
//     answer from a leader counts; no answer, or an answer that names this
//     node as a voter or a learner, ends the matter (suspicion restarts).
//  3. The answer's configuration is the leader's applied one, so a
//     committed one that excludes this node. A later re-add (a learner
//     first) could be under way: its leader would be sending to this
//     node. So the driver goroutine checks again that raft knows no
//     leader and, in the same step, condemns the driver: it steps no
//     Raft message from then on, so nothing this node acknowledges after
//     the check can count at a leader. A re-added learner finds the
//     node's copy empty and catches up from nothing, as any new learner.
//  4. The driver stops; a tombstone (<range>.removed, the answer's
//     voters) is written atomically beside the range's directory; the
//     directory is removed (segments, Raft state, orphan log: the disk
//     space comes back); the range opens again as a passive replica,
//     empty, whose first configuration is the tombstone's voters, without
//     this node: it never campaigns (raft does not campaign outside its
//     configuration), holds nothing to read, and a later move can add it
//     back as a learner. A crash anywhere in step 4 is safe: before the
//     tombstone the old replica opens again (and is found again); after
//     it, a missing or empty directory opens from the tombstone, never
//     from the stream's placed voters (which name this node).

// strayCheckIntervalDefault is the pause between sweeps for strays.
const strayCheckIntervalDefault = 30 * time.Second

// strayConfirmSweeps is how many sweeps in a row a range must be a
// suspect before its leader is asked.
const strayConfirmSweeps = 2

// strayAsksPerSweepMax bounds the leaders asked in one sweep.
const strayAsksPerSweepMax = 64

// strayAskTimeout bounds one range's question to its leader.
const strayAskTimeout = 15 * time.Second

// strayTombstoneSuffix names a removed stray's tombstone beside its
// range directory.
const strayTombstoneSuffix = ".removed"

// strayTombstone is what a removed stray leaves: the voters of the range
// as its leader answered, the first configuration of the passive replica
// that replaces it.
type strayTombstone struct {
	Voters []uint64 `json:"voters"`
}

// strayKey names one range of one stream.
type strayKey struct {
	stream string
	r      uint32
}

// strayCheckInterval is the sweep interval: RebalanceConfig's, or the
// default; negative turns sweeping off.
func (n *Node) strayCheckInterval() time.Duration {
	if iv := n.cfg.Rebalance.StrayCheckInterval; iv != 0 {
		return iv
	}
	return strayCheckIntervalDefault
}

// collectStrays sweeps the node's ranges for strays until ctx ends (a
// stopper task).
func (n *Node) collectStrays(ctx context.Context) {
	iv := n.strayCheckInterval()
	if iv < 0 {
		return
	}
	t := time.NewTicker(iv)
	defer t.Stop()
	suspects := map[*rangeDriver]int{} // this goroutine's
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		n.sweepStrays(ctx, suspects)
	}
}

// sweepStrays is one sweep (steps 1-2 above); suspects counts each
// driver's sweeps in a row as a suspect.
func (n *Node) sweepStrays(ctx context.Context, suspects map[*rangeDriver]int) {
	seen := map[*rangeDriver]bool{}
	asked := 0
	for key, d := range n.strayCandidates() {
		seen[d] = true
		if !n.straySuspect(ctx, d) {
			delete(suspects, d)
			continue
		}
		suspects[d]++
		if suspects[d] < strayConfirmSweeps || asked >= strayAsksPerSweepMax {
			continue
		}
		asked++
		voters, stray := n.askStray(ctx, key)
		if !stray {
			delete(suspects, d)
			continue
		}
		delete(suspects, d)
		if err := n.removeStray(ctx, key, d, voters); err != nil {
			n.logger.Warn("stray replica not removed", "stream", key.stream, "range", key.r, "error", err)
		}
	}
	for d := range suspects {
		if !seen[d] {
			delete(suspects, d) // closed, deleted or replaced since
		}
	}
}

// strayCandidates are the node's stream ranges that know no leader (the
// atomic view; straySuspect checks on the driver).
func (n *Node) strayCandidates() map[strayKey]*rangeDriver {
	out := map[strayKey]*rangeDriver{}
	n.mu.RLock()
	defer n.mu.RUnlock()
	for name, st := range n.streams {
		for r, d := range st.ranges {
			if d != nil && d.rep != nil && d.rep.LeaderID() == 0 {
				out[strayKey{name, uint32(r)}] = d
			}
		}
	}
	return out
}

// straySuspect reports, on d's goroutine, whether d knows no leader and
// either its configuration names this node or its log holds data.
func (n *Node) straySuspect(ctx context.Context, d *rangeDriver) bool {
	self := n.cfg.NodeID
	suspect := false
	cctx, cancel := context.WithTimeout(ctx, strayAskTimeout)
	defer cancel()
	err := d.exec(cctx, func() {
		st := d.rep.Status()
		if st.Lead != 0 {
			return
		}
		// A suspect still serves its committed prefix: a member cut off
		// from a quorum (a region that lost two of three nodes) is one
		// too, and its readers keep what they can read. Only a confirmed
		// stray refuses (steps 3-4, strayhint.go).
		suspect = confNames(d.rep.Conf(), self) || st.HardState.GetCommit() > 0 || d.store.Size() > 0
	})
	return err == nil && suspect
}

// confNames reports whether conf names id as a voter (incoming or
// outgoing) or a learner.
func confNames(conf *raftpb.ConfState, id uint64) bool {
	return slices.Contains(conf.GetVoters(), id) || slices.Contains(conf.GetVotersOutgoing(), id) ||
		slices.Contains(conf.GetLearners(), id) || slices.Contains(conf.GetLearnersNext(), id)
}

// askStray asks the range's leader for its configuration; stray is true
// only when a leader answered and its configuration does not name this
// node. voters are the answer's.
func (n *Node) askStray(ctx context.Context, key strayKey) (voters []uint64, stray bool) {
	cctx, cancel := context.WithTimeout(ctx, strayAskTimeout)
	defer cancel()
	rr := &rangeRouter{n: n, stream: key.stream, r: key.r}
	resp, err := rr.Describe(cctx)
	if err != nil || resp.GetLeaderId() == 0 || resp.GetLeaderId() == n.cfg.NodeID {
		return nil, false
	}
	for _, rs := range resp.GetReplicas() {
		if rs.GetNodeId() == n.cfg.NodeID {
			return nil, false // a member, or being added
		}
		if rs.GetRole() == "voter" {
			voters = append(voters, rs.GetNodeId())
		}
	}
	return voters, len(voters) > 0
}

// removeStray carries out step 3 and 4 above for d, range key, whose
// leader answered voters.
func (n *Node) removeStray(ctx context.Context, key strayKey, d *rangeDriver, voters []uint64) error {
	condemned := false
	cctx, cancel := context.WithTimeout(ctx, strayAskTimeout)
	defer cancel()
	err := d.exec(cctx, func() {
		if d.rep.Status().Lead != 0 {
			return
		}
		d.condemned = true // step() steps nothing more (replicated.go)
		d.flagStray()      // subscriptions on this driver end now
		condemned = true
	})
	if err != nil {
		return err
	}
	if !condemned {
		return nil // a leader spoke to it meanwhile: not a stray, or re-added
	}
	n.mu.RLock()
	st, ok := n.streams[key.stream]
	current := ok && int(key.r) < len(st.ranges) && st.ranges[key.r] == d
	n.mu.RUnlock()
	if !current {
		return nil // deleted or replaced meanwhile: a condemned driver is stopped by its owner
	}
	d.stop()
	dir := n.rangeDir(key.stream, key.r)
	b, err := json.Marshal(strayTombstone{Voters: voters})
	if err != nil {
		return err
	}
	if err := vfs.WriteFileAtomic(n.cfg.fsys(), dir+strayTombstoneSuffix, b, 0o600); err != nil {
		n.reopenStray(key, d) // the stray as it was: found again at a later sweep
		return fmt.Errorf("tombstone: %w", err)
	}
	if n.replServer != nil {
		n.replServer.Forget(key.stream, key.r)
	}
	if err := os.RemoveAll(dir); err != nil {
		// What is left opens under the tombstone: the Raft state if it
		// is still there (a stray again, found again), else an empty
		// non-member.
		n.reopenStray(key, d)
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	n.reopenStray(key, d)
	n.logger.Info("stray replica removed", "stream", key.stream, "range", key.r, "voters", voters)
	return nil
}

// reopenStray opens range key again, a passive replica from its
// tombstone, in place of the stopped stray d, unless the stream was
// deleted or replaced meanwhile.
func (n *Node) reopenStray(key strayKey, d *rangeDriver) {
	n.mu.RLock()
	st, ok := n.streams[key.stream]
	n.mu.RUnlock()
	if !ok || int(key.r) >= len(st.ranges) || st.ranges[key.r] != d {
		return
	}
	nd := n.openRange(st.spec, st.spec.MetaOffset, key.r)
	// The range's preferred leader came from a catalogue record applied
	// once, onto d: the rebalancer reads it here (preferredOf), and
	// without it plans transfers the ranges undo.
	nd.balance.pref.Store(d.balance.pref.Load())
	n.mu.Lock()
	cur, ok := n.streams[key.stream]
	if !ok || cur.spec.MetaOffset != st.spec.MetaOffset || int(key.r) >= len(cur.ranges) || cur.ranges[key.r] != d {
		n.mu.Unlock()
		nd.stop() // the stream went or changed: its owner removed the files
		return
	}
	ranges := slices.Clone(cur.ranges)
	ranges[key.r] = nd
	n.streams[key.stream] = &streamState{spec: cur.spec, ranges: ranges}
	n.region.groups[groupFor(cur.spec.MetaOffset, key.r)] = nd
	n.mu.Unlock()
}

// rangePeers are the first voters of range r of spec on this node: the
// placed ones, unless a stray of the range was removed here (a
// tombstone): then the voters its leader answered, which never name this
// node, so that the range's passive replica never campaigns.
func (n *Node) rangePeers(spec streamSpec, r uint32) []uint64 {
	peers := n.rangeReplicas(spec, r)
	b, err := vfs.ReadFile(n.cfg.fsys(), n.rangeDir(spec.Name, r)+strayTombstoneSuffix, 1<<20)
	if err != nil {
		if !os.IsNotExist(err) {
			n.logger.Error("read stray tombstone; the range opens without this node", "stream", spec.Name, "range", r, "error", err)
			return withoutNode(peers, n.cfg.NodeID)
		}
		return peers
	}
	var ts strayTombstone
	if err := json.Unmarshal(b, &ts); err != nil || len(withoutNode(ts.Voters, n.cfg.NodeID)) == 0 {
		n.logger.Error("bad stray tombstone; the range opens without this node", "stream", spec.Name, "range", r, "error", err)
		return withoutNode(peers, n.cfg.NodeID)
	}
	return withoutNode(ts.Voters, n.cfg.NodeID)
}

// withoutNode returns ids without id; if nothing is left, a voter no node
// has (raft's largest id), so that a group of none but this node is never
// created with this node in it.
func withoutNode(ids []uint64, id uint64) []uint64 {
	out := slices.DeleteFunc(slices.Clone(ids), func(x uint64) bool { return x == id })
	if len(out) == 0 {
		out = []uint64{^uint64(0)}
	}
	return out
}

// strayTombstonePath is range r's tombstone path (tests).
func (n *Node) strayTombstonePath(stream string, r uint32) string {
	return filepath.Join(n.rangeDir(stream, r) + strayTombstoneSuffix)
}
