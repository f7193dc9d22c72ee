package keyspace

import (
	"encoding/json"
	"errors"
	"math/rand"
	"slices"
	"testing"
)

// modelLookup is the dumb model of Lookup: the one active range whose
// slice holds h, by a scan of every range.
func modelLookup(t *testing.T, m RangeMap, h uint64) uint32 {
	t.Helper()
	found := []uint32{}
	for _, r := range m.Ranges {
		if !r.IsSplit() && r.Contains(h) {
			found = append(found, r.ID)
		}
	}
	if len(found) != 1 {
		t.Fatalf("hash %#x is owned by active ranges %v, want exactly one", h, found)
	}
	return found[0]
}

// randIn returns a random hash in [lo, hi].
func randIn(rng *rand.Rand, lo, hi uint64) uint64 {
	if hi-lo == ^uint64(0) {
		return rng.Uint64()
	}
	return lo + rng.Uint64()%(hi-lo+1)
}

// checkTiles checks that m's active ranges tile the hash space.
func checkTiles(t *testing.T, m RangeMap) {
	t.Helper()
	act := m.Active()
	slices.SortFunc(act, func(a, b uint32) int {
		if m.Ranges[a].HashStart < m.Ranges[b].HashStart {
			return -1
		}
		return 1
	})
	next := uint64(0)
	for i, id := range act {
		r := m.Ranges[id]
		if r.HashStart != next {
			t.Fatalf("active range %d starts at %#x, want %#x", id, r.HashStart, next)
		}
		if i == len(act)-1 && r.HashEnd != ^uint64(0) {
			t.Fatalf("last active range %d ends at %#x", id, r.HashEnd)
		}
		next = r.HashEnd + 1
	}
}

// TestRangeMapUnsplitIsRangeForHash: a map as created routes exactly as
// the fixed mapping does (the wire contract of streams that never split).
func TestRangeMapUnsplitIsRangeForHash(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	for _, n := range []uint32{1, 2, 3, 7, 64} {
		m := NewRangeMap(n)
		if err := m.Validate(); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2000; i++ {
			h := rng.Uint64()
			if got, want := m.Lookup(h), RangeForHash(h, n); got != want {
				t.Fatalf("n=%d hash %#x: Lookup %d, RangeForHash %d", n, h, got, want)
			}
		}
	}
}

// TestRangeMapSplitModel splits at random and checks every map against
// the model: active ranges tile the hash space, Lookup is the scan, every
// hash a split range owned is owned after the split by exactly one of its
// children, versions count splits, and Validate accepts each map.
func TestRangeMapSplitModel(t *testing.T) {
	seed := int64(7)
	rng := rand.New(rand.NewSource(seed))
	for run := 0; run < 20; run++ {
		m := NewRangeMap(uint32(1 + rng.Intn(5)))
		for s := 0; s < 40; s++ {
			act := m.Active()
			id := act[rng.Intn(len(act))]
			r := m.Ranges[id]
			if r.HashStart == r.HashEnd {
				continue
			}
			at := r.HashStart + 1 + rng.Uint64()%(r.HashEnd-r.HashStart)
			if s%3 == 0 {
				var err error
				if at, err = m.MidPoint(id); err != nil {
					t.Fatal(err)
				}
			}
			before := m.Clone()
			next, err := m.Split(id, at, uint64(s)*10)
			if err != nil {
				t.Fatalf("seed %d: split %d at %#x: %v", seed, id, at, err)
			}
			if !m.Equal(before) {
				t.Fatalf("Split changed its receiver")
			}
			if next.Version != m.Version+1 {
				t.Fatalf("version %d after %d", next.Version, m.Version)
			}
			if err := next.Validate(); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			m = next
			checkTiles(t, m)
			p := m.Ranges[id]
			for _, h := range []uint64{p.HashStart, p.HashEnd, at - 1, at, randIn(rng, p.HashStart, p.HashEnd)} {
				got := m.Lookup(h)
				if want := modelLookup(t, m, h); got != want {
					t.Fatalf("hash %#x: Lookup %d, model %d", h, got, want)
				}
				if got != p.Left && got != p.Right {
					t.Fatalf("hash %#x of split range %d maps to %d, not a child (%d, %d)", h, id, got, p.Left, p.Right)
				}
				if !slices.Contains(m.Ancestors(got), id) || !m.Owns(id, h) {
					t.Fatalf("range %d: ancestors %v lack %d", got, m.Ancestors(got), id)
				}
			}
			for i := 0; i < 50; i++ {
				h := rng.Uint64()
				if got, want := m.Lookup(h), modelLookup(t, m, h); got != want {
					t.Fatalf("hash %#x: Lookup %d, model %d", h, got, want)
				}
			}
		}
	}
}

