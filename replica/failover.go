package replica

import "slices"

// ForgetLeader makes a follower forget its leader, for when a failure
// detector outside Raft (the transport cannot reach the leader's node) says
// it is gone. With CheckQuorum and PreVote a follower refuses pre-votes while
// it has heard from a leader within an election timeout (the leader lease);
// once a quorum of followers has forgotten the dead leader, a candidate wins
// at once instead of after a second timeout. A follower that hears from the
// leader again follows it as before. No-op on a leader and on a follower
// with no leader.
func (r *Replica) ForgetLeader() {
	if r.isLeader || r.rn.BasicStatus().Lead == 0 {
		return
	}
	if err := r.rn.ForgetLeader(); err != nil {
		r.logger.Debug("forget leader", "error", err)
	}
}

// SoleVoter reports whether this replica is its group's only voter (a
// group of one), in the configuration it applied, outside any joint
// configuration. For the driver goroutine.
func (r *Replica) SoleVoter() bool {
	c := r.state.Conf
	return len(c.GetVoters()) == 1 && c.GetVoters()[0] == r.cfg.NodeID && len(c.GetVotersOutgoing()) == 0
}

// HasLearner reports whether node id is a learner in this replica's
// configuration as last applied (a replica a move is catching up). For
// the driver goroutine.
func (r *Replica) HasLearner(id uint64) bool {
	return slices.Contains(r.state.Conf.GetLearners(), id)
}

// IsVoter reports whether this replica is a voter in its configuration as
// last applied (learners cannot campaign).
func (r *Replica) IsVoter() bool {
	return slices.Contains(r.state.Conf.GetVoters(), r.cfg.NodeID)
}
