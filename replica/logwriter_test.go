package replica

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/segment"
	"github.com/hashicorp/go-hclog"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// TestLeaderAcksWhileItsWriteIsPending: a leader whose own write has not
// happened yet acks once both followers have the batch durably (the commit
// index covers it), but publishes the offset to readers only once its own
// log holds it.
func TestLeaderAcksWhileItsWriteIsPending(t *testing.T) {
	c := newCluster(t, 3)
	c.elect(1)
	c.holdWrites[1] = true
	var res []Result
	c.replicas[1].Propose(op(7, 0, 2, "a", &res))
	c.replicas[1].Propose(op(7, 2, 1, "b", &res))
	c.settle()
	if len(res) != 2 || res[0].Err != nil || res[0].BaseOffset != 0 || res[1].Err != nil || res[1].BaseOffset != 2 {
		t.Fatalf("replies with the leader's write pending: %+v", res)
	}
	if !c.replicas[1].HasLogWrites() || c.logs[1].NextOffset() != 0 || c.replicas[1].Committed() != 0 {
		t.Fatalf("leader: writes queued %v, log at %d, committed %d", c.replicas[1].HasLogWrites(),
			c.logs[1].NextOffset(), c.replicas[1].Committed())
	}
	c.holdWrites[1] = false
	c.tick(2)
	if got := c.logValues(1); fmt.Sprint(got) != "[a-0 a-1 b-0]" || c.replicas[1].Committed() != 3 {
		t.Fatalf("leader log %v, committed %d", got, c.replicas[1].Committed())
	}
	c.agree()
}

// TestNoAckUntilAQuorumHasWritten: the leader's own write and one
// follower's Raft step are not enough; the ack waits until a follower's
// write is durable too.
func TestNoAckUntilAQuorumHasWritten(t *testing.T) {
	c := newCluster(t, 3)
	c.elect(1)
	c.holdWrites[2], c.holdWrites[3] = true, true
	var res []Result
	c.replicas[1].Propose(op(7, 0, 2, "a", &res))
	c.settle()
	if len(res) != 0 {
		t.Fatalf("acked before any follower wrote: %+v", res)
	}
	if c.logs[1].NextOffset() != 2 || !c.replicas[2].HasLogWrites() {
		t.Fatalf("leader log at %d; follower 2 has writes queued: %v", c.logs[1].NextOffset(), c.replicas[2].HasLogWrites())
	}
	c.holdWrites[2] = false
	c.settle()
	if len(res) != 1 || res[0].Err != nil || res[0].BaseOffset != 0 {
		t.Fatalf("replies once follower 2 wrote: %+v", res)
	}
	c.holdWrites[3] = false
	c.tick(2)
	c.agree()
}

