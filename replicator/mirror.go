package replicator

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
)

// MirrorStore is the destination node's side of the Server: it finds the
// ranges this node mirrors. The node implements it over its replicas; the
// in-memory twin is MemMirrorStore.
type MirrorStore interface {
	// Open returns the mirror of one range if this node leads the range's
	// mirror group in its region. Errors are *apierr.Error values the
	// source acts on: NOT_LEADER with LeaderHint = the address (host:port)
	// of the node that leads it, when known; STREAM_NOT_FOUND or
	// RANGE_NOT_FOUND; NOT_HOME is wrong here (the range is homed in this
	// region: a mirror cannot be written), use STALE_EPOCH or UNAVAILABLE.
	Open(ctx context.Context, stream string, rng uint32) (MirrorRange, error)
}

// MirrorRange is one range's mirror: the range's Raft group in a region
// that is not its home. The Server serializes its calls for one range (one
// request at a time, whatever the number of streams), so an implementation
// needs no lock of its own against the Server; it must be safe against the
// node's own goroutines.
type MirrorRange interface {
	// AppliedEnd is the applied end: every offset below it is applied,
	// i.e. committed by the mirror's Raft group.
	AppliedEnd() uint64
	// HighestEpoch is the highest homing epoch this mirror has seen: in the
	// frames it holds, in heartbeats it recorded, and in what the node knows
	// from the lease store. Requests from a lower epoch are refused.
	HighestEpoch() uint64
	// RecordHeartbeat records a heartbeat of the home (hb.Epoch >=
	// HighestEpoch, checked by the Server): it raises HighestEpoch to
	// hb.Epoch. For fencing to survive a restart of the node the raised
	// epoch must be durable before RecordHeartbeat returns, or the node
	// must learn it again from the lease store before serving. The
	// heartbeat's tail and time feed the node's own views (min_offset
	// waits, metrics) as it likes.
	RecordHeartbeat(hb Heartbeat) error
	// ReadFrames reads the mirror's applied frames, with the contract of
	// Source.ReadFrames (endOffset bounds by BaseOffset, the first frame is
	// returned even if it alone exceeds maxBytes). The Server reads what a
	// batch overlaps to compare it.
	ReadFrames(from uint64, maxBytes int, endOffset uint64) ([]byte, error)
	// Apply appends frames, one or more whole data frames that the Server
	// validated (CRC, structure, dense offsets, epochs), starting at the
	// AppliedEnd it read under the same serialization, and returns the new
	// applied end once they are applied. Each frame is applied verbatim,
	// as one entry of the mirror's Raft group (which re-stamps only the
	// Raft term and index in the frame header). Apply owns frames after the
	// call. It must refuse frames that do not start at its applied end
	// (defence in depth: wrap ErrGap), and may return NOT_LEADER (with a
	// hint) when the node lost the group's leadership, or any other
	// *apierr.Error; the Server ends the stream with it.
	Apply(ctx context.Context, frames []byte) (appliedEnd uint64, err error)
}

// HomeChecker is implemented by mirrors whose node knows the range's home
// (its homing view: the lease store's current home and epoch). The Server
// asks it before it records or applies anything of a stream: at the open,
// and again with every request (the view moves). CheckHome returns nil if
// sourceRegion is the range's home at epoch; otherwise ErrNotHome (another
// region at the current epoch, or an epoch above the current one: retried
// later, changing nothing) or ErrStaleEpoch (an epoch below the current
// one: the source is fenced), as *Refusal or *apierr.Error values.
type HomeChecker interface {
	CheckHome(sourceRegion string, epoch uint64) error
}

// checkHome asks mr's HomeChecker, if it has one.
func checkHome(mr MirrorRange, open openRequest) error {
	if hc, ok := mr.(HomeChecker); ok {
		return hc.CheckHome(open.sourceRegion, open.epoch)
	}
	return nil
}

// LogEpocher is implemented by mirrors that know the epoch their log ends
// in apart from its frames: the highest epoch of any data frame the log
// held and of any fork it applied (replica.Replica.HighestEpoch), not the
// epochs of heartbeats. The Server answers an open with it when the frame
// at the applied end is gone (retention deleted the whole log), so that a
// home of a newer epoch still resends from its epoch change and the mirror
// forks a divergent tail instead of taking new frames on top of it. Zero
// means unknown.
type LogEpocher interface {
	LogEpoch() uint64
}

