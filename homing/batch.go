package homing

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// BatchRehomer is implemented by stores that prepare and complete the
// planned moves of many ranges in one transaction: a region's homes
// version is bumped once for all of them, instead of once per range in
// transactions that would mostly abort each other (they all write the
// region's version row). Both methods return one outcome per request, in
// request order: the range's home after the call, or the error for that
// range alone (ErrEpochMismatch, ErrNotDrained, ...); ranges that fail are
// left unchanged and the others are applied. The error result is for the
// whole call (ErrStoreUnavailable, ErrInvalidArgument): nothing changed.
type BatchRehomer interface {
	PrepareRehomes(ctx context.Context, reqs []RehomeRequest) ([]Home, []error, error)
	CompleteRehomes(ctx context.Context, reqs []RehomeRequest) ([]Home, []error, error)
}

var (
	_ BatchRehomer = (*SQLStore)(nil)
	_ BatchRehomer = (*MemStore)(nil)
)

func validateRehomes(reqs []RehomeRequest) error {
	if len(reqs) > RangesPerRequestMax {
		return invalidf("%d ranges in one request, over the maximum of %d", len(reqs), RangesPerRequestMax)
	}
	seen := make(map[RangeKey]bool, len(reqs))
	for _, r := range reqs {
		if err := r.validate(true); err != nil {
			return err
		}
		if seen[r.Key] {
			return invalidf("range %s listed twice", r.Key)
		}
		seen[r.Key] = true
	}
	return nil
}

// PrepareRehomes implements BatchRehomer.
func (s *SQLStore) PrepareRehomes(ctx context.Context, reqs []RehomeRequest) ([]Home, []error, error) {
	if err := validateRehomes(reqs); err != nil {
		return nil, nil, err
	}
	out := make([]Home, len(reqs))
	errs := make([]error, len(reqs))
	err := s.runTx(ctx, false, func(tx pgx.Tx) error {
		clear(out)
		clear(errs)
		versions := map[string]uint64{}
		var writes []Home
		bump := map[string]bool{}
		cur0, err := homesForUpdate(ctx, tx, reqs)
		if err != nil {
			return err
		}
		for i, req := range reqs {
			cur := cur0[req.Key]
			var from uint64
			if cur != nil {
				v, ok := versions[cur.Region]
				if !ok {
					if v, err = regionVersion(ctx, tx, cur.Region); err != nil {
						return err
					}
					versions[cur.Region] = v
				}
				from = v
			}
			next, changed, err := decidePrepareRehome(cur, req, from)
			if err != nil {
				errs[i] = err
				continue
			}
			out[i] = next
			if changed {
				writes = append(writes, next)
				bump[next.Region] = true
			}
		}
		if len(writes) == 0 {
			return nil
		}
		if err := writeHomes(ctx, tx, writes); err != nil {
			return err
		}
		return bumpVersions(ctx, tx, keysOf(bump)...)
	})
	if err != nil {
		return nil, nil, err
	}
	return out, errs, nil
}

// CompleteRehomes implements BatchRehomer.
func (s *SQLStore) CompleteRehomes(ctx context.Context, reqs []RehomeRequest) ([]Home, []error, error) {
	if err := validateRehomes(reqs); err != nil {
		return nil, nil, err
	}
	out := make([]Home, len(reqs))
	errs := make([]error, len(reqs))
	err := s.runTx(ctx, false, func(tx pgx.Tx) error {
		clear(out)
		clear(errs)
		nodes := map[string][]Liveness{}
		var writes []Home
		bump := map[string]bool{}
		var nowNanos int64
		cur0, err := homesForUpdate(ctx, tx, reqs)
		if err != nil {
			return err
		}
		for i, req := range reqs {
			cur := cur0[req.Key]
			var live []Liveness
			if cur != nil {
				l, ok := nodes[cur.Region]
				if !ok {
					if l, err = queryLiveness(ctx, tx, `SELECT `+livenessColumns+` FROM liveness WHERE region = $1`, cur.Region); err != nil {
						return err
					}
					nodes[cur.Region] = l
				}
				live = l
			}
			next, err := decideCompleteRehome(cur, req, live)
			if err != nil {
				errs[i] = err
				continue
			}
			out[i] = next
			writes = append(writes, next)
			bump[next.PrevRegion], bump[next.Region] = true, true
			nowNanos = req.NowNanos
		}
		if len(writes) == 0 {
			return nil
		}
		if err := writeHomes(ctx, tx, writes); err != nil {
			return err
		}
		if err := insertEpochs(ctx, tx, KindRehome, nowNanos, writes); err != nil {
			return err
		}
		return bumpVersions(ctx, tx, keysOf(bump)...)
	})
	if err != nil {
		return nil, nil, err
	}
	return out, errs, nil
}

