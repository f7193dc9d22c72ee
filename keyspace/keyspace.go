// Package keyspace maps record keys to ranges.
//
// The mapping is part of geolog's on-disk and wire contract and must never
// change: a key's hash is XXH64 (seed 0) of its bytes, and a stream of N
// ranges splits the 64-bit hash space into N contiguous, nearly equal slices,
// range i owning hashes [HashStart(i, N), HashEnd(i, N)]. Concretely a hash h
// belongs to range floor(h * N / 2^64). Contiguous hash slices (rather than
// h mod N) keep a later range split local: splitting range i in two moves
// only keys of range i.
//
// Because ranges are slices of the high bits, the hash must avalanche into
// them: FNV-1a, for example, leaves the high bits of "user-1" and "user-2"
// nearly equal and would put such keys in one range. XXH64 mixes every input
// bit into every output bit and is specified byte for byte, so any client
// language can compute the same mapping. The public API states it with
// reference vectors (proto/geolog/v1/log.proto, on Record), which
// TestProtoReferenceVectors checks against this package.
package keyspace

import (
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// Hash returns the XXH64 hash (seed 0) of key.
func Hash(key []byte) uint64 {
	return xxhash.Sum64(key)
}

// RangeForHash returns the range owning hash h in a stream of rangeCount
// ranges. rangeCount must be positive.
func RangeForHash(h uint64, rangeCount uint32) uint32 {
	if rangeCount == 0 {
		panic("keyspace: rangeCount is zero")
	}
	hi, _ := bits.Mul64(h, uint64(rangeCount))
	return uint32(hi)
}

// RangeForKey returns the range owning key in a stream of rangeCount ranges.
func RangeForKey(key []byte, rangeCount uint32) uint32 {
	return RangeForHash(Hash(key), rangeCount)
}

// HashStart returns the smallest hash owned by range r of rangeCount.
func HashStart(r, rangeCount uint32) uint64 {
	if r == 0 {
		return 0
	}
	// Smallest h with floor(h*N/2^64) >= r is ceil(r*2^64/N).
	q, rem := bits.Div64(uint64(r), 0, uint64(rangeCount))
	if rem != 0 {
		q++
	}
	return q
}

// HashEnd returns the largest hash owned by range r of rangeCount.
func HashEnd(r, rangeCount uint32) uint64 {
	if r+1 >= rangeCount {
		return ^uint64(0)
	}
	return HashStart(r+1, rangeCount) - 1
}
