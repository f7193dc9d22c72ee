package replica

import (
	"slices"
	"sync"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
)

// A mirrored frame keeps the epoch of the home that wrote it, so a mirror
// catching up takes frames of epochs older than ones it has seen: after a
// takeover the new home resends the old epoch's frames below its start,
// and a mirror whose uncommitted tail of newer frames a new Raft leader
// replaced takes the older frames again (sim seeds 311120, 322185). Such a
// frame is stale only where a newer epoch starts at or below its offset
// (every frame at or past an epoch's start is of that epoch or newer).
// Where an epoch starts is known here only as an upper bound: the lowest
// offset of a frame of it (or of a fork to it) this replica has seen, for
// the home of an epoch writes at or past its start only (docs/design.md
// "Where an epoch starts"). A source whose home epoch is below one the
// mirror has seen is fenced as a whole, before its frames come here
// (replicator.Server's heartbeat check).

// epochStartsMax bounds the steps an epochStarts keeps: the oldest go
// first, and they matter only to a frame below the newer steps' offsets.
const epochStartsMax = 64

// epochStarts is where a replica knows its range's homing epochs to start
// at the latest: for each epoch noted, the lowest offset of a frame of it.
// It keeps the steps that matter, epochs and offsets both increasing: a
// step at or past a newer epoch's is dropped. Safe from any goroutine.
type epochStarts struct {
	mu    sync.Mutex
	steps []epochStart
}

// epochStart says that epoch starts at from or below.
type epochStart struct{ epoch, from uint64 }

// note records a frame of epoch at offset at.
func (s *epochStarts) note(epoch, at uint64) {
	if epoch == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	i, _ := slices.BinarySearchFunc(s.steps, epoch, func(st epochStart, e uint64) int { return cmpUint64(st.epoch, e) })
	if i < len(s.steps) && s.steps[i].from <= at {
		return // an epoch as new or newer starts at or below at already
	}
	j := i // older epochs known to start at or past at tell nothing more
	for j > 0 && s.steps[j-1].from >= at {
		j--
	}
	k := i
	if k < len(s.steps) && s.steps[k].epoch == epoch {
		k++ // the same epoch, seen further on: replaced
	}
	s.steps = slices.Replace(s.steps, j, k, epochStart{epoch: epoch, from: at})
	if n := len(s.steps); n > epochStartsMax {
		s.steps = slices.Delete(s.steps, 0, n-epochStartsMax)
	}
}

// newer returns the lowest known start of an epoch above epoch, if one is
// at or below offset at.
func (s *epochStarts) newer(epoch, at uint64) (epochStart, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, found := slices.BinarySearchFunc(s.steps, epoch, func(st epochStart, e uint64) int { return cmpUint64(st.epoch, e) })
	if found {
		i++
	}
	// Offsets increase with epochs: the first newer step starts lowest.
	if i < len(s.steps) && s.steps[i].from <= at {
		return s.steps[i], true
	}
	return epochStart{}, false
}

// newerFork returns a fork to an epoch above epoch at or below offset at
// (a fork at at to epoch e: the home's frame at at is of epoch e), if one
// is held.
func (o *OrphanStore) newerFork(epoch, at uint64) (ForkRecord, bool) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	for _, f := range o.forks {
		if f.Epoch > epoch && f.At <= at {
			return f, true
		}
	}
	return ForkRecord{}, false
}

// staleMirrored checks a mirrored frame's epoch against where the newer
// epochs start: in the log (its frames, those a new leader replaced
// included, and what retention or a snapshot deleted), in the forks, and
// in this leader's proposals not yet in the log.
func (r *Replica) staleMirrored(h batch.Header) *apierr.Error {
	stale := func(newer, from uint64) *apierr.Error {
		return apierr.New(apierr.StaleEpoch, "stream %s range %d: a mirrored frame of homing epoch %d at offset %d, the log holds epoch %d from %d at the latest",
			r.cfg.Stream, r.cfg.Range, h.Epoch, h.BaseOffset, newer, from)
	}
	if st, ok := r.fork.starts.newer(h.Epoch, h.BaseOffset); ok {
		return stale(st.epoch, st.from)
	}
	if o := r.cfg.Orphans; o != nil {
		if f, ok := o.newerFork(h.Epoch, h.BaseOffset); ok {
			return stale(f.Epoch, f.At)
		}
	}
	// Proposals are in offset order, their epochs never going down.
	if n := len(r.proposals); n > 0 {
		if p := r.proposals[n-1].res; p.Epoch > h.Epoch && p.BaseOffset <= h.BaseOffset {
			return stale(p.Epoch, p.BaseOffset)
		}
	}
	return nil
}
