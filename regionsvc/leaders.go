package regionsvc

import (
	"context"
	"slices"
	"time"

	"github.com/geolog/geolog/placement"
	"github.com/geolog/geolog/rangecore"
)

// Leader balancing by the rebalancer (issue 12, item 2: range leaders
// balanced across nodes).
//
// Each range already hands its leadership to its preferred leader
// (leaderbalance.go: a leader that is not the preferred one transfers to
// it with Raft's leader transfer once it is up and caught up), and the
// preferred leader campaigns alone at start (startup.go). Before, the
// preferred leader was only the group id's pick among the voters, which
// spreads leaders evenly only by chance once replicas have moved, and a
// driver that moved leaders on its own would have been undone by it.
//
// So there is one owner: the preferred leader. The catalogue leader's
// rebalancer plans leader transfers (placement.LeaderTransfers: first away
// from nodes that are not live, a draining one above all, then from the
// node leading the most ranges to a replica on a node leading at least two
// fewer) over the live nodes the transport reaches, at most
// RebalanceConfig.LeaderTransfersMax under way at once, and records each
// as the range's preferred leader in the catalogue (a "range-leaders"
// record). Every node applies it to its replica of the range (pref); the
// range's leader sees the new preference at its next tick and transfers
// (balanceLeader), and at the next start the preferred leader campaigns.
// A preference whose node is no longer a voter is ignored (the group id
// picks again) until the rebalancer names another.
//
// The catalogue is replayed from its first record at each start, so a
// restarted node learns the preferences again as it replays; until then
// its ranges use the group id's pick (a transfer or two more at a
// restart, no flapping: once applied, both rules name the same node).
//
// Leaders are balanced by count: the region holds no per-range load that
// is cheap to gather. Leader balancing needs LeaderBalanceInterval (the
// ranges' own hand-off); without it the rebalancer plans no transfers.

// opRangeLeaders is the catalogue op of preferred leaders.
const opRangeLeaders = "range-leaders"

// rangeLeadersMax bounds the preferences one record carries (a record
// from the catalogue is applied only up to it).
const rangeLeadersMax = 1024

// preferredRangeLeader is one range's preferred leader in a "range-leaders" record.
type preferredRangeLeader struct {
	Stream string `json:"stream"`
	Range  uint32 `json:"range"`
	// MetaOffset is the stream's creation record's offset: a preference
	// for a stream since deleted is not applied to one re-created under
	// the same name.
	MetaOffset uint64 `json:"meta_offset"`
	Node       uint64 `json:"node"`
}

// applyRangeLeaders applies a "range-leaders" record (meta driver
// goroutine): each named range's replica on this node takes the
// preference; a quiesced one is woken so that its leader checks it now.
func (n *Node) applyRangeLeaders(at uint64, rec metaRecord) {
	if len(rec.Leaders) > rangeLeadersMax {
		n.logger.Error("range-leaders record too long; applied in part", "offset", at, "leaders", len(rec.Leaders))
		rec.Leaders = rec.Leaders[:rangeLeadersMax]
	}
	var wake []*rangeDriver
	n.mu.RLock()
	for _, l := range rec.Leaders {
		st, ok := n.streams[l.Stream]
		if !ok || st.spec.MetaOffset != l.MetaOffset || int(l.Range) >= len(st.ranges) || l.Node == 0 {
			continue
		}
		d := st.ranges[l.Range]
		if d == nil {
			continue
		}
		d.balance.pref.Store(l.Node)
		if d.rep != nil && d.quiesced.Load() {
			wake = append(wake, d)
		}
	}
	n.mu.RUnlock()
	for _, d := range wake {
		n.tasks.Go(func(ctx context.Context) {
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_ = d.exec(ctx, func() { d.rep.Unquiesce() })
		})
	}
}

// pendingTransfer is a leader transfer recorded and not yet seen done.
type pendingTransfer struct {
	to       uint64
	deadline time.Time
}

