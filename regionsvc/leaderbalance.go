package regionsvc

import (
	"slices"
	"sync/atomic"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/tracker"

	"github.com/geolog/geolog/raftnet"
)

// Preferred leaders: the range leaders of a region stay spread over its
// nodes.
//
// A range's leader does most of its work (it takes the appends and cursor
// commits, sends every follower its entries, runs the replicator), so a
// region whose leaders gather on one node has one busy node and idle
// others. A new group starts spread (firstCampaigner), but elections move
// leaders: a node that restarts or is cut off comes back leading nothing,
// and groups created while a peer was still opening elect whoever times
// out first. So each range has a preferred leader, the voter its group id
// picks (the same rule as firstCampaigner, over the current voters), and a
// leader that is not the preferred one hands leadership to it once it is
// back and caught up: Kafka's preferred replica election
// (auto.leader.rebalance.enable) per range.
//
// The leader checks every Config.LeaderBalanceInterval it has led (0: off).
// It transfers only to a voter that is reachable, replicating (heard from
// within the last election timeout, in Raft's replicate state) and holds
// every entry the leader holds, so the transfer takes one round trip and
// proposals are refused (NOT_LEADER, retried by clients) only that long.
// A preferred node that cannot keep leadership (its disk is full, it fails
// its fsyncs and hands off) would take it back and lose it again: each
// transfer doubles the range's wait before the next, up to
// leaderBalanceWaitMax intervals; a range that stays a follower that long
// starts again from one interval.

// leaderBalanceWaitMax bounds the backoff between a range's transfers, in
// intervals.
const leaderBalanceWaitMax = 32

// leaderBalance is a range driver's preferred-leader state (driver
// goroutine, but for pref).
type leaderBalance struct {
	every int // ticks between checks; 0: off
	wait  int // ticks to wait before the next check (every, doubled per transfer)
	// ticks counts ticks led since the last check; followerTicks ticks
	// since this replica last led.
	ticks, followerTicks int
	// pref is the preferred leader the catalogue names for the range (a
	// "range-leaders" record, leaders.go; 0: none, the group id picks),
	// set by the catalogue's apply (any goroutine); seen is the pref the
	// last check saw: a new one is checked at the next tick.
	pref atomic.Uint64
	seen uint64
}

// balanceLeader runs on every tick: a leader that has led for the wait
// hands leadership to the preferred leader if it is not that leader and
// the preferred one can take it at once.
func (d *rangeDriver) balanceLeader() {
	b := &d.balance
	if b.every == 0 || d.rep.SoleVoter() {
		return
	}
	if b.wait == 0 {
		b.wait = b.every
	}
	if !d.rep.IsLeader() {
		b.ticks = 0
		if b.followerTicks++; b.followerTicks >= leaderBalanceWaitMax*b.every {
			b.wait, b.followerTicks = b.every, 0
		}
		return
	}
	b.followerTicks = 0
	pref := b.pref.Load()
	if b.ticks++; b.ticks < b.wait && pref == b.seen {
		return
	}
	if pref != b.seen {
		// The catalogue named a new preferred leader (the rebalancer
		// balances leaders): hand over now, from a fresh backoff.
		b.seen, b.wait = pref, b.every
	}
	b.ticks = 0
	to := preferredTransferee(d.cfg.repl.nodeID, d.cfg.repl.groupID, pref, d.rep.Status(), d.peerDown)
	if to == 0 {
		return
	}
	d.logger.Debug("handing leadership to the range's preferred leader", "to", to)
	d.rep.TransferLeadership(to)
	b.wait = min(2*b.wait, leaderBalanceWaitMax*b.every)
}

// preferredLeader is the voter that should lead group g: the voters in id
// order, picked by group id (as firstCampaigner picks among the initial
// ones). 0 when there are none.
func preferredLeader(g raftnet.GroupID, voters []uint64) uint64 {
	if len(voters) == 0 {
		return 0
	}
	return voters[uint64(g)%uint64(len(voters))]
}

// preferredAmong is group g's preferred leader among voters: pref, the
// node the catalogue names (leaders.go), while it is one of the voters,
// else the group id's pick (preferredLeader).
func preferredAmong(g raftnet.GroupID, pref uint64, voters []uint64) uint64 {
	if pref != 0 && slices.Contains(voters, pref) {
		return pref
	}
	return preferredLeader(g, voters)
}

// preferredTransferee is the node leader self of group g (pref: the
// catalogue's preferred leader, 0 none) should hand
// leadership to now, from the leader's Raft status, or 0: self is the
// preferred leader, the group is changing its voters, a transfer is under
// way, or the preferred voter is down, not replicating or behind.
func preferredTransferee(self uint64, g raftnet.GroupID, pref uint64, st raft.Status, down func(uint64) bool) uint64 {
	if st.RaftState != raft.StateLeader || st.LeadTransferee != 0 || len(st.Config.Voters[1]) > 0 {
		return 0
	}
	to := preferredAmong(g, pref, st.Config.Voters[0].Slice())
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
