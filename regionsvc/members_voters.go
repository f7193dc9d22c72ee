package regionsvc

import (
	"context"
	"slices"
	"time"

	"github.com/geolog/geolog/membership"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"
)

// The catalogue group's voters. The catalogue starts with the founding
// nodes as voters (region.ids) and every joined node as a learner
// (members_join.go). Its leader keeps as many voters as it started with
// (3 or 5 in a production region; a region founded with fewer grows to 3
// once it has 3 members: catalogueVotersWant) over live nodes,
// one Raft change at a time, each a simple change (one voter in or out, so
// no joint consensus):
//
//  1. A voter that is not live (draining, decommissioned, or any later
//     state but live) is replaced: a live learner that holds every entry
//     the leader committed (Raft's replicate state, recently active) is
//     promoted first, in a zone the live voters do not cover if one is;
//     only then does the leaving voter go, so the quorum never shrinks
//     below what the region had.
//  2. A decommissioned voter is removed (it is cut off anyway); a draining
//     one is demoted to a learner (it still serves its ranges and keeps its
//     copy of the catalogue), and only once its place is taken: a draining
//     voter with no live learner to replace it stays a voter. A
//     decommissioned learner is removed.
//  3. The leader never removes or demotes itself: it hands leadership to a
//     caught-up live voter first, and the next leader makes the change.
//  4. A voter the node list does not know (a list still replaying) is left
//     alone; a voter that becomes live again is not demoted back (there is
//     no reason to churn the quorum).
//
// The leader checks every catalogueVotersInterval: a change interrupted by
// a leader change, or made impossible by a learner still catching up, is
// taken up at the next check, by whichever node leads then.

// catalogueVotersInterval is how often the catalogue leader checks its
// voters.
const catalogueVotersInterval = time.Second

// catalogueVoterChangeTimeout bounds the wait for one change to apply.
const catalogueVoterChangeTimeout = 10 * time.Second

// catalogueVotersMin is the fewest voters the catalogue grows to once
// the region has that many members: a region founded with one or two
// nodes (a first node started alone, then joins) would otherwise keep
// its founders as the only voters, and losing the founding node would
// lose the catalogue (streams, ACLs, the node list) with it.
const catalogueVotersMin = 3

// catalogueVotersWant is how many voters the catalogue keeps: as many as
// the region was founded with (3 or 5 in a production region), and at
// least catalogueVotersMin once that many nodes are members and not
// decommissioned (a draining node counts: it is still a member, and
// counting it keeps the quorum from shrinking while it drains, as for a
// founded region). Never an even count grown to: a region founded with
// one node keeps one voter while it has two members (two voters would
// need both up; one is as available), and takes three at the third.
func catalogueVotersWant(founded int, nodes []membership.Node) int {
	if founded >= catalogueVotersMin {
		return founded
	}
	members := 0
	for _, m := range nodes {
		if m.State != membership.Decommissioned {
			members++
		}
	}
	if members >= catalogueVotersMin {
		return catalogueVotersMin
	}
	return founded
}

// voterChange is one step of nextVoterChange: a Raft change of node id's
// role, or a leadership hand-off first (transferTo).
type voterChange struct {
	typ        raftpb.ConfChangeType
	id         uint64
	transferTo uint64
}

