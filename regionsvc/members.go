package regionsvc

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"sort"
	"sync"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/membership"
	"github.com/geolog/geolog/placement"
	"github.com/geolog/geolog/raftnet"
	"github.com/geolog/geolog/vfs"
)

// Membership (docs/operator-guide.md, "Growing a region"). The region's
// node list is the founding nodes (--peers of the first start, the seeds)
// plus the catalogue's membership records, applied in log order by package
// membership: "node-join" (a node joined, members_join.go) and
// "node-state" (drained, back to live, decommissioned;
// members_admin.go). A node opens with the founding nodes only and its
// catalogue replays every record from the first, at each start: every node
// holds the same list at the same catalogue offset (a record replayed over
// a later list could apply where it was refused: see
// membership/testdata/grow.txt). It also keeps the last list it knew in
// <data-dir>/members.json (merged with what it applied: membership.Merge),
// whose addresses it uses until the replay has caught up, so that after a
// restart it reaches nodes that joined before the catalogue replays. The
// Raft transport learns every member's address, and refuses Raft from an
// id that is not a member or was decommissioned in either list
// (authorizeRaftPeer).
//
// An address in --peers wins over the list's for the ids it names (a
// region started with a static --peers keeps working as it did).

// The catalogue ops of the node list.
const (
	opNodeJoin  = "node-join"
	opNodeState = "node-state"
	// opNodeAddr records a member's new address (members_move.go).
	opNodeAddr = "node-addr"
)

// isNodeOp reports whether a catalogue record's op changes the node list.
func isNodeOp(op string) bool { return op == opNodeJoin || op == opNodeState || op == opNodeAddr }

// nodeChange is a catalogue record's change of the node list.
type nodeChange struct {
	ID    uint64           `json:"id"`
	Addr  string           `json:"addr,omitempty"`
	Zone  string           `json:"zone,omitempty"`
	State membership.State `json:"state,omitempty"`
}

// membersFile is the applied node list inside the data directory.
const membersFile = "members.json"

// membersVersion is the on-disk version of membersFile.
const membersVersion = 1

// membersBytesMax bounds membersFile as read at start.
const membersBytesMax = 16 << 20

type membersDisk struct {
	Version int              `json:"version"`
	Nodes   *membership.List `json:"nodes"`
}

// memberTable is a node's copy of its region's node list.
type memberTable struct {
	mu sync.RWMutex
	// list is the list as applied from the catalogue (from the founding
	// nodes on), saved the last one known (membersFile): a node there may
	// not be applied yet after a restart.
	list, saved *membership.List
}

// openMembers loads the node list, or makes it: seeded from Config.Peers
// (or, in a region of one, from this node), or from the answer of the
// member Config.Join names. It sets rg.ids, the catalogue group's first
// voters: Config.Peers' ids as before membership, else the seeds.
func (n *Node) openMembers(rg *region) error {
	list, err := loadMembers(n.cfg.fsys(), n.cfg.DataDir)
	if err != nil {
		return err
	}
	if list == nil {
		if list, err = n.firstMembers(); err != nil {
			return err
		}
		if err := saveMembers(n.cfg.fsys(), n.cfg.DataDir, list); err != nil {
			return err
		}
	}
	rg.members.saved = list
	rg.members.list = &membership.List{}
	if err := rg.members.list.Seed(list.Founding()); err != nil {
		return fmt.Errorf("regionsvc: %s: %w", membersFile, err)
	}
	for id := range n.cfg.Peers {
		rg.ids = append(rg.ids, id)
	}
	if len(rg.ids) == 0 {
		rg.ids = list.Seeds()
	}
	if len(rg.ids) == 0 {
		return fmt.Errorf("regionsvc: %s lists no founding node", membersFile)
	}
	sort.Slice(rg.ids, func(i, j int) bool { return rg.ids[i] < rg.ids[j] })
	// A joined node's default replication factor is bounded by the seeds
	// as a founding node's is by --peers (Config.setReplicationDefaults).
	n.cfg.ReplicationFactor = min(n.cfg.ReplicationFactor, len(rg.ids))
	if len(n.cfg.Peers) == 0 && n.cfg.Join != "" {
		// A joined node's Peers are the members it knows as it opens (set
		// before any goroutine reads the configuration), so that code that
		// looks nodes up in Peers finds them as on a founding node; nodes
		// that join later are known through peerAddr and memberAddrs.
		// Its own entry is the address it listens at: the one it joined
		// with, or a new one it moves to (members_move.go).
		n.cfg.Peers = rg.members.peerAddrs(nil)
		n.cfg.Peers[n.cfg.NodeID] = n.cfg.ListenAddr
	}
	return nil
}

