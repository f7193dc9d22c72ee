package regionsvc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/membership"
	"github.com/geolog/geolog/pki"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// joinNode starts node id joining tr's region through member's address,
// and adds it to tr (its clients and cleanup); it returns the node's
// address, for startJoined.
func (tr *testRegion) joinNode(id, member uint64) string {
	tr.t.Helper()
	addr := freeAddr(tr.t)
	tr.dirs[id] = tr.t.TempDir()
	tr.startJoined(id, addr, member)
	return addr
}

// startJoined starts (or restarts) node id, which joins through member's
// address unless its data directory holds the node list already.
func (tr *testRegion) startJoined(id uint64, addr string, member uint64) {
	tr.t.Helper()
	cfg := Config{DataDir: tr.dirs[id], ListenAddr: addr, NodeID: id, Join: tr.peers[member], ReplicationFactor: tr.rf,
		TickInterval: testTick(20 * time.Millisecond), Fsync: 1,
		Logger: hclog.New(&hclog.LoggerOptions{Output: tWriter{tr.t}, Level: hclog.Warn})}
	if tr.mut != nil {
		tr.mut(&cfg)
	}
	n, err := New(cfg)
	if err != nil {
		tr.t.Fatalf("join node %d: %v", id, err)
	}
	if err := n.Start(); err != nil {
		tr.t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tr.t.Fatal(err)
	}
	tr.t.Cleanup(func() { conn.Close() })
	tr.nodes[id], tr.clients[id], tr.admins[id] = n, geologv1.NewLogClient(conn), geologv1.NewAdminClient(conn)
}

