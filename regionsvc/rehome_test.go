package regionsvc

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/homing"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// fakeStopNode is a node of an old home that answers RefreshHomes with a
// fixed response (the final tails it reports).
type fakeStopNode struct {
	geologv1.UnimplementedAdminServer
	resp *geologv1.RefreshHomesResponse
}

func (f *fakeStopNode) RefreshHomes(context.Context, *geologv1.RefreshHomesRequest) (*geologv1.RefreshHomesResponse, error) {
	return proto.Clone(f.resp).(*geologv1.RefreshHomesResponse), nil
}

// startFakeStopNodes serves each response from a node of its own; their
// addresses, in order.
func startFakeStopNodes(t *testing.T, resps []*geologv1.RefreshHomesResponse) []string {
	var addrs []string
	for _, resp := range resps {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s := grpc.NewServer()
		geologv1.RegisterAdminServer(s, &fakeStopNode{resp: resp})
		go s.Serve(lis)
		t.Cleanup(s.Stop)
		addrs = append(addrs, lis.Addr().String())
	}
	return addrs
}

// TestStopTakesOnlyLeaderTails (notes/simfaults.md, product bug 1): the
// stop of a planned rehome takes a range's final tail only from a node
// that led it. Range 0's leader lost the lead during the stop (its final
// tail failed, it reported nothing) and the followers report their
// committed ends, as nodes before RangeTail.leader did: those may lag what
// the leader acked, so range 0 must come back unreported (the coordinator
// then asks the leader of now, homing.OpDrainedTails) instead of at the
// followers' 16, below acked records. Range 1's leader reported 20: that
// is its tail, whatever a follower said.
func TestStopTakesOnlyLeaderTails(t *testing.T) {
	t.Parallel()
	follower := func(id uint64, tail0, tail1 uint64) *geologv1.RefreshHomesResponse {
		return &geologv1.RefreshHomesResponse{HomesVersion: 7, LivenessNodeId: id, Tails: []*geologv1.RangeTail{
			{Range: 0, TailOffset: tail0}, {Range: 1, TailOffset: tail1}}}
	}
	leader1 := &geologv1.RefreshHomesResponse{HomesVersion: 7, LivenessNodeId: 1, Tails: []*geologv1.RangeTail{
		{Range: 1, TailOffset: 20, Leader: true}}}
	addrs := startFakeStopNodes(t, []*geologv1.RefreshHomesResponse{leader1, follower(2, 16, 19), follower(3, 15, 25)})
	n, _ := testNode(t, t.TempDir(), func(cfg *Config) {
		cfg.Region, cfg.Regions = "eu", map[string][]string{"us": addrs}
	})
	got, err := n.refreshRegionTails(ctxT(t), "us", &geologv1.RefreshHomesRequest{Stream: "s", Ranges: []uint32{0, 1}, Confirm: true})
	if err != nil {
		t.Fatal(err)
	}
	if tail, ok := got.tails[0]; ok {
		t.Errorf("range 0, whose leader reported nothing: final tail %d from its followers, want none (unreported)", tail)
	}
	if got.tails[1] != 20 {
		t.Errorf("range 1: final tail %d, want its leader's 20", got.tails[1])
	}
	for id := uint64(1); id <= 3; id++ {
		if got.seen[id] != 7 {
			t.Errorf("node %d: seen %d, want 7", id, got.seen[id])
		}
	}
}

