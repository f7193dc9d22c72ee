package homing

import (
	"context"
	"errors"
	"math"

	"github.com/jackc/pgx/v5"
)

// Claims on a stream's range-map versions (docs/split.md, "Splits across
// homes"). Each region orders the splits of a stream through its own
// catalogue, but the ranges of one stream may be homed in several
// regions, each splitting its own; the children's ids follow from the map
// version (the next two ids), so two regions splitting at one version
// would give two ranges one id. Before a region reserves a split in its
// catalogue it claims the version here: one row per (stream, version),
// naming the region. A claim by the same region again is granted (a
// retry, or a different split after a reservation that never committed:
// the region's catalogue orders its own); a claim held by another region
// is refused with ErrSplitClaimed until this region's map has that
// region's split (its marker reaches this region's copy of the parent and
// the mirror records it), after which this region claims the next
// version. A new claim is granted only while the parent is homed in the
// claiming region and not moving, so a region that lost the home does not
// claim for it. DeleteHomes removes a stream's claims with its homes.

// SplitClaim claims MapVersion of Stream's range map for the split of
// Parent at At in Region.
type SplitClaim struct {
	Stream     string
	MapVersion uint64
	Parent     uint32
	At         uint64
	// Region is the caller's region: the parent's home.
	Region string
	// NowNanos is the caller's clock, recorded with the claim.
	NowNanos int64
}

func (c SplitClaim) validate() error {
	if err := validateStream(c.Stream); err != nil {
		return err
	}
	if c.MapVersion == 0 || c.MapVersion > math.MaxInt64 {
		return invalidf("stream %q: map version %d out of range", c.Stream, c.MapVersion)
	}
	return validateRegion("split", c.Region)
}

// claimHolder is the region holding a claim, "" if none.
type claimHolder struct {
	region string
	parent uint32
}

// decideSplitClaim is ClaimSplit's decision: held is the version's claim
// ("" region: none), parent the parent's home record. It returns whether
// to write the claim.
func decideSplitClaim(held claimHolder, parent *Home, c SplitClaim) (bool, error) {
	switch {
	case held.region == c.Region:
		return true, nil
	case held.region != "":
		return false, newError(ErrSplitClaimed, "stream %q: map version %d is the split of range %d in %s, which this region (%s) has not applied yet",
			c.Stream, c.MapVersion, held.parent, held.region, c.Region)
	case parent == nil:
		return false, newError(ErrRangeNotFound, "range %s", RangeKey{Stream: c.Stream, Range: c.Parent})
	case parent.Region != c.Region:
		return false, newError(ErrNotHome, "range %s is homed in %s at epoch %d, not in %s", parent.Key, parent.Region, parent.Epoch, c.Region)
	case parent.MovingTo != "":
		return false, newError(ErrNotHome, "range %s is moving from %s to %s (epoch %d)", parent.Key, parent.Region, parent.MovingTo, parent.Epoch)
	}
	return true, nil
}

// ClaimSplit implements Store.
func (m *MemStore) ClaimSplit(ctx context.Context, c SplitClaim) error {
	if err := c.validate(); err != nil {
		return err
	}
	if err := m.enter(ctx); err != nil {
		return err
	}
	defer m.mu.Unlock()
	k := splitClaimKey{c.Stream, c.MapVersion}
	write, err := decideSplitClaim(m.claims[k], m.home(RangeKey{Stream: c.Stream, Range: c.Parent}), c)
	if err == nil && write {
		m.claims[k] = claimHolder{region: c.Region, parent: c.Parent}
	}
	return err
}

// splitClaimKey names a claim.
type splitClaimKey struct {
	stream  string
	version uint64
}

// ClaimSplit implements Store.
func (s *SQLStore) ClaimSplit(ctx context.Context, c SplitClaim) error {
	if err := c.validate(); err != nil {
		return err
	}
	return s.runTx(ctx, false, func(tx pgx.Tx) error {
		var held claimHolder
		var parent int64
		err := tx.QueryRow(ctx, `SELECT region, parent_range FROM stream_splits WHERE stream = $1 AND map_version = $2 FOR UPDATE`,
			c.Stream, int64(c.MapVersion)).Scan(&held.region, &parent)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return err
		default:
			held.parent = uint32(parent)
		}
		cur, err := homeByKey(ctx, tx, RangeKey{Stream: c.Stream, Range: c.Parent})
		if err != nil {
			return err
		}
		write, err := decideSplitClaim(held, cur, c)
		if err != nil || !write {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO stream_splits (stream, map_version, region, parent_range, split_at, claimed_nanos)
			VALUES ($1, $2, $3, $4, $5, $6)
			ON CONFLICT (stream, map_version) DO UPDATE SET parent_range = excluded.parent_range, split_at = excluded.split_at, claimed_nanos = excluded.claimed_nanos`,
			c.Stream, int64(c.MapVersion), c.Region, int64(c.Parent), int64(c.At), c.NowNanos)
		return err
	})
}

// ClaimSplit claims a version of a stream's range map for a split of
// parent at at in this node's region (see Store.ClaimSplit).
func (h *Homes) ClaimSplit(ctx context.Context, stream string, version uint64, parent uint32, at uint64, nowNanos int64) error {
	return h.cfg.Store.ClaimSplit(ctx, SplitClaim{Stream: stream, MapVersion: version, Parent: parent, At: at, Region: h.cfg.Region, NowNanos: nowNanos})
}
