package raftnet

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// memNodes puts nodes 1..count on a fresh network, each with a recorder.
func memNodes(t *testing.T, cfg MemConfig, count int) (*MemNetwork, []*MemTransport, []*recorder) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t, "mem")
	}
	n := NewMemNetwork(cfg)
	var trs []*MemTransport
	var recs []*recorder
	for i := range count {
		rec := newRecorder()
		tr, err := n.AddNode(NodeID(i+1), rec)
		if err != nil {
			t.Fatal(err)
		}
		trs = append(trs, tr)
		recs = append(recs, rec)
	}
	return n, trs, recs
}

func mustSend(t *testing.T, tr *MemTransport, group GroupID, m *raftpb.Message) {
	t.Helper()
	if err := tr.Send(group, m); err != nil {
		t.Fatal(err)
	}
}

func checkBalanced(t *testing.T, n *MemNetwork) {
	t.Helper()
	if s := n.Stats(); !s.Balanced() || s.InFlight != uint64(n.InFlight()) {
		t.Fatalf("network accounting off: %+v, in flight %d", s, n.InFlight())
	}
}

func TestMemPerfectLink(t *testing.T) {
	n, trs, recs := memNodes(t, MemConfig{BatchMessagesMax: 40}, 2)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 100 {
		mustSend(t, trs[0], GroupID(i%10+1), msg(raftpb.MsgApp, 1, 2, uint64(i+1)))
	}
	if recs[1].count() != 0 {
		t.Fatal("delivered before Deliver")
	}
	if got := n.Deliver(rng); got != 100 {
		t.Fatalf("delivered %d", got)
	}
	checkFIFO(t, recs[1])
	if recs[1].batches != 3 { // 40 + 40 + 20
		t.Fatalf("%d batches", recs[1].batches)
	}
	s := n.LinkStats(1, 2)
	if s.Sent != 100 || s.Delivered != 100 || s.InFlight != 0 || !s.Balanced() {
		t.Fatalf("link stats %+v", s)
	}
	if ts := trs[0].Stats(); ts.MessagesSent != 100 || ts.BatchesSent != 3 {
		t.Fatalf("sender stats %+v", ts)
	}
	if ts := trs[1].Stats(); ts.MessagesReceived != 100 || ts.BatchesReceived != 3 {
		t.Fatalf("receiver stats %+v", ts)
	}
	if n.Deliver(rng) != 0 || n.Round() != 2 {
		t.Fatal("empty round delivered something")
	}
}

func TestMemDelaysKeepFIFOUnlessReorder(t *testing.T) {
	for _, reorder := range []bool{false, true} {
		t.Run(fmt.Sprint("reorder=", reorder), func(t *testing.T) {
			n, trs, recs := memNodes(t, MemConfig{}, 2)
			n.SetDefaultFaults(LinkFaults{DelayRoundsMax: 5, Reorder: reorder})
			rng := rand.New(rand.NewPCG(3, 4))
			seq := uint64(0)
			for range 30 {
				for range 5 {
					seq++
					mustSend(t, trs[0], 1, msg(raftpb.MsgApp, 1, 2, seq))
				}
				n.Deliver(rng)
				checkBalanced(t, n)
			}
			for n.InFlight() > 0 {
				n.Deliver(rng)
			}
			got := recs[1].received()
			if len(got) != int(seq) {
				t.Fatalf("delivered %d of %d", len(got), seq)
			}
			inOrder := slices.IsSortedFunc(got, func(a, b received) int { return int(a.index) - int(b.index) })
			if inOrder == reorder {
				t.Fatalf("in order: %v with reorder %v", inOrder, reorder)
			}
		})
	}
}

func TestMemLossAndDuplicates(t *testing.T) {
	n, trs, recs := memNodes(t, MemConfig{}, 2)
	n.SetLinkFaults(1, 2, LinkFaults{DuplicateRate: 1})
	n.SetLinkFaults(2, 1, LinkFaults{DropRate: 1})
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range 10 {
		mustSend(t, trs[0], 1, msg(raftpb.MsgApp, 1, 2, uint64(i+1)))
		mustSend(t, trs[1], 1, msg(raftpb.MsgAppResp, 2, 1, uint64(i+1)))
	}
	n.Deliver(rng)
	if recs[1].count() != 20 || recs[0].count() != 0 {
		t.Fatalf("received %d (want 20 with duplicates) and %d (want 0, all lost)", recs[1].count(), recs[0].count())
	}
	if s := n.LinkStats(1, 2); s.Duplicated != 10 || s.Delivered != 20 || !s.Balanced() {
		t.Fatalf("1→2 %+v", s)
	}
	if s := n.LinkStats(2, 1); s.DroppedLoss != 10 || !s.Balanced() {
		t.Fatalf("2→1 %+v", s)
	}
	// Random loss is silent, as on a real wire.
	if len(recs[1].unreachableGroups(1)) != 0 {
		t.Fatal("silent loss was reported")
	}
}

