package replica

import (
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// Commit-only appends (Config.HoldCommits).
//
// When an append commits, etcd raft tells every follower the new commit
// index at once (bcastAppend after maybeCommit): an append with no entries
// to each follower, and each answers it. A producer appending one record
// at a time so costs four of the eight Raft messages of each append (each a
// TLS record and goroutine wake-ups on both sides) for something the next
// append carries anyway: every MsgApp names the leader's commit index.
//
// So while appends come continuously (the range's last two log writes were
// queued at most commitHoldMax apart), a
// leader holds a commit-only append to a follower that holds every entry
// it names (Raft's replicate state, its match at the append's index),
// instead of sending it. Any later message to that follower carrying a
// commit index at least as high (an append with entries, a heartbeat)
// replaces it; what is still held commitHoldMax after the first was held
// is sent (the driver calls SendHeldCommits when HeldCommitsWait says).
//
// Why it is safe: only a follower's knowledge of the commit index waits,
// never what is durable or acked (the leader's commit index moves on
// durable MsgAppResps only, and acks follow it); Raft already tolerates
// the loss of any message, and a held one is sent late, not lost. What it
// costs: a follower learns a commit up to commitHoldMax later at the end
// of a burst, and while appends come continuously it publishes what the
// next append names (one gap between appends later). A leader holding one
// does not quiesce; a leader that steps down drops them (its followers
// learn the commit from the next leader).

// commitHoldMax bounds how long a commit-only append is held, and how far
// apart two log writes may be for appends to count as continuous.
const commitHoldMax = 5 * time.Millisecond

// heldCommits are the commit-only appends a leader holds, at most one per
// follower, and when the first was held.
type heldCommits struct {
	msgs  []*raftpb.Message
	since time.Time
}

// holdCommits returns msgs without the commit-only appends it holds, and
// drops held ones that a message in msgs replaces. For the driver
// goroutine, on the messages of a Ready, in order.
func (r *Replica) holdCommits(msgs []*raftpb.Message) []*raftpb.Message {
	if !r.cfg.HoldCommits {
		return msgs
	}
	var continuous, decided bool
	out := msgs[:0] // Raft let go of the Ready's slice
	for _, m := range msgs {
		r.replaceHeld(m)
		if m.GetType() == raftpb.MsgApp && len(m.GetEntries()) == 0 {
			if !decided {
				continuous, decided = r.appendsContinuous(), true
			}
			if continuous && r.caughtUp(m.GetTo(), m.GetIndex()) {
				if len(r.held.msgs) == 0 {
					r.held.since = r.cfg.Now()
				}
				r.held.msgs = append(r.held.msgs, m)
				continue
			}
		}
		out = append(out, m)
	}
	return out
}

// replaceHeld drops the message held for m's recipient if m carries a
// commit index at least as high in the same term or a later one.
func (r *Replica) replaceHeld(m *raftpb.Message) {
	t := m.GetType()
	if len(r.held.msgs) == 0 || (t != raftpb.MsgApp && t != raftpb.MsgHeartbeat) {
		return
	}
	for i, h := range r.held.msgs {
		if h.GetTo() == m.GetTo() && m.GetTerm() >= h.GetTerm() && m.GetCommit() >= h.GetCommit() {
			r.held.msgs = append(r.held.msgs[:i], r.held.msgs[i+1:]...)
			return
		}
	}
}

// appendsContinuous reports whether the range's last two log writes were
// queued at most commitHoldMax apart.
func (r *Replica) appendsContinuous() bool {
	w := &r.writer
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.writeQueuedAt.IsZero() && w.writeGap <= commitHoldMax && r.cfg.Now().Sub(w.writeQueuedAt) <= commitHoldMax
}

// caughtUp reports whether follower id is in Raft's replicate state with
// every entry up to index: an append to it with no entries at index only
// carries the commit index (not a probe).
func (r *Replica) caughtUp(id, index uint64) bool {
	ok := false
	r.rn.WithProgress(func(pid uint64, _ raft.ProgressType, pr tracker.Progress) {
		if pid == id {
			ok = pr.State == tracker.StateReplicate && pr.Match == index
		}
	})
	return ok
}

// HeldCommitsWait returns how long, by Config.Now's clock, until the
// commit-only appends held now must be sent (SendHeldCommits), at most
// commitHoldMax; false if none are held. For the driver goroutine.
func (r *Replica) HeldCommitsWait() (time.Duration, bool) {
	if len(r.held.msgs) == 0 {
		return 0, false
	}
	return min(max(r.held.since.Add(commitHoldMax).Sub(r.cfg.Now()), 0), commitHoldMax), true
}

// SendHeldCommits sends the commit-only appends held. For the driver
// goroutine.
func (r *Replica) SendHeldCommits() {
	msgs := r.held.msgs
	r.held = heldCommits{}
	if len(msgs) > 0 && r.failure.Load() == nil {
		r.cfg.Send(msgs)
	}
}
