package regionsvc

// Start-up elections: one campaign per group, from its preferred leader.
//
// When a node (or a whole region) starts, every one of its groups must
// elect. Left to Raft's randomised election timeouts, every replica of
// every range times out within the same second or two, and with
// thousands of ranges on two shared cores the pre-votes, votes and
// hard-state fsyncs of ten thousand concurrent elections starve each
// other: groups split their votes, leaders lose their quorum before
// their heartbeats go out, and readiness took minutes (notes/idle10k.md).
//
// Instead, as its driver starts, the group's preferred leader (the voter
// leader balance would hand it to, preferredLeader; for a new group the
// first campaigner, the same node) campaigns at once, and the other
// voters hold their Raft clock for startHoldElections election timeouts
// while they know no leader: they vote, they do not time out. So each
// group sees one campaign, from the node that would lead it anyway (no
// transfer later), paced by the opening of the ranges. A preferred
// leader whose node is down (found down by the transport after the
// first election timeout of the hold) or that never campaigns (its range
// did not open) costs its group the hold, then Raft elects as before.
// A held replica that learns a leader stops holding at its next tick.

// startHoldElections is how many election timeouts a voter that is not
// its group's preferred leader holds its clock at start.
const startHoldElections = 8

// startElection runs as the driver starts (first is the group's first
// campaigner, for a new group): it campaigns if this node is the group's
// preferred leader, else starts the hold.
func (d *rangeDriver) startElection(first uint64) {
	if d.rep.SoleVoter() || !d.rep.IsVoter() {
		return // campaignIfSole, or a learner: never campaigns
	}
	preferred := first
	if !d.rep.IsNewGroup() {
		preferred = preferredLeader(d.cfg.repl.groupID, d.rep.Status().Config.Voters[0].Slice())
	}
	if preferred == d.cfg.repl.nodeID {
		if err := d.rep.Campaign(); err != nil {
			d.logger.Warn("campaign at start", "error", err)
		}
		d.ready()
		return
	}
	d.startHold = startHoldElections * max(1, d.cfg.repl.electionTicks)
	d.startHoldElection = max(1, d.cfg.repl.electionTicks)
	d.startPreferred = preferred
}

// holdStart reports whether this tick is skipped by the start-up hold
// (see above), counting it down.
func (d *rangeDriver) holdStart() bool {
	if d.startHold == 0 {
		return false
	}
	held := startHoldElections*d.startHoldElection - d.startHold
	if d.rep.LeaderID() != 0 || (held >= d.startHoldElection && d.peerDown(d.startPreferred)) {
		d.startHold = 0
		return false
	}
	d.startHold--
	return true
}
