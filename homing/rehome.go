package homing

import (
	"errors"
	"maps"
	"slices"
)

// Rehome is the coordinator of one planned rehome (DESIGN.md "Planned
// rehome") of ranges that share an old home, From, to To, as a
// deterministic state machine: it takes the answers of the lease store and
// of the two regions' nodes, with the clock readings taken when they came,
// and returns the next requests. It has no goroutines, clock or I/O; one
// goroutine (regionsvc's rehome, or a test) owns it and, until Done:
//
//  1. takes Ready's ops and carries them out in order; at most one op of
//     a batch awaits an answer (Op.Awaited), and it comes last;
//  2. gives that op's answer to the method its kind names, with a clock
//     reading taken when the answer came;
//  3. calls Abandon instead when the caller gave up (its context is done),
//     then carries out what Ready returns next (cancels, the start of what
//     already moved) with a context of its own.
//
// The phases, for the ranges of the group together:
//
//   - Before anything stops, To's mirrors catch up to From's current tails
//     (best effort), so that the pause covers only what arrives meanwhile.
//   - Prepare marks each range as moving (compare-and-set on its epoch) and
//     bumps From's homes version.
//   - Stop: every node of From takes its homes at the prepare's version
//     (or heartbeats for them), stops admitting and acking the ranges, and
//     reports the homes version it acts on (its confirmation) and, from
//     each range's leader, the final tail once its appends in flight are
//     answered. The final tail is the highest report: every ack came from
//     a node that had not taken the stop yet, and reported after it did. A
//     range no leader reported (its leader lost the lead or failed during
//     the stop) is asked of the home leader of now again: a follower's
//     committed end is no final tail, since it may lag what its leader
//     acked (a follower learns the commit index with the leader's next
//     message), so a driver reports leaders' tails only. If a
//     node of From did not answer, it may still lead a range and ack past
//     those reports until its heartbeat brings the prepare: the core waits
//     until no node of From may act on the old homes (Undrained), then
//     reads the final tails again from the leaders of now.
//   - Catch-up: To's copy of each range reaches its final tail.
//   - Complete moves each lease to To at epoch+1 from the final tail, given
//     the confirmations; while the store answers ErrNotDrained the core
//     asks From's nodes to confirm again and retries.
//   - Start: To's nodes take the complete's homes at once. Release: From's
//     nodes learn where their producers go now.
//
// A range that fails after its prepare is cancelled (CancelRehome), which
// gives it back to its old home: nothing acked is lost, since the old home
// keeps its log. Ranges fail one by one; the others go on.
type Rehome struct {
	cfg    RehomeConfig
	ranges []rehomeRange
	phase  rehomePhase
	// waiting is the kind of the op whose answer the core waits for.
	waiting RehomeOpKind

	stopSnap         *RegionHomes // From's homes at the prepare's version
	stopIncomplete   bool         // a node of From did not take the stop
	drainKeys        []RangeKey   // the ranges the OpDrainedTails in flight asks for
	drainVersion     uint64
	seen             map[uint64]uint64 // confirmations: liveness id → homes version
	started, vacated RegionHomes       // To's and From's homes after the last complete
	everPrepared     bool
	attempts         int

	tStart, tPrepared, tStopped, tCaught, tMoved, tEnd int64

	ops   []RehomeOp
	notes []RehomeNote
}

// RehomeConfig configures a Rehome.
type RehomeConfig struct {
	From, To string
	// Ranges are the ranges' homes as read before the move: each homed in
	// From, not moving elsewhere. At most RangesPerRequestMax.
	Ranges []Home
	// MaxOffsetNanos is the cluster's maximum clock offset.
	MaxOffsetNanos int64
	// DrainRetryNanos is the pause between two rounds of the wait for From's
	// nodes to confirm the stop (100ms when 0).
	DrainRetryNanos int64
}

type rehomePhase int

const (
	phasePreCatchUp rehomePhase = iota
	phasePrepare
	phaseStop
	phaseStopTails
	phaseDrainWait
	phaseDrainTails
	phaseCatchUp
	phaseComplete
	phaseStart
	phaseDone
)

type rangeState int

const (
	rangeWaiting rangeState = iota
	rangePrepared
	rangeMoved
	rangeFailed
)

