package replica

import (
	"bytes"
	"slices"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/quorum"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"
)

// Quiescence: an idle group costs nothing (CockroachDB's quiescence).
//
// A Raft group ticks to send heartbeats and to notice a dead leader; an
// idle one gains nothing from either while every member is up. So a leader
// whose group has nothing in flight (Quiesce: every follower holds and
// knows every entry, all applied here, nothing proposed, read, reconfigured
// or transferred) sends each follower one last heartbeat carrying the
// commit index and a marker (quiesceContext) and stops ticking; a follower
// that steps it while caught up with that leader stops ticking too. Quiesced
// reports it to the driver, which then takes the replica's tick channel out
// of its select: a quiesced range wakes for nothing but its own events.
//
// Waking is implicit. Any message other than the quiesce heartbeat and its
// answer clears the state (Step), and Quiesced stays true only while the
// group is as it was when it quiesced: a proposal, a read, a membership
// change, a transfer, a campaign, a change of term or leader all end it,
// whoever caused them. The leader's appends wake its followers.
//
// What a tick would have noticed is the driver's: a follower of a quiesced
// group cannot time its leader out, so the driver watches the leader's node
// instead (node liveness: regionsvc wakes a quiesced follower whose
// leader's node its transport finds down, and it campaigns), and wakes a
// quiesced leader when any peer's liveness changes (a follower it left
// behind, a preferred leader back). A leader cut off from everyone learns
// so the same way and then steps down on its ticks (CheckQuorum).

// quiesceContext marks a leader's quiesce heartbeat in the message's
// Context (Raft echoes it in the follower's MsgHeartbeatResp, and takes
// any other context of an answer as a read-index position: Step takes the
// marker off before Raft sees the answer). Raft's own contexts are 8
// bytes, so the two never collide.
var quiesceContext = []byte("geolog.quiesce")

// quiesceState is what a quiesced replica was quiesced at (driver
// goroutine).
type quiesceState struct {
	on          bool
	term, lead  uint64
	index       uint64
	leaderState bool
}

// IsQuiesceHeartbeat reports whether m is a leader's quiesce heartbeat or a
// follower's answer to one: messages that neither wake a quiesced replica
// nor keep it awake.
func IsQuiesceHeartbeat(m *raftpb.Message) bool {
	t := m.GetType()
	return (t == raftpb.MsgHeartbeat || t == raftpb.MsgHeartbeatResp) && bytes.Equal(m.GetContext(), quiesceContext)
}

// Quiesced reports whether the driver may stop ticking this replica: it
// quiesced (Quiesce, or a leader's quiesce heartbeat) and nothing since
// needs a clock. For the driver goroutine.
func (r *Replica) Quiesced() bool {
	q := &r.quiesce
	if !q.on {
		return false
	}
	if !r.idleAt(q.term, q.lead, q.leaderState) || (q.leaderState && r.tailIndex != q.index) {
		q.on = false
	}
	return q.on
}

// wakeForClient wakes a quiesced follower that a client asked for an
// append or a linearizable read (it answers NOT_LEADER). A client comes to
// a follower when it could not reach the leader, or was sent away by it:
// the leader may be cut off while its process lives, which node liveness
// notices only after the transport's keepalive (seconds). Ticking again,
// the follower times the leader out after an election timeout and
// campaigns; its pre-vote wakes the others, which join once their own
// election timeout passed. A live leader refuses the pre-vote (CheckQuorum
// lease), wakes on it and quiesces the group again once it is idle, so a
// stale client costs a few heartbeats, never an election.
func (r *Replica) wakeForClient() { r.quiesce.on = false }

// Unquiesce makes the replica tick again (Quiesced false) until it quiesces
// anew: the driver's wake-up when node liveness changed.
func (r *Replica) Unquiesce() { r.quiesce.on = false }

// idleAt reports whether nothing that needs the clock is under way, and
// the replica is still in the term, under the leader and in the role
// given.
func (r *Replica) idleAt(term, lead uint64, leader bool) bool {
	if r.failure.Load() != nil || r.diskFull.Load() != nil || len(r.proposals) > 0 || len(r.duplicates) > 0 ||
		len(r.reads) > 0 || r.relearn.on || r.pendingConf != nil || r.fork.proposal != nil || r.fork.skip != nil || r.staged != nil {
		return false
	}
	st := r.rn.BasicStatus()
	want := raft.StateFollower
	if leader {
		want = raft.StateLeader
	}
	return st.RaftState == want && st.GetTerm() == term && st.Lead == lead && st.LeadTransferee == 0
}

