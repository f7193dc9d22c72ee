package regionsvc

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc/metadata"
)

// Altering a stream's retention (Log.AlterStream), in every region of it:
//
//  1. this region: an "alter" record in the catalogue, carrying the whole
//     new spec, which every node applies (applyAlter);
//  2. the stream's other regions at once, each through one of its nodes
//     (the request marked propagated). A region that cannot be reached
//     does not keep the others from the change: the answer is then a
//     retriable UNAVAILABLE naming the regions not yet altered, and
//     altering again completes it. So an operator can change a stream's
//     mirror hold while a mirror region is cut off, which is when it
//     matters (docs/operator-guide.md; TestAlterStreamRegionCutOff).
//
// An alter sets values, so applying it twice, or in two regions in either
// order, ends the same; a resend after a retriable error completes one
// cut short. A node applying an alter replaces the stream's spec and sets
// each of its ranges' retention (segment.Store.SetRetention), which the
// ranges' next maintenance round applies. An alter names the creation it
// changes (its catalogue offset): it never changes a newer stream of the
// name.

// alterWant is what an AlterStream request changes; nil leaves a value.
type alterWant struct {
	retentionAgeMillis, retentionBytes   *int64
	mirrorHoldBytes, mirrorHoldAgeMillis *int64
}

func alterWantOf(req *geologv1.AlterStreamRequest) (alterWant, error) {
	w := alterWant{retentionAgeMillis: req.RetentionMaxAgeMs, retentionBytes: req.RetentionMaxBytes,
		mirrorHoldBytes: req.MirrorHoldMaxBytes, mirrorHoldAgeMillis: req.MirrorHoldMaxMs}
	if err := checkMirrorHold(req.GetMirrorHoldMaxBytes(), req.GetMirrorHoldMaxMs()); err != nil {
		return w, err
	}
	switch {
	case w.retentionAgeMillis == nil && w.retentionBytes == nil && w.mirrorHoldBytes == nil && w.mirrorHoldAgeMillis == nil:
		return w, apierr.New(apierr.InvalidArgument, "alter stream %q: nothing to change (give retention_max_age_ms, retention_max_bytes, mirror_hold_max_bytes or mirror_hold_max_ms)", req.GetName())
	case w.retentionAgeMillis != nil && (*w.retentionAgeMillis < 0 || *w.retentionAgeMillis > retentionAgeMillisMax):
		return w, apierr.New(apierr.InvalidArgument, "retention max_age_ms %d is outside 0..%d (100 years)", *w.retentionAgeMillis, int64(retentionAgeMillisMax))
	case w.retentionBytes != nil && *w.retentionBytes < 0:
		return w, apierr.New(apierr.InvalidArgument, "retention max_bytes %d is negative", *w.retentionBytes)
	}
	return w, nil
}

// apply returns spec with w's changes.
func (w alterWant) apply(spec streamSpec) streamSpec {
	if w.retentionAgeMillis != nil {
		spec.RetentionAgeMillis = *w.retentionAgeMillis
	}
	if w.retentionBytes != nil {
		spec.RetentionBytes = *w.retentionBytes
	}
	if w.mirrorHoldBytes != nil {
		spec.MirrorHoldBytes = *w.mirrorHoldBytes
	}
	if w.mirrorHoldAgeMillis != nil {
		spec.MirrorHoldAgeMillis = *w.mirrorHoldAgeMillis
	}
	return spec
}

// alterStream is Log.AlterStream: it returns the stream's spec once the
// change is applied on this node.
func (n *Node) alterStream(ctx context.Context, req *geologv1.AlterStreamRequest) (streamSpec, error) {
	name := req.GetName()
	if err := validateStreamName(name); err != nil {
		return streamSpec{}, err
	}
	if name == cursorStreamName {
		return streamSpec{}, apierr.New(apierr.InvalidArgument, "stream %s is internal: its retention is the node's (--cursor-compaction-lag, --cursor-delete-retention)", name)
	}
	want, err := alterWantOf(req)
	if err != nil {
		return streamSpec{}, err
	}
	select {
	case <-n.closing:
		return streamSpec{}, apierr.New(apierr.ShuttingDown, "node is shutting down")
	default:
	}
	md, _ := metadata.FromIncomingContext(ctx)
	forwarded := len(md.Get(forwardedKey)) > 0
	origin := !forwarded && !isPropagated(ctx)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	st, err := n.lookupStream(ctx, name)
	if err != nil {
		return streamSpec{}, err
	}
	spec := want.apply(st.spec)
	if err := n.alterStreamReplicated(ctx, spec, req, forwarded); err != nil {
		return streamSpec{}, err
	}
	if origin {
		if err := n.alterOtherRegions(ctx, spec, req); err != nil {
			return streamSpec{}, err
		}
	}
	return spec, nil
}

