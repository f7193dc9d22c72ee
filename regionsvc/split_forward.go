package regionsvc

import (
	"context"
	"slices"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/internal/backoff"
	"github.com/geolog/geolog/pki"
	"github.com/geolog/geolog/placement"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"google.golang.org/grpc"
)

// A mirror split recorded at the request of the parent's mirror-group
// leader (docs/split.md "Mirrors"). In a region with more nodes than the
// replication factor the catalogue leader may hold no replica of the
// parent, so its log never holds the marker and split_mirror.go's step 3
// never runs there. The node that leads the parent's group in this region
// (which applied the marker) asks it instead:
//
//  1. The mirror-group leader, for each of its split_mirror.go candidates
//     (marker applied, not in the map), sends RegionCatalogue's
//     RecordMirrorSplit to the catalogue leader it knows now, with its
//     node's mTLS identity: the marker's decision and offset, and the
//     stream's catalogue offset. It asks again, with backoff
//     (mirrorSplitRetryMin doubling to mirrorSplitRetryMax), until the map
//     shows the split; each attempt looks the catalogue leader up again,
//     so a change of leader costs one attempt. A catalogue leader that
//     holds a replica may record the split from its own log meanwhile:
//     the request is then answered as recorded.
//  2. The catalogue leader cannot check the request against a log it
//     lacks, so it checks the sender and the map. The sender: a node of
//     this region whose certificate names the node id the request names
//     (authorizeSplitSender), and a voter of the parent here, by the
//     catalogue's placement of the range or else by the Raft
//     configuration the range's leader describes (checkSplitVoter; the
//     placement is not updated by replica moves). The map: the request
//     must be the stream's next split, of the parent's bounds, with the
//     map's next ids (checkMirrorSplit, the same check step 3 makes of a
//     marker in the leader's own log); the split already recorded is
//     answered as recorded, so a repeated request is harmless.
//  3. It then proposes the catalogue's split record (catalogueSplit), as
//     step 3 does, and answers once it applied it.
//
// What it cannot check is the split offset: it takes the voter's word.
// A voter's applied marker is committed in its group, so an honest voter
// has the home's offset.

// mirrorSplitRetryMin and mirrorSplitRetryMax bound the wait between a
// mirror-group leader's requests for one split.
const (
	mirrorSplitRetryMin = mirrorSplitInterval
	mirrorSplitRetryMax = 10 * time.Second
)

// mirrorSplitKey names a candidate across the loop's rounds.
type mirrorSplitKey struct {
	stream string
	rng    uint32
	d      *rangeDriver // a range opened again is a new candidate
}

// mirrorSplitRetries is the forwarding loop's backoff per candidate
// (recordMirrorSplits' goroutine only).
type mirrorSplitRetries map[mirrorSplitKey]mirrorSplitRetry

type mirrorSplitRetry struct {
	attempts int
	next     time.Time
}

func keyOf(c mirrorSplitCandidate) mirrorSplitKey {
	return mirrorSplitKey{stream: c.stream, rng: c.rng, d: c.d}
}

// keepOnly forgets the candidates no longer listed (recorded, or the
// range closed): the map holds at most the node's candidates.
func (rs mirrorSplitRetries) keepOnly(cands []mirrorSplitCandidate) {
	keep := make(map[mirrorSplitKey]bool, len(cands))
	for _, c := range cands {
		keep[keyOf(c)] = true
	}
	for k := range rs {
		if !keep[k] {
			delete(rs, k)
		}
	}
}

// due reports whether c's next request may go at now.
func (rs mirrorSplitRetries) due(c mirrorSplitCandidate, now time.Time) bool {
	return !now.Before(rs[keyOf(c)].next)
}

// done notes the outcome of a request for c at now: a failure waits
// longer each time; a success forgets c (it leaves the candidates once
// the map shows the split here).
func (rs mirrorSplitRetries) done(c mirrorSplitCandidate, err error, now time.Time) {
	if err == nil {
		delete(rs, keyOf(c))
		return
	}
	r := rs[keyOf(c)]
	r.next = now.Add(backoff.Delay(r.attempts, mirrorSplitRetryMin, mirrorSplitRetryMax, nil))
	r.attempts++
	rs[keyOf(c)] = r
}

