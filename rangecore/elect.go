package rangecore

import "go.etcd.io/raft/v3/raftpb"

// Quiescence, the campaign after a leader found down, and the start-up
// election: the Driver's decisions on ticks and liveness changes (see
// Driver; regionsvc/quiesce.go and regionsvc/startup.go say why).

// CampaignDelayTicksMax bounds the random delay before a follower that saw
// its leader's node go down campaigns. The delay makes it unlikely that
// both surviving voters of a group campaign in the same tick (a split
// vote, which costs a normal election timeout); pre-vote keeps a campaign
// harmless while the leader is in fact alive and heard by the others.
const CampaignDelayTicksMax = 3

// StartHoldElections is how many election timeouts a voter that is not
// its group's preferred leader holds its clock at start while the
// preferred leader's node is up (or not contacted yet), and
// StartHoldDownElections how many while it is found down: a node still
// opening its ranges does not listen yet, so down cannot mean dead here;
// it bounds what a dead preferred leader costs its groups at start.
const (
	StartHoldElections     = 8
	StartHoldDownElections = 25
)

// maybeQuiesce runs on a tick, before it is handed to the replica: a
// leader whose group is idle quiesces instead of ticking (it returns
// true). Not while a campaign is planned, the disk is full or the host
// vetoes; and not without a failure detector, whose quiesced followers
// could never learn that their leader died (a group of one has none).
func (d *Driver) maybeQuiesce() bool {
	rep := d.rep
	if !rep.IsLeader() || d.campaignInTicks != 0 || rep.DiskFull() != nil {
		return false
	}
	sole := rep.SoleVoter()
	if d.cfg.PeerDown == nil && !sole {
		return false
	}
	if !sole && (d.preferredCouldLead() || d.cfg.MayQuiesce != nil && !d.cfg.MayQuiesce()) {
		return false
	}
	return rep.Quiesce(func(id uint64) bool { return !d.peerDown(id) })
}

// wakeIfLeaderDown wakes a quiesced follower whose leader's node is down:
// after it stepped a quiesce heartbeat (the leader may have died since it
// sent it) and when liveness changed. A quiesced leader wakes on any
// change of liveness.
func (d *Driver) wakeIfLeaderDown(livenessChanged bool) {
	if !d.rep.Quiesced() {
		return
	}
	if d.rep.IsLeader() {
		if livenessChanged {
			d.rep.Unquiesce()
		}
		return
	}
	if d.peerDown(d.rep.LeaderID()) {
		d.rep.Unquiesce()
	}
}

// watchLeader runs on every tick of a follower. When the failure detector
// finds the leader's node down, the follower forgets the leader, so that
// it grants pre-votes at once instead of after an election timeout, and
// campaigns itself after a short random delay.
func (d *Driver) watchLeader() {
	if lead := d.rep.LeaderID(); lead != 0 && d.peerDown(lead) {
		d.rep.ForgetLeader()
		d.campaignInTicks = 1 + d.cfg.Rand(CampaignDelayTicksMax)
		return
	}
	if d.campaignInTicks == 0 {
		return
	}
	d.campaignInTicks--
	if d.campaignInTicks == 0 && d.rep.LeaderID() == 0 && d.rep.IsVoter() {
		if err := d.rep.Campaign(); err != nil {
			d.cfg.Logger.Debug("campaign after the leader's node went down", "error", err)
		}
	}
}

// CampaignPlanned reports whether a campaign after a leader found down is
// counting down (tests).
func (d *Driver) CampaignPlanned() bool { return d.campaignInTicks != 0 }

// startHold is a voter's hold at start: the ticks it still skips while its
// preferred leader's node is up, and while it is down.
type startHold struct {
	upTicks, downTicks int
	preferred          uint64
}

// Start runs as the driver starts (or a dormant group is admitted):
// preferred is the group's preferred leader (for a new group, its first
// campaigner). It campaigns if this node is the preferred leader, else
// starts the hold (not in a new group: its voters open within moments of
// each other and its first campaigner campaigns at once; notes/fds10k.md
// on a hold at creation).
func (d *Driver) Start(preferred uint64, electionTicks int) {
	rep := d.rep
	if rep.SoleVoter() || !rep.IsVoter() {
		return // CampaignIfSole, or a learner: never campaigns
	}
	if preferred == d.cfg.NodeID {
		d.preferredAtStart = true
		d.campaignAtStart()
		return
	}
	if rep.IsNewGroup() || preferred == 0 {
		return
	}
	election := max(1, electionTicks)
	d.hold = startHold{upTicks: StartHoldElections * election, downTicks: StartHoldDownElections * election, preferred: preferred}
	d.holdFor.Store(preferred)
}

// HoldingFor reports the preferred leader the start-up hold waits for (0:
// none).
func (d *Driver) HoldingFor() uint64 { return d.holdFor.Load() }

// NoteSent runs on every message sent (any goroutine): a vote or pre-vote
// refused to the preferred leader a voter holds for (its log is behind
// this one's) ends the hold, since that leader cannot win without this
// voter's peers.
func (d *Driver) NoteSent(m *raftpb.Message) {
	if p := d.holdFor.Load(); p != 0 && m.GetTo() == p && m.GetReject() &&
		(m.GetType() == raftpb.MsgPreVoteResp || m.GetType() == raftpb.MsgVoteResp) {
		d.holdFor.Store(0)
	}
}

// holdStart reports whether this tick is skipped by the start-up hold,
// counting it down; a known leader ends the hold.
func (d *Driver) holdStart() bool {
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
// the driver starts, and again whenever a peer's liveness changes while
// no leader is known yet.
func (d *Driver) campaignAtStart() {
	if d.rep.LeaderID() != 0 {
		d.preferredAtStart = false
		return
	}
	if err := d.rep.Campaign(); err != nil {
		d.cfg.Logger.Warn("campaign at start", "error", err)
	}
	d.Ready()
}

// CampaignIfSole makes the sole voter of a group of one campaign as soon
// as its driver runs: no one else can elect it, and it need not wait an
// election timeout for a vote of its own.
func (d *Driver) CampaignIfSole() {
	if !d.rep.SoleVoter() {
		return
	}
	if err := d.rep.Campaign(); err != nil {
		d.cfg.Logger.Warn("campaign as the sole voter", "error", err)
	}
	d.Ready()
}