// firstMembers is the node list of a node's first start.
func (n *Node) firstMembers() (*membership.List, error) {
	list := &membership.List{}
	switch {
	case len(n.cfg.Peers) > 0:
		var seeds []membership.Node
		for id, addr := range n.cfg.Peers {
			seeds = append(seeds, membership.Node{ID: id, Addr: addr})
		}
		if err := list.Seed(seeds); err != nil {
			return nil, fmt.Errorf("regionsvc: --peers: %w", err)
		}
		return list, nil
	case n.cfg.Join != "":
		return n.joinRegion() // members_join.go
	}
	addr := n.cfg.AdvertiseAddr
	if addr == "" {
		addr = n.cfg.ListenAddr
	}
	if err := list.Seed([]membership.Node{{ID: n.cfg.NodeID, Addr: addr, Zone: n.cfg.Zone}}); err != nil {
		return nil, fmt.Errorf("regionsvc: region of one: %w", err)
	}
	return list, nil
}

// loadMembers reads membersFile; nil without error if there is none.
func loadMembers(fsys vfs.FS, dataDir string) (*membership.List, error) {
	b, err := vfs.ReadFile(fsys, filepath.Join(dataDir, membersFile), membersBytesMax)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("regionsvc: read %s: %w", membersFile, err)
	}
	d := membersDisk{Nodes: &membership.List{}}
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("regionsvc: %s is corrupt: %w", membersFile, err)
	}
	if d.Version != membersVersion {
		return nil, fmt.Errorf("regionsvc: %s version %d, this build reads %d", membersFile, d.Version, membersVersion)
	}
	return d.Nodes, nil
}

// saveMembers replaces membersFile atomically and durably.
func saveMembers(fsys vfs.FS, dataDir string, list *membership.List) error {
	b, err := json.MarshalIndent(membersDisk{Version: membersVersion, Nodes: list}, "", "  ")
	if err != nil {
		return err
	}
	if err := vfs.WriteFileAtomic(fsys, filepath.Join(dataDir, membersFile), b, 0o600); err != nil {
		return fmt.Errorf("regionsvc: save %s: %w", membersFile, err)
	}
	return nil
}

// memberNode returns node id as this node's list holds it.
func (n *Node) memberNode(id uint64) (membership.Node, bool) {
	if n.region == nil {
		return membership.Node{}, false
	}
	m := &n.region.members
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.list == nil {
		return membership.Node{}, false
	}
	return m.list.Get(id)
}

// memberNodes returns a copy of the node list, by id.
func (n *Node) memberNodes() []membership.Node {
	if n.region == nil {
		return nil
	}
	m := &n.region.members
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.list == nil {
		return nil
	}
	return m.list.Nodes()
}

// peerAddr is the address node id of the region is reached at: --peers'
// if it names the id, else the node list's; "" for an unknown or
// decommissioned node.
func (n *Node) peerAddr(id uint64) string {
	if n.region == nil {
		return n.cfg.Peers[id]
	}
	return n.region.members.peerAddr(id, n.cfg.Peers)
}

// memberAddrs maps every node of the region that is not decommissioned,
// this one included, to its address (peerAddr).
func (n *Node) memberAddrs() map[uint64]string {
	if n.region == nil {
		return n.cfg.Peers
	}
	return n.region.members.peerAddrs(n.cfg.Peers)
}

