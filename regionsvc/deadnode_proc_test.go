package regionsvc_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/internal/nodeproc"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// TestDeadNodeRebuiltProc: real geologd processes with TLS. A region of
// four nodes serves a stream of 8 ranges, some of whose replicas are on
// node 4, while a producer writes keyed records to it. Node 4 is killed
// (SIGKILL) and stays down. Once it has been unreachable past
// --dead-node-after, the region lists it dead and the rebalancer rebuilds
// each of its replicas on the other nodes, under the producer, until every
// range has three voters, none on node 4, and no learner. Then the
// producer stops: no append failed, and each acknowledged record is stored
// exactly once at its acked offset on the copies left. It fails if a range
// keeps node 4 as a voter or ends with more or fewer than three voters, a
// rebuilt replica misses or duplicates a record, or an append fails.
func TestDeadNodeRebuiltProc(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real-process test")
	}
	const ranges = 8
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := nodeproc.NewPKI(t)
	flags := []string{"--tick", "50ms", "--superusers", "alice", "--rebalance-interval", "1s",
		"--rebalance-moves-max", "2", "--dead-node-after", "3s"}
	procs := nodeproc.TLSRegion(t, p, "us", 4, flags...)
	alice := p.ClientDir("alice")
	c := tlsClient(t, procAddrs(procs), alice)
	waitFor(t, ctx, "stream created", func() bool {
		_, err := c.CreateStream(ctx, client.StreamConfig{Name: "dead", RangeCount: ranges})
		return err == nil || client.CodeOf(err) == client.CodeStreamExists
	})
	var admins []geologv1.AdminClient
	for _, pr := range procs {
		admins = append(admins, geologv1.NewAdminClient(nodeproc.Dial(t, pr.Addr, alice)))
	}
	waitFor(t, ctx, "every range on three voters, some on node 4", func() bool {
		on4 := 0
		for r := uint32(0); r < ranges; r++ {
			d, err := describeAtLeader(ctx, admins, "dead", r)
			if err != nil || len(d.GetReplicas()) != 3 {
				return false
			}
			if slices.ContainsFunc(d.GetReplicas(), func(rs *geologv1.ReplicaStatus) bool { return rs.GetNodeId() == 4 }) {
				on4++
			}
		}
		return on4 > 0
	})
	prod := startAckedProducer(t, ctx, c, "dead", 200)
	time.Sleep(time.Second) // some records acked with node 4 up
	procs[3].Kill()
	killed := time.Now()
	alive := admins[:3]
	waitFor(t, ctx, "node 4 listed dead", func() bool {
		lctx, lcancel := context.WithTimeout(ctx, 5*time.Second)
		defer lcancel()
		resp, err := alive[0].ListNodes(lctx, &geologv1.ListNodesRequest{})
		return err == nil && slices.ContainsFunc(resp.GetNodes(), func(n *geologv1.NodeInfo) bool { return n.GetNodeId() == 4 && n.GetDead() })
	})
	var last string
	waitFor(t, ctx, "node 4's replicas rebuilt on nodes 1-3", func() bool {
		ok, state := drained(ctx, alive, "dead", ranges, 4)
		if state != last {
			t.Logf("rebuild: %s", state)
			last = state
		}
		return ok
	})
	t.Logf("node 4's replicas rebuilt %v after the kill", time.Since(killed).Round(100*time.Millisecond))
	acked := prod.stop(t)
	if len(acked) < 200 {
		t.Fatalf("only %d records acked while node 4 was rebuilt", len(acked))
	}
	checkEachAckedOnce(t, ctx, procs[:3], alice, "dead", ranges, acked)
}
