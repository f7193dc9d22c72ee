package replicator

import (
	"fmt"
	"sort"
	"sync"

	"github.com/geolog/geolog/batch"
)

// Source is the home range's committed log as the replicator sees it, on
// the range leader. The node adapts its segment store and replica to it:
// ReadFrames is segment.Store.ReadFrames, CommittedEnd and TailChanged are
// replica.Replica's Committed and Changed. All methods are safe for
// concurrent use.
type Source interface {
	// ReadFrames returns whole, CRC-verified data frames in offset order,
	// concatenated: first the frame that holds offset from, then the frames
	// after it, stopping before any frame with BaseOffset >= endOffset, at
	// the end of the log, or before the frame that would take the result
	// past maxBytes. The first frame is returned even if it alone exceeds
	// maxBytes. Control frames are never returned. from at the end of the
	// log returns nil, nil; from below the log's start wraps ErrOutOfRange
	// (segment.ErrOutOfRange in production). The caller owns the result.
	ReadFrames(from uint64, maxBytes int, endOffset uint64) ([]byte, error)
	// CommittedEnd is the committed tail: every offset below it is committed
	// in the home region and may be shipped.
	CommittedEnd() uint64
	// TailChanged returns a channel that is closed when CommittedEnd next
	// changes (it may also close for other reasons: a spurious wake-up is
	// harmless). Take the channel before reading CommittedEnd, so that no
	// change between the two is missed.
	TailChanged() <-chan struct{}
}

// SourceStarter is implemented by Sources that know their log's start
// (segment.Store.StartOffset in production): a Task whose read falls below
// it ships from there, flagged from_source_start, and the mirror skips to
// it (Skipper).
type SourceStarter interface {
	// StartOffset is the lowest offset ReadFrames can return.
	StartOffset() uint64
}

// MemSource is the in-memory twin of a home range: a slice of data frames
// with dense offsets and a committed end that the test moves. It counts
// what is read from it so that tests can check that a slow mirror slows the
// reads.
type MemSource struct {
	mu        sync.Mutex
	start     uint64   // base offset of frames[0]
	frames    [][]byte // data frames in offset order
	next      uint64   // end of the last frame
	committed uint64
	changed   chan struct{}

	reads        int
	bytesRead    int64
	readEndMax   uint64 // highest end offset ever returned by a read
	failNextRead error
}

var _ Source = (*MemSource)(nil)

// NewMemSource returns an empty source whose first offset will be start.
func NewMemSource(start uint64) *MemSource {
	return &MemSource{start: start, next: start, committed: start, changed: make(chan struct{})}
}

// Append adds one data frame after the last without committing it. The
// frame must be valid, hold records, and start at the source's next offset.
func (s *MemSource) Append(frame []byte) error {
	h, err := batch.Validate(frame)
	if err != nil {
		return err
	}
	size, _ := batch.FrameSize(frame)
	if !shipped(h) || size != len(frame) {
		return fmt.Errorf("replicator: MemSource takes whole data frames with records, compacted frames and markers")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !follows(h, s.next) {
		return fmt.Errorf("%w: frame at %d, source next is %d", ErrOutOfRange, h.BaseOffset, s.next)
	}
	s.frames = append(s.frames, frame)
	s.next = h.NextOffset()
	return nil
}

// Commit moves the committed end to end, clamped to the appended frames; it
// never moves back.
func (s *MemSource) Commit(end uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	end = min(end, s.next)
	if end <= s.committed {
		return
	}
	s.committed = end
	close(s.changed)
	s.changed = make(chan struct{})
}

// AppendCommitted appends frame and commits it.
func (s *MemSource) AppendCommitted(frame []byte) error {
	if err := s.Append(frame); err != nil {
		return err
	}
	s.mu.Lock()
	end := s.next
	s.mu.Unlock()
	s.Commit(end)
	return nil
}

// ReadFrames implements Source. Only committed frames are returned,
// whatever endOffset says.
func (s *MemSource) ReadFrames(from uint64, maxBytes int, endOffset uint64) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.failNextRead; err != nil {
		s.failNextRead = nil
		return nil, err
	}
	if from < s.start || from > s.next {
		return nil, fmt.Errorf("%w: %d not in [%d, %d]", ErrOutOfRange, from, s.start, s.next)
	}
	end := min(endOffset, s.committed)
	// The frame holding from: the last with BaseOffset <= from.
	i := sort.Search(len(s.frames), func(i int) bool { return frameBase(s.frames[i]) > from }) - 1
	i = max(i, 0)
	var out []byte
	for ; i < len(s.frames); i++ {
		f := s.frames[i]
		if frameBase(f) >= end || (len(out) > 0 && len(out)+len(f) > maxBytes) {
			break
		}
		if frameNext(f) <= from {
			continue // only when from == s.next: nothing holds it
		}
		out = append(out, f...)
		s.readEndMax = max(s.readEndMax, frameNext(f))
	}
	s.reads++
	s.bytesRead += int64(len(out))
	return out, nil
}

// CommittedEnd implements Source.
func (s *MemSource) CommittedEnd() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.committed
}

// TailChanged implements Source.
func (s *MemSource) TailChanged() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

var _ SourceStarter = (*MemSource)(nil)

// StartOffset implements SourceStarter.
func (s *MemSource) StartOffset() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.start
}

// Retain deletes the frames that end at or below start, as the home's
// retention deletes segments: reads below start then fail with
// ErrOutOfRange. start must be a frame boundary at or below the end of
// the appended frames.
func (s *MemSource) Retain(start uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	frames, err := retainFrames(s.frames, start, s.start, s.next)
	if err != nil {
		return err
	}
	s.frames, s.start = frames, start
	return nil
}

// retainFrames is frames (which hold [lo, hi)) from the frame at start
// on, copied; ErrOutOfRange if start is no frame boundary in [lo, hi].
func retainFrames(frames [][]byte, start, lo, hi uint64) ([][]byte, error) {
	i := sort.Search(len(frames), func(i int) bool { return frameBase(frames[i]) >= start })
	if start > hi || start < lo || (i < len(frames) && frameBase(frames[i]) != start) {
		return nil, fmt.Errorf("%w: %d is not a frame boundary in [%d, %d]", ErrOutOfRange, start, lo, hi)
	}
	return append([][]byte(nil), frames[i:]...), nil
}

// Frames returns the source's frames (shared, not to be modified).
func (s *MemSource) Frames() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]byte(nil), s.frames...)
}

// FailNextRead makes the next ReadFrames return err.
func (s *MemSource) FailNextRead(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failNextRead = err
}

// MemSourceStats counts the reads of a MemSource.
type MemSourceStats struct {
	Reads     int
	BytesRead int64
	// ReadEndMax is the highest end offset any read returned: how far the
	// replicator has read ahead.
	ReadEndMax uint64
}

// Stats returns the read counters so far.
func (s *MemSource) Stats() MemSourceStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return MemSourceStats{Reads: s.reads, BytesRead: s.bytesRead, ReadEndMax: s.readEndMax}
}
