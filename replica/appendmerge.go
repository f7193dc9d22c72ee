package replica

import (
	"go.etcd.io/raft/v3/raftpb"
)

// Appends merged per follower (Config.MergeAppends).
//
// etcd raft sends a follower in replicate state an append for each
// proposal it steps (bcastAppend after appendEntry), and one more with
// the new commit index when an acknowledgement commits. A Ready taken
// after several proposals therefore holds several appends to each
// follower, each continuing the one before: each is encoded, carried,
// decoded, stepped and answered on its own, though one message holding
// their entries says the same. mergeAppends folds such a run into its
// first message, per follower, before the Ready's messages leave.
//
// Why it is safe: the merged message is the one Raft would have sent had
// the proposals come before its first append: the same term, the first
// message's Index and LogTerm, every entry in order, the highest commit
// index. The follower's answer names the merged message's last index,
// which frees every append of the run in the leader's window of appends
// in flight (its acknowledgement frees all up to that index). Only
// appends that continue one another exactly are merged (the later one's
// Index and LogTerm are the earlier one's last entry), and only while the
// merged message stays within Config.MaxSizePerMsg and the entry bound a
// receiver checks. Nothing about what is durable or acked changes.

// mergeAppends returns msgs with each append that continues the previous
// message to the same follower merged into that message. For the driver
// goroutine, on a Ready's messages to peers, in order; it may modify the
// messages (Raft let go of them) but never the entry slices they share
// with Raft's log.
func mergeAppends(msgs []*raftpb.Message, bytesMax uint64) []*raftpb.Message {
	if len(msgs) < 2 {
		return msgs
	}
	// last holds, per follower, the position in out of the last message
	// to it; a Ready names a handful of followers.
	type lastTo struct {
		to  uint64
		pos int
	}
	var lastArr [8]lastTo
	last := lastArr[:0]
	out := msgs[:0]
	for _, m := range msgs {
		i := -1
		for j := range last {
			if last[j].to == m.GetTo() {
				i = j
				break
			}
		}
		if i >= 0 && mergeAppend(out[last[i].pos], m, bytesMax) {
			continue
		}
		if i < 0 {
			last = append(last, lastTo{to: m.GetTo()})
			i = len(last) - 1
		}
		last[i].pos = len(out)
		out = append(out, m)
	}
	clear(msgs[len(out):])
	return out
}

// mergeAppend merges append m into prev, the message before it to the same
// follower, if m continues prev exactly and the result stays within
// bytesMax and the entry bound; it reports whether it did.
func mergeAppend(prev, m *raftpb.Message, bytesMax uint64) bool {
	if prev.GetType() != raftpb.MsgApp || m.GetType() != raftpb.MsgApp ||
		prev.GetTerm() != m.GetTerm() || prev.GetFrom() != m.GetFrom() || m.GetCommit() < prev.GetCommit() {
		return false
	}
	lastIndex, lastTerm := prev.GetIndex(), prev.GetLogTerm()
	pe := prev.GetEntries()
	if n := len(pe); n > 0 {
		lastIndex, lastTerm = pe[n-1].GetIndex(), pe[n-1].GetTerm()
	}
	if m.GetIndex() != lastIndex || m.GetLogTerm() != lastTerm {
		return false
	}
	me := m.GetEntries()
	if len(pe)+len(me) > peerEntriesMax {
		return false
	}
	if len(pe) > 0 && len(me) > 0 && appendBytes(pe)+appendBytes(me) > bytesMax {
		return false
	}
	switch {
	case len(me) == 0: // m only carries a newer commit index
	case len(pe) == 0: // prev only carried a commit index
		prev.Entries = me
	default:
		// A new slice: prev's may share its backing array with Raft's log.
		ents := make([]*raftpb.Entry, 0, len(pe)+len(me))
		prev.Entries = append(append(ents, pe...), me...)
	}
	prev.Commit = m.Commit
	return true
}

// appendBytes is the size Raft counts for entries against MaxSizePerMsg.
func appendBytes(ents []*raftpb.Entry) uint64 {
	var n uint64
	for _, e := range ents {
		n += uint64(entryBytes(e))
	}
	return n
}
