package regionsvc

import (
	"sort"

	"github.com/geolog/geolog/apierr"
)

// recentBatchesMax is how many of a producer's latest batches a range
// remembers per producer, so that a retried batch gets its original offsets
// back. Clients must keep their in-flight window at or below it (the SDK's
// maximum is 16).
const recentBatchesMax = 16

// sentBatch is what the dedup table remembers of one idempotent batch.
type sentBatch struct {
	baseSequence        uint64
	recordCount         uint32
	baseOffset          uint64
	epoch               uint64
	appendTimeUnixNanos int64
}

// producerState is one producer's state within one range.
type producerState struct {
	// nextSequence is the sequence the producer's next batch must start at.
	nextSequence uint64
	// recent holds the latest batches, oldest first, at most recentBatchesMax.
	recent []sentBatch
	// lastAppendUnixNanos is the append time of the newest batch, for expiry.
	lastAppendUnixNanos int64
}

// dedupVerdict says what to do with an idempotent batch.
type dedupVerdict int

const (
	verdictAppend    dedupVerdict = iota // new: append it
	verdictDuplicate                     // already appended: answer with the original
	verdictReject                        // refuse with the returned error
)

// dedupTable is a range's idempotent-producer state. It is a pure data
// structure owned by the range driver goroutine: it is derived from the log
// (rebuilt on open from batch headers) and so survives restarts, and with
// Raft later, leader changes.
type dedupTable struct {
	producers    map[uint64]*producerState
	producersMax int
}

func newDedupTable(producersMax int) *dedupTable {
	return &dedupTable{producers: make(map[uint64]*producerState), producersMax: producersMax}
}

// check classifies a batch of count records from producer starting at
// baseSequence. For verdictDuplicate it returns the original batch.
//
// Rules (Kafka's idempotent producer, simplified):
//   - unknown producer: the batch must start at sequence 0, else SEQUENCE_GAP
//     with expected sequence 0 (a lost first batch, or expired state);
//   - baseSequence == next: append;
//   - an exact match of a remembered batch: duplicate, original offsets;
//   - entirely below next but no longer remembered: DUPLICATE_OUT_OF_WINDOW;
//   - overlapping a remembered batch without matching it: INVALID_ARGUMENT;
//   - above next: SEQUENCE_GAP, carrying the expected sequence.
func (d *dedupTable) check(producerID, baseSequence uint64, count uint32) (dedupVerdict, sentBatch, error) {
	p, ok := d.producers[producerID]
	if !ok {
		if baseSequence == 0 {
			return verdictAppend, sentBatch{}, nil
		}
		// Either the producer's first batch failed and a later one came
		// first (appending it would lose the first for good), or its state
		// expired with the log that held it. Both are a gap from 0; the SDK
		// answers it by continuing under a fresh producer id.
		e := apierr.New(apierr.SequenceGap, "producer %d is unknown to this range: its first batch must start at sequence 0, not %d", producerID, baseSequence)
		return verdictReject, sentBatch{}, e
	}
	if baseSequence == p.nextSequence {
		return verdictAppend, sentBatch{}, nil
	}
	if baseSequence > p.nextSequence {
		e := apierr.New(apierr.SequenceGap, "producer %d: batch starts at sequence %d, expected %d", producerID, baseSequence, p.nextSequence)
		e.ExpectedSequence = p.nextSequence
		return verdictReject, sentBatch{}, e
	}
	for _, b := range p.recent {
		if b.baseSequence == baseSequence && b.recordCount == count {
			return verdictDuplicate, b, nil
		}
	}
	if baseSequence+uint64(count) <= p.nextSequence {
		if len(p.recent) == 0 || baseSequence < p.recent[0].baseSequence {
			e := apierr.New(apierr.DuplicateOutOfWindow, "producer %d: sequence %d was appended before the last %d batches", producerID, baseSequence, recentBatchesMax)
			e.ExpectedSequence = p.nextSequence
			return verdictReject, sentBatch{}, e
		}
	}
	e := apierr.New(apierr.InvalidArgument, "producer %d: batch [%d, %d) overlaps earlier batches without matching one", producerID, baseSequence, baseSequence+uint64(count))
	e.ExpectedSequence = p.nextSequence
	return verdictReject, sentBatch{}, e
}

// record notes an appended idempotent batch. It is called both for new
// appends and, during recovery, for every batch read back from the log.
func (d *dedupTable) record(producerID uint64, b sentBatch) {
	p, ok := d.producers[producerID]
	if !ok {
		if len(d.producers) >= d.producersMax {
			d.evictOldest()
		}
		p = &producerState{recent: make([]sentBatch, 0, 4)}
		d.producers[producerID] = p
	}
	p.nextSequence = b.baseSequence + uint64(b.recordCount)
	if len(p.recent) == recentBatchesMax {
		copy(p.recent, p.recent[1:])
		p.recent = p.recent[:recentBatchesMax-1]
	}
	p.recent = append(p.recent, b)
	p.lastAppendUnixNanos = b.appendTimeUnixNanos
}

// expire forgets producers whose newest batch is older than cutoffUnixNanos.
func (d *dedupTable) expire(cutoffUnixNanos int64) int {
	n := 0
	for id, p := range d.producers {
		if p.lastAppendUnixNanos < cutoffUnixNanos {
			delete(d.producers, id)
			n++
		}
	}
	return n
}

// evictOldest drops the tenth of producers that appended least recently, so
// that the O(n log n) eviction cost is amortised over many inserts.
func (d *dedupTable) evictOldest() {
	type aged struct {
		id   uint64
		last int64
	}
	all := make([]aged, 0, len(d.producers))
	for id, p := range d.producers {
		all = append(all, aged{id, p.lastAppendUnixNanos})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].last < all[j].last })
	for _, a := range all[:len(all)/10+1] {
		delete(d.producers, a.id)
	}
}
