package homing

import (
	"context"
	"slices"
	"strings"

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
//
// Both also return the homes of every region whose version the call
// bumped, at that new version, read in the same transaction: what a
// heartbeat of one of those regions' nodes would bring next, so a caller
// may hand it to them directly (Homes.Install) instead of waiting for
// their heartbeats.
//
// CompleteRehomes takes seen, the homes versions that nodes of the old
// home reported directly to the caller (liveness node id → the version
// of their region's homes they had published when they answered, and
// will not go back from: Homes.Install). A node counts as drained when
// its stored HomesSeen or its reported version reaches the move's
// DrainVersion (or it may no longer be live). seen may be nil.
type BatchRehomer interface {
	PrepareRehomes(ctx context.Context, reqs []RehomeRequest) (RehomeBatch, error)
	CompleteRehomes(ctx context.Context, reqs []RehomeRequest, seen map[uint64]uint64) (RehomeBatch, error)
}

// RehomeBatch is the outcome of a batch rehome step.
type RehomeBatch struct {
	// Homes and Errs are per request, in request order: the range's home
	// after the call, or why it was left unchanged.
	Homes []Home
	Errs  []error
	// Regions are the homes of each region whose version the call bumped,
	// at the new version (empty when nothing changed).
	Regions []RegionHomes
}

// RegionHomes is the set of ranges homed in a region at one homes
// version, as one transaction read it: a heartbeat's view of the region.
type RegionHomes struct {
	Region  string
	Version uint64
	Homes   []Home // sorted by key
}

// Region returns the snapshot of region, if the batch has one.
func (b RehomeBatch) Region(region string) (RegionHomes, bool) {
	for _, r := range b.Regions {
		if r.Region == region {
			return r, true
		}
	}
	return RegionHomes{}, false
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
func (s *SQLStore) PrepareRehomes(ctx context.Context, reqs []RehomeRequest) (RehomeBatch, error) {
	if err := validateRehomes(reqs); err != nil {
		return RehomeBatch{}, err
	}
	out := make([]Home, len(reqs))
	errs := make([]error, len(reqs))
	var regions []RegionHomes
	err := s.runTx(ctx, false, func(tx pgx.Tx) error {
		clear(out)
		clear(errs)
		regions = nil
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
		regions, err = bumpAndReadRegions(ctx, tx, keysOf(bump))
		return err
	})
	if err != nil {
		return RehomeBatch{}, err
	}
	return RehomeBatch{Homes: out, Errs: errs, Regions: regions}, nil
}

// CompleteRehomes implements BatchRehomer.
func (s *SQLStore) CompleteRehomes(ctx context.Context, reqs []RehomeRequest, seen map[uint64]uint64) (RehomeBatch, error) {
	if err := validateRehomes(reqs); err != nil {
		return RehomeBatch{}, err
	}
	out := make([]Home, len(reqs))
	errs := make([]error, len(reqs))
	var regions []RegionHomes
	err := s.runTx(ctx, false, func(tx pgx.Tx) error {
		clear(out)
		clear(errs)
		regions = nil
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
			next, err := decideCompleteRehome(cur, req, live, seen)
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
		regions, err = bumpAndReadRegions(ctx, tx, keysOf(bump))
		return err
	})
	if err != nil {
		return RehomeBatch{}, err
	}
	return RehomeBatch{Homes: out, Errs: errs, Regions: regions}, nil
}

// bumpAndReadRegions bumps the homes version of each region and reads
// each one's homes at its new version, in two statements.
func bumpAndReadRegions(ctx context.Context, tx pgx.Tx, regions []string) ([]RegionHomes, error) {
	regions = slices.DeleteFunc(regions, func(r string) bool { return r == "" })
	slices.Sort(regions)
	rows, err := tx.Query(ctx, `INSERT INTO regions (region, homes_version) SELECT r, 2 FROM unnest($1::TEXT[]) AS t(r)
		ON CONFLICT (region) DO UPDATE SET homes_version = regions.homes_version + 1
		RETURNING region, homes_version`, regions)
	if err != nil {
		return nil, err
	}
	out := make([]RegionHomes, 0, len(regions))
	for rows.Next() {
		var r RegionHomes
		var v int64
		if err := rows.Scan(&r.Region, &v); err != nil {
			rows.Close()
			return nil, err
		}
		if v < 0 {
			rows.Close()
			return nil, newError(ErrSchema, "region %s has a negative homes version", r.Region)
		}
		r.Version = uint64(v)
		out = append(out, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	homes, err := queryHomes(ctx, tx, `SELECT `+homeColumns+` FROM range_homes WHERE home_region = ANY($1::TEXT[])`, regions)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(homes, func(a, b Home) int { return compareKeys(a.Key, b.Key) })
	for i := range out {
		out[i].Homes = []Home{}
		for _, h := range homes {
			if h.Region == out[i].Region {
				out[i].Homes = append(out[i].Homes, h)
			}
		}
	}
	slices.SortFunc(out, func(a, b RegionHomes) int { return strings.Compare(a.Region, b.Region) })
	return out, nil
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
func (m *MemStore) PrepareRehomes(ctx context.Context, reqs []RehomeRequest) (RehomeBatch, error) {
	if err := validateRehomes(reqs); err != nil {
		return RehomeBatch{}, err
	}
	if err := m.enter(ctx); err != nil {
		return RehomeBatch{}, err
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
	return RehomeBatch{Homes: out, Errs: errs, Regions: m.bumpAndRead(keysOf(bump))}, nil
}

// CompleteRehomes implements BatchRehomer.
func (m *MemStore) CompleteRehomes(ctx context.Context, reqs []RehomeRequest, seen map[uint64]uint64) (RehomeBatch, error) {
	if err := validateRehomes(reqs); err != nil {
		return RehomeBatch{}, err
	}
	if err := m.enter(ctx); err != nil {
		return RehomeBatch{}, err
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
		next, err := decideCompleteRehome(cur, req, nodes, seen)
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
	return RehomeBatch{Homes: out, Errs: errs, Regions: m.bumpAndRead(keysOf(bump))}, nil
}

// bumpAndRead bumps each region's homes version and returns its homes at
// the new version (m.mu held).
func (m *MemStore) bumpAndRead(regions []string) []RegionHomes {
	slices.Sort(regions)
	out := []RegionHomes{}
	for _, r := range regions {
		if r == "" {
			continue
		}
		m.bump(r)
		out = append(out, RegionHomes{Region: r, Version: m.versions[r], Homes: m.regionHomes(r)})
	}
	return out
}