// TestStoppedRangeAnswersOnlyItsFinalTail: a range stopped in its old
// home by a planned move (prepared, its homes installed as the stop does,
// not completed) on a region of three nodes over an in-memory lease store.
//   - The stop's tails come from the range's leader alone, marked so; its
//     followers report nothing (product bug 1 of notes/simfaults.md: their
//     committed ends may lag what the leader acked).
//   - No node of the old home answers a home read of it (product bug 4:
//     once the move completes the target acks what the old home lacks,
//     and a node cut off learns of it only a lease later); the answer is
//     retriable, as an append's.
//   - The coordinator still gets the final tail (drainedTail, OpDrainedTails's
//     read) from any node of the old home, and once the move is cancelled
//     home reads are answered again.
func TestStoppedRangeAnswersOnlyItsFinalTail(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("two regions of three nodes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	store := homing.NewMemStore()
	w := newWorldWith(t, []string{"us", "eu"}, 3, time.Millisecond, 0, nil, func(region string, id uint64, cfg *Config) {
		cfg.LeaseStore, cfg.LeaseTTL, cfg.LeaseHeartbeat, cfg.MaxClockOffset = store, testLeaseTTL, testLeaseHeartbeat, testMaxClockOffset
		cfg.FailoverDisabled = true
	})
	createHomedStream(t, ctx, w, "mv", 1, "us")
	appendAt(t, ctx, &homingWorld{world: w}, "us", "mv", 10)
	key := homing.RangeKey{Stream: "mv", Range: 0}
	b, err := store.PrepareRehomes(ctx, []homing.RehomeRequest{{Key: key, Epoch: 1, To: "eu"}})
	if err != nil || b.Errs[0] != nil {
		t.Fatalf("prepare: %v %v", err, b.Errs)
	}
	snap, ok := b.Region("us")
	if !ok {
		t.Fatal("the prepare returned no homes of us")
	}
	coord := w.nodes["eu"][1]
	stopped, err := coord.refreshRegionTails(ctx, "us", &geologv1.RefreshHomesRequest{Stream: "mv", Ranges: []uint32{0}, Homes: regionHomesToProto(snap)})
	if err != nil {
		t.Fatalf("stop: %v", err)
	}
	final, ok := stopped.tails[0]
	if !ok || final < 10 {
		t.Fatalf("the stop's final tail of range 0: %d (reported %v), want its leader's, at least the 10 acked", final, ok)
	}
	checkStopReports(t, ctx, w, final)
	for id, c := range w.conns["us"] {
		_, err := c.Read(ctx, &geologv1.ReadRequest{Stream: "mv", Consistency: geologv1.Consistency_CONSISTENCY_HOME})
		if e := apierr.As(rpcerr.FromError(err)); err == nil || !e.Retriable {
			t.Errorf("node %d of us answered a home read of the stopped range: %v, want a retriable refusal", id, err)
		}
	}
	spec, _ := coord.streamSpec("mv")
	if got, err := coord.drainedTail(ctx, spec, 0, "us"); err != nil || got != final {
		t.Fatalf("the coordinator's read of the final tail: %d, %v; want %d", got, err, final)
	}
	if _, err := store.CancelRehome(ctx, homing.RehomeRequest{Key: key, Epoch: 1, To: "eu"}); err != nil {
		t.Fatal(err)
	}
	if err := coord.refreshRegion(ctx, "us"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, ctx, 30*time.Second, "home reads after the cancel", func() bool {
		resp, err := w.conns["us"][1].Read(ctx, &geologv1.ReadRequest{Stream: "mv", Consistency: geologv1.Consistency_CONSISTENCY_HOME})
		return err == nil && resp.GetTailOffset() == final
	})
}

// checkStopReports: asked for range 0's final tail, the node of us that
// leads it reports final, marked as a leader's; the others report nothing.
func checkStopReports(t *testing.T, ctx context.Context, w *world, final uint64) {
	t.Helper()
	leaders := 0
	for id, n := range w.nodes["us"] {
		resp, err := (&adminServer{node: n}).RefreshHomes(ctx, &geologv1.RefreshHomesRequest{Stream: "mv", Ranges: []uint32{0}})
		if err != nil {
			t.Fatalf("node %d: %v", id, err)
		}
		d, err := n.rangeOf(ctx, "mv", 0)
		if err != nil {
			t.Fatal(err)
		}
		leads := d.rep.LeaderID() == n.cfg.NodeID
		switch tails := resp.GetTails(); {
		case leads && (len(tails) != 1 || !tails[0].GetLeader() || tails[0].GetTailOffset() != final):
			t.Errorf("node %d, the leader: tails %v, want %d marked as a leader's", id, tails, final)
		case !leads && len(tails) > 0:
			t.Errorf("node %d, a follower: tails %v, want none (a follower's end may lag what its leader acked)", id, tails)
		}
		if leads {
			leaders++
		}
	}
	if leaders != 1 {
		t.Errorf("%d nodes of us lead range 0 (a leader change during the test?), want 1", leaders)
	}
}
