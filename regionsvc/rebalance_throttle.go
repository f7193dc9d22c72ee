package regionsvc

import (
	"context"
	"errors"
	"io"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"golang.org/x/time/rate"

	"github.com/geolog/geolog/raftnet"
)

// The bound on transfer bandwidth: a move's catch-up goes through one
// token bucket per node, RebalanceConfig.TransferBytesPerSecond, so that
// it leaves the disk and the network to the producers.
//
//   - A snapshot this node sends (a learner catching up from the leader's
//     segments, replica/snapshot.go) reads its body through the bucket.
//   - Log entries this node sends to a learner (a learner catching up by
//     Raft's appends) take their bytes from the same bucket: an append to a
//     learner finds the bucket empty is dropped and reported unreachable,
//     so Raft sends that learner one append per heartbeat (probe state)
//     until the bucket refills. The bucket may go into debt by one append
//     (up to Raft's 1 MiB per message), which the next sends pay back.
//     Voters' appends are never throttled: a learner exists only during a
//     move, and producers wait on the voters alone.

// transferBurstBytes is the bucket's size: one read of a snapshot body.
const transferBurstBytes = 256 << 10

// newTransferLimiter returns the node's bucket, nil for no bound.
func newTransferLimiter(bytesPerSecond int64) *rate.Limiter {
	if bytesPerSecond <= 0 {
		return nil
	}
	return rate.NewLimiter(rate.Limit(bytesPerSecond), transferBurstBytes)
}

// throttledBody reads a snapshot body through lim.
type throttledBody struct {
	io.ReadCloser
	lim *rate.Limiter
	ctx context.Context
}

func (b *throttledBody) Read(p []byte) (int, error) {
	if len(p) > transferBurstBytes {
		p = p[:transferBurstBytes]
	}
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		if werr := b.lim.WaitN(b.ctx, n); werr != nil && err == nil {
			err = werr
		}
	}
	return n, err
}

// throttleSnapshot wraps a snapshot body in the node's bucket (as is
// without one).
func (n *Node) throttleSnapshot(body io.ReadCloser) io.ReadCloser {
	if n.transferLimiter == nil {
		return body
	}
	return &throttledBody{ReadCloser: body, lim: n.transferLimiter, ctx: n.tasks.Context()}
}

// errLearnerThrottled drops an append to a learner while the node's
// transfer bucket is empty.
var errLearnerThrottled = errors.New("regionsvc: transfer bandwidth bound: append to a learner deferred")

// learnerThrottle is a range's Raft transport with appends to learners
// under the node's transfer bucket. Send runs on the range's driver
// goroutine (sendRaft) for the appends it throttles (the log writer
// sends only responses), which also owns d.
type learnerThrottle struct {
	*raftnet.GRPCTransport
	n *Node
	g raftnet.GroupID
	d *rangeDriver // found at the first append to throttle
}

// learnerTransport returns the transport of group g's driver: the node's,
// with appends to learners throttled when the node has a transfer bound.
func (n *Node) learnerTransport(g raftnet.GroupID) raftnet.Transport {
	if n.transferLimiter == nil || g == metaGroupID {
		return n.region.transport
	}
	return &learnerThrottle{GRPCTransport: n.region.transport, n: n, g: g}
}

// Send implements raftnet.Transport.
func (t *learnerThrottle) Send(g raftnet.GroupID, m *raftpb.Message) error {
	if m.GetType() == raftpb.MsgApp && len(m.GetEntries()) > 0 && t.toLearner(m.GetTo()) {
		bytes := 0
		for _, e := range m.GetEntries() {
			bytes += len(e.GetData())
		}
		if !t.n.takeTransfer(bytes) {
			t.n.learnerDeferred.Add(1)
			return errLearnerThrottled
		}
		t.n.learnerBytes.Add(int64(bytes))
	}
	return t.GRPCTransport.Send(g, m)
}

// toLearner reports whether node id is a learner of the group (driver
// goroutine).
func (t *learnerThrottle) toLearner(id uint64) bool {
	if t.d == nil {
		t.n.mu.RLock()
		t.d = t.n.region.groups[t.g]
		t.n.mu.RUnlock()
	}
	return t.d != nil && t.d.rep != nil && t.d.rep.HasLearner(id)
}

// takeTransfer takes bytes from the node's transfer bucket if it holds
// any (it may go into debt by one send); false while it is empty.
func (n *Node) takeTransfer(bytes int) bool {
	lim := n.transferLimiter
	if lim == nil {
		return true
	}
	now := time.Now()
	if lim.TokensAt(now) <= 0 {
		return false
	}
	for bytes > 0 {
		c := min(bytes, transferBurstBytes)
		lim.ReserveN(now, c)
		bytes -= c
	}
	return true
}
