package regionsvc

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/geolog/geolog/internal/grpcdial"
	"github.com/geolog/geolog/rangecore"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/raftnet"
	"github.com/geolog/geolog/replica"
	"github.com/geolog/geolog/segment"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// Replicated mode: when Config.Peers is set, every range is a Raft group over
// the region's nodes, and so is the catalogue (group 1, the "meta" range,
// whose records are stream definitions). A stream exists on a node once its
// creation record is committed in the meta group and applied there.

// metaRecord is one catalogue record in the meta range.
type metaRecord struct {
	Op   string     `json:"op"` // "create", "delete" (delete.go), "alter" (alter.go) or "acl" (acl.go)
	Spec streamSpec `json:"spec"`
	// ACL is an "acl" record's change of an access rule.
	ACL *aclChange `json:"acl,omitempty"`
	// Nonce tells the creator its own record from a racing create of the
	// same name (the first committed wins).
	Nonce uint64 `json:"nonce"`
	// Node is a "node-join" or "node-state" record's change of the
	// region's node list (members.go).
	Node *nodeChange `json:"node,omitempty"`
	// Leaders is a "range-leaders" record's preferred leaders (leaders.go).
	Leaders []preferredRangeLeader `json:"leaders,omitempty"`
	// Reserve is a "split-reserve" record's split (split_reserve.go).
	Reserve *batch.Split `json:"reserve,omitempty"`
}

// region holds a node's replication machinery.
type region struct {
	transport *raftnet.GRPCTransport
	meta      *rangeDriver
	ids       []uint64
	// members is the region's node list (members.go).
	members memberTable
	// groups routes incoming Raft messages: guarded by Node.mu.
	groups map[raftnet.GroupID]*rangeDriver
	// metaOffsets: stream name → catalogue offset of its creation record.
	metaOffsets map[string]uint64
	// applied is closed and replaced when the catalogue applies a record.
	applied chan struct{}
	// metaApplied is the catalogue offset applied up to (exclusive).
	metaApplied atomic.Uint64
	// catalogueSavedTo is the catalogue offset the applied catalogue
	// loaded at start reflects (catalogDisk.AppliedTo): the replay skips
	// the stream records below it (set before the catalogue range opens).
	catalogueSavedTo uint64
	tickCh           chan struct{}
	// liveness is the peers' liveness as the ticker last saw it
	// (quiesce.go).
	liveness livenessWatch
	stopCh   chan struct{}
	// pace bounds the groups awake as new streams' ranges start
	// (openpace.go).
	pace openPace
}

func (n *Node) replicated() bool { return n.region != nil }

// openRegion starts the transport, the meta range and the shared ticker.
func (n *Node) openRegion() error {
	rg := &region{
		groups:      map[raftnet.GroupID]*rangeDriver{},
		metaOffsets: map[string]uint64{},
		applied:     make(chan struct{}),
		tickCh:      make(chan struct{}),
		liveness:    livenessWatch{ch: make(chan struct{})},
		stopCh:      make(chan struct{}),
	}
	if err := n.openMembers(rg); err != nil { // members.go: rg.ids too
		return err
	}
	tr, err := raftnet.NewGRPCTransport(raftnet.Config{
		NodeID:            raftnet.NodeID(n.cfg.NodeID),
		Handler:           (*raftRouter)(n),
		Logger:            n.cfg.Logger.Named("raftnet"),
		ClientCredentials: n.dialCredentials(),
		AuthorizePeer:     n.authorizeRaftPeer,
		// Entries are checked on receipt (frames, offsets, indexes): a
		// peer that sends a bad one loses its stream (replica/peercheck.go).
		CheckMessage: func(_ raftnet.GroupID, m *raftpb.Message) error { return replica.CheckPeerMessage(m) },
		// Within the node's receive limit: an entry is a frame.
		MessageBytesMax: n.cfg.raftMessageBytesMax(),
	})
	if err != nil {
		return fmt.Errorf("regionsvc: raft transport: %w", err)
	}
	for id, addr := range rg.members.peerAddrs(n.cfg.Peers) {
		if id != n.cfg.NodeID {
			if err := tr.SetPeer(raftnet.NodeID(id), addr); err != nil {
				return fmt.Errorf("regionsvc: peer %d: %w", id, err)
			}
		}
	}
	rg.transport = tr
	rg.pace.max = int64(cmp.Or(n.cfg.openAwakeMax, openAwakeMaxDefault))
	n.region = rg
	go n.ticker()
	go n.maintenanceSweep()
	// Streams this node applied before a restart (all committed) open at
	// once, from the applied catalogue it keeps, before the catalogue range
	// starts applying (which skips streams that exist).
	specs, savedTo, err := loadCatalog(n.cfg.fsys(), n.cfg.DataDir)
	if err != nil {
		return err
	}
	rg.catalogueSavedTo = savedTo
	for _, spec := range specs {
		n.addReplicatedStream(spec, false) // not paced: see openpace.go
	}
	rg.meta = openRangeDriver(n.rangeConfig(metaStreamName, 0, segment.Config{Dir: metaDir(n.cfg.DataDir)}, &replicationConfig{
		groupID:  metaGroupID,
		onCommit: n.applyMeta,
	}))
	n.mu.Lock()
	rg.groups[metaGroupID] = rg.meta
	n.mu.Unlock()
	if f := rg.meta.failure.Load(); f != nil {
		return fmt.Errorf("regionsvc: catalogue range: %w", f)
	}
	return nil
}

