package raftnet

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// These tests run real etcd Raft groups over both transports: elections,
// replication, forwarded proposals, unreachable reports, and a lagging
// follower caught up by a snapshot whose state travels as the body.

var voters = []uint64{1, 2, 3}

// raftGroup is one replica of one group: a RawNode, its storage, and a
// state machine that is the list of applied values.
type raftGroup struct {
	rn       *raft.RawNode
	storage  *raft.MemoryStorage
	applied  []string
	appliedI uint64
	// bodies holds snapshot bodies received, by snapshot index, until the
	// Ready that installs the snapshot.
	bodies map[uint64][]string
}

// raftNode is one node hosting several groups. mu guards everything: the
// simulator drives it from one goroutine, the gRPC test from the
// transport's goroutines and a ticker.
type raftNode struct {
	id NodeID
	tr Transport

	mu      sync.Mutex
	groups  map[GroupID]*raftGroup
	unknown int
}

func newRaftNode(t *testing.T, id NodeID, groups int) *raftNode {
	n := &raftNode{id: id, groups: make(map[GroupID]*raftGroup)}
	for g := range groups {
		st := raft.NewMemoryStorage()
		// Every replica starts from the same initial configuration.
		if err := st.ApplySnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{
			ConfState: &raftpb.ConfState{Voters: voters}, Index: proto.Uint64(1), Term: proto.Uint64(1),
		}}); err != nil {
			t.Fatal(err)
		}
		rn, err := raft.NewRawNode(&raft.Config{
			ID:              uint64(id),
			ElectionTick:    10,
			HeartbeatTick:   1,
			Storage:         st,
			MaxSizePerMsg:   64 << 10,
			MaxInflightMsgs: 64,
			CheckQuorum:     true,
			PreVote:         true,
			Logger:          &raft.DefaultLogger{Logger: log.New(io.Discard, "", 0)},
		})
		if err != nil {
			t.Fatal(err)
		}
		n.groups[GroupID(g+1)] = &raftGroup{rn: rn, storage: st, appliedI: 1, bodies: make(map[uint64][]string)}
	}
	return n
}

func (n *raftNode) HandleMessages(_ NodeID, msgs []GroupMessage) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	unknown := 0
	for _, gm := range msgs {
		g := n.groups[gm.Group]
		if g == nil {
			unknown++
			continue
		}
		_ = g.rn.Step(gm.Message) // stale or foreign-term messages are refused; Raft expects that
	}
	n.unknown += unknown
	return unknown
}

func (n *raftNode) HandleSnapshot(_ NodeID, group GroupID, m *raftpb.Message, body io.Reader) error {
	data, err := io.ReadAll(body) // outside the lock: a body may be large
	if err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	g := n.groups[group]
	if g == nil {
		return fmt.Errorf("group %d: %w", group, ErrUnknownGroup)
	}
	g.bodies[m.GetSnapshot().GetMetadata().GetIndex()] = decodeState(data)
	return g.rn.Step(m)
}

func (n *raftNode) ReportUnreachable(to NodeID, groups []GroupID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, id := range groups {
		if g := n.groups[id]; g != nil {
			g.rn.ReportUnreachable(uint64(to))
		}
	}
}

func (n *raftNode) ReportSnapshot(to NodeID, group GroupID, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	status := raft.SnapshotFinish
	if err != nil {
		status = raft.SnapshotFailure
	}
	if g := n.groups[group]; g != nil {
		g.rn.ReportSnapshot(uint64(to), status)
	}
}

func encodeState(s []string) []byte { return []byte(strings.Join(s, "\n")) }
func decodeState(b []byte) []string {
	if len(b) == 0 {
		return nil
	}
	return strings.Split(string(b), "\n")
}

// tick ticks every group and processes what is ready.
func (n *raftNode) tick(t testing.TB) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, id := range n.sortedGroups() {
		n.groups[id].rn.Tick()
	}
	n.processLocked(t)
}

func (n *raftNode) process(t testing.TB) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.processLocked(t)
}

