package replica

import (
	"fmt"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// TestMergedAppendsReplicate: with MergeAppends, proposals stepped before
// one Ready leave as one append per follower (not one each), each follower
// answers it once (and the commit-only append after it once), and every op
// commits on every replica in order.
func TestMergedAppendsReplicate(t *testing.T) {
	for _, merge := range []bool{false, true} {
		t.Run(fmt.Sprint("merge=", merge), func(t *testing.T) {
			c := newClusterOpts(t, 3, 3, func(c *cluster) {
				c.repCfg = func(id uint64, cfg *Config) { cfg.MergeAppends = merge }
			})
			c.elect(1)
			withEntries, resps := map[uint64]int{}, map[uint64]int{}
			c.drop = func(m *raftpb.Message) bool {
				switch {
				case m.GetType() == raftpb.MsgApp && len(m.GetEntries()) > 0:
					withEntries[m.GetTo()]++
				case m.GetType() == raftpb.MsgAppResp:
					resps[m.GetFrom()]++
				}
				return false
			}
			var res []Result
			const ops = 6
			for round := range 3 {
				clear(withEntries)
				clear(resps)
				for i := range ops {
					seq := uint64(2 * (round*ops + i))
					c.replicas[1].Propose(op(7, seq, 2, fmt.Sprint(seq), &res))
				}
				c.settle()
				if len(res) != (round+1)*ops {
					t.Fatalf("round %d: %d answers, want %d", round, len(res), (round+1)*ops)
				}
				for _, id := range c.ids[1:] {
					switch {
					case !merge && withEntries[id] < 2:
						// Else this test shows nothing.
						t.Fatalf("round %d: without merging node %d got %d appends with entries, want several", round, id, withEntries[id])
					case merge && withEntries[id] != 1:
						t.Fatalf("round %d: node %d got %d appends with entries, want 1", round, id, withEntries[id])
					case merge && resps[id] != 2:
						// The append, then the commit-only append
						// (HoldCommits is off).
						t.Fatalf("round %d: node %d answered %d times, want twice", round, id, resps[id])
					}
				}
			}
			for i, r := range res {
				if r.Err != nil || r.BaseOffset != uint64(2*i) {
					t.Fatalf("answer %d: %+v, want offset %d", i, r, 2*i)
				}
			}
			want := c.logValues(1)
			if len(want) != 3*ops*2 {
				t.Fatalf("leader's log holds %d records, want %d", len(want), 3*ops*2)
			}
			for _, id := range c.ids[1:] {
				if got := c.logValues(id); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("node %d's log %v, leader's %v", id, got, want)
				}
			}
		})
	}
}

// app builds an append from 1 to node to, term 2, after (index, logTerm),
// with entries of the given terms.
func app(to, index, logTerm, commit uint64, terms ...uint64) *raftpb.Message {
	m := &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: proto.Uint64(1), To: proto.Uint64(to),
		Term: proto.Uint64(2), Index: proto.Uint64(index), LogTerm: proto.Uint64(logTerm), Commit: proto.Uint64(commit)}
	for i, term := range terms {
		m.Entries = append(m.Entries, &raftpb.Entry{Index: proto.Uint64(index + 1 + uint64(i)), Term: proto.Uint64(term), Data: make([]byte, 100)})
	}
	return m
}

func describe(msgs []*raftpb.Message) string {
	s := ""
	for _, m := range msgs {
		s += fmt.Sprintf("%s to %d after %d/%d commit %d entries %d; ", m.GetType(), m.GetTo(), m.GetIndex(), m.GetLogTerm(), m.GetCommit(), len(m.GetEntries()))
	}
	return s
}

