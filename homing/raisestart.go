package homing

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Raising an epoch's recorded start (docs/design.md "Where an epoch
// starts"). A takeover records the taker's tail as the new epoch's start,
// but the taker's log may still commit frames of the old epoch past it: a
// verbatim mirror apply in flight when the tail was read, or entries a new
// Raft leader's predecessor left uncommitted. Before the new home admits
// its first frame of the epoch, its range leader confirms where its log
// really ends (nothing older in flight, and no more accepted) and raises
// the recorded start to that end. The frames between the old start and
// the new one are the old home's, the same in every copy that holds them:
// they stay in the log (and their acks stand) instead of being cut to an
// orphan log.
//
// The store's part is a compare-and-set: same epoch, the start the caller
// read, only upward. That the epoch has no frame yet is the caller's part:
// only a range leader whose log holds no frame of the epoch asks, and it
// admits none until the raise (or an equal start) is confirmed; a leader
// that lost a race reads the record again. Two leaders in turn cannot
// raise past each other's first frame: a later leader's log holds every
// frame an earlier one committed, and a leader whose log holds a frame of
// the epoch does not ask.

// RaiseStartRequest asks to move the recorded start of Key's current epoch
// from From (as the caller read it) up to To (its log's confirmed end).
type RaiseStartRequest struct {
	Key RangeKey
	// Epoch is the range's current homing epoch, as the caller expects it.
	Epoch uint64
	// Region is the caller's region: the range's home at Epoch.
	Region string
	// From is the recorded start the caller read; To the new one (>= From).
	From, To uint64
}

func (r RaiseStartRequest) validate() error {
	if err := validateKey(r.Key); err != nil {
		return err
	}
	if err := validateEpoch(r.Epoch); err != nil {
		return err
	}
	if err := validateRegion("home", r.Region); err != nil {
		return err
	}
	if err := validateOffset(r.From); err != nil {
		return err
	}
	if err := validateOffset(r.To); err != nil {
		return err
	}
	if r.To < r.From {
		return invalidf("range %s: a start is only raised: %d is below %d", r.Key, r.To, r.From)
	}
	return nil
}

// decideRaiseStart is RaiseStart's decision; changed is false when the
// record already starts at To (a repeated raise, or a retry after an
// ambiguous commit).
func decideRaiseStart(cur *Home, req RaiseStartRequest) (next Home, changed bool, err error) {
	if err := checkCurrent(cur, req.Key, req.Epoch); err != nil {
		return Home{}, false, err
	}
	switch {
	case cur.Region != req.Region:
		return Home{}, false, newError(ErrNotHome, "range %s is homed in %s at epoch %d, not in %s", req.Key, cur.Region, cur.Epoch, req.Region)
	case cur.MovingTo != "":
		return Home{}, false, newError(ErrNotHome, "range %s is moving from %s to %s (epoch %d)", req.Key, cur.Region, cur.MovingTo, cur.Epoch)
	case cur.StartOffset == req.To:
		return *cur, false, nil
	case cur.StartOffset != req.From:
		return Home{}, false, newError(ErrStartMoved, "range %s: epoch %d starts at %d, not %d", req.Key, cur.Epoch, cur.StartOffset, req.From)
	}
	next = *cur
	next.StartOffset = req.To
	return next, true, nil
}

// RaiseStart implements Store.
func (m *MemStore) RaiseStart(ctx context.Context, req RaiseStartRequest) (Home, error) {
	if err := req.validate(); err != nil {
		return Home{}, err
	}
	if err := m.enter(ctx); err != nil {
		return Home{}, err
	}
	defer m.mu.Unlock()
	next, changed, err := decideRaiseStart(m.home(req.Key), req)
	if err != nil || !changed {
		return next, err
	}
	m.homes[req.Key] = next
	hist := m.history[req.Key]
	for i := range hist {
		if hist[i].Epoch == next.Epoch {
			hist[i].StartOffset = next.StartOffset
		}
	}
	m.bump(next.Region)
	return next, nil
}

// RaiseStart implements Store.
func (s *SQLStore) RaiseStart(ctx context.Context, req RaiseStartRequest) (Home, error) {
	if err := req.validate(); err != nil {
		return Home{}, err
	}
	var out Home
	err := s.runTx(ctx, false, func(tx pgx.Tx) error {
		cur, err := homeByKey(ctx, tx, req.Key)
		if err != nil {
			return err
		}
		next, changed, err := decideRaiseStart(cur, req)
		if err != nil {
			return err
		}
		out = next
		if !changed {
			return nil
		}
		if _, err := tx.Exec(ctx, `UPDATE range_homes SET start_offset = $4
			WHERE stream = $1 AND range_id = $2 AND epoch = $3`,
			req.Key.Stream, int64(req.Key.Range), int64(req.Epoch), int64(req.To)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE range_epochs SET start_offset = $4
			WHERE stream = $1 AND range_id = $2 AND epoch = $3`,
			req.Key.Stream, int64(req.Key.Range), int64(req.Epoch), int64(req.To)); err != nil {
			return err
		}
		// The home region's nodes learn the new start with their next
		// heartbeat; other regions with their next directory read.
		return bumpVersions(ctx, tx, next.Region)
	})
	if err != nil {
		return Home{}, err
	}
	return out, nil
}

// RaiseStart raises the recorded start of key's epoch from from to to for
// this node's region (see Store.RaiseStart), then refreshes this node's
// view so that its lease shows the new start.
func (h *Homes) RaiseStart(ctx context.Context, key RangeKey, epoch, from, to uint64) (Home, error) {
	home, err := h.cfg.Store.RaiseStart(ctx, RaiseStartRequest{Key: key, Epoch: epoch, Region: h.cfg.Region, From: from, To: to})
	if err != nil {
		return home, err
	}
	if from != to {
		h.logger.Info("epoch start raised", "range", key, "epoch", epoch, "from", from, "to", home.StartOffset)
	}
	if rerr := h.Refresh(ctx); rerr != nil {
		h.logger.Warn("refresh after raising an epoch's start failed", "error", rerr)
	}
	return home, nil
}
