package regionsvc

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/homing"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/replica"
	"github.com/geolog/geolog/replicator"
	"github.com/geolog/geolog/segment"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/metadata"
)

// Multi-region placement (DESIGN.md "Mirrors"). Every region of a stream
// holds a Raft group per range. In the range's home region the group is
// writable; in the others it is a mirror that takes only the replicator's
// batches, verbatim. The pieces here:
//
//   - creation: a stream created in one region is propagated to each of its
//     other regions (idempotently: a region that has the same definition
//     counts as done), so every region's catalogue holds it;
//   - appends to a mirror get NOT_HOME with an address in the home region;
//   - on the home region, the leader of each range runs one replicator task
//     per other region (replicationManager), shipping committed frames;
//   - on every node, the replicator's Mirror server applies them through
//     mirrorStore: the mirror group's leader proposes each frame verbatim.

// propagatedKey marks a CreateStream that a node of another region sent to
// carry a creation over: the receiving region creates the stream and does
// not propagate it further.
const propagatedKey = "x-geolog-propagated"

func isPropagated(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(propagatedKey)) > 0
}

// createRequest is the CreateStream request that recreates spec exactly
// (homes explicit) in another node or region.
func createRequest(spec streamSpec) *geologv1.CreateStreamRequest {
	cleanup, compaction := spec.cleanupInfo()
	return &geologv1.CreateStreamRequest{Name: spec.Name, RangeCount: spec.RangeCount, Regions: spec.Regions,
		Retention:  spec.retentionInfo(),
		RangeHomes: spec.homes(), Cleanup: cleanup, Compaction: compaction, ReplicationFactor: spec.ReplicationFactor}
}

// propagateCreate creates w's stream in every other region of it. A
// region that already holds a stream under the name counts as done if w
// asks for it (createWant.diff); one that holds a different stream is an
// error naming the difference. It tries each address of a region in turn.
func (n *Node) propagateCreate(ctx context.Context, w createWant) error {
	var missing []string
	for _, region := range w.spec.Regions {
		if region == n.cfg.Region {
			continue
		}
		if err := n.createInRegion(ctx, region, w); err != nil {
			if e := apierr.As(err); e.Code == apierr.StreamExists || e.Code == apierr.InvalidArgument {
				return err
			}
			missing = append(missing, fmt.Sprintf("%s (%v)", region, err))
		}
	}
	if len(missing) > 0 {
		return apierr.New(apierr.Unavailable, "stream %q is not yet created in regions %v; creating it again completes it", w.spec.Name, missing)
	}
	return nil
}

func (n *Node) createInRegion(ctx context.Context, region string, w createWant) error {
	return n.propagateToRegion(ctx, region, func(cctx context.Context, addr string, c geologv1.LogClient) error {
		_, err := c.CreateStream(cctx, createRequest(w.spec))
		if rpcerr.CodeOf(err) == apierr.StreamExists {
			return n.checkSameDefinition(ctx, addr, region, w)
		}
		return err
	})
}

// propagateToRegion makes a request propagated to region (marked so that
// the region does not propagate it further) through its nodes in turn:
// call sends it to one; a node that answers NOT_LEADER or a retriable
// error passes the turn to the next.
func (n *Node) propagateToRegion(ctx context.Context, region string, call func(ctx context.Context, addr string, c geologv1.LogClient) error) error {
	addrs := n.regionAddrs(region)
	if len(addrs) == 0 {
		return apierr.New(apierr.InvalidArgument, "region %q has no known addresses on this node (see Config.Regions)", region)
	}
	var last error
	for _, addr := range addrs {
		conn, err := n.peerConn(addr)
		if err != nil {
			last = err
			continue
		}
		cctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, propagatedKey, n.cfg.Region), 20*time.Second)
		err = call(cctx, addr, geologv1.NewLogClient(conn))
		cancel()
		if err == nil {
			return nil
		}
		e := rpcerr.FromError(err)
		if !e.Retriable && e.Code != apierr.NotLeader {
			return e
		}
		last = e
	}
	return last
}

// checkSameDefinition confirms that the stream region holds under w's
// name (asked at addr) is the one w asks for.
func (n *Node) checkSameDefinition(ctx context.Context, addr, region string, w createWant) error {
	other, err := n.describeRemote(ctx, addr, w.spec.Name)
	if err != nil {
		return err
	}
	if diff := w.diff(other); diff != "" {
		return apierr.New(apierr.StreamExists, "stream %q already exists in region %s with another definition: %s", w.spec.Name, region, diff)
	}
	return nil
}

