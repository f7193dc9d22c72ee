package sim

import (
	"fmt"
	"math/rand/v2"

	"github.com/geolog/geolog/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Replaced replicas (Regions > 1). One run in three replaces a node's
// disk: every range's Raft group of its region removes the node
// (replica.ProposeConfChange, as Admin ChangeReplicas does for
// `geolog replicas replace`), the node stops and its disk is wiped, it
// starts empty, and every group adds it back as a learner, which its
// leader rebuilds from the log or by snapshot, then promotes it once it
// has caught up with its leader. A step that fails (NOT_LEADER, a change
// in progress, a leader lost) is retried every replaceRetryMs at the
// leader of now. The node keeps its Raft id (the product's procedure
// adds a new id and removes the old one: the simulator's regions have
// fixed ids); it bootstraps as a new replica does, with every node as a
// peer, and joins as the leader's snapshot or log tells it.
//
// Checks: those of every node, from its new start (it publishes less
// than it did before the wipe: that alone is not a fall back, and its
// readers start over); every acked record stays in the log; the rebuilt
// replica catches up with the log (the final checks).

const replaceRetryMs = 20

// replacePendingMs is how long a membership change may go unanswered
// before it is asked again of the leader of now.
const replacePendingMs = 1000

// ReplaceResult counts replaced replicas (part of HomingResult).
type ReplaceResult struct {
	// Wiped counts the disks wiped, Removed, Learners and Promoted the
	// membership changes applied, Retries the steps retried.
	Wiped, Removed, Learners, Promoted, Retries int
}

func (r ReplaceResult) String() string {
	return fmt.Sprintf("; replicas replaced: %d disks wiped, %d removed, %d added as learners, %d promoted (%d steps retried)",
		r.Wiped, r.Removed, r.Learners, r.Promoted, r.Retries)
}

func (r ReplaceResult) add(o ReplaceResult) ReplaceResult {
	r.Wiped += o.Wiped
	r.Removed += o.Removed
	r.Learners += o.Learners
	r.Promoted += o.Promoted
	r.Retries += o.Retries
	return r
}

// Phases of a range's replacement.
const (
	replRemove = iota
	replRemoved
	replLearner
	replPromote
	replDone
)

// replacer drives one node's replacement.
type replacer struct {
	h   *homeWorld
	rng *rand.Rand
	at  int64 // when it starts (-1: not in this run)
	n   *node
	// phase is, per range, its step; pending whether a change is under
	// way (and seq, so a late reply of an earlier one is ignored).
	phase   []int
	pending []int64 // when the change under way was proposed (-1: none)
	seq     []int
	wipeGen int // the incarnation that starts empty (0: not wiped yet)
	// wipes counts, per node, its wiped disks: a reader of it starts over.
	wipes map[*node]int
	// lastErr is the last membership change refused (for a test's eyes).
	lastErr error
}

func newReplacer(h *homeWorld) *replacer {
	w := h.w
	rp := &replacer{h: h, rng: rand.New(rand.NewPCG(uint64(w.opt.Seed), 0x7265706c616365)), at: -1, wipes: map[*node]int{}}
	if rp.rng.IntN(3) == 0 {
		rp.at = 300 + rp.rng.Int64N(1500)
	}
	return rp
}

// busy reports whether a replica replacement is under way: the run
// settles until it is done (a membership change a Raft leader dropped
// blocks the range's next one for replica's confProposalTimeout, 10 s).
func (h *homeWorld) busy() bool {
	rp := h.replacer
	if rp.n == nil {
		return false
	}
	for _, ph := range rp.phase {
		if ph != replDone {
			return true
		}
	}
	return false
}

// step starts the replacement when due, then drives each range's step.
func (rp *replacer) step() {
	w := rp.h.w
	if rp.at < 0 || w.now < rp.at || (rp.n == nil && w.now != rp.at) {
		return
	}
	if rp.n == nil {
		rp.n = w.nodes[rp.rng.IntN(len(w.nodes))]
		rp.phase = make([]int, w.opt.Ranges)
		rp.pending = make([]int64, w.opt.Ranges)
		for r := range rp.pending {
			rp.pending[r] = -1
		}
		rp.seq = make([]int, w.opt.Ranges)
	}
	if w.now%replaceRetryMs != 0 {
		return
	}
	removed := true
	for r := range rp.phase {
		rp.advance(r)
		removed = removed && rp.phase[r] >= replRemoved
	}
	if removed && rp.wipeGen == 0 && (rp.forgotten() || w.opt.mut.replaceEarlyWipe) {
		rp.wipe()
	}
}

// advance drives range r's replacement one step.
func (rp *replacer) advance(r int) {
	w, n := rp.h.w, rp.n
	if rp.pending[r] >= 0 && w.now-rp.pending[r] < replacePendingMs {
		return
	}
	if rp.pending[r] >= 0 {
		// No answer: a leader deposed before the change applied never
		// answers. Ask the leader of now.
		rp.pending[r] = -1
		rp.seq[r]++
		rp.h.res.Replaced.Retries++
	}
	l := w.leaderOf(n.region, r)
	if l == nil {
		return
	}
	rp.applied(l, r)
	switch rp.phase[r] {
	case replRemove:
		if l == n {
			// The node leads: hand the lead on first.
			l.replicas[r].TransferLeadership(uint64(n.id%w.opt.Nodes + 1))
			return
		}
		rp.change(l, r, raftpb.ConfChangeRemoveNode, replRemoved)
	case replRemoved:
		if rp.wipeGen != 0 && n.up && n.gen >= rp.wipeGen {
			rp.change(l, r, raftpb.ConfChangeAddLearnerNode, replLearner)
		}
	case replLearner:
		if n.up && n.replicas[r].Committed() >= l.replicas[r].Committed() {
			rp.change(l, r, raftpb.ConfChangeAddNode, replDone)
		}
	}
}

// applied moves range r's phase on where its leader's configuration
// shows the change already applied (a change whose proposer lost the lead
// before answering).
func (rp *replacer) applied(l *node, r int) {
	conf := l.replicas[r].Conf()
	id := uint64(rp.n.id)
	voter, learner := contains(conf.GetVoters(), id), contains(conf.GetLearners(), id)
	switch {
	case rp.phase[r] == replRemove && !voter && !learner:
		rp.phase[r] = replRemoved
		rp.h.res.Replaced.Removed++
	case rp.phase[r] == replRemoved && rp.wipeGen != 0 && learner:
		rp.phase[r] = replLearner
		rp.h.res.Replaced.Learners++
	case rp.phase[r] == replLearner && voter:
		rp.phase[r] = replDone
		rp.h.res.Replaced.Promoted++
	}
}

func contains(ids []uint64, id uint64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// change proposes a membership change of n in range r's group at its
// leader l; the range moves to next once it is applied.
func (rp *replacer) change(l *node, r int, typ raftpb.ConfChangeType, next int) {
	rp.pending[r] = rp.h.w.now
	rp.seq[r]++
	seq, gen := rp.seq[r], l.gen
	cc := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: typ.Enum(), NodeId: proto.Uint64(uint64(rp.n.id))}}}
	l.replicas[r].ProposeConfChange(cc, func(cs *raftpb.ConfState, err error) {
		if rp.seq[r] != seq || l.gen != gen {
			return
		}
		rp.pending[r] = -1
		if err != nil {
			rp.h.res.Replaced.Retries++
			rp.lastErr = err
			return
		}
		if rp.phase[r] >= next {
			return // seen applied already (applied)
		}
		rp.phase[r] = next
		rp.h.w.tracef("%s range %d: %v applied", traceName(rp.n), r, typ)
		switch typ {
		case raftpb.ConfChangeRemoveNode:
			rp.h.res.Replaced.Removed++
		case raftpb.ConfChangeAddLearnerNode:
			rp.h.res.Replaced.Learners++
		default:
			rp.h.res.Replaced.Promoted++
		}
	})
}

