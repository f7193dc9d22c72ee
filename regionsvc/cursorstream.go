package regionsvc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/cursors"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/segment"
	"github.com/hashicorp/go-hclog"
)

// The cursor stream (docs/consumers.md): cursors and consumer groups live
// in the internal stream "_cursors", a stream like any other (replicated
// by Raft in each region, mirrored to every region, homed through the
// lease store) whose name users cannot create or append to. It is created
// on first use (the first Consumer request any node takes), in every
// region the node knows, homes spread over them or all in
// Config.CursorHome, and propagated like any stream; the region's
// catalogue leader completes a propagation cut short. A name's range is
// keyspace.RangeForKey of the name.
//
// On every node, each range of the stream has a cursorRange: an applier
// goroutine that follows the range's committed log into a cursors.State
// (every replica's copy: local reads and fetch fencing use it), and a
// coordinator goroutine (cursorwriter.go) that serves the range's cursors
// and groups while this node leads the range in its home region.

// cursorStreamName is the internal stream of cursors and groups.
const cursorStreamName = "_cursors"

// cursorRangesDefault is the cursor stream's range count by default.
const cursorRangesDefault = 16

// cursorStreamSpec is the cursor stream's definition on this node: the
// same on every node configured alike.
func (n *Node) cursorStreamSpec() streamSpec {
	regions := []string{n.cfg.Region}
	for r := range n.cfg.Regions {
		regions = append(regions, r)
	}
	slices.Sort(regions)
	homes := make([]string, n.cfg.CursorRanges)
	for i := range homes {
		homes[i] = regions[i%len(regions)]
		if n.cfg.CursorHome != "" {
			homes[i] = n.cfg.CursorHome
		}
	}
	return streamSpec{Name: cursorStreamName, RangeCount: uint32(n.cfg.CursorRanges), Regions: regions, Homes: homes,
		Cleanup:                geologv1.CleanupPolicy_CLEANUP_POLICY_COMPACT,
		MinCompactionLagMillis: specMillis(n.cfg.CursorCompactionLag), DeleteRetentionMillis: specMillis(n.cfg.CursorDeleteRetention)}
}

// specMillis is a compaction setting of a streamSpec: 0 the default, -1
// none, else milliseconds (at least 1).
func specMillis(d time.Duration) int64 {
	switch {
	case d < 0:
		return -1
	case d == 0:
		return 0
	}
	return max(d.Milliseconds(), 1)
}

// isInternalStream reports whether a stream is the node's own (no user
// may append to it).
func isInternalStream(name string) bool { return name == cursorStreamName }

// cursorService is a node's side of cursors and groups.
type cursorService struct {
	n      *Node
	logger hclog.Logger

	mu     sync.Mutex
	ranges []*cursorRange // nil until the cursor stream is open here
	closed bool

	// kick asks run to create the stream now (a request needs it).
	kick chan struct{}
	// merged are the forks of cursor ranges merged back (run's only).
	merged map[mergeKey]bool
	stop   chan struct{}
	done   chan struct{}
}

func newCursorService(n *Node) *cursorService {
	return &cursorService{n: n, logger: n.cfg.Logger.Named("cursors"), kick: make(chan struct{}, 1),
		merged: map[mergeKey]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
}

// cursorEnsureInterval is how often a node checks that the cursor stream
// is open here (to attach its ranges), and how often the catalogue leader
// retries a propagation to other regions that failed.
const cursorEnsureInterval = 200 * time.Millisecond

// cursorPropagateInterval is how often a region's catalogue leader
// completes the cursor stream's propagation until it succeeded once.
const cursorPropagateInterval = 5 * time.Second

// run attaches the ranges once the cursor stream is open here, creates
// the stream when a request asks for it, and completes its propagation.
func (cs *cursorService) run() {
	defer close(cs.done)
	t := time.NewTicker(cursorEnsureInterval)
	defer t.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-cs.stop; cancel() }()
	attached, propagated := false, !cs.n.replicated() || len(cs.n.cfg.Regions) == 0
	var lastPropagate, lastMerge time.Time
	for {
		if !attached {
			attached = cs.attach()
		}
		if attached && !propagated && cs.n.leadsCatalogue() && time.Since(lastPropagate) >= cursorPropagateInterval {
			lastPropagate = time.Now()
			propagated = cs.propagate(ctx)
		}
		if attached && cs.n.replicated() && time.Since(lastMerge) >= cursorMergeInterval {
			lastMerge = time.Now()
			cs.mergeOrphans(ctx)
		}
		select {
		case <-t.C:
		case <-cs.kick:
			if !attached {
				cs.create(ctx)
			}
		case <-cs.stop:
			return
		}
	}
}

