package homing

import (
	"cmp"
	"context"
	"slices"
	"sync"
)

// MemStore is the in-memory twin of the SQL lease store, for unit tests and
// the simulator. Each method runs under one lock, so every call is atomic
// and the history is trivially serializable. SetDown simulates an outage.
// The zero value is not usable; call NewMemStore.
type MemStore struct {
	mu       sync.Mutex
	down     bool
	closed   bool
	nodes    map[uint64]Liveness
	homes    map[RangeKey]Home
	versions map[string]uint64 // region -> homes version
	history  map[RangeKey][]EpochRecord
	claims   map[splitClaimKey]claimHolder // splitclaim.go
	calls    int
}

var _ Store = (*MemStore)(nil)

// NewMemStore returns an empty store.
func NewMemStore() *MemStore {
	return &MemStore{
		nodes:    map[uint64]Liveness{},
		homes:    map[RangeKey]Home{},
		versions: map[string]uint64{},
		history:  map[RangeKey][]EpochRecord{},
		claims:   map[splitClaimKey]claimHolder{},
	}
}

// SetDown makes every call fail with ErrStoreUnavailable (true) or work
// again (false), as a lease-store outage would.
func (m *MemStore) SetDown(down bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.down = down
}

// Calls returns how many calls reached the store (failed or not).
func (m *MemStore) Calls() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls
}

// enter takes the lock and checks the store is up; the caller unlocks.
func (m *MemStore) enter(ctx context.Context) error {
	m.mu.Lock()
	m.calls++
	if m.closed {
		m.mu.Unlock()
		return newError(ErrClosed, "store is closed")
	}
	if m.down {
		m.mu.Unlock()
		return newError(ErrStoreUnavailable, "in-memory store is down")
	}
	if err := ctx.Err(); err != nil {
		m.mu.Unlock()
		return newErrorAlso(ErrStoreUnavailable, err, "%v", err)
	}
	return nil
}

// Heartbeat implements Store.
func (m *MemStore) Heartbeat(ctx context.Context, req HeartbeatRequest) (HeartbeatResult, error) {
	if err := req.validate(); err != nil {
		return HeartbeatResult{}, err
	}
	if err := m.enter(ctx); err != nil {
		return HeartbeatResult{}, err
	}
	defer m.mu.Unlock()
	var cur *Liveness
	if l, ok := m.nodes[req.NodeID]; ok {
		cur = &l
	}
	d, err := decideHeartbeat(cur, req)
	if err != nil {
		return HeartbeatResult{}, err
	}
	if d.write {
		m.nodes[req.NodeID] = d.next
	}
	if d.insert {
		m.ensureRegion(req.Region)
	}
	res := HeartbeatResult{Liveness: d.next, Extended: d.extended, HomesVersion: m.versions[req.Region]}
	if res.HomesVersion != req.HomesKnown {
		res.HomesChanged = true
		res.Homes = m.regionHomes(req.Region)
	}
	return res, nil
}

func (m *MemStore) ensureRegion(region string) {
	if _, ok := m.versions[region]; !ok {
		m.versions[region] = 1
	}
}

func (m *MemStore) bump(regions ...string) {
	for _, r := range regions {
		m.versions[r]++
		if m.versions[r] == 1 {
			// A region first seen here starts at 1 and is bumped to 2, as
			// the SQL store's insert-or-increment does.
			m.versions[r] = 2
		}
	}
}

func (m *MemStore) regionHomes(region string) []Home {
	out := []Home{}
	for _, h := range m.homes {
		if h.Region == region {
			out = append(out, h)
		}
	}
	slices.SortFunc(out, func(a, b Home) int { return compareKeys(a.Key, b.Key) })
	return out
}

func compareKeys(a, b RangeKey) int {
	switch {
	case a.less(b):
		return -1
	case b.less(a):
		return 1
	}
	return 0
}

