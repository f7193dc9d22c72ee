package replica

import (
	"errors"
	"fmt"
	"testing"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// snapshotOf is what a probe must leave unchanged on a node: its log, its
// committed offset, its term and its highest epoch.
type nodeView struct {
	values    string
	committed uint64
	term      uint64
	epoch     uint64
	failed    bool
}

func (c *cluster) view(id uint64) nodeView {
	r := c.replicas[id]
	return nodeView{values: fmt.Sprint(c.logValues(id)), committed: r.Committed(), term: r.rn.BasicStatus().GetTerm(),
		epoch: r.HighestEpoch(), failed: r.Failure() != nil}
}

// forgedCluster is a settled 3-node group led by node 1 with 6 records
// in two batches, committed everywhere.
func forgedCluster(t *testing.T) *cluster {
	c := newCluster(t, 3)
	c.elect(1)
	var res []Result
	c.replicas[1].Propose(op(7, 0, 3, "a", &res))
	c.replicas[1].Propose(op(7, 3, 3, "b", &res))
	c.settle()
	c.tick(2)
	if len(res) != 2 || res[1].Err != nil {
		t.Fatalf("appends: %+v", res)
	}
	return c
}

// dataEntry is a leader's data entry at index and term whose frame starts
// at base.
func dataEntry(index, term, base uint64, value string) *raftpb.Entry {
	h := batch.Header{Type: batch.TypeData, BaseOffset: base, Epoch: 1}
	frame := batch.Encode(nil, h, []batch.Record{{Key: []byte("k"), Value: []byte(value)}})
	return &raftpb.Entry{Index: proto.Uint64(index), Term: proto.Uint64(term), Type: raftpb.EntryNormal.Enum(), Data: frame}
}

// skipEntry is a leader's skip entry (skip.go) at index and term, at the
// log's next offset base, skipping to at; mangle changes its payload
// (which is cut by cut bytes, if given) before the frame is encoded.
func skipEntry(index, term, base, at uint64, mangle func([]byte), cut ...int) *raftpb.Entry {
	payload := skipDesc{At: at, Proposer: 1, ProposalTerm: term}.encode()
	mangle(payload)
	for _, n := range cut {
		payload = payload[:len(payload)-n]
	}
	frame := batch.EncodeControl(nil, batch.Header{Type: batch.TypeFork, BaseOffset: base, Epoch: 1}, payload)
	return &raftpb.Entry{Index: proto.Uint64(index), Term: proto.Uint64(term), Type: raftpb.EntryNormal.Enum(), Data: frame}
}

// appendFrom builds the MsgApp node from would send to node to, after the
// last entry of to's log.
func (c *cluster) appendFrom(from, to uint64, ents ...*raftpb.Entry) *raftpb.Message {
	r := c.replicas[to]
	term := r.rn.BasicStatus().GetTerm()
	last := r.tailIndex
	lastTerm, _, err := r.termAt(last)
	if err != nil {
		c.t.Fatal(err)
	}
	return &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: proto.Uint64(from), To: proto.Uint64(to),
		Term: proto.Uint64(term), Index: proto.Uint64(last), LogTerm: proto.Uint64(lastTerm),
		Commit: proto.Uint64(last + uint64(len(ents))), Entries: ents}
}

// TestForgedAppendWrongOffset is the probe: a MsgApp in the
// leader's name whose entry does not start at the follower's next offset
// panicked the follower. Now it is refused, and the follower's log, term
// and epoch stay as they were while the group goes on.
func TestForgedAppendWrongOffset(t *testing.T) {
	c := forgedCluster(t)
	before := c.view(2)
	r2 := c.replicas[2]
	for _, base := range []uint64{0, 5, 7, 1 << 40} {
		m := c.appendFrom(1, 2, dataEntry(r2.tailIndex+1, before.term, base, "forged"))
		if err := r2.Step(m); !errors.Is(err, ErrInvalidMessage) {
			t.Fatalf("base %d: Step = %v, want ErrInvalidMessage", base, err)
		}
		c.settle()
		c.tick(2)
		if got := c.view(2); got != before {
			t.Fatalf("base %d: node 2 changed: %+v, was %+v", base, got, before)
		}
	}
	// The group still works, and the follower follows.
	var res []Result
	c.replicas[1].Propose(op(7, 6, 1, "c", &res))
	c.settle()
	c.tick(2)
	if len(res) != 1 || res[0].Err != nil || res[0].BaseOffset != 6 {
		t.Fatalf("append after the probes: %+v", res)
	}
	if got, want := fmt.Sprint(c.logValues(2)), fmt.Sprint(c.logValues(1)); got != want {
		t.Fatalf("follower log %s, leader's %s", got, want)
	}
}

