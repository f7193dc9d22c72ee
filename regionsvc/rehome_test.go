package regionsvc

import (
	"context"
	"net"
	"testing"

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
