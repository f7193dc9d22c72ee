package replica

import (
	"testing"

	"github.com/geolog/geolog/batch"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// fuzzReader hands out the fuzzer's bytes as small numbers; past the end
// it gives zeros.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

// delta is a small signed number around 0.
func (r *fuzzReader) delta() int64 { return int64(int8(r.byte())) / 16 }

func (r *fuzzReader) done() bool { return len(r.b) == 0 }

func add(v uint64, d int64) uint64 {
	if d < 0 && uint64(-d) > v {
		return 0
	}
	return uint64(int64(v) + d)
}

// peerTypes are the message types the fuzzer sends (MsgProp and a local
// type included: they must be refused).
var peerTypes = []raftpb.MessageType{
	raftpb.MsgApp, raftpb.MsgAppResp, raftpb.MsgHeartbeat, raftpb.MsgHeartbeatResp, raftpb.MsgVote,
	raftpb.MsgVoteResp, raftpb.MsgPreVote, raftpb.MsgPreVoteResp, raftpb.MsgTimeoutNow,
	raftpb.MsgTransferLeader, raftpb.MsgReadIndex, raftpb.MsgReadIndexResp, raftpb.MsgProp,
	raftpb.MsgStorageAppendResp,
}

// fuzzMessage builds one message to node to, near the values its log has
// (so that the fuzzer reaches the checks that need a match), from r.
func (c *cluster) fuzzMessage(r *fuzzReader, to uint64) *raftpb.Message {
	rep := c.replicas[to]
	from := 1 + (to+uint64(r.byte()%2))%3
	st := rep.rn.BasicStatus()
	term := add(st.GetTerm(), r.delta())
	index := add(rep.tailIndex, r.delta())
	logTerm := add(term, r.delta())
	if t, ok, _ := rep.termAt(index); ok && r.byte()%4 != 0 {
		logTerm = t
	}
	t := peerTypes[int(r.byte())%len(peerTypes)]
	m := &raftpb.Message{Type: t.Enum(), From: proto.Uint64(from), To: proto.Uint64(to), Term: proto.Uint64(term),
		Index: proto.Uint64(index), LogTerm: proto.Uint64(logTerm), Commit: proto.Uint64(add(st.GetCommit(), r.delta())),
		Reject: proto.Bool(r.byte()%8 == 0), RejectHint: proto.Uint64(add(index, r.delta()))}
	if t != raftpb.MsgApp && t != raftpb.MsgProp {
		return m
	}
	next := rep.tailOffset
	if _, ok, _ := rep.termAt(index); ok {
		if off, _, err := rep.tailAfter(index); err == nil {
			next = off
		}
	}
	for i, n := 0, int(r.byte()%4); i < n; i++ {
		e := &raftpb.Entry{Index: proto.Uint64(add(index+1+uint64(i), r.delta()/4)), Term: proto.Uint64(add(term, r.delta()/4)), Type: raftpb.EntryNormal.Enum()}
		switch r.byte() % 6 {
		case 0: // a leader's empty entry
		case 1, 2:
			base := add(next, r.delta()/4)
			recs := 1 + int(r.byte()%3)
			rs := make([]batch.Record, recs)
			for j := range rs {
				rs[j] = batch.Record{Key: []byte{r.byte()}, Value: []byte("v")}
			}
			e.Data = batch.Encode(nil, batch.Header{Type: batch.TypeData, BaseOffset: base, Epoch: uint64(r.byte() % 3)}, rs)
			next = base + uint64(recs)
		case 3:
			cc := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{
				Type: raftpb.ConfChangeType(r.byte() % 4).Enum(), NodeId: proto.Uint64(uint64(r.byte() % 5))}}}
			e.Type = raftpb.EntryConfChangeV2.Enum()
			e.Data, _ = proto.Marshal(cc)
		case 4:
			d := forkDesc{At: add(next, r.delta()), KeepIndex: add(index, r.delta()), Proposer: from, ProposalTerm: term}
			payload := d.encode()
			if r.byte()%2 == 0 { // a skip (skip.go), maybe to where the log already is
				payload = skipDesc{At: add(next, r.delta()), Proposer: from, ProposalTerm: term}.encode()
			}
			e.Data = batch.EncodeControl(nil, batch.Header{Type: batch.TypeFork, BaseOffset: next, Epoch: uint64(r.byte()%4) + 1}, payload)
		default:
			e.Data = make([]byte, int(r.byte()))
			for j := range e.Data {
				e.Data[j] = r.byte()
			}
		}
		m.Entries = append(m.Entries, e)
	}
	return m
}

// FuzzStep steps the fuzzer's messages, in the shape of peers' but with
// every field free, into the members of a settled 3-node group between
// ticks: no message may panic a replica or stop it (a replica stops on an
// inconsistency only after Step let it through).
func FuzzStep(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0})
	f.Add([]byte{1, 1, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{1, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 2, 1, 0, 5, 1, 0, 5})
	f.Add([]byte{0, 0, 32, 0, 0, 1, 2, 0, 0, 0, 0, 0, 0, 1, 3, 3, 1})
	f.Add([]byte{2, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 4, 0, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 512 {
			return
		}
		c := forgedCluster(t)
		r := &fuzzReader{b: data}
		for steps := 0; !r.done() && steps < 32; steps++ {
			to := 1 + uint64(r.byte()%3)
			m := c.fuzzMessage(r, to)
			_ = c.replicas[to].Step(m)
			c.settle() // fails the test if a replica stops
			if r.byte()%4 == 0 {
				c.tick(1)
			}
		}
		c.tick(12) // elections and catch-up run to the end
	})
}