// alterOtherRegions propagates req to spec's other regions, all at once;
// it names those it could not alter.
func (n *Node) alterOtherRegions(ctx context.Context, spec streamSpec, req *geologv1.AlterStreamRequest) error {
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		missing []string
		first   error
	)
	for _, region := range spec.Regions {
		if region == n.cfg.Region {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := n.propagateToRegion(ctx, region, func(cctx context.Context, _ string, c geologv1.LogClient) error {
				_, err := c.AlterStream(cctx, req)
				return err
			})
			if err != nil {
				mu.Lock()
				missing = append(missing, region)
				first = cmp.Or(first, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(missing) == 0 {
		return nil
	}
	slices.Sort(missing)
	return apierr.Wrap(apierr.Unavailable, first, "stream %q is altered in region %s and not yet in %s (altering it again completes it)",
		spec.Name, n.cfg.Region, strings.Join(missing, ", "))
}

// alterStreamReplicated proposes the new spec to the region's catalogue
// (through its leader) and waits until this node applied it.
func (n *Node) alterStreamReplicated(ctx context.Context, spec streamSpec, req *geologv1.AlterStreamRequest, forwarded bool) error {
	res, err := n.proposeMeta(ctx, metaRecord{Op: "alter", Spec: spec})
	if err != nil {
		return err
	}
	if res.err != nil {
		leader := n.region.meta.rep.LeaderID()
		e := apierr.As(res.err)
		if e.Code != apierr.NotLeader || forwarded || !n.catalogueLeaderUp() || leader == n.cfg.NodeID || n.peerAddr(leader) == "" {
			return res.err
		}
		// Not proposed: the leader proposes it (an alter sets values, so
		// a duplicate is harmless).
		conn, err := n.peerConn(n.peerAddr(leader))
		if err != nil {
			return apierr.Wrap(apierr.Unavailable, err, "forward to %s", n.peerAddr(leader))
		}
		if _, err := geologv1.NewLogClient(conn).AlterStream(metadata.AppendToOutgoingContext(ctx, forwardedKey, "1"), req); err != nil {
			return rpcerr.FromError(err)
		}
	}
	return n.waitAltered(ctx, spec)
}

// waitAltered waits until this node's spec of the stream is spec's (or the
// stream is gone or was created anew).
func (n *Node) waitAltered(ctx context.Context, spec streamSpec) error {
	return n.waitCatalogue(ctx, spec.Name, "alter stream", func(st *streamState, ok bool) (bool, error) {
		if !ok || st.spec.MetaOffset != spec.MetaOffset {
			return false, apierr.New(apierr.StreamNotFound, "stream %q was deleted while it was altered", spec.Name)
		}
		return st.spec.RetentionAgeMillis == spec.RetentionAgeMillis && st.spec.RetentionBytes == spec.RetentionBytes &&
			st.spec.MirrorHoldBytes == spec.MirrorHoldBytes && st.spec.MirrorHoldAgeMillis == spec.MirrorHoldAgeMillis, nil
	})
}

// applyAlter applies a catalogue "alter" record, on the catalogue
// driver's goroutine. The applied catalogue (catalog.json) is saved with
// the new spec before the node serves it: AlterStream answers once this
// node serves it (waitAltered), and a node restarted right after must not
// serve the old spec until its catalogue group replays the alter
// (TestAlterStreamRetention restarts at once and reads it back).
func (n *Node) applyAlter(at uint64, spec streamSpec) {
	n.mu.Lock()
	st, ok := n.streams[spec.Name]
	if !ok || st.spec.MetaOffset != spec.MetaOffset {
		n.mu.Unlock()
		return // a deleted stream, or a newer one of the name
	}
	if at <= st.spec.AlteredAt {
		// A record this node applied (and saved) before it restarted,
		// which the catalogue group replays: applied again it would put
		// its older values back until the newer alters replay too.
		n.mu.Unlock()
		return
	}
	specs := n.specsLocked()
	for i := range specs {
		if specs[i].Name == spec.Name {
			specs[i] = altered(specs[i], spec, at)
		}
	}
	n.mu.Unlock()
	if err := saveCatalog(n.cfg.fsys(), n.cfg.DataDir, specs, at); err != nil {
		n.logger.Error("save applied catalogue", "error", err)
	}
	n.mu.Lock()
	st, ok = n.streams[spec.Name]
	if !ok || st.spec.MetaOffset != spec.MetaOffset {
		n.mu.Unlock()
		return
	}
	next := &streamState{spec: altered(st.spec, spec, at), ranges: st.ranges} // readers that hold st keep a consistent spec
	n.streams[spec.Name] = next
	n.mu.Unlock()
	n.setRetention(next)
	n.logger.Info("stream altered", "stream", spec.Name, "retention_age_ms", spec.RetentionAgeMillis, "retention_bytes", spec.RetentionBytes, "catalogue_offset", at)
}

// altered is s with the values an alter (the catalogue record at at)
// sets taken from spec.
func altered(s, spec streamSpec, at uint64) streamSpec {
	s.RetentionAgeMillis, s.RetentionBytes = spec.RetentionAgeMillis, spec.RetentionBytes
	s.MirrorHoldBytes, s.MirrorHoldAgeMillis = spec.MirrorHoldBytes, spec.MirrorHoldAgeMillis
	s.AlteredAt = at
	return s
}

// setRetention gives st's ranges its spec's retention and mirror hold.
func (n *Node) setRetention(st *streamState) {
	age, bytes := time.Duration(st.spec.RetentionAgeMillis)*time.Millisecond, st.spec.RetentionBytes
	for r, d := range st.ranges {
		if d == nil || d.store == nil {
			continue // a range that failed to open takes it when it opens
		}
		d.setMirrorHold(st.spec)
		if err := d.store.SetRetention(age, bytes); err != nil {
			n.logger.Error("set retention", "stream", st.spec.Name, "range", r, "error", err)
		}
	}
}
