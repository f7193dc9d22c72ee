package regionsvc

import (
	"slices"
	"sync"
	"time"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/keyspace"
)

// Automatic splits by load (docs/split.md "Automatic split"). With
// Config.SplitRangeRecordsPerSecond set, every MaintenanceInterval each
// node measures, for every range it leads in its home region and that has
// not split, the records committed per second since its previous look
// (from the range's committed offset: nothing is added to the append
// path). A range over the threshold at loadSplitLooks looks in a row is a
// candidate: the node reads the newest records of its log, hashes their
// keys, and splits the range at the boundary that best halves them, the
// way CockroachDB picks a load-based split key from sampled requests.
// Load that one key carries cannot be spread by a split (all of a key's
// records stay in one range, in order); when no boundary leaves at most
// loadSplitShareMax of the sampled records on either side, the range is
// left whole and the node says so, instead of splitting off a cold child
// again and again. The split itself runs through splitRange, the same
// fenced, ordered and idempotent steps as an operator's.

const (
	// loadSplitLooks is how many looks in a row a range must be over the
	// threshold: one burst does not split a range.
	loadSplitLooks = 3
	// loadSplitSampleOffsets bounds how far back from the committed end
	// the key sample starts, and loadSplitSampleBytes the bytes read.
	loadSplitSampleOffsets = 4096
	loadSplitSampleBytes   = 1 << 20
	// loadSplitSamplesMin is the fewest sampled records a boundary is
	// chosen from.
	loadSplitSamplesMin = 64
	// loadSplitShareMax is the largest share of the sampled records one
	// child may get for a split to be worth it.
	loadSplitShareMax = 0.75
)

// splitRangeKey names a range of a stream.
type splitRangeKey struct {
	stream string
	rng    uint32
}

// loadLook is what the node saw of a range at its previous look.
type loadLook struct {
	at        time.Time
	committed uint64
	// over counts the looks in a row the range was over the threshold.
	over int
	// unsplittable counts the looks at which it was over the threshold
	// long enough but its sampled keys had no boundary worth splitting at.
	unsplittable int
}

// loadSplitter keeps the looks of the ranges led here. It is used by the
// node's split loop; mu is for the tests that read it.
type loadSplitter struct {
	mu    sync.Mutex
	looks map[splitRangeKey]loadLook
}

// look returns the load candidates: the ranges of led (those this node
// leads at home, not split) over perSecond records a second for
// loadSplitLooks looks in a row, with the boundary their sampled keys
// give. Ranges no longer led are forgotten.
func (s *loadSplitter) look(now time.Time, led []ledRange, perSecond int64, limit int) []autoSplitCandidate {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := make(map[splitRangeKey]loadLook, len(led))
	var out []autoSplitCandidate
	for _, lr := range led {
		k := splitRangeKey{lr.stream, lr.rng}
		committed := lr.d.committed.Load()
		cur := loadLook{at: now, committed: committed}
		prev, ok := s.looks[k]
		if ok && committed >= prev.committed && now.After(prev.at) {
			rate := float64(committed-prev.committed) / now.Sub(prev.at).Seconds()
			if rate > float64(perSecond) {
				cur.over, cur.unsplittable = prev.over+1, prev.unsplittable
			}
		}
		switch {
		case cur.over < loadSplitLooks || len(out) >= limit:
		case lr.reserved:
			// A load split reserved earlier and not finished: finish it
			// at its own boundary, not at a new sample's.
			out = append(out, autoSplitCandidate{stream: lr.stream, rng: lr.rng, reason: "load", bytes: lr.d.store.Size()})
		default:
			at, ok := loadBoundary(sampleKeyHashes(lr.d, committed), lr.lo, lr.hi)
			if ok {
				out = append(out, autoSplitCandidate{stream: lr.stream, rng: lr.rng, at: at, reason: "load", bytes: lr.d.store.Size()})
			} else {
				cur.unsplittable++
			}
		}
		next[k] = cur
	}
	s.looks = next
	return out
}

// lookOf returns the node's last look at a range (tests).
func (s *loadSplitter) lookOf(stream string, r uint32) loadLook {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.looks[splitRangeKey{stream, r}]
}

// sampleKeyHashes returns the key hashes of the range's newest committed
// records, at most loadSplitSampleBytes of frames from at most
// loadSplitSampleOffsets below committed. A read that fails (retention
// deleted the start, say) samples nothing: the next look tries again.
func sampleKeyHashes(d *rangeDriver, committed uint64) []uint64 {
	from := d.store.StartOffset()
	if committed > loadSplitSampleOffsets && committed-loadSplitSampleOffsets > from {
		from = committed - loadSplitSampleOffsets
	}
	if from >= committed {
		return nil
	}
	frames, err := d.store.ReadFrames(from, loadSplitSampleBytes, committed)
	if err != nil {
		return nil
	}
	var hashes []uint64
	for len(frames) > 0 {
		size, err := batch.FrameSize(frames)
		if err != nil || size > len(frames) {
			break
		}
		_ = batch.RecordKeys(frames[:size], func(_ uint32, key []byte) {
			hashes = append(hashes, keyspace.Hash(key))
		})
		frames = frames[size:]
	}
	return hashes
}

// loadBoundary returns the hash boundary (the right child's first hash)
// that best halves the sampled key hashes of a range owning [lo, hi], and
// false when there are too few samples or no boundary leaves at most
// loadSplitShareMax of them on either side (one key, or a few, carry the
// load). Hashes outside [lo, hi] are ignored. The boundary is halfway
// between the two neighbouring sampled hashes it falls between, so keys
// not sampled fall on either side evenly.
func loadBoundary(hashes []uint64, lo, hi uint64) (uint64, bool) {
	hs := make([]uint64, 0, len(hashes))
	for _, h := range hashes {
		if h >= lo && h <= hi {
			hs = append(hs, h)
		}
	}
	n := len(hs)
	if n < loadSplitSamplesMin {
		return 0, false
	}
	slices.Sort(hs)
	bestAt, bestLeft := uint64(0), -1
	for i := 1; i < n; i++ {
		if hs[i] == hs[i-1] {
			continue
		}
		// Splitting between hs[i-1] and hs[i] leaves i samples left.
		if bestLeft < 0 || absDiff(2*i, n) < absDiff(2*bestLeft, n) {
			bestAt, bestLeft = hs[i-1]+(hs[i]-hs[i-1])/2+1, i
		}
	}
	if bestLeft < 0 || float64(max(bestLeft, n-bestLeft)) > loadSplitShareMax*float64(n) {
		return 0, false
	}
	return bestAt, true
}

func absDiff(a, b int) int {
	if a > b {
		return a - b
	}
	return b - a
}