func TestMergeAppends(t *testing.T) {
	hb := &raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), From: proto.Uint64(1), To: proto.Uint64(2), Term: proto.Uint64(2), Commit: proto.Uint64(5)}
	other := app(3, 10, 2, 5, 2)
	other.Term = proto.Uint64(3)
	for _, tc := range []struct {
		name string
		in   []*raftpb.Message
		max  uint64
		want string
	}{
		{"a run per follower", []*raftpb.Message{app(2, 10, 2, 5, 2), app(3, 10, 2, 5, 2), app(2, 11, 2, 6, 2, 2), app(3, 11, 2, 6, 2), app(2, 13, 2, 7)}, 1 << 20,
			"MsgApp to 2 after 10/2 commit 7 entries 3; MsgApp to 3 after 10/2 commit 6 entries 2; "},
		{"commit-only first", []*raftpb.Message{app(2, 10, 2, 5), app(2, 10, 2, 6, 2)}, 1 << 20,
			"MsgApp to 2 after 10/2 commit 6 entries 1; "},
		{"a gap", []*raftpb.Message{app(2, 10, 2, 5, 2), app(2, 12, 2, 5, 2)}, 1 << 20,
			"MsgApp to 2 after 10/2 commit 5 entries 1; MsgApp to 2 after 12/2 commit 5 entries 1; "},
		{"another log term", []*raftpb.Message{app(2, 10, 2, 5, 2), app(2, 11, 1, 5, 2)}, 1 << 20,
			"MsgApp to 2 after 10/2 commit 5 entries 1; MsgApp to 2 after 11/1 commit 5 entries 1; "},
		{"another term", []*raftpb.Message{app(3, 9, 2, 5, 2), other}, 1 << 20,
			"MsgApp to 3 after 9/2 commit 5 entries 1; MsgApp to 3 after 10/2 commit 5 entries 1; "},
		{"a lower commit", []*raftpb.Message{app(2, 10, 2, 6, 2), app(2, 11, 2, 5, 2)}, 1 << 20,
			"MsgApp to 2 after 10/2 commit 6 entries 1; MsgApp to 2 after 11/2 commit 5 entries 1; "},
		{"a heartbeat between", []*raftpb.Message{app(2, 10, 2, 5, 2), hb, app(2, 11, 2, 5, 2)}, 1 << 20,
			"MsgApp to 2 after 10/2 commit 5 entries 1; MsgHeartbeat to 2 after 0/0 commit 5 entries 0; MsgApp to 2 after 11/2 commit 5 entries 1; "},
		{"past the size bound", []*raftpb.Message{app(2, 10, 2, 5, 2), app(2, 11, 2, 5, 2)}, 200,
			"MsgApp to 2 after 10/2 commit 5 entries 1; MsgApp to 2 after 11/2 commit 5 entries 1; "},
		{"within the size bound", []*raftpb.Message{app(2, 10, 2, 5, 2), app(2, 11, 2, 5, 2)}, 300,
			"MsgApp to 2 after 10/2 commit 5 entries 2; "},
	} {
		if got := describe(mergeAppends(tc.in, tc.max)); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
	}
}

// TestMergeAppendsLeavesRaftsEntries: merging never writes into the
// backing array an append's entries share with Raft's log.
func TestMergeAppendsLeavesRaftsEntries(t *testing.T) {
	log := app(2, 10, 2, 5, 2, 2, 2).Entries // Raft's unstable entries
	first := app(2, 10, 2, 5)
	first.Entries = log[:1:3] // room for two more in Raft's array
	second := app(2, 11, 2, 5)
	second.Entries = []*raftpb.Entry{{Index: proto.Uint64(12), Term: proto.Uint64(2)}}
	out := mergeAppends([]*raftpb.Message{first, second}, 1<<20)
	if len(out) != 1 || len(out[0].GetEntries()) != 2 {
		t.Fatalf("not merged: %s", describe(out))
	}
	if log[1].GetIndex() != 12 || len(log[1].GetData()) != 100 {
		t.Fatalf("Raft's entry 12 was overwritten: %v", log[1])
	}
	if log[1] == second.Entries[0] {
		t.Fatal("Raft's array holds the merged message's entry")
	}
}
