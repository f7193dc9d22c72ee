package replica

import (
	"bytes"
	"encoding/binary"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"
)

// The compaction floor on followers (notes/sim169.md).
//
// SetCompactionFloor is the driver's: regionsvc sets it on the home's
// leader (the lowest offset a mirror region still needs) and on a mirror
// group's leader (the home's floor, from its heartbeats). Followers hear
// neither, and used to compact by retention alone: a follower that then
// led (a leader change at the home, or in a mirror region that a takeover
// makes the home) had deleted what a lagging or divergent mirror needs to
// catch up or fork, and the mirror waited for it for ever.
//
// So a leader with a floor (its driver's, or the one it learned as a
// follower while its driver has none) shares it: every Compact sends each
// peer a floor message (a MsgHeartbeat carrying floorContext and the offset,
// which Raft never steps) when the floor or the term changed since it
// last did, and again every floorShareRounds calls (messages get lost). A
// follower takes a floor message from its leader of the current term and
// keeps the floor until a newer one replaces it, across leader changes
// (holding back is safe; a new leader with a floor replaces it within a
// Compact round, one without one leaves it standing). Compact bounds
// compaction by the driver's floor on a leader that has one, else by the
// lower of the driver's and the learned one. The learned floor is kept in
// the hard state (HardState.SharedFloor: saved with every compaction
// point, and at once when a floor below the saved one, or the first one,
// arrives), so a restarted follower holds to it until its leader's next
// floor message: found by the simulator with floors set on leaders only
// (seeds 45 and 169 of the minute runs, a follower restarted and
// compacting before it heard its leader's floor again). A leader keeps
// its own floor there the same way (saveLeaderFloor, keepSharedFloor): one
// that crashes never steps down, and restarted as a follower it holds to
// the floor it had (seed 743 of the minute runs).
//
// A follower that has heard from no leader whether there is a floor (a
// new replica, a restarted one with none saved) compacts nothing until
// it does: a leader without a floor says so (a no-floor message, sent as
// a floor message is), and only then does such a follower compact by
// retention alone. It used to compact by retention alone at once: seed 486
// of the minute runs, where a replica added back with a wiped disk took
// the home's log from 6 by snapshot, its leader (floor 6, the resend point
// of a mirror holding a divergent tail [6, 32)) crashed before its next
// floor message, and, with no leader, the new replica compacted to 25; it
// led the home later, and its resend to the mirror began at 25, inside the
// mirror's divergent frame [24, 26) (notes/floor.md). A no-floor message
// leaves a learned floor standing (a leader without one leaves it, see
// above); a leader compacts by its own floor or retention alone, as its
// driver says.
//
// An older build steps a floor message as a plain heartbeat (commit 0)
// and echoes its context, which the leader reads as an unknown read-index
// context: harmless.

// floorContext marks a floor message's Context; the offset follows it, 8
// bytes big-endian. Raft's own contexts are 8 bytes and quiesceContext
// differs, so they never collide.
var floorContext = []byte("geolog.floor")

// noFloorContext is a no-floor message's whole Context: the leader has
// no floor (see above).
var noFloorContext = []byte("geolog.nofloor")

// floorShareRounds is how many Compact calls a leader lets pass before it
// sends an unchanged floor again.
const floorShareRounds = 8

// floorShare is a leader's record of the floor it last shared, and a
// follower's of the floor it learned.
type floorShare struct {
	// leader side
	sentOffset uint64
	sentNone   bool // the last share was a no-floor message
	sentTerm   uint64
	rounds     int // Compact calls since the last share
	// follower side
	learned    uint64
	learnedSet bool
	// heard: a leader's floor or no-floor message arrived since this
	// replica opened.
	heard bool
}

// IsFloorMessage reports whether m is a leader's floor or no-floor
// message (see above): a transport carries it as any other message.
func IsFloorMessage(m *raftpb.Message) bool {
	_, _, ok := floorMessage(m)
	return ok
}

// floorMessage returns the offset a floor message carries (none: a
// no-floor message).
func floorMessage(m *raftpb.Message) (offset uint64, none, ok bool) {
	c := m.GetContext()
	switch {
	case m.GetType() != raftpb.MsgHeartbeat:
		return 0, false, false
	case bytes.Equal(c, noFloorContext):
		return 0, true, true
	case len(c) != len(floorContext)+8 || !bytes.HasPrefix(c, floorContext):
		return 0, false, false
	}
	return binary.BigEndian.Uint64(c[len(floorContext):]), false, true
}

// floorMsg is a floor message (none: a no-floor message) from a leader of
// term to a peer.
func floorMsg(from, to, term, offset uint64, none bool) *raftpb.Message {
	ctx := binary.BigEndian.AppendUint64(append([]byte(nil), floorContext...), offset)
	if none {
		ctx = append([]byte(nil), noFloorContext...)
	}
	return &raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), To: proto.Uint64(to), From: proto.Uint64(from),
		Term: proto.Uint64(term), Context: ctx}
}

