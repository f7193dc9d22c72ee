package regionsvc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/grpcdial"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/membership"
	"github.com/geolog/geolog/pki"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// Joining a running region (Config.Join):
//
//  1. The joiner calls NodeDirectory.Join on the member it was given, in
//     its own name (with TLS, the member checks that the caller's
//     certificate names this region and the id the request asks for: an id
//     cannot be taken by another node).
//  2. A member that does not lead the catalogue forwards the request to the
//     leader (x-geolog-forwarded; the leader takes it from a node of the
//     region only).
//  3. The leader proposes a "node-join" record and waits until it applied
//     it: from then on every node that applied it reaches the joiner and
//     takes Raft from it. The leader then adds the joiner to the catalogue
//     group as a learner and answers with the node list.
//  4. The joiner saves the list and opens its copy of the catalogue (its
//     first voters are the list's seeds); the leader ships it the whole
//     catalogue, and the joiner opens every stream as the others do.
//
// Every step can be repeated: a join of a member at its own address
// changes nothing but its zone, and adding an existing learner is a no-op;
// a joiner that failed after step 3 joins again on its next start.

// joinTimeout bounds a joiner's attempts (the region may be electing a
// catalogue leader).
const joinTimeout = 60 * time.Second

// joinRetryInterval is the pause between a joiner's attempts.
const joinRetryInterval = 200 * time.Millisecond

// joinRegion joins the region through Config.Join and returns its node list.
func (n *Node) joinRegion() (*membership.List, error) {
	if _, port, err := net.SplitHostPort(n.cfg.ListenAddr); err != nil || port == "0" {
		return nil, fmt.Errorf("regionsvc: Join: ListenAddr %q must name the port the region's nodes reach this one at", n.cfg.ListenAddr)
	}
	conn, err := grpcdial.Dial(n.cfg.Join, n.peerDialConfig())
	if err != nil {
		return nil, fmt.Errorf("regionsvc: Join %s: %w", n.cfg.Join, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), joinTimeout)
	defer cancel()
	req := &geologinternalv1.JoinRequest{Region: n.cfg.Region, NodeId: n.cfg.NodeID, Address: n.cfg.ListenAddr, Zone: n.cfg.Zone}
	for {
		resp, err := geologinternalv1.NewNodeDirectoryClient(conn).Join(ctx, req)
		if err == nil {
			return listFromJoin(resp)
		}
		err = rpcerr.FromError(err)
		if !rpcerr.IsRetriable(err) || ctx.Err() != nil {
			return nil, fmt.Errorf("regionsvc: Join %s as node %d: %w", n.cfg.Join, n.cfg.NodeID, err)
		}
		n.logger.Info("join: retrying", "member", n.cfg.Join, "error", err)
		select {
		case <-time.After(joinRetryInterval):
		case <-ctx.Done():
		}
	}
}

// listFromJoin is the node list a Join answered (checked: it came from
// the network).
func listFromJoin(resp *geologinternalv1.JoinResponse) (*membership.List, error) {
	nodes := make([]membership.Node, 0, len(resp.GetMembers()))
	for _, m := range resp.GetMembers() {
		st, err := membership.ParseState(m.GetState())
		if err != nil {
			return nil, fmt.Errorf("regionsvc: Join answer: %w", err)
		}
		nodes = append(nodes, membership.Node{ID: m.GetNodeId(), Addr: m.GetAddress(), Zone: m.GetZone(), State: st, Seed: m.GetSeed()})
	}
	list, err := membership.FromNodes(nodes)
	if err != nil {
		return nil, fmt.Errorf("regionsvc: Join answer: %w", err)
	}
	if len(list.Seeds()) == 0 {
		return nil, errors.New("regionsvc: Join answer lists no founding node")
	}
	return list, nil
}

