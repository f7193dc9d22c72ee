package replica

import (
	"fmt"

	"github.com/geolog/geolog/batch"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Step's checks against the log (see peercheck.go). They need the log as
// Raft sees it when it steps the message: tailIndex and tailOffset cover
// what Ready cycles handed over, and stepped covers what Step let Raft
// append since the last Ready (several appends can arrive in one batch of
// the driver's, before a Ready hands the first one over).

// steppedEntry is an entry that Step let Raft append after the last
// Ready: its index, term and the log's next offset after it.
type steppedEntry struct {
	index, term, nextOffset uint64
	appendTimeUnixNanos     int64
}

// checkStep checks a message from a peer against this replica's log, after
// checkShape passed. A heartbeat's commit index is bounded in place (m is
// Step's to change).
func (r *Replica) checkStep(m *raftpb.Message) error {
	switch m.GetType() {
	case raftpb.MsgApp:
		return r.checkAppend(m)
	case raftpb.MsgAppResp:
		// A follower acknowledges or refuses entries this leader sent:
		// none past its log (Raft would take them as matched and send
		// from past its end).
		if last := r.lastHeld(); m.GetIndex() > last {
			return invalid("append response for index %d from node %d, the log ends at %d", m.GetIndex(), m.GetFrom(), last)
		}
	case raftpb.MsgTransferLeader:
		// A follower forwards a leadership transfer to its leader, and
		// only a leader takes one from a peer: Raft panics forwarding one
		// that came with a term.
		if st := r.rn.BasicStatus(); st.RaftState != raft.StateLeader {
			return fmt.Errorf("%w: leadership transfer from node %d to a %s", ErrMessageDropped, m.GetFrom(), st.RaftState)
		}
	case raftpb.MsgHeartbeat:
		// Raft commits a heartbeat's index without looking (and panics
		// past its log). A leader sends at most what this follower
		// acknowledged, which is in the log; bound it there.
		if bound := max(r.rn.BasicStatus().GetCommit(), r.lastHeld()); m.GetCommit() > bound {
			m.Commit = proto.Uint64(bound)
		}
	}
	return nil
}

// lastHeld is the last index of the log as Raft sees it now.
func (r *Replica) lastHeld() uint64 {
	if r.snapStepped {
		// A snapshot stepped since the last Ready: Raft's log is the
		// snapshot, committed.
		return r.rn.BasicStatus().GetCommit()
	}
	if n := len(r.stepped); n > 0 {
		return r.stepped[n-1].index
	}
	return r.tailIndex
}

// checkAppend checks an append that Raft would take: one from the current
// term or a newer one, matching this log at m.Index, past the commit
// index. Its first entry that this log does not hold must start at the
// offset the log has there, and must not be at or below the commit index
// (Raft panics on a conflict with a committed entry). Entries it lets
// through are recorded in stepped.
func (r *Replica) checkAppend(m *raftpb.Message) error {
	ents := m.GetEntries()
	if len(ents) == 0 {
		return nil
	}
	if r.snapStepped {
		return fmt.Errorf("%w: an append after a snapshot not yet taken in; the leader sends it again", ErrMessageDropped)
	}
	st := r.rn.BasicStatus()
	if m.GetTerm() < st.GetTerm() || (m.GetTerm() == st.GetTerm() && st.RaftState == raft.StateLeader) || m.GetIndex() < st.GetCommit() {
		return nil // Raft ignores its entries
	}
	if t, ok, err := r.termAt(m.GetIndex()); err != nil || !ok || t != m.GetLogTerm() {
		return err // no match here: Raft refuses it (with a hint)
	}
	ci := -1 // the first entry this log does not hold
	for i, e := range ents {
		t, ok, err := r.termAt(e.GetIndex())
		if err != nil {
			return err
		}
		if !ok || t != e.GetTerm() {
			ci = i
			break
		}
	}
	if ci < 0 {
		return nil // all held: Raft appends nothing
	}
	if idx := ents[ci].GetIndex(); idx <= st.GetCommit() {
		return invalid("entry %d of term %d conflicts with the committed log (commit index %d)", idx, ents[ci].GetTerm(), st.GetCommit())
	}
	next, appendTime, err := r.tailAfter(ents[ci].GetIndex() - 1)
	if err != nil {
		return err
	}
	added := make([]steppedEntry, 0, len(ents)-ci)
	for _, e := range ents[ci:] {
		h, framed, err := entryHeader(e)
		if err != nil {
			return err
		}
		if framed {
			// What the segment store takes: offsets that continue the
			// log, append times that do not go back.
			if !continues(h, next) {
				return invalid("entry %d carries base offset %d, the log continues at offset %d", e.GetIndex(), h.BaseOffset, next)
			}
			if h.AppendTimeUnixNanos < appendTime {
				return invalid("entry %d carries append time %d, before the log's %d", e.GetIndex(), h.AppendTimeUnixNanos, appendTime)
			}
			next, appendTime = h.NextOffset(), h.AppendTimeUnixNanos
		}
		added = append(added, steppedEntry{index: e.GetIndex(), term: e.GetTerm(), nextOffset: next, appendTimeUnixNanos: appendTime})
	}
	r.noteStepped(added)
	return nil
}

// noteStepped records entries Raft takes (appended after or over the log's
// tail, as Raft does).
func (r *Replica) noteStepped(added []steppedEntry) {
	first := added[0].index
	for len(r.stepped) > 0 && r.stepped[len(r.stepped)-1].index >= first {
		r.stepped = r.stepped[:len(r.stepped)-1]
	}
	r.stepped = append(r.stepped, added...)
}

// termAt returns the term of the entry at index i in the log as Raft sees
// it, and whether the log holds i.
func (r *Replica) termAt(i uint64) (uint64, bool, error) {
	if n := len(r.stepped); n > 0 && i >= r.stepped[0].index {
		if i > r.stepped[n-1].index {
			return 0, false, nil
		}
		return r.stepped[i-r.stepped[0].index].term, true, nil
	}
	switch {
	case i == r.state.SnapshotIndex:
		return r.state.SnapshotTerm, true, nil
	case i < r.state.SnapshotIndex || i > r.tailIndex:
		return 0, false, nil
	}
	if t, ok := r.storage.cache.term(i); ok {
		return t, true, nil
	}
	if err := r.flushLogWrites(); err != nil {
		return 0, false, err
	}
	t, err := r.cfg.Log.TermAt(i)
	if err != nil {
		return 0, false, fmt.Errorf("replica: term at index %d: %w", i, err)
	}
	return t, true, nil
}

// tailAfter returns the log's next offset and newest append time after
// the entry at index i, which the log holds (termAt said so).
func (r *Replica) tailAfter(i uint64) (uint64, int64, error) {
	if n := len(r.stepped); n > 0 && i >= r.stepped[0].index {
		e := r.stepped[i-r.stepped[0].index]
		return e.nextOffset, e.appendTimeUnixNanos, nil
	}
	switch {
	case i == r.tailIndex:
		return r.tailOffset, r.logAppendUnixNanos, nil
	case i == r.state.SnapshotIndex:
		return r.state.SnapshotNextOffset, r.state.SnapshotAppendUnixNanos, nil
	}
	// Rare: a new leader overwrites part of this log's uncommitted tail.
	// Every frame's header has the log's next offset and newest append
	// time at its place (a control frame takes them from the log), and
	// the log has the frame once what is queued is written.
	if err := r.flushLogWrites(); err != nil {
		return 0, 0, err
	}
	var h batch.Header
	found := false
	err := r.cfg.Log.HeadersByIndex(i, i+1, func(fh batch.Header) { h, found = fh, true })
	if err != nil || !found {
		return 0, 0, fmt.Errorf("replica: the log's frame at index %d: %v", i, err)
	}
	return h.NextOffset(), h.AppendTimeUnixNanos, nil
}

// flushLogWrites writes what is queued for the log writer, on the driver
// goroutine (as appendSync does), so that the log holds every entry Raft
// was handed.
func (r *Replica) flushLogWrites() error {
	r.writer.wmu.Lock()
	defer r.writer.wmu.Unlock()
	return r.writeQueued()
}
