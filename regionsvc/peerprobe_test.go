package regionsvc

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/internal/rpcerr"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"github.com/geolog/geolog/raftnet"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// probeState is what a probe must leave as it was on a node: the range's
// log (tail offset, last Raft index), its committed offset, Raft term,
// highest epoch, forks, and that it serves.
type probeState struct {
	next, lastIndex, committed, term, epoch uint64
	forks                                   int
	failed                                  bool
}

func rangeState(t *testing.T, n *Node, stream string) probeState {
	t.Helper()
	d, err := n.rangeOf(context.Background(), stream, 0)
	if err != nil {
		t.Fatal(err)
	}
	var term uint64
	// Raft's status is the driver goroutine's to read.
	if err := d.exec(context.Background(), func() { term = d.rep.Status().GetTerm() }); err != nil && d.failure.Load() == nil {
		t.Fatalf("read the term of %s/0: %v", stream, err)
	}
	return probeState{next: d.store.NextOffset(), lastIndex: d.store.LastIndex(), committed: d.committed.Load(),
		term: term, epoch: d.highestEpoch.Load(), forks: len(d.rep.Orphans()), failed: d.failure.Load() != nil}
}

func regionStates(t *testing.T, w *world, region, stream string) map[uint64]probeState {
	out := map[uint64]probeState{}
	for id, n := range w.nodes[region] {
		out[id] = rangeState(t, n, stream)
	}
	return out
}

// produceN appends n records to stream from region through the SDK.
func produceN(t *testing.T, ctx context.Context, w *world, region, stream string, n int, tag string) {
	t.Helper()
	c, err := client.New(w.regionAddrs(region))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := c.NewProducer(stream)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := range n {
		if _, err := p.ProduceSync(ctx, &client.Record{Key: []byte("k"), Value: []byte(fmt.Sprintf("%s-%d", tag, i))}); err != nil {
			t.Fatal(err)
		}
	}
}

// waitCaughtUp waits until every node of every region has the home's tail.
func waitCaughtUp(t *testing.T, ctx context.Context, w *world, stream string) {
	t.Helper()
	waitUntil(t, ctx, time.Minute, "every copy caught up", func() bool {
		var tail uint64
		for _, region := range w.regions {
			for _, n := range w.nodes[region] {
				tail = max(tail, rangeState(t, n, stream).committed)
			}
		}
		for _, region := range w.regions {
			for _, n := range w.nodes[region] {
				if rangeState(t, n, stream).committed != tail {
					return false
				}
			}
		}
		return true
	})
}

// TestPeerProbes: the probes that need no identity, from a plain
// gRPC client. A forged Raft append whose frame does not continue the
// follower's log (it panicked the node), a heartbeat committing past the
// log, a proposal in a peer's name, a frame with a bad CRC, and a Mirror
// stream at an epoch above the lease store's (it moved the mirror's real
// records into its orphan log and fenced the real home) or from a region
// that is not the home: each is refused, the stream dropped, and every
// node's log, term and epoch stay as they were while the real home keeps
// appending and replicating.
func TestPeerProbes(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// A slower tick than the other tests: terms must not move by
	// themselves on a loaded machine while the probes run.
	w := newWorldWith(t, []string{"us", "eu"}, 3, 2*time.Millisecond, 0, nil, func(_ string, _ uint64, cfg *Config) {
		cfg.TickInterval = 100 * time.Millisecond
	})
	createHomedStream(t, ctx, w, "probe", 1, "us")
	produceN(t, ctx, w, "us", "probe", 20, "a")
	waitCaughtUp(t, ctx, w, "probe")

	t.Run("raft", func(t *testing.T) { raftProbes(t, ctx, w) })
	t.Run("mirror", func(t *testing.T) { mirrorProbes(t, ctx, w) })

	// The real home goes on, and every copy follows.
	produceN(t, ctx, w, "us", "probe", 5, "b")
	waitCaughtUp(t, ctx, w, "probe")
}

