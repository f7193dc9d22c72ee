package homing

import (
	"maps"
	"slices"
)

// Takeover is the failover decision of one region (unplanned failover,
// DESIGN.md "Homing") as a deterministic state machine: which ranges homed
// in another region this region takes, and when, given the lease store's
// liveness records, the surviving regions' tails and the time. It has no
// goroutines, clock or I/O; one goroutine (the driver: regionsvc's failover
// agent, or a test) owns it and, in a loop:
//
//   - calls Tick with a clock reading and what the node knows (whether it
//     leads its region's failover, its own lease, the home directory);
//   - takes Ready's ops, carries them out, and feeds each answer back with
//     the op's Round (LivenessRead, TailsRead, TakeoverDone); answers of
//     another round are ignored;
//   - calls LeaderChanged when the node stops (or starts) leading.
//
// A round judges each region that homes ranges this region mirrors, one
// after the other in name order: a region is dead when every one of its
// liveness records is past its expiration plus the max clock offset (and
// the store answered). The most caught-up surviving mirror of a dead
// region's range takes it at epoch+1 from its tail; only the best region
// (ties broken by the stream's preference order) acts at once, any other
// after GraceNanos from when the region was first seen dead (the best may
// be unable to). The store's compare-and-set on the epoch makes the race
// of two takers harmless: one wins, the other gets OutcomeEpochMismatch.
type Takeover struct {
	cfg TakeoverConfig

	// deadSince is when each home region was first seen dead.
	deadSince map[string]int64
	// aliveUntil is, per region, the first instant at which every node of
	// it may be dead by its liveness records as last read (latest
	// expiration plus the max clock offset): no need to read them before.
	aliveUntil map[string]int64
	// liveSince is when this node's own lease last became valid after it
	// had none (0 while it has none).
	liveSince int64
	leading   bool

	round uint64 // the current round's id; answers of others are stale
	cur   *takeoverRound
	ops   []TakeoverOp
	notes []TakeoverNote
}

// TakeoverConfig configures a Takeover. Durations are in nanoseconds.
type TakeoverConfig struct {
	// Region is this node's region.
	Region string
	// Regions are every region of the deployment, this one included: a
	// grant is announced to each of them but the one that failed.
	Regions []string
	// SettleNanos is how long the node's own lease must have held before it
	// judges other regions by their liveness: a lease TTL plus the max
	// clock offset. After a lease-store outage every region's liveness has
	// expired; they say nothing until each had a lease's time to renew.
	SettleNanos int64
	// GraceNanos is how long a region that is not the best candidate waits,
	// once a home region is dead, before taking over itself.
	GraceNanos int64
	// MaxOffsetNanos is the maximum clock offset between two nodes.
	MaxOffsetNanos int64
	// ChunkRangesMax bounds the ranges of one takeover request (at most
	// RangesPerRequestMax, the default when 0).
	ChunkRangesMax int
}

// TakeoverTick is what the driver knows at a clock reading.
type TakeoverTick struct {
	NowNanos int64
	// Leading: this node leads its region's failover (its catalogue) and
	// failover is enabled.
	Leading bool
	// ServeUntilNanos is the node's own lease (View.ServeUntilNanos; 0 when
	// it holds none): a region that is not live could not serve what it took.
	ServeUntilNanos int64
	// StoreUnreached: the node's last call to the lease store failed
	// (View.Failures > 0); ReachedSinceNanos is since when it has reached
	// the store without a break (View.ReachedSinceNanos; 0: not known).
	// While the store is out of reach nothing is judged, and after a break
	// the core settles as after regaining its lease: an outage shorter
	// than a lease may have expired other regions' liveness and not its
	// own.
	StoreUnreached    bool
	ReachedSinceNanos int64
	// Homes are the home records of ranges this node mirrors that are homed
	// elsewhere (the home directory).
	Homes []Home
	// Streams are each known stream's regions in failover preference order.
	// A home whose stream is missing is passed over.
	Streams map[string][]string
}

// TakeoverOpKind is what a TakeoverOp asks the driver to do.
type TakeoverOpKind int

