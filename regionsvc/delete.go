package regionsvc

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/homing"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc/metadata"
)

// Deleting a stream (Log.DeleteStream), in every region of it, in this
// order, so that a deletion cut short is completed by the next one:
//
//  1. the stream's other regions, each through one of its nodes (the
//     request marked propagated, as a creation is; STREAM_NOT_FOUND there
//     counts as done);
//  2. this region: with replication a "delete" record in the catalogue,
//     which every node applies (applyDelete); without it, the node alone;
//  3. the stream's home records in the lease store (homing on), once no
//     region holds the stream any more (a region's catalogue leader would
//     register again the homes of a stream it still holds).
//
// A node applying a deletion removes the stream from its catalogue (so
// that requests for it answer STREAM_NOT_FOUND, and replication of its
// ranges stops), stops the ranges' drivers, forgets their mirror state and
// removes their files; the name is then free for a new stream, whose
// ranges are new Raft groups (group ids derive from the creation record's
// catalogue offset). A retry that finds the stream gone here still
// removes its home records (step 3 may be what was cut short): the node
// remembers the streams it deleted (deletedStreamsMax of them, in
// memory), and removes their homes again on such a retry, which answers
// STREAM_NOT_FOUND as any for a stream that no longer exists.

func (n *Node) deleteStream(ctx context.Context, name string) error {
	if err := validateStreamName(name); err != nil {
		return err
	}
	select {
	case <-n.closing:
		return apierr.New(apierr.ShuttingDown, "node is shutting down")
	default:
	}
	md, _ := metadata.FromIncomingContext(ctx)
	forwarded := len(md.Get(forwardedKey)) > 0
	origin := !forwarded && !isPropagated(ctx)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	st, err := n.lookupStream(ctx, name)
	if err != nil {
		if origin && apierr.As(err).Code == apierr.StreamNotFound && n.wasDeleted(name) {
			if herr := n.deleteHomes(ctx, name); herr != nil {
				return herr
			}
		}
		return err
	}
	spec := st.spec
	if origin {
		if err := n.propagateDelete(ctx, spec); err != nil {
			return err
		}
	}
	err = n.deleteStreamReplicated(ctx, spec, forwarded)
	if err != nil || !origin {
		return err
	}
	return n.deleteHomes(ctx, name)
}

// propagateDelete deletes spec's stream in its other regions.
func (n *Node) propagateDelete(ctx context.Context, spec streamSpec) error {
	for _, region := range spec.Regions {
		if region == n.cfg.Region {
			continue
		}
		if err := n.deleteInRegion(ctx, region, spec.Name); err != nil {
			return apierr.Wrap(apierr.Unavailable, err, "stream %q is not yet deleted in region %s (deleting it again completes it)", spec.Name, region)
		}
	}
	return nil
}

func (n *Node) deleteInRegion(ctx context.Context, region, name string) error {
	return n.propagateToRegion(ctx, region, func(cctx context.Context, _ string, c geologv1.LogClient) error {
		_, err := c.DeleteStream(cctx, &geologv1.DeleteStreamRequest{Name: name})
		if rpcerr.CodeOf(err) == apierr.StreamNotFound {
			return nil
		}
		return err
	})
}

// deleteStreamReplicated proposes the deletion to the region's catalogue
// (through its leader) and waits until this node applied it.
func (n *Node) deleteStreamReplicated(ctx context.Context, spec streamSpec, forwarded bool) error {
	res, err := n.proposeMeta(ctx, metaRecord{Op: "delete", Spec: streamSpec{Name: spec.Name, MetaOffset: spec.MetaOffset}})
	if err != nil {
		return err
	}
	if res.err != nil {
		// The leader's peer address, not the error's hint (an advertised
		// address, for clients), as for a create.
		leader := n.region.meta.rep.LeaderID()
		e := apierr.As(res.err)
		if e.Code != apierr.NotLeader || forwarded || !n.catalogueLeaderUp() || leader == n.cfg.NodeID || n.peerAddr(leader) == "" {
			return res.err
		}
		// Not proposed, or superseded: forwarding is safe (a deletion
		// applies once, to the creation it names).
		if err := n.forwardDelete(ctx, n.peerAddr(leader), spec.Name); err != nil && rpcerr.CodeOf(err) != apierr.StreamNotFound {
			return err
		}
	}
	return n.waitStreamGone(ctx, spec)
}

func (n *Node) forwardDelete(ctx context.Context, addr, name string) error {
	conn, err := n.peerConn(addr)
	if err != nil {
		return apierr.Wrap(apierr.Unavailable, err, "forward to %s", addr)
	}
	if _, err := geologv1.NewLogClient(conn).DeleteStream(metadata.AppendToOutgoingContext(ctx, forwardedKey, "1"),
		&geologv1.DeleteStreamRequest{Name: name}); err != nil {
		return rpcerr.FromError(err)
	}
	return nil
}