// CreateHomes implements Store.
func (m *MemStore) CreateHomes(ctx context.Context, specs []HomeSpec) ([]Home, error) {
	if err := validateSpecs(specs); err != nil {
		return nil, err
	}
	if err := m.enter(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	out := make([]Home, len(specs))
	bumped := map[string]bool{}
	for i, s := range specs {
		var cur *Home
		if h, ok := m.homes[s.Key]; ok {
			cur = &h
		}
		h, created := decideCreate(cur, s)
		if created {
			m.homes[s.Key] = h
			m.history[s.Key] = append(m.history[s.Key], EpochRecord{Key: s.Key, Epoch: 1, Region: s.Region, StartOffset: s.StartOffset, Kind: KindCreate})
			if !bumped[s.Region] {
				bumped[s.Region] = true
				m.bump(s.Region)
			}
		}
		out[i] = h
	}
	return out, nil
}

// Homes implements Store.
func (m *MemStore) Homes(ctx context.Context, keys []RangeKey) ([]Home, error) {
	if err := validateKeys(keys); err != nil {
		return nil, err
	}
	if err := m.enter(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	out := make([]Home, len(keys))
	for i, k := range keys {
		h, ok := m.homes[k]
		if !ok {
			h = Home{Key: k}
		}
		out[i] = h
	}
	return out, nil
}

// RegionHomes implements Store.
func (m *MemStore) RegionHomes(ctx context.Context, region string) ([]Home, uint64, error) {
	if err := validateRegion("home", region); err != nil {
		return nil, 0, err
	}
	if err := m.enter(ctx); err != nil {
		return nil, 0, err
	}
	defer m.mu.Unlock()
	return m.regionHomes(region), m.versions[region], nil
}

// Liveness implements Store.
func (m *MemStore) Liveness(ctx context.Context, region string) ([]Liveness, error) {
	if region != "" {
		if err := validateRegion("node", region); err != nil {
			return nil, err
		}
	}
	if err := m.enter(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	return m.liveness(region), nil
}

func (m *MemStore) liveness(region string) []Liveness {
	out := []Liveness{}
	for _, l := range m.nodes {
		if region == "" || l.Region == region {
			out = append(out, l)
		}
	}
	slices.SortFunc(out, func(a, b Liveness) int {
		switch {
		case a.NodeID < b.NodeID:
			return -1
		case a.NodeID > b.NodeID:
			return 1
		}
		return 0
	})
	return out
}

// Takeover implements Store.
func (m *MemStore) Takeover(ctx context.Context, req TakeoverRequest) (TakeoverResult, error) {
	if err := req.validate(); err != nil {
		return TakeoverResult{}, err
	}
	if err := m.enter(ctx); err != nil {
		return TakeoverResult{}, err
	}
	defer m.mu.Unlock()
	cur := make(map[RangeKey]Home, len(req.Ranges))
	for _, r := range req.Ranges {
		if h, ok := m.homes[r.Key]; ok {
			cur[r.Key] = h
		}
	}
	plan, err := decideTakeover(req, m.liveness(req.From), cur)
	if err != nil {
		return TakeoverResult{}, err
	}
	if len(plan.granted) == 0 {
		return plan.result, nil
	}
	for _, l := range plan.result.Fenced {
		m.nodes[l.NodeID] = l
	}
	for _, h := range plan.granted {
		m.homes[h.Key] = h
		m.history[h.Key] = append(m.history[h.Key], EpochRecord{Key: h.Key, Epoch: h.Epoch, Region: h.Region,
			StartOffset: h.StartOffset, PrevRegion: h.PrevRegion, Kind: KindTakeover, GrantedNanos: req.NowNanos})
	}
	m.bump(req.From, req.To)
	return plan.result, nil
}

// PrepareRehome implements Store.
func (m *MemStore) PrepareRehome(ctx context.Context, req RehomeRequest) (Home, error) {
	if err := req.validate(true); err != nil {
		return Home{}, err
	}
	if err := m.enter(ctx); err != nil {
		return Home{}, err
	}
	defer m.mu.Unlock()
	cur := m.home(req.Key)
	from := ""
	if cur != nil {
		from = cur.Region
	}
	next, changed, err := decidePrepareRehome(cur, req, m.versions[from])
	if err != nil {
		return Home{}, err
	}
	if changed {
		m.homes[req.Key] = next
		m.bump(from)
	}
	return next, nil
}

func (m *MemStore) home(k RangeKey) *Home {
	if h, ok := m.homes[k]; ok {
		return &h
	}
	return nil
}

// CompleteRehome implements Store.
func (m *MemStore) CompleteRehome(ctx context.Context, req RehomeRequest) (Home, error) {
	if err := req.validate(true); err != nil {
		return Home{}, err
	}
	if err := m.enter(ctx); err != nil {
		return Home{}, err
	}
	defer m.mu.Unlock()
	cur := m.home(req.Key)
	var nodes []Liveness
	if cur != nil {
		nodes = m.liveness(cur.Region)
	}
	next, err := decideCompleteRehome(cur, req, nodes, nil)
	if err != nil {
		return Home{}, err
	}
	m.homes[req.Key] = next
	m.history[req.Key] = append(m.history[req.Key], EpochRecord{Key: next.Key, Epoch: next.Epoch, Region: next.Region,
		StartOffset: next.StartOffset, PrevRegion: next.PrevRegion, Kind: KindRehome, GrantedNanos: req.NowNanos})
	m.bump(next.PrevRegion, next.Region)
	return next, nil
}

// CancelRehome implements Store.
func (m *MemStore) CancelRehome(ctx context.Context, req RehomeRequest) (Home, error) {
	if err := req.validate(false); err != nil {
		return Home{}, err
	}
	if err := m.enter(ctx); err != nil {
		return Home{}, err
	}
	defer m.mu.Unlock()
	cur := m.home(req.Key)
	next, changed, err := decideCancelRehome(cur, req)
	if err != nil {
		return Home{}, err
	}
	if changed {
		m.homes[req.Key] = next
		m.bump(next.Region)
	}
	return next, nil
}

// History implements Store.
func (m *MemStore) History(ctx context.Context, key RangeKey) ([]EpochRecord, error) {
	if err := validateKey(key); err != nil {
		return nil, err
	}
	if err := m.enter(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	return append([]EpochRecord{}, m.history[key]...), nil
}

// StreamHistory implements Store.
func (m *MemStore) StreamHistory(ctx context.Context, stream string) ([]EpochRecord, error) {
	if err := validateStream(stream); err != nil {
		return nil, err
	}
	if err := m.enter(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	out := []EpochRecord{}
	for k, recs := range m.history {
		if k.Stream == stream {
			out = append(out, recs...)
		}
	}
	slices.SortFunc(out, func(a, b EpochRecord) int {
		return cmp.Or(cmp.Compare(a.Key.Range, b.Key.Range), cmp.Compare(a.Epoch, b.Epoch))
	})
	return out, nil
}

// Close implements Store: later calls fail with ErrClosed.
func (m *MemStore) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
}

// DeleteHomes implements Store.
func (m *MemStore) DeleteHomes(ctx context.Context, stream string) error {
	if err := validateStream(stream); err != nil {
		return err
	}
	if err := m.enter(ctx); err != nil {
		return err
	}
	defer m.mu.Unlock()
	for k := range m.claims {
		if k.stream == stream {
			delete(m.claims, k)
		}
	}
	bumped := map[string]bool{}
	for k, h := range m.homes {
		if k.Stream != stream {
			continue
		}
		delete(m.homes, k)
		if !bumped[h.Region] {
			bumped[h.Region] = true
			m.bump(h.Region)
		}
	}
	for k := range m.history {
		if k.Stream == stream {
			delete(m.history, k)
		}
	}
	return nil
}