// The takeover ops.
const (
	// OpReadLiveness: read Region's liveness records; answer LivenessRead.
	OpReadLiveness TakeoverOpKind = iota + 1
	// OpSurveyTails: ask each of Asks for its tails of the stream, and read
	// this node's own committed tails of Keys (those it can serve: a range
	// it holds a healthy replica of); answer TailsRead.
	OpSurveyTails
	// OpTakeover: take Ranges from Region (Store.Takeover); answer
	// TakeoverDone.
	OpTakeover
	// OpRefreshDirectory: read the home directory again (what moved is
	// stale). No answer.
	OpRefreshDirectory
	// OpRefreshRegions: ask every node of Regions to refresh its homes now,
	// not at its next heartbeat. No answer.
	OpRefreshRegions
)

// Awaited reports whether the core waits for this kind's answer.
func (k TakeoverOpKind) Awaited() bool {
	return k == OpReadLiveness || k == OpSurveyTails || k == OpTakeover
}

func (k TakeoverOpKind) String() string {
	return [...]string{"?", "read-liveness", "survey-tails", "takeover", "refresh-directory", "refresh-regions"}[min(int(k), 5)]
}

// TailAsk is one (region, stream) whose tails a survey asks for.
type TailAsk struct{ Region, Stream string }

// TakeoverOp is one request of a round.
type TakeoverOp struct {
	Kind  TakeoverOpKind
	Round uint64
	// Region: the region read (OpReadLiveness), or the dead home region
	// (OpSurveyTails, OpTakeover).
	Region  string
	Asks    []TailAsk       // OpSurveyTails
	Keys    []RangeKey      // OpSurveyTails
	Ranges  []TakeoverRange // OpTakeover
	Regions []string        // OpRefreshRegions
}

// TailReport answers OpSurveyTails.
type TailReport struct {
	// Remote holds each answering region's tails of a stream's ranges, by
	// region then stream; a region that did not answer is absent (not a
	// candidate).
	Remote map[string]map[string][]uint64
	// Local holds this node's committed tail of each range it can serve; a
	// range missing is not taken by this region.
	Local map[RangeKey]uint64
}

// TakeoverNote is something the driver logs or counts.
type TakeoverNote struct {
	// Down: Region was first seen dead, with Ranges of its ranges mirrored
	// here.
	Down   bool
	Region string
	Ranges int
	// Granted: this range is now homed here, at Range.Epoch+1 from
	// Range.StartOffset (Range as requested).
	Granted bool
	Range   TakeoverRange
}

// takeoverRound is one pass over the regions homing mirrored ranges.
type takeoverRound struct {
	now      int64
	byRegion map[string][]Home
	streams  map[string][]string
	regions  []string // left to judge, the current one first
	// waiting is the kind of answer the round waits for (0: none).
	waiting TakeoverOpKind
	chunks  [][]TakeoverRange // takeover requests left for the current region
	sent    []TakeoverRange   // the takeover request awaiting its answer
	took    bool              // a range of the current region was granted
}

// NewTakeover returns a core with no region judged yet.
func NewTakeover(cfg TakeoverConfig) (*Takeover, error) {
	if err := validateRegion("takeover", cfg.Region); err != nil {
		return nil, err
	}
	if cfg.SettleNanos < 0 || cfg.GraceNanos < 0 || cfg.MaxOffsetNanos < 0 || cfg.ChunkRangesMax < 0 {
		return nil, invalidf("takeover durations and chunk size must not be negative")
	}
	if cfg.ChunkRangesMax == 0 || cfg.ChunkRangesMax > RangesPerRequestMax {
		cfg.ChunkRangesMax = RangesPerRequestMax
	}
	cfg.Regions = slices.Sorted(slices.Values(cfg.Regions))
	return &Takeover{cfg: cfg, deadSince: map[string]int64{}, aliveUntil: map[string]int64{}}, nil
}

// Busy reports whether a round waits for an answer (a Tick then does
// nothing).
func (t *Takeover) Busy() bool { return t.cur != nil }

// Current reports whether round is the round in progress: an op of
// another round that awaits an answer should not be carried out (the core
// dropped its round; refreshes are still worth doing).
func (t *Takeover) Current(round uint64) bool { return t.cur != nil && round == t.round }

// Ready returns the ops and notes produced since the last call; the caller
// owns them.
func (t *Takeover) Ready() ([]TakeoverOp, []TakeoverNote) {
	ops, notes := t.ops, t.notes
	t.ops, t.notes = nil, nil
	return ops, notes
}

