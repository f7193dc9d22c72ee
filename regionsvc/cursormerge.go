package regionsvc

import (
	"context"
	"fmt"
	"time"

	"github.com/geolog/geolog/cursors"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/replica"
)

// Merging back what a failover stranded (docs/consumers.md, "The old home
// returns"): when a region that was home for a cursor range comes back,
// its copy forks and the commits it acknowledged but never shipped move to
// the range's orphan log. The leader of that copy reads them there and
// sends their positions to the coordinator as a merge (CommitCursors with
// merge, forwarded): each raises its register if it is still below it.
// Group records are never merged (a stale membership). A fork is merged
// once per node run; merging it again (after a restart) changes nothing.

// cursorMergeInterval is how often a node looks for forks to merge.
const cursorMergeInterval = 2 * time.Second

// mergeKey names one fork of one cursor range.
type mergeKey struct {
	rng   uint32
	index uint64
}

// mergeOrphans merges every fork of the cursor ranges whose copy this
// node leads and that it has not merged yet.
func (cs *cursorService) mergeOrphans(ctx context.Context) {
	n := cs.n
	for _, cr := range cs.all() {
		d := cr.d
		if d.rep == nil || d.rep.LeaderID() != n.cfg.NodeID {
			continue
		}
		for _, f := range d.rep.Orphans() {
			k := mergeKey{cr.idx, f.Index}
			if cs.merged[k] || f.Records == 0 {
				continue
			}
			if err := cs.mergeFork(ctx, cr, f); err != nil {
				cs.logger.Warn("merge orphaned cursor commits back", "range", cr.idx, "fork", f.Index, "error", err)
				continue
			}
			cs.merged[k] = true
		}
	}
}

// mergeFork reads one fork's orphaned records and merges their positions.
func (cs *cursorService) mergeFork(ctx context.Context, cr *cursorRange, f replica.ForkRecord) error {
	byCursor := map[string][]cursors.Position{}
	for from := f.FirstOffset; from < f.NextOffset; {
		resp, err := cs.n.readOrphans(ctx, &geologv1.ReadOrphansRequest{Stream: cursorStreamName, Range: cr.idx, ForkIndex: f.Index, FromOffset: from})
		if err != nil {
			return err
		}
		for _, r := range resp.Records {
			d, err := cursors.Decode(cursors.Record{Key: r.Key, Value: r.Value, Tombstone: r.Tombstone})
			if err == nil && d.Position != nil && !d.Position.Deleted {
				byCursor[d.Cursor] = append(byCursor[d.Cursor], *d.Position)
			}
		}
		if resp.NextOffset <= from {
			return fmt.Errorf("orphan log read made no progress at %d", from)
		}
		from = resp.NextOffset
	}
	merged := 0
	for cursor, ps := range byCursor {
		for len(ps) > 0 {
			chunk := ps[:min(len(ps), cursors.CommitPositionsMax)]
			ps = ps[len(chunk):]
			req := &geologv1.CommitCursorsRequest{Cursor: cursor, Merge: true, Positions: positionsToProto(chunk)}
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			resp, err := cs.n.coordinate(cctx, cr, func(b *cursors.Batch, _ *cursors.Coordinator) (any, error) {
				return commitResponse(b.Merge(cursor, chunk))
			}, func(ctx context.Context, c geologv1.ConsumerClient) (any, error) { return c.CommitCursors(ctx, req) })
			cancel()
			if err != nil {
				return err
			}
			for _, r := range resp.(*geologv1.CommitCursorsResponse).GetResults() {
				if r.GetApplied() {
					merged++
				}
			}
		}
	}
	cs.logger.Info("merged orphaned cursor commits back", "range", cr.idx, "fork", f.Index, "cursors", len(byCursor), "positions_raised", merged)
	return nil
}

// mergeCursor serves a forwarded merge at the coordinator.
func (n *Node) mergeCursor(ctx context.Context, cursor string, ps []cursors.Position, req *geologv1.CommitCursorsRequest) (*geologv1.CommitCursorsResponse, error) {
	cr, err := n.cursors.rangeFor(ctx, cursor)
	if err != nil {
		return nil, err
	}
	v, err := n.coordinate(ctx, cr, func(b *cursors.Batch, _ *cursors.Coordinator) (any, error) {
		return commitResponse(b.Merge(cursor, ps))
	}, func(ctx context.Context, c geologv1.ConsumerClient) (any, error) { return c.CommitCursors(ctx, req) })
	if err != nil {
		return nil, err
	}
	return v.(*geologv1.CommitCursorsResponse), nil
}

// commitResponse is the reply of a commit or merge.
func commitResponse(res []cursors.CommitResult, err error) (any, error) {
	if err != nil {
		return nil, err
	}
	// The messages are allocated together: two allocations per request
	// instead of two per position.
	results := make([]geologv1.CursorCommitResult, len(res))
	positions := make([]geologv1.CursorPosition, len(res))
	out := &geologv1.CommitCursorsResponse{Results: make([]*geologv1.CursorCommitResult, len(res))}
	for i, r := range res {
		p, q := &positions[i], r.Position
		p.Stream, p.Range, p.Offset, p.Epoch, p.Generation = q.Stream, q.Range, q.Offset, q.Epoch, q.Generation
		p.Metadata, p.CommitTimeUnixNanos = q.Metadata, q.CommitTimeUnixNanos
		results[i].Position, results[i].Applied = p, r.Applied
		out.Results[i] = &results[i]
	}
	return out, nil
}
