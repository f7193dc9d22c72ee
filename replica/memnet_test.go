package replica

import (
	"errors"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/raftnet"
	"github.com/geolog/geolog/segment"
	"github.com/hashicorp/go-hclog"
	"go.etcd.io/raft/v3/raftpb"
)

// memGroup is one Raft group of replicas over raftnet's in-memory network,
// wired as a node wires its ranges: messages through Send, snapshots
// through SendSnapshot and HandleSnapshot, outcomes back through the
// Handler.
type memGroup struct {
	t           *testing.T
	net         *raftnet.MemNetwork
	replicas    map[uint64]*Replica
	logs        map[uint64]*segment.Store
	trs         map[uint64]*raftnet.MemTransport
	unreachable map[uint64][]uint64 // reported while a Ready cycle ran
}

const memGroupID raftnet.GroupID = 7

// memHandler is node id's raftnet.Handler.
type memHandler struct {
	g  *memGroup
	id uint64
}

func (h memHandler) HandleMessages(from raftnet.NodeID, msgs []raftnet.GroupMessage) int {
	for _, m := range msgs {
		h.g.replicas[h.id].Step(m.Message)
	}
	return 0
}

func (h memHandler) HandleSnapshot(from raftnet.NodeID, group raftnet.GroupID, m *raftpb.Message, body io.Reader) error {
	r := h.g.replicas[h.id]
	st, err := r.ReceiveSnapshot(m, body)
	if errors.Is(err, ErrSnapshotStale) {
		return r.StepSnapshot(m, nil)
	}
	if err != nil {
		return err
	}
	return r.StepSnapshot(m, st)
}

func (h memHandler) ReportUnreachable(to raftnet.NodeID, groups []raftnet.GroupID) {
	h.g.replicas[h.id].ReportUnreachable(uint64(to))
}

func (h memHandler) ReportSnapshot(to raftnet.NodeID, group raftnet.GroupID, err error) {
	h.g.replicas[h.id].ReportSnapshot(uint64(to), err)
}

func newMemGroup(t *testing.T) *memGroup {
	g := &memGroup{t: t, net: raftnet.NewMemNetwork(raftnet.MemConfig{}), replicas: map[uint64]*Replica{},
		logs: map[uint64]*segment.Store{}, trs: map[uint64]*raftnet.MemTransport{}, unreachable: map[uint64][]uint64{}}
	for id := uint64(1); id <= 3; id++ {
		tr, err := g.net.AddNode(raftnet.NodeID(id), memHandler{g: g, id: id})
		if err != nil {
			t.Fatal(err)
		}
		st, err := segment.Open(segment.Config{Dir: t.TempDir(), Fsync: segment.FsyncNever,
			SegmentBytesMax: segment.SegmentBytesMaxMin, RetentionBytes: 3000})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		r, err := New(Config{
			NodeID: id, Stream: "m", Peers: []uint64{1, 2, 3}, Log: st, State: &MemState{},
			Send: func(msgs []*raftpb.Message) {
				for _, m := range msgs {
					if tr.Send(memGroupID, m) != nil {
						g.unreachable[id] = append(g.unreachable[id], m.GetTo())
					}
				}
			},
			SendSnapshot: func(m *raftpb.Message, body io.ReadCloser) error { return tr.SendSnapshot(memGroupID, m, body) },
			Logger:       hclog.New(&hclog.LoggerOptions{Level: hclog.Warn, Output: testWriter{t}}),
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		g.replicas[id], g.logs[id], g.trs[id] = r, st, tr
	}
	return g
}

// run delivers rounds and runs Ready cycles, ticking every third round.
func (g *memGroup) run(rounds int, rng *rand.Rand) {
	for i := 0; i < rounds; i++ {
		if i%3 == 0 {
			for _, r := range g.replicas {
				r.Tick()
			}
		}
		g.net.Deliver(rng)
		for id := uint64(1); id <= 3; id++ {
			r := g.replicas[id]
			for r.HasReady() || r.HasLogWrites() {
				if err := r.ProcessReady(); err != nil {
					g.t.Fatalf("node %d: %v", id, err)
				}
				if err := r.WriteLog(); err != nil {
					g.t.Fatalf("node %d: write log: %v", id, err)
				}
			}
			for _, to := range g.unreachable[id] {
				r.ReportUnreachable(to)
			}
			g.unreachable[id] = nil
		}
	}
}

// TestSnapshotOverMemNetwork: the snapshot path over raftnet's in-memory
// twin, as the simulator's and a node's transports carry it: a follower
// cut off past the leader's compaction point catches up by segment
// transfer, and the network's accounting balances.
func TestSnapshotOverMemNetwork(t *testing.T) {
	g := newMemGroup(t)
	rng := rand.New(rand.NewPCG(3, 4))
	if err := g.replicas[1].Campaign(); err != nil {
		t.Fatal(err)
	}
	g.run(10, rng)
	if !g.replicas[1].IsLeader() {
		t.Fatal("node 1 did not become leader")
	}
	g.net.Partition(3)
	var res []Result
	for i := 0; i < 60; i++ {
		g.replicas[1].Propose(op(7, uint64(3*i), 3, "x", &res))
		g.run(2, rng)
	}
	g.run(40, rng) // past an election timeout: node 3 is no longer recently active
	for _, id := range []uint64{1, 2} {
		if _, err := g.replicas[id].Compact(); err != nil {
			t.Fatal(err)
		}
	}
	if g.logs[1].FirstIndex() <= g.logs[3].LastIndex()+1 {
		t.Fatalf("leader's log starts at %d, node 3's ends at %d", g.logs[1].FirstIndex(), g.logs[3].LastIndex())
	}
	g.net.HealAll()
	for i := 0; i < 200 && g.replicas[3].Committed() != g.replicas[1].Committed(); i++ {
		g.run(1, rng)
	}
	if len(res) != 60 || g.replicas[3].Committed() != 180 || g.replicas[1].Committed() != 180 {
		t.Fatalf("%d acks; committed: leader %d, node 3 %d", len(res), g.replicas[1].Committed(), g.replicas[3].Committed())
	}
	if g.replicas[3].Stats().SnapshotsInstalled != 1 || g.trs[1].Stats().SnapshotsSent == 0 || g.trs[3].Stats().SnapshotsReceived != 1 {
		t.Fatalf("snapshots: installed %d, sent %d, received %d", g.replicas[3].Stats().SnapshotsInstalled,
			g.trs[1].Stats().SnapshotsSent, g.trs[3].Stats().SnapshotsReceived)
	}
	if s := g.net.Stats(); !s.Balanced() {
		t.Fatalf("network accounting off: %+v", s)
	}
	// Node 3 holds the leader's records at the leader's offsets.
	start := g.logs[3].StartOffset()
	a, err := g.logs[1].ReadFrames(start, 1<<20, 180)
	if err != nil {
		t.Fatal(err)
	}
	b, err := g.logs[3].ReadFrames(start, 1<<20, 180)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) == 0 || string(a) != string(b) {
		t.Fatalf("logs differ from offset %d (%d and %d bytes)", start, len(a), len(b))
	}
	if h, _ := batch.DecodeHeader(b); h.BaseOffset != start {
		t.Fatalf("node 3's first frame at %d, log starts at %d", h.BaseOffset, start)
	}
}