// raftProbes sends forged Raft messages to a follower of the range. They
// come from node 9, which is no node of the region (Raft takes an append
// from anyone at its term): a probe in a real node's name would supersede
// that node's own stream, which then supersedes the probe's.
func raftProbes(t *testing.T, ctx context.Context, w *world) {
	var leader, follower uint64
	for id, n := range w.nodes["us"] {
		d, _ := n.rangeOf(ctx, "probe", 0)
		if d.rep.LeaderID() == id {
			leader = id
		} else {
			follower = id
		}
	}
	if leader == 0 {
		t.Fatal("no leader")
	}
	leader = 9
	fn := w.nodes["us"][follower]
	fn.mu.RLock()
	group := groupFor(fn.region.metaOffsets["probe"], 0)
	fn.mu.RUnlock()
	d, _ := fn.rangeOf(ctx, "probe", 0)
	st := rangeState(t, fn, "probe")
	lastTerm, err := d.store.TermAt(st.lastIndex)
	if err != nil {
		t.Fatal(err)
	}
	u := proto.Uint64
	frame := func(base uint64, corrupt bool) []byte {
		f := batch.Encode(nil, batch.Header{Type: batch.TypeData, BaseOffset: base, Epoch: st.epoch, AppendTimeUnixNanos: time.Now().UnixNano()},
			[]batch.Record{{Key: []byte("k"), Value: []byte("forged")}})
		if corrupt {
			f[len(f)-1] ^= 0xff
		}
		return f
	}
	app := func(base uint64, corrupt bool) *raftpb.Message {
		return &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: u(leader), To: u(follower), Term: u(st.term),
			Index: u(st.lastIndex), LogTerm: u(lastTerm), Commit: u(st.lastIndex + 1),
			Entries: []*raftpb.Entry{{Index: u(st.lastIndex + 1), Term: u(st.term), Type: raftpb.EntryNormal.Enum(), Data: frame(base, corrupt)}}}
	}
	before := regionStates(t, w, "us", "probe")
	for _, p := range []struct {
		name string
		m    *raftpb.Message
	}{
		{"an append at a wrong base offset", app(st.next+7, false)},
		{"an append at offset 0", app(0, false)},
		{"an append whose frame fails its CRC", app(st.next, true)},
		{"a proposal from a peer", &raftpb.Message{Type: raftpb.MsgProp.Enum(), From: u(leader), To: u(follower),
			Entries: []*raftpb.Entry{{Data: frame(0, false)}}}},
		{"a heartbeat committing past the log", &raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), From: u(leader), To: u(follower),
			Term: u(st.term), Commit: u(st.lastIndex + 1000)}},
	} {
		code := forgeRaft(t, ctx, w.addrs["us"][follower], leader, follower, group, p.m)
		t.Logf("%s: stream ended with %s", p.name, code)
		if p.m.GetType() != raftpb.MsgHeartbeat && code != codes.InvalidArgument {
			t.Fatalf("%s: stream ended with %s, want InvalidArgument", p.name, code)
		}
		after := regionStates(t, w, "us", "probe")
		if p.m.GetType() == raftpb.MsgHeartbeat {
			// The heartbeat names node 9 the follower's leader, and node 9
			// is no node of the region: the follower's driver finds that
			// leader down and may call an election (rangecore watchLeader),
			// a new term with its empty entry. That is the follower healing
			// what it was told, not harm: compare what an election leaves.
			after, before = electionFree(after), electionFree(before)
		}
		if fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("%s: the region changed:\n%v\nwas\n%v", p.name, after, before)
		}
	}
}

// electionFree is states without what an election changes: the term and
// the last Raft index (the new leader's empty entry).
func electionFree(states map[uint64]probeState) map[uint64]probeState {
	out := make(map[uint64]probeState, len(states))
	for id, s := range states {
		s.term, s.lastIndex = 0, 0
		out[id] = s
	}
	return out
}