// peerAddr is Node.peerAddr, static being --peers: a moved node's
// recorded address, else static's, else the applied list's address, else
// the saved list's; "" if either list says decommissioned.
func (m *memberTable) peerAddr(id uint64, static map[uint64]string) string {
	m.mu.RLock()
	var applied, saved membership.Node
	if m.list != nil {
		applied, _ = m.list.Get(id)
		saved, _ = m.saved.Get(id)
	}
	m.mu.RUnlock()
	switch {
	case applied.State == membership.Decommissioned || saved.State == membership.Decommissioned:
		return ""
	case applied.Moved:
		return applied.Addr
	case saved.Moved:
		return saved.Addr
	}
	if a := static[id]; a != "" {
		return a
	}
	if applied.Addr != "" {
		return applied.Addr
	}
	return saved.Addr
}

// peerAddrs is Node.memberAddrs, static being --peers.
func (m *memberTable) peerAddrs(static map[uint64]string) map[uint64]string {
	ids := make([]uint64, 0, len(static))
	for id := range static {
		ids = append(ids, id)
	}
	m.mu.RLock()
	if m.list != nil {
		for _, node := range membership.Merge(m.list, m.saved).Nodes() {
			ids = append(ids, node.ID)
		}
	}
	m.mu.RUnlock()
	out := map[uint64]string{}
	for _, id := range ids {
		if a := m.peerAddr(id, static); a != "" {
			out[id] = a
		}
	}
	return out
}

// isKnownPeerAddr reports whether addr is some member's address.
func (n *Node) isKnownPeerAddr(addr string) bool {
	for _, a := range n.memberAddrs() {
		if a == addr {
			return true
		}
	}
	return false
}

// applyNodeRecord applies a committed change of the node list (on the
// catalogue driver's goroutine): the list, its file, the transport. A
// change the list refuses (a join racing another for the same address)
// is refused alike on every node, and changes nothing.
func (n *Node) applyNodeRecord(at uint64, rec metaRecord) {
	c := rec.Node
	if c == nil {
		n.logger.Error("catalogue node record without a node; skipped", "offset", at)
		return
	}
	m := &n.region.members
	m.mu.Lock()
	var changed bool
	var err error
	switch rec.Op {
	case opNodeJoin:
		changed, err = m.list.Join(membership.Node{ID: c.ID, Addr: c.Addr, Zone: c.Zone})
	case opNodeState:
		changed, err = m.list.SetState(c.ID, c.State)
	case opNodeAddr:
		changed, err = m.list.Move(membership.Node{ID: c.ID, Addr: c.Addr})
	}
	if changed {
		m.saved = membership.Merge(m.list, m.saved)
	}
	snapshot := m.saved
	node, _ := m.list.Get(c.ID)
	m.mu.Unlock()
	if err != nil {
		n.logger.Warn("catalogue node change refused", "offset", at, "op", rec.Op, "node", c.ID, "error", err)
		return
	}
	if !changed {
		return
	}
	// snapshot is never changed once published (Merge makes a new list).
	if err := saveMembers(n.cfg.fsys(), n.cfg.DataDir, snapshot); err != nil {
		n.logger.Error("save node list", "error", err)
	}
	n.syncPeer(c.ID)
	n.logger.Info("node list changed", "op", rec.Op, "node", c.ID, "addr", node.Addr, "zone", node.Zone, "state", node.State, "catalogue_offset", at)
}

// syncPeer tells the transport node id's address, or that it is gone.
func (n *Node) syncPeer(id uint64) {
	if id == n.cfg.NodeID {
		return
	}
	tr := n.region.transport
	if addr := n.peerAddr(id); addr != "" {
		if err := tr.SetPeer(raftnet.NodeID(id), addr); err != nil {
			n.logger.Warn("set peer", "node", id, "error", err)
		}
		return
	}
	tr.RemovePeer(raftnet.NodeID(id))
	tr.EndInbound(raftnet.NodeID(id))
}