// metaStreamName names the catalogue's range in logs and metrics.
const metaStreamName = "_meta"

// ticker drives every replica's Raft clock from one goroutine (quiesced
// ones ignore it), and watches the peers' liveness for them (quiesce.go).
func (n *Node) ticker() {
	t := time.NewTicker(n.cfg.TickInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			n.watchLiveness()
			n.region.pace.admit() // openpace.go
			n.mu.Lock()
			close(n.region.tickCh)
			n.region.tickCh = make(chan struct{})
			n.mu.Unlock()
		case <-n.region.stopCh:
			return
		}
	}
}

func (n *Node) tick() <-chan struct{} {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.region.tickCh
}

// completeReplication fills in the node-wide parts of a range's replication.
func (n *Node) completeReplication(rc *replicationConfig) {
	rc.nodeID = n.cfg.NodeID
	if rc.peers == nil { // a stream's range: openRange sets rc.peers
		rc.peers = n.region.ids[:n.cfg.ReplicationFactor]
	}
	if rc.groupID == metaGroupID {
		rc.peers = n.region.ids
	} else {
		rc.pace = &n.region.pace // openpace.go
	}
	// The voter that campaigns when a group is created: spread over the
	// voters by group id, so that a new stream's range leaders (who do most
	// of the work: client appends, one append message per follower) start
	// spread over the region's nodes instead of all on the lowest id.
	rc.firstCampaigner = rangecore.PreferredLeader(uint64(rc.groupID), rc.peers)
	rc.transport = n.learnerTransport(rc.groupID) // rebalance_throttle.go
	rc.tick = n.tick
	rc.liveness = n.livenessChanged
	rc.addrOf = func(id uint64) string { return n.clientAddr(n.cfg.Region, id) }
	rc.snapshotBody = n.throttleSnapshot // rebalance_throttle.go
	rc.onRemoved = n.hintRemoved         // strayhint.go
	rc.peerGone = func(id uint64) bool { return !n.isRegionPeer(id) }
	rc.heartbeatTicks, rc.electionTicks = n.cfg.HeartbeatTicks, n.cfg.ElectionTicks
	if iv := n.cfg.LeaderBalanceInterval; iv > 0 {
		rc.leaderBalanceTicks = max(1, int(iv/n.cfg.TickInterval))
	}
}

// applyMeta applies newly committed catalogue records, on the meta
// driver's goroutine.
func (n *Node) applyMeta(d *rangeDriver, from, to uint64) {
	for off := from; off < to; {
		before := off
		frames, err := d.store.ReadFrames(off, 1<<20, to)
		if err != nil || len(frames) == 0 {
			n.logger.Error("read catalogue", "offset", off, "error", err)
			return
		}
		for len(frames) > 0 {
			size, err := batch.FrameSize(frames)
			if err != nil {
				n.logger.Error("catalogue frame", "error", err)
				return
			}
			h, recs, err := batch.Decode(frames[:size])
			frames = frames[size:]
			if err != nil {
				n.logger.Error("catalogue frame", "error", err)
				return
			}
			for i, rec := range recs {
				at := h.Offset(&recs[i])
				if at < off || at >= to {
					continue
				}
				n.applyMetaRecord(at, rec.Value)
				off = at + 1
			}
		}
		if off == before {
			n.logger.Error("catalogue read made no progress", "offset", off)
			return
		}
	}
	n.region.metaApplied.Store(to)
	n.mu.Lock()
	close(n.region.applied)
	n.region.applied = make(chan struct{})
	n.mu.Unlock()
}

