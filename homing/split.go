package homing

import (
	"context"
	"slices"

	"github.com/jackc/pgx/v5"
)

// Homing the children of a split range (docs/split.md, "Homing"). The
// children inherit the parent's home: same region, same epoch, their logs
// starting at offset 0. Both rows are written in one transaction, before
// the split's catalogue record (so a child never serves without a row, and
// a node that finds a child without a row never homes it at epoch 1), and
// only while the parent is still homed in the caller's region at the epoch
// the split was written at: a split that lost its home to a takeover or a
// rehome writes nothing. From then on each child is homed on its own.

// KindSplit is the epoch record of a child of a split: its first epoch,
// the parent's at the split.
const KindSplit = "split"

// SplitHomesRequest homes the children of Parent, which split at Epoch in
// Region.
type SplitHomesRequest struct {
	Parent RangeKey
	// Epoch is the parent's homing epoch the split marker was written at.
	Epoch uint64
	// Region is the caller's region: the parent's home at Epoch.
	Region string
	// Children are the two children's range ids.
	Children [2]uint32
	// NowNanos is the caller's clock, recorded in the children's history.
	NowNanos int64
}

func (r SplitHomesRequest) validate() error {
	if err := validateKey(r.Parent); err != nil {
		return err
	}
	if err := validateEpoch(r.Epoch); err != nil {
		return err
	}
	if err := validateRegion("home", r.Region); err != nil {
		return err
	}
	a, b := r.Children[0], r.Children[1]
	if a == b || a == r.Parent.Range || b == r.Parent.Range {
		return invalidf("range %s: children %d and %d must be two other ranges", r.Parent, a, b)
	}
	return nil
}

func (r SplitHomesRequest) childKeys() []RangeKey {
	return []RangeKey{{Stream: r.Parent.Stream, Range: r.Children[0]}, {Stream: r.Parent.Stream, Range: r.Children[1]}}
}

// decideSplitHomes is SplitHomes' decision: cur is the parent's record,
// kids the children's (nil: none yet). It returns the children's records
// and which of them to create. A child that has a record keeps it: a
// repeated request (a retry after an ambiguous commit) changes nothing,
// and a child homed on its own since is not reset.
func decideSplitHomes(cur *Home, kids [2]*Home, req SplitHomesRequest) (out [2]Home, create []Home, err error) {
	if kids[0] != nil && kids[1] != nil {
		// Homed already (a retry, or one that comes late, after the
		// parent or the children moved on): they stand.
		return [2]Home{*kids[0], *kids[1]}, nil, nil
	}
	if err := checkCurrent(cur, req.Parent, req.Epoch); err != nil {
		return out, nil, err
	}
	switch {
	case cur.Region != req.Region:
		return out, nil, newError(ErrNotHome, "range %s is homed in %s at epoch %d, not in %s", req.Parent, cur.Region, cur.Epoch, req.Region)
	case cur.MovingTo != "":
		return out, nil, newError(ErrNotHome, "range %s is moving from %s to %s (epoch %d)", req.Parent, cur.Region, cur.MovingTo, cur.Epoch)
	}
	for i, k := range req.childKeys() {
		if kids[i] != nil {
			out[i] = *kids[i]
			continue
		}
		out[i] = Home{Key: k, Region: cur.Region, Epoch: cur.Epoch, PrevRegion: cur.PrevRegion}
		create = append(create, out[i])
	}
	return out, create, nil
}

// SplitHomes implements Store.
func (m *MemStore) SplitHomes(ctx context.Context, req SplitHomesRequest) ([]Home, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	if err := m.enter(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	keys := req.childKeys()
	out, create, err := decideSplitHomes(m.home(req.Parent), [2]*Home{m.home(keys[0]), m.home(keys[1])}, req)
	if err != nil {
		return nil, err
	}
	for _, h := range create {
		m.homes[h.Key] = h
		m.history[h.Key] = append(m.history[h.Key], EpochRecord{Key: h.Key, Epoch: h.Epoch, Region: h.Region,
			PrevRegion: h.PrevRegion, Kind: KindSplit, GrantedNanos: req.NowNanos})
	}
	if len(create) > 0 {
		m.bump(out[0].Region)
	}
	return out[:], nil
}

// SplitHomes implements Store.
func (s *SQLStore) SplitHomes(ctx context.Context, req SplitHomesRequest) ([]Home, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	var out [2]Home
	err := s.runTx(ctx, false, func(tx pgx.Tx) error {
		// The parent's row is locked first, then the children's: every
		// split of one parent takes them in the same order.
		cur, err := homeByKey(ctx, tx, req.Parent)
		if err != nil {
			return err
		}
		keys := req.childKeys()
		have, err := homesByKey(ctx, tx, keys)
		if err != nil {
			return err
		}
		var kids [2]*Home
		for i, k := range keys {
			if h, ok := have[k]; ok {
				kids[i] = &h
			}
		}
		var create []Home
		out, create, err = decideSplitHomes(cur, kids, req)
		if err != nil || len(create) == 0 {
			return err
		}
		for _, h := range create {
			if _, err := tx.Exec(ctx, `INSERT INTO range_homes (stream, range_id, home_region, epoch, start_offset, prev_region, moving_to, drain_version)
				VALUES ($1, $2, $3, $4, 0, $5, '', 0)`, h.Key.Stream, int64(h.Key.Range), h.Region, int64(h.Epoch), h.PrevRegion); err != nil {
				return err
			}
		}
		if err := insertEpochs(ctx, tx, KindSplit, req.NowNanos, create); err != nil {
			return err
		}
		// The home region's nodes learn the children with their next
		// heartbeat (or a refresh).
		return bumpVersions(ctx, tx, out[0].Region)
	})
	if err != nil {
		return nil, err
	}
	return slices.Clone(out[:]), nil
}

// SplitHomes homes the children of key's split at epoch in this node's
// region (see Store.SplitHomes), then refreshes this node's view so that it
// holds the children's leases.
func (h *Homes) SplitHomes(ctx context.Context, key RangeKey, epoch uint64, children [2]uint32, nowNanos int64) ([]Home, error) {
	homes, err := h.cfg.Store.SplitHomes(ctx, SplitHomesRequest{Parent: key, Epoch: epoch, Region: h.cfg.Region, Children: children, NowNanos: nowNanos})
	if err != nil {
		return nil, err
	}
	h.logger.Info("split homed", "range", key, "epoch", epoch, "left", children[0], "right", children[1])
	if rerr := h.Refresh(ctx); rerr != nil {
		h.logger.Warn("refresh after homing a split failed", "error", rerr)
	}
	return homes, nil
}
