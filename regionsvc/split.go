package regionsvc

import (
	"context"
	"errors"
	"sync"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/keyspace"
)

// Range splits in a node (docs/split.md). Built so far (notes/split.md):
// a range's home leader decides a split from the stream's range map and
// proposes a split marker through the range's append path (lease and
// epoch checks included); once committed, the marker's offset is the
// range's split offset, and every copy of the range refuses appends from
// the moment its log holds the marker (replica/split.go: RANGE_SPLIT,
// retriable once the producer refreshed its map). The catalogue's split
// record then adds the children to the stream's map and every node opens
// their Raft groups (split_apply.go); appends are checked against the
// map. Not built yet: homing rows, the SDK's routing, the readers' end of
// range, consumers moving to the children, mirrors' children, automatic
// splits.

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
// midpoint) from any node of the range's home region (split_admin.go has
// the steps): on the catalogue leader, or forwarded to it. It returns once
// the split is recorded in the catalogue and applied here, with the split
// offset. RANGE_SPLIT: the range had split already; SPLIT_IN_PROGRESS:
// another split of the stream holds its reservation. An error after the
// marker committed leaves the reservation standing: the same split asked
// for again finishes it.
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
	if d := st.ranges[r]; !d.isHome() {
		return splitResult{}, n.notHome(d)
	}
	if !n.leadsCatalogue() {
		if isForwarded(ctx) {
			return splitResult{}, apierr.New(apierr.NotLeader, "this node no longer leads the region's catalogue")
		}
		return n.forwardSplit(ctx, stream, r, at)
	}
	if !n.splits.enter(stream) {
		return splitResult{}, apierr.New(apierr.SplitInProgress, "stream %q: another split of it is under way on this node", stream)
	}
	defer n.splits.leave(stream)
	dec, err := n.reserveSplit(ctx, st.spec, r, at) // split_reserve.go
	if err != nil {
		return splitResult{}, err
	}
	res, err := n.splitMarker(ctx, stream, dec) // split_admin.go
	if err != nil {
		return res, err
	}
	if err := n.splitHomes(ctx, stream, res); err != nil {
		return res, err
	}
	if err := n.catalogueSplit(ctx, stream, r, res); err != nil { // split_apply.go
		return res, apierr.Wrap(apierr.As(err).Code, err, "stream %q range %d split at offset %d; its catalogue record", stream, r, res.offset)
	}
	return res, nil
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

// keyRouter says which range a key belongs to, by a stream's range map.
type keyRouter struct {
	// count is the stream's range count as created; m its map once a
	// range split (nil: never split).
	count uint32
	m     *keyspace.RangeMap
}

// keyRouter returns the stream's key router.
func (s streamSpec) keyRouter() keyRouter { return keyRouter{count: s.RangeCount, m: s.RangeMap} }

// owns reports whether range r's slice holds key: the range key's records
// were appended to. A split range still owns its slice (it refuses the
// append itself, with RANGE_SPLIT, so a producer with a stale map
// refreshes it instead of failing).
func (k keyRouter) owns(r uint32, key []byte) bool {
	if k.m == nil {
		return keyspace.RangeForKey(key, k.count) == r
	}
	return k.m.Owns(r, keyspace.Hash(key))
}

// rangeOf is the range that takes key's appends now.
func (k keyRouter) rangeOf(key []byte) uint32 {
	if k.m == nil {
		return keyspace.RangeForKey(key, k.count)
	}
	return k.m.LookupKey(key)
}

// rangeTotal is how many ranges the stream has ever had: as created,
// and the children of every split.
func (s streamSpec) rangeTotal() uint32 {
	if s.RangeMap != nil {
		return uint32(len(s.RangeMap.Ranges))
	}
	return s.RangeCount
}
