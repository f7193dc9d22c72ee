package regionsvc

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/geolog/geolog/membership"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
)

// A member's address change. A node restarted at another address with its
// data directory (and so its id) asks the region to record the new address
// (registerAddress): a Join in its own name at the new address, sent to
// the members it knows in turn. The region takes it as a move, not a join,
// when the id is a member's at another address and the request is
// authenticated as that node: with TLS, the first node to receive it checks
// that the caller's certificate names that id (authorizeJoin), and a
// member forwarding it to the catalogue leader is trusted to have checked.
// Without TLS nothing proves who asks, and the id at another address is
// refused as before (NODE_ID_IN_USE): change --peers on every node instead.
// The catalogue leader commits a "node-addr" record; every node applies
// it (membership.List.Move) and tells its transport, and the recorded
// address wins over --peers for that id from then on (members.go, peerAddr).

// checkJoinOrMove refuses, with a typed error, a join this node's copy of
// the list refuses; move reports a join that is an address change the
// region takes (see above).
func (n *Node) checkJoinOrMove(want membership.Node) (move bool, err error) {
	m := &n.region.members
	m.mu.RLock()
	defer m.mu.RUnlock()
	err = m.list.CheckJoin(want)
	if errors.Is(err, membership.ErrIDInUse) && n.secure() {
		if err := m.list.CheckMove(want); err != nil {
			return false, membershipError(err)
		}
		return true, nil
	}
	return false, membershipError(err)
}

// moveAsLeader commits the move of want to its address; NOT_LEADER if
// this node does not lead the catalogue.
func (n *Node) moveAsLeader(ctx context.Context, want membership.Node) error {
	if err := n.commitMeta(ctx, metaRecord{Op: opNodeAddr, Node: &nodeChange{ID: want.ID, Addr: want.Addr}}); err != nil {
		return err
	}
	if got, ok := n.memberNode(want.ID); !ok || got.Addr != want.Addr {
		// A racing change was applied first.
		_, err := n.checkJoinOrMove(want)
		return err
	}
	return nil
}

// addressRetryInterval is the pause between a moved node's attempts to
// record its address.
const addressRetryInterval = time.Second

// registerAddress records this node's address when the node list it saved
// holds another for it (see above); it retries until a member took it or
// ctx ends (a stopper task).
func (n *Node) registerAddress(ctx context.Context) {
	own := n.cfg.Peers[n.cfg.NodeID]
	m := &n.region.members
	m.mu.RLock()
	saved, ok := m.saved.Get(n.cfg.NodeID)
	m.mu.RUnlock()
	if !ok || own == "" || saved.Addr == own || saved.State == membership.Decommissioned {
		return
	}
	if !n.secure() {
		n.logger.Warn("this node's address changed; without TLS the region cannot verify the node, so it is not recorded: give every node's --peers the new address",
			"recorded", saved.Addr, "now", own)
		return
	}
	n.logger.Info("this node's address changed: recording it", "recorded", saved.Addr, "now", own)
	req := &geologinternalv1.JoinRequest{Region: n.cfg.Region, NodeId: n.cfg.NodeID, Address: own, Zone: n.cfg.Zone}
	for {
		err := n.askMembers(ctx, req)
		if err == nil {
			n.logger.Info("new address recorded", "addr", own)
			return
		}
		n.logger.Debug("record address: retrying", "addr", own, "error", err)
		select {
		case <-time.After(addressRetryInterval):
		case <-ctx.Done():
			return
		}
	}
}

// askMembers sends req to the region's other members in id order until one
// takes it.
func (n *Node) askMembers(ctx context.Context, req *geologinternalv1.JoinRequest) error {
	addrs := n.memberAddrs()
	ids := make([]uint64, 0, len(addrs))
	for id := range addrs {
		if id != n.cfg.NodeID {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	err := errors.New("no other member known")
	for _, id := range ids {
		conn, derr := n.peerConn(addrs[id])
		if derr != nil {
			err = derr
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, joinTimeout/4)
		_, err = geologinternalv1.NewNodeDirectoryClient(conn).Join(cctx, req)
		cancel()
		if err == nil {
			return nil
		}
	}
	return err
}
