package keyspace

import (
	"errors"
	"fmt"
	"math"
)

// A range map is a stream's ranges once ranges can split (docs/split.md).
// A stream is created with n ranges, 0..n-1, owning the hash slices of
// HashStart/HashEnd. Splitting range p at hash boundary at gives it two
// children with the next two unused ids: the left one owns [p.HashStart,
// at-1], the right one [at, p.HashEnd]. The parent's log ends at its split
// offset (where its split marker is, batch.TypeSplit); a key's records
// before it are in the parent, after it in exactly one child. A range is
// never split twice, never merged, and its id never reused, so a range id
// names one hash slice for the life of the stream.
//
// Every split raises the map's Version by one. Two copies of a map with
// the same Version are equal: splits are applied in the order of the
// catalogue that records them, one at a time.

// NoRange is the Parent of a range the stream was created with and the
// Children of a range that has not split.
const NoRange = math.MaxUint32

// RangesMax bounds the ranges of one map, split ones included.
const RangesMax = 1 << 16

// Errors of range map operations.
var (
	// ErrRangeNotFound: the map has no range of that id.
	ErrRangeNotFound = errors.New("keyspace: no such range")
	// ErrAlreadySplit: the range has split; its children own its keys.
	ErrAlreadySplit = errors.New("keyspace: range already split")
	// ErrSplitPoint: the hash boundary would leave a child empty.
	ErrSplitPoint = errors.New("keyspace: split point outside the range")
	// ErrTooManyRanges: the map would hold more than RangesMax ranges.
	ErrTooManyRanges = errors.New("keyspace: too many ranges")
	// ErrBadMap: a map (read from disk or the network) breaks an
	// invariant of range maps.
	ErrBadMap = errors.New("keyspace: invalid range map")
)

// Range is one range of a map: its hash slice and its place in the split
// tree.
type Range struct {
	// ID is the range's id, its index in RangeMap.Ranges.
	ID uint32 `json:"id"`
	// HashStart and HashEnd bound the hashes the range owns, inclusive.
	HashStart uint64 `json:"hash_start"`
	HashEnd   uint64 `json:"hash_end"`
	// Parent is the range this one split from (NoRange: an original).
	Parent uint32 `json:"parent"`
	// Left and Right are the children (NoRange: not split). Left owns the
	// lower hashes.
	Left  uint32 `json:"left"`
	Right uint32 `json:"right"`
	// SplitOffset is, once split, the offset of the split marker in this
	// range's log: its records are [0, SplitOffset), nothing follows the
	// marker.
	SplitOffset uint64 `json:"split_offset,omitempty"`
}

// IsSplit reports whether r has split into children.
func (r Range) IsSplit() bool { return r.Left != NoRange }

// Contains reports whether r's slice holds hash h.
func (r Range) Contains(h uint64) bool { return h >= r.HashStart && h <= r.HashEnd }

// RangeMap is a stream's ranges, versioned. The zero value is not a map:
// build one with NewRangeMap. A RangeMap is a value: Split returns a new
// map and leaves its receiver unchanged.
type RangeMap struct {
	// Version counts the splits applied: 0 for the map as created.
	Version uint64 `json:"version"`
	// Initial is the range count the stream was created with: ranges
	// 0..Initial-1 tile the hash space as RangeForHash does.
	Initial uint32 `json:"initial"`
	// Ranges[i] is range i; split ranges stay.
	Ranges []Range `json:"ranges"`
}

// NewRangeMap returns the map of a stream created with rangeCount ranges.
func NewRangeMap(rangeCount uint32) RangeMap {
	if rangeCount == 0 || rangeCount > RangesMax {
		panic(fmt.Sprintf("keyspace: range map of %d ranges", rangeCount))
	}
	m := RangeMap{Initial: rangeCount, Ranges: make([]Range, rangeCount)}
	for i := range rangeCount {
		m.Ranges[i] = Range{ID: i, HashStart: HashStart(i, rangeCount), HashEnd: HashEnd(i, rangeCount),
			Parent: NoRange, Left: NoRange, Right: NoRange}
	}
	return m
}

// Get returns range id.
func (m RangeMap) Get(id uint32) (Range, bool) {
	if uint64(id) >= uint64(len(m.Ranges)) {
		return Range{}, false
	}
	return m.Ranges[id], true
}

// Lookup returns the unsplit range that owns hash h: the original range
// of h, then down the split tree. O(number of splits above it).
func (m RangeMap) Lookup(h uint64) uint32 {
	id := RangeForHash(h, m.Initial)
	for {
		r := m.Ranges[id]
		if !r.IsSplit() {
			return id
		}
		if h < m.Ranges[r.Right].HashStart {
			id = r.Left
		} else {
			id = r.Right
		}
	}
}

