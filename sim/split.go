package sim

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/keyspace"
	"github.com/geolog/geolog/replica"
)

// Splits, the parent's side (Regions 1, one run in two; docs/split.md,
// replica/split.go). At a random time the simulator asks range 0's
// leader of the moment to append a split marker (batch.EncodeSplit,
// through replica.Propose like regionsvc's proposeSplit), again every
// splitRetryMs until one is answered or a replica's log holds one. From
// then on producers stop starting batches on the range, and a batch
// answered RANGE_SPLIT waits for the children and goes to the child that
// owns its key (it must never be in the parent). Once the marker is
// committed the children open as Raft groups of their own (children.go).
//
// Checks: every replica's committed log holds the marker at one offset
// (the split offset, the same in every copy, across crashes,
// truncations, snapshots and moves), no committed data frame follows it
// anywhere, no record is acked at or past it, the marker's answer (if
// one came) names that offset, and no batch answered RANGE_SPLIT is in
// the range's log. At the end every member of the range holds the
// marker: its committed end is the split offset + 1.

const splitRetryMs = 200

// SplitResult counts what the split did (Regions 1).
type SplitResult struct {
	Runs, Proposed, Answered, Refused, Abandoned int
	// Children counts the runs whose children opened; ChildRecords the
	// records committed in them; Moved the batches answered RANGE_SPLIT
	// that went to a child; Resplit the runs whose child split again;
	// ChildFaults the crashes and partitions aimed at a child's leader.
	Children, ChildRecords, Moved, Resplit, ChildFaults int
}

func (r SplitResult) add(o SplitResult) SplitResult {
	r.Runs += o.Runs
	r.Proposed += o.Proposed
	r.Answered += o.Answered
	r.Refused += o.Refused
	r.Abandoned += o.Abandoned
	r.Children += o.Children
	r.ChildRecords += o.ChildRecords
	r.Moved += o.Moved
	r.Resplit += o.Resplit
	r.ChildFaults += o.ChildFaults
	return r
}

func (r SplitResult) String() string {
	if r.Runs == 0 {
		return ""
	}
	return fmt.Sprintf("; splits: %d ranges split, %d markers proposed (%d answered, %d refused), %d batches answered RANGE_SPLIT (%d moved to a child); children opened in %d runs, %d records committed in them, %d children split again, %d faults aimed at children",
		r.Runs, r.Proposed, r.Answered, r.Refused, r.Abandoned, r.Moved, r.Children, r.ChildRecords, r.Resplit, r.ChildFaults)
}

type splitWorld struct {
	w   *world
	rng *rand.Rand
	on  bool
	r   int   // the range that splits
	at  int64 // when it is first asked
	// next is when the marker is asked for again; answered the offset
	// its answer gave (-1: none).
	next     int64
	answered int64
	// offset is the marker's offset as the first replica holding it
	// committed (-1: none seen).
	offset int64
	// abandoned are the records of batches answered RANGE_SPLIT.
	abandoned  map[string]bool
	refusedAny bool
	res        SplitResult
	kids       children // children.go
	// A split of a child (children.go): parent is the split whose child
	// this one splits (nil: the first), sub the split of one of this
	// one's children; c0 is the left child's range (the right's is
	// c0+1); lo and hi bound the hashes the range owns; version is the
	// map version the split makes.
	parent, sub *splitWorld
	c0          int
	lo, hi      uint64
	version     uint64
	// rmap is the stream's range map as the splits whose children opened
	// made it (the first split's only; its range 0 is range r, owning
	// every hash: children.go).
	rmap keyspace.RangeMap
}

func newSplitWorld(w *world) *splitWorld {
	s := &splitWorld{w: w, rng: rand.New(rand.NewPCG(uint64(w.opt.Seed), 0x73706c6974)), answered: -1, offset: -1, abandoned: map[string]bool{},
		c0: w.opt.Ranges, hi: math.MaxUint64, version: 1}
	s.on = w.opt.Regions == 1 && (s.rng.IntN(2) == 0 || w.opt.mut.splitAlways)
	if s.on {
		s.at = 200 + s.rng.Int64N(max(int64(w.opt.Steps)*2/3, 1))
		s.next = s.at
		s.res.Runs = 1
		s.rmap = keyspace.NewRangeMap(1)
	}
	s.kids = newChildren(s)
	return s
}

// ended reports whether range r split (a marker is in some log or was
// answered): producers start nothing more on it.
func (s *splitWorld) ended(r int) bool {
	return s.on && r == s.r && (s.answered >= 0 || s.offset >= 0 || s.refusedAny)
}

// of is the split of range r (nil: none; the first split's and its
// children's).
func (s *splitWorld) of(r int) *splitWorld {
	for x := s; x != nil; x = x.sub {
		if x.on && x.r == r {
			return x
		}
	}
	return nil
}

// result adds up what the splits did.
func (s *splitWorld) result() SplitResult {
	var res SplitResult
	for x := s; x != nil; x = x.sub {
		res = res.add(x.res)
	}
	return res
}

// step runs every split.
func (s *splitWorld) step() {
	for x := s; x != nil && s.w.err == nil; x = x.sub {
		x.stepOne()
	}
}