// Forker is implemented by mirrors that can cut a divergent tail
// (DESIGN.md "Divergent tails"). When a batch from the current home (its
// epoch fenced as usual) overlaps the mirror's applied frames and, at
// offset at, carries a newer homing epoch than the frame the mirror holds
// there, the mirror's log forked off the home's at at: the Server calls
// Fork, then applies the batch from at on.
type Forker interface {
	// Fork moves the mirror's frames at and past offset at into the
	// range's orphan log (original offsets, epochs and records), truncates
	// the mirror to at on every replica of its group, durably, and raises
	// its highest epoch to epoch. It returns the applied end after the fork
	// (at).
	Fork(ctx context.Context, at, epoch uint64) (uint64, error)
}

// Skipper is implemented by mirrors that can skip what their home's
// retention deleted before they received it: when a batch flagged
// from_source_start starts at the home's log start, past the mirror's
// applied end, the Server calls SkipTo with that start, then applies the
// batch.
type Skipper interface {
	// SkipTo moves the mirror's log start and end to offset at, on every
	// replica of its group, durably: its frames are deleted (they are a
	// prefix of the home's log that the home deleted too) and the applied
	// end becomes at. It must refuse an at not above the applied end. (A
	// mirror whose log ends in an older epoch than the batch is forked at
	// its start first, when it is a Forker, LogEpocher and SourceStarter:
	// Server.orphanBeforeSkip.)
	SkipTo(ctx context.Context, at uint64) error
}

// MemMirrorStore is the in-memory twin of a destination node: it mirrors
// any range it is asked for (creating it on first Open), unless told it is
// not the leader.
type MemMirrorStore struct {
	mu         sync.Mutex
	ranges     map[rangeKey]*MemMirror
	leaderHint string // non-empty: not the leader, this address is
	notLeader  bool
	// homeRegion and homeEpoch, when homeRegion is set, are every range's
	// home as the node knows it (SetHome): the mirrors check sources
	// against it (HomeChecker).
	homeRegion string
	homeEpoch  uint64
}

// SetHome makes the node know region as every range's home at epoch, as a
// node's homing view would: its mirrors then take frames from that home at
// that epoch only (HomeChecker). Region "" turns the check off (the
// default).
func (s *MemMirrorStore) SetHome(region string, epoch uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.homeRegion, s.homeEpoch = region, epoch
}

var _ HomeChecker = (*MemMirror)(nil)

// CheckHome implements HomeChecker against the store's SetHome.
func (m *MemMirror) CheckHome(region string, epoch uint64) error {
	s := m.store
	s.mu.Lock()
	home, current := s.homeRegion, s.homeEpoch
	s.mu.Unlock()
	switch {
	case home == "":
		return nil
	case epoch > current:
		return newRefusal(ErrNotHome, "epoch %d from %s is above the current %d", epoch, region, current)
	case epoch < current:
		return newRefusal(ErrStaleEpoch, "epoch %d from %s, the current is %d", epoch, region, current)
	case region != home:
		return newRefusal(ErrNotHome, "region %s is not the home (%s at epoch %d)", region, home, current)
	}
	return nil
}

var _ MirrorStore = (*MemMirrorStore)(nil)

type rangeKey struct {
	stream string
	rng    uint32
}

// NewMemMirrorStore returns an empty store that leads every range.
func NewMemMirrorStore() *MemMirrorStore {
	return &MemMirrorStore{ranges: make(map[rangeKey]*MemMirror)}
}

// SetNotLeader makes this node a follower of every range: Open and Apply
// answer NOT_LEADER with hint (none when empty). SetLeader undoes it.
func (s *MemMirrorStore) SetNotLeader(hint string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notLeader, s.leaderHint = true, hint
}

// SetLeader makes this node lead every range again.
func (s *MemMirrorStore) SetLeader() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notLeader, s.leaderHint = false, ""
}

func (s *MemMirrorStore) notLeaderErr(stream string, rng uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.notLeader {
		return nil
	}
	e := apierr.New(apierr.NotLeader, "stream %s range %d: not the mirror leader", stream, rng)
	e.LeaderHint = s.leaderHint
	return e
}

// Open implements MirrorStore.
func (s *MemMirrorStore) Open(ctx context.Context, stream string, rng uint32) (MirrorRange, error) {
	if err := s.notLeaderErr(stream, rng); err != nil {
		return nil, err
	}
	return s.Range(stream, rng), nil
}

// Range returns the mirror of (stream, rng), creating it empty.
func (s *MemMirrorStore) Range(stream string, rng uint32) *MemMirror {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := rangeKey{stream, rng}
	m := s.ranges[k]
	if m == nil {
		m = &MemMirror{store: s, stream: stream, rng: rng}
		s.ranges[k] = m
	}
	return m
}