// TestForgedOverwriteWrongOffset: an append that overwrites the
// follower's uncommitted tail (a new leader's, in shape) but does not
// continue the log where the entries it keeps end is refused before
// anything is truncated.
func TestForgedOverwriteWrongOffset(t *testing.T) {
	c := forgedCluster(t)
	// Node 3 takes an entry that never commits: node 2 hears nothing and
	// node 3's acks are lost.
	c.drop = func(m *raftpb.Message) bool { return m.GetTo() == 2 || m.GetFrom() == 3 }
	var res []Result
	c.replicas[1].Propose(op(7, 6, 2, "u", &res))
	c.settle()
	c.drop = nil
	r3 := c.replicas[3]
	committedIndex := r3.rn.BasicStatus().GetCommit()
	if r3.tailIndex <= committedIndex {
		t.Fatalf("node 3 holds no uncommitted entry (tail %d, commit %d)", r3.tailIndex, committedIndex)
	}
	before := c.view(3)
	term := r3.rn.BasicStatus().GetTerm() + 1
	lastTerm, _, _ := r3.termAt(committedIndex)
	m := &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: proto.Uint64(2), To: proto.Uint64(3),
		Term: proto.Uint64(term), Index: proto.Uint64(committedIndex), LogTerm: proto.Uint64(lastTerm),
		Commit: proto.Uint64(committedIndex), Entries: []*raftpb.Entry{dataEntry(committedIndex+1, term, 2, "x")}}
	if err := r3.Step(m); !errors.Is(err, ErrInvalidMessage) {
		t.Fatalf("Step = %v, want ErrInvalidMessage", err)
	}
	c.settle()
	if got := c.view(3); got != before {
		t.Fatalf("node 3 changed: %+v, was %+v", got, before)
	}
}