type rehomeRange struct {
	home     Home // as read before the move
	state    rangeState
	prepared Home // after the prepare
	moved    Home // after the complete
	tail     uint64
	hasTail  bool
	err      error
}

// RehomeOpKind is what a RehomeOp asks the driver to do.
type RehomeOpKind int

// The rehome ops. "Answer X" names the method that takes the answer.
const (
	// OpReadTails: read Region's committed tails of Keys, best effort;
	// answer TailsRead (ok false when no node answered).
	OpReadTails RehomeOpKind = iota + 1
	// OpAwaitTails: wait, with a bound of the driver's, until Region's copy
	// of each range of Tails reaches its offset; answer TailsAwaited with
	// the error of each range that did not.
	OpAwaitTails
	// OpPrepare: BatchRehomer.PrepareRehomes(Reqs); answer Prepared.
	OpPrepare
	// OpStop: RefreshHomes on every node of Region, with Homes if set (else
	// a heartbeat, then a second one to confirm), reporting the final tails
	// of Keys that their leaders give (never a follower's committed end);
	// answer Stopped.
	OpStop
	// OpDrainedTails: ask Region's home leader for the confirmed tail of
	// each of Keys, until two readings agree; answer DrainedTails.
	OpDrainedTails
	// OpDrainLiveness: Store.Liveness(Region), to see whether it drained;
	// answer LivenessRead.
	OpDrainLiveness
	// OpConfirm: ask every node of Region to heartbeat and report the homes
	// version it acts on; answer Confirmed.
	OpConfirm
	// OpWait: wait until AtNanos; answer Tick.
	OpWait
	// OpComplete: BatchRehomer.CompleteRehomes(Reqs, Seen), each request's
	// NowNanos stamped with a clock reading taken just before sending;
	// answer Completed.
	OpComplete
	// OpCancel: Store.CancelRehome(Key, Epoch) with a context the caller's
	// cancellation does not end; no answer (on failure the range stays
	// stopped until a rehome completes or is cancelled: log it).
	OpCancel
	// OpStart: RefreshHomes on every node of Region with Homes if set (else
	// a heartbeat); answer Started (errors are only logged: heartbeats
	// bring the homes).
	OpStart
	// OpRelease: the same, in the background, for the old home; no answer.
	OpRelease
)

var rehomeOpNames = [...]string{"?", "read-tails", "await-tails", "prepare", "stop", "drained-tails", "read-liveness",
	"confirm", "wait", "complete", "cancel", "start", "release"}

func (k RehomeOpKind) String() string { return rehomeOpNames[min(int(k), len(rehomeOpNames)-1)] }

// Awaited reports whether the core waits for this kind's answer.
func (k RehomeOpKind) Awaited() bool { return k != OpCancel && k != OpRelease }

// RehomeOp is one request of a rehome.
type RehomeOp struct {
	Kind    RehomeOpKind
	Region  string
	Keys    []RangeKey          // OpReadTails, OpStop, OpDrainedTails
	Tails   map[RangeKey]uint64 // OpAwaitTails
	Reqs    []RehomeRequest     // OpPrepare, OpComplete
	Seen    map[uint64]uint64   // OpComplete (the caller owns a copy)
	Homes   *RegionHomes        // OpStop, OpStart, OpRelease
	Key     RangeKey            // OpCancel
	Epoch   uint64              // OpCancel
	AtNanos int64               // OpWait
}

// RehomeNote is something the driver logs.
type RehomeNote struct {
	Key RangeKey // zero for the whole group
	Msg string
	Err error
	// Nodes are liveness ids (waiting for the old home to confirm).
	Nodes []uint64
	// Routine: a wait that is part of the protocol, worth a debug line
	// (the others are worth a warning).
	Routine bool
}

// RangeRehomeResult is one range's outcome.
type RangeRehomeResult struct {
	Key RangeKey
	// Moved: the range is homed in To at Home.Epoch from StartOffset. Else
	// Err says why it stayed (a range prepared and then failed was
	// cancelled: its old home serves it again).
	Moved       bool
	Home        Home
	StartOffset uint64
	Err         error
}

