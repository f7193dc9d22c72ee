package replica

import (
	"math/rand/v2"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// TestEntryCacheMatchesModel: appends, overwrites, trims and clears against
// a model log; whatever the cache answers agrees with the model, it stays
// within its bounds, and it answers the newest entries.
func TestEntryCacheMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var c entryCache
	var model []*raftpb.Entry // model[i] has index i+1
	term := uint64(1)
	entry := func(i uint64) *raftpb.Entry {
		return &raftpb.Entry{Index: proto.Uint64(i), Term: proto.Uint64(term), Data: make([]byte, rng.IntN(300<<10))}
	}
	applied := uint64(0)
	hits := 0
	for step := 0; step < 5000; step++ {
		switch k := rng.IntN(10); {
		case k < 6 || len(model) == 0: // append at the tail
			n := 1 + rng.IntN(4)
			var ents []*raftpb.Entry
			for i := 0; i < n; i++ {
				ents = append(ents, entry(uint64(len(model)+1+i)))
			}
			model = append(model, ents...)
			c.add(ents)
		case k < 8: // a new leader overwrites an unapplied suffix
			from := applied + 1 + uint64(rng.IntN(len(model)-int(applied)+1))
			if from > uint64(len(model))+1 {
				continue
			}
			term++
			model = model[:from-1]
			ents := []*raftpb.Entry{entry(from)}
			model = append(model, ents...)
			c.add(ents)
		case k < 9:
			applied = min(uint64(len(model)), applied+uint64(rng.IntN(8)))
			c.trim(applied)
		default:
			if rng.IntN(20) == 0 {
				c.clear()
			}
		}
		if c.bytes > entryCacheBytesMax+300<<10 {
			t.Fatalf("step %d: cache holds %d bytes", step, c.bytes)
		}
		total := 0
		for i, e := range c.ents {
			total += entryBytes(e)
			if i > 0 && e.GetIndex() != c.ents[i-1].GetIndex()+1 {
				t.Fatalf("step %d: cache not contiguous", step)
			}
		}
		if total != c.bytes {
			t.Fatalf("step %d: counted %d bytes, holds %d", step, c.bytes, total)
		}
		if n := len(c.ents); n > 0 && c.ents[n-1].GetIndex() != uint64(len(model)) {
			t.Fatalf("step %d: cache ends at %d, log at %d", step, c.ents[n-1].GetIndex(), len(model))
		}
		// Mostly near the tail, where the cache is.
		lo := uint64(len(model) - rng.IntN(min(len(model), 40)))
		if rng.IntN(4) == 0 {
			lo = 1 + uint64(rng.IntN(len(model)))
		}
		hi := lo + 1 + uint64(rng.IntN(len(model)-int(lo)+1))
		if tm, ok := c.term(lo); ok && tm != model[lo-1].GetTerm() {
			t.Fatalf("step %d: term(%d) = %d, want %d", step, lo, tm, model[lo-1].GetTerm())
		}
		maxSize := uint64(rng.IntN(1 << 20))
		if ents, ok := c.entries(lo, hi, maxSize); ok {
			hits++
			if len(ents) == 0 {
				t.Fatalf("step %d: entries [%d, %d) empty", step, lo, hi)
			}
			var size uint64
			for i, e := range ents {
				if e != model[lo-1+uint64(i)] {
					t.Fatalf("step %d: entry %d is not the log's", step, lo+uint64(i))
				}
				size += uint64(entryBytes(e))
			}
			if len(ents) > 1 && size > maxSize {
				t.Fatalf("step %d: %d bytes returned for at most %d", step, size, maxSize)
			}
		}
	}
	if hits < 1000 {
		t.Fatalf("the cache answered %d reads of 5000", hits)
	}
}