// LookupKey returns the unsplit range that owns key.
func (m RangeMap) LookupKey(key []byte) uint32 { return m.Lookup(Hash(key)) }

// Owns reports whether range id owned hash h when its log was written:
// h is in its slice. A split range still owns its slice below its split
// offset.
func (m RangeMap) Owns(id uint32, h uint64) bool {
	r, ok := m.Get(id)
	return ok && r.Contains(h)
}

// Active returns the ids of the ranges that have not split, in id order:
// the ranges that take appends.
func (m RangeMap) Active() []uint32 {
	var out []uint32
	for _, r := range m.Ranges {
		if !r.IsSplit() {
			out = append(out, r.ID)
		}
	}
	return out
}

// MidPoint returns the hash boundary that splits range id in two halves
// of equal hash width (the right child may be one hash wider).
func (m RangeMap) MidPoint(id uint32) (uint64, error) {
	r, ok := m.Get(id)
	if !ok {
		return 0, fmt.Errorf("%w: range %d of %d", ErrRangeNotFound, id, len(m.Ranges))
	}
	if r.HashStart == r.HashEnd {
		return 0, fmt.Errorf("%w: range %d owns a single hash", ErrSplitPoint, id)
	}
	return r.HashStart + (r.HashEnd-r.HashStart)/2 + 1, nil
}

// CheckSplit reports why range id cannot split at hash boundary at, nil
// if it can.
func (m RangeMap) CheckSplit(id uint32, at uint64) error {
	r, ok := m.Get(id)
	switch {
	case !ok:
		return fmt.Errorf("%w: range %d of %d", ErrRangeNotFound, id, len(m.Ranges))
	case r.IsSplit():
		return fmt.Errorf("%w: range %d split at offset %d into %d and %d", ErrAlreadySplit, id, r.SplitOffset, r.Left, r.Right)
	case at <= r.HashStart || at > r.HashEnd:
		return fmt.Errorf("%w: range %d owns [%#016x, %#016x], a split at %#016x leaves a child empty", ErrSplitPoint, id, r.HashStart, r.HashEnd, at)
	case len(m.Ranges)+2 > RangesMax:
		return fmt.Errorf("%w: %d ranges, at most %d", ErrTooManyRanges, len(m.Ranges), RangesMax)
	}
	return nil
}

// NextIDs returns the ids the children of the next split get.
func (m RangeMap) NextIDs() (left, right uint32) {
	return uint32(len(m.Ranges)), uint32(len(m.Ranges) + 1)
}

// Split returns the map after range id splits at hash boundary at, its
// marker at offset splitOffset of its log: Version+1, the children at
// NextIDs. The receiver is unchanged.
func (m RangeMap) Split(id uint32, at, splitOffset uint64) (RangeMap, error) {
	if err := m.CheckSplit(id, at); err != nil {
		return RangeMap{}, err
	}
	left, right := m.NextIDs()
	out := RangeMap{Version: m.Version + 1, Initial: m.Initial, Ranges: make([]Range, len(m.Ranges), len(m.Ranges)+2)}
	copy(out.Ranges, m.Ranges)
	p := &out.Ranges[id]
	p.Left, p.Right, p.SplitOffset = left, right, splitOffset
	out.Ranges = append(out.Ranges,
		Range{ID: left, HashStart: p.HashStart, HashEnd: at - 1, Parent: id, Left: NoRange, Right: NoRange},
		Range{ID: right, HashStart: at, HashEnd: p.HashEnd, Parent: id, Left: NoRange, Right: NoRange})
	return out, nil
}

// Ancestors returns range id's ancestors, nearest first: the ranges whose
// logs a reader of id's keys must finish before it (each up to its split
// offset).
func (m RangeMap) Ancestors(id uint32) []uint32 {
	var out []uint32
	for r, ok := m.Get(id); ok && r.Parent != NoRange; r, ok = m.Get(r.Parent) {
		out = append(out, r.Parent)
	}
	return out
}

// Clone returns a deep copy of m.
func (m RangeMap) Clone() RangeMap {
	m.Ranges = append([]Range(nil), m.Ranges...)
	return m
}

// Equal reports whether two maps are the same map.
func (m RangeMap) Equal(o RangeMap) bool {
	if m.Version != o.Version || m.Initial != o.Initial || len(m.Ranges) != len(o.Ranges) {
		return false
	}
	for i := range m.Ranges {
		if m.Ranges[i] != o.Ranges[i] {
			return false
		}
	}
	return true
}