// RehomeTimes are the phases' durations of a move that moved something,
// from the prepare's start to the new home's start (the pause).
type RehomeTimes struct {
	PrepareNanos, StopOldNanos, CatchUpNanos, CompleteNanos, StartNewNanos, PauseNanos int64
	CompleteAttempts                                                                   int
}

// NewRehome returns a coordinator whose first op reads From's tails.
func NewRehome(cfg RehomeConfig) (*Rehome, error) {
	if err := validateRegion("rehome from", cfg.From); err != nil {
		return nil, err
	}
	if err := validateRegion("rehome to", cfg.To); err != nil {
		return nil, err
	}
	if cfg.From == cfg.To || len(cfg.Ranges) == 0 || len(cfg.Ranges) > RangesPerRequestMax || cfg.MaxOffsetNanos < 0 || cfg.DrainRetryNanos < 0 {
		return nil, invalidf("a rehome moves 1 to %d ranges between two regions", RangesPerRequestMax)
	}
	if cfg.DrainRetryNanos == 0 {
		cfg.DrainRetryNanos = 100_000_000
	}
	r := &Rehome{cfg: cfg, seen: map[uint64]uint64{}}
	keys := make([]RangeKey, len(cfg.Ranges))
	for i, h := range cfg.Ranges {
		r.ranges = append(r.ranges, rehomeRange{home: h})
		keys[i] = h.Key
	}
	r.send(RehomeOp{Kind: OpReadTails, Region: cfg.From, Keys: keys})
	return r, nil
}

// Ready returns the ops and notes produced since the last call; the caller
// owns them.
func (r *Rehome) Ready() ([]RehomeOp, []RehomeNote) {
	ops, notes := r.ops, r.notes
	r.ops, r.notes = nil, nil
	return ops, notes
}

// Done reports whether the rehome has finished (Results is final; a
// Release may still be in Ready).
func (r *Rehome) Done() bool { return r.phase == phaseDone }

func (r *Rehome) send(op RehomeOp) {
	if op.Kind.Awaited() {
		r.waiting = op.Kind
	}
	r.ops = append(r.ops, op)
}

func (r *Rehome) note(n RehomeNote) { r.notes = append(r.notes, n) }

// expect reports whether an answer of kind is awaited, and stops awaiting.
func (r *Rehome) expect(kind RehomeOpKind) bool {
	if r.phase == phaseDone || r.waiting != kind {
		return false
	}
	r.waiting = 0
	return true
}

func (r *Rehome) index(k RangeKey) int {
	return slices.IndexFunc(r.ranges, func(x rehomeRange) bool { return x.home.Key == k })
}

// keys lists the ranges in state s, in request order.
func (r *Rehome) keys(s rangeState) []RangeKey {
	var out []RangeKey
	for _, x := range r.ranges {
		if x.state == s {
			out = append(out, x.home.Key)
		}
	}
	return out
}

// abort gives a prepared range back to its home rather than leave it
// stopped.
func (r *Rehome) abort(i int, err error) {
	x := &r.ranges[i]
	if x.state != rangePrepared {
		return
	}
	r.send(RehomeOp{Kind: OpCancel, Key: x.home.Key, Epoch: x.prepared.Epoch})
	x.state, x.err = rangeFailed, err
}

// TailsRead answers OpReadTails: From's tails before anything stops.
func (r *Rehome) TailsRead(nowNanos int64, tails map[RangeKey]uint64, ok bool) {
	if !r.expect(OpReadTails) {
		return
	}
	if !ok || len(tails) == 0 {
		r.prepare(nowNanos)
		return
	}
	r.send(RehomeOp{Kind: OpAwaitTails, Region: r.cfg.To, Tails: maps.Clone(tails)})
}

// TailsAwaited answers OpAwaitTails: errs holds the ranges whose copy did
// not reach its tail.
func (r *Rehome) TailsAwaited(nowNanos int64, errs map[RangeKey]error) {
	if !r.expect(OpAwaitTails) {
		return
	}
	if r.phase == phasePreCatchUp {
		for _, x := range r.ranges {
			if err := errs[x.home.Key]; err != nil {
				r.note(RehomeNote{Key: x.home.Key, Msg: "the target did not catch up before the move; moving anyway", Err: err})
			}
		}
		r.prepare(nowNanos)
		return
	}
	for i, x := range r.ranges {
		if err := errs[x.home.Key]; err != nil {
			r.abort(i, err)
		}
	}
	r.tCaught = nowNanos
	r.complete(nowNanos)
}