// homesForUpdate reads (and locks) the home records of the requests'
// ranges in one statement.
func homesForUpdate(ctx context.Context, tx pgx.Tx, reqs []RehomeRequest) (map[RangeKey]*Home, error) {
	keys := make([]RangeKey, len(reqs))
	for i, r := range reqs {
		keys[i] = r.Key
	}
	streams, ranges := keyArrays(keys)
	homes, err := queryHomes(ctx, tx, `SELECT `+homeColumns+` FROM range_homes
		WHERE (stream, range_id) IN (SELECT s, r FROM unnest($1::TEXT[], $2::INT8[]) AS t(s, r)) FOR UPDATE`, streams, ranges)
	if err != nil {
		return nil, err
	}
	out := make(map[RangeKey]*Home, len(homes))
	for i := range homes {
		out[homes[i].Key] = &homes[i]
	}
	return out, nil
}

func keysOf(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// PrepareRehomes implements BatchRehomer.
func (m *MemStore) PrepareRehomes(ctx context.Context, reqs []RehomeRequest) ([]Home, []error, error) {
	if err := validateRehomes(reqs); err != nil {
		return nil, nil, err
	}
	if err := m.enter(ctx); err != nil {
		return nil, nil, err
	}
	defer m.mu.Unlock()
	out := make([]Home, len(reqs))
	errs := make([]error, len(reqs))
	bump := map[string]bool{}
	versions := map[string]uint64{}
	for r, v := range m.versions {
		versions[r] = v
	}
	for i, req := range reqs {
		cur := m.home(req.Key)
		from := ""
		if cur != nil {
			from = cur.Region
		}
		next, changed, err := decidePrepareRehome(cur, req, versions[from])
		if err != nil {
			errs[i] = err
			continue
		}
		out[i] = next
		if changed {
			m.homes[req.Key] = next
			bump[from] = true
		}
	}
	m.bump(keysOf(bump)...)
	return out, errs, nil
}

// CompleteRehomes implements BatchRehomer.
func (m *MemStore) CompleteRehomes(ctx context.Context, reqs []RehomeRequest) ([]Home, []error, error) {
	if err := validateRehomes(reqs); err != nil {
		return nil, nil, err
	}
	if err := m.enter(ctx); err != nil {
		return nil, nil, err
	}
	defer m.mu.Unlock()
	out := make([]Home, len(reqs))
	errs := make([]error, len(reqs))
	bump := map[string]bool{}
	for i, req := range reqs {
		cur := m.home(req.Key)
		var nodes []Liveness
		if cur != nil {
			nodes = m.liveness(cur.Region)
		}
		next, err := decideCompleteRehome(cur, req, nodes)
		if err != nil {
			errs[i] = err
			continue
		}
		out[i] = next
		m.homes[req.Key] = next
		m.history[req.Key] = append(m.history[req.Key], EpochRecord{Key: next.Key, Epoch: next.Epoch, Region: next.Region,
			StartOffset: next.StartOffset, PrevRegion: next.PrevRegion, Kind: KindRehome, GrantedNanos: req.NowNanos})
		bump[next.PrevRegion], bump[next.Region] = true, true
	}
	m.bump(keysOf(bump)...)
	return out, errs, nil
}