// TestAnswerCommittedAtStep: the leader answers an append when it steps
// the follower ack that completes a quorum of durable copies (the driver
// calls AnswerCommitted after Step), with no Ready cycle in between; a
// step that leaves the batch durable on fewer than a quorum answers
// nothing, whatever the leader has sent or queued for its own log.
func TestAnswerCommittedAtStep(t *testing.T) {
	c := newCluster(t, 3)
	c.elect(1)
	leader := c.replicas[1]
	for _, id := range c.ids {
		c.holdWrites[id] = true
	}
	var res []Result
	leader.Propose(op(7, 0, 2, "a", &res))
	if err := leader.ProcessReady(); err != nil { // sends the appends, queues its own write
		t.Fatal(err)
	}
	// Each follower steps the append and writes it (its ack leaves once
	// durable); the acks wait in acks until the leader steps them.
	var acks []*raftpb.Message
	for _, id := range []uint64{2, 3} {
		c.stepQueuedTo(id)
		f := c.replicas[id]
		for f.HasReady() {
			if err := f.ProcessReady(); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.WriteLog(); err != nil {
			t.Fatal(err)
		}
		acks = append(acks, c.takeQueuedTo(1)...)
	}
	if len(acks) == 0 || len(res) != 0 {
		t.Fatalf("%d acks for the leader, %d answers before it stepped any", len(acks), len(res))
	}
	// The first follower's ack: two copies of three known, one durable
	// (the leader's write is still queued).
	first := acks[0].GetFrom()
	for len(acks) > 0 && acks[0].GetFrom() == first {
		if err := leader.Step(acks[0]); err != nil {
			t.Fatal(err)
		}
		leader.AnswerCommitted()
		acks = acks[1:]
	}
	if len(res) != 0 {
		t.Fatalf("answered with one durable copy of three: %+v", res)
	}
	// The second follower's ack completes the quorum: answered at the step.
	for _, m := range acks {
		if err := leader.Step(m); err != nil {
			t.Fatal(err)
		}
	}
	leader.AnswerCommitted()
	if len(res) != 1 || res[0].Err != nil || res[0].BaseOffset != 0 {
		t.Fatalf("answers once both followers' copies are durable: %+v", res)
	}
	if !leader.HasLogWrites() || c.logs[1].NextOffset() != 0 {
		t.Fatalf("the leader's own write: queued %v, log at %d", leader.HasLogWrites(), c.logs[1].NextOffset())
	}
	for _, id := range c.ids {
		c.holdWrites[id] = false
	}
	c.tick(2)
	if len(res) != 1 {
		t.Fatalf("answered again: %+v", res)
	}
	c.agree()
}

// stepQueuedTo steps the queued messages for node id; the others stay queued.
func (c *cluster) stepQueuedTo(id uint64) {
	var rest []*raftpb.Message
	for _, m := range c.queue {
		if m.GetTo() == id {
			_ = c.replicas[id].Step(m)
		} else {
			rest = append(rest, m)
		}
	}
	c.queue = rest
}

// takeQueuedTo removes the queued messages for node id and returns them.
func (c *cluster) takeQueuedTo(id uint64) []*raftpb.Message {
	var mine, rest []*raftpb.Message
	for _, m := range c.queue {
		if m.GetTo() == id {
			mine = append(mine, m)
		} else {
			rest = append(rest, m)
		}
	}
	c.queue = rest
	return mine
}

// TestTruncationFlushesQueuedWrites: an isolated leader's entries are still
// queued (its disk is slow) when the new leader's entries overwrite them:
// the queued writes go first, then the truncation, and the idempotence
// table forgets the overwritten batch.
func TestTruncationFlushesQueuedWrites(t *testing.T) {
	c := newCluster(t, 3)
	c.elect(1)
	var stale, fresh []Result
	c.cut[1] = true
	c.holdWrites[1] = true
	c.replicas[1].Propose(op(9, 0, 2, "stale", &stale))
	c.settle()
	if !c.replicas[1].HasLogWrites() {
		t.Fatal("the isolated leader's write is not queued")
	}
	for i := 0; i < 100 && c.leader() == 0; i++ {
		c.tick(1)
	}
	l := c.leader()
	if l == 0 || l == 1 {
		t.Fatalf("no new leader (got %d)", l)
	}
	c.replicas[l].Propose(op(8, 0, 3, "fresh", &fresh))
	c.settle()
	delete(c.cut, 1)
	c.tick(3) // node 1 truncates with its write still held
	if got := c.logValues(1); fmt.Sprint(got) != "[fresh-0 fresh-1 fresh-2]" {
		t.Fatalf("node 1 log after the truncation: %v", got)
	}
	c.holdWrites[1] = false
	c.tick(3)
	if len(stale) != 1 || apierr.CodeOf(stale[0].Err) != apierr.NotLeader {
		t.Fatalf("stale proposal: %+v", stale)
	}
	if len(fresh) != 1 || fresh[0].Err != nil {
		t.Fatalf("fresh proposal: %+v", fresh)
	}
	for _, id := range c.ids {
		if got := c.logValues(id); fmt.Sprint(got) != "[fresh-0 fresh-1 fresh-2]" {
			t.Fatalf("node %d log: %v", id, got)
		}
	}
	// Node 1, now leading, takes producer 9's batch as new: it was never
	// committed.
	c.transfer(1)
	var again []Result
	c.replicas[1].Propose(op(9, 0, 2, "stale", &again))
	c.settle()
	if len(again) != 1 || again[0].Err != nil || again[0].Duplicate || again[0].BaseOffset != 3 {
		t.Fatalf("producer 9's retry: %+v", again)
	}
}

// failingLog fails Sync once fail is set.
type failingLog struct {
	FrameLog
	mu   sync.Mutex
	fail bool
}

func (f *failingLog) Sync() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return errors.New("injected: fdatasync fails")
	}
	return f.FrameLog.Sync()
}

// TestWriteFailureStopsReplica: a failed fsync on the log writer stops the
// replica; what it was writing is never acked, and its pending proposals
// are answered with UNAVAILABLE.
func TestWriteFailureStopsReplica(t *testing.T) {
	var fl *failingLog
	c := newClusterOpts(t, 3, 3, func(c *cluster) {
		c.repCfg = func(id uint64, cfg *Config) {
			if id == 1 {
				fl = &failingLog{FrameLog: cfg.Log}
				cfg.Log = fl
			}
		}
	})
	c.elect(1)
	c.holdWrites[2], c.holdWrites[3] = true, true
	fl.fail = true
	var res []Result
	r1 := c.replicas[1]
	r1.Propose(op(7, 0, 2, "a", &res))
	if err := r1.ProcessReady(); err != nil {
		t.Fatal(err)
	}
	if err := r1.WriteLog(); err == nil {
		t.Fatal("WriteLog hid the failure")
	}
	if !r1.HasReady() {
		t.Fatal("the failure does not wake the driver")
	}
	if err := r1.ProcessReady(); err == nil || r1.Failure() == nil {
		t.Fatalf("ProcessReady after the failure: %v (failure %v)", err, r1.Failure())
	}
	if len(res) != 1 || apierr.CodeOf(res[0].Err) != apierr.Unavailable {
		t.Fatalf("pending proposal: %+v", res)
	}
	if err := r1.WriteLog(); err == nil {
		t.Fatal("a stopped replica's writer accepts writes")
	}
}