func (r *Rehome) prepare(nowNanos int64) {
	r.phase, r.tStart = phasePrepare, nowNanos
	reqs := make([]RehomeRequest, len(r.ranges))
	for i, x := range r.ranges {
		reqs[i] = RehomeRequest{Key: x.home.Key, Epoch: x.home.Epoch, To: r.cfg.To}
	}
	r.send(RehomeOp{Kind: OpPrepare, Reqs: reqs})
}

// Prepared answers OpPrepare.
func (r *Rehome) Prepared(nowNanos int64, b RehomeBatch, err error) {
	if !r.expect(OpPrepare) {
		return
	}
	for i := range r.ranges {
		x := &r.ranges[i]
		switch {
		case err != nil:
			x.state, x.err = rangeFailed, err
		case i >= len(b.Errs) || i >= len(b.Homes):
			x.state, x.err = rangeFailed, unavailablef("the lease store answered %d of %d prepares", len(b.Errs), len(r.ranges))
		case b.Errs[i] != nil:
			x.state, x.err = rangeFailed, b.Errs[i]
		default:
			x.state, x.prepared = rangePrepared, b.Homes[i]
			r.drainVersion = max(r.drainVersion, x.prepared.DrainVersion)
			r.everPrepared = true
		}
	}
	if !r.everPrepared {
		r.finish(nowNanos)
		return
	}
	r.phase, r.tPrepared = phaseStop, nowNanos
	// Hand From's nodes their homes at the prepare's version; a repeated
	// prepare changed nothing and returns no snapshot: they heartbeat
	// instead, and confirm so.
	op := RehomeOp{Kind: OpStop, Region: r.cfg.From, Keys: r.keys(rangePrepared)}
	if snap, ok := b.Region(r.cfg.From); ok {
		r.stopSnap = &snap
		op.Homes = r.stopSnap
	}
	r.send(op)
}

// Stopped answers OpStop: the highest final tail a leader of From
// reported per range (a range no leader reported is left out, whatever
// its followers' ends), the homes version each node acts on now (by
// liveness id), and err when a node did not answer.
func (r *Rehome) Stopped(nowNanos int64, tails map[RangeKey]uint64, seen map[uint64]uint64, err error) {
	if !r.expect(OpStop) {
		return
	}
	r.merge(seen)
	r.stopIncomplete = err != nil
	if err != nil {
		r.note(RehomeNote{Msg: "stopping the old home", Err: err}) // the store's drain check decides
	}
	var missing []RangeKey
	for i := range r.ranges {
		x := &r.ranges[i]
		if x.state != rangePrepared {
			continue
		}
		if t, ok := tails[x.home.Key]; ok {
			x.tail, x.hasTail = t, true
		} else {
			missing = append(missing, x.home.Key) // its leader did not answer
		}
	}
	if len(missing) > 0 {
		r.phase = phaseStopTails
		r.askDrained(missing)
		return
	}
	r.afterStop(nowNanos)
}

// askDrained asks From's leaders of now for the final tails of keys.
func (r *Rehome) askDrained(keys []RangeKey) {
	r.drainKeys = keys
	r.send(RehomeOp{Kind: OpDrainedTails, Region: r.cfg.From, Keys: keys})
}

func (r *Rehome) merge(seen map[uint64]uint64) {
	for id, v := range seen {
		r.seen[id] = max(r.seen[id], v)
	}
}

// DrainedTails answers OpDrainedTails: the home leader's confirmed tail of
// each range asked, or why it could not be read. A range that was not
// asked (its leader reported its final tail in the stop) keeps that tail.
func (r *Rehome) DrainedTails(nowNanos int64, tails map[RangeKey]uint64, errs map[RangeKey]error) {
	if !r.expect(OpDrainedTails) {
		return
	}
	for i := range r.ranges {
		x := &r.ranges[i]
		t, ok := tails[x.home.Key]
		err := errs[x.home.Key]
		switch {
		case x.state != rangePrepared || !slices.Contains(r.drainKeys, x.home.Key):
		case err != nil || !ok:
			if err == nil {
				err = unavailablef("no tail for %s from the old home", x.home.Key)
			}
			r.abort(i, err)
		default:
			x.tail, x.hasTail = max(x.tail, t), true
		}
	}
	if r.phase == phaseStopTails {
		r.afterStop(nowNanos)
		return
	}
	r.catchUp(nowNanos)
}