// shareFloor sends the leader's floor (compactionFloor), or that it has
// none, to its peers when that changed or floorShareRounds calls passed
// (see above). For the driver goroutine.
func (r *Replica) shareFloor() {
	if !r.isLeader {
		return
	}
	f := &r.floorShare
	floor, ok := r.compactionFloor()
	f.rounds++
	unchanged := f.sentOffset == floor && f.sentNone == !ok && f.sentTerm == r.term
	// An unchanged floor is sent again every floorShareRounds calls. While
	// the group is quiesced, neither that nor a no-floor message is sent:
	// an idle range sends nothing, and both only let a follower compact
	// (one that has not heard compacts nothing, which keeps more). A
	// changed floor is sent at once, quiesced or not.
	if (unchanged && f.rounds < floorShareRounds) || (r.quiesce.on && (unchanged || !ok)) {
		return
	}
	var msgs []*raftpb.Message
	r.rn.WithProgress(func(id uint64, _ raft.ProgressType, _ tracker.Progress) {
		if id != r.cfg.NodeID {
			msgs = append(msgs, floorMsg(r.cfg.NodeID, id, r.term, floor, !ok))
		}
	})
	if len(msgs) > 0 {
		r.cfg.Send(msgs)
	}
	f.sentOffset, f.sentNone, f.sentTerm, f.rounds = floor, !ok, r.term, 0
}

// learnFloor takes a floor or no-floor message from the current term's
// leader; others change nothing. A follower that knows no leader yet (just
// restarted) takes it from the sender of the current term: only a term's
// leader sends heartbeats in it. A no-floor message only lets a follower
// that heard none compact by retention alone (see above).
func (r *Replica) learnFloor(m *raftpb.Message, offset uint64, none bool) {
	st := r.rn.BasicStatus()
	if r.isLeader || m.GetTerm() != st.GetTerm() || (st.Lead != raft.None && m.GetFrom() != st.Lead) {
		return
	}
	r.floorShare.heard = true
	if !none {
		r.noteFloor(offset)
	}
}

// noteFloor makes offset the learned floor, saving it when it is the
// first or lower than the saved one (see above).
func (r *Replica) noteFloor(offset uint64) {
	f := &r.floorShare
	if f.learnedSet && f.learned == offset {
		return
	}
	f.learned, f.learnedSet = offset, true
	if s := r.state.SharedFloor; s != 0 && s-1 <= offset {
		return // the saved floor is lower: holding to it after a restart is safe
	}
	// The first floor learned, or one below the saved: save it now, so
	// that a restart never compacts past it.
	prev := r.state
	r.keepSharedFloor()
	if err := r.cfg.State.Save(r.state); err != nil {
		r.state = prev
		r.logger.Warn("cannot save the compaction floor learned from the leader", "floor", offset, "error", err)
	}
}

// keepSharedFloor records the floor to hold to after a restart in the
// state (the caller saves it): a leader's own (its driver's), else the
// learned one.
func (r *Replica) keepSharedFloor() {
	if r.isLeader && r.floorSet {
		r.state.SharedFloor = r.floorOffset + 1
	} else if f := &r.floorShare; f.learnedSet {
		r.state.SharedFloor = f.learned + 1
	}
}

// saveLeaderFloor saves a leader's own floor as the one to hold to after
// a restart, at once when it is the first or below the saved one (the
// saved one rises with every compaction point, keepSharedFloor). A
// leader that crashes never steps down (stepDownFloor), and its driver's
// floor was only in memory: restarted as a follower with no floor saved,
// it compacted by retention alone before its new leader's first floor
// message, deleting what a divergent mirror needed to fork at its epoch's
// start (seed 743 of the minute runs: r0's leader of range 1, the home
// at epoch 3 from 15, crashed at 6480 ms, restarted and compacted to 31 at
// 6825; r1 then forked at 31, keeping its epoch-2 records [15, 31)).
func (r *Replica) saveLeaderFloor() {
	if !r.isLeader || !r.floorSet {
		return
	}
	if s := r.state.SharedFloor; s != 0 && s-1 <= r.floorOffset {
		return
	}
	prev := r.state
	r.state.SharedFloor = r.floorOffset + 1
	if err := r.cfg.State.Save(r.state); err != nil {
		r.state = prev
		r.logger.Warn("cannot save the compaction floor", "floor", r.floorOffset, "error", err)
	}
}

// stepDownFloor runs as this replica stops leading: the floor its driver
// set stays as the learned one until the next leader's floor message
// (else a leader that never followed one would compact by retention alone
// in between: seed 10 of the 3-second runs, with floors on leaders only).
func (r *Replica) stepDownFloor() {
	if r.floorSet {
		r.noteFloor(r.floorOffset)
	}
}

// compactionFloor is the floor Compact holds to: the driver's on a leader
// that has one, else the lower of the driver's and the learned one.
func (r *Replica) compactionFloor() (uint64, bool) {
	f := &r.floorShare
	switch {
	case r.floorSet && (r.isLeader || !f.learnedSet):
		return r.floorOffset, true
	case r.floorSet:
		return min(r.floorOffset, f.learned), true
	case f.learnedSet:
		return f.learned, true
	}
	return 0, false
}

// holdsAll reports whether Compact keeps the whole log: a follower that
// has no floor and has heard from no leader whether there is one (see
// above).
func (r *Replica) holdsAll() bool {
	f := &r.floorShare
	return !r.isLeader && !r.floorSet && !f.learnedSet && !f.heard
}

// LearnedCompactionFloor returns the floor this replica learned from a
// leader (false: none since it opened). For the driver goroutine.
func (r *Replica) LearnedCompactionFloor() (uint64, bool) {
	return r.floorShare.learned, r.floorShare.learnedSet
}
