package homing

import (
	"context"
	"slices"

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
		var writes []Home
		bump := map[string]bool{}
		cur0, versions, _, err := readRehomeRows(ctx, tx, reqs, false)
		if err != nil {
			return err
		}
		for i, req := range reqs {
			cur := cur0[req.Key]
			var from uint64
			if cur != nil {
				from = versions[cur.Region]
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
		regions, err = writeRehomeRows(ctx, tx, writes, nil, keysOf(bump))
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
		var writes []Home
		bump := map[string]bool{}
		var nowNanos int64
		cur0, _, nodes, err := readRehomeRows(ctx, tx, reqs, true)
		if err != nil {
			return err
		}
		for i, req := range reqs {
			cur := cur0[req.Key]
			var live []Liveness
			if cur != nil {
				live = nodes[cur.Region]
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
		regions, err = writeRehomeRows(ctx, tx, writes, &epochGrant{kind: KindRehome, nanos: nowNanos}, keysOf(bump))
		return err
	})
	if err != nil {
		return RehomeBatch{}, err
	}
	return RehomeBatch{Homes: out, Errs: errs, Regions: regions}, nil
}

// readRehomeRows reads, in one round trip, the home records of the
// requests' ranges (locked for update) and, for the regions they are homed
// in, the homes versions or (withLiveness) the liveness records.
func readRehomeRows(ctx context.Context, tx pgx.Tx, reqs []RehomeRequest, withLiveness bool) (map[RangeKey]*Home, map[string]uint64, map[string][]Liveness, error) {
	keys := make([]RangeKey, len(reqs))
	for i, r := range reqs {
		keys[i] = r.Key
	}
	streams, ranges := keyArrays(keys)
	const inKeys = `(stream, range_id) IN (SELECT s, r FROM unnest($1::TEXT[], $2::INT8[]) AS t(s, r))`
	b := &pgx.Batch{}
	b.Queue(`SELECT `+homeColumns+` FROM range_homes WHERE `+inKeys+` FOR UPDATE`, streams, ranges)
	if withLiveness {
		b.Queue(`SELECT `+livenessColumns+` FROM liveness WHERE region IN (SELECT home_region FROM range_homes WHERE `+inKeys+`)`, streams, ranges)
	} else {
		b.Queue(`SELECT region, homes_version FROM regions WHERE region IN (SELECT home_region FROM range_homes WHERE `+inKeys+`)`, streams, ranges)
	}
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	rows, err := br.Query()
	if err != nil {
		return nil, nil, nil, err
	}
	homes, err := scanHomes(rows)
	if err != nil {
		return nil, nil, nil, err
	}
	cur := make(map[RangeKey]*Home, len(homes))
	for i := range homes {
		cur[homes[i].Key] = &homes[i]
	}
	if rows, err = br.Query(); err != nil {
		return nil, nil, nil, err
	}
	if withLiveness {
		ls, err := scanLivenesses(rows)
		if err != nil {
			return nil, nil, nil, err
		}
		nodes := map[string][]Liveness{}
		for _, l := range ls {
			nodes[l.Region] = append(nodes[l.Region], l)
		}
		return cur, nil, nodes, br.Close()
	}
	versions, err := scanVersions(rows)
	if err != nil {
		return nil, nil, nil, err
	}
	return cur, versions, nil, br.Close()
}

// epochGrant is the history to record for a batch's writes.
type epochGrant struct {
	kind  string
	nanos int64
}

// writeRehomeRows writes the home records (and their history with grant),
// bumps the homes version of each region and reads each one's homes at its
// new version, in one round trip.
func writeRehomeRows(ctx context.Context, tx pgx.Tx, writes []Home, grant *epochGrant, regions []string) ([]RegionHomes, error) {
	regions = slices.DeleteFunc(regions, func(r string) bool { return r == "" })
	slices.Sort(regions)
	b := &pgx.Batch{}
	sql, args := writeHomesSQL(writes)
	b.Queue(sql, args...)
	if grant != nil {
		sql, args := insertEpochsSQL(grant.kind, grant.nanos, writes)
		b.Queue(sql, args...)
	}
	b.Queue(`INSERT INTO regions (region, homes_version) SELECT r, 2 FROM unnest($1::TEXT[]) AS t(r)
		ON CONFLICT (region) DO UPDATE SET homes_version = regions.homes_version + 1
		RETURNING region, homes_version`, regions)
	b.Queue(`SELECT `+homeColumns+` FROM range_homes WHERE home_region = ANY($1::TEXT[])`, regions)
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, err
	}
	if grant != nil {
		if _, err := br.Exec(); err != nil {
			return nil, err
		}
	}
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	versions, err := scanVersions(rows)
	if err != nil {
		return nil, err
	}
	if rows, err = br.Query(); err != nil {
		return nil, err
	}
	homes, err := scanHomes(rows)
	if err != nil {
		return nil, err
	}
	out := make([]RegionHomes, 0, len(regions))
	for _, r := range regions {
		rh := RegionHomes{Region: r, Version: versions[r], Homes: []Home{}}
		for _, h := range homes {
			if h.Region == r {
				rh.Homes = append(rh.Homes, h)
			}
		}
		out = append(out, rh)
	}
	return out, br.Close()
}

// scanVersions reads (region, homes_version) rows and closes rows.
func scanVersions(rows pgx.Rows) (map[string]uint64, error) {
	defer rows.Close()
	out := map[string]uint64{}
	for rows.Next() {
		var r string
		var v int64
		if err := rows.Scan(&r, &v); err != nil {
			return nil, err
		}
		if v < 0 {
			return nil, newError(ErrSchema, "region %s has a negative homes version", r)
		}
		out[r] = uint64(v)
	}
	return out, rows.Err()
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
