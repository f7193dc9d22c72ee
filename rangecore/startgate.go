package rangecore

import (
	"errors"

	"github.com/geolog/geolog/apierr"
)

// Where an epoch starts (docs/design.md "Where an epoch starts";
// homing/raisestart.go). A takeover records the taker's committed end as
// the new epoch's start, but more of its log may still commit after that
// reading, at the old epoch: a verbatim mirror apply already proposed, or
// entries a new Raft leader's predecessor left uncommitted. So the new
// home's range leader admits no frame of its epoch E until it has
// confirmed where its log ends and the recorded start is that end:
//
//  1. It holds E's appends (StartGate.Admit), and proposes no mirrored
//     frame older than E any more (the gate's floor, AdmitMirrored).
//  2. A ReadIndex confirms its leadership and everything committed; once
//     nothing of its own is pending, its log is committed to its end L
//     (a leader's log past its committed end is its own proposals):
//     StartGate.Indexed.
//  3. The node compares L with the recorded start S (CheckStart): equal,
//     done; above, it raises S to L in the lease store (RaiseStart,
//     compare-and-set); below, the log has not reached the epoch's start
//     yet and the appends are refused, retriable.
//  4. Back on the driver, in the same leader term with the log still at
//     L, the held appends are proposed: E's first frame lands at L
//     (StartGate.Done).
//
// A leader whose log already holds a frame of E (HighestEpoch) needs no
// confirmation; nor does epoch 1, which nothing precedes.

// Leader is what the gate reads of the range's replica.
type Leader struct {
	// IsLeader: the replica leads its group, in Term.
	IsLeader bool
	Term     uint64
	// HighestEpoch is the highest epoch of a frame in its log.
	HighestEpoch uint64
	// Committed is its committed end; Pending counts its own proposals not
	// answered yet.
	Committed uint64
	Pending   int
}

// Verdict is the gate's answer to an append.
type Verdict int

const (
	// Pass: propose it now.
	Pass Verdict = iota
	// Held: the gate keeps it until the start is confirmed (Done).
	Held
	// RefuseStale: a mirrored frame older than the epoch this range was
	// home at (StaleEpoch).
	RefuseStale
	// RefuseFull: too many appends held already (retriable).
	RefuseFull
)

const (
	// StartGateHeldMax bounds the appends a range holds while it confirms
	// its start; more are refused, retriable.
	StartGateHeldMax = 4096
	// StartGateTriesMax bounds the ReadIndex rounds of one confirmation
	// that find an apply still in flight; then the held appends are
	// refused, retriable, and the next append starts again.
	StartGateTriesMax = 50
)

// ErrStartInFlight: the log had entries past its committed end when the
// confirmation looked (an apply or a proposal in flight).
var ErrStartInFlight = apierr.New(apierr.Unavailable, "the range's log is still committing older entries before the new epoch's first")

// StartGate is a range leader's confirmation of its epoch's start, holding
// appends of type T meanwhile. Not safe for concurrent use.
type StartGate[T any] struct {
	// epoch's start was confirmed to be this leader's log end in term.
	epoch, term uint64
	// floor is the highest epoch this node held appends of: no mirrored
	// frame of an older epoch is proposed here any more.
	floor uint64
	// running: a confirmation of runEpoch is under way; tries counts its
	// rounds (an apply still in flight makes it ask again).
	running  bool
	runEpoch uint64
	tries    int
	// held are the appends waiting for it, in arrival order.
	held []T
}

// Floor is the highest epoch this range held appends of (0: none).
func (g *StartGate[T]) Floor() uint64 { return g.floor }

// Held counts the appends held.
func (g *StartGate[T]) Held() int { return len(g.held) }

// Confirmed is the epoch whose start was last confirmed, and the leader
// term it was confirmed in.
func (g *StartGate[T]) Confirmed() (epoch, term uint64) { return g.epoch, g.term }

// AdmitMirrored judges a mirrored (verbatim) frame of frameEpoch: Pass, or
// RefuseStale once this range held appends of a newer epoch.
func (g *StartGate[T]) AdmitMirrored(frameEpoch uint64) Verdict {
	if g.floor == 0 || frameEpoch >= g.floor {
		return Pass
	}
	return RefuseStale
}

// Admit judges a client's append at epoch. Held with start true: a
// confirmation round of epoch begins; the driver runs a ReadIndex in
// l.Term and reports it to Indexed.
func (g *StartGate[T]) Admit(op T, epoch uint64, l Leader) (v Verdict, start bool) {
	if epoch <= 1 || !l.IsLeader || l.HighestEpoch >= epoch {
		return Pass, false
	}
	if g.epoch == epoch && g.term == l.Term {
		return Pass, false
	}
	if len(g.held) >= StartGateHeldMax {
		return RefuseFull, false
	}
	g.held = append(g.held, op)
	g.floor = max(g.floor, epoch)
	if g.running {
		return Held, false
	}
	g.running, g.runEpoch, g.tries = true, epoch, 0
	return Held, true
}

