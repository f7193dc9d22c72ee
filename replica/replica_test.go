package replica

import (
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/segment"
	"github.com/hashicorp/go-hclog"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// cluster is a test harness: replicas of one group over real segment stores,
// with a synchronous, controllable network.
type cluster struct {
	t        *testing.T
	ids      []uint64
	voters   []uint64 // the group's initial voters (a prefix of ids)
	dirs     map[uint64]string
	states   map[uint64]*MemState
	logs     map[uint64]*segment.Store
	replicas map[uint64]*Replica
	queue    []*raftpb.Message
	snaps    []snapMsg       // snapshots in flight
	cut      map[uint64]bool // isolated nodes
	clock    map[uint64]time.Time
	// storeCfg and repCfg, if set, adjust a node's configuration at start.
	storeCfg func(id uint64, cfg *segment.Config)
	repCfg   func(id uint64, cfg *Config)
	// drop, if set, drops a message it returns true for.
	drop func(m *raftpb.Message) bool
	// holdSnaps keeps snapshots in snaps instead of delivering them.
	holdSnaps bool
	// holdWrites keeps a node's log writes queued (its disk is slow).
	holdWrites map[uint64]bool
	// lingerMarks makes settle wait, as the range driver does, while a
	// replica's MarkLinger asks (the clock must be moved for it to end).
	lingerMarks bool
}

// snapMsg is a MsgSnap and its body on their way.
type snapMsg struct {
	m    *raftpb.Message
	body io.ReadCloser
}

func newCluster(t *testing.T, n int) *cluster { return newClusterVoters(t, n, n) }

// newClusterVoters starts n nodes of which the first voters form the group;
// the others host a replica that is not (yet) a member.
func newClusterVoters(t *testing.T, n, voters int) *cluster { return newClusterOpts(t, n, voters, nil) }

// newClusterOpts is newClusterVoters with opt applied before the nodes start.
func newClusterOpts(t *testing.T, n, voters int, opt func(c *cluster)) *cluster {
	c := &cluster{t: t, dirs: map[uint64]string{}, states: map[uint64]*MemState{},
		logs: map[uint64]*segment.Store{}, replicas: map[uint64]*Replica{}, cut: map[uint64]bool{},
		clock: map[uint64]time.Time{}, holdWrites: map[uint64]bool{}}
	if opt != nil {
		opt(c)
	}
	for i := 1; i <= n; i++ {
		c.ids = append(c.ids, uint64(i))
	}
	c.voters = c.ids[:voters]
	for _, id := range c.ids {
		c.dirs[id] = t.TempDir()
		c.states[id] = &MemState{}
		c.start(id)
	}
	t.Cleanup(func() {
		for _, id := range c.ids {
			if c.logs[id] != nil {
				c.logs[id].Close()
			}
		}
	})
	return c
}

// start opens node id's log and replica (again, after stop).
func (c *cluster) start(id uint64) {
	var headers []batch.Header
	now := func() time.Time {
		if t, ok := c.clock[id]; ok {
			return t
		}
		return time.Now()
	}
	scfg := segment.Config{
		Dir: c.dirs[id], Fsync: segment.FsyncNever, Now: now,
		OnRecover: func(h batch.Header) error { headers = append(headers, h); return nil },
	}
	if c.storeCfg != nil {
		c.storeCfg(id, &scfg)
	}
	st, err := segment.Open(scfg)
	if err != nil {
		c.t.Fatal(err)
	}
	rcfg := Config{
		NodeID: id, Stream: "s", Peers: c.voters, Log: st, State: c.states[id],
		Send: func(msgs []*raftpb.Message) { c.send(msgs) },
		SendSnapshot: func(m *raftpb.Message, body io.ReadCloser) error {
			c.snaps = append(c.snaps, snapMsg{m: proto.Clone(m).(*raftpb.Message), body: body})
			return nil
		},
		Now:    now,
		Logger: hclog.New(&hclog.LoggerOptions{Level: hclog.Warn, Output: testWriter{c.t}}),
	}
	if c.repCfg != nil {
		c.repCfg(id, &rcfg)
	}
	r, err := New(rcfg, headers)
	if err != nil {
		c.t.Fatal(err)
	}
	c.logs[id], c.replicas[id] = st, r
}

// stop crashes node id: pending proposals are dropped, the log is closed.
func (c *cluster) stop(id uint64) {
	c.replicas[id].Close()
	c.logs[id].Close()
	c.logs[id], c.replicas[id] = nil, nil
}

func (c *cluster) send(msgs []*raftpb.Message) {
	for _, m := range msgs {
		c.queue = append(c.queue, proto.Clone(m).(*raftpb.Message))
	}
}

// settle runs Ready cycles and delivers messages until nothing moves.
func (c *cluster) settle() {
	for round := 0; round < 1000; round++ {
		moved := false
		for _, id := range c.ids {
			if r := c.replicas[id]; r != nil && r.HasReady() {
				if err := r.ProcessReady(); err != nil {
					c.t.Fatalf("node %d: %v", id, err)
				}
				moved = true
			}
		}
		// Log writes land a round after their Ready cycle (unless held):
		// Raft steps on meanwhile, as with a driver's log-writer goroutine.
		for _, id := range c.ids {
			if r := c.replicas[id]; r != nil && !c.holdWrites[id] && r.HasLogWrites() {
				err := r.WriteLog()
				if errors.Is(err, segment.ErrNoSpace) {
					continue // the disk is full: the writes stay queued
				}
				if err != nil {
					c.t.Fatalf("node %d: write log: %v", id, err)
				}
				moved = true
			}
			if r := c.replicas[id]; r != nil {
				// As the range driver's timer does (Config.HoldCommits).
				if wait, ok := r.HeldCommitsWait(); ok && wait == 0 {
					r.SendHeldCommits()
					moved = true
				}
			}
		}
		q := c.queue
		c.queue = nil
		for _, m := range q {
			to, from := m.GetTo(), m.GetFrom()
			if c.cut[to] || c.cut[from] || c.replicas[to] == nil || (c.drop != nil && c.drop(m)) {
				continue
			}
			c.replicas[to].Step(m)
			// As the range driver does: what the step committed is
			// answered before the next Ready cycle.
			c.replicas[to].AnswerCommitted()
			moved = true
		}
		if !c.holdSnaps {
			snaps := c.snaps
			c.snaps = nil
			for _, s := range snaps {
				c.deliverSnapshot(s)
				moved = true
			}
		}
		if !moved {
			return
		}
	}
	c.t.Fatal("cluster did not settle")
}

// tick ticks every live replica n times, settling in between.
func (c *cluster) tick(n int) {
	for i := 0; i < n; i++ {
		for _, id := range c.ids {
			if r := c.replicas[id]; r != nil {
				r.Tick()
			}
		}
		c.settle()
	}
}

func (c *cluster) leader() uint64 {
	for _, id := range c.ids {
		if r := c.replicas[id]; r != nil && !c.cut[id] && r.IsLeader() {
			return id
		}
	}
	return 0
}

// transfer moves leadership from the current leader to id.
func (c *cluster) transfer(to uint64) {
	c.t.Helper()
	c.replicas[c.leader()].TransferLeadership(to)
	c.settle()
	if !c.replicas[to].IsLeader() {
		c.t.Fatalf("leadership did not move to node %d", to)
	}
}

// elect makes id campaign (only where no follower is in a leader's lease).
func (c *cluster) elect(id uint64) {
	c.t.Helper()
	if err := c.replicas[id].Campaign(); err != nil {
		c.t.Fatal(err)
	}
	c.settle()
	if !c.replicas[id].IsLeader() {
		c.t.Fatalf("node %d did not become leader", id)
	}
}

// op builds an append of n records.
func op(producer, seq uint64, n int, tag string, results *[]Result) *Op {
	recs := make([]batch.Record, n)
	for i := range recs {
		recs[i] = batch.Record{Key: []byte("k"), Value: []byte(fmt.Sprintf("%s-%d", tag, i))}
	}
	h := batch.Header{Type: batch.TypeData, ProducerID: producer, BaseSequence: seq}
	return &Op{ProducerID: producer, BaseSequence: seq, RecordCount: uint32(n),
		Frame: batch.Encode(nil, h, recs), Reply: func(r Result) { *results = append(*results, r) }}
}

// logValues reads node id's whole log (data records) as strings.
func (c *cluster) logValues(id uint64) []string {
	st := c.logs[id]
	var out []string
	for off := uint64(0); off < st.NextOffset(); {
		frames, err := st.ReadFrames(off, 1<<20, st.NextOffset())
		if err != nil {
			c.t.Fatal(err)
		}
		for len(frames) > 0 {
			n, _ := batch.FrameSize(frames)
			h, recs, err := batch.Decode(frames[:n])
			if err != nil {
				c.t.Fatal(err)
			}
			for i, r := range recs {
				if h.Offset(&recs[i]) >= off {
					out = append(out, string(r.Value))
				}
			}
			off = h.NextOffset()
			frames = frames[n:]
		}
	}
	return out
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

func TestReplicateAndCommit(t *testing.T) {
	c := newCluster(t, 3)
	c.elect(1)
	var res []Result
	for i := 0; i < 10; i++ {
		c.replicas[1].Propose(op(7, uint64(3*i), 3, fmt.Sprint(i), &res))
	}
	c.settle()
	if len(res) != 10 {
		t.Fatalf("%d replies, want 10", len(res))
	}
	for i, r := range res {
		if r.Err != nil || r.BaseOffset != uint64(3*i) || r.RecordCount != 3 {
			t.Fatalf("reply %d: %+v", i, r)
		}
	}
	c.tick(2) // heartbeats carry the commit index to followers
	want := c.logValues(1)
	if len(want) != 30 {
		t.Fatalf("leader log has %d records", len(want))
	}
	for _, id := range c.ids {
		if got := c.logValues(id); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("node %d log differs:\n%v\n%v", id, got, want)
		}
		if c.replicas[id].Committed() != 30 {
			t.Fatalf("node %d committed %d", id, c.replicas[id].Committed())
		}
	}
	// A follower refuses appends and names the leader.
	c.replicas[2].Propose(op(8, 0, 1, "x", &res))
	last := res[len(res)-1]
	if apierr.CodeOf(last.Err) != apierr.NotLeader || apierr.As(last.Err).LeaderHint != "node:1" {
		t.Fatalf("follower propose: %v", last.Err)
	}
}

func TestDuplicateAcrossLeaderChange(t *testing.T) {
	c := newCluster(t, 3)
	c.elect(1)
	var res []Result
	c.replicas[1].Propose(op(7, 0, 2, "a", &res))
	c.replicas[1].Propose(op(7, 2, 2, "b", &res))
	c.settle()
	c.transfer(2)
	// The producer retries its second batch at the new leader: it gets the
	// original offsets back, and nothing is appended twice.
	c.replicas[2].Propose(op(7, 2, 2, "b", &res))
	c.replicas[2].Propose(op(7, 4, 1, "c", &res))
	c.settle()
	if len(res) != 4 || !res[2].Duplicate || res[2].BaseOffset != 2 || res[3].BaseOffset != 4 {
		t.Fatalf("replies: %+v", res)
	}
	c.tick(2)
	for _, id := range c.ids {
		if got := c.logValues(id); fmt.Sprint(got) != "[a-0 a-1 b-0 b-1 c-0]" {
			t.Fatalf("node %d log: %v", id, got)
		}
	}
}

// TestIsolatedLeaderGetsNoAck: a leader cut off from its followers keeps
// accepting proposals but can never ack them; after the partition heals its
// tail is overwritten and the proposals fail with a retriable NOT_LEADER.
func TestIsolatedLeaderGetsNoAck(t *testing.T) {
	c := newCluster(t, 3)
	// Node 1's clock runs an hour ahead: its stale tail carries later append
	// times than the new leader's entries that replace it.
	c.clock[1] = time.Now().Add(time.Hour)
	c.elect(1)
	var stale, fresh []Result
	c.cut[1] = true
	c.replicas[1].Propose(op(0, 0, 2, "stale", &stale))
	c.settle()
	// The others elect a leader of their own once their election timeout
	// passes without hearing from node 1.
	for i := 0; i < 100 && c.leader() == 0; i++ {
		c.tick(1)
	}
	newLeader := c.leader()
	if newLeader == 0 || newLeader == 1 {
		t.Fatalf("no new leader (got %d)", newLeader)
	}
	c.replicas[newLeader].Propose(op(0, 0, 3, "fresh", &fresh))
	c.settle()
	// The isolated leader answers its append (liveness.go) with a
	// retriable error once it has heard no quorum for an election
	// timeout, never with an ack.
	for _, r := range stale {
		if r.Err == nil {
			t.Fatalf("isolated leader acked: %+v", stale)
		}
	}
	if len(fresh) != 1 || fresh[0].Err != nil || fresh[0].BaseOffset != 0 {
		t.Fatalf("new leader: %+v", fresh)
	}
	delete(c.cut, 1)
	c.tick(3)
	if len(stale) != 1 || apierr.CodeOf(stale[0].Err) != apierr.NotLeader || !apierr.IsRetriable(stale[0].Err) {
		t.Fatalf("stale proposal: %+v", stale)
	}
	for _, id := range c.ids {
		if got := c.logValues(id); fmt.Sprint(got) != "[fresh-0 fresh-1 fresh-2]" {
			t.Fatalf("node %d log: %v", id, got)
		}
	}
}

func TestRestartKeepsLogAndDedup(t *testing.T) {
	c := newCluster(t, 3)
	c.elect(1)
	var res []Result
	c.replicas[1].Propose(op(9, 0, 4, "a", &res))
	c.settle()
	c.tick(2)
	for _, id := range c.ids {
		c.stop(id)
	}
	for _, id := range c.ids {
		c.start(id)
	}
	c.elect(3)
	c.replicas[3].Propose(op(9, 0, 4, "a", &res))
	c.replicas[3].Propose(op(9, 4, 1, "b", &res))
	c.settle()
	if len(res) != 3 || !res[1].Duplicate || res[1].BaseOffset != 0 || res[2].BaseOffset != 4 || res[2].Err != nil {
		t.Fatalf("replies after restart: %+v", res)
	}
}

// TestReplaceReplica replaces voter 1 by node 4: add it as a learner, let it
// catch up, promote it, remove node 1. Writes continue throughout and every
// remaining replica ends with the same log.
func TestReplaceReplica(t *testing.T) {
	c := newClusterVoters(t, 4, 3)
	c.elect(2)
	var res []Result
	for i := 0; i < 5; i++ {
		c.replicas[2].Propose(op(5, uint64(i), 1, "before", &res))
	}
	c.settle()
	change := func(typ raftpb.ConfChangeType, node uint64) *raftpb.ConfState {
		t.Helper()
		var got *raftpb.ConfState
		var gotErr error
		done := false
		cc := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: typ.Enum(), NodeId: proto.Uint64(node)}}}
		c.replicas[c.leader()].ProposeConfChange(cc, func(cs *raftpb.ConfState, err error) { got, gotErr, done = cs, err, true })
		c.settle()
		if !done || gotErr != nil {
			t.Fatalf("change %v %d: done=%v %v", typ, node, done, gotErr)
		}
		return got
	}
	cs := change(raftpb.ConfChangeAddLearnerNode, 4)
	if fmt.Sprint(cs.GetLearners()) != "[4]" {
		t.Fatalf("after add learner: %v", cs)
	}
	c.tick(3)
	if got := c.logValues(4); len(got) != 5 {
		t.Fatalf("learner caught up to %d records, want 5", len(got))
	}
	cs = change(raftpb.ConfChangeAddNode, 4)
	if fmt.Sprint(cs.GetVoters()) != "[1 2 3 4]" || len(cs.GetLearners()) != 0 {
		t.Fatalf("after promote: %v", cs)
	}
	cs = change(raftpb.ConfChangeRemoveNode, 1)
	if fmt.Sprint(cs.GetVoters()) != "[2 3 4]" {
		t.Fatalf("after remove: %v", cs)
	}
	// Node 1 is out: the group commits with 2, 3 and 4 even while 1 is cut.
	c.cut[1] = true
	for i := 5; i < 8; i++ {
		c.replicas[c.leader()].Propose(op(5, uint64(i), 1, "after", &res))
	}
	c.settle()
	c.tick(3)
	if len(res) != 8 {
		t.Fatalf("%d acks, want 8", len(res))
	}
	want := c.logValues(2)
	for _, id := range []uint64{3, 4} {
		if got := c.logValues(id); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("node %d log %v, want %v", id, got, want)
		}
	}
	// A second change while one is unapplied is refused, not lost.
	c.cut[3], c.cut[4] = true, true
	var errs []error
	l := c.leader()
	if l == 0 {
		l = 2
	}
	cc := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddLearnerNode.Enum(), NodeId: proto.Uint64(1)}}}
	c.replicas[l].ProposeConfChange(cc, func(_ *raftpb.ConfState, err error) { errs = append(errs, err) })
	c.replicas[l].ProposeConfChange(cc, func(_ *raftpb.ConfState, err error) { errs = append(errs, err) })
	if len(errs) != 1 || apierr.CodeOf(errs[0]) != apierr.Unavailable {
		t.Fatalf("second concurrent change: %v", errs)
	}
}

