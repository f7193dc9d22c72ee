package sim

import (
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// cloneMessage copies a Raft message as a network would: the receiver
// gets its own message and entries (a replica trims a message's entries
// as it steps it, holdBackAfterFork) and its own entry data. It does what
// proto.Clone does for the messages sendRaft carries, several times
// faster (proto.Clone walks the message by reflection, a third of the
// simulator's Raft cost). Scalar fields are pointers in this raftpb
// (proto2 optionals), and shared: protobuf-go code replaces such a
// pointer and never writes through it. A message with a snapshot or
// local responses (neither travels through sendRaft) goes to proto.Clone;
// Raft builds its messages, so they carry no unknown fields.
func cloneMessage(m *raftpb.Message) *raftpb.Message {
	if m.Snapshot != nil || len(m.Responses) > 0 {
		return proto.Clone(m).(*raftpb.Message)
	}
	c := &raftpb.Message{
		Type: m.Type, To: m.To, From: m.From, Term: m.Term, LogTerm: m.LogTerm, Index: m.Index,
		Commit: m.Commit, Vote: m.Vote, Reject: m.Reject, RejectHint: m.RejectHint,
	}
	if m.Context != nil {
		c.Context = append([]byte{}, m.Context...)
	}
	if len(m.Entries) > 0 {
		c.Entries = make([]*raftpb.Entry, len(m.Entries))
		es := make([]raftpb.Entry, len(m.Entries))
		for i, e := range m.Entries {
			es[i].Term, es[i].Index, es[i].Type = e.Term, e.Index, e.Type
			if e.Data != nil {
				es[i].Data = append([]byte{}, e.Data...)
			}
			c.Entries[i] = &es[i]
		}
	}
	return c
}
