package client

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/keyspace"
)

// Range splits in the producer (docs/split.md, "SDK"). The producer routes
// by the stream's range map (keyspace.RangeMap.LookupKey: the range
// without children whose hash slice holds the key). When a range answers
// RANGE_SPLIT to the oldest batch in flight, nothing of that batch nor of
// any batch behind it is in the range (the server answers a batch it holds
// with its offset first, and a range takes a sequence only after the one
// before it). The range's driver then describes the stream until the map
// shows the range split and, holding the producer's routing lock (so that
// no Produce routes meanwhile), hands its unacknowledged batches' records
// and then its buffered ones, in order, to the children that own their
// keys, and ends. Per key, records keep their order: each key's records
// from the parent reach one child before any produced later, which route
// by the new map. A child's batches start its own producer sequence.

// splitRefreshAttemptsMax bounds the DescribeStream calls of one hand-off
// (the range's split is recorded in the catalogue shortly after its marker
// commits, so a node may describe the old map for a moment); the driver
// then resends, hears RANGE_SPLIT again and tries again.
const splitRefreshAttemptsMax = 20

// RangeMap returns the stream's range map as described (validated: a map
// from the network is checked before it routes anything).
func (d *StreamDescription) RangeMap() (keyspace.RangeMap, error) {
	m := keyspace.RangeMap{Version: d.RangeMapVersion, Initial: d.Stream.RangeCount}
	for i, r := range d.Ranges {
		if r.Range != uint32(i) {
			return keyspace.RangeMap{}, apierr.New(apierr.Internal, "server described range %d at position %d", r.Range, i)
		}
		kr := keyspace.Range{ID: r.Range, HashStart: r.HashStart, HashEnd: r.HashEnd, Parent: r.Parent,
			Left: keyspace.NoRange, Right: keyspace.NoRange, SplitOffset: r.SplitOffset}
		if len(r.Children) == 2 {
			kr.Left, kr.Right = r.Children[0], r.Children[1]
		} else if len(r.Children) != 0 {
			return keyspace.RangeMap{}, apierr.New(apierr.Internal, "server described range %d with %d children", r.Range, len(r.Children))
		}
		m.Ranges = append(m.Ranges, kr)
	}
	if err := m.Validate(); err != nil {
		return keyspace.RangeMap{}, apierr.Wrap(apierr.Internal, err, "server described an invalid range map")
	}
	return m, nil
}

// route is the range of a record with key (keyless: the sticky range, or
// a random active one once that split); routeMu is held.
func (p *Producer) route(key []byte, rangeCount uint32) uint32 {
	m := p.rmap.Load()
	switch {
	case len(key) > 0 && m == nil:
		return keyspace.RangeForKey(key, rangeCount)
	case len(key) > 0:
		return m.LookupKey(key)
	}
	rng := p.sticky.Load()
	if m != nil && m.Ranges[rng].IsSplit() {
		return m.Lookup(rand.Uint64())
	}
	return rng
}

// setMapLocked installs m if it is newer than the producer's, growing the
// drivers for its new ranges; routeMu is held for writing.
func (p *Producer) setMapLocked(m keyspace.RangeMap) {
	if cur := p.rmap.Load(); cur != nil && cur.Version >= m.Version {
		return
	}
	if len(m.Ranges) > len(p.drivers) {
		p.mu.Lock()
		grown := make([]atomic.Pointer[rangeDriver], len(m.Ranges))
		for i := range p.drivers {
			grown[i].Store(p.drivers[i].Load())
		}
		p.drivers = grown
		p.mu.Unlock()
	}
	p.rmap.Store(&m)
}

// refreshMap describes the stream until its map shows range parent split.
func (p *Producer) refreshMap(parent uint32) (keyspace.RangeMap, error) {
	var last error
	for attempt := 0; attempt < splitRefreshAttemptsMax; attempt++ {
		if attempt > 0 {
			select {
			case <-p.ctx.Done():
				return keyspace.RangeMap{}, ErrClosed
			case <-time.After(time.Duration(min(attempt, 5)) * 20 * time.Millisecond):
			}
		}
		ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
		desc, err := p.c.DescribeStream(ctx, p.stream)
		cancel()
		if err != nil {
			last = err
			continue
		}
		m, err := desc.RangeMap()
		if err != nil {
			return keyspace.RangeMap{}, err
		}
		if r, ok := m.Get(parent); ok && r.IsSplit() {
			return m, nil
		}
		last = fmt.Errorf("range %d answered RANGE_SPLIT; the stream's map (version %d) does not show it split yet", parent, m.Version)
	}
	return keyspace.RangeMap{}, last
}

// splitAway handles RANGE_SPLIT for the oldest batch in flight: the range
// hands everything it holds to its children and ends (true), or, if the
// map is not to be had yet, resends later (false).
func (d *rangeDriver) splitAway(e *Error) bool {
	d.closeConn()
	m, err := d.p.refreshMap(d.rng)
	if err != nil {
		d.log.Debug("range split; its map is not known yet", "error", err)
		d.rewind(e)
		return false
	}
	d.log.Info("range split; its records go to its children", "map_version", m.Version, "inflight_batches", len(d.batches))
	d.p.handOff(d, m)
	return true
}

// handOff moves d's unacknowledged and buffered records, in order, to the
// ranges m routes them to.
func (p *Producer) handOff(d *rangeDriver, m keyspace.RangeMap) {
	p.routeMu.Lock()
	defer p.routeMu.Unlock()
	p.setMapLocked(m)
	// In-flight records were counted as sent when they were cut; they are
	// unsent again in the children's queues (each child's cut counts them
	// sent once more).
	var recs []*promisedRecord
	inflight := 0
	for _, b := range d.batches {
		recs = append(recs, b.recs...)
		inflight += b.sizeBytes
	}
	d.batches = nil
	p.budget.requeue(int64(inflight))
	d.mu.Lock()
	d.closed = true
	recs = append(recs, d.pending[d.pendingHead:]...)
	d.pending, d.pendingHead, d.pendingBytes = nil, 0, 0
	d.mu.Unlock()
	var lost []*promisedRecord
	for _, pr := range recs {
		child := p.driver(p.route(pr.rec.Key, p.rangeCount.Load()))
		if pr.stopCtx != nil {
			pr.stopCtx()
			pr.stopCtx = nil
			if child != nil {
				pr.stopCtx = context.AfterFunc(pr.ctx, child.requestSweep)
			}
		}
		if child == nil || !child.enqueue(pr) {
			lost = append(lost, pr) // the producer is closing
		}
	}
	if len(lost) > 0 {
		left := &batch{recs: lost, sizeBytes: sumSizes(lost)}
		p.budget.dequeue(int64(left.sizeBytes))
		d.fail(left, func(*promisedRecord) error { return ErrClosed })
	}
}