// isStreamOp says whether a catalogue record's op changes a stream's
// definition (the records catalog.json reflects).
func isStreamOp(op string) bool {
	switch op {
	case "create", "delete", "alter", opSplit, opSplitReserve:
		return true
	}
	return false
}

// replayedStreamRecord is a stream record the catalogue group replays
// after a restart that the loaded applied catalogue already reflects: it
// is not applied again (a deleted stream's creation would open its ranges
// until its deletion replayed; an older alter would serve its values
// until the newer ones replayed). What the node keeps in memory alone of
// it is noted: which names it deleted (a retried DeleteStream answers as
// done).
func (n *Node) replayedStreamRecord(rec metaRecord) {
	switch rec.Op {
	case "create":
		n.forgetDeleted(rec.Spec.Name)
	case "delete":
		if _, ok := n.streamSpec(rec.Spec.Name); !ok {
			n.noteDeleted(rec.Spec.Name)
		}
	}
}

func (n *Node) applyMetaRecord(at uint64, value []byte) {
	var rec metaRecord
	err := json.Unmarshal(value, &rec)
	if err == nil && isNodeOp(rec.Op) {
		n.applyNodeRecord(at, rec) // members.go
		return
	}
	if err == nil && rec.Op == opRangeLeaders {
		n.applyRangeLeaders(at, rec) // leaders.go
		return
	}
	if err == nil && at < n.region.catalogueSavedTo && isStreamOp(rec.Op) {
		n.replayedStreamRecord(rec)
		return
	}
	if err == nil && rec.Op == opSplit {
		n.applySplit(at, rec.Spec) // split_apply.go
		return
	}
	if err == nil && rec.Op == opSplitReserve {
		n.applySplitReserve(at, rec) // split_reserve.go
		return
	}
	if err != nil || (rec.Op != "create" && rec.Op != "delete" && rec.Op != "alter" && rec.Op != "acl") {
		n.logger.Error("catalogue record not understood; skipped", "offset", at, "error", err)
		return
	}
	if rec.Op == "acl" {
		n.applyACLRecord(at, rec)
		return
	}
	if rec.Op == "delete" {
		n.applyDelete(at, rec.Spec)
		return
	}
	if rec.Op == "alter" {
		n.applyAlter(at, rec.Spec)
		return
	}
	n.mu.RLock()
	_, exists := n.streams[rec.Spec.Name]
	n.mu.RUnlock()
	if exists {
		return // a racing create of the same name: the first one won
	}
	spec := rec.Spec
	spec.MetaOffset = at
	n.addReplicatedStream(spec, true)
	n.forgetDeleted(spec.Name)
	// Remember what was applied, so that after a restart this node hosts
	// the stream's replicas at once instead of waiting for the catalogue
	// group to commit again (which, with another node down, can take a
	// quorum this node is needed for).
	n.mu.RLock()
	specs := make([]streamSpec, 0, len(n.streams))
	for _, st := range n.streams {
		specs = append(specs, st.spec)
	}
	n.mu.RUnlock()
	if err := saveCatalog(n.cfg.fsys(), n.cfg.DataDir, specs, at); err != nil {
		n.logger.Error("save applied catalogue", "error", err)
	}
	n.logger.Info("stream created", "stream", spec.Name, "ranges", spec.RangeCount, "catalogue_offset", at)
}

// addReplicatedStream opens a stream the catalogue committed; paced, its
// ranges open as few of the node's groups are awake (openpace.go).
func (n *Node) addReplicatedStream(spec streamSpec, paced bool) {
	st := n.openStreamAt(spec, spec.MetaOffset, paced)
	n.mu.Lock()
	n.streams[spec.Name] = st
	n.region.metaOffsets[spec.Name] = spec.MetaOffset
	for r, rd := range st.ranges {
		n.region.groups[groupFor(spec.MetaOffset, uint32(r))] = rd
	}
	n.mu.Unlock()
}