func TestMemCutsAndPartitions(t *testing.T) {
	n, trs, recs := memNodes(t, MemConfig{}, 3)
	rng := rand.New(rand.NewPCG(7, 8))
	// In flight when the link is cut: dropped and reported to the sender.
	mustSend(t, trs[0], 4, msg(raftpb.MsgApp, 1, 2, 1))
	mustSend(t, trs[0], 5, msg(raftpb.MsgApp, 1, 2, 2))
	mustSend(t, trs[0], 4, msg(raftpb.MsgApp, 1, 2, 3))
	n.Cut(1, 2)
	n.Deliver(rng)
	if recs[1].count() != 0 {
		t.Fatal("delivered over a cut link")
	}
	if got := recs[0].unreachableGroups(2); !slices.Equal(got, []GroupID{4, 5}) {
		t.Fatalf("reported %v", got)
	}
	if s := n.LinkStats(1, 2); s.DroppedCut != 3 || !s.Balanced() {
		t.Fatalf("stats %+v", s)
	}
	// While cut, Send refuses; the other direction still works (one way).
	if err := trs[0].Send(1, msg(raftpb.MsgApp, 1, 2, 4)); !errors.Is(err, ErrPeerUnreachable) {
		t.Fatalf("send over a cut link: %v", err)
	}
	mustSend(t, trs[1], 1, msg(raftpb.MsgAppResp, 2, 1, 1))
	n.Deliver(rng)
	if recs[0].count() != 1 {
		t.Fatal("reverse direction of a one-way cut did not deliver")
	}
	n.HealAll()
	mustSend(t, trs[0], 1, msg(raftpb.MsgApp, 1, 2, 5))
	n.Deliver(rng)
	if recs[1].count() != 1 {
		t.Fatal("healed link did not deliver")
	}
	// A partition isolates node 3 both ways.
	n.Partition(3)
	for _, c := range []struct {
		tr *MemTransport
		m  *raftpb.Message
	}{
		{trs[0], msg(raftpb.MsgApp, 1, 3, 1)},
		{trs[2], msg(raftpb.MsgAppResp, 3, 1, 1)},
		{trs[2], msg(raftpb.MsgAppResp, 3, 2, 1)},
	} {
		if err := c.tr.Send(1, c.m); !errors.Is(err, ErrPeerUnreachable) {
			t.Fatalf("send across the partition: %v", err)
		}
	}
	mustSend(t, trs[0], 1, msg(raftpb.MsgApp, 1, 2, 6))
	n.Deliver(rng)
	if recs[1].count() != 2 {
		t.Fatal("majority side stopped delivering")
	}
	checkBalanced(t, n)
}

func TestMemRestartDropsOldIncarnation(t *testing.T) {
	n, trs, recs := memNodes(t, MemConfig{}, 2)
	rng := rand.New(rand.NewPCG(9, 10))
	mustSend(t, trs[0], 7, msg(raftpb.MsgApp, 1, 2, 1))
	n.RemoveNode(2)
	rec2 := newRecorder()
	if _, err := n.AddNode(2, rec2); err != nil {
		t.Fatal(err)
	}
	mustSend(t, trs[0], 8, msg(raftpb.MsgApp, 1, 2, 2))
	n.Deliver(rng)
	got := rec2.received()
	if len(got) != 1 || got[0].index != 2 || recs[1].count() != 0 {
		t.Fatalf("new incarnation got %v", got)
	}
	if r := recs[0].unreachableGroups(2); !slices.Equal(r, []GroupID{7}) {
		t.Fatalf("reported %v", r)
	}
	if s := n.LinkStats(1, 2); s.DroppedNodeDown != 1 || !s.Balanced() {
		t.Fatalf("stats %+v", s)
	}
	if err := trs[1].Send(1, msg(raftpb.MsgAppResp, 2, 1, 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("send from a removed node: %v", err)
	}
	if err := trs[0].Send(1, msg(raftpb.MsgApp, 1, 9, 1)); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("send to a node never added: %v", err)
	}
}