func (n *raftNode) sortedGroups() []GroupID {
	ids := make([]GroupID, 0, len(n.groups))
	for id := range n.groups {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// processLocked handles every group's Ready: persist, install snapshots,
// send (a MsgSnap's state goes as the body, not in the message), apply.
func (n *raftNode) processLocked(t testing.TB) {
	for _, id := range n.sortedGroups() {
		g := n.groups[id]
		for g.rn.HasReady() {
			rd := g.rn.Ready()
			if !raft.IsEmptySnap(rd.Snapshot) {
				idx := rd.Snapshot.GetMetadata().GetIndex()
				if err := g.storage.ApplySnapshot(rd.Snapshot); err != nil {
					t.Errorf("node %d group %d: apply snapshot: %v", n.id, id, err)
				}
				body, ok := g.bodies[idx]
				if !ok {
					t.Errorf("node %d group %d: snapshot %d without its body", n.id, id, idx)
				}
				g.applied, g.appliedI = body, idx
				delete(g.bodies, idx)
			}
			if err := g.storage.Append(rd.Entries); err != nil {
				t.Errorf("append: %v", err)
			}
			if !raft.IsEmptyHardState(rd.HardState) {
				if err := g.storage.SetHardState(rd.HardState); err != nil {
					t.Errorf("hard state: %v", err)
				}
			}
			for _, m := range rd.Messages {
				n.send(id, m)
			}
			for _, e := range rd.CommittedEntries {
				if e.GetIndex() <= g.appliedI {
					continue
				}
				g.appliedI = e.GetIndex()
				if e.GetType() == raftpb.EntryNormal && len(e.GetData()) > 0 {
					g.applied = append(g.applied, string(e.GetData()))
				}
			}
			g.rn.Advance(rd)
		}
	}
}

func (n *raftNode) send(id GroupID, m *raftpb.Message) {
	g := n.groups[id]
	if m.GetType() != raftpb.MsgSnap {
		if err := n.tr.Send(id, m); err != nil {
			g.rn.ReportUnreachable(m.GetTo())
		}
		return
	}
	// The snapshot's state leaves the message and travels as the body.
	m = proto.Clone(m).(*raftpb.Message)
	body := io.NopCloser(bytes.NewReader(m.GetSnapshot().GetData()))
	m.Snapshot.Data = nil
	if err := n.tr.SendSnapshot(id, m, body); err != nil {
		g.rn.ReportSnapshot(m.GetTo(), raft.SnapshotFailure)
	}
}

// propose proposes value in group on whichever replica leads it; it reports
// whether one did.
func (n *raftNode) propose(id GroupID, value string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	g := n.groups[id]
	if g.rn.BasicStatus().RaftState != raft.StateLeader {
		return false
	}
	return g.rn.Propose([]byte(value)) == nil
}

// compact snapshots every group at its applied index and drops the log
// before it, so that a follower that fell behind needs a snapshot.
func (n *raftNode) compact(t testing.TB) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, g := range n.groups {
		if _, err := g.storage.CreateSnapshot(g.appliedI, &raftpb.ConfState{Voters: voters}, encodeState(g.applied)); err != nil {
			continue // already at or past this index
		}
		if err := g.storage.Compact(g.appliedI); err != nil {
			t.Errorf("compact: %v", err)
		}
	}
}

func (n *raftNode) state(id GroupID) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.groups[id].applied)
}

// converged reports whether every group has the same state on every node,
// with at least want values.
func converged(nodes []*raftNode, groups, want int) bool {
	for g := range groups {
		ref := nodes[0].state(GroupID(g + 1))
		if len(ref) < want {
			return false
		}
		for _, n := range nodes[1:] {
			if !slices.Equal(ref, n.state(GroupID(g+1))) {
				return false
			}
		}
	}
	return true
}

