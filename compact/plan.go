package compact

import (
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/dedup"
)

// ErrKeysExceeded reports a log below a compaction point holding more
// distinct keys (and producers) than Plan may remember: nothing is
// compacted (a partial compaction would not be the rule's), and the copy
// keeps its records until a larger bound is configured.
var ErrKeysExceeded = errors.New("compact: too many keys to compact within the memory bound")

// ErrOutOfOrder reports frames handed to a Plan out of log order.
var ErrOutOfOrder = errors.New("compact: frames out of log order")

const (
	// keyIDBytesMax is the longest key a Plan remembers as itself; longer
	// keys are remembered by their SHA-256 (a collision would need
	// 2^128 work to arrange, and would make every copy drop the same
	// record: compaction stays deterministic).
	keyIDBytesMax = 32
	// entryOverheadBytes is what Plan counts per remembered key or
	// producer besides the key: the offset and Go's map overhead.
	entryOverheadBytes = 64
	// DefaultMemoryBytesMax bounds a Plan's memory by default.
	DefaultMemoryBytesMax = 64 << 20
)

// frameID names a frame of the log: its base offset and Raft index (a
// control frame shares its base offset with the record after it).
type frameID struct{ base, index uint64 }

func idOf(h batch.Header) frameID { return frameID{base: h.BaseOffset, index: h.Index} }

// producerFrames are a producer's latest batches below the point.
type producerFrames struct {
	recent []frameID // oldest first, at most dedup.RecentBatchesMax
	newest int64     // append time of the newest
}

// Plan is one compaction of one copy of a range at one decision: Observe
// every frame below the point in log order (every segment holding an
// offset below it, whole), then Rewrite the segments. It is deterministic:
// the records it keeps depend on the frames below the point alone, not on
// where the copy's segments begin or end (those decide only which emptied
// batch headers stay; see the package documentation).
type Plan struct {
	d           batch.Compaction
	memoryMax   int64
	memoryBytes int64

	latest    map[string]uint64 // key id → offset of its newest record below the point
	producers map[uint64]*producerFrames
	keep      map[frameID]struct{} // frames kept even when emptied
	// run is the last data or marker frame observed and the control frames
	// after it: kept whole if a frame that cannot follow a gap follows.
	run    []frameID
	next   uint64 // offset the next observed frame may start at, at least
	frozen bool   // Rewrite has begun
}

// NewPlan starts a compaction at decision d, remembering at most about
// memoryBytesMax bytes of keys and producers (0: DefaultMemoryBytesMax).
func NewPlan(d batch.Compaction, memoryBytesMax int64) *Plan {
	if memoryBytesMax <= 0 {
		memoryBytesMax = DefaultMemoryBytesMax
	}
	return &Plan{d: d, memoryMax: memoryBytesMax, latest: map[string]uint64{},
		producers: map[uint64]*producerFrames{}, keep: map[frameID]struct{}{}}
}

// Decision returns the plan's decision.
func (p *Plan) Decision() batch.Compaction { return p.d }

// Keys returns how many distinct keys the plan found below the point.
func (p *Plan) Keys() int { return len(p.latest) }

// below reports whether frame h lies in what the decision compacts: a
// frame with records (or a span) that ends at or below the point, or a
// control frame before it (one at the point belongs to what follows).
func (p *Plan) below(h batch.Header) bool {
	if h.IsControl() {
		return h.BaseOffset < p.d.Point
	}
	return h.NextOffset() <= p.d.Point
}

// Observe notes one frame (of a segment's frames in log order; last: the
// segment's last frame). Frames past the point are ignored.
func (p *Plan) Observe(frame []byte, h batch.Header, last bool) error {
	if p.frozen {
		return fmt.Errorf("%w: Observe after Rewrite", ErrOutOfOrder)
	}
	if h.BaseOffset < p.next && !h.IsControl() {
		return fmt.Errorf("%w: frame at %d after one ending at %d", ErrOutOfOrder, h.BaseOffset, p.next)
	}
	if !p.below(h) {
		return nil
	}
	p.next = h.NextOffset()
	id := idOf(h)
	switch {
	case h.Type == batch.TypeFork:
		// A fork frame names the frame before it: keep that, and it.
		p.keepRun()
		p.keep[id] = struct{}{}
	case h.IsControl():
		p.run = append(p.run, id)
	default:
		p.run = append(p.run[:0], id)
		if h.NextOffset() == p.d.Point {
			// What follows the point is not compacted and may not follow
			// a gap: the frame that ends at the point stays.
			p.keep[id] = struct{}{}
		}
		if h.Type == batch.TypeData {
			if err := p.observeData(frame, h); err != nil {
				return err
			}
		}
	}
	if last && h.IsControl() {
		// The segment's last frame stays, and a control frame cannot
		// follow a gap: keep the run that ends the segment.
		p.keepRun()
	}
	return nil
}