// Indexed is a round's ReadIndex answer (end, err), read in term, with l
// the replica now. nil: the node compares end with the recorded start
// (CheckStart), then the driver calls Done; an error: call Done with it.
func (g *StartGate[T]) Indexed(term uint64, err error, l Leader) error {
	if err == nil && (l.Pending > 0 || l.Term != term) {
		err = ErrStartInFlight
	}
	return err
}

// Done ends a round of the confirmation of epoch in term at end, which the
// node answered with err, l the replica now. retry: run another round
// (a ReadIndex in term); else release are the held appends, to propose
// (through Admit again) if rerr is nil, else to refuse with rerr
// (retriable).
func (g *StartGate[T]) Done(epoch, term, end uint64, err error, l Leader) (retry bool, release []T, rerr error) {
	if err == nil && (l.Term != term || l.Committed > end || l.Pending > 0) {
		err = ErrStartInFlight
	}
	if errors.Is(err, ErrStartInFlight) && l.Term == term && g.tries < StartGateTriesMax {
		g.tries++
		return true, nil, nil
	}
	g.running = false
	if err == nil {
		g.epoch, g.term = epoch, term
	}
	release, g.held = g.held, nil
	return false, release, err
}

// Stop returns the held appends, to refuse: the range stops.
func (g *StartGate[T]) Stop() []T {
	held := g.held
	g.held = nil
	return held
}

// StartCheck is the node's verdict on a range leader's start confirmation.
type StartCheck int

const (
	// StartOK: the recorded start is the log's end.
	StartOK StartCheck = iota
	// StartNotHome: the lease is at another epoch (retriable elsewhere).
	StartNotHome
	// StartBelow: the log ends below the recorded start: it appends once
	// it reaches it (retriable).
	StartBelow
	// StartKeep: retention deleted the log past the recorded start, and
	// no retained frame shows that what it deleted was older: the record
	// is kept, as before raises.
	StartKeep
	// StartRaise: raise the recorded start to the log's end (RaiseStart).
	StartRaise
	// StartFork: the log holds a divergent tail from the divergence point
	// (DivergeAt) on, at or above the recorded start: raise the start to
	// that point (if below it), fork the log there to the epoch (its tail
	// to the orphan log), then confirm again.
	StartFork
	// StartDivergedBelow: the log diverges from the range's below the
	// recorded start (retriable; no takeover records a start past its
	// region's consistent prefix, so it is not expected).
	StartDivergedBelow
)

// DivergeAt is where a range leader's log, whose highest epoch is
// logEpoch, leaves the range's timeline as a new home at epoch sees it:
// the lowest recorded start of an epoch between the two (logEpoch <
// e < epoch), from the range's epoch history (starts: epoch -> start).
// Every offset at or past start(e) holds a record of epoch e or later, and
// the log holds none later than logEpoch, so its frames from there on are
// a divergent tail (rangecore.Timeline's fence, for the home). NoFence
// when no such epoch is recorded.
//
// The case: a region that was home (logEpoch), lost the range with an
// unreplicated tail, and takes it back (epoch) while its agent's copy
// lagged below the intervening epoch's start, so the copy passed as a
// candidate; its group's leader still holds that tail. Raising the start
// over it would keep the old tail below the new epoch's first frame and
// drop what the intervening epoch made of those offsets.
func DivergeAt(logEpoch, epoch uint64, starts map[uint64]uint64) uint64 {
	at := uint64(NoFence)
	for e, s := range starts {
		if e > logEpoch && e < epoch {
			at = min(at, s)
		}
	}
	return at
}

// CheckStart compares a range leader's log, ending at end (committed, with
// nothing in flight), its retained part starting at logStart with a frame
// of firstEpoch (0: none, or unreadable), with the lease store's record of
// the range: its lease at leaseEpoch starting at leaseStart. epoch is the
// epoch the leader confirms; divergeAt is where its log leaves the range's
// timeline (DivergeAt; NoFence: nowhere known), checked first: a log
// that diverges is forked, never confirmed over its divergent tail.
func CheckStart(leaseEpoch, leaseStart, epoch, end, logStart, firstEpoch, divergeAt uint64) StartCheck {
	switch {
	case leaseEpoch != epoch:
		return StartNotHome
	case divergeAt < end && divergeAt >= leaseStart:
		return StartFork
	case divergeAt < end:
		return StartDivergedBelow
	case end == leaseStart:
		return StartOK
	case end < leaseStart:
		return StartBelow
	case logStart > leaseStart && (firstEpoch == 0 || firstEpoch >= epoch):
		// Epochs never go back along a log: a retained frame older than
		// the epoch shows that what retention deleted was older too.
		return StartKeep
	}
	return StartRaise
}