// waitStreamGone waits until this node no longer holds the creation of
// spec (the catalogue applied its deletion).
func (n *Node) waitStreamGone(ctx context.Context, spec streamSpec) error {
	return n.waitCatalogue(ctx, spec.Name, "delete stream", func(st *streamState, ok bool) (bool, error) {
		return !ok || st.spec.MetaOffset != spec.MetaOffset, nil
	})
}

// waitCatalogue waits until done, asked of the node's state of stream name
// (ok false when it holds none) after each catalogue apply, says so or
// fails; what names the request in a timeout.
func (n *Node) waitCatalogue(ctx context.Context, name, what string, done func(st *streamState, ok bool) (bool, error)) error {
	for {
		n.mu.RLock()
		st, ok := n.streams[name]
		applied := n.region.applied
		n.mu.RUnlock()
		if fin, err := done(st, ok); fin || err != nil {
			return err
		}
		select {
		case <-applied:
		case <-ctx.Done():
			return apierr.Wrap(apierr.Timeout, ctx.Err(), "%s %q: committed, not yet applied here", what, name)
		}
	}
}

// applyDelete applies a catalogue deletion, on the catalogue driver's
// goroutine: the stream goes if it is still the creation the record names
// (a deletion never removes a newer stream of the same name).
func (n *Node) applyDelete(at uint64, del streamSpec) {
	n.mu.Lock()
	st, ok := n.streams[del.Name]
	if !ok || st.spec.MetaOffset != del.MetaOffset {
		n.mu.Unlock()
		return
	}
	delete(n.streams, del.Name)
	delete(n.region.metaOffsets, del.Name)
	for r := range st.ranges {
		delete(n.region.groups, groupFor(st.spec.MetaOffset, uint32(r)))
	}
	specs := n.specsLocked()
	n.mu.Unlock()
	n.closeDeleted(st)
	if err := saveCatalog(n.cfg.fsys(), n.cfg.DataDir, specs, at); err != nil {
		n.logger.Error("save applied catalogue", "error", err)
	}
	n.noteDeleted(del.Name)
	n.logger.Info("stream deleted", "stream", del.Name, "ranges", st.spec.RangeCount, "catalogue_offset", at)
}

// deletedStreamsMax bounds the deleted stream names a node remembers.
const deletedStreamsMax = 4096

// noteDeleted remembers that the node deleted a stream of name.
func (n *Node) noteDeleted(name string) {
	n.epochs.forget(name) // a stream created again under the name starts at epoch 1
	n.deletedMu.Lock()
	defer n.deletedMu.Unlock()
	if n.deleted == nil || len(n.deleted) >= deletedStreamsMax {
		n.deleted = map[string]bool{}
	}
	n.deleted[name] = true
}

// forgetDeleted forgets a deletion of name: a stream of that name exists
// again.
func (n *Node) forgetDeleted(name string) {
	n.deletedMu.Lock()
	defer n.deletedMu.Unlock()
	delete(n.deleted, name)
}

// wasDeleted reports whether the node deleted a stream of name (and holds
// none since).
func (n *Node) wasDeleted(name string) bool {
	n.deletedMu.Lock()
	defer n.deletedMu.Unlock()
	return n.deleted[name]
}

// specsLocked lists the streams' specs; n.mu is held.
func (n *Node) specsLocked() []streamSpec {
	specs := make([]streamSpec, 0, len(n.streams))
	for _, st := range n.streams {
		specs = append(specs, st.spec)
	}
	return specs
}

// closeDeleted stops a deleted stream's ranges and removes what the node
// holds of them: drivers, mirror and homing state, files.
func (n *Node) closeDeleted(st *streamState) {
	var wg sync.WaitGroup
	for _, rd := range st.ranges {
		wg.Add(1)
		go func() { defer wg.Done(); rd.stop() }()
	}
	wg.Wait()
	name := st.spec.Name
	for r := range st.ranges {
		if n.replServer != nil {
			n.replServer.Forget(name, uint32(r))
		}
	}
	if hs := n.homing; hs != nil {
		hs.dirMu.Lock()
		for r := range st.ranges {
			delete(hs.dir, homing.RangeKey{Stream: name, Range: uint32(r)})
		}
		hs.dirMu.Unlock()
	}
	if err := os.RemoveAll(filepath.Join(n.cfg.DataDir, "streams", name)); err != nil {
		n.logger.Error("remove a deleted stream's files", "stream", name, "error", err)
	}
}

// deleteHomes removes a deleted stream's home records from the lease
// store, if homing is on.
func (n *Node) deleteHomes(ctx context.Context, name string) error {
	if n.homing == nil {
		return nil
	}
	if err := n.homing.store.DeleteHomes(ctx, name); err != nil {
		return apierr.New(apierr.Unavailable, "stream %q is deleted, its home records are not yet (deleting it again completes it): %v", name, homingErr(err))
	}
	return nil
}