// forgeRaft opens a Raft stream to addr in node from's name, sends m (of
// group), then a harmless message every 50 ms until the server ends the
// stream or 2 s pass; it returns the stream's end (OK: still open).
func forgeRaft(t *testing.T, ctx context.Context, addr string, from, to uint64, group raftnet.GroupID, m *raftpb.Message) codes.Code {
	t.Helper()
	conn := mustConn(t, addr)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := geologinternalv1.NewRaftTransportClient(conn).Stream(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&geologinternalv1.RaftBatch{FromNode: from, ToNode: to}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatalf("hello: %v", err)
	}
	batchOf := func(m *raftpb.Message) *geologinternalv1.RaftBatch {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return &geologinternalv1.RaftBatch{FromNode: from, ToNode: to, Messages: []*geologinternalv1.GroupMessage{{GroupId: uint64(group), Message: b}}}
	}
	ended := make(chan error, 1)
	go func() { _, err := s.Recv(); ended <- err }()
	_ = s.Send(batchOf(m))
	// A heartbeat answer to a follower: Raft ignores it.
	harmless := &raftpb.Message{Type: raftpb.MsgHeartbeatResp.Enum(), From: proto.Uint64(from), To: proto.Uint64(to), Term: proto.Uint64(m.GetTerm() + 0)}
	if harmless.GetTerm() == 0 {
		harmless.Term = proto.Uint64(1)
	}
	deadline := time.After(2 * time.Second)
	for {
		select {
		case err := <-ended:
			return status.Code(err)
		case <-deadline:
			return codes.OK
		case <-time.After(50 * time.Millisecond):
			_ = s.Send(batchOf(harmless))
		}
	}
}

// mirrorProbes opens Mirror streams to every node of eu that are not the
// range's home at the current epoch.
func mirrorProbes(t *testing.T, ctx context.Context, w *world) {
	st := rangeState(t, w.nodes["eu"][1], "probe")
	before := regionStates(t, w, "eu", "probe")
	for _, p := range []struct {
		name   string
		region string
		epoch  uint64
	}{
		{"the home at an epoch above the current", "us", st.epoch + 1},
		{"another region at the current epoch", "ap", st.epoch},
		{"another region at an epoch above the current", "ap", st.epoch + 5},
	} {
		led := false
		for id := range w.nodes["eu"] {
			err := forgeMirror(t, ctx, w.addrs["eu"][id], p.region, p.epoch, st.next)
			switch rpcerr.CodeOf(err) {
			case apierr.NotLeader:
				continue
			case apierr.NotHome:
				led = true
				t.Logf("%s at node %d: %v", p.name, id, err)
			default:
				t.Fatalf("%s at node %d: %v, want NOT_HOME", p.name, id, err)
			}
		}
		if !led {
			t.Fatalf("%s: no node of eu led the mirror", p.name)
		}
		if after := regionStates(t, w, "eu", "probe"); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("%s: the mirror changed:\n%v\nwas\n%v", p.name, after, before)
		}
	}
}

// forgeMirror opens a Mirror stream to addr as region's home at epoch and
// sends a batch that overlaps the mirror's log with a record of that epoch
// (what made the mirror fork); it returns the refusal.
func forgeMirror(t *testing.T, ctx context.Context, addr, region string, epoch, next uint64) error {
	t.Helper()
	conn := mustConn(t, addr)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := geologinternalv1.NewMirrorClient(conn).Replicate(sctx)
	if err != nil {
		t.Fatal(err)
	}
	hb := &geologinternalv1.HomeHeartbeat{HomeEpoch: epoch, CommittedEndOffset: next, HomeTimeUnixNanos: time.Now().UnixNano()}
	if err := s.Send(&geologinternalv1.ReplicateRequest{Heartbeat: hb, Open: &geologinternalv1.ReplicateOpen{
		Stream: "probe", Range: 0, SourceRegion: region, DestinationRegion: "eu", HomeEpoch: epoch}}); err != nil {
		t.Fatal(err)
	}
	frame := batch.Encode(nil, batch.Header{Type: batch.TypeData, Epoch: epoch, AppendTimeUnixNanos: time.Now().UnixNano()},
		[]batch.Record{{Key: []byte("k"), Value: []byte("forged")}})
	_ = s.Send(&geologinternalv1.ReplicateRequest{Heartbeat: hb, Batch: &geologinternalv1.MirrorBatch{FirstOffset: 0, EndOffset: 1,
		FrameCount: 1, Compression: geologinternalv1.Compression_COMPRESSION_NONE, Payload: frame, UncompressedBytes: uint64(len(frame))}})
	for {
		resp, err := s.Recv()
		if err != nil {
			return fmt.Errorf("stream ended without a refusal: %w", err)
		}
		if resp.GetError() != nil {
			return rpcerr.FromDetail(resp.GetError())
		}
	}
}
