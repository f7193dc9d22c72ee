package regionsvc

import (
	"context"
	"errors"
	"sync"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/keyspace"
)

// Range splits in a node (docs/split.md). Built so far (stage 2 of
// notes/split.md): a range's home leader decides a split from the
// stream's range map and proposes a split marker through the range's
// append path (lease and epoch checks included); once committed, the
// marker's offset is the range's split offset, and every copy of the
// range refuses appends from the moment its log holds the marker
// (replica/split.go: RANGE_SPLIT, retriable once the producer refreshed
// its map). Not built yet: the catalogue record that adds the children to
// the stream's map and opens their Raft groups, their homing rows, the
// readers' end of range, consumers moving to the children, mirrors'
// children, automatic splits.

// splitResult is a committed split: the marker's offset (the parent's
// split offset) and its decision.
type splitResult struct {
	offset   uint64
	epoch    uint64
	decision batch.Split
}

// splitGuard admits one split decision per stream at a time on this node:
// a decision takes the next version and ids of the stream's map, which
// two concurrent splits would both take. (Across nodes and regions the
// catalogue record, stage 3, is what serializes them.)
type splitGuard struct {
	mu       sync.Mutex
	inFlight map[string]bool
}

func (g *splitGuard) enter(stream string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inFlight[stream] {
		return false
	}
	if g.inFlight == nil {
		g.inFlight = map[string]bool{}
	}
	g.inFlight[stream] = true
	return true
}

func (g *splitGuard) leave(stream string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.inFlight, stream)
}

// rangeMap is the stream's range map: as recorded, or the map as created.
func (s streamSpec) rangeMap() keyspace.RangeMap {
	if s.RangeMap != nil {
		return s.RangeMap.Clone()
	}
	return keyspace.NewRangeMap(s.RangeCount)
}

// splitDecision is the decision to split range r of m at hash boundary at
// (0: the range's midpoint), or why it cannot be taken.
func splitDecision(stream string, m keyspace.RangeMap, r uint32, at uint64) (batch.Split, error) {
	var err error
	if at == 0 {
		at, err = m.MidPoint(r)
	}
	if err == nil {
		err = m.CheckSplit(r, at)
	}
	switch {
	case errors.Is(err, keyspace.ErrRangeNotFound):
		return batch.Split{}, apierr.Wrap(apierr.RangeNotFound, err, "stream %q range %d", stream, r)
	case errors.Is(err, keyspace.ErrAlreadySplit):
		return batch.Split{}, apierr.Wrap(apierr.RangeSplit, err, "stream %q range %d", stream, r)
	case err != nil:
		return batch.Split{}, apierr.Wrap(apierr.InvalidArgument, err, "stream %q range %d", stream, r)
	}
	p, _ := m.Get(r)
	left, right := m.NextIDs()
	return batch.Split{MapVersion: m.Version + 1, Parent: r, HashStart: p.HashStart, HashEnd: p.HashEnd, At: at, Left: left, Right: right}, nil
}

// splitRange splits range r of stream at hash boundary at (0: the
// midpoint). This node must lead the range in its home region; it
// returns once the marker is committed, with the split offset. A
// RANGE_SPLIT answer means the range had split (or a split was under
// way) already.
func (n *Node) splitRange(ctx context.Context, stream string, r uint32, at uint64) (splitResult, error) {
	if isInternalStream(stream) || stream == metaStreamName {
		return splitResult{}, apierr.New(apierr.InvalidArgument, "stream %q is the node's own: its ranges do not split", stream)
	}
	st, err := n.lookupStream(ctx, stream)
	if err != nil {
		return splitResult{}, err
	}
	if r >= uint32(len(st.ranges)) {
		return splitResult{}, apierr.New(apierr.RangeNotFound, "stream %q has %d ranges; range %d does not exist", stream, len(st.ranges), r)
	}
	d := st.ranges[r]
	if !d.isHome() {
		return splitResult{}, n.notHome(d)
	}
	if !n.splits.enter(stream) {
		return splitResult{}, apierr.New(apierr.Unavailable, "stream %q: another split of it is under way on this node", stream)
	}
	defer n.splits.leave(stream)
	dec, err := splitDecision(stream, st.spec.rangeMap(), r, at)
	if err != nil {
		return splitResult{}, err
	}
	epoch, err := n.admit(d)
	if err != nil {
		return splitResult{}, err
	}
	return d.proposeSplit(ctx, epoch, dec)
}

// proposeSplit appends the split marker of dec at epoch through the
// range's append path and waits for its answer.
func (d *rangeDriver) proposeSplit(ctx context.Context, epoch uint64, dec batch.Split) (splitResult, error) {
	done := make(chan appendResult, 1) // reply is called once and must not block
	op := &appendOp{recordCount: 1, epoch: epoch, frame: batch.EncodeSplit(nil, batch.Header{}, dec),
		reply: func(r appendResult) { done <- r }}
	d.submit(ctx, op)
	select {
	case res := <-done:
		if res.err != nil {
			return splitResult{}, res.err
		}
		d.logger.Info("range split", "offset", res.baseOffset, "epoch", res.epoch, "left", dec.Left, "right", dec.Right, "at", dec.At)
		return splitResult{offset: res.baseOffset, epoch: res.epoch, decision: dec}, nil
	case <-ctx.Done():
		return splitResult{}, apierr.Wrap(apierr.Timeout, ctx.Err(), "split of range %d: the outcome is unknown", d.cfg.rangeID)
	}
}