// createStreamReplicated proposes the stream to the catalogue and waits until
// this node applied it.
func (n *Node) createStreamReplicated(ctx context.Context, spec streamSpec, forwarded bool) error {
	n.mu.RLock()
	_, exists := n.streams[spec.Name]
	n.mu.RUnlock()
	if exists {
		return apierr.New(apierr.StreamExists, "stream %q already exists", spec.Name)
	}
	reps, err := n.placeRanges(spec) // members.go
	if err != nil {
		return err
	}
	spec.Replicas = reps
	res, err := n.proposeMeta(ctx, metaRecord{Op: "create", Spec: spec})
	if err != nil {
		return err
	}
	if res.err != nil {
		// The leader's peer address, not the error's hint: a hint is for
		// clients (an advertised address), this is a node's call.
		leader := n.region.meta.rep.LeaderID()
		e := apierr.As(res.err)
		if e.Code != apierr.NotLeader || forwarded || !n.catalogueLeaderUp() || leader == n.cfg.NodeID || n.peerAddr(leader) == "" {
			return res.err
		}
		// NOT_LEADER from the catalogue means the record was not proposed,
		// or was superseded and can never commit: forwarding is safe.
		if err := n.forwardCreate(ctx, n.peerAddr(leader), spec); err != nil {
			return err
		}
		return n.waitStreamApplied(ctx, spec.Name)
	}
	return n.waitOwnStream(ctx, spec.Name, res.baseOffset)
}

// catalogueLeaderUp reports whether this node knows a leader of the
// catalogue whose node the transport does not find down.
func (n *Node) catalogueLeaderUp() bool {
	id := n.region.meta.rep.LeaderID()
	return id != 0 && !n.region.meta.peerDown(id)
}

// proposeMeta proposes a catalogue record (with a fresh nonce) and returns
// its outcome; while the catalogue has no leader (a region starting or
// electing) it waits for one rather than fail.
func (n *Node) proposeMeta(ctx context.Context, rec metaRecord) (appendResult, error) {
	var nonceBytes [8]byte
	rand.Read(nonceBytes[:])
	rec.Nonce = binary.LittleEndian.Uint64(nonceBytes[:])
	value, err := json.Marshal(rec)
	if err != nil {
		return appendResult{}, err
	}
	for {
		frame := batch.Encode(nil, batch.Header{Type: batch.TypeData}, []batch.Record{{Key: []byte(rec.Spec.Name), Value: value}})
		done := make(chan appendResult, 1)
		n.region.meta.submit(ctx, &appendOp{recordCount: 1, frame: frame, reply: func(r appendResult) { done <- r }})
		var res appendResult
		select {
		case res = <-done:
		case <-ctx.Done():
			return appendResult{}, apierr.Wrap(apierr.Timeout, ctx.Err(), "%s stream %q", rec.Op, rec.Spec.Name)
		}
		// A leader whose node is down counts as none (hints name advertised
		// addresses, and a node may not know its leader's yet).
		if e := apierr.As(res.err); res.err == nil || e.Code != apierr.NotLeader || n.catalogueLeaderUp() {
			return res, nil
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return appendResult{}, apierr.Wrap(apierr.Unavailable, ctx.Err(), "%s stream %q: the catalogue has no leader", rec.Op, rec.Spec.Name)
		}
	}
}

// waitOwnStream waits until this node applied the record created at
// offset; a different record for the name means a racing create won.
func (n *Node) waitOwnStream(ctx context.Context, name string, offset uint64) error {
	for {
		n.mu.RLock()
		at, ok := n.region.metaOffsets[name]
		applied := n.region.applied
		n.mu.RUnlock()
		if ok {
			if at != offset {
				return apierr.New(apierr.StreamExists, "stream %q was created concurrently", name)
			}
			return nil
		}
		select {
		case <-applied:
		case <-ctx.Done():
			return apierr.Wrap(apierr.Timeout, ctx.Err(), "create stream %q: committed, not yet applied", name)
		}
	}
}

// waitStreamApplied waits until this node knows the stream.
func (n *Node) waitStreamApplied(ctx context.Context, name string) error {
	for {
		n.mu.RLock()
		_, ok := n.streams[name]
		applied := n.region.applied
		n.mu.RUnlock()
		if ok {
			return nil
		}
		select {
		case <-applied:
		case <-ctx.Done():
			return apierr.Wrap(apierr.Timeout, ctx.Err(), "create stream %q: created, not yet applied here", name)
		}
	}
}

