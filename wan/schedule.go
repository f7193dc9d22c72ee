package wan

import (
	"hash/fnv"
	"math/rand/v2"
	"time"
)

// drawDelay draws one chunk's one-way delay: latency plus a uniform draw in
// [0, jitter]. Jitter only adds, as queueing does on a real path: latency is
// the floor (the propagation delay).
func drawDelay(rng *rand.Rand, latency, jitter time.Duration) time.Duration {
	if jitter <= 0 {
		return latency
	}
	return latency + time.Duration(rng.Int64N(int64(jitter)+1))
}

// shaper is a bandwidth cap: a virtual transmitter that sends one chunk at a
// time at bytesPerSecond. depart returns when a chunk of n bytes read at now
// has left it; queueing behind earlier chunks is included. Deterministic:
// the caller passes now.
type shaper struct {
	nextFree time.Time // when the transmitter is idle again
}

func (s *shaper) depart(now time.Time, n int, bytesPerSecond int64) time.Time {
	if bytesPerSecond <= 0 {
		return now
	}
	start := now
	if s.nextFree.After(start) {
		start = s.nextFree
	}
	// n ≤ blockBytes, so n·1e9 cannot overflow.
	s.nextFree = start.Add(time.Duration(int64(n) * int64(time.Second) / bytesPerSecond))
	return s.nextFree
}

// SymmetricLatency picks a one-way latency in [min, max] for the pair of
// regions a and b, the same for (a, b) and (b, a) and for every run with the
// same seed: a default WAN matrix (e.g. 30–80 ms) without writing one down.
// max < min is treated as max = min.
func SymmetricLatency(seed uint64, a, b string, min, max time.Duration) time.Duration {
	if max <= min {
		return min
	}
	if b < a {
		a, b = b, a
	}
	h := fnv.New64a()
	h.Write([]byte(a))
	h.Write([]byte{0})
	h.Write([]byte(b))
	rng := rand.New(rand.NewPCG(seed, h.Sum64()))
	// Whole milliseconds read better in configs and logs.
	span := int64((max - min) / time.Millisecond)
	return min + time.Duration(rng.Int64N(span+1))*time.Millisecond
}