// TestLogWriterGoroutines drives three replicas the way a node does: a
// driver goroutine and a log-writer goroutine each, messages through
// channels, producers racing leader changes. Run with -race.
func TestLogWriterGoroutines(t *testing.T) {
	type node struct {
		r    *Replica
		log  *segment.Store
		in   chan []*raftpb.Message
		exec chan func()
		stop chan struct{}
		done sync.WaitGroup
	}
	nodes := map[uint64]*node{}
	send := func(msgs []*raftpb.Message) {
		for _, m := range msgs {
			if n := nodes[m.GetTo()]; n != nil {
				select {
				case n.in <- []*raftpb.Message{proto.Clone(m).(*raftpb.Message)}:
				default: // dropped: Raft retransmits
				}
			}
		}
	}
	for id := uint64(1); id <= 3; id++ {
		st, err := segment.Open(segment.Config{Dir: t.TempDir()}) // fsync on: writes overlap Ready cycles
		if err != nil {
			t.Fatal(err)
		}
		r, err := New(Config{NodeID: id, Stream: "g", Peers: []uint64{1, 2, 3}, Log: st, State: &MemState{},
			Send: send, Logger: hclog.New(&hclog.LoggerOptions{Level: hclog.Warn, Output: testWriter{t}})}, nil)
		if err != nil {
			t.Fatal(err)
		}
		nodes[id] = &node{r: r, log: st, in: make(chan []*raftpb.Message, 1024), exec: make(chan func()), stop: make(chan struct{})}
	}
	for _, n := range nodes {
		n.done.Add(2)
		go func() { // the driver
			defer n.done.Done()
			tick := time.NewTicker(2 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case msgs := <-n.in:
					for _, m := range msgs {
						n.r.Step(m)
					}
				case fn := <-n.exec:
					fn()
				case <-tick.C:
					n.r.Tick()
				case <-n.r.LogWritten():
				case <-n.stop:
					n.r.Close()
					return
				}
				for i := 0; i < 16 && n.r.HasReady(); i++ {
					if err := n.r.ProcessReady(); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
		go func() { // the log writer
			defer n.done.Done()
			for {
				select {
				case <-n.r.LogWrites():
					if err := n.r.WriteLog(); err != nil {
						t.Error(err)
					}
				case <-n.stop:
					return
				}
			}
		}()
	}
	on := func(id uint64, fn func()) {
		done := make(chan struct{})
		nodes[id].exec <- func() { fn(); close(done) }
		<-done
	}
	on(1, func() { nodes[1].r.Campaign() })
	const batches = 300
	leaders := map[uint64]bool{} // nodes that acked a batch
	deadline := time.Now().Add(30 * time.Second)
	for seq := uint64(0); seq < batches; seq++ {
		if seq == batches/3 || seq == 2*batches/3 {
			// Move leadership while appends are in flight.
			for id, n := range nodes {
				on(id, func() {
					if n.r.IsLeader() {
						n.r.TransferLeadership(id%3 + 1)
					}
				})
			}
		}
		// Propose at whichever node leads, retrying (the same sequence:
		// idempotence makes a retry of an appended batch a duplicate) until
		// acked.
		for acked := false; !acked; {
			if time.Now().After(deadline) {
				t.Fatalf("only %d of %d batches acked", seq, batches)
			}
			// Room for a reply from every node: during a transfer two may
			// still think they lead, and a reply is sent on the driver.
			reply := make(chan Result, len(nodes))
			var leader uint64
			for id, n := range nodes {
				on(id, func() {
					if n.r.IsLeader() {
						leader = id
						o := op(5, seq, 1, fmt.Sprintf("s%d", seq), nil)
						o.Reply = func(r Result) { reply <- r }
						n.r.Propose(o)
					}
				})
			}
			select {
			case r := <-reply:
				if r.Err == nil {
					if r.BaseOffset != seq {
						t.Fatalf("batch %d acked at offset %d", seq, r.BaseOffset)
					}
					acked = true
					leaders[leader] = true
				}
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	if len(leaders) < 2 {
		t.Fatalf("leadership never moved: acks from %v", leaders)
	}
	// Every replica commits all of it, the same records at the same
	// offsets.
	for id, n := range nodes {
		for time.Now().Before(deadline) && n.r.Committed() < batches {
			time.Sleep(time.Millisecond)
		}
		if c := n.r.Committed(); c != batches {
			t.Fatalf("node %d committed %d", id, c)
		}
	}
	for _, n := range nodes {
		close(n.stop)
		n.done.Wait()
	}
	want, err := nodes[1].log.ReadFrames(0, 1<<30, batches)
	if err != nil {
		t.Fatal(err)
	}
	for id, n := range nodes {
		got, err := n.log.ReadFrames(0, 1<<30, batches)
		if err != nil || len(got) != len(want) {
			t.Fatalf("node %d: %d bytes of frames (want %d): %v", id, len(got), len(want), err)
		}
		n.log.Close()
	}
}

// TestDuplicateOfOverwrittenBatch: a leader answers a retry as a duplicate
// of a batch still uncommitted in its log, then loses leadership, and the
// new leader's entries overwrite that batch. The duplicate must not be
// answered with the offsets another batch now holds: it fails with a
// retriable NOT_LEADER.
func TestDuplicateOfOverwrittenBatch(t *testing.T) {
	c := newCluster(t, 3)
	c.elect(1)
	var first, retry, other []Result
	c.cut[1] = true
	c.replicas[1].Propose(op(7, 0, 2, "mine", &first))
	c.settle()
	c.replicas[1].Propose(op(7, 0, 2, "mine", &retry)) // answered once the original commits
	if len(retry) != 0 || len(c.replicas[1].duplicates) != 1 {
		t.Fatalf("retry: %+v, %d waiting", retry, len(c.replicas[1].duplicates))
	}
	for i := 0; i < 100 && (c.leader() == 0 || c.leader() == 1); i++ {
		c.tick(1)
	}
	l := c.leader()
	c.replicas[l].Propose(op(8, 0, 3, "theirs", &other))
	c.settle()
	delete(c.cut, 1)
	c.tick(3)
	if len(other) != 1 || other[0].Err != nil || other[0].BaseOffset != 0 {
		t.Fatalf("the new leader's batch: %+v", other)
	}
	if c.replicas[1].Committed() != 3 {
		t.Fatalf("node 1 committed %d", c.replicas[1].Committed())
	}
	for _, res := range [][]Result{first, retry} {
		if len(res) != 1 || apierr.CodeOf(res[0].Err) != apierr.NotLeader || !apierr.IsRetriable(res[0].Err) {
			t.Fatalf("the overwritten batch was answered %+v", res)
		}
	}
}

// TestStaleLeaderDoesNotRejectFinally: a leader deposed without knowing it
// yet lacks the batches its successor appended, so a producer's next batch
// looks like a sequence gap to it; it answers a retriable NOT_LEADER, not
// the final SEQUENCE_GAP. A confirmed leader's rejection stands.
func TestStaleLeaderDoesNotRejectFinally(t *testing.T) {
	c := newCluster(t, 3)
	c.elect(1)
	var res []Result
	c.replicas[1].Propose(op(7, 0, 2, "a", &res))
	c.settle()
	// A real gap at the confirmed leader: final.
	c.replicas[1].Propose(op(7, 5, 1, "gap", &res))
	c.settle()
	if len(res) != 2 || res[0].Err != nil || apierr.CodeOf(res[1].Err) != apierr.SequenceGap {
		t.Fatalf("replies at the leader: %+v", res)
	}
	// Node 1 is cut off and does not tick: it still believes it leads
	// while nodes 2 and 3 elect a leader that appends sequences 2-3.
	c.cut[1] = true
	for i := 0; i < 100 && (c.leader() == 0 || c.leader() == 1); i++ {
		c.replicas[2].Tick()
		c.replicas[3].Tick()
		c.settle()
	}
	l := c.leader()
	var next, stale []Result
	c.replicas[l].Propose(op(7, 2, 2, "b", &next))
	c.settle()
	if len(next) != 1 || next[0].Err != nil || !c.replicas[1].IsLeader() {
		t.Fatalf("new leader %d: %+v; node 1 leads: %v", l, next, c.replicas[1].IsLeader())
	}
	c.replicas[1].Propose(op(7, 4, 1, "c", &stale))
	c.settle()
	if len(stale) != 0 {
		t.Fatalf("the deposed leader answered before confirming: %+v", stale)
	}
	delete(c.cut, 1)
	c.tick(3)
	if len(stale) != 1 || apierr.CodeOf(stale[0].Err) != apierr.NotLeader || !apierr.IsRetriable(stale[0].Err) {
		t.Fatalf("the deposed leader answered %+v", stale)
	}
}