// Join implements the NodeDirectory's Join (see the steps above).
func (s *directoryServer) Join(ctx context.Context, req *geologinternalv1.JoinRequest) (*geologinternalv1.JoinResponse, error) {
	n := s.node
	if err := n.authorizeJoin(ctx, req); err != nil {
		return nil, err
	}
	if req.GetRegion() != n.cfg.Region {
		return nil, apierr.New(apierr.InvalidArgument, "node %d asks to join region %q; this is region %q", req.GetNodeId(), req.GetRegion(), n.cfg.Region)
	}
	want := membership.Node{ID: req.GetNodeId(), Addr: req.GetAddress(), Zone: req.GetZone()}
	move, err := n.checkJoinOrMove(want) // members_move.go
	if err != nil {
		return nil, err
	}
	if move {
		err = n.moveAsLeader(ctx, want)
	} else {
		err = n.joinAsLeader(ctx, want)
	}
	if err == nil {
		return joinResponse(n.memberNodes()), nil
	}
	if apierr.As(err).Code != apierr.NotLeader || isForwarded(ctx) {
		return nil, err
	}
	var resp *geologinternalv1.JoinResponse
	err = n.forwardToCatalogueLeader(ctx, func(ctx context.Context, conn *grpc.ClientConn) error {
		var err error
		resp, err = geologinternalv1.NewNodeDirectoryClient(conn).Join(ctx, req)
		return err
	})
	return resp, err
}

// authorizeJoin admits, with TLS, the node the request names (its
// certificate names this region and that id), or a node of the region that
// forwards the request.
func (n *Node) authorizeJoin(ctx context.Context, req *geologinternalv1.JoinRequest) error {
	if !n.secure() {
		return nil
	}
	id, err := pki.PeerIdentity(ctx)
	switch {
	case err != nil:
		return apierr.Wrap(apierr.Unauthenticated, err, "join")
	case isForwarded(ctx) && id.IsNode() && id.Region == n.cfg.Region && n.isRegionPeer(id.NodeID):
		return nil
	case id != pki.NodeIdentity(n.cfg.Region, req.GetNodeId()):
		return apierr.New(apierr.PermissionDenied, "the caller is %s: a node joins in its own name (node %d of region %s)", id.Name(), req.GetNodeId(), n.cfg.Region)
	}
	return nil
}

// checkJoin refuses, with a typed error, a join this node's copy of the
// list refuses (the catalogue's apply decides in the end).
func (n *Node) checkJoin(want membership.Node) error {
	m := &n.region.members
	m.mu.RLock()
	defer m.mu.RUnlock()
	return membershipError(m.list.CheckJoin(want))
}

// joinAsLeader commits the join of want and adds it to the catalogue
// group as a learner; NOT_LEADER if this node does not lead the catalogue.
func (n *Node) joinAsLeader(ctx context.Context, want membership.Node) error {
	if err := n.commitMeta(ctx, metaRecord{Op: opNodeJoin, Node: &nodeChange{ID: want.ID, Addr: want.Addr, Zone: want.Zone}}); err != nil {
		return err
	}
	if got, ok := n.memberNode(want.ID); !ok || got.Addr != want.Addr || got.State == membership.Decommissioned {
		// A racing join or decommission was applied first.
		return membershipError(n.checkJoin(want))
	}
	return n.changeCatalogueConf(ctx, raftpb.ConfChangeAddLearnerNode, want.ID)
}

// commitMeta proposes a catalogue record and waits until this node applied
// it; NOT_LEADER if this node does not lead the catalogue.
func (n *Node) commitMeta(ctx context.Context, rec metaRecord) error {
	res, err := n.proposeMeta(ctx, rec)
	if err != nil {
		return err
	}
	if res.err != nil {
		return res.err
	}
	return n.waitMetaApplied(ctx, rec.Op, res.baseOffset+1)
}

func joinResponse(nodes []membership.Node) *geologinternalv1.JoinResponse {
	resp := &geologinternalv1.JoinResponse{}
	for _, m := range nodes {
		resp.Members = append(resp.Members, &geologinternalv1.JoinMember{NodeId: m.ID, Address: m.Addr, Zone: m.Zone, State: m.State.String(), Seed: m.Seed})
	}
	return resp
}

// forwardToCatalogueLeader runs call against the catalogue leader, marked
// forwarded (it is never forwarded again).
func (n *Node) forwardToCatalogueLeader(ctx context.Context, call func(ctx context.Context, conn *grpc.ClientConn) error) error {
	return n.askCatalogueLeader(metadata.AppendToOutgoingContext(ctx, forwardedKey, "1"), call)
}

