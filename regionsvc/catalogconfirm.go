package regionsvc

import (
	"context"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// catalogueConfirmMax bounds how long a lookup of an unknown stream waits
// for the catalogue leader to confirm that it does not exist.
const catalogueConfirmMax = 3 * time.Second

// lookupStream finds a stream by name. On a replicated node a miss is not
// taken from the local copy of the catalogue, which may lag the catalogue
// leader by a few entries (a follower learns of a commit one message
// later; a restarted node replays its log): the miss is confirmed against
// the leader (a Raft ReadIndex on the catalogue group), so that
// STREAM_NOT_FOUND is final: every stream created before the request
// started would have been found. When the leader cannot be asked, the answer
// is a retriable UNAVAILABLE.
func (n *Node) lookupStream(ctx context.Context, name string) (*streamState, error) {
	n.mu.RLock()
	st, ok := n.streams[name]
	n.mu.RUnlock()
	if ok {
		return st, nil
	}
	ctx, cancel := context.WithTimeout(ctx, catalogueConfirmMax)
	defer cancel()
	forwarded := false
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		forwarded = len(md.Get(forwardedKey)) > 0
	}
	if err := n.confirmCatalogue(ctx, name, forwarded); err != nil {
		return nil, err
	}
	n.mu.RLock()
	st, ok = n.streams[name]
	n.mu.RUnlock()
	if ok {
		return st, nil
	}
	return nil, apierr.New(apierr.StreamNotFound, "stream %q does not exist", name)
}

// confirmCatalogue brings this node's catalogue up to what the catalogue
// leader has committed now, as far as the stream name matters: on the
// leader by a ReadIndex and a wait for it to be applied; elsewhere by asking
// the leader (a forwarded DescribeStream) and, if it knows the stream,
// waiting until it is applied here.
func (n *Node) confirmCatalogue(ctx context.Context, name string, forwarded bool) error {
	meta := n.region.meta
	if meta.rep == nil {
		return apierr.New(apierr.Unavailable, "stream %q: the catalogue is not open", name)
	}
	// A node that has not heard from a catalogue leader yet (starting, or
	// during an election) waits for one, within ctx.
	leader := meta.rep.LeaderID()
	for leader == 0 {
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return apierr.New(apierr.Unavailable, "stream %q: the catalogue has no known leader to confirm it", name)
		}
		leader = meta.rep.LeaderID()
	}
	if leader == n.cfg.NodeID {
		done := make(chan struct{})
		var end uint64
		var rerr error
		if err := meta.exec(ctx, func() {
			meta.rep.ReadIndex(func(e uint64, err error) { end, rerr = e, err; close(done) })
		}); err != nil {
			return unavailableCatalogue(name, err)
		}
		select {
		case <-done:
		case <-ctx.Done():
			return unavailableCatalogue(name, ctx.Err())
		}
		if rerr != nil {
			return unavailableCatalogue(name, rerr)
		}
		return n.waitMetaApplied(ctx, name, end)
	}
	if forwarded {
		return unavailableCatalogue(name, meta.rep.NotLeaderError())
	}
	addr := n.peerAddr(leader)
	if addr == "" {
		return apierr.New(apierr.Unavailable, "stream %q: catalogue leader %d has no known address", name, leader)
	}
	conn, err := n.peerConn(addr)
	if err != nil {
		return unavailableCatalogue(name, err)
	}
	_, err = geologv1.NewLogClient(conn).DescribeStream(metadata.AppendToOutgoingContext(ctx, forwardedKey, "1"),
		&geologv1.DescribeStreamRequest{Name: name})
	switch e := rpcerr.FromError(err); {
	case err == nil:
		// The leader has it: it is committed, so it applies here soon.
		if err := n.waitStreamApplied(ctx, name); err != nil {
			return unavailableCatalogue(name, err)
		}
		return nil
	case apierr.As(e).Code == apierr.StreamNotFound:
		return nil // confirmed absent by the leader
	default:
		return unavailableCatalogue(name, e)
	}
}

// waitMetaApplied waits until this node applied the catalogue below end.
func (n *Node) waitMetaApplied(ctx context.Context, name string, end uint64) error {
	for {
		n.mu.RLock()
		applied := n.region.applied
		n.mu.RUnlock()
		if n.region.metaApplied.Load() >= end {
			return nil
		}
		select {
		case <-applied:
		case <-ctx.Done():
			return unavailableCatalogue(name, ctx.Err())
		}
	}
}

func unavailableCatalogue(name string, cause error) error {
	return apierr.New(apierr.Unavailable, "stream %q: the catalogue could not confirm whether it exists: %v", name, cause)
}
