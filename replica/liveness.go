package replica

import (
	"fmt"
	"slices"

	"github.com/geolog/geolog/apierr"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Liveness under faults: what a leader does when it can no longer commit,
// so that producers waiting on it move on instead of waiting for the fault
// to end.
//
//   - A leader that has heard no response from a quorum of the voters
//     (itself included) for an election timeout (Config.ElectionTick
//     ticks) fails its pending appends and the retries waiting for them
//     with a retriable NOT_LEADER without a hint, and refuses new ones the
//     same way, until a quorum answers again. Raft's CheckQuorum makes it
//     step down at its next quorum check (within another election
//     timeout); this does not wait for that. A failed append may still
//     commit (a quorum may hold it; a new leader then commits it): the
//     error says the outcome is unknown, and an idempotent retry is
//     answered as a duplicate with the original offsets.
//   - A leader that loses leadership fails its pending appends at once,
//     the same way but with the new leader as the hint when known, instead
//     of when the new leader's first entry commits here (which, for a
//     leader cut off from the others, is only after the partition heals).
//   - A leader that stops (a failed write or fsync of its log, or any
//     other error that stops the replica: see fail) hands leadership to
//     its most caught-up follower at once (MsgTimeoutNow, as a leadership
//     transfer ends), instead of leaving the group to notice after an
//     election timeout. A stopped replica steps no more messages and
//     ticks no more (as a crashed one: it votes for nobody and acks
//     nothing, and its in-memory log, which may hold entries the failed
//     fsync lost, is never used again); it only notes which node leads
//     now, from that leader's appends and heartbeats, so that the appends
//     it refuses name it (StoppedAppendError).

// quorumWatch is a leader's record of which voters answered it lately, in
// ticks (driver goroutine).
type quorumWatch struct {
	tick uint64
	// heard maps a voter to the tick of the last response stepped from
	// it in this replica's term.
	heard map[uint64]uint64
	// lost is set while a leader has heard from no quorum for an election
	// timeout.
	lost bool
}

// noteHeard records a response from a peer to this leader's appends or
// heartbeats.
func (r *Replica) noteHeard(m *raftpb.Message) {
	t := m.GetType()
	if !r.isLeader || m.GetTerm() != r.term || (t != raftpb.MsgAppResp && t != raftpb.MsgHeartbeatResp) {
		return
	}
	if r.quorum.heard == nil {
		r.quorum.heard = make(map[uint64]uint64)
	}
	r.quorum.heard[m.GetFrom()] = r.quorum.tick
}

// watchQuorum runs on every Tick: a leader that heard no quorum within an
// election timeout fails its pending appends (see the comment at the top
// of this file).
func (r *Replica) watchQuorum() {
	q := &r.quorum
	q.tick++
	if !r.isLeader {
		q.lost = false
		return
	}
	conf := r.state.Conf
	if len(conf.GetVotersOutgoing()) > 0 {
		return // a joint configuration: Raft's own check decides
	}
	voters := conf.GetVoters()
	if q.heard == nil {
		q.heard = make(map[uint64]uint64)
	}
	heard, self := 0, false
	for _, id := range voters {
		if id == r.cfg.NodeID {
			heard, self = heard+1, true
			continue
		}
		last, ok := q.heard[id]
		if !ok {
			// A voter this leader has not counted yet (it just became
			// leader, or the voter was just added) gets a full timeout.
			q.heard[id], last = q.tick, q.tick
		}
		if q.tick-last < uint64(r.cfg.ElectionTick) {
			heard++
		}
	}
	lost := self && heard < len(voters)/2+1
	if lost && !q.lost {
		r.logger.Warn("leader heard no quorum within an election timeout: failing pending appends",
			"term", r.term, "heard", heard, "voters", len(voters))
		r.failPending(r.noQuorumError())
	}
	q.lost = lost
}

// leadershipChanged runs in ProcessReady after isLeader was updated from a
// SoftState: a new leader starts its quorum watch afresh; a deposed one
// fails what it has pending at once.
func (r *Replica) leadershipChanged(wasLeader bool) {
	switch {
	case r.isLeader && !wasLeader:
		clear(r.quorum.heard)
		r.quorum.lost = false
	case wasLeader && !r.isLeader:
		r.quorum.lost = false
		if r.Pending() > 0 {
			e := r.notLeader()
			e.Message += ": this node lost leadership; the append may still commit (an idempotent retry is safe)"
			r.failPending(e)
		}
	}
}

// noQuorumError is the retriable error of a leader cut off from its
// quorum. It names no leader: this node still leads as far as it knows,
// and the one the others elect is unknown to it.
func (r *Replica) noQuorumError() *apierr.Error {
	e := apierr.New(apierr.NotLeader, "stream %s range %d: node %d leads but has heard from no quorum within an election timeout; "+
		"the append may still commit (an idempotent retry is safe)", r.cfg.Stream, r.cfg.Range, r.cfg.NodeID)
	e.LeaderCutOff = true
	return e
}

// failPending answers every pending append, and every retry waiting for
// its original to commit, with e.
func (r *Replica) failPending(e *apierr.Error) {
	ps := append(r.proposals, r.duplicates...)
	r.proposals, r.duplicates = nil, nil
	for _, p := range ps {
		p.op.Reply(Result{Err: e})
	}
}

// leaveOnFailure runs once as the replica stops with failure f (fail):
// it records whether other voters can take the range's appends and which
// leader it knows (StoppedAppendError), hands leadership away if it led
// (handOff), and stops counting itself as leader.
func (r *Replica) leaveOnFailure(f *apierr.Error) {
	r.stoppedLeaderTerm.Store(r.term)
	if id := r.leaderID.Load(); id != r.cfg.NodeID {
		r.stoppedLeader.Store(id)
	}
	if slices.ContainsFunc(r.state.Conf.GetVoters(), func(id uint64) bool { return id != r.cfg.NodeID }) {
		r.stoppedOthers.Store(true)
	}
	if !r.isLeader || f.Code == apierr.ShuttingDown {
		return
	}
	r.handOff()
	r.isLeader = false
	r.leaderTerm.Store(0)
	r.leaderID.Store(0)
}

// handOff asks a stopping leader's most caught-up follower to campaign at
// once: MsgTimeoutNow, the message that ends a leadership transfer. The
// follower campaigns at the next term without pre-vote; the usual vote
// rules decide (a follower missing committed entries cannot win), so this
// is as safe as any election. Nothing is sent in a group of one; a closing
// replica does not come here (its driver transfers leadership first).
func (r *Replica) handOff() {
	st := r.rn.Status()
	var to, match uint64
	for id, pr := range st.Progress {
		if id == r.cfg.NodeID || pr.IsLearner {
			continue
		}
		if to == 0 || pr.Match > match || (pr.Match == match && id < to) {
			to, match = id, pr.Match
		}
	}
	if to == 0 {
		return
	}
	r.logger.Warn("replica stopped while leading: handing leadership to a follower", "to", to, "term", r.term)
	r.cfg.Send([]*raftpb.Message{{Type: raftpb.MsgTimeoutNow.Enum(), To: proto.Uint64(to),
		From: proto.Uint64(r.cfg.NodeID), Term: proto.Uint64(r.term)}})
}

// stepStopped is Step on a stopped replica: nothing reaches Raft; a
// leader's append or heartbeat of a later term says who leads now.
func (r *Replica) stepStopped(m *raftpb.Message) {
	t := m.GetType()
	if (t == raftpb.MsgApp || t == raftpb.MsgHeartbeat) && m.GetTerm() >= r.stoppedLeaderTerm.Load() && m.GetFrom() != r.cfg.NodeID {
		r.stoppedLeaderTerm.Store(m.GetTerm())
		r.stoppedLeader.Store(m.GetFrom())
	}
}

// StoppedAppendError is the error an append gets from this replica once it
// stopped (Failure is not nil). Where the group has other voters, one of
// them takes the range's appends: a retriable NOT_LEADER naming the leader
// as a "node:<id>" hint once this replica has heard from it, with the
// failure in the message. Otherwise (a group of one, a replica closing)
// the failure itself. Safe from any goroutine; nil while not stopped.
func (r *Replica) StoppedAppendError() error {
	f := r.failure.Load()
	if f == nil {
		return nil
	}
	if f.Code == apierr.ShuttingDown || !r.stoppedOthers.Load() {
		return f
	}
	e := apierr.New(apierr.NotLeader, "%s; the range's other replicas take its appends", f.Message)
	if id := r.stoppedLeader.Load(); id != 0 {
		e.LeaderHint = fmt.Sprintf("node:%d", id)
	}
	return e
}
