package regionsvc

import (
	"errors"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/cursors"
	"github.com/geolog/geolog/keyspace"
	"github.com/geolog/geolog/segment"
)

// Readers of a split range (docs/split.md "Readers"). A range's log ends
// at its split offset: its records are those below it, the marker holds
// the split offset, and nothing follows. Every read of the range (Read in
// either form, a read by key, Subscribe, a group's Fetch) is bounded by
// the split offset, and a read at or past it answers RANGE_SPLIT, not
// retriable, naming the split offset and the two children, where the
// range's keys continue from offset 0. So a reader is never handed the
// marker's offset as its next offset (it would then stand past the end
// of the records it can read), and a reader at the split offset learns
// where to go instead of waiting for records that will never come.
//
// The driver publishes the end (publishSplitEnd) before it publishes a
// committed offset past the marker, both on its goroutine, and readers
// load the committed offset before the end (readBounds, readTail): a
// reader that sees the marker committed sees the end.

// A read that meets the marker itself stops there too (recordReader,
// frameCollector: splitEndOf), and answers the end if it found nothing
// before it: whatever the moment, a read's next offset is never past the
// split offset.

// splitEndOf is the end a split marker's frame makes.
func splitEndOf(frame []byte) (*splitEnd, error) {
	h, dec, err := batch.DecodeSplit(frame)
	if err != nil {
		return nil, &segment.CorruptionError{Offset: h.BaseOffset, Err: errors.Join(segment.ErrCorrupt, err)}
	}
	return &splitEnd{offset: h.BaseOffset, at: dec.At, left: dec.Left, right: dec.Right}, nil
}

// splitEnd is a split range's end, as readers see it.
type splitEnd struct {
	offset, at  uint64
	left, right uint32
}

// publishSplitEnd publishes the range's end once its replica applied a
// split marker. For the driver goroutine.
func (d *rangeDriver) publishSplitEnd() {
	if d.splitEnd.Load() != nil || d.rep == nil || !d.rep.SplitPending() {
		return
	}
	dec, off, ok, err := d.rep.SplitApplied()
	if err != nil {
		d.logger.Error("split marker unreadable: reads are not bounded by it", "error", err)
		return
	}
	if ok {
		d.splitEnd.Store(&splitEnd{offset: off, at: dec.At, left: dec.Left, right: dec.Right})
	}
}

// boundBySplit bounds a read from offset from whose end is end by the
// range's split: the end is at most the split offset, and a read at or
// past it gets RANGE_SPLIT.
func (d *rangeDriver) boundBySplit(from, end uint64) (uint64, error) {
	s := d.splitEnd.Load()
	if s == nil {
		return end, nil
	}
	if from >= s.offset {
		var start uint64
		if d.store != nil {
			start = d.store.StartOffset()
		}
		return 0, s.ended(d.cfg.stream, d.cfg.rangeID, from, start)
	}
	return min(end, s.offset), nil
}

// ended is the answer to a read at from, at or past the split offset.
func (s *splitEnd) ended(stream string, rng uint32, from, start uint64) *apierr.Error {
	e := apierr.New(apierr.RangeSplit, "stream %s range %d split at offset %d (offset %d asked): its records end there, and its keys continue in ranges %d and %d from offset 0",
		stream, rng, s.offset, from, s.left, s.right)
	e.Retriable = false
	e.StartOffset, e.TailOffset = start, s.offset
	e.SplitOffset, e.SplitChildren, e.SplitAt = s.offset, [2]uint32{s.left, s.right}, s.at
	return e
}

// readTail is the tail a read reply reports: the servable end, bounded by
// the split offset (a split range's readers see its log end there).
func (d *rangeDriver) readTail() uint64 {
	end := d.servableEnd()
	if s := d.splitEnd.Load(); s != nil {
		return min(end, s.offset)
	}
	return end
}

// groupSplits is the cursor coordinator's view of a stream's splits
// (cursors.SplitsOf): from this node's catalogue, which the coordinator's
// node applies in order like every node (a map only grows).
func (n *Node) groupSplits(stream string) []cursors.Split {
	n.mu.RLock()
	st, ok := n.streams[stream]
	var out []cursors.Split
	if ok && st.spec.RangeMap != nil {
		for _, r := range st.spec.RangeMap.Ranges {
			if r.IsSplit() {
				out = append(out, cursors.Split{Parent: r.ID, SplitOffset: r.SplitOffset, Left: r.Left, Right: r.Right})
			}
		}
	}
	n.mu.RUnlock()
	return out
}

// newCoordinator is a cursor range's group coordinator, assigning over
// the range maps of this node's catalogue.
func (n *Node) newCoordinator() *cursors.Coordinator {
	c := cursors.NewCoordinator()
	c.SplitsOf = n.groupSplits
	return c
}

// learnSplitEnd takes the range's end from the stream's range map (the
// catalogue's split record as it applies, or the saved catalogue as the
// range opens), if the range split: the second source beside the marker,
// for a copy whose log no longer holds it (retention deleted its
// segment, or the copy has not written it yet; a read at or past the
// split offset is past every record of the range either way). The map
// has the split only once the marker is committed, at the same offset.
func (d *rangeDriver) learnSplitEnd(m *keyspace.RangeMap) {
	if m == nil {
		return
	}
	r, ok := m.Get(d.cfg.rangeID)
	if !ok || !r.IsSplit() {
		return
	}
	right, ok := m.Get(r.Right)
	if !ok {
		return
	}
	if d.splitEnd.CompareAndSwap(nil, &splitEnd{offset: r.SplitOffset, at: right.HashStart, left: r.Left, right: r.Right}) {
		d.notify() // a subscription waiting at the end learns it
	}
}