// describeRemote returns the definition of stream as the node at addr
// holds it.
func (n *Node) describeRemote(ctx context.Context, addr, stream string) (streamSpec, error) {
	conn, err := n.peerConn(addr)
	if err != nil {
		return streamSpec{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := geologv1.NewLogClient(conn).DescribeStream(cctx, &geologv1.DescribeStreamRequest{Name: stream})
	if err != nil {
		return streamSpec{}, rpcerr.FromError(err)
	}
	si := resp.GetStream()
	return streamSpec{Name: si.GetName(), RangeCount: si.GetRangeCount(), Regions: si.GetRegions(), Homes: si.GetRangeHomes(),
		RetentionAgeMillis: si.GetRetention().GetMaxAgeMs(), RetentionBytes: si.GetRetention().GetMaxBytes(),
		MirrorHoldBytes: si.GetRetention().GetMirrorHoldMaxBytes(), MirrorHoldAgeMillis: si.GetRetention().GetMirrorHoldMaxMs(),
		Cleanup: si.GetCleanup(), DeleteRetentionMillis: si.GetCompaction().GetDeleteRetentionMs(),
		MinCompactionLagMillis: si.GetCompaction().GetMinLagMs(), CreatedUnixNanos: si.GetCreatedUnixNanos()}, nil
}

// existingDefinition looks for the stream in its other regions: the first
// region that answers with it gives its definition. A create taken by a
// node outside the stream's regions, with the homes left to their
// default, adopts it (a retry of a create that another node resolved).
func (n *Node) existingDefinition(ctx context.Context, spec streamSpec) (streamSpec, bool) {
	for _, region := range spec.Regions {
		for _, addr := range n.regionAddrs(region) {
			other, err := n.describeRemote(ctx, addr, spec.Name)
			if err == nil {
				return other, true
			}
			if rpcerr.CodeOf(err) == apierr.StreamNotFound {
				break // this region does not hold it; the next may
			}
		}
	}
	return streamSpec{}, false
}

// notHome is the retriable NOT_HOME an append to a mirror gets, with the
// advertised address of a node of the home region to retry at: the home
// leader when its heartbeats named it, else one of the region's nodes
// (spread by range; one that does not lead the range redirects again
// within its region). No hint when the node knows no advertised address
// of the home region yet (advertise.go).
func (n *Node) notHome(d *rangeDriver) error {
	role := d.role()
	if role.region == "" || role.region == n.cfg.Region {
		// Homing on, and the home is not known here yet (or is moving):
		// nowhere to send the producer but back here, later.
		return apierr.New(apierr.Unavailable, "stream %s range %d: its home is being settled (homing epoch %d); retry", d.cfg.stream, d.cfg.rangeID, role.epoch)
	}
	e := apierr.New(apierr.NotHome, "stream %s range %d is homed in region %s (epoch %d); region %s holds a read-only mirror",
		d.cfg.stream, d.cfg.rangeID, role.region, role.epoch, n.cfg.Region)
	e.LeaderHint = n.homeLeaderAddr(d)
	if e.LeaderHint == "" {
		if addrs := n.book.regionAddrs(role.region); len(addrs) > 0 {
			e.LeaderHint = addrs[int(d.cfg.rangeID)%len(addrs)]
		}
	}
	return e
}

// homeLeaderAddr is the advertised address of the range's leader in its
// home region, as this node knows it: its own region's leader when the
// range is homed here, else the leader the home's heartbeats name; "" if
// unknown.
func (n *Node) homeLeaderAddr(d *rangeDriver) string {
	role := d.role()
	switch {
	case d.rep == nil:
		return ""
	case role.home:
		return n.clientAddr(n.cfg.Region, d.rep.LeaderID())
	case role.region != "":
		return n.clientAddr(role.region, d.homeLeaderID.Load())
	}
	return ""
}

// mirrorStore is the node's side of the replicator's Mirror server.
type mirrorStore struct{ n *Node }

var _ replicator.MirrorStore = (*mirrorStore)(nil)

// Open implements replicator.MirrorStore.
func (s *mirrorStore) Open(ctx context.Context, stream string, rng uint32) (replicator.MirrorRange, error) {
	d, err := s.n.rangeOf(ctx, stream, rng)
	if err != nil {
		return nil, err
	}
	switch {
	case d.rep == nil || d.store == nil:
		return nil, apierr.New(apierr.Unavailable, "stream %s range %d is not served here", stream, rng)
	case d.isHome():
		// A source that believes it is home for a range homed here is
		// stale (fenced by a takeover or a rehome) or misconfigured; it
		// must stop.
		return nil, apierr.New(apierr.StaleEpoch, "stream %s range %d is homed in region %s, which takes no mirrored batches", stream, rng, s.n.cfg.Region)
	case d.rep.LeaderID() != s.n.cfg.NodeID:
		// No hint: the source reaches this region through its own address
		// list (in a local cluster, the WAN proxy's), in which our peers'
		// addresses mean nothing; it tries the next one.
		return nil, apierr.New(apierr.NotLeader, "stream %s range %d: node %d does not lead the mirror group", stream, rng, s.n.cfg.NodeID)
	}
	if err := s.n.checkMirrorCaller(ctx, d); err != nil {
		return nil, err
	}
	return &mirrorRange{driverSource: driverSource{d: d}, n: s.n}, nil
}

// mirrorRange is one range's mirror group, as led by this node; it reads
// its applied frames as a home's source does.
type mirrorRange struct {
	driverSource
	n *Node
}

var _ replicator.HomeChecker = (*mirrorRange)(nil)

// CheckHome implements replicator.HomeChecker: a mirror takes frames from
// the range's home at the current epoch only, as this node knows them
// (the lease store's, through its homing view; the stream's spec without
// homing). A source at an epoch this node has not heard of yet is told to
// retry, and the node reads the lease store's homes at once: a new home's
// first stream after a takeover or a rehome waits for that read, not for
// the next directory interval.
func (m *mirrorRange) CheckHome(region string, epoch uint64) error {
	err := m.checkHome(region, epoch)
	if err != nil {
		m.n.metrics.peerRefused.Add(context.Background(), 1, peerMirror)
	}
	return err
}

func (m *mirrorRange) checkHome(region string, epoch uint64) error {
	role := m.d.role()
	switch {
	case role.region == "" || epoch > role.epoch:
		m.n.refreshHomesSoon()
		return apierr.New(apierr.NotHome, "stream %s range %d: homing epoch %d from region %s is above the current one here (%s at epoch %d)",
			m.d.cfg.stream, m.d.cfg.rangeID, epoch, region, role.region, role.epoch)
	case epoch < role.epoch:
		return apierr.New(apierr.StaleEpoch, "stream %s range %d: homing epoch %d from region %s, the home is %s at epoch %d",
			m.d.cfg.stream, m.d.cfg.rangeID, epoch, region, role.region, role.epoch)
	case region != role.region:
		return apierr.New(apierr.NotHome, "stream %s range %d: region %s is not the home (%s at epoch %d)",
			m.d.cfg.stream, m.d.cfg.rangeID, region, role.region, role.epoch)
	}
	return nil
}

var _ replicator.MirrorRange = (*mirrorRange)(nil)

func (m *mirrorRange) AppliedEnd() uint64   { return m.d.committed.Load() }
func (m *mirrorRange) HighestEpoch() uint64 { return m.d.highestEpoch.Load() }

// RecordHeartbeat raises the highest epoch seen. It is not made durable:
// a restarted node relearns it from its log and from the home's next
// heartbeat (the lease store will be the durable source once homing lands).
func (m *mirrorRange) RecordHeartbeat(hb replicator.Heartbeat) error {
	m.d.raiseEpoch(hb.Epoch)
	if hb.Epoch > m.d.role().epoch {
		// A newer home than the directory's: learn where it starts
		// (timeline.go).
		m.d.updateFence()
	}
	if hb.LeaderNodeID != 0 {
		m.d.homeLeaderID.Store(hb.LeaderNodeID)
	}
	if hb.RetainFromKnown {
		m.d.homeFloor.Store(hb.RetainFrom + 1)
	}
	return nil
}

// Apply proposes each frame verbatim to the mirror group, in order, and
// returns once the last is committed and AppliedEnd shows it.
func (m *mirrorRange) Apply(ctx context.Context, frames []byte) (end uint64, err error) {
	if span := m.n.shipmentSpan(ctx, "geolog.replicator.apply", m.d, m.d.committed.Load(), len(frames)); span != nil {
		defer func() { span.SetAttributes(attribute.Int64("geolog.end_offset", int64(end))); endSpan(span, err) }()
	}
	return m.apply(ctx, frames)
}

func (m *mirrorRange) apply(ctx context.Context, frames []byte) (uint64, error) {
	var ops []chan appendResult
	for len(frames) > 0 {
		size, err := batch.FrameSize(frames)
		if err != nil || size > len(frames) {
			return 0, apierr.Wrap(apierr.InvalidArgument, err, "mirrored frames are malformed")
		}
		h, err := batch.DecodeHeader(frames[:size])
		if err != nil {
			return 0, apierr.Wrap(apierr.InvalidArgument, err, "mirrored frame")
		}
		done := make(chan appendResult, 1)
		ops = append(ops, done)
		m.d.raiseEpoch(h.Epoch)
		m.d.submit(ctx, &appendOp{verbatim: true, recordCount: h.Span(), frame: frames[:size:size],
			reply: func(r appendResult) { done <- r }})
		frames = frames[size:]
	}
	var end uint64
	var first error
	for _, done := range ops {
		select {
		case r := <-done:
			if r.err != nil && first == nil {
				first = r.err
			}
			if r.err == nil {
				end = r.baseOffset + uint64(r.recordCount)
			}
		case <-ctx.Done():
			return 0, apierr.Wrap(apierr.Timeout, ctx.Err(), "mirror apply")
		}
	}
	if first != nil {
		return 0, first
	}
	// The replies come from inside the driver's Ready cycle, before it
	// publishes the committed end (AppliedEnd): wait for it, or the
	// server would take the next batch for a gap and the source would
	// resend from the stale end, a round trip lost.
	if err := m.d.waitCommitted(ctx, end); err != nil {
		return 0, err
	}
	return end, nil
}

var _ replicator.Forker = (*mirrorRange)(nil)

var _ replicator.LogEpocher = (*mirrorRange)(nil)

// LogEpoch implements replicator.LogEpocher: the replica's highest epoch
// of a data frame or a fork (its log's epoch, as the fence reads it), not
// the heartbeats' (0 without a replica). The Server answers an open with
// it when retention deleted the frame at the applied end.
func (m *mirrorRange) LogEpoch() uint64 {
	if m.d.rep == nil {
		return 0
	}
	return m.d.rep.HighestEpoch()
}

// Fork implements replicator.Forker: the mirror group (led here) cuts its
// divergent tail at offset at into the range's orphan log, on every
// replica (replica.ProposeFork), and continues at at under epoch.
func (m *mirrorRange) Fork(ctx context.Context, at, epoch uint64) (uint64, error) {
	return m.d.forkAt(ctx, at, epoch)
}

// forkAt has the range's group (led here) cut its log's tail from offset
// at into the orphan log on every replica (replica.ProposeFork) and
// continue at at under epoch, retrying while appends are in flight; it
// returns once the driver publishes the cut log. The caller asserts that
// nothing the log holds from at on is the range's: a mirror's divergent
// tail (mirrorRange.Fork), or a new home's own (the start gate,
// Node.confirmStart). Off the driver goroutine.
func (d *rangeDriver) forkAt(ctx context.Context, at, epoch uint64) (uint64, error) {
	for {
		done := make(chan replica.ForkResult, 1)
		if err := d.exec(ctx, func() { d.rep.ProposeFork(at, epoch, func(r replica.ForkResult) { done <- r }) }); err != nil {
			return d.committed.Load(), err
		}
		var res replica.ForkResult
		select {
		case res = <-done:
		case <-ctx.Done():
			return d.committed.Load(), apierr.Wrap(apierr.Timeout, ctx.Err(), "fork at %d", at)
		}
		if res.Err == nil {
			d.raiseEpoch(epoch)
			// The driver publishes the cut log right after the reply.
			for d.committed.Load() > at {
				select {
				case <-d.changed():
				case <-time.After(10 * time.Millisecond):
				case <-ctx.Done():
					return d.committed.Load(), apierr.Wrap(apierr.Timeout, ctx.Err(), "fork at %d", at)
				}
			}
			d.logger.Warn("forked: the divergent tail is in the orphan log", "fork_offset", at, "epoch", epoch,
				"orphaned_records", res.Records, "orphaned_offsets", fmt.Sprintf("[%d, %d)", res.FirstOffset, res.NextOffset))
			return at, nil
		}
		// Appends in flight, or another fork pending: retry shortly.
		if e := apierr.As(res.Err); e.Code != apierr.Unavailable {
			return d.committed.Load(), res.Err
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return d.committed.Load(), apierr.Wrap(apierr.Timeout, ctx.Err(), "fork at %d", at)
		}
	}
}

var _ replicator.Skipper = (*mirrorRange)(nil)

// SkipTo implements replicator.Skipper: the mirror group (led here) moves
// its log's start and end to offset at, the home's log start, on every
// replica (replica.ProposeSkip); its frames below at are deleted, as the
// home's retention deleted them there. It returns once the skip is
// committed and the driver publishes at as the committed end. Readers
// below at then get OFFSET_OUT_OF_RANGE with start at, as at the home.
func (m *mirrorRange) SkipTo(ctx context.Context, at uint64) error {
	d := m.d
	timeout := func() error { return apierr.Wrap(apierr.Timeout, ctx.Err(), "skip to %d", at) }
	for {
		done := make(chan replica.SkipResult, 1)
		if err := d.exec(ctx, func() { d.rep.ProposeSkip(at, func(r replica.SkipResult) { done <- r }) }); err != nil {
			return err
		}
		var res replica.SkipResult
		select {
		case res = <-done:
		case <-ctx.Done():
			return timeout()
		}
		if res.Err == nil {
			// The driver publishes the moved log right after the reply.
			for d.committed.Load() < at {
				select {
				case <-d.changed():
				case <-time.After(10 * time.Millisecond):
				case <-ctx.Done():
					return timeout()
				}
			}
			d.logger.Warn("skipped to the home's log start: retention there deleted what this mirror had not received",
				"to", at, "skip_index", res.Index)
			return nil
		}
		// Appends in flight, or a fork or skip pending: retry shortly.
		if e := apierr.As(res.Err); e.Code != apierr.Unavailable {
			return res.Err
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return timeout()
		}
	}
}

// raiseEpoch records that the range has seen homing epoch e.
func (d *rangeDriver) raiseEpoch(e uint64) {
	for {
		cur := d.highestEpoch.Load()
		if e <= cur || d.highestEpoch.CompareAndSwap(cur, e) {
			return
		}
	}
}

// driverSource is a home range as the replicator reads it: committed data
// frames of the range's log. With epoch set (a replicator task's), it
// ships only frames of that epoch or older: once the range's log holds a
// newer home's frames (this region is a mirror now), the task is stale and
// must not pass them on as its own. And it ships nothing past the range's
// timeline fence (servableEnd): a region that takes a range back after
// another epoch may hold a tail of its own from its earlier time as home
// (acked, never replicated, orphaned by the takeover), which its start
// gate forks off before the new epoch's first frame (epochstart.go) and
// which the fence keeps from local readers until then. Shipped before the
// fork, that tail would stay in the mirrors for good: the task's cursor is
// past the fork point by then, and a mirror compares only what a batch
// overlaps (seed 7705544: a mirror forked at 297 where epoch 3 starts at
// 286, keeping the old epoch's records between).
type driverSource struct {
	d     *rangeDriver
	epoch uint64
}

var _ replicator.Source = driverSource{}

// end is the end of what the source ships: the committed end, or for a
// task the fence if lower.
func (s driverSource) end() uint64 {
	if s.epoch == 0 {
		return s.d.committed.Load()
	}
	return s.d.servableEnd()
}

func (s driverSource) ReadFrames(from uint64, maxBytes int, endOffset uint64) ([]byte, error) {
	frames, err := s.d.store.ReadFrames(from, maxBytes, min(endOffset, s.end()))
	if errors.Is(err, segment.ErrOutOfRange) {
		// Below the log's start (retention deleted it): the replicator's
		// sentinel, so that the task reports the mirror behind it.
		err = fmt.Errorf("%w: %w", replicator.ErrOutOfRange, err)
	}
	if err != nil || s.epoch == 0 || s.d.rep == nil || s.d.rep.HighestEpoch() <= s.epoch {
		return frames, err // the common case: no newer epoch anywhere in the log
	}
	for at := 0; at < len(frames); {
		size, err := batch.FrameSize(frames[at:])
		if err != nil {
			return nil, err
		}
		h, err := batch.DecodeHeader(frames[at : at+size])
		if err != nil {
			return nil, err
		}
		if h.Epoch > s.epoch {
			if at == 0 {
				return nil, apierr.New(apierr.StaleEpoch, "stream %s range %d: the log continues at homing epoch %d, past this source's %d",
					s.d.cfg.stream, s.d.cfg.rangeID, h.Epoch, s.epoch)
			}
			return frames[:at], nil
		}
		at += size
	}
	return frames, nil
}

var _ replicator.SourceStarter = driverSource{}

// StartOffset implements replicator.SourceStarter: the log's start on
// this node (retention deletes below it), where a task ships from to a
// mirror that is behind it.
func (s driverSource) StartOffset() uint64 { return s.d.store.StartOffset() }

func (s driverSource) CommittedEnd() uint64         { return s.end() }
func (s driverSource) TailChanged() <-chan struct{} { return s.d.changed() }

// replicationManager runs the replicator tasks of the ranges this node
// leads in their home region: one per (range, other region of the stream).
// It rescans on an interval, so leadership changes start and stop tasks
// within replicationScanInterval.
type replicationManager struct {
	n      *Node
	dialer *replicator.GRPCDialer

	mu    sync.Mutex
	tasks map[taskKey]*runningTask

	stop chan struct{}
	done chan struct{}
}

type taskKey struct {
	stream string
	rng    uint32
	region string
	epoch  uint64 // the home epoch the task ships under
}

type runningTask struct {
	task   *replicator.Task
	d      *rangeDriver // the home range it ships
	cancel context.CancelFunc
	done   chan struct{}
	ended  atomic.Bool
	err    atomic.Pointer[error]
	endAt  atomic.Int64 // unix nanos when Run returned
}

// replicationScanInterval is how often the manager looks for ranges whose
// leadership moved.
const replicationScanInterval = 100 * time.Millisecond

// fencedRetryInterval is how long a task that ended (fenced by a newer
// home, or failed) waits before the manager starts it again. A fence is
// often a mirror whose own view of the homes is a heartbeat behind (after
// a rehome or a takeover): a second is enough for it to catch up, and a
// retry that is fenced again costs one refused open.
const fencedRetryInterval = time.Second

func newReplicationManager(n *Node) *replicationManager {
	return &replicationManager{
		n:      n,
		dialer: replicator.NewGRPCDialer(replicator.DialerConfig{Credentials: n.dialCredentials()}),
		tasks:  map[taskKey]*runningTask{},
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
}

func (m *replicationManager) run() {
	defer close(m.done)
	t := time.NewTicker(replicationScanInterval)
	defer t.Stop()
	for {
		m.scan()
		select {
		case <-t.C:
		case <-m.stop:
			m.stopAll()
			m.dialer.Close() // the tasks that used its connections are done
			return
		}
	}
}

// scan starts the tasks of ranges led here and stops the others.
func (m *replicationManager) scan() {
	n := m.n
	want := map[taskKey]*rangeDriver{}
	n.mu.RLock()
	for _, st := range n.streams {
		for r, d := range st.ranges {
			if !d.isHome() || d.rep == nil || d.store == nil || d.failure.Load() != nil || d.rep.LeaderID() != n.cfg.NodeID {
				continue
			}
			for _, region := range st.spec.Regions {
				if region != n.cfg.Region {
					want[taskKey{st.spec.Name, uint32(r), region, d.role().epoch}] = d
				}
			}
		}
	}
	n.mu.RUnlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	for k, rt := range m.tasks {
		if _, ok := want[k]; !ok {
			rt.cancel()
			<-rt.done
			delete(m.tasks, k)
			continue
		}
		if rt.ended.Load() && now.Sub(time.Unix(0, rt.endAt.Load())) >= fencedRetryInterval {
			delete(m.tasks, k) // restarted below
		}
	}
	for k, d := range want {
		if _, ok := m.tasks[k]; ok {
			continue
		}
		m.start(k, d)
	}
}

func (m *replicationManager) start(k taskKey, d *rangeDriver) {
	n := m.n
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s/%d/%s", n.cfg.NodeID, k.stream, k.rng, k.region)
	task, err := replicator.NewTask(replicator.TaskConfig{
		Stream: k.stream, Range: k.rng,
		SourceRegion: n.cfg.Region, DestinationRegion: k.region, SourceNodeID: n.cfg.NodeID,
		Epoch:  k.epoch,
		Source: driverSource{d: d, epoch: k.epoch},
		Dialer: m.dialer,
		Addrs:  func() []string { return n.regionAddrs(k.region) },
		Now:    n.cfg.Now,
		Seed:   h.Sum64() ^ uint64(time.Now().UnixNano()),
		Logger: n.cfg.Logger,

		TracerProvider: n.shipTracer(),
		// Mirrors keep their logs from the home's floor (P3, notes/simgaps.md).
		RetainFrom: func() (uint64, bool) { v := d.taskFloor.Load(); return v - 1, v != 0 },
	})
	if err != nil {
		n.logger.Error("replicator task", "stream", k.stream, "range", k.rng, "region", k.region, "error", err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	rt := &runningTask{task: task, d: d, cancel: cancel, done: make(chan struct{})}
	m.tasks[k] = rt
	go func() {
		defer close(rt.done)
		err := task.Run(ctx)
		if ctx.Err() == nil {
			n.logger.Warn("replicator task ended", "stream", k.stream, "range", k.rng, "region", k.region, "error", err)
		}
		rt.err.Store(&err)
		rt.endAt.Store(time.Now().UnixNano())
		rt.ended.Store(true)
	}()
}

func (m *replicationManager) stopAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, rt := range m.tasks {
		rt.cancel()
		<-rt.done
		delete(m.tasks, k)
	}
}

func (m *replicationManager) close() {
	close(m.stop)
	<-m.done
}

// progress reports, for a range led here, each mirror's position as the
// replicator tasks know it, and whether it is past the stream's hold
// bound or behind the range's log start (mirrorhold.go).
func (m *replicationManager) progress(stream string, rng uint32, now time.Time) []*geologv1.RegionProgress {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*geologv1.RegionProgress
	for k, rt := range m.tasks {
		if k.stream != stream || k.rng != rng {
			continue
		}
		lag := rt.task.Lag(now)
		st := rt.task.Stats()
		p := lagProgress(k.region, lag)
		p.State = st.Phase.String()
		p.LastError = st.LastError
		released, behind := holdState(rt.d, rt.d.mirrorHold(), lag.AppliedEnd, st.Streams > 0, lag.TimeLag)
		p.HoldReleased = released
		p.BehindLogStart = behind || st.BehindSourceStart
		switch {
		case rt.ended.Load():
			p.State = "ended"
		case p.BehindLogStart:
			p.State += "; behind the home's log start"
		case released:
			p.State += "; past the mirror hold bound"
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Region < out[j].Region })
	return out
}

// committedEnd is the committed end of a home range this node runs tasks
// for (0 if none).
func (m *replicationManager) committedEnd(stream string, rng uint32) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, rt := range m.tasks {
		if k.stream == stream && k.rng == rng {
			return rt.d.committed.Load()
		}
	}
	return 0
}

func lagProgress(region string, lag replicator.LagStatus) *geologv1.RegionProgress {
	return &geologv1.RegionProgress{
		Region:             region,
		AppliedEndOffset:   lag.AppliedEnd,
		OffsetLag:          lag.OffsetLag,
		TimeLagMillis:      lag.TimeLag.Milliseconds(),
		HeartbeatAgeMillis: lag.HeartbeatAge.Milliseconds(),
	}
}

// rangeReplication is what DescribeStream reports of a range's mirrors: on
// the home leader, every mirror's progress; on a mirror's leader, its own.
func (n *Node) rangeReplication(spec streamSpec, r uint32, d *rangeDriver) []*geologv1.RegionProgress {
	repl := n.repl.Load()
	if repl == nil || d.rep == nil {
		return nil
	}
	now := n.cfg.Now()
	if d.isHome() {
		return repl.progress(spec.Name, r, now)
	}
	if !slices.Contains(spec.Regions, n.cfg.Region) {
		return nil
	}
	lag, ok := n.replServer.Lag(spec.Name, r)
	if !ok {
		if d.rep.LeaderID() != n.cfg.NodeID {
			return nil
		}
		// This node leads the mirror but has not heard from the home since
		// it started: the lag is at least that long, never zero.
		age := now.Sub(n.started)
		return []*geologv1.RegionProgress{{Region: n.cfg.Region, AppliedEndOffset: d.committed.Load(),
			TimeLagMillis: age.Milliseconds(), HeartbeatAgeMillis: age.Milliseconds(), State: "mirror: no heartbeat yet"}}
	}
	p := lagProgress(n.cfg.Region, lag)
	p.AppliedEndOffset = d.committed.Load()
	p.State = "mirror"
	return []*geologv1.RegionProgress{p}
}

// createStreamRegions creates w's stream in this region's catalogue (if
// it is placed here) and, unless the request was itself propagated from
// another region or forwarded within this one, in each of the stream's
// other regions, then registers its homes. Creating an existing stream
// again with a definition w asks for (createWant.diff) is a retry: it
// completes what an earlier attempt left undone (regions, homes) with the
// stream's own definition, and answers with it.
func (n *Node) createStreamRegions(ctx context.Context, w createWant) (*geologv1.StreamInfo, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	forwarded := len(md.Get(forwardedKey)) > 0
	propagated := isPropagated(ctx)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), createTimeout(w.spec.RangeCount))
	defer cancel()
	if propagated {
		ctx = metadata.AppendToOutgoingContext(ctx, propagatedKey, "1") // kept when forwarded to the catalogue leader
	}
	switch {
	case w.spec.hasRegion(n.cfg.Region):
		err := n.createStreamReplicated(ctx, w.spec, forwarded)
		if err != nil && rpcerr.CodeOf(err) != apierr.StreamExists {
			return nil, err
		}
		if err != nil {
			existing, ok := n.streamSpec(w.spec.Name)
			if !ok {
				return nil, err
			}
			if diff := w.diff(existing); diff != "" {
				return nil, streamExistsDiff(w.spec.Name, diff)
			}
			if propagated || forwarded {
				return existing.info(), nil
			}
			w = wantExactly(existing)
		}
	case propagated || forwarded:
		return nil, apierr.New(apierr.InvalidArgument, "stream %q is not placed in region %q", w.spec.Name, n.cfg.Region)
	case !w.homesSet:
		if existing, ok := n.existingDefinition(ctx, w.spec); ok {
			if diff := w.diff(existing); diff != "" {
				return nil, streamExistsDiff(w.spec.Name, diff)
			}
			w = wantExactly(existing)
		}
	}
	if !propagated && !forwarded {
		if err := n.propagateCreate(ctx, w); err != nil {
			return nil, err
		}
		// Homes are registered once every region has the stream (a
		// region homes only ranges it holds), before the create returns,
		// so appends are admitted at once.
		if err := n.registerStreamHomes(ctx, w.spec); err != nil {
			return nil, err
		}
	}
	return w.spec.info(), nil
}

// createTimeout bounds a create of rangeCount ranges: 30 s, and 20 ms more
// per range, since every node opens every range (its Raft state made
// durable, an election) before the create returns: a region of one node
// opened 4,096 ranges in about 30 s on a loaded 2-core machine.
func createTimeout(rangeCount uint32) time.Duration {
	return 30*time.Second + time.Duration(rangeCount)*20*time.Millisecond
}

// homeTail is the committed end offset of a range as its home leader
// confirms it now (DESIGN.md "Read path", consistency home): every record
// acknowledged before the call lies below it. On the home leader it is a
// Raft ReadIndex; anywhere else the home leader is asked (within the region
// through the leader's address, from a mirror region through that region's
// addresses), and the caller then waits until the local copy has it.
// forwarded: another node asks, and only the leader answers.
func (n *Node) homeTail(ctx context.Context, d *rangeDriver, forwarded bool) (uint64, error) {
	return n.homeTailFor(ctx, d, homeTailAsk{forwarded: forwarded})
}

// homeTailAsk says who asks homeTailFor for a range's confirmed tail.
type homeTailAsk struct {
	// forwarded: another node asks; only the leader answers, so that a
	// stale view can never pass for the home's.
	forwarded bool
	// final: a planned rehome's coordinator asks for the final tail of a
	// range stopped for the move, which its home leader confirms
	// (homing.View.CheckFinal) though it answers no home read of it
	// (CheckRead).
	final bool
}

// homeTailFor is homeTail for ask.
func (n *Node) homeTailFor(ctx context.Context, d *rangeDriver, ask homeTailAsk) (uint64, error) {
	if d.rep == nil {
		return d.committed.Load(), nil // a region of one without Raft: its own home
	}
	role := d.role()
	if role.home && d.rep.LeaderID() == n.cfg.NodeID {
		return n.leaderHomeTail(ctx, d, ask.final)
	}
	if ask.forwarded {
		return 0, d.hintAddress(d.rep.NotLeaderError())
	}
	var addrs []string
	if role.home {
		if a := n.peerAddr(d.rep.LeaderID()); a != "" && d.rep.LeaderID() != 0 {
			addrs = []string{a}
		}
	} else {
		addrs = n.regionAddrs(role.region)
	}
	if len(addrs) == 0 {
		return 0, apierr.New(apierr.Unavailable, "stream %s range %d: no known leader in the home region %q", d.cfg.stream, d.cfg.rangeID, role.region)
	}
	var last error
	for _, addr := range addrs {
		conn, err := n.peerConn(addr)
		if err != nil {
			last = err
			continue
		}
		octx := metadata.AppendToOutgoingContext(ctx, forwardedKey, "1")
		if ask.final {
			octx = metadata.AppendToOutgoingContext(octx, finalTailKey, "1")
		}
		cctx, cancel := context.WithTimeout(octx, 10*time.Second)
		resp, err := geologv1.NewLogClient(conn).Read(cctx, &geologv1.ReadRequest{Stream: d.cfg.stream, Range: d.cfg.rangeID,
			Consistency: geologv1.Consistency_CONSISTENCY_HOME})
		cancel()
		if err == nil {
			return resp.GetTailOffset(), nil
		}
		last = rpcerr.FromError(err)
	}
	e := apierr.As(last)
	if e.Code == apierr.NotLeader || e.Code == apierr.Unavailable {
		return 0, apierr.New(apierr.Unavailable, "stream %s range %d: the home leader could not confirm its tail: %v", d.cfg.stream, d.cfg.rangeID, last)
	}
	return 0, last
}

// leaderHomeTail is homeTail on the range's home leader: a ReadIndex, then
// the lease check (CheckFinal for a planned rehome's final tail, else
// CheckRead).
func (n *Node) leaderHomeTail(ctx context.Context, d *rangeDriver, final bool) (uint64, error) {
	done := make(chan struct{})
	var tail uint64
	var rerr error
	if err := d.exec(ctx, func() {
		d.rep.ReadIndex(func(end uint64, err error) { tail, rerr = end, err; close(done) })
	}); err != nil {
		return 0, err
	}
	select {
	case <-done:
	case <-ctx.Done():
		return 0, apierr.Wrap(apierr.Timeout, ctx.Err(), "confirming the home tail")
	}
	if rerr != nil {
		return 0, d.hintAddress(rerr)
	}
	if n.homing == nil {
		return tail, nil
	}
	// As for an ack (DESIGN.md "Fencing"): confirmed under a lease that
	// may have expired, the tail may miss appends another region acked
	// after taking the range over; and a range stopped for a planned move
	// answers only its coordinator (homing.View.CheckRead).
	check := n.homing.homes.CheckRead
	if final {
		check = n.homing.homes.CheckFinal
	}
	if _, err := check(d.cfg.stream, d.cfg.rangeID); err != nil {
		if errors.Is(err, homing.ErrNotHome) {
			return 0, n.notHome(d)
		}
		return 0, homingErr(err)
	}
	return tail, nil
}
