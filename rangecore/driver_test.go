package rangecore

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/replica"
	"github.com/geolog/geolog/segment"
	"github.com/geolog/geolog/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"
)

// driverHarness runs a group of three replicas, each under a Driver, on an
// in-memory network and disks: messages are delivered by settle, log and
// mark writes run at once after each Cycle. Commands (testdata/driver*.txt):
//
//	group [size=3] [nodetector] [veto=1] [balance=<ticks> groupid=<g>]
//	                              new replicas (nodetector: no failure
//	                              detector; veto: node 1 vetoes its
//	                              quiescence; balance: leader balance every
//	                              that many ticks, the group id picking
//	                              the preferred leader)
//	name-leader node=2            the host names the preferred leader
//	                              (node=0: none)
//	start node=1 preferred=1      Driver.Start and CampaignIfSole, then settle
//	propose node=1 value=a        EventPropose, then settle
//	tick [n=1]                    EventTick on each live replica not
//	                              quiesced (settle after each round)
//	down node=1 / up node=1       the node stops (its messages are lost)
//	                              or comes back; every live node gets an
//	                              EventLiveness
//	diskfull node=1 on|off        the node's disk refuses writes that
//	                              grow a file (vfs.Faults.SetNoSpace); its
//	                              queued log writes wait, as regionsvc's
//	                              log writer's retries do, until off
//	state                         each node's role, leader, quiescence
//
// Outputs list what happened: acks with the committed offset published
// before them, and whether each tick reached the replica.
type driverHarness struct {
	nodes []*ddNode
	queue []*raftpb.Message
	log   []string
	named atomic.Uint64 // the preferred leader the host names (name-leader)
}

type ddNode struct {
	id        uint64
	rep       *replica.Replica
	drv       *Driver
	down      bool
	published uint64
	faults    *vfs.Faults
}