// keepRun marks the current run kept.
func (p *Plan) keepRun() {
	for _, id := range p.run {
		p.keep[id] = struct{}{}
	}
}

// observeData notes a data frame's keys and producer.
func (p *Plan) observeData(frame []byte, h batch.Header) error {
	_, recs, err := batch.Decode(frame)
	if err != nil {
		return err
	}
	for i := range recs {
		r := &recs[i]
		if r.Key == nil {
			continue // a record without a key is never superseded
		}
		k := keyID(r.Key)
		if _, ok := p.latest[k]; !ok {
			if err := p.grow(int64(len(k))); err != nil {
				return err
			}
		}
		p.latest[k] = h.Offset(r)
	}
	if h.ProducerID == 0 {
		return nil
	}
	pf, ok := p.producers[h.ProducerID]
	if !ok {
		if err := p.grow(dedup.RecentBatchesMax * 16); err != nil {
			return err
		}
		pf = &producerFrames{}
		p.producers[h.ProducerID] = pf
	}
	if len(pf.recent) == dedup.RecentBatchesMax {
		pf.recent = append(pf.recent[:0], pf.recent[1:]...)
	}
	pf.recent = append(pf.recent, idOf(h))
	pf.newest = h.AppendTimeUnixNanos
	return nil
}

func (p *Plan) grow(bytes int64) error {
	p.memoryBytes += bytes + entryOverheadBytes
	if p.memoryBytes > p.memoryMax {
		return fmt.Errorf("%w: more than %d bytes below offset %d", ErrKeysExceeded, p.memoryMax, p.d.Point)
	}
	return nil
}

// keyID is how a plan remembers a key: itself if short, else its digest
// (one byte longer than any short key, so the two never meet).
func keyID(key []byte) string {
	if len(key) <= keyIDBytesMax {
		return string(key)
	}
	sum := sha256.Sum256(key)
	return "\xff" + string(sum[:])
}

// freeze ends observation: the frames of the producers whose idempotence
// may still be asked about join the kept ones.
func (p *Plan) freeze() {
	if p.frozen {
		return
	}
	p.frozen = true
	for _, pf := range p.producers {
		if pf.newest < p.d.ProducerCutoffUnixNanos {
			continue
		}
		for _, id := range pf.recent {
			p.keep[id] = struct{}{}
		}
	}
}

// Keeps reports whether the record r of frame h survives the decision:
// at or past the point, without a key, or its key's newest record below
// the point and not a tombstone appended before the tombstone cutoff.
func (p *Plan) Keeps(h batch.Header, r *batch.Record) bool {
	if !p.below(h) || r.Key == nil {
		return true
	}
	if p.latest[keyID(r.Key)] != h.Offset(r) {
		return false
	}
	return !r.Tombstone || h.AppendTimeUnixNanos >= p.d.TombstoneCutoffUnixNanos
}

// Rewrite returns what replaces frame h in the compacted log (a
// segment.RewriteFunc): frames past the point as they are; below it, data
// frames as compacted frames holding the records Keeps keeps, or nothing
// when none is left and the frame need not stay (a segment's last frame,
// the frame that ends at the point, the latest batches of a producer
// still remembered, the frames a control frame that stays must follow);
// markers likewise, as empty data frames when they stay; control frames
// when they stay. Call it once every frame below the point was observed.
func (p *Plan) Rewrite(dst, frame []byte, h batch.Header, last bool) ([]byte, error) {
	p.freeze()
	if !p.below(h) {
		return append(dst, frame...), nil
	}
	_, keep := p.keep[idOf(h)]
	keep = keep || last
	switch {
	case h.IsControl():
		if keep {
			return append(dst, frame...), nil
		}
		return dst, nil
	case h.Type == batch.TypeSplit:
		// A split marker ends the range's log: nothing follows it, so no
		// point is past it; were one, it stays as it is (docs/split.md).
		return append(dst, frame...), nil
	case h.Type == batch.TypeCompact:
		if !keep {
			return dst, nil
		}
		// A spent decision: its offset becomes a hole in an empty frame.
		h.Type, h.OffsetSpan = batch.TypeData, h.Span()
		return batch.Encode(dst, h, nil), nil
	}
	_, recs, err := batch.Decode(frame)
	if err != nil {
		return nil, err
	}
	kept := recs[:0]
	for i := range recs {
		if p.Keeps(h, &recs[i]) {
			kept = append(kept, recs[i])
		}
	}
	if len(kept) == 0 && !keep {
		return dst, nil
	}
	h.OffsetSpan = h.Span()
	return batch.Encode(dst, h, kept), nil
}

// Changes reports whether Rewrite would change frame h (so that a segment
// whose frames it would all keep as they are need not be rewritten).
func (p *Plan) Changes(frame []byte, h batch.Header, last bool) (bool, error) {
	out, err := p.Rewrite(nil, frame, h, last)
	if err != nil {
		return false, err
	}
	return string(out) != string(frame), nil
}
