package compact

import (
	"time"

	"github.com/geolog/geolog/batch"
)

// Defaults of a stream's compaction settings.
const (
	// DefaultDeleteRetention is how long a tombstone stays readable after
	// it was appended, Kafka's delete.retention.ms default.
	DefaultDeleteRetention = 24 * time.Hour
	// DefaultMinLag is the least age of a record compaction may remove:
	// consumers reading near the tail never see it happen under them.
	DefaultMinLag = time.Minute
	// DefaultInterval is the least time between two decisions of a range.
	DefaultInterval = time.Minute
	// DefaultProducerRetention is how long after a producer's last batch
	// compaction keeps that producer's latest batch headers, so that its
	// retries are still recognised (the node's producer-state TTL).
	DefaultProducerRetention = 7 * 24 * time.Hour
)

// Policy is when a range's home leader decides a compaction. A zero field
// takes its default; a negative one means none (zero time).
type Policy struct {
	// MinLag: a decision's point is never past the first record appended
	// less than MinLag ago. Default DefaultMinLag.
	MinLag time.Duration
	// DeleteRetention: a tombstone is removed once it is older than this.
	// Default DefaultDeleteRetention.
	DeleteRetention time.Duration
	// ProducerRetention: see DefaultProducerRetention. Default it.
	ProducerRetention time.Duration
	// Interval is the least time between decisions. Default
	// DefaultInterval.
	Interval time.Duration
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// WithDefaults returns p with its zero fields at their defaults (negative
// ones stay: none). Applying it again changes nothing.
func (p Policy) WithDefaults() Policy {
	p.MinLag = orDefault(p.MinLag, DefaultMinLag)
	p.DeleteRetention = orDefault(p.DeleteRetention, DefaultDeleteRetention)
	p.ProducerRetention = orDefault(p.ProducerRetention, DefaultProducerRetention)
	p.Interval = orDefault(p.Interval, DefaultInterval)
	return p
}

// Inputs are what the home leader knows when it considers a decision.
type Inputs struct {
	NowUnixNanos int64
	// Last is the latest decision in the log (applied or proposed), and
	// LastUnixNanos when this leader made or first saw it (0: never).
	Last          batch.Compaction
	LastUnixNanos int64
	// MarkerEnd is the offset after Last's marker (0: unknown).
	MarkerEnd uint64
	// Committed is the committed tail.
	Committed uint64
	// LagPoint is the first offset appended at or after Now - MinLag (the
	// log's OffsetForTime): a frame boundary.
	LagPoint uint64
	// Floor is the lowest applied end of the range's mirrors in other
	// regions, when FloorKnown; a stream in several regions whose
	// mirrors' positions are not all known must not decide.
	Floor      uint64
	FloorKnown bool
	// Regions is how many regions the stream is in.
	Regions int
}

// Decide returns the next decision of a range's home leader, if one is
// due: at least Interval after the last, at a point past the last one
// covering more than the last marker, no further than the committed tail,
// the minimum lag and (in a stream of several regions) what every mirror
// has applied, so that no region ever compacts with records it might later
// lose to a failover. Cutoffs never go back. Pure: the caller supplies the
// clock and the log's positions.
func Decide(p Policy, in Inputs) (batch.Compaction, bool) {
	p = p.WithDefaults()
	if in.LastUnixNanos != 0 && in.NowUnixNanos-in.LastUnixNanos < int64(max(p.Interval, 0)) {
		return batch.Compaction{}, false
	}
	point := min(in.Committed, in.LagPoint)
	if in.Regions > 1 {
		if !in.FloorKnown {
			return batch.Compaction{}, false
		}
		point = min(point, in.Floor)
	}
	if point <= in.Last.Point {
		return batch.Compaction{}, false
	}
	if in.Last.Point+1 == in.MarkerEnd && point <= in.MarkerEnd {
		// Nothing but the last marker since the last point: a decision
		// would only add a marker of its own, and so on, for ever.
		return batch.Compaction{}, false
	}
	return batch.Compaction{
		Point:                    point,
		TombstoneCutoffUnixNanos: max(in.Last.TombstoneCutoffUnixNanos, in.NowUnixNanos-int64(max(p.DeleteRetention, 0))),
		ProducerCutoffUnixNanos:  max(in.Last.ProducerCutoffUnixNanos, in.NowUnixNanos-int64(max(p.ProducerRetention, 0))),
	}, true
}

// Newer reports whether decision d supersedes cur: copies apply the
// decisions of their log in order, so a later marker never holds an
// earlier point, but a replayed or resent one may arrive again.
func Newer(d, cur batch.Compaction) bool { return d.Point > cur.Point }
