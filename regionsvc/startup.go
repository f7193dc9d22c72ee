package regionsvc

import (
	"go.etcd.io/raft/v3/raftpb"
)

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
// startHoldElections election timeouts (startHoldDownElections while the
// preferred leader's node is found down): they vote, they do not time
// out. So each
// group sees one campaign, from the node that would lead it anyway (no
// transfer later), paced by the opening of the ranges. A preferred
// leader whose node is dead, or that never campaigns (its range did not
// open), costs its group the hold, then Raft elects as before.
// A held replica that learns a leader, or refuses the preferred leader its
// vote (its log is behind), stops holding at its next tick;
// the preferred leader campaigns again whenever a peer's liveness changes
// until a leader is known (campaignAtStart).

// startHoldElections is how many election timeouts a voter that is not
// its group's preferred leader holds its clock at start while the
// preferred leader's node is up (or not contacted yet), and
// startHoldDownElections how many while it is found down: a node still
// opening its ranges does not listen yet, so down cannot mean dead here;
// it bounds what a dead preferred leader costs its groups at start
// (25 election timeouts: 20 s at the default ticks).
const (
	startHoldElections     = 8
	startHoldDownElections = 25
)

// startElection runs as the driver starts (first is the group's first
// campaigner, for a new group): it campaigns if this node is the group's
// preferred leader, else starts the hold.
func (d *rangeDriver) startElection(first uint64) {
	if d.rep.SoleVoter() || !d.rep.IsVoter() {
		return // campaignIfSole, or a learner: never campaigns
	}
	preferred := first
	if !d.rep.IsNewGroup() {
		preferred = preferredAmong(d.cfg.repl.groupID, d.balance.pref.Load(), d.rep.Status().Config.Voters[0].Slice())
	}
	if preferred == d.cfg.repl.nodeID {
		d.preferredAtStart = true
		d.campaignAtStart()
		return
	}
	if d.rep.IsNewGroup() {
		// A new group's voters open as its creation is applied, within
		// moments of each other, and its first campaigner campaigns at
		// once: no hold (see notes/fds10k.md on a hold at creation).
		return
	}
	election := max(1, d.cfg.repl.electionTicks)
	d.hold = startHold{upTicks: startHoldElections * election, downTicks: startHoldDownElections * election, preferred: preferred}
	d.holdFor.Store(preferred)
}

// noteVoteRefused runs on every message sent (any goroutine): a vote or
// pre-vote refused to the preferred leader a voter holds for (its log is
// behind this one's: it stopped first, say) ends the hold, since that
// leader cannot win without this voter's peers.
func (d *rangeDriver) noteVoteRefused(m *raftpb.Message) {
	if p := d.holdFor.Load(); p != 0 && m.GetTo() == p && m.GetReject() &&
		(m.GetType() == raftpb.MsgPreVoteResp || m.GetType() == raftpb.MsgVoteResp) {
		d.holdFor.Store(0)
	}
}

// startHold is a voter's hold at start (driver goroutine): the ticks it
// still skips while its preferred leader's node is up, and while it is
// down.
type startHold struct {
	upTicks, downTicks int
	preferred          uint64
}

// holdStart reports whether this tick is skipped by the start-up hold
// (see above), counting it down; a known leader ends the hold.
func (d *rangeDriver) holdStart() bool {
	h := &d.hold
	if h.upTicks == 0 {
		return false
	}
	left := &h.upTicks
	if d.peerDown(h.preferred) {
		left = &h.downTicks
	}
	if *left--; d.rep.LeaderID() != 0 || *left <= 0 || d.holdFor.Load() == 0 {
		*h = startHold{}
		d.holdFor.Store(0)
		return false
	}
	return true
}

// campaignAtStart campaigns as the group's preferred leader at start: as
// the driver starts, and again whenever a peer's liveness changes while no
// leader is known yet (a peer that was still starting, or whose stream was
// waiting out the transport's reconnect backoff, can vote now: waiting an
// election timeout for it would let the hold run out).
func (d *rangeDriver) campaignAtStart() {
	if d.rep.LeaderID() != 0 {
		d.preferredAtStart = false
		return
	}
	if err := d.rep.Campaign(); err != nil {
		d.logger.Warn("campaign at start", "error", err)
	}
	d.ready()
}