// forgotten reports whether every other node of the region is up and
// has applied the node's removal in every range: none counts its vote
// any more. Wiping it sooner lets a member that has not applied the
// removal count the blank node's vote for a candidate missing committed
// entries (the first version of this file did: a lagging node of the
// taker region became leader with 26 of the 42 acked records and
// confirmed a home read at 26). The product's procedure never meets it:
// it adds a new node id and removes the old one (see
// notes/simfaults.md).
func (rp *replacer) forgotten() bool {
	w := rp.h.w
	for _, m := range w.regionNodes(rp.n.region) {
		if m == rp.n {
			continue
		}
		if !m.up {
			return false
		}
		for r := range m.replicas {
			conf := m.replicas[r].Conf()
			if id := uint64(rp.n.id); contains(conf.GetVoters(), id) || contains(conf.GetLearners(), id) || len(conf.GetVotersOutgoing()) > 0 {
				return false
			}
		}
	}
	return true
}

// wipe stops the node, once every group removed it, and gives it an
// empty disk: it starts as a new replica.
func (rp *replacer) wipe() {
	w, n := rp.h.w, rp.n
	if n.up {
		w.crash(n)
	}
	n.fs = vfs.NewMem(rand.New(rand.NewPCG(rp.rng.Uint64(), rp.rng.Uint64())))
	n.served = make([]uint64, w.opt.Ranges)
	n.forkEpoch = make([]uint64, w.opt.Ranges)
	rp.wipeGen = n.gen + 1
	w.tracef("%s: disk wiped (replaced)", traceName(n))
	rp.wipes[n]++
	rp.h.res.Replaced.Wiped++
}
