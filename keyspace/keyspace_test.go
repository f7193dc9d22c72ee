package keyspace

import (
	"fmt"
	"math"
	"math/rand"
	"testing"
)

// TestHashIsXXH64 pins the hash: it is part of the wire contract.
func TestHashIsXXH64(t *testing.T) {
	for key, want := range map[string]uint64{
		"":    0xef46db3751d8e999, // XXH64 reference values, seed 0
		"a":   0xd24ec4f1a98c6e5b,
		"abc": 0x44bc2cf5ad770999,
	} {
		if got := Hash([]byte(key)); got != want {
			t.Errorf("Hash(%q) = %#x, want %#x", key, got, want)
		}
	}
}

// TestRangeForHashModel checks RangeForHash, HashStart and HashEnd against a
// dumb model: floor(h * n / 2^64) computed in float with exact corrections.
func TestRangeForHashModel(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for _, n := range []uint32{1, 2, 3, 7, 8, 100, 4096} {
		// Slices tile the hash space: contiguous, no gap, no overlap.
		var next uint64
		for r := uint32(0); r < n; r++ {
			start, end := HashStart(r, n), HashEnd(r, n)
			if start != next {
				t.Fatalf("n=%d range %d starts at %#x, want %#x", n, r, start, next)
			}
			if end < start {
				t.Fatalf("n=%d range %d is empty", n, r)
			}
			for _, h := range []uint64{start, end, start + (end-start)/2} {
				if got := RangeForHash(h, n); got != r {
					t.Fatalf("n=%d: hash %#x in slice of %d maps to %d", n, h, r, got)
				}
			}
			next = end + 1
		}
		if next != 0 { // wrapped past 2^64-1 exactly once
			t.Fatalf("n=%d: slices end at %#x, not at 2^64-1", n, next-1)
		}
		for i := 0; i < 1000; i++ {
			h := rng.Uint64()
			r := RangeForHash(h, n)
			if h < HashStart(r, n) || h > HashEnd(r, n) {
				t.Fatalf("n=%d: hash %#x maps to %d outside its slice", n, h, r)
			}
			approx := math.Floor(float64(h) / math.Pow(2, 64) * float64(n))
			if d := float64(r) - approx; d < -1 || d > 1 {
				t.Fatalf("n=%d: hash %#x maps to %d, model says about %v", n, h, r, approx)
			}
		}
	}
}

// TestSimilarKeysSpread: keys that differ only in their last characters must
// still spread evenly over the ranges.
func TestSimilarKeysSpread(t *testing.T) {
	const n, keys = 8, 8000
	counts := make([]int, n)
	for i := 0; i < keys; i++ {
		counts[RangeForKey([]byte(fmt.Sprintf("user-%d", i)), n)]++
	}
	for r, c := range counts {
		if c < keys/n*8/10 || c > keys/n*12/10 {
			t.Fatalf("range %d holds %d of %d keys: %v", r, c, keys, counts)
		}
	}
	seen := map[uint32]bool{}
	for i := 0; i < 10; i++ {
		seen[RangeForKey([]byte(fmt.Sprintf("room-%d", i)), 4)] = true
	}
	if len(seen) < 3 {
		t.Fatalf("room-0..room-9 land in only %d of 4 ranges", len(seen))
	}
}