func TestMemQueueBound(t *testing.T) {
	n, trs, _ := memNodes(t, MemConfig{LinkQueueMessagesMax: 5}, 2)
	for i := range 5 {
		mustSend(t, trs[0], 1, msg(raftpb.MsgApp, 1, 2, uint64(i+1)))
	}
	if err := trs[0].Send(1, msg(raftpb.MsgApp, 1, 2, 6)); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("send over the bound: %v", err)
	}
	n.Deliver(rand.New(rand.NewPCG(1, 1)))
	mustSend(t, trs[0], 1, msg(raftpb.MsgApp, 1, 2, 7))
	if s := trs[0].Stats(); s.DroppedQueueFull != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestMemSnapshot(t *testing.T) {
	n, trs, recs := memNodes(t, MemConfig{SnapshotBytesMax: 1 << 20, SnapshotsInflightMax: 2}, 2)
	rng := rand.New(rand.NewPCG(11, 12))
	body := &bodySource{size: 300 << 10, seed: 3}
	if err := trs[0].SendSnapshot(3, snapMsg(1, 2, 50), body); err != nil {
		t.Fatal(err)
	}
	big := &bodySource{size: 2 << 20}
	if err := trs[0].SendSnapshot(4, snapMsg(1, 2, 50), big); err != nil {
		t.Fatal(err)
	}
	if err := trs[0].SendSnapshot(5, snapMsg(1, 2, 50), &bodySource{size: 1}); !errors.Is(err, ErrSnapshotsBusy) {
		t.Fatalf("third snapshot: %v", err)
	}
	if got := n.Deliver(rng); got != 2 {
		t.Fatalf("delivered %d", got)
	}
	reps := recs[0].snapshotReports()
	if len(reps) != 2 || reps[0].err != nil || reps[0].group != 3 || !errors.Is(reps[1].err, ErrSnapshotTooLarge) {
		t.Fatalf("reports %+v", reps)
	}
	got := recs[1].snapshotsReceived()
	if got[0].bodySize != 300<<10 || got[0].sha != body.sum() || got[0].index != 50 {
		t.Fatalf("received %+v", got[0])
	}
	if body.closed.Load() != 1 || big.closed.Load() != 1 {
		t.Fatal("bodies not closed once")
	}
	// A lost snapshot fails visibly.
	n.SetLinkFaults(1, 2, LinkFaults{DropRate: 1})
	if err := trs[0].SendSnapshot(6, snapMsg(1, 2, 60), &bodySource{size: 10}); err != nil {
		t.Fatal(err)
	}
	n.Deliver(rng)
	if reps := recs[0].snapshotReports(); len(reps) != 3 || !errors.Is(reps[2].err, ErrDropped) {
		t.Fatalf("reports %+v", reps)
	}
	checkBalanced(t, n)
	if s := trs[0].Stats(); s.SnapshotsSent != 1 || s.SnapshotsSendFailed != 3 {
		t.Fatalf("sender stats %+v", s)
	}
}

// memScenario runs a lossy, delaying, duplicating, reordering network with a
// partition that comes and goes, and returns a trace of every Handler call.
// Handlers answer messages from inside Deliver, as a Raft node would.
func memScenario(t *testing.T, seed uint64) []string {
	t.Helper()
	n, trs, recs := memNodes(t, MemConfig{}, 3)
	n.SetDefaultFaults(LinkFaults{DropRate: 0.1, DuplicateRate: 0.1, DelayRoundsMax: 3, Reorder: true})
	n.SetLinkFaults(1, 3, LinkFaults{DropRate: 0.3, DelayRoundsMax: 6})
	var trace []string
	round := 0
	for i, rec := range recs {
		self := trs[i]
		rec.onMessages = func(from NodeID, msgs []GroupMessage) {
			for _, gm := range msgs {
				trace = append(trace, fmt.Sprintf("r%d %d→%d g%d %s %d", round, from, self.id, gm.Group, gm.Message.GetType(), gm.Message.GetIndex()))
				if gm.Message.GetType() == raftpb.MsgApp {
					_ = self.Send(gm.Group, msg(raftpb.MsgAppResp, self.id, from, gm.Message.GetIndex()))
				}
			}
		}
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	seq := uint64(0)
	for round = 1; round <= 60; round++ {
		switch round {
		case 20:
			n.Partition(3)
		case 30:
			n.HealAll()
		}
		for _, a := range trs {
			for _, b := range trs {
				if a != b {
					seq++
					_ = a.Send(GroupID(seq%7+1), msg(raftpb.MsgApp, a.id, b.id, seq)) // cut links refuse
				}
			}
		}
		n.Deliver(rng)
		checkBalanced(t, n)
	}
	for i, rec := range recs {
		for to := range NodeID(4) {
			if groups := rec.unreachableGroups(to); len(groups) > 0 {
				trace = append(trace, fmt.Sprintf("node %d: %d unreachable for %v", i+1, to, groups))
			}
		}
	}
	s := n.Stats()
	trace = append(trace, fmt.Sprintf("stats %+v", s))
	if s.DroppedLoss == 0 || s.Duplicated == 0 || s.DroppedCut == 0 || s.Refused == 0 {
		t.Fatalf("scenario exercised too little: %+v", s)
	}
	return trace
}

func TestMemDeterministic(t *testing.T) {
	a, b := memScenario(t, 42), memScenario(t, 42)
	if !slices.Equal(a, b) {
		for i := range min(len(a), len(b)) {
			if a[i] != b[i] {
				t.Fatalf("same seed diverged at step %d: %q vs %q", i, a[i], b[i])
			}
		}
		t.Fatalf("same seed, traces of %d and %d steps", len(a), len(b))
	}
	if slices.Equal(a, memScenario(t, 43)) {
		t.Fatal("different seeds made the same trace")
	}
	t.Logf("%d steps; %s", len(a), a[len(a)-1])
}