// afterStop waits for the old home to drain if a node of it did not take
// the stop from the coordinator: it may lead a range and ack appends past
// the tails reported until its heartbeat brings the prepare (or its lease
// runs out).
func (r *Rehome) afterStop(nowNanos int64) {
	if !r.stopIncomplete || len(r.keys(rangePrepared)) == 0 {
		r.catchUp(nowNanos)
		return
	}
	r.phase = phaseDrainWait
	r.send(RehomeOp{Kind: OpDrainLiveness, Region: r.cfg.From})
}

// LivenessRead answers OpReadLiveness (the wait for From to drain).
func (r *Rehome) LivenessRead(nowNanos int64, live []Liveness, err error) {
	if !r.expect(OpDrainLiveness) {
		return
	}
	if err == nil {
		left := Undrained(live, r.drainVersion, r.seen, nowNanos, r.cfg.MaxOffsetNanos)
		if len(left) == 0 {
			// No node may act on the old homes any more: read the final
			// tails again from the leaders of now.
			r.phase = phaseDrainTails
			r.askDrained(r.keys(rangePrepared))
			return
		}
		r.note(RehomeNote{Msg: "waiting for the old home to confirm", Nodes: left, Routine: true})
	}
	r.send(RehomeOp{Kind: OpConfirm, Region: r.cfg.From})
}

// Confirmed answers OpConfirm with the homes version each node of From
// that answered acts on.
func (r *Rehome) Confirmed(nowNanos int64, seen map[uint64]uint64) {
	if !r.expect(OpConfirm) {
		return
	}
	r.merge(seen)
	if r.phase == phaseDrainWait {
		r.send(RehomeOp{Kind: OpWait, AtNanos: nowNanos + r.cfg.DrainRetryNanos})
		return
	}
	r.complete(nowNanos)
}

// Tick answers OpWait.
func (r *Rehome) Tick(nowNanos int64) {
	if !r.expect(OpWait) {
		return
	}
	r.send(RehomeOp{Kind: OpDrainLiveness, Region: r.cfg.From})
}

func (r *Rehome) catchUp(nowNanos int64) {
	r.phase, r.tStopped = phaseCatchUp, nowNanos
	tails := map[RangeKey]uint64{}
	for _, x := range r.ranges {
		if x.state == rangePrepared {
			tails[x.home.Key] = x.tail
		}
	}
	if len(tails) == 0 {
		r.tCaught = nowNanos
		r.complete(nowNanos)
		return
	}
	r.send(RehomeOp{Kind: OpAwaitTails, Region: r.cfg.To, Tails: tails})
}

// complete asks the store to move the prepared ranges not moved yet, or
// starts the new home once none is left.
func (r *Rehome) complete(nowNanos int64) {
	r.phase = phaseComplete
	var reqs []RehomeRequest
	for _, x := range r.ranges {
		if x.state == rangePrepared {
			reqs = append(reqs, RehomeRequest{Key: x.home.Key, Epoch: x.prepared.Epoch, To: r.cfg.To,
				StartOffset: x.tail, MaxOffsetNanos: r.cfg.MaxOffsetNanos})
		}
	}
	if len(reqs) == 0 {
		r.startNew(nowNanos)
		return
	}
	r.attempts++
	r.send(RehomeOp{Kind: OpComplete, Reqs: reqs, Seen: maps.Clone(r.seen)})
}