// forwardMirrorSplitOnce is step 1, one attempt, bounded by
// mirrorSplitTimeout; failures are logged.
func (n *Node) forwardMirrorSplitOnce(ctx context.Context, c mirrorSplitCandidate) error {
	cctx, cancel := context.WithTimeout(ctx, mirrorSplitTimeout)
	defer cancel()
	err := n.forwardMirrorSplit(cctx, c)
	if err != nil && ctx.Err() == nil {
		n.logger.Warn("mirror split not recorded yet: asked the catalogue leader", "stream", c.stream, "range", c.rng, "error", err)
	}
	return err
}

// forwardMirrorSplit asks the catalogue leader to record the split whose
// marker c's replica applied.
func (n *Node) forwardMirrorSplit(ctx context.Context, c mirrorSplitCandidate) error {
	var dec batch.Split
	var offset uint64
	var applied bool
	var rerr error
	if err := c.d.exec(ctx, func() { dec, offset, applied, rerr = c.d.rep.SplitApplied() }); err != nil {
		return err
	}
	if rerr != nil {
		return apierr.Wrap(apierr.Internal, rerr, "stream %q range %d", c.stream, c.rng)
	}
	if !applied {
		return nil // written, not applied yet: the next round, not a failed attempt
	}
	spec, ok := n.streamSpec(c.stream)
	if !ok {
		return apierr.New(apierr.StreamNotFound, "stream %q does not exist", c.stream)
	}
	req := &geologinternalv1.RecordMirrorSplitRequest{Region: n.cfg.Region, NodeId: n.cfg.NodeID, Stream: c.stream,
		StreamMetaOffset: spec.MetaOffset, SplitOffset: offset, MapVersion: dec.MapVersion, Parent: dec.Parent,
		HashStart: dec.HashStart, HashEnd: dec.HashEnd, At: dec.At, Left: dec.Left, Right: dec.Right}
	err := n.askCatalogueLeader(ctx, func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := geologinternalv1.NewRegionCatalogueClient(conn).RecordMirrorSplit(ctx, req)
		return err
	})
	if err != nil {
		return err
	}
	n.logger.Info("mirror split recorded by the catalogue leader", "stream", c.stream, "range", c.rng, "split_offset", offset,
		"version", dec.MapVersion, "left", dec.Left, "right", dec.Right)
	return nil
}

// catalogueServer serves RegionCatalogue.
type catalogueServer struct {
	geologinternalv1.UnimplementedRegionCatalogueServer
	node *Node
}

// RecordMirrorSplit implements RegionCatalogue's RecordMirrorSplit (steps
// 2 and 3 above).
func (s *catalogueServer) RecordMirrorSplit(ctx context.Context, req *geologinternalv1.RecordMirrorSplitRequest) (*geologinternalv1.RecordMirrorSplitResponse, error) {
	version, err := s.node.recordForwardedSplit(ctx, req)
	if err != nil {
		return nil, err
	}
	return &geologinternalv1.RecordMirrorSplitResponse{RangeMapVersion: version}, nil
}

// recordForwardedSplit checks and records a forwarded mirror split and
// returns the map version that shows it.
func (n *Node) recordForwardedSplit(ctx context.Context, req *geologinternalv1.RecordMirrorSplitRequest) (uint64, error) {
	if !n.replicated() || n.region.meta.rep == nil {
		return 0, apierr.New(apierr.Unavailable, "the node is not open")
	}
	sender, err := n.authorizeSplitSender(ctx, req)
	if err != nil {
		return 0, err
	}
	if !n.leadsCatalogue() {
		return 0, apierr.New(apierr.NotLeader, "this node does not lead region %s's catalogue", n.cfg.Region)
	}
	stream, r := req.GetStream(), req.GetParent()
	st, err := n.forwardedSplitStream(ctx, req)
	if err != nil {
		return 0, err
	}
	if err := n.checkSplitVoter(ctx, st.spec, r, sender); err != nil {
		return 0, err
	}
	dec := batch.Split{MapVersion: req.GetMapVersion(), Parent: r, HashStart: req.GetHashStart(), HashEnd: req.GetHashEnd(),
		At: req.GetAt(), Left: req.GetLeft(), Right: req.GetRight()}
	offset := req.GetSplitOffset()
	recorded, err := checkMirrorSplit(stream, st.spec.rangeMap(), r, dec, offset)
	if err != nil || recorded {
		return st.spec.rangeMap().Version, err
	}
	err = n.catalogueSplit(ctx, stream, r, splitResult{offset: offset, decision: dec})
	if err != nil {
		// The same split recorded meanwhile (this node's own step 3, or
		// another request) makes the proposal fail its map check: the
		// answer is the map's.
		if st2, lerr := n.lookupStream(ctx, stream); lerr == nil && st2.spec.MetaOffset == st.spec.MetaOffset {
			if ok, cerr := checkMirrorSplit(stream, st2.spec.rangeMap(), r, dec, offset); cerr == nil && ok {
				return st2.spec.rangeMap().Version, nil
			}
		}
		return 0, err
	}
	n.logger.Info("mirror split recorded at a voter's request", "stream", stream, "range", r, "node", sender,
		"split_offset", offset, "version", dec.MapVersion, "left", dec.Left, "right", dec.Right)
	return dec.MapVersion, nil
}