// Quiesce quiesces a leader whose group is idle, on a tick, instead of
// ticking it: it sends every follower a quiesce heartbeat and returns true;
// Quiesced then holds until something wakes the group. It returns false
// (and sends nothing) when the group is not idle: this replica does not
// lead, something is proposed, read, reconfigured, transferred or forked,
// Raft has a Ready, a log write is queued, a commit index is held for a
// follower (commithold.go), an entry is not committed and
// applied here, or a follower does not hold every entry in Raft's
// replicate state. live(id), if not nil, says whether a follower's node is
// up: a follower that is down is not waited for (it catches up when it is
// back: the driver wakes the leader when liveness changes), but a leader
// whose live voters are no quorum does not quiesce (it ticks on, and its
// quorum check steps it down). For the driver goroutine.
func (r *Replica) Quiesce(live func(id uint64) bool) bool {
	if r.quiesce.on {
		return true
	}
	st := r.rn.BasicStatus()
	// A leader whose quorum watch found no quorum does not quiesce even
	// when its followers answer again: only a tick clears the watch, and
	// quiesced it would refuse every append for ever.
	if !r.isLeader || r.quorum.lost || !r.idleAt(st.GetTerm(), r.cfg.NodeID, true) || r.rn.HasReady() || r.HasLogWrites() || len(r.held.msgs) > 0 {
		return false
	}
	last := r.tailIndex
	if st.GetCommit() != last || r.appliedIndex != last {
		return false
	}
	to, ok := r.quiesceTargets(last, live)
	if !ok {
		return false
	}
	if live != nil && !quorumLive(r.cfg.NodeID, r.rn.Status().Config.Voters, live) {
		// Cut off from a quorum: it keeps ticking, so that its quorum
		// check steps it down (quiesced, it would lead on, unseen, until
		// it heard the new leader's term).
		return false
	}
	slices.Sort(to) // in id order, not the map's: the simulator replays its sends
	msgs := make([]*raftpb.Message, 0, len(to))
	for _, id := range to {
		msgs = append(msgs, &raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), To: proto.Uint64(id),
			From: proto.Uint64(r.cfg.NodeID), Term: proto.Uint64(st.GetTerm()), Commit: proto.Uint64(last),
			Context: quiesceContext})
	}
	if len(msgs) > 0 {
		r.cfg.Send(msgs)
	}
	r.quiesce = quiesceState{on: true, term: st.GetTerm(), lead: r.cfg.NodeID, index: last, leaderState: true}
	return true
}

// quiesceTargets returns the followers a leader whose log ends at index
// last sends its quiesce heartbeat to (Quiesce), or false if one keeps it
// from quiescing. It visits Raft's progress in place (RawNode.WithProgress)
// rather than through Status, which copies every peer's progress: a busy
// group's idle leader asks on every tick. live must not change anything.
func (r *Replica) quiesceTargets(last uint64, live func(id uint64) bool) ([]uint64, bool) {
	var to []uint64
	ok := true
	r.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		if !ok || id == r.cfg.NodeID {
			return
		}
		if live != nil && !live(id) {
			if pr.RecentActive && pr.Match != last {
				// Not until Raft's quorum check (a ticking leader's, each
				// election timeout) found it inactive: until then it holds
				// compaction back (compact.go), and a quiesced leader
				// would hold it for ever.
				ok = false
			}
			return
		}
		if pr.Match != last || pr.State != tracker.StateReplicate {
			ok = false
			return
		}
		to = append(to, id)
	})
	return to, ok
}

// quorumLive reports whether the live voters (this replica, self, and
// those live says are up) are a quorum of each half of voters.
func quorumLive(self uint64, voters quorum.JointConfig, live func(id uint64) bool) bool {
	for _, half := range voters {
		if len(half) == 0 {
			continue
		}
		up := 0
		for id := range half {
			if id == self || live(id) {
				up++
			}
		}
		if up <= len(half)/2 {
			return false
		}
	}
	return true
}

// takeQuiesceMarker reports whether m is a quiesce heartbeat or the
// answer to one (IsQuiesceHeartbeat), and takes the marker off an answer:
// Raft reads a heartbeat answer's context as a read-index position, so
// the leader steps it as a plain one.
func takeQuiesceMarker(m *raftpb.Message) bool {
	if !IsQuiesceHeartbeat(m) {
		return false
	}
	if m.GetType() == raftpb.MsgHeartbeatResp {
		m.Context = nil
	}
	return true
}

// noteQuiesce runs in Step after Raft stepped m (commit is m's commit
// index as sent, quiesce whether it was a quiesce heartbeat or its
// answer): a quiesce heartbeat quiesces a follower that holds and has
// committed every entry up to it, led by its sender in its term; the
// answer to one changes nothing; any other message wakes the replica.
func (r *Replica) noteQuiesce(m *raftpb.Message, commit uint64, quiesce bool) {
	if !quiesce {
		r.quiesce.on = false
		return
	}
	if m.GetType() != raftpb.MsgHeartbeat {
		return
	}
	st := r.rn.BasicStatus()
	if !r.idleAt(m.GetTerm(), m.GetFrom(), false) || st.GetCommit() != commit || r.lastHeld() != commit {
		r.quiesce.on = false
		return
	}
	r.quiesce = quiesceState{on: true, term: m.GetTerm(), lead: m.GetFrom(), index: commit}
}
