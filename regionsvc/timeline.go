package regionsvc

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/geolog/geolog/homing"
	"github.com/geolog/geolog/rangecore"
)

// Timeline fences (DESIGN.md invariant 8 and "Divergent tails"). After an
// unplanned failover a copy of a range may hold, from some offset on,
// records of an older epoch that the range's log replaced: the returning
// old home's unreplicated tail, or a mirror that was ahead of the region
// that took over. Until the copy forks (the new home's first batch moves
// that tail to the orphan log), local reads and subscriptions must not
// serve it once the node knows of the newer epoch: an offset is never
// served with two different records, except in the window before the
// node could know (docs/reads-never-go-backwards.md).
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
//   - The lease store's home record (the directory, role.epoch and
//     role.start): epoch E starts at S. If E is the log's epoch + 1, the
//     fence is S (when the copy reaches S).
//   - A gap of more than one epoch (two moves while this copy was away):
//     the epochs between are unknown; the node reads the range's epoch
//     history from the lease store, and fences everything (offset 0) until
//     it has it.
//   - No home known at all (homing on, right after a start, or a home that
//     just learned its region lost the range and has not read the new
//     home yet): the copy may hold anything; fence everything and ask the
//     store at once.
//   - An epoch heard only from a replicator's heartbeat, beyond the
//     directory's: its start is unknown. The node asks the store at once;
//     meanwhile it does not fence (a copy ahead of the new home forks as
//     soon as that home's first batch arrives, which follows the heartbeat
//     by a round trip). This window is documented as part of the pre-
//     knowledge window.
//
// The fence is published atomically and recomputed whenever one of its
// inputs changes: the role (homing.go), the log's epoch (ready, after a
// fork), a history read, a heartbeat.

// noFence is the fence offset when nothing is fenced.
const noFence = rangecore.NoFence

// timelineFence is a fence in force: local reads are served below offset.
type timelineFence struct {
	offset uint64
	// epoch is the newer epoch whose start the fence is; 0 for a
	// provisional fence (the start is not known yet).
	epoch uint64
	// logEpoch is the copy's highest epoch when the fence was set.
	logEpoch uint64
}

// known reports whether the fence is at a known epoch's start (a reader
// past it read a divergent tail), not a provisional one.
func (f *timelineFence) known() bool { return f != nil && f.epoch != 0 }

// timeline is a range driver's fence state.
type timeline struct {
	mu sync.Mutex
	// core knows the epochs' starts, as the lease store told them
	// (directory records, history), and places the fence (d.tl.mu).
	core  rangecore.Timeline
	fence atomic.Pointer[timelineFence]
	// logEpoch is the log's highest epoch at the last computation.
	logEpoch atomic.Uint64
	// wanted is what was last asked of the node, and when (d.tl.mu).
	wanted   int
	wantedAt time.Time
}

// epochWantRepeat is how often a range asks the node again for the same
// thing while it lacks it (a range without a home record, a store that
// does not answer): the first ask goes at once.
const epochWantRepeat = time.Second

// servableEnd is the end of what local reads may serve: the committed end,
// or the fence if lower.
func (d *rangeDriver) servableEnd() uint64 {
	c := d.committed.Load()
	if f := d.tl.fence.Load(); f != nil && f.offset < c {
		return f.offset
	}
	return c
}

// fenceNow returns the fence in force, nil if none.
func (d *rangeDriver) fenceNow() *timelineFence { return d.tl.fence.Load() }

// learnEpochStarts records epoch start offsets the lease store gave.
func (d *rangeDriver) learnEpochStarts(starts map[uint64]uint64, history bool) {
	d.tl.mu.Lock()
	if history {
		d.tl.core.LearnHistory(starts)
	} else {
		for e, s := range starts {
			d.tl.core.LearnStart(e, s)
		}
	}
	d.tl.mu.Unlock()
	d.updateFence()
}

// updateFence recomputes the fence from what the node knows (see the top
// of this file); it asks the node (cfg.wantEpochs) for what it lacks.
func (d *rangeDriver) updateFence() { d.updateFenceFor(nil) }