// TestProposeExpectedTerm: an Op carrying the term it was validated in is
// refused, with a retriable NOT_LEADER matching ErrTermChanged and nothing
// appended, once the replica leads in another term, even when it is the
// leader again (lost and regained leadership between the proposer's check
// and Propose); in its own term, or with no term, it is appended.
func TestProposeExpectedTerm(t *testing.T) {
	c := newCluster(t, 3)
	c.elect(1)
	var res []Result
	validated := c.replicas[1].LeaderTerm()
	if validated == 0 {
		t.Fatal("the leader reports no term")
	}
	withTerm := func(o *Op, term uint64) *Op { o.Term = term; return o }
	c.replicas[1].Propose(withTerm(op(0, 0, 1, "a", &res), validated))
	c.settle()
	c.transfer(2)
	c.transfer(1)
	if now := c.replicas[1].LeaderTerm(); now <= validated {
		t.Fatalf("term %d after two leader changes, was %d", now, validated)
	}
	c.replicas[1].Propose(withTerm(op(0, 0, 1, "stale", &res), validated))
	c.settle()
	if len(res) != 2 || res[0].Err != nil {
		t.Fatalf("replies: %+v", res)
	}
	stale := res[1].Err
	if !errors.Is(stale, ErrTermChanged) || apierr.CodeOf(stale) != apierr.NotLeader || !apierr.IsRetriable(stale) {
		t.Fatalf("a proposal of an older term: %v", stale)
	}
	c.replicas[1].Propose(withTerm(op(0, 0, 1, "b", &res), c.replicas[1].LeaderTerm()))
	c.replicas[1].Propose(op(0, 0, 1, "c", &res))
	c.settle()
	if len(res) != 4 || res[2].Err != nil || res[3].Err != nil {
		t.Fatalf("replies: %+v", res)
	}
	c.tick(2)
	for _, id := range c.ids {
		if got := c.logValues(id); fmt.Sprint(got) != "[a-0 b-0 c-0]" {
			t.Fatalf("node %d log: %v", id, got)
		}
	}
	// A follower answers NOT_LEADER whatever the term says.
	c.replicas[2].Propose(withTerm(op(0, 0, 1, "x", &res), c.replicas[1].LeaderTerm()))
	if last := res[len(res)-1].Err; apierr.CodeOf(last) != apierr.NotLeader || errors.Is(last, ErrTermChanged) {
		t.Fatalf("follower propose: %v", last)
	}
}
