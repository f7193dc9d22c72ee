package rangecore

import (
	"slices"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/tracker"
)

// Preferred leaders: the range leaders of a region stay spread over its
// nodes.
//
// A range's leader does most of its work (it takes the appends and cursor
// commits, sends every follower its entries, runs the replicator), so a
// region whose leaders gather on one node has one busy node and idle
// others. A new group starts spread (its first campaigner is
// PreferredLeader), but elections move leaders: a node that restarts or
// is cut off comes back leading nothing, and groups created while a peer
// was still opening elect whoever times out first. So each range has a
// preferred leader, the voter the host names (regionsvc: the catalogue's
// "range-leaders" record) or else the one its group id picks, and a
// leader that is not the preferred one hands leadership to it once it is
// back and caught up: Kafka's preferred replica election
// (auto.leader.rebalance.enable) per range.
//
// The leader checks every DriverConfig.LeaderBalanceTicks ticks it has led
// (0: off). It transfers only to a voter that is not found down,
// replicating (heard from within the last election timeout, in Raft's
// replicate state) and holds every entry the leader holds, so the
// transfer takes one round trip and proposals are refused (NOT_LEADER,
// retried by clients) only that long. A preferred node that cannot keep
// leadership (its disk is full, it fails its fsyncs and hands off) would
// take it back and lose it again: each transfer doubles the range's wait
// before the next, up to LeaderBalanceWaitMax checks; a range that stays a
// follower that long starts again from one. A leader the preferred node
// could take over from now does not quiesce (maybeQuiesce): a quiesced
// leader does not tick, so it would never hand over.
//
// It runs here, in the driver's tick, so that the simulator runs it as
// the product does (sim/driver.go).

// LeaderBalanceWaitMax bounds the backoff between a range's transfers, in
// checks.
const LeaderBalanceWaitMax = 32

// balance is a driver's preferred-leader state.
type balance struct {
	wait int // ticks to wait before the next check (every, doubled per transfer)
	// ticks counts ticks led since the last check; followerTicks ticks
	// since this replica last led.
	ticks, followerTicks int
	// seen is the host's preferred leader the last check saw: a new one
	// is checked at the next tick.
	seen uint64
}

// balanceLeader runs on every tick the replica ticks, before the
// replica's tick (Driver.tick): a leader that has led for the wait hands
// leadership to the preferred leader if it is not that leader and the
// preferred one can take it at once.
func (d *Driver) balanceLeader() {
	b, every := &d.balance, d.cfg.LeaderBalanceTicks
	if every <= 0 || d.rep.SoleVoter() {
		return
	}
	if b.wait == 0 {
		b.wait = every
	}
	if !d.rep.IsLeader() {
		b.ticks = 0
		if b.followerTicks++; b.followerTicks >= LeaderBalanceWaitMax*every {
			b.wait, b.followerTicks = every, 0
		}
		return
	}
	b.followerTicks = 0
	pref := d.namedLeader()
	if b.ticks++; b.ticks < b.wait && pref == b.seen {
		return
	}
	if pref != b.seen {
		// The host named a new preferred leader (the rebalancer balances
		// leaders): hand over now, from a fresh backoff.
		b.seen, b.wait = pref, every
	}
	b.ticks = 0
	to := PreferredTransferee(d.cfg.NodeID, d.cfg.GroupID, pref, d.rep.Status(), d.peerDown)
	if to == 0 {
		return
	}
	d.cfg.Logger.Debug("handing leadership to the range's preferred leader", "to", to)
	d.rep.TransferLeadership(to)
	if d.cfg.OnBalanceTransfer != nil {
		d.cfg.OnBalanceTransfer(to)
	}
	b.wait = min(2*b.wait, LeaderBalanceWaitMax*every)
}

// namedLeader is the preferred leader the host names, 0 if none.
func (d *Driver) namedLeader() uint64 {
	if d.cfg.PreferredLeader == nil {
		return 0
	}
	return d.cfg.PreferredLeader()
}

// preferredCouldLead reports whether leader balance is on and the
// range's preferred leader could take leadership from this leader now.
func (d *Driver) preferredCouldLead() bool {
	return d.cfg.LeaderBalanceTicks > 0 &&
		PreferredTransferee(d.cfg.NodeID, d.cfg.GroupID, d.namedLeader(), d.rep.Status(), d.peerDown) != 0
}

// PreferredLeader is the voter that should lead group g: the voters in id
// order, picked by group id (the first campaigner of a new group). 0
// when there are none.
func PreferredLeader(g uint64, voters []uint64) uint64 {
	if len(voters) == 0 {
		return 0
	}
	return voters[g%uint64(len(voters))]
}

// PreferredAmong is group g's preferred leader among voters: pref, the
// node the host names, while it is one of the voters, else the group id's
// pick (PreferredLeader).
func PreferredAmong(g, pref uint64, voters []uint64) uint64 {
	if pref != 0 && slices.Contains(voters, pref) {
		return pref
	}
	return PreferredLeader(g, voters)
}

// PreferredTransferee is the node leader self of group g (pref: the
// host's preferred leader, 0 none) should hand leadership to now, from
// the leader's Raft status, or 0: self is the preferred leader, the group
// is changing its voters, a transfer is under way, or the preferred voter
// is down, not replicating or behind.
func PreferredTransferee(self, g, pref uint64, st raft.Status, down func(uint64) bool) uint64 {
	if st.RaftState != raft.StateLeader || st.LeadTransferee != 0 || len(st.Config.Voters[1]) > 0 {
		return 0
	}
	to := PreferredAmong(g, pref, st.Config.Voters[0].Slice())
	if to == 0 || to == self || down(to) {
		return 0
	}
	pr, ok := st.Progress[to]
	mine, okSelf := st.Progress[self]
	if !ok || !okSelf || pr.IsLearner || !pr.RecentActive || pr.State != tracker.StateReplicate || pr.Match < mine.Match {
		return 0
	}
	return to
}