// forwardedSplitStream is the stream a forwarded split names, if it is
// the one the request was made of and its parent is a mirror here.
func (n *Node) forwardedSplitStream(ctx context.Context, req *geologinternalv1.RecordMirrorSplitRequest) (*streamState, error) {
	stream, r := req.GetStream(), req.GetParent()
	st, err := n.lookupStream(ctx, stream)
	if err != nil {
		return nil, err
	}
	if st.spec.MetaOffset != req.GetStreamMetaOffset() {
		return nil, apierr.New(apierr.StreamNotFound, "stream %q was created at catalogue offset %d, not %d: the request is of a deleted stream",
			stream, st.spec.MetaOffset, req.GetStreamMetaOffset())
	}
	if int(r) >= len(st.ranges) || st.ranges[r] == nil {
		return nil, apierr.New(apierr.RangeNotFound, "stream %q has no range %d here", stream, r)
	}
	switch role := st.ranges[r].role(); {
	case role.home || role.region == n.cfg.Region:
		return nil, apierr.New(apierr.InvalidArgument, "stream %q range %d is homed in this region: its split is recorded by the home's steps", stream, r)
	case role.region == "":
		return nil, apierr.New(apierr.Unavailable, "stream %q range %d: its home is not known here yet", stream, r)
	}
	return st, nil
}

// authorizeSplitSender returns the node a forwarded split comes from: with
// TLS, the node of this region its certificate names, which must be the
// one the request names; without TLS (geologd --insecure, where nothing
// is checked) the request's word.
func (n *Node) authorizeSplitSender(ctx context.Context, req *geologinternalv1.RecordMirrorSplitRequest) (uint64, error) {
	const method = geologinternalv1.RegionCatalogue_RecordMirrorSplit_FullMethodName
	if req.GetRegion() != n.cfg.Region || req.GetNodeId() == 0 {
		return 0, apierr.New(apierr.InvalidArgument, "a split forwarded by node %d of region %q; this is region %q", req.GetNodeId(), req.GetRegion(), n.cfg.Region)
	}
	if !n.secure() {
		return req.GetNodeId(), nil
	}
	id, err := pki.PeerIdentity(ctx)
	switch {
	case err != nil:
		return 0, n.authRefused(ctx, method, "", reasonNoIdentity, apierr.Wrap(apierr.Unauthenticated, err, "%s", method))
	case !id.IsNode() || id.Region != n.cfg.Region:
		return 0, n.authRefused(ctx, method, id.Name(), reasonRegionOnly, apierr.New(apierr.PermissionDenied, "%s is for nodes of region %s only; the caller is %s", method, n.cfg.Region, id.Name()))
	case id.NodeID != req.GetNodeId():
		return 0, n.authRefused(ctx, method, id.Name(), reasonNoPermission, apierr.New(apierr.PermissionDenied, "the caller is %s: a node forwards a split in its own name, not node %d's", id.Name(), req.GetNodeId()))
	}
	return id.NodeID, nil
}

// checkSplitVoter admits sender if it is a voter of range r of spec in
// this region: placed there by the catalogue, or in the range's Raft
// configuration as its leader describes it (replica moves change the
// configuration, not the placement).
func (n *Node) checkSplitVoter(ctx context.Context, spec streamSpec, r uint32, sender uint64) error {
	if slices.Contains(spec.replicasOf(r), sender) {
		return nil
	}
	c, err := n.describeRange(ctx, placement.RangeID{Stream: spec.Name, Range: r})
	if err != nil {
		return apierr.Wrap(apierr.Unavailable, err, "stream %q range %d: its voters, to check node %d's split", spec.Name, r, sender)
	}
	if slices.Contains(c.voters, sender) {
		return nil
	}
	return apierr.New(apierr.PermissionDenied, "node %d is not a voter of stream %q range %d in region %s (voters %v): it may not record its split",
		sender, spec.Name, r, n.cfg.Region, c.voters)
}
