package regionsvc

import (
	"context"
	"io"

	"golang.org/x/time/rate"
)

// The bound on transfer bandwidth: a snapshot this node sends (a learner
// catching up from the leader's segments, replica/snapshot.go) reads its
// body through one token bucket per node, RebalanceConfig.
// TransferBytesPerSecond, so that a move's catch-up leaves the disk and the
// network to the producers. Log entries a learner is sent (Raft's
// appends, bounded by its in-flight window) are not throttled: they are
// what a follower gets anyway.

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
