package client

import (
	"context"
	"errors"
	"iter"
	"sync"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/keyspace"
)

// Readers across a range split (docs/split.md "Readers"). A split range's
// log ends at its split offset: a read at or past it answers RANGE_SPLIT
// (not retriable) naming the split offset and the two children, where the
// range's keys continue from offset 0 (RangeEnded). Subscribe follows it:
// it reads the parent to its end, then the children, so that each key's
// records come in append order (a key's records after the split are in
// exactly one child). Following both children, it yields their records as
// they come, interleaved between the children but in offset order within
// each (StoredRecord.Range tells them apart); a subscription by key
// follows the one child that owns its key (both for the keyless records,
// which producers spread over every range). A child that splits in turn
// is followed the same way. This is how Kinesis's KCL and Pravega's
// readers treat a shard's or segment's successors: the parent first.

// RangeEnd is where a split range's log ends: its records are those below
// SplitOffset, and its keys continue in Children (two ranges, each read
// from offset 0); the first owns the keys whose hash is below At.
type RangeEnd struct {
	SplitOffset uint64
	Children    []uint32
	At          uint64
}

// RangeEnded reports whether err is a read's answer that the range split
// and the read was at or past its end (Read, and the end of a
// subscription that does not follow the children), and where the range's
// keys continue.
func RangeEnded(err error) (RangeEnd, bool) {
	var e *Error
	if !errors.As(err, &e) || e.Code != apierr.RangeSplit || e.Retriable || e.SplitChildren == ([2]uint32{}) {
		return RangeEnd{}, false
	}
	return RangeEnd{SplitOffset: e.SplitOffset, Children: e.SplitChildren[:], At: e.SplitAt}, true
}

// childrenToRead are the children of end a reader of key (nil: every key)
// reads.
func (end RangeEnd) childrenToRead(key []byte) []uint32 {
	if len(key) == 0 {
		return end.Children // every key, or the keyless records
	}
	if keyspace.Hash(key) < end.At {
		return end.Children[:1]
	}
	return end.Children[1:]
}

// followSplit is a subscription's end at a split (end): it goes on with
// the children, yielding their records until ctx ends, the consumer stops
// iterating, or a child ends with an error (yielded).
func (c *Client) followSplit(ctx context.Context, s *subscription, end RangeEnd, copts []ConsumerOpt, yield func(StoredRecord, error) bool) {
	start := StartAt{}
	if !s.delivered && !s.start.Time.IsZero() {
		// It started by time and found nothing in the parent: the same
		// time in the children.
		start.Time = s.start.Time
	}
	c.log.Debug("subscription follows a split", "stream", s.stream, "range", s.rng, "split_offset", end.SplitOffset, "children", end.Children)
	children := end.childrenToRead(s.key)
	if len(children) == 1 {
		for rec, err := range c.subscribeRange(ctx, s.stream, children[0], s.key, start, copts, true) {
			if !yield(rec, err) || err != nil {
				return
			}
		}
		return
	}
	mergeSubscriptions(ctx, yield, func(ctx context.Context, child uint32) iter.Seq2[StoredRecord, error] {
		return c.subscribeRange(ctx, s.stream, child, s.key, start, copts, true)
	}, children)
}

// childRangeWaitMax bounds how long a subscription of a split's child
// waits for nodes to know the child (RANGE_NOT_FOUND): each node applies
// the split's catalogue record shortly after the parent's marker.
const childRangeWaitMax = 30 * time.Second

// childUnknown reports whether err is a node's RANGE_NOT_FOUND for a
// split's child that the subscription still waits out (retrying, with
// backoff, for up to childRangeWaitMax).
func (s *subscription) childUnknown(err error) bool {
	if !s.child || CodeOf(err) != CodeRangeNotFound {
		return false
	}
	if s.childWaitFrom.IsZero() {
		s.childWaitFrom = time.Now()
	}
	return time.Since(s.childWaitFrom) < childRangeWaitMax
}

// mergeSubscriptions yields the records of the subscriptions of ranges
// as they come, one goroutine per range (each range's records in its
// order), until the consumer stops iterating or one yields an error
// (yielded, and the others stopped). It returns once every goroutine has.
func mergeSubscriptions(ctx context.Context, yield func(StoredRecord, error) bool,
	sub func(ctx context.Context, rng uint32) iter.Seq2[StoredRecord, error], ranges []uint32) {
	ctx, cancel := context.WithCancel(ctx)
	type item struct {
		rec StoredRecord
		err error
	}
	items := make(chan item)
	var wg sync.WaitGroup
	for _, rng := range ranges {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rec, err := range sub(ctx, rng) {
				select {
				case items <- item{rec, err}:
				case <-ctx.Done():
					return
				}
				if err != nil {
					return
				}
			}
		}()
	}
	go func() { wg.Wait(); close(items) }()
	defer func() {
		cancel()
		for range items { // until every goroutine returned
		}
	}()
	for it := range items {
		if !yield(it.rec, it.err) || it.err != nil {
			return
		}
	}
}

// Group members across a split (docs/split.md "Consumer groups and
// cursors"). A member's fetch of a split range ends with RANGE_SPLIT once
// every record of the range was delivered; the end then goes through
// Records after those records (endRange). Once every record yielded
// before it is marked processed (at once without ManualCommit, else as
// the application marks them), the member marks the split offset, commits
// it and heartbeats: the coordinator, seeing the range finished, gives
// its children to the group (starting at offset 0) and asks this member
// to release it. Until then the range stays owned, its fetcher idle.

// yielding notes that rec is about to be yielded; false if its range's
// ownership token is no longer current (revoked since it was fetched).
func (g *GroupConsumer) yielding(rng uint32, token uint64, rec StoredRecord) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	gr, ok := g.ranges[rng]
	if !ok || gr.token != token {
		return false
	}
	gr.yielded = max(gr.yielded, rec.Offset+1)
	return true
}

// endRange takes a range's end (a split at splitOffset) from Records.
func (g *GroupConsumer) endRange(rng uint32, token uint64, splitOffset uint64) {
	g.mu.Lock()
	gr, ok := g.ranges[rng]
	if ok && gr.token == token {
		gr.ended, gr.splitOffset = true, splitOffset
		gr.markEnd()
	}
	g.mu.Unlock()
	if ok {
		g.log.Debug("range ended at a split", "range", rng, "split_offset", splitOffset)
		g.kick()
	}
}

// markEnd marks the split offset of an ended range once every record
// yielded is marked; g.mu is held.
func (gr *groupRange) markEnd() {
	if gr.ended && gr.marked >= gr.yielded && gr.splitOffset > gr.marked {
		gr.marked = gr.splitOffset
	}
}

// commitEnded commits the positions of ranges that ended at a split.
func (g *GroupConsumer) commitEnded() {
	g.mu.Lock()
	var ended []uint32
	for rng, gr := range g.ranges {
		if gr.ended && gr.marked > gr.committed {
			ended = append(ended, rng)
		}
	}
	g.mu.Unlock()
	if len(ended) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(g.ctx, g.heartbeatTimeout())
	defer cancel()
	if err := g.commit(ctx, ended); err != nil && g.ctx.Err() == nil {
		g.log.Debug("commit of ended ranges", "ranges", ended, "error", err)
	}
}