// waitNodes polls ListNodes on every node but except until want holds
// for each.
func (tr *testRegion) waitNodes(ctx context.Context, what string, want func([]*geologv1.NodeInfo) error, except ...uint64) {
	tr.t.Helper()
	for id, a := range tr.admins {
		if tr.nodes[id] == nil || slices.Contains(except, id) {
			continue // stopped, or left out
		}
		var last error
		for ctx.Err() == nil {
			resp, err := a.ListNodes(ctx, &geologv1.ListNodesRequest{})
			if last = err; err == nil {
				if last = want(resp.Nodes); last == nil {
					break
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		if last != nil {
			tr.t.Fatalf("%s on node %d: %v", what, id, last)
		}
	}
}

func nodeState(id uint64, st geologv1.NodeState) func([]*geologv1.NodeInfo) error {
	return func(nodes []*geologv1.NodeInfo) error {
		for _, n := range nodes {
			if n.NodeId == id {
				if n.State != st {
					return fmt.Errorf("node %d is %v", id, n.State)
				}
				return nil
			}
		}
		return fmt.Errorf("node %d not listed in %v", id, nodes)
	}
}

// voters returns the voters of every range of stream (asked of the
// range leaders, through any node).
func (tr *testRegion) voters(ctx context.Context, stream string, ranges uint32) [][]uint64 {
	tr.t.Helper()
	out := make([][]uint64, ranges)
	for r := uint32(0); r < ranges; r++ {
		var last any = "no answer"
		for out[r] == nil {
			if ctx.Err() != nil {
				tr.t.Fatalf("voters of %s range %d: %v; the last answer: %v", stream, r, ctx.Err(), last)
			}
			for id, a := range tr.admins {
				if tr.nodes[id] == nil {
					continue
				}
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second) // one node's hang is not the test's
				d, err := a.DescribeReplicas(cctx, &geologv1.DescribeReplicasRequest{Stream: stream, Range: r})
				cancel()
				if err != nil {
					last = fmt.Errorf("node %d: %w", id, err)
					continue
				}
				last = d
				for _, rs := range d.Replicas {
					if rs.Role == "voter" {
						out[r] = append(out[r], rs.NodeId)
					}
				}
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return out
}

// TestNodeJoinsRunningRegion: a 4th node joins a running 3-node region by
// one member's address (no restart, no flag change); it appears in every
// node's ListNodes, a stream created afterwards places replicas on it and
// it serves them; a drain and a decommission reach every node's list, a
// drained node takes no new replicas, and bad requests get typed errors.
// It fails if the joiner is not listed everywhere, gets no replica, cannot
// serve its range, or if a bad request is accepted.
// (The decommissioned node itself is not asked: it is cut off.)
func TestNodeJoinsRunningRegion(t *testing.T) {
	t.Parallel()
	tr := newTestRegion(t, 3)
	// Generous: a busy machine (make test beside other work) has taken
	// over a minute for the steps below.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	tr.createStream(ctx, "before", 3)
	tr.joinNode(4, 2)
	tr.waitNodes(ctx, "node 4 listed live", nodeState(4, geologv1.NodeState_NODE_STATE_LIVE))

	// Existing streams keep their replicas; a new one uses node 4.
	if v := tr.voters(ctx, "before", 3); slices.ContainsFunc(v, func(ids []uint64) bool { return slices.Contains(ids, 4) }) {
		t.Fatalf("stream created before the join moved to node 4: %v", v)
	}
	tr.createStream(ctx, "after", 4)
	after := tr.voters(ctx, "after", 4)
	var on4 []uint32
	for r, ids := range after {
		if slices.Contains(ids, 4) {
			on4 = append(on4, uint32(r))
		}
	}
	if len(on4) == 0 {
		t.Fatalf("no range of the new stream on the joined node: %v", after)
	}
	// Node 4 serves what it holds: an append through it reads back from it.
	tr.appendAndReadFrom(ctx, 4, "after", on4[0])
	tr.checkReplicationFactors(ctx)

	// Drain: every node applies it; a new stream avoids node 4.
	if _, err := tr.admins[1].SetNodeState(ctx, &geologv1.SetNodeStateRequest{NodeId: 4, State: geologv1.NodeState_NODE_STATE_DRAINING}); err != nil {
		t.Fatalf("drain: %v", err)
	}
	tr.waitNodes(ctx, "node 4 draining", nodeState(4, geologv1.NodeState_NODE_STATE_DRAINING))
	tr.createStream(ctx, "drained", 4)
	for r, ids := range tr.voters(ctx, "drained", 4) {
		if slices.Contains(ids, 4) {
			t.Fatalf("range %d of a stream created during the drain is on node 4: %v", r, ids)
		}
	}
	tr.checkBadMembership(ctx)
	if _, err := tr.admins[3].SetNodeState(ctx, &geologv1.SetNodeStateRequest{NodeId: 4, State: geologv1.NodeState_NODE_STATE_DECOMMISSIONED}); err != nil {
		t.Fatalf("decommission: %v", err)
	}
	// Not asked of node 4: its peers stop speaking Raft with it as they
	// apply the record, so it may never receive it.
	tr.waitNodes(ctx, "node 4 decommissioned", nodeState(4, geologv1.NodeState_NODE_STATE_DECOMMISSIONED), 4)
	tr.checkRetiredID(ctx)
}

// checkBadMembership: an unknown id and a duplicate address get
// NODE_NOT_FOUND and ADDRESS_IN_USE, with the membership sentinel as the
// cause in process.
func (tr *testRegion) checkBadMembership(ctx context.Context) {
	t := tr.t
	_, err := tr.admins[2].SetNodeState(ctx, &geologv1.SetNodeStateRequest{NodeId: 9, State: geologv1.NodeState_NODE_STATE_DRAINING})
	if rpcerr.CodeOf(err) != apierr.NodeNotFound {
		t.Fatalf("drain of unknown node 9: %v", err)
	}
	if err := tr.nodes[1].checkNodeState(9, membership.Draining); !errors.Is(err, membership.ErrUnknownNode) {
		t.Fatalf("in process, unknown node: %v", err)
	}
	_, err = tr.directory(1).Join(ctx, &geologinternalv1.JoinRequest{Region: "local", NodeId: 5, Address: tr.peers[2]})
	if rpcerr.CodeOf(err) != apierr.AddressInUse {
		t.Fatalf("join at node 2's address: %v", err)
	}
	if err := tr.nodes[3].checkJoin(membership.Node{ID: 5, Addr: tr.peers[2]}); !errors.Is(err, membership.ErrAddressInUse) {
		t.Fatalf("in process, duplicate address: %v", err)
	}
}

// checkRetiredID: a decommissioned id cannot join again, at any address.
func (tr *testRegion) checkRetiredID(ctx context.Context) {
	t := tr.t
	_, err := tr.directory(2).Join(ctx, &geologinternalv1.JoinRequest{Region: "local", NodeId: 4, Address: "127.0.0.1:1"})
	if rpcerr.CodeOf(err) != apierr.NodeIDRetired {
		t.Fatalf("join with decommissioned id 4: %v", err)
	}
	_, err = tr.admins[2].SetNodeState(ctx, &geologv1.SetNodeStateRequest{NodeId: 4, State: geologv1.NodeState_NODE_STATE_LIVE})
	if rpcerr.CodeOf(err) != apierr.NodeIDRetired {
		t.Fatalf("undrain of decommissioned node 4: %v", err)
	}
	if err := tr.nodes[1].checkJoin(membership.Node{ID: 4, Addr: "127.0.0.1:1"}); !errors.Is(err, membership.ErrIDRetired) {
		t.Fatalf("in process, reused id: %v", err)
	}
}

func (tr *testRegion) directory(id uint64) geologinternalv1.NodeDirectoryClient {
	conn, err := grpc.NewClient(tr.nodes[id].Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tr.t.Fatal(err)
	}
	tr.t.Cleanup(func() { conn.Close() })
	return geologinternalv1.NewNodeDirectoryClient(conn)
}

func (tr *testRegion) createStream(ctx context.Context, name string, ranges uint32) {
	tr.t.Helper()
	tr.createStreamReq(ctx, &geologv1.CreateStreamRequest{Name: name, RangeCount: ranges})
}

// createStreamReq creates req's stream through any node (a retry that
// finds it created counts).
func (tr *testRegion) createStreamReq(ctx context.Context, req *geologv1.CreateStreamRequest) {
	tr.t.Helper()
	tr.retry(ctx, "create "+req.Name, func(ctx context.Context, c geologv1.LogClient) error {
		_, err := c.CreateStream(ctx, req)
		if rpcerr.CodeOf(err) == apierr.StreamExists {
			return nil
		}
		return err
	})
}

// appendAndReadFrom appends one record to range r of stream (any node)
// and reads it back from node id's own copy.
func (tr *testRegion) appendAndReadFrom(ctx context.Context, id uint64, stream string, r uint32) {
	tr.t.Helper()
	// Every node, the joined one too (tr.retry asks the founders only): it
	// may lead the range.
	var err error
	for appended := false; !appended && ctx.Err() == nil; time.Sleep(20 * time.Millisecond) {
		for _, c := range tr.clients {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err = c.Append(cctx, &geologv1.AppendRequest{Stream: stream, Range: r, Records: []*geologv1.Record{{Value: []byte("v")}}})
			cancel()
			if appended = err == nil; appended {
				break
			}
		}
	}
	if ctx.Err() != nil {
		tr.t.Fatalf("append to range %d: %v", r, err)
	}
	for ctx.Err() == nil {
		rr, err := tr.clients[id].Read(ctx, &geologv1.ReadRequest{Stream: stream, Range: r, MaxRecords: 10})
		if err == nil && len(rr.Records) >= 1 && string(rr.Records[0].Value) == "v" { // a timed-out attempt may have committed too
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	tr.t.Fatalf("node %d did not serve its range %d", id, r)
}

// TestJoinedNodeRestarts: a joined node and a founding node restart (the
// joiner with --join still set: it reopens from its saved node list, it
// does not join again); both list the region's four nodes and a stream
// created afterwards is served by the joined node. It fails if either
// restart loses the node list or the joined node cannot serve.
func TestJoinedNodeRestarts(t *testing.T) {
	t.Parallel()
	tr := newTestRegion(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	addr4 := tr.joinNode(4, 3)
	tr.waitNodes(ctx, "node 4 listed", nodeState(4, geologv1.NodeState_NODE_STATE_LIVE))
	tr.stop(4)
	tr.stop(1)
	tr.start(1)
	tr.startJoined(4, addr4, 3)
	tr.waitNodes(ctx, "node 4 listed after restarts", nodeState(4, geologv1.NodeState_NODE_STATE_LIVE))
	// Created through the joined node: a learner of the catalogue, it
	// forwards the creation to the catalogue leader.
	var err error
	for ctx.Err() == nil {
		if _, err = tr.clients[4].CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "s", RangeCount: 4}); err == nil || rpcerr.CodeOf(err) == apierr.StreamExists {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ctx.Err() != nil {
		t.Fatalf("create through the joined node: %v", err)
	}
	for r, ids := range tr.voters(ctx, "s", 4) {
		if slices.Contains(ids, 4) {
			tr.appendAndReadFrom(ctx, 4, "s", uint32(r))
			return
		}
	}
	t.Fatal("no range on the joined node")
}

// TestZonesSpreadNewRanges: founding nodes record their --zone in the
// catalogue (a founder's zone is not in the others' --peers), and a new
// range's replicas span three zones: with nodes 1 and 2 in zone a, 3 in b
// and 4 in c, no range is on both 1 and 2. It fails if a zone is not
// listed on every node or a range doubles up in zone a.
func TestZonesSpreadNewRanges(t *testing.T) {
	t.Parallel()
	zones := map[uint64]string{1: "a", 2: "a", 3: "b", 4: "c"}
	tr := newTestRegionWith(t, 4, 3, func(c *Config) { c.Zone = zones[c.NodeID] })
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	tr.waitNodes(ctx, "zones recorded", func(nodes []*geologv1.NodeInfo) error {
		for _, n := range nodes {
			if n.Zone != zones[n.NodeId] {
				return fmt.Errorf("node %d in zone %q", n.NodeId, n.Zone)
			}
		}
		return nil
	})
	tr.createStream(ctx, "z", 4)
	for r, ids := range tr.voters(ctx, "z", 4) {
		if slices.Contains(ids, 1) && slices.Contains(ids, 2) {
			t.Fatalf("range %d on both nodes of zone a: %v", r, ids)
		}
	}
}

// TestJoinIdentity: with TLS, a node joins in its own name only; a node of
// the region may forward a join, a stranger may not. It fails if a
// forged join is admitted or an honest one refused.
func TestJoinIdentity(t *testing.T) {
	t.Parallel()
	n := &Node{cfg: Config{TLS: &tls.Config{}, Region: "local"}, region: &region{}}
	n.region.members.list = &membership.List{}
	if err := n.region.members.list.Seed([]membership.Node{{ID: 1, Addr: "h:1"}, {ID: 2, Addr: "h:2"}}); err != nil {
		t.Fatal(err)
	}
	req := &geologinternalv1.JoinRequest{Region: "local", NodeId: 4, Address: "h:4"}
	forwarded := func(ctx context.Context) context.Context {
		return metadata.NewIncomingContext(ctx, metadata.Pairs(forwardedKey, "1"))
	}
	for _, c := range []struct {
		what string
		ctx  context.Context
		code apierr.Code // 0: admitted
	}{
		{"node 4 itself", callerCtx(t, pki.NodeIdentity("local", 4)), 0},
		{"node 5 in 4's name", callerCtx(t, pki.NodeIdentity("local", 5)), apierr.PermissionDenied},
		{"node 4 of another region", callerCtx(t, pki.NodeIdentity("eu", 4)), apierr.PermissionDenied},
		{"a client", callerCtx(t, pki.ClientIdentity("alice")), apierr.PermissionDenied},
		{"member 2 forwarding", forwarded(callerCtx(t, pki.NodeIdentity("local", 2))), 0},
		{"stranger 9 forwarding", forwarded(callerCtx(t, pki.NodeIdentity("local", 9))), apierr.PermissionDenied},
		{"no certificate", context.Background(), apierr.Unauthenticated},
	} {
		err := n.authorizeJoin(c.ctx, req)
		if got := apierr.As(err); (c.code == 0) != (err == nil) || (err != nil && got.Code != c.code) {
			t.Errorf("%s: %v, want code %v", c.what, err, c.code)
		}
	}
}

// checkReplicationFactors (4 live nodes): a stream of replication factor 1
// has one voter per range; 5 (more than the live nodes) and 2 (not a
// setting) are INVALID_ARGUMENT.
func (tr *testRegion) checkReplicationFactors(ctx context.Context) {
	t := tr.t
	tr.createStreamReq(ctx, &geologv1.CreateStreamRequest{Name: "rf1", RangeCount: 2, ReplicationFactor: 1})
	for r, ids := range tr.voters(ctx, "rf1", 2) {
		if len(ids) != 1 {
			t.Fatalf("rf1 range %d voters %v, want one", r, ids)
		}
	}
	for _, rf := range []uint32{5, 2} {
		_, err := tr.clients[1].CreateStream(ctx, &geologv1.CreateStreamRequest{Name: fmt.Sprintf("rf%d", rf), RangeCount: 1, ReplicationFactor: rf})
		if rpcerr.CodeOf(err) != apierr.InvalidArgument {
			t.Fatalf("replication factor %d on 4 live nodes: %v", rf, err)
		}
	}
}