// MemMirror is the in-memory twin of one range's mirror. It keeps the
// frames in memory and enforces the MirrorRange contract itself: frames
// must be valid data frames extending its prefix exactly. It stamps its own
// Raft term and index on every frame it applies, as a mirror's Raft group
// does, so that tests compare data fields, not bytes.
type MemMirror struct {
	store  *MemMirrorStore
	stream string
	rng    uint32

	mu           sync.Mutex
	frames       [][]byte
	start        uint64 // the log's start: frames below it are gone (Retain)
	end          uint64
	logEpoch     uint64 // the highest epoch of a frame applied or a fork (LogEpoch)
	highestEpoch uint64
	lastHB       Heartbeat
	heartbeats   int
	applies      int
	hold         chan struct{} // non-nil: Apply waits until it is closed
	held         int           // Apply calls waiting on hold now
	applyErr     error
	orphans      [][]byte // frames cut by Fork, in order
	skips        int      // SkipTo calls that moved the log
}

var _ Forker = (*MemMirror)(nil)

// Fork implements Forker: the frames at and past at move to Orphans. A
// fork below the log's start (Retain) orphans every frame and the log
// continues, empty, at at (as replica.ProposeFork resets a log).
func (m *MemMirror) Fork(ctx context.Context, at, epoch uint64) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.highestEpoch = max(m.highestEpoch, epoch)
	m.logEpoch = max(m.logEpoch, epoch)
	if at < m.start {
		m.orphans = append(m.orphans, m.frames...)
		m.frames, m.start, m.end = nil, at, at
		return at, nil
	}
	i := sort.Search(len(m.frames), func(i int) bool { return frameBase(m.frames[i]) >= at })
	if at > m.end || (i < len(m.frames) && frameBase(m.frames[i]) != at) {
		return m.end, fmt.Errorf("%w: fork at %d is not a frame boundary at or below %d", ErrOutOfRange, at, m.end)
	}
	m.orphans = append(m.orphans, m.frames[i:]...)
	m.frames = m.frames[:i]
	m.end = at
	return at, nil
}

var _ SourceStarter = (*MemMirror)(nil)

// StartOffset is the log's start (Retain, Fork, SkipTo move it).
func (m *MemMirror) StartOffset() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.start
}

var _ Skipper = (*MemMirror)(nil)

// SkipTo implements Skipper: the frames are dropped, and the log starts
// and ends at at.
func (m *MemMirror) SkipTo(ctx context.Context, at uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if at <= m.end {
		return skipRefusal("skip to %d, the mirror's end is %d", at, m.end)
	}
	m.frames, m.start, m.end = nil, at, at
	m.skips++
	return nil
}

// Skips counts the SkipTo calls that moved the log.
func (m *MemMirror) Skips() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.skips
}

var _ LogEpocher = (*MemMirror)(nil)

// LogEpoch implements LogEpocher: the highest epoch of a frame the mirror
// applied or of a fork, kept when Retain deletes the frames.
func (m *MemMirror) LogEpoch() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.logEpoch
}

// Retain deletes the frames that end at or below start, as retention
// deletes a mirror's oldest segments: ReadFrames below start fails after
// it. start must be at or below the applied end, and a frame boundary.
func (m *MemMirror) Retain(start uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	frames, err := retainFrames(m.frames, start, m.start, m.end) // source.go
	if err != nil {
		return err
	}
	m.frames, m.start = frames, start
	return nil
}

// Orphans returns the frames Fork cut, in order.
func (m *MemMirror) Orphans() [][]byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([][]byte(nil), m.orphans...)
}

var _ MirrorRange = (*MemMirror)(nil)

// memTerm is the Raft term a MemMirror stamps on the frames it applies.
const memTerm = 7

// AppliedEnd implements MirrorRange.
func (m *MemMirror) AppliedEnd() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.end
}

// HighestEpoch implements MirrorRange.
func (m *MemMirror) HighestEpoch() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.highestEpoch
}

// SetHighestEpoch raises the highest epoch seen, as a node that learned a
// newer homing from the lease store would.
func (m *MemMirror) SetHighestEpoch(e uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.highestEpoch = max(m.highestEpoch, e)
}

// RecordHeartbeat implements MirrorRange.
func (m *MemMirror) RecordHeartbeat(hb Heartbeat) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if hb.Epoch < m.highestEpoch {
		return newRefusal(ErrStaleEpoch, "heartbeat of epoch %d, seen %d", hb.Epoch, m.highestEpoch)
	}
	m.highestEpoch = hb.Epoch
	m.lastHB = hb
	m.heartbeats++
	return nil
}