// balanceLeaders is the rebalancer's leader step on the catalogue leader
// (loop goroutine), after the round's moves: it plans leader transfers
// over reg (current leaders, with the transfers under way taken as done)
// and records them as the ranges' preferred leaders.
func (rb *rebalancer) balanceLeaders(ctx context.Context, now time.Time, reg placement.Region) {
	if rb.n.cfg.LeaderBalanceInterval <= 0 || rb.cfg.LeaderTransfersMax <= 0 {
		return
	}
	reg = rb.leaderView(now, reg)
	free := rb.cfg.LeaderTransfersMax - len(rb.pending)
	if free <= 0 {
		return
	}
	transfers := placement.LeaderTransfers(reg, free)
	if len(transfers) == 0 {
		return
	}
	rec := metaRecord{Op: opRangeLeaders}
	for _, t := range transfers {
		rec.Leaders = append(rec.Leaders, preferredRangeLeader{Stream: t.Range.Stream, Range: t.Range.Range,
			MetaOffset: rb.n.streamMetaOffset(t.Range.Stream), Node: t.To})
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := rb.n.commitMeta(cctx, rec)
	cancel()
	if err != nil {
		rb.logger.Warn("recording preferred leaders failed", "transfers", len(transfers), "error", err)
		return
	}
	wait := rb.transferWait()
	for _, t := range transfers {
		rb.logger.Info("moving range leader", "range", t.Range.String(), "from", t.From, "to", t.To)
		rb.pending[t.Range] = pendingTransfer{to: t.To, deadline: now.Add(wait)}
	}
	rb.leaderTransfers.Add(int64(len(transfers)))
	rb.mu.Lock()
	rb.status.transfers = len(rb.pending)
	rb.mu.Unlock()
	rb.peakTransfers.Store(max(rb.peakTransfers.Load(), int64(len(rb.pending))))
}

// leaderView is reg as leader balancing plans from it: dead nodes are no
// targets; ranges with a replica move under way are left alone; a
// transfer under way counts as done until its range's leader is its
// target or its time is up (a target found down meanwhile does not take
// leadership, balanceLeader: the preference waits for it).
func (rb *rebalancer) leaderView(now time.Time, reg placement.Region) placement.Region {
	reg = rb.loop.Overlay(now, reg)
	moving := map[placement.RangeID]bool{}
	for _, m := range rb.loop.InFlight() {
		moving[m.Range] = true
	}
	seen := map[placement.RangeID]bool{}
	for i := range reg.Ranges {
		r := &reg.Ranges[i]
		seen[r.ID] = true
		r.Moving = r.Moving || moving[r.ID] || len(r.Learners) > 0
		// The range hands leadership to its preferred leader by itself (a
		// leader elected elsewhere under load goes back): balance the
		// preferences, not the moment's leaders, so that such an election
		// costs no transfer; but only for a while (unmetPreferences).
		p := rb.n.preferredOf(r.ID, r.Replicas)
		if p != 0 && rb.n.region.transport.PeerDown(raftnetID(p)) {
			p = 0 // a node down takes no leadership: count the real leader
		}
		var late bool
		r.Leader, late = rb.unmet.counted(now, r.ID, r.Leader, p, rb.transferWait())
		if late {
			rb.logger.Warn("range leader is not its preferred leader after the transfer wait: balancing counts the real leader",
				"range", r.ID.String(), "leader", r.Leader, "preferred", p)
		}
		if p, ok := rb.pending[r.ID]; ok {
			if r.Leader == p.to || now.After(p.deadline) {
				delete(rb.pending, r.ID)
			} else {
				r.Leader = p.to
			}
		}
	}
	for id := range rb.pending {
		if !seen[id] {
			delete(rb.pending, id) // the stream is gone
		}
	}
	for id := range rb.unmet {
		if !seen[id] {
			delete(rb.unmet, id)
		}
	}
	rb.mu.Lock()
	rb.status.transfers = len(rb.pending)
	rb.mu.Unlock()
	return reg
}

// transferWait is how long a recorded leader transfer, or a range's
// preference, counts as done without its range's leader being the one
// named: ten of the ranges' own balance checks, and slack for the
// catalogue record to apply.
func (rb *rebalancer) transferWait() time.Duration {
	return 10*rb.n.cfg.LeaderBalanceInterval + 5*time.Second
}

// unmetPreferences holds, per range whose leader is not its preferred
// leader, since when that has been so (loop goroutine). Balancing counts
// a range's preferred leader as its leader only for a transfer wait from
// then: a preference the range never carries out (its node stays behind,
// or refuses leadership) is not counted forever, else the region would
// look balanced while one node leads more than its share and nothing
// would plan again.
type unmetPreferences map[placement.RangeID]unmetPreference

type unmetPreference struct {
	pref  uint64
	since time.Time
	late  bool // the wait ran out (and it was said)
}

// counted returns the leader balancing counts for range id, whose leader
// is leader and whose preferred leader is pref (0: none that can lead), and
// late when this call is the first to find pref unmet for longer than wait.
func (u unmetPreferences) counted(now time.Time, id placement.RangeID, leader, pref uint64, wait time.Duration) (counted uint64, late bool) {
	if pref == 0 || pref == leader {
		delete(u, id)
		return leader, false
	}
	m, ok := u[id]
	if !ok || m.pref != pref {
		m = unmetPreference{pref: pref, since: now}
	}
	if now.Sub(m.since) < wait {
		u[id] = m
		return pref, false
	}
	late = !m.late
	m.late = true
	u[id] = m
	return leader, late
}

// preferredOf is range id's preferred leader among voters as its replica
// on this node knows it (the catalogue's record, else the group id's
// pick); 0 if this node has no driver for it.
func (n *Node) preferredOf(id placement.RangeID, voters []uint64) uint64 {
	n.mu.RLock()
	defer n.mu.RUnlock()
	st, ok := n.streams[id.Stream]
	if !ok || int(id.Range) >= len(st.ranges) || st.ranges[id.Range] == nil {
		return 0
	}
	return rangecore.PreferredAmong(uint64(groupFor(st.spec.MetaOffset, id.Range)), st.ranges[id.Range].balance.pref.Load(), slices.Sorted(slices.Values(voters)))
}

// streamMetaOffset is the catalogue offset of stream's creation record (0
// if this node does not know the stream).
func (n *Node) streamMetaOffset(stream string) uint64 {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if st, ok := n.streams[stream]; ok {
		return st.spec.MetaOffset
	}
	return 0
}