// nextVoterChange is the next step that keeps want voters over live nodes
// (the rules above), for leader self of a group of voters and learners;
// caughtUp says whether a node holds what the leader committed. ok is
// false when there is nothing to do.
func nextVoterChange(self uint64, voters, learners []uint64, nodes []membership.Node, want int, caughtUp func(uint64) bool) (voterChange, bool) {
	byID := map[uint64]membership.Node{}
	for _, m := range nodes {
		byID[m.ID] = m
	}
	live := func(id uint64) bool { m, ok := byID[id]; return ok && m.State == membership.Live }
	leaving := func(id uint64) bool { m, ok := byID[id]; return ok && m.State != membership.Live }
	var liveVoters, leavingVoters []uint64
	for _, id := range voters {
		switch {
		case live(id):
			liveVoters = append(liveVoters, id)
		case leaving(id):
			leavingVoters = append(leavingVoters, id)
		}
	}
	if len(liveVoters) < want {
		if c := pickPromotion(learners, liveVoters, byID, live, caughtUp); c != 0 {
			return voterChange{typ: raftpb.ConfChangeAddNode, id: c}, true
		}
	}
	for _, id := range leavingVoters {
		decommissioned := byID[id].State == membership.Decommissioned
		if len(liveVoters) < want && !decommissioned {
			continue // nobody to take its place yet
		}
		if id == self {
			for _, to := range liveVoters {
				if caughtUp(to) {
					return voterChange{transferTo: to}, true
				}
			}
			continue
		}
		if decommissioned {
			return voterChange{typ: raftpb.ConfChangeRemoveNode, id: id}, true
		}
		return voterChange{typ: raftpb.ConfChangeAddLearnerNode, id: id}, true
	}
	for _, id := range learners {
		if byID[id].State == membership.Decommissioned {
			return voterChange{typ: raftpb.ConfChangeRemoveNode, id: id}, true
		}
	}
	return voterChange{}, false
}

// pickPromotion is the learner to promote: live, caught up, preferably in
// a zone no live voter is in, then the lowest id; 0 if none can be.
func pickPromotion(learners, liveVoters []uint64, byID map[uint64]membership.Node, live, caughtUp func(uint64) bool) uint64 {
	zones := map[string]bool{}
	for _, id := range liveVoters {
		zones[byID[id].Zone] = true
	}
	var best uint64
	bestNewZone := false
	for _, id := range slices.Sorted(slices.Values(learners)) {
		if !live(id) || !caughtUp(id) {
			continue
		}
		newZone := !zones[byID[id].Zone]
		if best == 0 || (newZone && !bestNewZone) {
			best, bestNewZone = id, newZone
		}
	}
	return best
}

// keepCatalogueVoters runs the rules above on the catalogue leader until
// ctx ends (a stopper task).
func (n *Node) keepCatalogueVoters(ctx context.Context) {
	t := time.NewTicker(catalogueVotersInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		if n.region.meta.rep.LeaderID() == n.cfg.NodeID { // atomic; the step checks on the driver
			n.catalogueVoterStep(ctx)
		}
	}
}

// catalogueVoterStep makes one change of the catalogue's voters, if one
// is due, and waits for it to apply.
func (n *Node) catalogueVoterStep(ctx context.Context) {
	meta := n.region.meta
	nodes := n.memberNodes()
	want := catalogueVotersWant(len(n.region.ids), nodes)
	done := make(chan error, 1)
	var step voterChange
	var due bool
	err := meta.exec(ctx, func() {
		st := meta.rep.Status()
		if st.RaftState != raft.StateLeader || len(st.Config.Voters[1]) > 0 || st.LeadTransferee != 0 {
			done <- nil
			return
		}
		caughtUp := func(id uint64) bool {
			pr, ok := st.Progress[id]
			return ok && (id == st.ID || (pr.RecentActive && pr.State == tracker.StateReplicate && pr.Match >= st.HardState.GetCommit()))
		}
		conf := meta.rep.Conf()
		step, due = nextVoterChange(n.cfg.NodeID, conf.GetVoters(), conf.GetLearners(), nodes, want, caughtUp)
		switch {
		case !due:
		case step.transferTo != 0:
			meta.rep.TransferLeadership(step.transferTo)
		default:
			cc := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: step.typ.Enum(), NodeId: proto.Uint64(step.id)}}}
			meta.rep.ProposeConfChange(cc, func(_ *raftpb.ConfState, err error) { done <- err })
			return
		}
		done <- nil
	})
	if err != nil {
		return
	}
	select {
	case err = <-done:
	case <-time.After(catalogueVoterChangeTimeout):
		return // lost with a leader change: the next check sees the conf as it is
	case <-ctx.Done():
		return
	}
	if !due {
		return
	}
	if err != nil {
		n.logger.Warn("catalogue voters: change failed; retried", "change", step.typ, "node", step.id, "error", err)
		return
	}
	if step.transferTo != 0 {
		n.logger.Info("catalogue voters: the leader leaves, handing leadership off", "to", step.transferTo)
		return
	}
	n.logger.Info("catalogue voters changed", "change", step.typ, "node", step.id)
}