// LeaderChanged tells the core whether this node leads its region's
// failover now. Losing the lead forgets every region's state and drops the
// round in progress: its answers are ignored, and nothing more is asked.
func (t *Takeover) LeaderChanged(leading bool) {
	if leading == t.leading {
		return
	}
	t.leading = leading
	if !leading {
		t.reset()
	}
}

func (t *Takeover) reset() {
	clear(t.deadSince)
	clear(t.aliveUntil)
	t.cur = nil
	t.round++
	t.ops = nil
}

// Tick starts a round at tk.NowNanos unless one is in progress.
func (t *Takeover) Tick(tk TakeoverTick) {
	t.LeaderChanged(tk.Leading)
	if !tk.Leading || t.cur != nil {
		return
	}
	now := tk.NowNanos
	if tk.ServeUntilNanos == 0 || now >= tk.ServeUntilNanos {
		t.liveSince = 0
		return // not live itself: it could not serve what it took
	}
	if t.liveSince == 0 {
		t.liveSince = now
	}
	if tk.StoreUnreached || now-max(t.liveSince, tk.ReachedSinceNanos) < t.cfg.SettleNanos {
		// This node just gained (or regained) its lease, or reaches the
		// store again after a break: the store may have been out for
		// every region, whose homes renew now too. Their expired liveness
		// says nothing until they had a lease's time to renew with the
		// store back. An outage shorter than a lease can expire a home
		// that last renewed early in it and leave this node's own lease
		// standing: the break, not the lease, starts the wait.
		return
	}
	r := &takeoverRound{now: now, byRegion: map[string][]Home{}, streams: tk.Streams}
	for _, h := range tk.Homes {
		if h.Region != t.cfg.Region && h.MovingTo == "" {
			r.byRegion[h.Region] = append(r.byRegion[h.Region], h)
		}
	}
	for _, homes := range r.byRegion {
		slices.SortFunc(homes, func(a, b Home) int { return compareKeys(a.Key, b.Key) })
	}
	r.regions = slices.Sorted(maps.Keys(r.byRegion))
	t.round++
	t.cur = r
	t.nextRegion()
}

// nextRegion asks for what the first region left needs, skipping those
// that cannot be dead yet; it ends the round when none is left.
func (t *Takeover) nextRegion() {
	r := t.cur
	for len(r.regions) > 0 {
		from := r.regions[0]
		if r.now < t.aliveUntil[from] {
			delete(t.deadSince, from)
			r.regions = r.regions[1:]
			continue
		}
		r.waiting = OpReadLiveness
		t.ops = append(t.ops, TakeoverOp{Kind: OpReadLiveness, Round: t.round, Region: from})
		return
	}
	t.cur = nil
}

// expect reports whether an answer of this kind and round is awaited.
func (t *Takeover) expect(round uint64, kind TakeoverOpKind) bool {
	return t.cur != nil && round == t.round && t.cur.waiting == kind
}