// create creates the cursor stream (in every region: it is propagated
// like any stream's creation).
func (cs *cursorService) create(ctx context.Context) {
	n := cs.n
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	spec := n.cursorStreamSpec()
	spec.CreatedUnixNanos = n.cfg.Now().UnixNano()
	var err error
	if n.replicated() {
		_, err = n.createStreamRegions(cctx, wantExactly(spec))
	} else {
		_, err = n.createStreamFromSpec(cctx, wantExactly(spec))
	}
	if err != nil && rpcerr.CodeOf(err) != apierr.StreamExists && ctx.Err() == nil {
		cs.logger.Warn("create the cursor stream", "error", err)
		return
	}
	cs.logger.Info("cursor stream created", "ranges", spec.RangeCount, "regions", spec.Regions)
}

// propagate makes sure every region of the cursor stream holds it.
func (cs *cursorService) propagate(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	spec, ok := cs.n.streamSpec(cursorStreamName)
	if !ok {
		return false
	}
	if err := cs.n.propagateCreate(cctx, wantExactly(spec)); err != nil {
		cs.logger.Debug("propagate the cursor stream", "error", err)
		return false
	}
	return true
}

// attach builds the cursorRanges once the cursor stream is open here.
func (cs *cursorService) attach() bool {
	n := cs.n
	n.mu.RLock()
	st, ok := n.streams[cursorStreamName]
	n.mu.RUnlock()
	if !ok {
		return false
	}
	if !st.spec.sameDefinition(n.cursorStreamSpec()) {
		cs.logger.Warn("the cursor stream's definition differs from this node's configuration (regions or cursor homes); using the stream's",
			"regions", st.spec.Regions, "ranges", st.spec.RangeCount)
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed {
		return true
	}
	for r, d := range st.ranges {
		cr := newCursorRange(cs, uint32(r), len(st.ranges), d)
		cs.ranges = append(cs.ranges, cr)
		go cr.runApplier()
		go cr.runWriter()
	}
	cs.logger.Debug("cursor stream attached", "ranges", len(st.ranges))
	return true
}

func (cs *cursorService) close() {
	cs.mu.Lock()
	cs.closed = true
	rs := cs.ranges
	cs.mu.Unlock()
	close(cs.stop)
	<-cs.done
	for _, cr := range rs {
		cr.close()
	}
}

// cursorCreateWaitMax bounds how long a request waits for the cursor
// stream to be created and opened here.
const cursorCreateWaitMax = 20 * time.Second

// ready returns the cursor ranges, asking for the stream's creation and
// waiting for it (bounded) when it is not open here yet.
func (cs *cursorService) ready(ctx context.Context) ([]*cursorRange, error) {
	if rs := cs.all(); len(rs) > 0 {
		return rs, nil
	}
	ctx, cancel := context.WithTimeout(ctx, cursorCreateWaitMax)
	defer cancel()
	for {
		select {
		case cs.kick <- struct{}{}:
		default:
		}
		if rs := cs.all(); len(rs) > 0 {
			return rs, nil
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return nil, apierr.New(apierr.Unavailable, "the cursor stream is not open on this node yet: %v; retry", ctx.Err())
		case <-cs.stop:
			return nil, apierr.New(apierr.ShuttingDown, "node is shutting down")
		}
	}
}

// rangeFor returns the cursorRange holding name, creating the cursor
// stream if it does not exist yet.
func (cs *cursorService) rangeFor(ctx context.Context, name string) (*cursorRange, error) {
	rs, err := cs.ready(ctx)
	if err != nil {
		return nil, err
	}
	return rs[keyspace.RangeForKey([]byte(name), uint32(len(rs)))], nil
}

// errNoCursorStream is what a read finds when the cursor stream was never
// created here: nothing is stored.
var errNoCursorStream = errors.New("regionsvc: no cursor stream")

// existing returns the cursor ranges for a read: errNoCursorStream if the
// stream does not exist (a read never creates it), else once open here.
//
// A node's catalogue may lag its region's: the creation of the cursor
// stream, like the first commit after it, needs only a quorum, so a node
// left behind does not know the stream yet while a commit in it is
// already acknowledged. With confirm (every read but a LOCAL one, whose
// answer is this node's copy whatever it holds), a stream unknown here is
// confirmed absent by the catalogue's leader, or waited for until this
// node applied its creation (lookupStream); only then is "nothing stored"
// the answer.
func (cs *cursorService) existing(ctx context.Context, confirm bool) ([]*cursorRange, error) {
	if rs := cs.all(); len(rs) > 0 {
		return rs, nil
	}
	if _, ok := cs.n.streamSpec(cursorStreamName); !ok {
		if !confirm {
			return nil, errNoCursorStream
		}
		if _, err := cs.n.lookupStream(ctx, cursorStreamName); err != nil {
			if rpcerr.CodeOf(err) == apierr.StreamNotFound {
				return nil, errNoCursorStream
			}
			return nil, err
		}
	}
	return cs.ready(ctx)
}

// confirmRead reports whether a read at consistency c must confirm that
// the cursor stream is absent before answering so (existing).
func confirmRead(c geologv1.Consistency) bool {
	return c != geologv1.Consistency_CONSISTENCY_UNSPECIFIED && c != geologv1.Consistency_CONSISTENCY_LOCAL
}

// rangeForRead is rangeFor for a read: errNoCursorStream when nothing was
// ever stored (confirmed as existing says).
func (cs *cursorService) rangeForRead(ctx context.Context, name string, confirm bool) (*cursorRange, error) {
	rs, err := cs.existing(ctx, confirm)
	if err != nil {
		return nil, err
	}
	return rs[keyspace.RangeForKey([]byte(name), uint32(len(rs)))], nil
}

// all returns every cursorRange (nil before the stream is open).
func (cs *cursorService) all() []*cursorRange {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return slices.Clone(cs.ranges)
}

// cursorRange is one range of the cursor stream on this node.
type cursorRange struct {
	cs  *cursorService
	idx uint32
	// rangeHint is its CursorRangeHeader: "idx/count".
	rangeHint string
	d         *rangeDriver
	logger    hclog.Logger

	// mu guards state and applied: the applier writes, everyone else
	// reads.
	mu      sync.RWMutex
	state   *cursors.State
	applied uint64 // the next offset to apply
	// last identifies the frame holding offset applied-1, to tell a cut
	// log (a fork) from one that only grew.
	last frameID
	// decoded is the applier's record slice, reused from frame to frame
	// (guarded by mu, emptied after each frame).
	decoded []batch.Record

	notifyMu  sync.Mutex
	appliedCh chan struct{} // closed and replaced when applied moves

	inbox chan *cursorOp // the coordinator's requests (cursorwriter.go)
	stop  chan struct{}
	done  sync.WaitGroup
}

type frameID struct {
	base, epoch uint64
	appendTime  int64
}

func newCursorRange(cs *cursorService, idx uint32, count int, d *rangeDriver) *cursorRange {
	cr := &cursorRange{cs: cs, idx: idx, rangeHint: fmt.Sprintf("%d/%d", idx, count), d: d, logger: cs.logger.With("range", idx),
		state: cursors.NewState(cursors.Limits{}), appliedCh: make(chan struct{}),
		inbox: make(chan *cursorOp, cursorInboxOpsMax), stop: make(chan struct{})}
	cr.done.Add(2)
	return cr
}

func (cr *cursorRange) close() {
	close(cr.stop)
	cr.done.Wait()
}

func (cr *cursorRange) notifyApplied() {
	cr.notifyMu.Lock()
	close(cr.appliedCh)
	cr.appliedCh = make(chan struct{})
	cr.notifyMu.Unlock()
}

func (cr *cursorRange) appliedChanged() <-chan struct{} {
	cr.notifyMu.Lock()
	defer cr.notifyMu.Unlock()
	return cr.appliedCh
}

// appliedEnd is the offset the state has applied up to.
func (cr *cursorRange) appliedEnd() uint64 {
	cr.mu.RLock()
	defer cr.mu.RUnlock()
	return cr.applied
}

// waitApplied waits until the state has applied every offset below end.
func (cr *cursorRange) waitApplied(ctx context.Context, end uint64) error {
	for {
		ch := cr.appliedChanged()
		if cr.appliedEnd() >= end {
			return nil
		}
		select {
		case <-ch:
		case <-cr.stop:
			return apierr.New(apierr.ShuttingDown, "node is shutting down")
		case <-ctx.Done():
			return apierr.New(apierr.Timeout, "cursor range %d: waiting to apply up to %d (applied %d): %v", cr.idx, end, cr.appliedEnd(), ctx.Err())
		}
	}
}

// readAfter runs fn on the applied state under the read lock once it has
// applied every offset below end. The check and fn are under one lock: a
// state rebuilt from the log's start (checkCut after a fork, or a log
// that now starts later) after a caller's waitApplied is waited for
// again, never read half-built.
func (cr *cursorRange) readAfter(ctx context.Context, end uint64, fn func(s *cursors.State)) error {
	for {
		cr.mu.RLock()
		if cr.applied >= end {
			fn(cr.state)
			cr.mu.RUnlock()
			return nil
		}
		cr.mu.RUnlock()
		if err := cr.waitApplied(ctx, end); err != nil {
			return err
		}
	}
}

// read runs fn on the applied state under the read lock.
func (cr *cursorRange) read(fn func(s *cursors.State)) {
	cr.mu.RLock()
	defer cr.mu.RUnlock()
	fn(cr.state)
}

// applyReadBytesMax bounds one read of the applier.
const applyReadBytesMax = 1 << 20

// applyDecodedKeepMax bounds the record slice the applier keeps between
// frames.
const applyDecodedKeepMax = 4096

// runApplier follows the range's committed log into the state (doc.go of
// package cursors, driver contract step 1).
func (cr *cursorRange) runApplier() {
	defer cr.done.Done()
	d := cr.d
	var seen cutSignal
	for {
		changed := d.changed()
		if d.store == nil || d.failure.Load() != nil {
			// A range that stopped serving applies nothing more; its state
			// stays as it was (reads of it remain possible).
			select {
			case <-changed:
				continue
			case <-cr.stop:
				return
			}
		}
		// A fork cuts the log for a newer epoch and keeps the cut tail in
		// the orphan log: on either sign, check that the frame last
		// applied is still in the log (it may have grown again since).
		if now := cr.cutSignal(); now != seen || d.committed.Load() < cr.appliedEnd() {
			seen = now
			cr.checkCut()
		}
		before := cr.appliedEnd()
		if err := cr.applyMore(); err != nil {
			cr.logger.Error("apply the cursor log", "error", err)
		}
		if after := cr.appliedEnd(); after < d.committed.Load() && after > before {
			continue
		}
		select {
		case <-changed:
		case <-time.After(cursorApplyRetryInterval):
		case <-cr.stop:
			return
		}
	}
}

// cursorApplyRetryInterval is how soon the applier looks again when it
// made no progress (a read error, the log moving under it).
const cursorApplyRetryInterval = 50 * time.Millisecond

// cutSignal is what changes when a fork cuts the log: the highest epoch
// seen, and the number of forks in the orphan log.
type cutSignal struct {
	epoch uint64
	forks int
}

func (cr *cursorRange) cutSignal() cutSignal {
	s := cutSignal{epoch: cr.d.highestEpoch.Load()}
	if cr.d.rep != nil {
		s.forks = len(cr.d.rep.Orphans())
	}
	return s
}

// checkCut rebuilds the state from the log's start when the frame holding
// the last applied offset is no longer the one applied (the log was cut
// and may have grown again since).
func (cr *cursorRange) checkCut() {
	cr.mu.RLock()
	applied, last := cr.applied, cr.last
	cr.mu.RUnlock()
	if applied == 0 {
		return
	}
	same := false
	if applied <= cr.d.committed.Load() {
		if f, err := cr.d.store.ReadFrames(applied-1, 1, applied); err == nil && len(f) >= batch.HeaderSize {
			if h, err := batch.DecodeHeader(f); err == nil {
				same = frameID{h.BaseOffset, h.Epoch, h.AppendTimeUnixNanos} == last
			}
		}
	}
	if same {
		return
	}
	cr.logger.Warn("the cursor log was cut (a fork): rebuilding the state from the log", "applied", applied)
	cr.mu.Lock()
	cr.state, cr.applied, cr.last = cursors.NewState(cursors.Limits{}), 0, frameID{}
	cr.mu.Unlock()
	cr.notifyApplied()
}

// applyMore applies what is committed past the applied offset, one read
// at a time.
func (cr *cursorRange) applyMore() error {
	d := cr.d
	committed := d.committed.Load()
	from := cr.appliedEnd()
	if start := d.store.StartOffset(); from < start {
		// The log starts later than what was applied (retention or an
		// installed snapshot): the state is what the log holds.
		cr.mu.Lock()
		cr.state, cr.applied = cursors.NewState(cursors.Limits{}), start
		cr.mu.Unlock()
		from = start
	}
	if from >= committed {
		return nil
	}
	frames, err := d.store.ReadFrames(from, applyReadBytesMax, committed)
	if err != nil {
		if errors.Is(err, segment.ErrOutOfRange) {
			return nil // moved under us: the next pass sees the new start
		}
		return err
	}
	cr.mu.Lock()
	defer cr.notifyApplied()
	defer cr.mu.Unlock()
	for len(frames) > 0 {
		size, err := batch.FrameSize(frames)
		if err != nil || size > len(frames) {
			return errors.Join(segment.ErrCorrupt, err)
		}
		h, recs, err := batch.DecodeAppend(cr.decoded[:0], frames[:size])
		frames = frames[size:]
		if err != nil {
			return err
		}
		cr.applyFrame(h, recs, committed)
		clear(recs) // no views of the frames kept past this read
		if cap(recs) > applyDecodedKeepMax {
			recs = nil
		}
		cr.decoded = recs[:0]
	}
	return nil
}

// applyFrame applies the records of one frame below committed. Compaction
// by key leaves holes (a compacted frame's records keep their offsets, and
// whole frames may be gone) and writes markers, which hold no cursor
// record: the applied offset moves to the frame's end either way.
func (cr *cursorRange) applyFrame(h batch.Header, recs []batch.Record, committed uint64) {
	if h.Type == batch.TypeData {
		for i := range recs {
			at := h.Offset(&recs[i])
			if at < cr.applied || at >= committed {
				continue
			}
			rec := &recs[i]
			if err := cr.state.Apply(cursors.Record{Key: rec.Key, Value: rec.Value, Tombstone: rec.Tombstone}); err != nil {
				// Same bytes, same decision on every replica: skipped
				// everywhere.
				cr.logger.Error("cursor record not understood; skipped", "offset", at, "error", err)
			}
			cr.applied = at + 1
		}
	}
	if end := h.NextOffset(); end <= committed && end > cr.applied {
		cr.applied = end
	}
	if cr.applied == h.NextOffset() {
		cr.last = frameID{h.BaseOffset, h.Epoch, h.AppendTimeUnixNanos}
	}
}

// setConsumerDefaults completes the cursor and group settings of Config.
func (c *Config) setConsumerDefaults() error {
	if c.CursorRanges <= 0 {
		c.CursorRanges = cursorRangesDefault
	}
	if c.CursorRanges > rangeCountMax {
		return fmt.Errorf("regionsvc: CursorRanges %d is over %d", c.CursorRanges, rangeCountMax)
	}
	if c.CursorHome != "" && c.CursorHome != c.Region && len(c.Regions[c.CursorHome]) == 0 {
		return fmt.Errorf("regionsvc: CursorHome %q is not a region this node knows", c.CursorHome)
	}
	if c.GroupHeartbeatInterval <= 0 {
		c.GroupHeartbeatInterval = groupHeartbeatIntervalDefault
	}
	return nil
}

// createInternalStream takes the creation of the cursor stream that
// another node forwarded or another region propagated (users cannot
// create it): the definition must be this node's.
func (n *Node) createInternalStream(ctx context.Context, req *geologv1.CreateStreamRequest) (*geologv1.StreamInfo, error) {
	if !isPropagated(ctx) && !isForwarded(ctx) {
		return nil, apierr.New(apierr.InvalidArgument, "stream name %q is reserved", req.GetName())
	}
	spec := n.cursorStreamSpec()
	asked := streamSpec{Name: req.GetName(), RangeCount: req.GetRangeCount(), Regions: req.GetRegions(), Homes: req.GetRangeHomes(),
		RetentionAgeMillis: req.GetRetention().GetMaxAgeMs(), RetentionBytes: req.GetRetention().GetMaxBytes()}
	if err := cleanupFromRequest(req, &asked); err != nil {
		return nil, err
	}
	if !spec.sameDefinition(asked) {
		return nil, apierr.New(apierr.InvalidArgument, "the cursor stream's definition differs between nodes: asked %d ranges in %v homed %v, this node's is %d ranges in %v homed %v (Config.Regions, CursorRanges, CursorHome, CursorCompactionLag, CursorDeleteRetention must agree)",
			asked.RangeCount, asked.Regions, asked.homes(), spec.RangeCount, spec.Regions, spec.homes())
	}
	spec.CreatedUnixNanos = n.cfg.Now().UnixNano()
	return n.createStreamFromSpec(ctx, wantExactly(spec))
}
