package replica

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"slices"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/dedup"
)

// The idempotence table is derived from the log, so compaction would take
// with it what the table knows of producers whose batches all lie below
// the compaction point: such a producer's retry of a batch already in the
// (deleted) log would be appended again, once more at sequence 0 for a
// first batch. So, like Kafka's producer-state snapshots, a replica keeps
// the table as of the compaction point (the producer base) in its state,
// saved atomically with the compaction point itself, and a snapshot carries
// the leader's. The table is then the base plus every frame after the
// compaction point, on opening, after a truncation and after an install.

const (
	// producerBaseMax bounds the producers the base remembers (the most
	// recently active), so that the state stays a few MiB at most (36
	// bytes per remembered batch).
	producerBaseMax = 16 << 10
	// producerBaseBytesMax bounds an encoded base.
	producerBaseBytesMax = 4 + 4 + producerBaseMax*(8+1+dedup.RecentBatchesMax*producerBatchBytes)
	producerBatchBytes   = 8 + 4 + 8 + 8 + 8
)

// errProducerBase marks a base that does not decode.
var errProducerBase = errors.New("producer base is malformed")

// producerBase is the idempotence state derived from a log prefix: per
// producer its latest batches, as dedup.Table.Record keeps them.
type producerBase struct {
	producers map[uint64][]dedup.Batch
}

func newProducerBase() *producerBase {
	return &producerBase{producers: map[uint64][]dedup.Batch{}}
}

// record notes frame h, as dedup.Table.Record would.
func (p *producerBase) record(h batch.Header) {
	if h.Type != batch.TypeData || h.ProducerID == 0 {
		return
	}
	b := dedup.BatchOf(h)
	recent := p.producers[h.ProducerID]
	if n := len(recent); n > 0 && recent[n-1] == b {
		return
	}
	if len(recent) == dedup.RecentBatchesMax {
		recent = slices.Delete(recent, 0, 1)
	}
	p.producers[h.ProducerID] = append(recent, b)
	if len(p.producers) > producerBaseMax {
		p.evictOldest()
	}
}

// evictOldest drops the tenth of producers that appended least recently
// (ties by id, so that every replica drops the same).
func (p *producerBase) evictOldest() {
	ids := slices.SortedFunc(maps.Keys(p.producers), func(a, b uint64) int {
		ra, rb := p.producers[a], p.producers[b]
		return cmp.Or(cmp.Compare(ra[len(ra)-1].AppendTimeUnixNanos, rb[len(rb)-1].AppendTimeUnixNanos), cmp.Compare(a, b))
	})
	for _, id := range ids[:len(ids)/10+1] {
		delete(p.producers, id)
	}
}

// clone returns a deep copy.
func (p *producerBase) clone() *producerBase {
	c := &producerBase{producers: make(map[uint64][]dedup.Batch, len(p.producers))}
	for id, r := range p.producers {
		c.producers[id] = slices.Clone(r)
	}
	return c
}

// table builds an idempotence table holding the base.
func (p *producerBase) table(producersMax int) *dedup.Table {
	t := dedup.NewTable(producersMax)
	// Oldest activity first: a table smaller than the base evicts the
	// least recently active, as it would have while appending.
	ids := slices.SortedFunc(maps.Keys(p.producers), func(a, b uint64) int {
		ra, rb := p.producers[a], p.producers[b]
		return cmp.Or(cmp.Compare(ra[len(ra)-1].AppendTimeUnixNanos, rb[len(rb)-1].AppendTimeUnixNanos), cmp.Compare(a, b))
	})
	for _, id := range ids {
		for _, b := range p.producers[id] {
			t.Record(id, b)
		}
	}
	return t
}

// encode: producer count (u32), then per producer by id: id (u64), batch
// count (u8), batches (base sequence u64, record count u32, base offset
// u64, epoch u64, append time i64); CRC-32C of all that (u32).
// Little-endian. An empty base encodes to nil.
func (p *producerBase) encode() []byte {
	if len(p.producers) == 0 {
		return nil
	}
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(p.producers)))
	for _, id := range slices.Sorted(maps.Keys(p.producers)) {
		r := p.producers[id]
		b = binary.LittleEndian.AppendUint64(b, id)
		b = append(b, byte(len(r)))
		for _, x := range r {
			b = binary.LittleEndian.AppendUint64(b, x.BaseSequence)
			b = binary.LittleEndian.AppendUint32(b, x.RecordCount)
			b = binary.LittleEndian.AppendUint64(b, x.BaseOffset)
			b = binary.LittleEndian.AppendUint64(b, x.Epoch)
			b = binary.LittleEndian.AppendUint64(b, uint64(x.AppendTimeUnixNanos))
		}
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func decodeProducerBase(b []byte) (*producerBase, error) {
	p := newProducerBase()
	if len(b) == 0 {
		return p, nil
	}
	if len(b) < 8 || len(b) > producerBaseBytesMax {
		return nil, fmt.Errorf("%w: %d bytes", errProducerBase, len(b))
	}
	body := b[:len(b)-4]
	if binary.LittleEndian.Uint32(b[len(b)-4:]) != crc32.Checksum(body, castagnoli) {
		return nil, fmt.Errorf("%w: crc mismatch", errProducerBase)
	}
	n := binary.LittleEndian.Uint32(body)
	body = body[4:]
	if n == 0 || n > producerBaseMax {
		return nil, fmt.Errorf("%w: %d producers", errProducerBase, n)
	}
	var prev uint64
	for i := uint32(0); i < n; i++ {
		if len(body) < 9 {
			return nil, fmt.Errorf("%w: truncated", errProducerBase)
		}
		id, count := binary.LittleEndian.Uint64(body), int(body[8])
		body = body[9:]
		if id == 0 || (i > 0 && id <= prev) || count == 0 || count > dedup.RecentBatchesMax || len(body) < count*producerBatchBytes {
			return nil, fmt.Errorf("%w: producer %d with %d batches", errProducerBase, id, count)
		}
		prev = id
		r := make([]dedup.Batch, count)
		for j := range r {
			r[j] = dedup.Batch{
				BaseSequence:        binary.LittleEndian.Uint64(body),
				RecordCount:         binary.LittleEndian.Uint32(body[8:]),
				BaseOffset:          binary.LittleEndian.Uint64(body[12:]),
				Epoch:               binary.LittleEndian.Uint64(body[20:]),
				AppendTimeUnixNanos: int64(binary.LittleEndian.Uint64(body[28:])),
			}
			body = body[producerBatchBytes:]
		}
		p.producers[id] = r
	}
	if len(body) != 0 {
		return nil, fmt.Errorf("%w: %d bytes left over", errProducerBase, len(body))
	}
	return p, nil
}