// TestRangeMapSplitRefusals: a split range, a boundary that leaves a
// child empty and an unknown range are refused with their sentinels.
func TestRangeMapSplitRefusals(t *testing.T) {
	m := NewRangeMap(2)
	r1 := m.Ranges[1]
	for _, c := range []struct {
		id   uint32
		at   uint64
		want error
	}{
		{5, 10, ErrRangeNotFound},
		{1, r1.HashStart, ErrSplitPoint},
		{1, r1.HashStart - 1, ErrSplitPoint},
		{0, 0, ErrSplitPoint},
	} {
		if _, err := m.Split(c.id, c.at, 0); !errors.Is(err, c.want) {
			t.Errorf("split %d at %#x: %v, want %v", c.id, c.at, err, c.want)
		}
	}
	m2, err := m.Split(1, r1.HashEnd, 9) // right child owns one hash
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Split(1, r1.HashStart+5, 0); !errors.Is(err, ErrAlreadySplit) {
		t.Fatalf("second split of range 1: %v", err)
	}
	if _, err := m2.MidPoint(m2.Ranges[1].Right); !errors.Is(err, ErrSplitPoint) {
		t.Fatalf("midpoint of a one-hash range: %v", err)
	}
	if l, r := m2.NextIDs(); l != 4 || r != 5 {
		t.Fatalf("next ids %d %d", l, r)
	}
}

// TestRangeMapValidateRejects: every single-field corruption of a valid
// map with splits is either refused by Validate or leaves a map whose
// lookups still agree with the model (so Lookup never panics or loops).
func TestRangeMapValidateRejects(t *testing.T) {
	m := NewRangeMap(3)
	var err error
	for _, s := range []struct {
		id uint32
	}{{1}, {3}, {4}, {6}} {
		at, _ := m.MidPoint(s.id)
		if m, err = m.Split(s.id, at, 100); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewSource(3))
	refused := 0
	for i := 0; i < 3000; i++ {
		c := m.Clone()
		r := &c.Ranges[rng.Intn(len(c.Ranges))]
		v := []uint64{0, 1, 2, 3, 4, 5, 9, 100, NoRange, ^uint64(0), rng.Uint64()}[rng.Intn(11)]
		switch rng.Intn(8) {
		case 0:
			r.ID = uint32(v)
		case 1:
			r.HashStart = v
		case 2:
			r.HashEnd = v
		case 3:
			r.Parent = uint32(v)
		case 4:
			r.Left = uint32(v)
		case 5:
			r.Right = uint32(v)
		case 6:
			c.Version = v
		case 7:
			c.Initial = uint32(v)
		}
		if c.Equal(m) {
			continue
		}
		if err := c.Validate(); err != nil {
			if !errors.Is(err, ErrBadMap) {
				t.Fatalf("Validate: %v, not ErrBadMap", err)
			}
			refused++
			continue
		}
		checkTiles(t, c)
		for j := 0; j < 20; j++ {
			h := rng.Uint64()
			if got, want := c.Lookup(h), modelLookup(t, c, h); got != want {
				t.Fatalf("accepted corrupt map %+v: hash %#x: %d, model %d", c, h, got, want)
			}
		}
	}
	if refused < 1000 {
		t.Fatalf("only %d corruptions refused", refused)
	}
}

// TestRangeMapJSON: the catalogue stores maps as JSON; a round trip is
// the identity.
func TestRangeMapJSON(t *testing.T) {
	m, err := NewRangeMap(4).Split(2, HashStart(2, 4)+12345, 77)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var back RangeMap
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !back.Equal(m) || back.Validate() != nil {
		t.Fatalf("round trip: %+v", back)
	}
}