// stepOne asks for the marker when due, and opens the children.
func (s *splitWorld) stepOne() {
	w := s.w
	if !s.on {
		return
	}
	s.stepChildren() // children.go
	if s.answered >= 0 || s.offset >= 0 || w.now < s.next {
		return
	}
	if len(w.canonical[s.r]) == 0 {
		// A range whose log would hold the marker alone reports a highest
		// epoch of 0 once its leader changes (replica.HighestEpoch counts
		// data frames and this leader's proposals only: seed 41 of one
		// region with moves, 3 s; notes/simmoves.md): split a range with
		// records.
		s.next = w.now + splitRetryMs
		return
	}
	s.next = w.now + splitRetryMs
	l := w.leaderOf(0, s.r)
	if l == nil {
		return
	}
	rep, gen := l.replicas[s.r], l.gen
	if rep.SplitPending() {
		return // its marker is on its way
	}
	dec := batch.Split{MapVersion: s.version, Parent: uint32(s.r), HashStart: s.lo, HashEnd: s.hi, At: s.kids.at,
		Left: uint32(s.c0), Right: uint32(s.c0) + 1}
	s.res.Proposed++
	w.tracef("%s range %d: split marker proposed", traceName(l), s.r)
	rep.Propose(&replica.Op{RecordCount: 1, Frame: batch.EncodeSplit(nil, batch.Header{}, dec), Reply: func(res replica.Result) {
		if res.Err != nil || !l.up || l.gen != gen {
			s.res.Refused++
			return
		}
		s.res.Answered++
		w.tracef("range %d: split marker answered at %d", s.r, res.BaseOffset)
		if s.answered >= 0 && uint64(s.answered) != res.BaseOffset && w.err == nil {
			w.err = fmt.Errorf("range %d: split markers answered at %d and at %d", s.r, s.answered, res.BaseOffset)
		}
		s.answered = int64(res.BaseOffset)
		if s.offset >= 0 && s.offset != s.answered && w.err == nil {
			w.err = fmt.Errorf("range %d: split marker answered at %d, committed at %d", s.r, s.answered, s.offset)
		}
	}})
}

// refused handles a producer's RANGE_SPLIT answer: the batch is given
// up; true if err is one.
func (s *splitWorld) refused(p *producer, r int, err error) bool {
	if s = s.of(r); s == nil || apierr.CodeOf(err) != apierr.RangeSplit {
		return false
	}
	s.refusedAny = true
	if b := p.batch[r]; b != nil {
		for _, v := range b.values {
			if seen, ok := s.w.seen[r][v]; ok && s.w.err == nil {
				s.w.err = fmt.Errorf("range %d: %q answered RANGE_SPLIT, but it is in the log at %d", r, v, seen)
			}
			s.abandoned[v] = true
		}
		p.batch[r] = nil
		s.res.Abandoned++
		s.moveToChild(p, b) // children.go
	}
	return true
}

// frame checks a committed frame of range r at base on node n against
// the split; it reports whether the frame is the marker.
func (s *splitWorld) frame(n *node, r int, h batch.Header) (bool, error) {
	if s = s.of(r); s == nil {
		return false, nil
	}
	if h.Type == batch.TypeSplit {
		switch {
		case s.offset < 0:
			s.offset = int64(h.BaseOffset)
			s.w.tracef("%s range %d: split marker committed at %d", traceName(n), r, h.BaseOffset)
			s.committed() // children.go: the catalogue opens the children
		case uint64(s.offset) != h.BaseOffset:
			return true, fmt.Errorf("%v range %d: split marker committed at %d, at %d in another copy", n, r, h.BaseOffset, s.offset)
		}
		if s.answered >= 0 && s.answered != s.offset {
			return true, fmt.Errorf("range %d: split marker answered at %d, committed at %d", r, s.answered, s.offset)
		}
		for off := range s.w.acked[r] {
			if off >= h.BaseOffset {
				return true, fmt.Errorf("range %d: %q acked at %d, at or past the split offset %d", r, s.w.acked[r][off], off, h.BaseOffset)
			}
		}
		return true, nil
	}
	if s.offset >= 0 && h.BaseOffset > uint64(s.offset) {
		return false, fmt.Errorf("%v range %d: a %v frame committed at %d, after the split marker at %d", n, r, h.Type, h.BaseOffset, s.offset)
	}
	return false, nil
}

// ack: nothing is acked at or past the split offset.
func (s *splitWorld) ack(r int, off uint64, v string) error {
	if s = s.of(r); s != nil && s.offset >= 0 && off >= uint64(s.offset) {
		return fmt.Errorf("range %d: %q acked at %d, at or past the split marker at %d", r, v, off, s.offset)
	}
	return nil
}

// canonize: a record answered RANGE_SPLIT is never in the log.
func (s *splitWorld) canonize(r int, off uint64, v string) error {
	if s = s.of(r); s == nil {
		return nil
	}
	if s.abandoned[v] {
		return fmt.Errorf("range %d: %q committed at %d, but it was answered RANGE_SPLIT", r, v, off)
	}
	if s.offset >= 0 && off >= uint64(s.offset) {
		return fmt.Errorf("range %d: %q committed at %d, past the split marker at %d", r, v, off, s.offset)
	}
	return nil
}

// end is range r's committed end once healed: its records, and the
// marker if it split.
func (s *splitWorld) end(r int) uint64 {
	n := uint64(len(s.w.canonical[r]))
	if x := s.of(r); x != nil && x.offset >= 0 {
		n++
	}
	return n
}

// final: a split asked for is in the log once healed, and its children
// hold the rest of its keys' records (children.go).
func (s *splitWorld) final() error {
	if err := s.finalChildren(); err != nil {
		return err
	}
	for x := s; x != nil; x = x.sub {
		if x.on && x.offset < 0 && x.res.Proposed > 0 {
			return fmt.Errorf("range %d: split asked for (%d markers proposed, %d answered at %d) and never committed", x.r, x.res.Proposed, x.res.Answered, x.answered)
		}
	}
	return nil
}
