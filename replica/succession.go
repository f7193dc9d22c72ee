package replica

import (
	"slices"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Succession: how soon the followers of a leader that went silent (its
// process paused or dead, or its links cut) elect another.
//
// Raft's election timer fires after a random [ElectionTick, 2×ElectionTick)
// ticks without word from the leader, which spreads the followers out so
// that their votes rarely split; the next leader is therefore elected
// anywhere between one and two election timeouts after the leader fell
// silent (0.8 to 1.6 s at regionsvc's defaults), and sometimes later when
// the first pre-vote comes a tick before the other follower's CheckQuorum
// lease ran out. A follower instead campaigns at a fixed point: its rank
// among the voters other than the silent leader (ordered by id) gives it
// ElectionTick+1+rank ticks, so the first follower asks one tick after any
// follower's lease can still hold (the other follower heard the leader last
// at about the same time, its clock a fraction of a tick apart), and the
// others a tick apart each: no two campaign together, and the first
// normally wins at once. Raft's own timer runs on beneath (a follower whose
// campaign failed, its log behind the other's say, may win by it as
// before); a follower that lost its leader and sees no other elected
// campaigns again a couple of ticks later, for up to an election timeout.
//
// Nothing here changes what an election may decide. The campaign is Raft's
// (pre-vote first, then the vote, both under the usual rules), so a
// follower that lost touch with a leader the others still hear is refused
// (their lease holds: CheckQuorum) and bumps no term. Only the moment
// changes, within what Raft's randomised timer could have chosen.

// campaignRetryTicks is how long a follower that lost its leader waits,
// with no leader elected, before it campaigns again (plus its rank, so
// that two followers whose votes split do not campaign together again): a
// vote between nodes that hear each other takes a round trip and a state
// save, well within it.
const campaignRetryTicks = 2

// successionWatch is a follower's record of when it last heard from its
// leader, in ticks (driver goroutine).
type successionWatch struct {
	tick uint64
	// lead is the leader followed at term; contact the tick of its last
	// append or heartbeat stepped here (or of when it became the leader
	// followed).
	lead, term, contact uint64
	// electing is set while no leader is known since one was lost (this
	// node's campaign, Raft's timer, a vote request of a newer term), from
	// tick first; last is the tick of the latest campaign, rank this
	// node's successorRank after the lost leader.
	electing    bool
	first, last uint64
	rank        int
}

// noteLeaderContact records an append or heartbeat of the followed leader.
func (r *Replica) noteLeaderContact(m *raftpb.Message) {
	w := &r.succession
	t := m.GetType()
	if w.lead != 0 && m.GetFrom() == w.lead && m.GetTerm() >= w.term && (t == raftpb.MsgApp || t == raftpb.MsgHeartbeat) {
		w.contact = w.tick
	}
}

// watchLeader runs on every Tick: a voter following a leader it has not
// heard from for ElectionTick+1+rank ticks campaigns (see above). Once the
// leader is lost, while no other is elected, it campaigns again every
// campaignRetryTicks+rank ticks, for an election timeout: its pre-vote may
// have come while the other follower's lease still held (it heard the
// leader last), or both may have campaigned at the same moment (a split
// vote, which Raft alone settles only after another random timeout).
func (r *Replica) watchLeader() {
	w := &r.succession
	w.tick++
	st := r.rn.BasicStatus()
	switch {
	case st.RaftState == raft.StateLeader:
		w.lead, w.electing = 0, false
	case st.RaftState == raft.StateFollower && st.Lead != raft.None:
		w.electing = false
		if st.Lead != w.lead || st.GetTerm() != w.term {
			w.lead, w.term, w.contact = st.Lead, st.GetTerm(), w.tick
			return
		}
		rank, ok := r.successorRank(st.Lead)
		if !ok || w.tick-w.contact < uint64(r.cfg.ElectionTick+1+rank) {
			return
		}
		r.logger.Info("heard nothing from the leader for an election timeout: campaigning", "leader", st.Lead, "term", st.GetTerm(), "rank", rank)
		// Electing from now: the next ticks find a (pre-)candidate.
		w.lead, w.rank, w.electing, w.first = 0, rank, true, w.tick
		r.campaignForSuccession()
	case w.lead != 0: // the leader followed was just lost
		w.rank, w.electing = r.successorRank(w.lead)
		w.lead, w.first, w.last = 0, w.tick, w.tick
	case w.electing && w.tick-w.last >= uint64(campaignRetryTicks+w.rank) && w.tick-w.first < uint64(r.cfg.ElectionTick):
		r.campaignForSuccession()
	}
}

// campaignForSuccession starts a campaign (pre-vote first) and notes when.
func (r *Replica) campaignForSuccession() {
	r.succession.last = r.succession.tick
	// An error here is only Raft's refusal to campaign (a pending
	// configuration change not applied yet): its own timer goes on.
	_ = r.rn.Campaign()
}

// successorRank is this replica's place, from 0, among the voters other
// than lead ordered by id; false if it is no voter or the configuration is
// joint (Raft's own timer decides then).
func (r *Replica) successorRank(lead uint64) (int, bool) {
	conf := r.state.Conf
	if len(conf.GetVotersOutgoing()) > 0 {
		return 0, false
	}
	voters := slices.Clone(conf.GetVoters())
	slices.Sort(voters)
	rank := 0
	for _, id := range voters {
		switch id {
		case lead:
			continue
		case r.cfg.NodeID:
			return rank, true
		}
		rank++
	}
	return 0, false
}