func TestRaftOverMemNetwork(t *testing.T) {
	const groups = 5
	net := NewMemNetwork(MemConfig{Logger: testLogger(t, "mem")})
	net.SetDefaultFaults(LinkFaults{DropRate: 0.05, DuplicateRate: 0.05, DelayRoundsMax: 2, Reorder: true})
	var nodes []*raftNode
	for _, id := range voters {
		n := newRaftNode(t, NodeID(id), groups)
		tr, err := net.AddNode(NodeID(id), n)
		if err != nil {
			t.Fatal(err)
		}
		n.tr = tr
		nodes = append(nodes, n)
	}
	rng := rand.New(rand.NewPCG(2026, 11))
	proposed := 0
	step := func(rounds int, propose bool) {
		for range rounds {
			for _, n := range nodes {
				n.tick(t)
			}
			if propose {
				for g := range groups {
					for _, n := range nodes {
						if n.propose(GroupID(g+1), fmt.Sprintf("g%d-%d", g+1, proposed)) {
							proposed++
						}
					}
				}
			}
			net.Deliver(rng)
			for _, n := range nodes {
				n.process(t)
			}
			if s := net.Stats(); !s.Balanced() {
				t.Fatalf("network accounting off: %+v", s)
			}
		}
	}
	step(100, true)
	// Node 3 falls behind: partitioned while the others commit and compact.
	net.Partition(3)
	step(100, true)
	for _, n := range nodes[:2] {
		n.compact(t)
	}
	step(20, true)
	net.HealAll()
	step(300, false)
	if !converged(nodes, groups, 50) {
		for g := range groups {
			for _, n := range nodes {
				t.Logf("group %d node %d: %d values", g+1, n.id, len(n.state(GroupID(g+1))))
			}
		}
		t.Fatal("groups did not converge")
	}
	s3 := nodes[2].tr.Stats()
	if s3.SnapshotsReceived == 0 {
		t.Fatalf("node 3 caught up without a snapshot: %+v", s3)
	}
	t.Logf("network %+v; node 3 %+v", net.Stats(), s3)
}

func TestRaftOverGRPC(t *testing.T) {
	const groups = 20
	var nodes []*raftNode
	var tns []*testNode
	for _, id := range voters {
		n := newRaftNode(t, NodeID(id), groups)
		tn := startNode(t, NodeID(id), "", func(c *Config) { c.Handler = n; c.SnapshotChunkBytes = 64 << 10 })
		n.tr = tn.tr
		nodes = append(nodes, n)
		tns = append(tns, tn)
	}
	connect(t, tns...)
	// Each node ticks on its own clock, as in production, every 20 ms:
	// elections after 200-400 ms of silence (ElectionTick 10). With 5 ms
	// (50-100 ms) a busy machine's scheduling delays alone kept every
	// group electing, and nothing committed for 30 s.
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Go(func() {
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-done:
					return
				case <-tick.C:
					n.tick(t)
				}
			}
		})
	}
	t.Cleanup(func() { close(done); wg.Wait() }) // before the transports close
	// propose keeps proposing on the leaders until every group has at least
	// want values everywhere: proposals made during an election are lost,
	// and a slow machine has more elections.
	propose := func(want int, on []*raftNode) {
		t.Helper()
		i := 0
		waitFor(t, time.Minute, fmt.Sprintf("%d values in every group", want), func() bool {
			i++
			for g := range groups {
				if len(on[0].state(GroupID(g+1))) < want {
					for _, n := range on {
						n.propose(GroupID(g+1), fmt.Sprintf("g%d-%d", g+1, i))
					}
				}
			}
			return converged(on, groups, want)
		})
	}
	propose(20, nodes)
	// Node 3's transport goes away (its Raft state, being durable, stays);
	// the others commit and compact; node 3 comes back on the same address
	// and catches up by snapshot.
	tns[2].stop()
	propose(60, nodes[:2])
	for _, n := range nodes[:2] {
		n.compact(t)
	}
	n3 := nodes[2]
	tn3 := startNode(t, 3, tns[2].addr, func(c *Config) { c.Handler = n3 })
	n3.mu.Lock()
	n3.tr = tn3.tr
	n3.mu.Unlock()
	connect(t, tns[0], tns[1], tn3)
	waitFor(t, time.Minute, "node 3 to catch up", func() bool { return converged(nodes, groups, 60) })
	if s := tn3.tr.Stats(); s.SnapshotsReceived == 0 {
		t.Fatalf("node 3 caught up without a snapshot: %+v", s)
	}
}