func newDriverHarness(t *testing.T, size uint64, noDetector bool, veto uint64, balanceTicks int, groupID uint64) *driverHarness {
	h := &driverHarness{}
	now := func() time.Time { return time.Unix(1_800_000_000, 0) }
	var peers []uint64
	for id := uint64(1); id <= size; id++ {
		peers = append(peers, id)
	}
	for _, id := range peers {
		n := &ddNode{id: id, faults: &vfs.Faults{}}
		fs := vfs.WithFaults(vfs.NewMem(rand.New(rand.NewPCG(id, 7))), n.faults)
		dir := filepath.Join("/data", fmt.Sprint(id))
		st, err := segment.Open(segment.Config{Dir: dir, FS: fs, Now: now})
		if err != nil {
			t.Fatal(err)
		}
		rep, err := replica.New(replica.Config{
			NodeID: id, Stream: "t", Peers: peers, HeartbeatTick: 1, ElectionTick: 10,
			Log: st, State: replica.FileState{FS: fs, Dir: dir}, Now: now,
			Send: func(msgs []*raftpb.Message) {
				for _, m := range msgs {
					h.queue = append(h.queue, proto.Clone(m).(*raftpb.Message))
				}
			},
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		n.rep = rep
		cfg := DriverConfig{
			NodeID:             id,
			Publish:            func() { n.published = rep.Committed() },
			Rand:               func(k int) int { return int(id-1) % k }, // n2 waits 2 ticks, n3 3
			LeaderBalanceTicks: balanceTicks, GroupID: groupID, PreferredLeader: h.named.Load,
		}
		if !noDetector {
			cfg.PeerDown = func(p uint64) bool { return h.nodes[p-1].down }
		}
		if veto == id {
			cfg.MayQuiesce = func() bool { return false }
		}
		n.drv = NewDriver(rep, cfg)
		h.nodes = append(h.nodes, n)
	}
	return h
}

// settle delivers messages and runs cycles and writes until nothing moves.
func (h *driverHarness) settle(t *testing.T) {
	for round := 0; round < 200; round++ {
		moved := false
		q := h.queue
		h.queue = nil
		for _, m := range q {
			to, from := h.nodes[m.GetTo()-1], h.nodes[m.GetFrom()-1]
			if to.down || from.down {
				continue
			}
			moved = true
			to.drv.Handle(Event{Kind: EventMessages, Msgs: []*raftpb.Message{m}})
		}
		for _, n := range h.nodes {
			if n.down {
				continue
			}
			if n.rep.HasReady() {
				moved = true
			}
			n.drv.Cycle()
			if n.rep.HasLogWrites() {
				err := n.rep.WriteLog()
				switch {
				case errors.Is(err, segment.ErrNoSpace):
					// Kept queued: written once the disk has room.
				case err != nil:
					t.Fatal(err)
				default:
					moved = true
					n.drv.Handle(Event{Kind: EventLogWritten})
				}
			}
		}
		if !moved && len(h.queue) == 0 {
			return
		}
	}
	t.Fatal("settle: the group never settled")
}

func (h *driverHarness) run(t *testing.T, d *datadriven.TestData) string {
	h.log = nil
	node := func() *ddNode { return h.nodes[ddUint(t, d, "node", 1)-1] }
	switch d.Cmd {
	case "start":
		node().drv.Start(ddUint(t, d, "preferred", 0), 10) // as regionsvc's startGroup
		node().drv.CampaignIfSole()
		h.settle(t)
	case "propose":
		n := node()
		var v string
		d.ScanArgs(t, "value", &v)
		h.propose(n, v)
		h.settle(t)
	case "tick":
		for i := uint64(0); i < ddUint(t, d, "n", 1); i++ {
			var ticked []string
			for _, n := range h.nodes {
				switch {
				case n.down:
				case n.rep.Quiesced():
					ticked = append(ticked, fmt.Sprintf("n%d quiesced", n.id))
				case n.drv.Handle(Event{Kind: EventTick}).Ticked:
					ticked = append(ticked, fmt.Sprintf("n%d ticked", n.id))
				default:
					ticked = append(ticked, fmt.Sprintf("n%d not ticked", n.id))
				}
			}
			h.log = append(h.log, "tick: "+strings.Join(ticked, ", "))
			h.settle(t)
		}
	case "down", "up":
		node().down = d.Cmd == "down"
		for _, n := range h.nodes {
			if !n.down {
				n.drv.Handle(Event{Kind: EventLiveness})
			}
		}
		h.settle(t)
	case "diskfull":
		node().faults.SetNoSpace(d.HasArg("on"))
		h.settle(t)
	case "name-leader":
		h.named.Store(ddUint(t, d, "node", 0))
	case "state":
	default:
		t.Fatalf("unknown command %s", d.Cmd)
	}
	return strings.Join(append(h.log, h.state()...), "\n")
}

func (h *driverHarness) propose(n *ddNode, v string) {
	frame := batch.Encode(nil, batch.Header{Type: batch.TypeData}, []batch.Record{{Value: []byte(v)}})
	n.drv.Handle(Event{Kind: EventPropose, Op: &replica.Op{Frame: frame, RecordCount: 1,
		Reply: func(r replica.Result) {
			if r.Err != nil {
				h.log = append(h.log, fmt.Sprintf("n%d refused %s: %v", n.id, v, apiCode(r.Err)))
				return
			}
			// Propose holds the ack to its cycle's end: never given
			// while a cycle is under way, and after the cycle's Publish.
			h.log = append(h.log, fmt.Sprintf("n%d acked %s at %d (in a cycle %v, published %d of committed %d)",
				n.id, v, r.BaseOffset, n.drv.Holding(), n.published, n.rep.Committed()))
		}}})
}

func apiCode(err error) string {
	s := err.Error()
	if i := strings.IndexByte(s, ':'); i > 0 {
		return s[:i]
	}
	return s
}

func (h *driverHarness) state() []string {
	var out []string
	for _, n := range h.nodes {
		if n.down {
			out = append(out, fmt.Sprintf("n%d: down", n.id))
			continue
		}
		role := "follower"
		if n.rep.IsLeader() {
			role = "leader"
		}
		s := fmt.Sprintf("n%d: %s, leader %d, committed %d", n.id, role, n.rep.LeaderID(), n.rep.Committed())
		if n.rep.Quiesced() {
			s += ", quiesced"
		}
		if n.drv.CampaignPlanned() {
			s += ", campaign planned"
		}
		out = append(out, s)
	}
	return out
}

// TestMostCaughtUp: the hand-off target (a leader stopping or whose disk
// is full) is the voter with the most of the log, never a learner or the
// leader itself, and the lowest id among equals, whatever the map's order.
func TestMostCaughtUp(t *testing.T) {
	pr := func(match uint64, learner bool) tracker.Progress {
		return tracker.Progress{Match: match, IsLearner: learner}
	}
	cases := []struct {
		progress map[uint64]tracker.Progress
		want     uint64
	}{
		{map[uint64]tracker.Progress{1: pr(50, false), 2: pr(40, false), 3: pr(45, false)}, 3},
		{map[uint64]tracker.Progress{1: pr(50, false), 2: pr(45, false), 3: pr(45, false), 4: pr(45, false)}, 2},
		{map[uint64]tracker.Progress{1: pr(50, false), 4: pr(90, true), 5: pr(0, false)}, 5},
		{map[uint64]tracker.Progress{1: pr(50, false), 4: pr(90, true)}, 0},
	}
	for i, c := range cases {
		for range 20 { // map order varies between iterations
			if got := MostCaughtUp(1, c.progress); got != c.want {
				t.Fatalf("case %d: got %d, want %d", i, got, c.want)
			}
		}
	}
}