// TestPeerMessagesRefused: messages Raft would panic on, or that a peer
// never sends, are refused, and each node stays as it was.
func TestPeerMessagesRefused(t *testing.T) {
	c := forgedCluster(t)
	term := c.replicas[1].rn.BasicStatus().GetTerm()
	u := proto.Uint64
	cases := []struct {
		name string
		to   uint64
		m    *raftpb.Message
	}{
		{"a proposal forwarded to the leader", 1, &raftpb.Message{Type: raftpb.MsgProp.Enum(), From: u(2), To: u(1),
			Entries: []*raftpb.Entry{{Data: batch.Encode(nil, batch.Header{Type: batch.TypeData}, []batch.Record{{Value: []byte("p")}})}}}},
		{"an ack past the leader's log", 1, &raftpb.Message{Type: raftpb.MsgAppResp.Enum(), From: u(2), To: u(1), Term: u(term), Index: u(1 << 30)}},
		{"a local message type", 2, &raftpb.Message{Type: raftpb.MsgStorageAppendResp.Enum(), From: u(1), To: u(2), Term: u(term)}},
		{"no term", 2, &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: u(1), To: u(2)}},
		{"a term at the top of uint64", 2, &raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), From: u(1), To: u(2), Term: u(1<<64 - 1)}},
		{"entries that do not follow the index", 2, func() *raftpb.Message {
			m := c.appendFrom(1, 2, dataEntry(c.replicas[2].tailIndex+5, term, 6, "x"))
			return m
		}()},
		{"an entry of a newer term than its message", 2, c.appendFrom(1, 2, dataEntry(c.replicas[2].tailIndex+1, term+1, 6, "x"))},
		{"entries on a heartbeat", 2, &raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), From: u(1), To: u(2), Term: u(term),
			Entries: []*raftpb.Entry{dataEntry(1, term, 0, "x")}}},
		{"a configuration change that does not decode", 2, c.appendFrom(1, 2, &raftpb.Entry{Index: u(c.replicas[2].tailIndex + 1),
			Term: u(term), Type: raftpb.EntryConfChangeV2.Enum(), Data: []byte{0xff, 0xff, 0xff}})},
		{"a no-op frame as an entry", 2, c.appendFrom(1, 2, &raftpb.Entry{Index: u(c.replicas[2].tailIndex + 1), Term: u(term),
			Type: raftpb.EntryNormal.Enum(), Data: batch.EncodeControl(nil, batch.Header{Type: batch.TypeNoop, BaseOffset: 6}, nil)})},
		{"bytes after a frame", 2, func() *raftpb.Message {
			e := dataEntry(c.replicas[2].tailIndex+1, term, 6, "x")
			e.Data = append(e.Data, 0)
			return c.appendFrom(1, 2, e)
		}()},
		{"data frames that do not chain", 2, c.appendFrom(1, 2, dataEntry(c.replicas[2].tailIndex+1, term, 6, "x"),
			dataEntry(c.replicas[2].tailIndex+2, term, 9, "y"))},
		{"a skip frame naming an index before it", 2, c.appendFrom(1, 2, skipEntry(c.replicas[2].tailIndex+1, term, 6, 40,
			func(b []byte) { b[0] = 3 }))},
		{"a skip frame of another version", 2, c.appendFrom(1, 2, skipEntry(c.replicas[2].tailIndex+1, term, 6, 40,
			func(b []byte) { b[batch.ForkPrevIndexBytes+len(skipDescMagic)] = 9 }))},
		{"a skip frame cut short", 2, c.appendFrom(1, 2, skipEntry(c.replicas[2].tailIndex+1, term, 6, 40,
			func(b []byte) { b[len(b)-1] = 0xee }, 8))},
	}
	for _, tc := range cases {
		before := [3]nodeView{c.view(1), c.view(2), c.view(3)}
		if err := c.replicas[tc.to].Step(tc.m); !errors.Is(err, ErrInvalidMessage) {
			t.Fatalf("%s: Step = %v, want ErrInvalidMessage", tc.name, err)
		}
		if err := CheckPeerMessage(tc.m); !errors.Is(err, ErrInvalidMessage) && tc.name != "an ack past the leader's log" {
			t.Fatalf("%s: CheckPeerMessage = %v, want ErrInvalidMessage", tc.name, err)
		}
		c.settle()
		if after := [3]nodeView{c.view(1), c.view(2), c.view(3)}; after != before {
			t.Fatalf("%s: nodes changed: %+v, were %+v", tc.name, after, before)
		}
	}
	// A frame whose CRC fails passes Step's shape check (the transport
	// checks CRCs, and the log writer again) but not CheckPeerMessage.
	e := dataEntry(c.replicas[2].tailIndex+1, term, 6, "x")
	e.Data[len(e.Data)-1] ^= 0xff
	if err := CheckPeerMessage(c.appendFrom(1, 2, e)); !errors.Is(err, ErrInvalidMessage) {
		t.Fatalf("CheckPeerMessage of a frame with a bad CRC = %v", err)
	}
	// What the leader itself sends passes.
	good := c.appendFrom(1, 2, dataEntry(c.replicas[2].tailIndex+1, term, 6, "x"))
	if err := CheckPeerMessage(good); err != nil {
		t.Fatalf("a well-formed append: %v", err)
	}
	skip := c.appendFrom(1, 2, skipEntry(c.replicas[2].tailIndex+1, term, 6, 40, func([]byte) {}))
	if err := CheckPeerMessage(skip); err != nil {
		t.Fatalf("a well-formed skip entry: %v", err)
	}
}

