package regionsvc

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/cursors"
	"github.com/geolog/geolog/internal/backoff"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// Requests for a cursor range's coordinator reach it from any node: the
// node that takes the request runs it if it coordinates the range, or
// forwards it, marked forwarded, to the leader in its region (the home
// region) or to a node of the home region (elsewhere; that node runs it or
// answers NOT_LEADER, never forwarding again), moving on to the next
// address on NOT_LEADER, NOT_HOME or an unreachable node, a bounded
// number of times.

// coordinateAttemptsMax bounds the nodes one request is tried at.
const coordinateAttemptsMax = 8

// forwardTimeout bounds one forwarded call whose context has no deadline.
const forwardTimeout = 10 * time.Second

func isForwarded(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(forwardedKey)) > 0
}

// coordinate runs run on the coordinator of cr, here or, through forward,
// on the node that is.
func (n *Node) coordinate(ctx context.Context, cr *cursorRange, run func(b *cursors.Batch, c *cursors.Coordinator) (any, error),
	forward func(ctx context.Context, c geologv1.ConsumerClient) (any, error)) (any, error) {
	if isForwarded(ctx) {
		return cr.submit(ctx, run)
	}
	var last error
	var hint string
	for attempt := 0; attempt < coordinateAttemptsMax; attempt++ {
		var v any
		var err error
		if cr.coordinatesHere() {
			v, err = cr.submit(ctx, run)
			if n.replicated() {
				n.hintCoordinator(ctx, cr, n.peerAddr(n.cfg.NodeID), err) // names n.advertise
			}
		} else if addr := n.coordinatorAddr(cr, attempt, hint); addr != "" {
			v, err = n.forwardTo(ctx, addr, forward)
			n.hintCoordinator(ctx, cr, addr, err)
		} else {
			err = apierr.New(apierr.Unavailable, "cursor range %d: no coordinator known yet (home %q)", cr.idx, cr.d.role().region)
		}
		if err == nil {
			return v, nil
		}
		e := apierr.As(err)
		if !redirectable(e) || ctx.Err() != nil {
			return nil, err
		}
		last, hint = e, e.LeaderHint
		if err := backoff.Sleep(ctx, coordinateBackoff(attempt)); err != nil {
			break
		}
	}
	e := apierr.New(apierr.Unavailable, "cursor range %d: the coordinator could not be reached: %v", cr.idx, last)
	return nil, e
}

// CoordinatorHeader is the response header in which a node that took a
// Consumer request names the node that coordinated it, when that node is
// in its own region (an address the client can dial): a client may send
// the next requests for the same name there, saving the forwarding hop.
// A hint only: a node that no longer coordinates forwards the request.
const CoordinatorHeader = "x-geolog-coordinator"

// CursorRangeHeader goes with CoordinatorHeader: the cursor range of the
// request's name and the cursor ranges' count, as "index/count". A client
// may send the first request of another name of the same range (the
// range of keyspace.RangeForKey(name, count)) to the same coordinator.
const CursorRangeHeader = "x-geolog-cursor-range"

// hintCoordinator sets CoordinatorHeader after a request the peer at addr
// (a Peers address) served. The header names the node's advertised
// address; none when it is not known yet.
func (n *Node) hintCoordinator(ctx context.Context, cr *cursorRange, addr string, err error) {
	if err != nil || !cr.d.role().home {
		return
	}
	if client := n.peerClientAddr(addr); client != "" {
		_ = grpc.SetHeader(ctx, metadata.Pairs(CoordinatorHeader, client, CursorRangeHeader, cr.rangeHint))
	}
}

// peerClientAddr is the advertised address of the peer at addr (a Peers
// address), "" when it is not known.
func (n *Node) peerClientAddr(addr string) string {
	for id, a := range n.memberAddrs() {
		if a == addr {
			return n.clientAddr(n.cfg.Region, id)
		}
	}
	return ""
}

// redirectable reports whether an error means "not here, try the
// coordinator elsewhere (or later)".
func redirectable(e *apierr.Error) bool {
	switch e.Code {
	case apierr.NotLeader, apierr.NotHome, apierr.Unavailable, apierr.LeaseExpired, apierr.ShuttingDown:
		return true
	}
	return false
}

// coordinateBackoff is the wait before retry attempt (from 0) of a
// request to a cursor range's coordinator: 10 ms doubling to 500 ms.
func coordinateBackoff(attempt int) time.Duration {
	return backoff.Delay(attempt, 10*time.Millisecond, 500*time.Millisecond, nil)
}

// coordinatorAddr is where a request for cr's coordinator goes on the
// attempt-th try: the hinted leader if this node can dial it, else the
// range's leader in this region when it is the home, else a node of the
// home region (the home leader first, as its heartbeats name it).
func (n *Node) coordinatorAddr(cr *cursorRange, attempt int, hint string) string {
	d := cr.d
	role := d.role()
	if role.home {
		if hint != "" && n.isPeerAddr(hint) {
			return hint
		}
		if d.rep != nil {
			if id := d.rep.LeaderID(); id != 0 && id != n.cfg.NodeID {
				return n.peerAddr(id)
			}
		}
		addrs := n.memberAddrs() // joined nodes too (members.go)
		var others []string
		for _, id := range slices.Sorted(maps.Keys(addrs)) {
			if id != n.cfg.NodeID {
				others = append(others, addrs[id])
			}
		}
		if len(others) == 0 {
			return ""
		}
		return others[attempt%len(others)]
	}
	addrs := n.regionAddrs(role.region)
	if len(addrs) == 0 {
		return ""
	}
	first := int(cr.idx) % len(addrs)
	if id := d.homeLeaderID.Load(); id >= 1 && id <= uint64(len(addrs)) {
		first = int(id - 1)
	}
	return addrs[(first+attempt)%len(addrs)]
}

func (n *Node) isPeerAddr(addr string) bool {
	for _, a := range n.memberAddrs() {
		if a == addr {
			return true
		}
	}
	return false
}

// forwardTo sends a request to another node, marked forwarded.
func (n *Node) forwardTo(ctx context.Context, addr string, forward func(ctx context.Context, c geologv1.ConsumerClient) (any, error)) (any, error) {
	conn, err := n.peerConn(addr)
	if err != nil {
		return nil, apierr.Wrap(apierr.Unavailable, err, "forward to %s", addr)
	}
	fctx := metadata.AppendToOutgoingContext(ctx, forwardedKey, "1")
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		fctx, cancel = context.WithTimeout(fctx, forwardTimeout)
		defer cancel()
	}
	v, err := forward(fctx, geologv1.NewConsumerClient(conn))
	if err != nil {
		return nil, rpcerr.FromError(err)
	}
	return v, nil
}
