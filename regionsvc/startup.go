package regionsvc

import "github.com/geolog/geolog/rangecore"

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
// first campaigner, the same node) campaigns at once, and, in a group
// that existed before (not a new one: see startElection), the other
// voters hold their Raft clock while they know no leader, for
// rangecore.StartHoldElections election timeouts
// (rangecore.StartHoldDownElections while the preferred leader's node is
// found down): they vote, they do not time out. So each group sees one
// campaign, from the node that would lead it anyway (no
// transfer later), paced by the opening of the ranges. A preferred
// leader whose node is dead, or that never campaigns (its range did not
// open), costs its group the hold, then Raft elects as before.
// A held replica that learns a leader, or refuses the preferred leader its
// vote (its log is behind), stops holding at its next tick;
// the preferred leader campaigns again whenever a peer's liveness changes
// until a leader is known (rangecore.Driver's campaignAtStart).

// The hold's lengths are rangecore.StartHoldElections and
// rangecore.StartHoldDownElections election timeouts (25: 20 s at the
// default ticks); the decisions (campaign, hold, the refused vote that
// ends it) are rangecore.Driver's (rangecore/elect.go).

// startElection runs as the driver starts (first is the group's first
// campaigner, for a new group): the core campaigns if this node is the
// group's preferred leader, else starts the hold.
func (d *rangeDriver) startElection(first uint64) {
	if d.rep.SoleVoter() || !d.rep.IsVoter() {
		return // CampaignIfSole, or a learner: never campaigns
	}
	preferred := first
	if !d.rep.IsNewGroup() {
		preferred = rangecore.PreferredAmong(uint64(d.cfg.repl.groupID), d.balance.pref.Load(), d.rep.Status().Config.Voters[0].Slice())
	}
	d.core.Start(preferred, d.cfg.repl.electionTicks)
}