// TestCompactedFramesFromPeer: what a leader of a compacted range sends
// passes the peer checks: a compaction marker, and a frame compaction by
// key rewrote that starts past the log's next offset (a mirror group
// proposes those as its home shipped them). The follower stores both,
// holes included. A frame that was not compacted may not leave a hole.
func TestCompactedFramesFromPeer(t *testing.T) {
	c := forgedCluster(t)
	r2 := c.replicas[2]
	term := r2.rn.BasicStatus().GetTerm()
	u := proto.Uint64
	at := r2.logAppendUnixNanos + 1
	marker := &raftpb.Entry{Index: u(r2.tailIndex + 1), Term: u(term), Type: raftpb.EntryNormal.Enum(),
		Data: batch.EncodeCompaction(nil, batch.Header{BaseOffset: 6, Epoch: 1, AppendTimeUnixNanos: at}, batch.Compaction{Point: 6})}
	compacted := &raftpb.Entry{Index: u(r2.tailIndex + 2), Term: u(term), Type: raftpb.EntryNormal.Enum(),
		Data: batch.Encode(nil, batch.Header{Type: batch.TypeData, BaseOffset: 10, Epoch: 1, OffsetSpan: 3, AppendTimeUnixNanos: at},
			[]batch.Record{{Key: []byte("k"), Value: []byte("kept"), OffsetDelta: 2}})}
	plain := dataEntry(r2.tailIndex+2, term, 10, "x")

	before := c.view(2)
	bad := c.appendFrom(1, 2, marker, plain)
	if err := CheckPeerMessage(bad); !errors.Is(err, ErrInvalidMessage) {
		t.Fatalf("a plain frame after a hole: CheckPeerMessage = %v, want ErrInvalidMessage", err)
	}
	if err := r2.Step(c.appendFrom(1, 2, dataEntry(r2.tailIndex+1, term, 10, "x"))); !errors.Is(err, ErrInvalidMessage) {
		t.Fatalf("a plain frame past the log's next offset: Step = %v, want ErrInvalidMessage", err)
	}
	c.settle()
	if got := c.view(2); got != before {
		t.Fatalf("node 2 changed: %+v, was %+v", got, before)
	}

	good := c.appendFrom(1, 2, marker, compacted)
	if err := CheckPeerMessage(good); err != nil {
		t.Fatalf("a marker and a compacted frame: CheckPeerMessage = %v", err)
	}
	c.drop = func(m *raftpb.Message) bool { return true } // node 1 never sent these
	if err := r2.Step(good); err != nil {
		t.Fatalf("a marker and a compacted frame: Step = %v", err)
	}
	c.settle()
	if f := r2.Failure(); f != nil {
		t.Fatalf("node 2 failed: %v", f)
	}
	if next := c.logs[2].NextOffset(); next != 13 {
		t.Fatalf("node 2's log continues at offset %d, want 13 (marker at 6, hole 7-9, compacted frame 10-12)", next)
	}
}

// TestHeartbeatCommitBounded: a heartbeat whose commit index is past the
// follower's log (Raft panics on it) is bounded to the log.
func TestHeartbeatCommitBounded(t *testing.T) {
	c := forgedCluster(t)
	before := c.view(2)
	term := c.replicas[1].rn.BasicStatus().GetTerm()
	m := &raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), From: proto.Uint64(1), To: proto.Uint64(2),
		Term: proto.Uint64(term), Commit: proto.Uint64(1 << 40)}
	if err := c.replicas[2].Step(m); err != nil {
		t.Fatalf("Step = %v", err)
	}
	c.settle()
	if got := c.view(2); got != before {
		t.Fatalf("node 2 changed: %+v, was %+v", got, before)
	}
	if commit := c.replicas[2].rn.BasicStatus().GetCommit(); commit > c.replicas[2].tailIndex {
		t.Fatalf("commit index %d past the log's last index %d", commit, c.replicas[2].tailIndex)
	}
}

// TestConfChangeRefusedAtApply: a committed configuration change that the
// configuration cannot take (Raft panics on it) is skipped, the proposer
// answered, and the group goes on.
func TestConfChangeRefusedAtApply(t *testing.T) {
	c := newCluster(t, 1)
	c.elect(1)
	cc := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeRemoveNode.Enum(), NodeId: proto.Uint64(1)}}}
	var got error
	done := false
	c.replicas[1].ProposeConfChange(cc, func(_ *raftpb.ConfState, err error) { got, done = err, true })
	c.settle()
	if !done || apierr.CodeOf(got) != apierr.InvalidArgument {
		t.Fatalf("removing the last voter: done %v, err %v", done, got)
	}
	if v := c.replicas[1].Conf().GetVoters(); len(v) != 1 || v[0] != 1 {
		t.Fatalf("voters %v", v)
	}
	var res []Result
	c.replicas[1].Propose(op(7, 0, 1, "a", &res))
	c.settle()
	if len(res) != 1 || res[0].Err != nil {
		t.Fatalf("append after the refused change: %+v", res)
	}
}
