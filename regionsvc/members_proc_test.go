package regionsvc_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/internal/nodeproc"
	"github.com/geolog/geolog/internal/rpcerr"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// TestTLSNodeJoinsProc: real geologd processes with TLS. A node that asks
// to join in another id's name is refused; node 4 joins a running 3-node
// region with --join and one member's address and its own certificate,
// every node lists it, and a stream created afterwards has replicas on it
// and serves appends and reads. It fails if the forged join is admitted,
// node 4 is missing from a node's list, or no range of the new stream is
// on it.
func TestTLSNodeJoinsProc(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real-process test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := nodeproc.NewPKI(t)
	procs := nodeproc.TLSRegion(t, p, "us", 3, "--tick", "50ms", "--superusers", "alice")
	alice := p.ClientDir("alice")

	// Node 5's certificate cannot join as node 4.
	forger := geologinternalv1.NewNodeDirectoryClient(nodeproc.Dial(t, procs[0].Addr, p.NodeDir("us", 5)))
	waitFor(t, ctx, "forged join refused", func() bool {
		_, err := forger.Join(ctx, &geologinternalv1.JoinRequest{Region: "us", NodeId: 4, Address: "127.0.0.1:1"})
		if err == nil {
			t.Fatal("node 5 joined as node 4")
		}
		return rpcerr.CodeOf(err) == apierr.PermissionDenied
	})

	addr4 := nodeproc.FreeAddr(t)
	procs = append(procs, nodeproc.Start(t, t.TempDir(), addr4, "--region", "us", "--node-id", "4", "--join", procs[1].Addr,
		"--certs-dir", p.NodeDir("us", 4), "--tick", "50ms", "--superusers", "alice"))
	for _, pr := range procs {
		admin := geologv1.NewAdminClient(nodeproc.Dial(t, pr.Addr, alice))
		waitFor(t, ctx, "node 4 listed by "+pr.Addr, func() bool {
			resp, err := admin.ListNodes(ctx, &geologv1.ListNodesRequest{})
			return err == nil && slices.ContainsFunc(resp.GetNodes(), func(n *geologv1.NodeInfo) bool {
				return n.GetNodeId() == 4 && n.GetState() == geologv1.NodeState_NODE_STATE_LIVE
			})
		})
	}
	c := tlsClient(t, procAddrs(procs), alice)
	waitFor(t, ctx, "stream created", func() bool {
		_, err := c.CreateStream(ctx, client.StreamConfig{Name: "grown", RangeCount: 4})
		return err == nil || client.CodeOf(err) == client.CodeStreamExists
	})
	var admins []geologv1.AdminClient
	for _, pr := range procs {
		admins = append(admins, geologv1.NewAdminClient(nodeproc.Dial(t, pr.Addr, alice)))
	}
	r := rangeOnNode(t, ctx, admins, "grown", 4, 4)
	var base uint64
	waitFor(t, ctx, "append to the range on node 4", func() bool {
		for _, pr := range procs {
			resp, err := geologv1.NewLogClient(nodeproc.Dial(t, pr.Addr, alice)).Append(ctx,
				&geologv1.AppendRequest{Stream: "grown", Range: r, Records: []*geologv1.Record{{Value: []byte("on-4")}}})
			if err == nil {
				base = resp.GetBaseOffset()
				return true
			}
		}
		return false
	})
	// Node 4's own copy serves it.
	read, err := geologv1.NewLogClient(nodeproc.Dial(t, addr4, alice)).Read(ctx, &geologv1.ReadRequest{Stream: "grown", Range: r, FromOffset: base,
		MaxRecords: 1, Consistency: geologv1.Consistency_CONSISTENCY_MIN_OFFSET, MinOffset: base + 1})
	if err != nil || len(read.GetRecords()) != 1 || string(read.GetRecords()[0].GetValue()) != "on-4" {
		t.Fatalf("node 4 read of range %d: %v %v", r, read, err)
	}
}

