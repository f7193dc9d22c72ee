package rangecore

import "math"

// Timeline fences (DESIGN.md invariant 8 and "Divergent tails"). After an
// unplanned failover a copy of a range may hold, from some offset on,
// records of an older epoch that the range's log replaced: the returning
// old home's unreplicated tail, or a mirror that was ahead of the region
// that took over. Until the copy forks (the new home's first batch moves
// that tail to the orphan log), local reads and subscriptions must not
// serve it once the node knows of the newer epoch.
//
// Every offset of the range's log at or past the start offset of epoch e
// holds a record of epoch e or later. This copy's records are of epochs up
// to its log's highest (the replica's HighestEpoch, which a fork raises to
// the fork's epoch). So its records at or past start(e) for any known
// epoch e newer than its log's are a divergent tail: the fence is the
// lowest such start, and local reads stop below it.
//
// What the node knows, and the fence it gives:
//
//   - The lease store's home record (Role): epoch E starts at S. If E is
//     the log's epoch + 1, the fence is S (when the copy reaches S).
//   - A gap of more than one epoch (two moves while this copy was away):
//     the epochs between are unknown; the node reads the range's epoch
//     history from the lease store (WantHistory), and fences everything
//     (offset 0) until it has it.
//   - No home known at all (homing on, right after a start, or a home that
//     just learned its region lost the range and has not read the new
//     home yet): the copy may hold anything; fence everything and ask the
//     store at once (WantHome).
//   - An epoch heard only from a replicator's heartbeat, beyond the
//     directory's: its start is unknown. The node asks the store at once
//     (WantHome); meanwhile it does not fence (a copy ahead of the new home
//     forks as soon as that home's first batch arrives, which follows the
//     heartbeat by a round trip).

// NoFence is the fence offset when nothing is fenced.
const NoFence = math.MaxUint64

// Fence is a fence in force: local reads are served below Offset.
type Fence struct {
	Offset uint64
	// Epoch is the newer epoch whose start the fence is; 0 for a
	// provisional fence (the start is not known yet).
	Epoch uint64
	// LogEpoch is the copy's highest epoch when the fence was set.
	LogEpoch uint64
}

// Known reports whether the fence is at a known epoch's start (a reader
// past it read a divergent tail), not a provisional one.
func (f *Fence) Known() bool { return f != nil && f.Epoch != 0 }

// Want is what Timeline lacks to place the fence: what the node should
// read from the lease store.
type Want int

const (
	WantNothing Want = iota
	WantHome         // the range's current home record
	WantHistory      // the range's epoch history
)

// Role is the range's home as the node's view of the lease store tells it.
type Role struct {
	// Home: homed in this node's region.
	Home bool
	// Region is the home region; "" when unknown (homing on, no record
	// found yet).
	Region string
	// Epoch is the home's homing epoch (0 unknown), and Start the offset
	// it starts at (the home record's).
	Epoch, Start uint64
}

// Timeline is a range copy's knowledge of its epochs' starts, and the
// fence it gives. Not safe for concurrent use.
type Timeline struct {
	// starts maps homing epochs to their start offsets, as the lease store
	// told them (directory records, history).
	starts map[uint64]uint64
	// historyWanted: an epoch history read is needed.
	historyWanted bool
}

// LearnStart records that epoch starts at start. A recorded start only
// moves up (a new home raises it to where its log really left the old
// epoch: StartGate), so the highest one heard is the newest: a fence moves
// up with it, and a stale read (a history read before the raise) does not
// move it back.
func (t *Timeline) LearnStart(epoch, start uint64) {
	if t.starts == nil {
		t.starts = map[uint64]uint64{}
	}
	if s, ok := t.starts[epoch]; !ok || start > s {
		t.starts[epoch] = start
	}
}

// LearnHistory records the starts an epoch history read returned.
func (t *Timeline) LearnHistory(starts map[uint64]uint64) {
	for e, s := range starts {
		t.LearnStart(e, s)
	}
	t.historyWanted = false
}

// Start is the known start of epoch.
func (t *Timeline) Start(epoch uint64) (uint64, bool) {
	s, ok := t.starts[epoch]
	return s, ok
}

// HistoryWanted reports whether the last Fence needed the epoch history.
func (t *Timeline) HistoryWanted() bool { return t.historyWanted }

// Fence places the fence (nil: none) for role and the log's highest epoch;
// heard is the highest epoch heard from a replicator's heartbeat (0:
// none). It returns what the node should read from the store.
func (t *Timeline) Fence(role Role, logEpoch, heard uint64) (*Fence, Want) {
	if role.Home {
		return t.homeFence(role, logEpoch)
	}
	if role.Region == "" {
		// Homing on, no home known: the copy may be anything.
		return &Fence{Offset: 0, LogEpoch: logEpoch}, WantHome
	}
	if role.Epoch != 0 {
		t.LearnStart(role.Epoch, role.Start)
	}
	want := WantNothing
	if heard > max(role.Epoch, logEpoch) {
		want = WantHome // a heartbeat's epoch: ask the store where it starts
	}
	newest := max(role.Epoch, logEpoch)
	for e := logEpoch + 1; e <= newest; e++ {
		if _, ok := t.starts[e]; !ok {
			// Epochs between the log's and the home's are unknown: fence
			// everything until the history is read.
			t.historyWanted = true
			return &Fence{Offset: 0, LogEpoch: logEpoch}, WantHistory
		}
	}
	var f *Fence
	for e, s := range t.starts {
		if e > logEpoch && e <= newest && (f == nil || s < f.Offset) {
			f = &Fence{Offset: s, Epoch: e, LogEpoch: logEpoch}
		}
	}
	return f, want
}

// homeFence is Fence for the home's own copy. The home's log is the
// range's, but for a tail it may hold from an earlier time as home: a
// region that lost the range with an unreplicated tail and takes it back
// after another epoch. Its frames past the start of an epoch between its
// log's and its own (DivergeAt) are that tail, which its start gate forks
// off before the epoch's first frame (StartFork); until then they are
// fenced. Epochs between whose starts are unknown fence everything until
// the history is read.
func (t *Timeline) homeFence(role Role, logEpoch uint64) (*Fence, Want) {
	if role.Epoch == 0 || logEpoch+1 >= role.Epoch {
		return nil, WantNothing
	}
	for e := logEpoch + 1; e < role.Epoch; e++ {
		if _, ok := t.starts[e]; !ok {
			t.historyWanted = true
			return &Fence{Offset: 0, LogEpoch: logEpoch}, WantHistory
		}
	}
	at := DivergeAt(logEpoch, role.Epoch, t.starts)
	var f *Fence
	for e, s := range t.starts {
		if e > logEpoch && e < role.Epoch && s == at && (f == nil || e < f.Epoch) {
			f = &Fence{Offset: s, Epoch: e, LogEpoch: logEpoch}
		}
	}
	return f, WantNothing
}
