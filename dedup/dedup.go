// Package dedup is a range's idempotent-producer state: for each producer,
// the next expected sequence and its latest batches, so that a retried batch
// gets its original offsets back. It is a pure data structure owned by one
// range driver; it is derived from the log (replayed from batch headers on
// open) and therefore survives restarts and, under Raft, leader changes.
package dedup

import (
	"sort"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
)

// RecentBatchesMax is how many of a producer's latest batches a range
// remembers per producer, so that a retried batch gets its original offsets
// back. Clients must keep their in-flight window at or below it (the SDK's
// maximum is 16).
const RecentBatchesMax = 16

// Batch is what the dedup table remembers of one idempotent batch.
type Batch struct {
	BaseSequence        uint64
	RecordCount         uint32
	BaseOffset          uint64
	Epoch               uint64
	AppendTimeUnixNanos int64
}

// producerState is one producer's state within one range.
type producerState struct {
	// nextSequence is the sequence the producer's next batch must start at.
	nextSequence uint64
	// recent holds the latest batches, oldest first, at most RecentBatchesMax.
	recent []Batch
	// lastAppendUnixNanos is the append time of the newest batch, for expiry.
	lastAppendUnixNanos int64
}

// Verdict says what to do with an idempotent batch.
type Verdict int

const (
	Append    Verdict = iota // new: append it
	Duplicate                // already appended: answer with the original
	Reject                   // refuse with the returned error
)

// Table is a range's idempotent-producer state; see the package comment.
type Table struct {
	producers    map[uint64]*producerState
	producersMax int
}

func NewTable(producersMax int) *Table {
	return &Table{producers: make(map[uint64]*producerState), producersMax: producersMax}
}

// Check classifies a batch of count records from producerID starting at
// baseSequence, to be appended under epoch (the range's homing epoch now).
// For Duplicate it returns the original batch.
//
// Rules (Kafka's idempotent producer, simplified; the public API states
// them for clients, AppendRequest "Idempotent producers"):
//   - unknown producer: the batch must start at sequence 0, else
//     PRODUCER_STATE_LOST (its state expired or was evicted, or every batch
//     of it was on a log that forked away; a client that sent a later
//     batch before its first was acknowledged looks the same);
//   - baseSequence == next: append;
//   - an exact match of a remembered batch: duplicate, original offsets;
//   - entirely below next but no longer remembered: DUPLICATE_OUT_OF_WINDOW;
//   - overlapping a remembered batch without matching it: INVALID_ARGUMENT;
//   - above next, with the producer's newest batch here appended under an
//     older epoch: PRODUCER_STATE_LOST. The batches the producer had
//     acknowledged after it were on the log of a home that failed over
//     (they are in its orphan log), and never will be in this one;
//   - above next otherwise: SEQUENCE_GAP, carrying the expected sequence
//     (within one epoch, a client that skipped sequences).
//
// The PRODUCER_STATE_LOST errors carry ExpectedSequence (0 for an unknown
// producer) and, for a known producer, ForkEpoch: the first epoch after its
// newest batch here (epochs grow by one), whose start the caller knows and
// the table does not (it completes ForkOffset). An unknown producer's
// ForkEpoch is 0: the table cannot tell what it lost.
func (d *Table) Check(producerID, baseSequence uint64, count uint32, epoch uint64) (Verdict, Batch, error) {
	p, ok := d.producers[producerID]
	if !ok {
		if baseSequence == 0 {
			return Append, Batch{}, nil
		}
		e := apierr.New(apierr.ProducerStateLost, "producer %d is unknown to this range (its state expired, was evicted, or was lost in a failover) and its batch starts at sequence %d, not 0: continue under a new producer id", producerID, baseSequence)
		return Reject, Batch{}, e
	}
	if baseSequence == p.nextSequence {
		return Append, Batch{}, nil
	}
	if baseSequence > p.nextSequence {
		if newest := p.recent[len(p.recent)-1]; newest.Epoch < epoch {
			e := apierr.New(apierr.ProducerStateLost, "producer %d: this range holds its batches up to sequence %d, the last appended under epoch %d; the range is at epoch %d and the batch starts at %d: the batches in between were cut off the log by a failover: continue under a new producer id",
				producerID, p.nextSequence, newest.Epoch, epoch, baseSequence)
			e.ExpectedSequence, e.ForkEpoch = p.nextSequence, newest.Epoch+1
			return Reject, Batch{}, e
		}
		e := apierr.New(apierr.SequenceGap, "producer %d: batch starts at sequence %d, expected %d", producerID, baseSequence, p.nextSequence)
		e.ExpectedSequence = p.nextSequence
		return Reject, Batch{}, e
	}
	for _, b := range p.recent {
		if b.BaseSequence == baseSequence && b.RecordCount == count {
			return Duplicate, b, nil
		}
	}
	if baseSequence+uint64(count) <= p.nextSequence {
		if len(p.recent) == 0 || baseSequence < p.recent[0].BaseSequence {
			e := apierr.New(apierr.DuplicateOutOfWindow, "producer %d: sequence %d was appended before the last %d batches", producerID, baseSequence, RecentBatchesMax)
			e.ExpectedSequence = p.nextSequence
			return Reject, Batch{}, e
		}
	}
	e := apierr.New(apierr.InvalidArgument, "producer %d: batch [%d, %d) overlaps earlier batches without matching one", producerID, baseSequence, baseSequence+uint64(count))
	e.ExpectedSequence = p.nextSequence
	return Reject, Batch{}, e
}

// RecordFrame records the data frame h of an idempotent producer (one with
// a producer id; other frames are ignored) as Record would.
func (d *Table) RecordFrame(h batch.Header) {
	if h.Type != batch.TypeData || h.ProducerID == 0 {
		return
	}
	d.Record(h.ProducerID, BatchOf(h))
}

// BatchOf is the batch of frame h: the one way a frame read back from a
// log (a recovery, a replica applying its log) becomes a Batch. A
// compacted frame keeps its span as its record count.
func BatchOf(h batch.Header) Batch {
	return Batch{
		BaseSequence:        h.BaseSequence,
		RecordCount:         h.Span(),
		BaseOffset:          h.BaseOffset,
		Epoch:               h.Epoch,
		AppendTimeUnixNanos: h.AppendTimeUnixNanos,
	}
}

// Record notes an appended idempotent batch. It is called both for new
// appends and, during recovery, for every batch read back from the log.
// Recording the producer's latest batch again is a no-op.
func (d *Table) Record(producerID uint64, b Batch) {
	p, ok := d.producers[producerID]
	if !ok {
		if len(d.producers) >= d.producersMax {
			d.evictOldest()
		}
		p = &producerState{recent: make([]Batch, 0, 4)}
		d.producers[producerID] = p
	}
	if n := len(p.recent); n > 0 && p.recent[n-1] == b {
		return // already recorded: a leader records at proposal and again when the entry is written
	}
	p.nextSequence = b.BaseSequence + uint64(b.RecordCount)
	if len(p.recent) == RecentBatchesMax {
		copy(p.recent, p.recent[1:])
		p.recent = p.recent[:RecentBatchesMax-1]
	}
	p.recent = append(p.recent, b)
	p.lastAppendUnixNanos = b.AppendTimeUnixNanos
}

// expire forgets producers whose newest batch is older than cutoffUnixNanos.
func (d *Table) Expire(cutoffUnixNanos int64) int {
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
func (d *Table) evictOldest() {
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