// rangeOnNode returns a range of stream (of ranges) whose voters include
// node, asking the range leaders (whichever of admins leads).
func rangeOnNode(t *testing.T, ctx context.Context, admins []geologv1.AdminClient, stream string, ranges uint32, node uint64) uint32 {
	t.Helper()
	for r := uint32(0); r < ranges; r++ {
		var voters []uint64
		waitFor(t, ctx, fmt.Sprintf("range %d described", r), func() bool {
			for _, admin := range admins {
				d, err := admin.DescribeReplicas(ctx, &geologv1.DescribeReplicasRequest{Stream: stream, Range: r})
				if err != nil {
					continue
				}
				for _, rs := range d.GetReplicas() {
					if rs.GetRole() == "voter" {
						voters = append(voters, rs.GetNodeId())
					}
				}
				return true
			}
			return false
		})
		if slices.Contains(voters, node) {
			return r
		}
	}
	t.Fatalf("no range of %s on node %d", stream, node)
	return 0
}

// TestTLSNodeMovesProc: real geologd processes with TLS. Joined node 4
// restarts with its data directory at another address; it records the
// address in its own name, every node lists it there, and a range placed
// on it takes an append that node 4's own copy serves at the new address.
// It fails if the move is refused (NODE_ID_IN_USE, as before), a node
// keeps the old address, or node 4 is not reached at the new one.
func TestTLSNodeMovesProc(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real-process test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := nodeproc.NewPKI(t)
	procs := nodeproc.TLSRegion(t, p, "us", 3, "--tick", "50ms", "--superusers", "alice")
	alice := p.ClientDir("alice")
	dir4, addr4 := t.TempDir(), nodeproc.FreeAddr(t)
	flags4 := []string{"--region", "us", "--node-id", "4", "--join", procs[1].Addr, "--certs-dir", p.NodeDir("us", 4), "--tick", "50ms", "--superusers", "alice"}
	first := nodeproc.Start(t, dir4, addr4, flags4...)
	waitListedAt(t, ctx, procs, alice, 4, addr4)
	first.Stop()

	moved := nodeproc.FreeAddr(t)
	procs = append(procs, nodeproc.Start(t, dir4, moved, flags4...))
	waitListedAt(t, ctx, procs, alice, 4, moved)
	c := tlsClient(t, procAddrs(procs), alice)
	waitFor(t, ctx, "stream created", func() bool {
		_, err := c.CreateStream(ctx, client.StreamConfig{Name: "moved", RangeCount: 4})
		return err == nil || client.CodeOf(err) == client.CodeStreamExists
	})
	var admins []geologv1.AdminClient
	for _, pr := range procs {
		admins = append(admins, geologv1.NewAdminClient(nodeproc.Dial(t, pr.Addr, alice)))
	}
	r := rangeOnNode(t, ctx, admins, "moved", 4, 4)
	var base uint64
	waitFor(t, ctx, "append to the range on node 4", func() bool {
		for _, pr := range procs {
			resp, err := geologv1.NewLogClient(nodeproc.Dial(t, pr.Addr, alice)).Append(ctx,
				&geologv1.AppendRequest{Stream: "moved", Range: r, Records: []*geologv1.Record{{Value: []byte("moved-4")}}})
			if err == nil {
				base = resp.GetBaseOffset()
				return true
			}
		}
		return false
	})
	read, err := geologv1.NewLogClient(nodeproc.Dial(t, moved, alice)).Read(ctx, &geologv1.ReadRequest{Stream: "moved", Range: r, FromOffset: base,
		MaxRecords: 1, Consistency: geologv1.Consistency_CONSISTENCY_MIN_OFFSET, MinOffset: base + 1})
	if err != nil || len(read.GetRecords()) != 1 || string(read.GetRecords()[0].GetValue()) != "moved-4" {
		t.Fatalf("node 4's read of range %d at its new address: %v %v", r, read, err)
	}
}

// waitListedAt waits until every proc lists node id live at addr.
func waitListedAt(t *testing.T, ctx context.Context, procs []*nodeproc.Proc, alice string, id uint64, addr string) {
	t.Helper()
	for _, pr := range procs {
		admin := geologv1.NewAdminClient(nodeproc.Dial(t, pr.Addr, alice))
		waitFor(t, ctx, fmt.Sprintf("node %d listed at %s by %s", id, addr, pr.Addr), func() bool {
			resp, err := admin.ListNodes(ctx, &geologv1.ListNodesRequest{})
			return err == nil && slices.ContainsFunc(resp.GetNodes(), func(n *geologv1.NodeInfo) bool {
				return n.GetNodeId() == id && n.GetAddress() == addr && n.GetState() == geologv1.NodeState_NODE_STATE_LIVE
			})
		})
	}
}