// askCatalogueLeader runs call against the catalogue leader.
func (n *Node) askCatalogueLeader(ctx context.Context, call func(ctx context.Context, conn *grpc.ClientConn) error) error {
	leader := n.region.meta.rep.LeaderID()
	addr := n.peerAddr(leader)
	if leader == 0 || leader == n.cfg.NodeID || addr == "" {
		return apierr.New(apierr.Unavailable, "the catalogue has no leader this node can reach")
	}
	conn, err := n.peerConn(addr)
	if err != nil {
		return apierr.Wrap(apierr.Unavailable, err, "forward to %s", addr)
	}
	if err := call(ctx, conn); err != nil {
		return rpcerr.FromError(err)
	}
	return nil
}

// changeCatalogueConf adds node id to the catalogue group as a learner
// (typ ConfChangeAddLearnerNode; nothing if it is a member), or removes it
// if it is a learner (ConfChangeRemoveNode; voters are replaced and
// removed by the catalogue leader's keepCatalogueVoters, members_voters.go,
// which promotes a learner first).
func (n *Node) changeCatalogueConf(ctx context.Context, typ raftpb.ConfChangeType, id uint64) error {
	meta := n.region.meta
	done := make(chan error, 1)
	err := meta.exec(ctx, func() {
		conf := meta.rep.Conf()
		voter, learner := contains(conf.GetVoters(), id), contains(conf.GetLearners(), id)
		if (typ == raftpb.ConfChangeAddLearnerNode && (voter || learner)) || (typ == raftpb.ConfChangeRemoveNode && !learner) {
			done <- nil
			return
		}
		cc := &raftpb.ConfChangeV2{Changes: []*raftpb.ConfChangeSingle{{Type: typ.Enum(), NodeId: proto.Uint64(id)}}}
		meta.rep.ProposeConfChange(cc, func(_ *raftpb.ConfState, err error) { done <- err })
	})
	if err != nil {
		return err
	}
	select {
	case err := <-done:
		if err != nil {
			return apierr.Wrap(apierr.Unavailable, err, "catalogue membership change for node %d", id)
		}
		return nil
	case <-ctx.Done():
		return apierr.Wrap(apierr.Timeout, ctx.Err(), "catalogue membership change for node %d", id)
	}
}

// zoneRetryInterval is the pause between a node's attempts to record its
// zone.
const zoneRetryInterval = time.Second

// registerZone records this node's Config.Zone in the catalogue when the
// node list holds another (a founding node's zone, unknown to the others'
// --peers, or a zone changed by a restart with another --zone): a join of
// its own id at its own address, which changes nothing but the zone. It
// retries until the zone is recorded or ctx ends.
func (n *Node) registerZone(ctx context.Context) {
	// The list is rebuilt from the founding nodes as the catalogue
	// replays: first let it apply what this node holds committed, or every
	// restart would record the zone again.
	if err := n.waitMetaApplied(ctx, "zone", n.region.meta.committed.Load()); err != nil {
		return
	}
	for {
		m, ok := n.memberNode(n.cfg.NodeID)
		if !ok || m.Zone == n.cfg.Zone || m.State == membership.Decommissioned {
			return
		}
		want := membership.Node{ID: m.ID, Addr: m.Addr, Zone: n.cfg.Zone}
		err := n.joinAsLeader(ctx, want)
		if err != nil && apierr.As(err).Code == apierr.NotLeader {
			// Asked of the leader in this node's own name, as a joiner asks.
			req := &geologinternalv1.JoinRequest{Region: n.cfg.Region, NodeId: m.ID, Address: m.Addr, Zone: n.cfg.Zone}
			err = n.askCatalogueLeader(ctx, func(ctx context.Context, conn *grpc.ClientConn) error {
				_, err := geologinternalv1.NewNodeDirectoryClient(conn).Join(ctx, req)
				return err
			})
		}
		if err != nil {
			n.logger.Debug("record zone: retrying", "zone", n.cfg.Zone, "error", err)
		}
		select {
		case <-time.After(zoneRetryInterval):
		case <-ctx.Done():
			return
		}
	}
}