// forwardedKey marks a request one node forwarded to another, so that it is
// never forwarded again.
const forwardedKey = "x-geolog-forwarded"

// forwardCreate sends a CreateStream to the catalogue leader.
func (n *Node) forwardCreate(ctx context.Context, addr string, spec streamSpec) error {
	conn, err := n.peerConn(addr)
	if err != nil {
		return apierr.Wrap(apierr.Unavailable, err, "forward to %s", addr)
	}
	_, err = geologv1.NewLogClient(conn).CreateStream(metadata.AppendToOutgoingContext(ctx, forwardedKey, "1"), createRequest(spec))
	if err != nil {
		return rpcerr.FromError(err)
	}
	return nil
}

// peerConn returns a client connection to another node of the region, or
// of another region (regionAddrs); the bound is the nodes configured and
// learned.
func (n *Node) peerConn(addr string) (*grpc.ClientConn, error) {
	n.peerConnsMu.Lock()
	defer n.peerConnsMu.Unlock()
	if c, ok := n.peerConns[addr]; ok {
		return c, nil
	}
	// members.go, regiondir.go
	if !n.isKnownPeerAddr(addr) && !n.isOtherRegionAddr(addr) {
		return nil, fmt.Errorf("%s is not a node of this region nor of a region it knows", addr)
	}
	c, err := grpcdial.Dial(addr, n.peerDialConfig())
	if err != nil {
		return nil, err
	}
	if n.peerConns == nil {
		n.peerConns = map[string]*grpc.ClientConn{}
	}
	n.peerConns[addr] = c
	return c, nil
}

// dialCredentials secure every connection this node makes to another:
// Config.ClientCredentials, else Config.ClientTLS, else plaintext.
// peerDialConfig is the dial configuration of the node's connections to
// other nodes (forwarding, identity, admin calls): keepalive with no call in
// flight too, a reconnect backoff short enough for a restarted peer, and
// no idle timeout (gRPC's default closes a connection after 30 minutes
// without a call; a takeover's survey must find it open: warmRegionConns).
func (n *Node) peerDialConfig() grpcdial.Config {
	return grpcdial.Config{Credentials: n.dialCredentials(), PermitWithoutStream: true, BackoffMax: 2 * time.Second,
		Extra: append(n.peerTracing(), grpc.WithIdleTimeout(0))} // tracing.go
}

func (n *Node) dialCredentials() credentials.TransportCredentials {
	switch {
	case n.cfg.ClientCredentials != nil:
		return n.cfg.ClientCredentials
	case n.cfg.ClientTLS != nil:
		return credentials.NewTLS(n.cfg.ClientTLS)
	}
	return insecure.NewCredentials()
}

// raftRouter is the Node as the transport's Handler.
type raftRouter Node

func (r *raftRouter) HandleMessages(from raftnet.NodeID, msgs []raftnet.GroupMessage) int {
	n := (*Node)(r)
	if n.testPeerBlocked(uint64(from)) {
		return 0 // a test's cut: lost on the wire
	}
	unknown := 0
	byGroup := map[raftnet.GroupID][]*raftpb.Message{}
	for _, m := range msgs {
		byGroup[m.Group] = append(byGroup[m.Group], m.Message)
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	for g, ms := range byGroup {
		d, ok := n.region.groups[g]
		if !ok || d.rep == nil {
			unknown += len(ms)
			continue
		}
		d.deliverRaft(ms)
	}
	return unknown
}

func (r *raftRouter) HandleSnapshot(from raftnet.NodeID, group raftnet.GroupID, msg *raftpb.Message, body io.Reader) error {
	return (*Node)(r).handleSnapshot(from, group, msg, body) // snapshot.go
}

func (r *raftRouter) ReportUnreachable(to raftnet.NodeID, groups []raftnet.GroupID) {
	n := (*Node)(r)
	n.mu.RLock()
	defer n.mu.RUnlock()
	for _, g := range groups {
		if d, ok := n.region.groups[g]; ok && d.unreachable != nil {
			select {
			case d.unreachable <- uint64(to):
			default:
			}
		}
	}
}

func (r *raftRouter) ReportSnapshot(to raftnet.NodeID, group raftnet.GroupID, err error) {
	(*Node)(r).reportSnapshot(to, group, err) // snapshot.go
}