// ReadFrames implements MirrorRange.
func (m *MemMirror) ReadFrames(from uint64, maxBytes int, endOffset uint64) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if from > m.end || from < m.start {
		return nil, fmt.Errorf("%w: %d not in the log [%d, %d]", ErrOutOfRange, from, m.start, m.end)
	}
	i := max(sort.Search(len(m.frames), func(i int) bool { return frameBase(m.frames[i]) > from })-1, 0)
	var out []byte
	for ; i < len(m.frames); i++ {
		f := m.frames[i]
		if frameBase(f) >= endOffset || (len(out) > 0 && len(out)+len(f) > maxBytes) {
			break
		}
		if frameNext(f) <= from {
			continue
		}
		out = append(out, f...)
	}
	return out, nil
}

// Apply implements MirrorRange.
func (m *MemMirror) Apply(ctx context.Context, frames []byte) (uint64, error) {
	if err := m.store.notLeaderErr(m.stream, m.rng); err != nil {
		return 0, err
	}
	m.mu.Lock()
	hold := m.hold
	m.mu.Unlock()
	if hold != nil {
		m.mu.Lock()
		m.held++
		m.mu.Unlock()
		var err error
		select {
		case <-hold:
		case <-ctx.Done():
			err = apierr.Wrap(apierr.Unavailable, ctx.Err(), "apply")
		}
		m.mu.Lock()
		m.held--
		m.mu.Unlock()
		if err != nil {
			return 0, err
		}
	}
	fs, err := SplitFrames(frames)
	if err != nil {
		return 0, newRefusal(ErrMalformed, "apply: %v", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.applyErr != nil {
		return 0, m.applyErr
	}
	next := m.end
	for _, f := range fs {
		h, _ := batch.DecodeHeader(f)
		switch {
		case !shipped(h):
			return 0, newRefusal(ErrMalformed, "apply: control or empty frame")
		case !follows(h, next):
			return 0, gapRefusal(h.BaseOffset, next)
		case h.Epoch > m.highestEpoch:
			return 0, newRefusal(ErrMalformed, "apply: frame epoch %d above the highest seen %d", h.Epoch, m.highestEpoch)
		}
		next = h.NextOffset()
	}
	for _, f := range fs {
		own := append([]byte(nil), f...)
		batch.PatchRaft(own, memTerm, uint64(len(m.frames)+1))
		m.frames = append(m.frames, own)
		m.logEpoch = max(m.logEpoch, frameEpoch(f))
	}
	m.end = next
	m.applies++
	return m.end, nil
}

// Frames returns the applied frames (shared, not to be modified).
func (m *MemMirror) Frames() [][]byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([][]byte(nil), m.frames...)
}

// LastHeartbeat returns the latest heartbeat recorded and how many were.
func (m *MemMirror) LastHeartbeat() (Heartbeat, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastHB, m.heartbeats
}

// Applies counts the successful Apply calls.
func (m *MemMirror) Applies() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.applies
}

// Held counts the Apply calls blocked by Hold now.
func (m *MemMirror) Held() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.held
}

// Hold makes Apply block (until Release or its context ends), as a mirror
// whose Raft group cannot commit would.
func (m *MemMirror) Hold() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.hold == nil {
		m.hold = make(chan struct{})
	}
}

// Release lets held and later Apply calls through.
func (m *MemMirror) Release() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.hold != nil {
		close(m.hold)
		m.hold = nil
	}
}

// FailApply makes every Apply return err (nil: succeed again).
func (m *MemMirror) FailApply(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.applyErr = err
}

// Seed makes the mirror hold frames as if applied (a divergent tail for a
// test, say), without the checks of Apply but each frame's validity.
func (m *MemMirror) Seed(frames ...[]byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, f := range frames {
		h, err := batch.DecodeHeader(f)
		if err != nil {
			return err
		}
		if !follows(h, m.end) {
			return gapRefusal(h.BaseOffset, m.end)
		}
		m.frames = append(m.frames, append([]byte(nil), f...))
		m.end = h.NextOffset()
		m.highestEpoch = max(m.highestEpoch, h.Epoch)
		m.logEpoch = max(m.logEpoch, h.Epoch)
	}
	return nil
}

// TruncateTo drops the frames at and past end, which must be a frame
// boundary at or below the applied end, as homing does when it cuts a
// divergent tail off a mirror.
func (m *MemMirror) TruncateTo(end uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	i := sort.Search(len(m.frames), func(i int) bool { return frameBase(m.frames[i]) >= end })
	if end > m.end || (i < len(m.frames) && frameBase(m.frames[i]) != end) || (i == len(m.frames) && end != m.end) {
		return fmt.Errorf("%w: %d is not a frame boundary at or below %d", ErrOutOfRange, end, m.end)
	}
	m.frames = m.frames[:i]
	m.end = end
	return nil
}