// updateFenceFor is updateFence; a role, if not nil, becomes the range's
// role at the same time (setRole).
func (d *rangeDriver) updateFenceFor(newRole *rangeRole) {
	if !d.cfg.fenced || d.rep == nil {
		if newRole != nil {
			d.roleP.Store(newRole)
		}
		return
	}
	d.tl.mu.Lock()
	role := d.role()
	if newRole != nil {
		role = *newRole
	}
	logEpoch := d.rep.HighestEpoch()
	d.tl.logEpoch.Store(logEpoch)
	f, want := d.computeFence(role, logEpoch)
	old := d.tl.fence.Swap(f)
	if newRole != nil {
		d.roleP.Store(newRole) // after the fence: see setRole
	}
	ask := want != wantNothing && (want != d.tl.wanted || time.Since(d.tl.wantedAt) >= epochWantRepeat)
	if ask {
		d.tl.wanted, d.tl.wantedAt = want, time.Now()
	} else if want == wantNothing {
		d.tl.wanted = wantNothing
	}
	d.tl.mu.Unlock()
	if ask && d.cfg.wantEpochs != nil {
		d.cfg.wantEpochs(d, want == wantHistory)
	}
	if (old == nil) != (f == nil) || (f != nil && *old != *f) {
		if f != nil {
			d.logger.Info("timeline fence: local reads stop below the offset", "fence_offset", f.offset, "epoch", f.epoch, "log_epoch", logEpoch)
		} else {
			d.logger.Info("timeline fence lifted", "log_epoch", logEpoch)
		}
		d.notify()
	}
}

// What computeFence lacks to place the fence.
const (
	wantNothing = int(rangecore.WantNothing)
	wantHome    = int(rangecore.WantHome)    // the range's current home record
	wantHistory = int(rangecore.WantHistory) // the range's epoch history
)

// computeFence places the fence (nil: none) for role and the log's epoch
// (rangecore.Timeline.Fence); d.tl.mu held.
func (d *rangeDriver) computeFence(role rangeRole, logEpoch uint64) (*timelineFence, int) {
	f, want := d.tl.core.Fence(rangecore.Role{Home: role.home, Region: role.region, Epoch: role.epoch, Start: role.start},
		logEpoch, d.highestEpoch.Load())
	if f == nil {
		return nil, int(want)
	}
	return &timelineFence{offset: f.Offset, epoch: f.Epoch, logEpoch: f.LogEpoch}, int(want)
}

// noteLogEpoch recomputes the fence if the log's epoch moved (a fork, or
// a newer epoch's first frame): called by the driver after Ready cycles.
func (d *rangeDriver) noteLogEpoch() {
	if !d.cfg.fenced || d.rep == nil {
		return
	}
	if d.rep.HighestEpoch() != d.tl.logEpoch.Load() || d.tl.fence.Load() != nil {
		d.updateFence()
	}
}

// epochWants are the ranges whose fences lack epoch starts, for the homing
// loop to ask the lease store about (Node.serveEpochWants).
type epochWants struct {
	mu      sync.Mutex
	home    bool                  // a directory read is wanted
	history map[*rangeDriver]bool // epoch histories wanted
	last    time.Time             // the last time they were served
	ch      chan struct{}         // capacity 1: wants were added
}

// epochWantsInterval is the least time between two rounds of lease-store
// reads for fences: a burst of heartbeats costs one directory read.
const epochWantsInterval = 50 * time.Millisecond

// historyReadsMax bounds the epoch histories read in one round.
const historyReadsMax = 64

// wantEpochs asks the homing loop for the range's current home record or,
// with history, its epoch history. It never blocks.
func (n *Node) wantEpochs(d *rangeDriver, history bool) {
	hs := n.homing
	if hs == nil {
		return
	}
	w := &hs.wants
	w.mu.Lock()
	if history {
		if w.history == nil {
			w.history = map[*rangeDriver]bool{}
		}
		w.history[d] = true
	} else {
		w.home = true
	}
	w.mu.Unlock()
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// serveEpochWants reads what fences asked for: one directory read (whose
// roles update the fences), and the epoch histories wanted (at most
// historyReadsMax; the rest wait for the next round). On the homing loop.
func (n *Node) serveEpochWants(ctx context.Context) {
	w := &n.homing.wants
	w.mu.Lock()
	if wait := epochWantsInterval - time.Since(w.last); wait > 0 && (w.home || len(w.history) > 0) {
		w.mu.Unlock()
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return
		}
		w.mu.Lock()
	}
	home, history := w.home, make([]*rangeDriver, 0, len(w.history))
	for d := range w.history {
		if len(history) == historyReadsMax {
			break
		}
		history = append(history, d)
		delete(w.history, d)
	}
	w.home, w.last = false, time.Now()
	w.mu.Unlock()
	if home {
		n.refreshDirectory(ctx)
	}
	for _, d := range history {
		cctx, cancel := context.WithTimeout(ctx, homeDirectoryInterval)
		recs, err := n.homing.store.History(cctx, homing.RangeKey{Stream: d.cfg.stream, Range: d.cfg.rangeID})
		cancel()
		if err != nil {
			// Again at the next directory tick (not at once: the store
			// may be down).
			n.logger.Debug("read epoch history", "stream", d.cfg.stream, "range", d.cfg.rangeID, "error", err)
			w.mu.Lock()
			w.history[d] = true
			w.mu.Unlock()
			continue
		}
		d.learnEpochStarts(homing.EpochStarts(recs), true)
	}
}
