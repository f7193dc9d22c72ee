package regionsvc

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// drivers lists every range driver of node n, the catalogue's included.
func (n *Node) drivers() []*rangeDriver {
	n.mu.RLock()
	defer n.mu.RUnlock()
	all := []*rangeDriver{n.region.meta}
	for _, st := range n.streams {
		all = append(all, st.ranges...)
	}
	return all
}

// waitQuiesced waits until every range of every live node is quiesced.
func (tr *testRegion) waitQuiesced(ctx context.Context) {
	tr.t.Helper()
	for {
		awake := 0
		for _, n := range tr.nodes {
			for _, d := range n.drivers() {
				if !d.quiesced.Load() {
					awake++
				}
			}
		}
		if awake == 0 {
			return
		}
		if ctx.Err() != nil {
			tr.t.Fatalf("%d ranges still awake", awake)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// raftMessagesSent is the Raft messages the live nodes sent so far.
func (tr *testRegion) raftMessagesSent() uint64 {
	var sent uint64
	for _, n := range tr.nodes {
		sent += n.region.transport.Stats().MessagesSent
	}
	return sent
}

// crash makes node id vanish from the network as a killed process does,
// without its ranges handing leadership away: its server and transport
// stop, its ranges do not (the test's cleanup closes it).
func (tr *testRegion) crash(id uint64) {
	n := tr.nodes[id]
	n.grpcServer.Stop()
	n.region.transport.Close()
	delete(tr.clients, id)
}

// TestIdleRangesQuiesce: the ranges of an idle region quiesce and then
// send no Raft message at all (without quiescence every leader
// heartbeats every other tick); an append wakes its range and is acked;
// the leader of a quiesced range dies without handing off, and its
// followers, woken by the node's liveness watch, elect a new leader that
// takes appends.
func TestIdleRangesQuiesce(t *testing.T) {
	// Not parallel: it counts Raft messages over 50 ticks of silence, and
	// beside other tests a late keepalive once woke a range (one message).
	tr := newTestRegion(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	tr.retry(ctx, "create stream", func(ctx context.Context, c geologv1.LogClient) error {
		_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "q", RangeCount: 4})
		if rpcerr.CodeOf(err) == apierr.StreamExists {
			return nil
		}
		return err
	})
	appendTo := func(r uint32, seq uint64) {
		tr.retry(ctx, fmt.Sprintf("append to range %d", r), func(ctx context.Context, c geologv1.LogClient) error {
			_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "q", Range: r, ProducerId: 9, BaseSequence: seq,
				Records: []*geologv1.Record{{Value: []byte("v")}}})
			return err
		})
	}
	appendTo(0, 0)
	tr.waitQuiesced(ctx)
	before := tr.raftMessagesSent()
	time.Sleep(50 * testTick(20*time.Millisecond)) // 50 ticks: 25 heartbeat rounds without quiescence
	if sent := tr.raftMessagesSent() - before; sent != 0 {
		t.Fatalf("a quiesced region sent %d raft messages in 50 ticks", sent)
	}
	appendTo(1, 0) // wakes range 1, which quiesces again
	tr.waitQuiesced(ctx)

	leader := tr.leaderOf(ctx, "q", 2)
	tr.crash(leader)
	appendTo(2, 0)
	for id, n := range tr.nodes {
		n.mu.RLock()
		d := n.streams["q"].ranges[2]
		n.mu.RUnlock()
		if id != leader && d.rep.LeaderID() == leader {
			t.Fatalf("node %d still follows the crashed leader %d", id, leader)
		}
	}
}