// LivenessRead answers OpReadLiveness: the region's liveness records, or
// the store's error (the region then counts as live).
func (t *Takeover) LivenessRead(round uint64, live []Liveness, err error) {
	if !t.expect(round, OpReadLiveness) {
		return
	}
	r := t.cur
	from := r.regions[0]
	if err != nil || len(live) == 0 {
		// Not known dead: the grace starts over once it is.
		delete(t.deadSince, from)
		t.endRegion(false)
		return
	}
	latest := int64(0)
	for _, l := range live {
		latest = max(latest, l.ExpirationNanos+t.cfg.MaxOffsetNanos)
	}
	if r.now <= latest {
		t.aliveUntil[from] = latest + 1
		delete(t.deadSince, from)
		t.endRegion(false)
		return
	}
	if _, ok := t.deadSince[from]; !ok {
		t.deadSince[from] = r.now
		t.notes = append(t.notes, TakeoverNote{Down: true, Region: from, Ranges: len(r.byRegion[from])})
	}
	asks := map[TailAsk]bool{}
	var keys []RangeKey
	for _, h := range r.byRegion[from] {
		regions, ok := r.streams[h.Key.Stream]
		if !ok {
			continue
		}
		keys = append(keys, h.Key)
		for _, g := range regions {
			if g != t.cfg.Region && g != from {
				asks[TailAsk{Region: g, Stream: h.Key.Stream}] = true
			}
		}
	}
	if len(keys) == 0 {
		t.endRegion(false)
		return
	}
	sorted := slices.SortedFunc(maps.Keys(asks), func(a, b TailAsk) int {
		if a.Region != b.Region {
			return cmpString(a.Region, b.Region)
		}
		return cmpString(a.Stream, b.Stream)
	})
	r.waiting = OpSurveyTails
	t.ops = append(t.ops, TakeoverOp{Kind: OpSurveyTails, Round: t.round, Region: from, Asks: sorted, Keys: keys})
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// TailsRead answers OpSurveyTails and decides which ranges to take.
func (t *Takeover) TailsRead(round uint64, rep TailReport) {
	if !t.expect(round, OpSurveyTails) {
		return
	}
	r := t.cur
	from := r.regions[0]
	graceOver := r.now-t.deadSince[from] >= t.cfg.GraceNanos
	var take []TakeoverRange
	for _, h := range r.byRegion[from] {
		order, ok := r.streams[h.Key.Stream]
		mine, serves := rep.Local[h.Key]
		if !ok || !serves {
			continue
		}
		if t.best(order, from, h.Key, mine, rep.Remote) != t.cfg.Region && !graceOver {
			continue
		}
		take = append(take, TakeoverRange{Key: h.Key, Epoch: h.Epoch, StartOffset: mine})
	}
	if len(take) == 0 {
		t.endRegion(false)
		return
	}
	r.chunks = nil
	for len(take) > 0 {
		n := min(len(take), t.cfg.ChunkRangesMax)
		r.chunks = append(r.chunks, take[:n:n])
		take = take[n:]
	}
	t.nextChunk()
}

// best is the region whose mirror of key is the most caught up (ties: the
// earlier in order), among this one (at tail mine) and the surviving
// regions that answered.
func (t *Takeover) best(order []string, from string, key RangeKey, mine uint64, remote map[string]map[string][]uint64) string {
	best, bestTail := t.cfg.Region, mine
	for _, g := range order {
		if g == t.cfg.Region || g == from {
			continue
		}
		rt := remote[g][key.Stream]
		if int(key.Range) >= len(rt) {
			continue // unreachable: not a candidate
		}
		tail := rt[key.Range]
		if tail > bestTail || (tail == bestTail && rank(order, g) < rank(order, best)) {
			best, bestTail = g, tail
		}
	}
	return best
}

// rank is a region's place in order; a region not in it comes last.
func rank(order []string, g string) int {
	if i := slices.Index(order, g); i >= 0 {
		return i
	}
	return len(order)
}

func (t *Takeover) nextChunk() {
	r := t.cur
	r.waiting = OpTakeover
	r.sent, r.chunks = r.chunks[0], r.chunks[1:]
	t.ops = append(t.ops, TakeoverOp{Kind: OpTakeover, Round: t.round, Region: r.regions[0], Ranges: r.sent})
}

// TakeoverDone answers OpTakeover with the store's result or error. After
// an error the region's remaining chunks wait for the next round.
func (t *Takeover) TakeoverDone(round uint64, res TakeoverResult, err error) {
	if !t.expect(round, OpTakeover) {
		return
	}
	r := t.cur
	if err == nil {
		for i, o := range res.Ranges {
			if o.Outcome != Granted || i >= len(r.sent) {
				continue
			}
			r.took = true
			t.notes = append(t.notes, TakeoverNote{Granted: true, Region: r.regions[0], Range: r.sent[i]})
		}
		if len(r.chunks) > 0 {
			t.nextChunk()
			return
		}
	}
	t.endRegion(true)
}

// endRegion finishes the current region: after a takeover attempt the
// directory is stale for what moved, and a grant is announced to every
// region but the failed one (this region's nodes lead the ranges now; the
// other survivors redirect producers here).
func (t *Takeover) endRegion(attempted bool) {
	r := t.cur
	from := r.regions[0]
	if attempted {
		t.ops = append(t.ops, TakeoverOp{Kind: OpRefreshDirectory, Round: t.round})
		if r.took {
			var regions []string
			for _, g := range append([]string{t.cfg.Region}, t.cfg.Regions...) {
				if g != from && !slices.Contains(regions, g) {
					regions = append(regions, g)
				}
			}
			t.ops = append(t.ops, TakeoverOp{Kind: OpRefreshRegions, Round: t.round, Region: from, Regions: regions})
		}
	}
	r.regions, r.waiting, r.chunks, r.sent, r.took = r.regions[1:], 0, nil, nil, false
	t.nextRegion()
}
