package replica

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"go.etcd.io/raft/v3"
)

// Relearning: what a replica does after the machine's crash (commitmark.go).
//
// A replica publishes applied entries once a commit mark covers them; the
// mark may be the state's record, written without an fdatasync. A
// process's crash keeps that record in the page cache, and the restarted
// replica trusts it (Load's MarkTrusted: the record carries the boot it
// was written in). The machine's crash may lose it: the replica restarted
// in a new boot knows a commit index (its durable marks') that may be
// below what it published before. So it relearns:
//
//  1. New marks a replica with a log whose mark is not trusted as
//     relearning: Relearning is true and the node serves no reader from
//     it (a retriable UNAVAILABLE), though it publishes what it applies
//     as usual, for its own use.
//  2. It asks Raft for a read index (ReadIndex, with relearnContext) as
//     soon as it knows a leader, and again every election timeout until
//     one is answered: a follower forwards the request to its leader,
//     and a leader answers only once it has committed an entry of its
//     own term, so the index answered covers every entry committed
//     before the crash, and with them everything this replica published.
//     A leader asks only once an entry of its own term is committed: etcd
//     raft answers a sole voter at once with its commit index, which may
//     be the stale one it restarted with.
//  3. Once it applied up to that index it stops relearning, and stamps
//     the state's record with the new boot (from then on a process's
//     crash keeps what it publishes, as in 1).
//
// A relearning replica does not quiesce (it needs its ticks to ask
// again). One that cannot reach a quorum's leader stays relearning, and
// its node serves its range's readers from the other replicas.

// relearnState is a relearning replica's state (driver goroutine).
type relearnState struct {
	on       bool
	answered bool   // a read index was answered
	index    uint64 // the highest answered
	seq      uint64 // requests asked
	lead     uint64 // the leader (or this replica, leading) last asked
	ticks    int    // ticks until asking again
}

// relearnPrefix starts a relearn request's context (then its sequence
// number, u64): never 8 bytes long (linearizable reads' contexts) nor the
// quiesce marker.
var relearnPrefix = []byte("geolog.relearn.")

func relearnContext(seq uint64) []byte {
	return binary.LittleEndian.AppendUint64(append([]byte(nil), relearnPrefix...), seq)
}

func isRelearnContext(ctx []byte) bool {
	return len(ctx) == len(relearnPrefix)+8 && bytes.HasPrefix(ctx, relearnPrefix)
}

// Relearning reports whether the replica may publish less than it
// published before the machine's crash: no reader may read from it until
// it is false (see above). Safe from any goroutine.
func (r *Replica) Relearning() bool { return r.relearning.Load() }

// startRelearning decides, when the replica opens, whether it relearns: it
// holds entries and its commit mark is not trusted. A trusted record saved
// synced (a clean Close) is overwritten durably by an unsynced one first,
// so that a later WriteCommit lost with the machine never leaves it
// standing.
func (r *Replica) startRelearning(trusted, synced bool) error {
	if !trusted {
		if r.tailIndex > 0 {
			r.relearn.on = true
			r.relearning.Store(true)
			r.logger.Info("relearning the commit index after a machine restart", "commit", r.state.Raft.GetCommit())
		}
		return nil
	}
	commit := r.state.Raft.GetCommit()
	if synced {
		if err := r.cfg.State.SaveCommit(commit, false); err != nil {
			return fmt.Errorf("replica: commit mark %d on open: %w", commit, err)
		}
	}
	r.writer.record.Store(commit)
	return nil
}

// askRelearn asks for a read index when the replica relearns and has a
// leader (or leads) it has not asked, or its ticks ran out (a request or
// its answer may be lost). For the driver goroutine.
func (r *Replica) askRelearn(tick bool) {
	rl := &r.relearn
	if !rl.on || rl.answered {
		return
	}
	lead := r.leaderID.Load()
	if tick && rl.ticks > 0 {
		rl.ticks--
	}
	if lead == 0 || (lead == rl.lead && rl.ticks > 0) {
		return
	}
	if r.isLeader && !r.committedInTerm() {
		// etcd raft answers a sole voter's read index at once with its
		// commit index, before its election's entry commits (a group of
		// more holds the request until then): that index may be the
		// stale one this replica restarted with. Ask once an entry of
		// this term is committed, which covers every entry before it.
		return
	}
	rl.seq++
	rl.lead, rl.ticks = lead, r.cfg.ElectionTick
	r.rn.ReadIndex(relearnContext(rl.seq))
}

// committedInTerm reports whether this leader's commit index reaches an
// entry of its own term (etcd raft's committedEntryInCurrentTerm).
func (r *Replica) committedInTerm() bool {
	t, err := r.storage.Term(r.state.Raft.GetCommit())
	return err == nil && t == r.term
}

// takeRelearnAnswers takes the read indexes answered to relearn requests
// out of a Ready's read states. For the driver goroutine.
func (r *Replica) takeRelearnAnswers(states []raft.ReadState) {
	rl := &r.relearn
	for _, rs := range states {
		if rl.on && isRelearnContext(rs.RequestCtx) {
			rl.answered, rl.index = true, max(rl.index, rs.Index)
		}
	}
}

// finishRelearning ends relearning once the replica applied up to the
// index answered: it publishes at least what it published before the
// crash. It stamps the state's record with this boot and wakes the
// readers waiting. For the driver goroutine.
func (r *Replica) finishRelearning() error {
	rl := &r.relearn
	if !rl.on || !rl.answered || r.appliedIndex < rl.index {
		return nil
	}
	rl.on = false
	r.relearning.Store(false)
	if err := r.saveRecord(r.appliedIndex); err != nil {
		return err
	}
	r.logger.Info("relearned the commit index", "index", rl.index, "committed_end", r.committed.Load())
	r.notify()
	return nil
}

// SaveCleanMark saves the state's mark record synced and marked clean
// (StateStore.SaveCommit): a restart in a later boot trusts it, and does
// not relearn. For a replica shutting down gracefully, after its last log
// write and before Close; nothing may be published after it. A relearning
// replica saves nothing.
func (r *Replica) SaveCleanMark() error {
	if r.relearning.Load() {
		return nil
	}
	w := &r.writer
	w.markMu.Lock()
	defer w.markMu.Unlock()
	w.mu.Lock()
	index := max(w.markDone, w.record.Load())
	w.mu.Unlock()
	if err := r.cfg.State.SaveCommit(index, true); err != nil {
		return fmt.Errorf("replica: clean commit mark %d: %w", index, err)
	}
	return nil
}