// isRegionPeer reports whether id is a node of the region that is not
// decommissioned (Raft is taken from such nodes only).
func (n *Node) isRegionPeer(id uint64) bool { return n.peerAddr(id) != "" }

// rangeReplicas is range r's first voters: as the stream's creation
// placed them, or, for a stream created before placement, the region's
// first ids (the founding nodes), as many as the replication factor.
func (n *Node) rangeReplicas(spec streamSpec, r uint32) []uint64 {
	if reps := spec.replicasOf(r); reps != nil {
		return reps
	}
	return n.region.ids[:n.cfg.ReplicationFactor]
}

// placementRegion is the region as package placement sees it: the node
// list, and every stream's ranges with their replicas as created.
func (n *Node) placementRegion() placement.Region {
	var reg placement.Region
	seen := map[uint64]bool{}
	dead := n.deadNodes() // rebalance.go: unreachable past the dead-node time
	for _, m := range n.memberNodes() {
		seen[m.ID] = true
		st := placementState(m.State)
		if dead[m.ID] && st != placement.Decommissioned {
			st = placement.Dead
		}
		reg.Nodes = append(reg.Nodes, placement.Node{ID: m.ID, Zone: m.Zone, State: st})
	}
	for id := range n.cfg.Peers {
		if !seen[id] {
			reg.Nodes = append(reg.Nodes, placement.Node{ID: id})
		}
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	for _, st := range n.streams {
		for r := range st.ranges {
			reps := n.rangeReplicas(st.spec, uint32(r))
			reg.Ranges = append(reg.Ranges, placement.Range{ID: placement.RangeID{Stream: st.spec.Name, Range: uint32(r)},
				Replicas: reps, ReplicationFactor: len(reps)})
		}
	}
	return reg
}

func placementState(s membership.State) placement.NodeState {
	switch s {
	case membership.Draining:
		return placement.Draining
	case membership.Decommissioned:
		return placement.Decommissioned
	}
	return placement.Live
}

// placeRanges chooses the replicas of a new stream's ranges in this region
// over its live nodes (placement.ChooseEach): spread over zones, then the
// nodes with the fewest replicas.
func (n *Node) placeRanges(spec streamSpec) ([][]uint64, error) {
	rf := int(spec.ReplicationFactor)
	if rf == 0 {
		rf = n.cfg.ReplicationFactor
	}
	reps, err := placement.ChooseEach(n.placementRegion(), rf, int(spec.RangeCount))
	if errors.Is(err, placement.ErrNotEnoughNodes) {
		return nil, apierr.Wrap(apierr.InvalidArgument, err, "stream %q: replication factor %d: region %s has fewer live nodes", spec.Name, rf, n.cfg.Region)
	}
	if err != nil {
		return nil, apierr.Wrap(apierr.InvalidArgument, err, "stream %q", spec.Name)
	}
	for _, r := range reps {
		slices.Sort(r)
	}
	return reps, nil
}

// membershipCodes are the API codes of package membership's refusals; any
// other refusal (a bad id, address, zone or state) is INVALID_ARGUMENT.
var membershipCodes = []struct {
	sentinel error
	code     apierr.Code
}{
	{membership.ErrUnknownNode, apierr.NodeNotFound},
	{membership.ErrIDRetired, apierr.NodeIDRetired},
	{membership.ErrDecommissioned, apierr.NodeIDRetired},
	{membership.ErrIDInUse, apierr.NodeIDInUse},
	{membership.ErrAddressInUse, apierr.AddressInUse},
}

// membershipError maps a refusal of package membership to its API code,
// keeping it as the cause (errors.Is sees it).
func membershipError(err error) error {
	if err == nil {
		return nil
	}
	for _, c := range membershipCodes {
		if errors.Is(err, c.sentinel) {
			return apierr.Wrap(c.code, err, "%v", err)
		}
	}
	return apierr.Wrap(apierr.InvalidArgument, err, "%v", err)
}
