// Package backoff is geolog's one retry backoff and its one
// context-aware sleep.
//
// Every retry loop (the SDK's calls and connections, Raft's peer streams,
// the replicator's cursor, the consumer coordinator's forwarding, the lease
// store's conflicts) waits Delay(attempt, lo, hi, rng) between attempts:
// exponential, capped, jittered. A deterministic core passes its seeded
// *rand.Rand; a driver passes nil for the process-wide generator.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Base is the wait before retry attempt attempt (0: the first retry)
// before jitter: lo doubled attempt times, capped at hi (lo when hi < lo);
// 0 when lo <= 0. Any attempt is fine: the doubling stops at hi.
func Base(attempt int, lo, hi time.Duration) time.Duration {
	if lo <= 0 {
		return 0
	}
	hi = max(hi, lo)
	d := lo
	for i := 0; i < attempt && d < hi; i++ {
		d *= 2
	}
	return min(d, hi)
}

// Delay is Base spread uniformly over [Base/2, Base], drawn from rng (the
// process-wide generator when rng is nil), so that callers that failed
// together do not retry in lockstep.
func Delay(attempt int, lo, hi time.Duration, rng *rand.Rand) time.Duration {
	return Jitter(Base(attempt, lo, hi), rng)
}

// Jitter spreads d uniformly over [d/2, d], drawn from rng (the
// process-wide generator when rng is nil); d <= 1 ns is returned as is.
func Jitter(d time.Duration, rng *rand.Rand) time.Duration {
	half := d / 2
	if half <= 0 {
		return d
	}
	span := int64(d-half) + 1
	if rng == nil {
		return half + time.Duration(rand.Int64N(span))
	}
	return half + time.Duration(rng.Int64N(span))
}

// Sleep waits d, or until ctx is done and returns ctx.Err() then (wrap it
// where a caller wants an API error: apierr.As makes it TIMEOUT). It
// returns at once, with ctx.Err(), when ctx is already done.
func Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