// Completed answers OpComplete (for the requests of the op, in order).
func (r *Rehome) Completed(nowNanos int64, b RehomeBatch, err error) {
	if !r.expect(OpComplete) {
		return
	}
	r.tMoved = nowNanos
	if snap, ok := b.Region(r.cfg.To); ok && snap.Version > r.started.Version {
		r.started = snap
	}
	if snap, ok := b.Region(r.cfg.From); ok && snap.Version > r.vacated.Version {
		r.vacated = snap
	}
	undrained := false
	j := 0
	for i := range r.ranges {
		x := &r.ranges[i]
		if x.state != rangePrepared {
			continue
		}
		switch {
		case err != nil:
			r.abort(i, err)
		case j >= len(b.Errs) || j >= len(b.Homes):
			r.abort(i, unavailablef("the lease store answered %d of the completes", len(b.Errs)))
		case b.Errs[j] == nil:
			x.state, x.moved = rangeMoved, b.Homes[j]
		case errors.Is(b.Errs[j], ErrNotDrained):
			undrained = true
		default:
			r.abort(i, b.Errs[j])
		}
		j++
	}
	if undrained {
		// A node of the old home did not confirm to the coordinator: it
		// confirms through its heartbeats (or its liveness runs out).
		r.note(RehomeNote{Msg: "the old home has not confirmed yet", Routine: true})
		r.send(RehomeOp{Kind: OpConfirm, Region: r.cfg.From})
		return
	}
	r.complete(nowNanos)
}

func (r *Rehome) startNew(nowNanos int64) {
	if len(r.keys(rangeMoved)) == 0 {
		r.finish(nowNanos)
		return
	}
	r.phase = phaseStart
	op := RehomeOp{Kind: OpStart, Region: r.cfg.To}
	if r.started.Version > 0 {
		op.Homes = &r.started
	}
	r.send(op)
}

// Started answers OpStart.
func (r *Rehome) Started(nowNanos int64) {
	if !r.expect(OpStart) {
		return
	}
	r.finish(nowNanos)
}

// Abandon ends the rehome because the caller gave up (err, e.g. its
// context's): every range prepared and not moved is cancelled, what moved
// is started. The answer of the op in flight is no longer awaited.
func (r *Rehome) Abandon(nowNanos int64, err error) {
	switch r.phase {
	case phaseDone:
		return
	case phaseStart:
		// The start is not awaited any more: the new home's nodes learn
		// of the move by their heartbeats.
		r.waiting = 0
		r.finish(nowNanos)
		return
	}
	r.waiting = 0
	for i, x := range r.ranges {
		switch x.state {
		case rangePrepared:
			r.abort(i, err)
		case rangeWaiting:
			r.ranges[i].state, r.ranges[i].err = rangeFailed, err
		}
	}
	if r.tMoved == 0 {
		r.tMoved = nowNanos
	}
	r.startNew(nowNanos)
}

// finish ends the rehome; the old home learns where its producers go now
// (the complete's homes, else its heartbeat), and a range given back
// resumes there at once.
func (r *Rehome) finish(nowNanos int64) {
	r.phase, r.tEnd = phaseDone, nowNanos
	if r.everPrepared {
		op := RehomeOp{Kind: OpRelease, Region: r.cfg.From}
		if r.vacated.Version > 0 {
			op.Homes = &r.vacated
		}
		r.send(op)
	}
}

// Results returns each range's outcome, in the order of Config.Ranges.
func (r *Rehome) Results() []RangeRehomeResult {
	out := make([]RangeRehomeResult, len(r.ranges))
	for i, x := range r.ranges {
		out[i] = RangeRehomeResult{Key: x.home.Key, Moved: x.state == rangeMoved, Err: x.err}
		if out[i].Moved {
			out[i].Home, out[i].StartOffset = x.moved, x.tail
		}
	}
	return out
}

// Times returns the phases' durations once Done, when something moved;
// zero otherwise.
func (r *Rehome) Times() RehomeTimes {
	if r.phase != phaseDone || len(r.keys(rangeMoved)) == 0 {
		return RehomeTimes{}
	}
	return RehomeTimes{
		PrepareNanos: r.tPrepared - r.tStart, StopOldNanos: r.tStopped - r.tPrepared, CatchUpNanos: r.tCaught - r.tStopped,
		CompleteNanos: r.tMoved - r.tCaught, StartNewNanos: r.tEnd - r.tMoved, PauseNanos: r.tEnd - r.tStart,
		CompleteAttempts: r.attempts,
	}
}
