package regionsvc

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/compact"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Compaction by key (package compact, docs/compaction.md) in a node: a
// stream whose cleanup policy includes compact gives each of its range
// drivers a keyCompactor. On every maintenance tick the driver
//
//  1. takes the result of its last cleaner job, if one came back;
//  2. on the range's home leader, asks compact.Decide whether a decision
//     is due and proposes it as a marker, as an append (lease and epoch
//     checks included);
//  3. on every copy, once a decision newer than the one it last completed
//     is applied (a Raft replica: Replica.KeyCompaction; a single node:
//     its marker durable), readies the log (Replica.PrepareRewrite, or
//     sealing the segments below the point) and submits a job to the
//     node's one cleaner, which rewrites segments in the background at a
//     bounded rate.

// compactionConfig is what a compacting range's driver needs from the node.
type compactionConfig struct {
	policy  compact.Policy
	cleaner *compact.Cleaner
	// regions is how many regions the stream is in; floor returns the
	// lowest applied end of its mirrors, ok only when every mirror's is
	// known (see Node.compactionFloor).
	regions int
	floor   func() (uint64, bool)
	// admit returns the epoch this node may append to the range at now
	// (Node.admit), or why it may not.
	admit func(d *rangeDriver) (uint64, error)
	// onResult, if set, is told every job's result (metrics, tests).
	onResult func(compact.Result)
}

// keyCompactor is a range driver's compaction state, owned by the driver
// goroutine.
type keyCompactor struct {
	cfg compactionConfig
	// applied is the newest decision applied to this copy; proposed the
	// newest this node proposed (applied or not), decidedAt when this node
	// last proposed or first saw a new one; markerEnd the offset after the
	// newest marker known (0: unknown).
	applied, proposed batch.Compaction
	decidedAt         int64
	markerEnd         uint64
	proposing         bool
	// cleaned is the decision this copy last completed; running says a job
	// is queued or running, done receives its result.
	cleaned batch.Compaction
	running bool
	done    chan compact.Result
}

func newKeyCompactor(cfg compactionConfig) *keyCompactor {
	return &keyCompactor{cfg: cfg, done: make(chan compact.Result, 1)}
}

// compactByKey runs steps 1-3 above; for the driver goroutine.
func (d *rangeDriver) compactByKey() {
	k := d.keyc
	if k == nil || d.failure.Load() != nil {
		return
	}
	select {
	case res := <-k.done:
		k.running = false
		if res.Err == nil && res.Complete {
			k.cleaned = res.Decision
		}
		if k.cfg.onResult != nil {
			k.cfg.onResult(res)
		}
	default:
	}
	now := d.cfg.now().UnixNano()
	if a := d.rep.KeyCompaction(); a.Point > k.applied.Point {
		k.applied, k.decidedAt = a, max(k.decidedAt, now)
		k.markerEnd = max(k.markerEnd, d.rep.KeyCompactionMarkerEnd())
	}
	d.maybeDecide(now)
	d.maybeClean()
}

// maybeDecide proposes a compaction marker when this node leads the range
// in its home region and a decision is due.
func (d *rangeDriver) maybeDecide(now int64) {
	k := d.keyc
	if k.proposing || !d.isHome() || !d.rep.IsLeader() {
		return
	}
	epoch, err := k.cfg.admit(d)
	if err != nil {
		return
	}
	last := k.applied
	if k.proposed.Point > last.Point {
		last = k.proposed
	}
	committed := d.committed.Load()
	p := k.cfg.policy.WithDefaults()
	lag, err := d.store.OffsetForTime(now - int64(max(p.MinLag, 0)))
	if err != nil {
		d.logger.Warn("compaction: offset for the minimum lag", "error", err)
		return
	}
	in := compact.Inputs{NowUnixNanos: now, Last: last, LastUnixNanos: k.decidedAt, MarkerEnd: k.markerEnd,
		Committed: committed, LagPoint: min(lag, committed), Regions: k.cfg.regions}
	if k.cfg.floor != nil {
		in.Floor, in.FloorKnown = k.cfg.floor()
	}
	dec, ok := compact.Decide(p, in)
	if !ok {
		return
	}
	k.proposing, k.proposed, k.decidedAt = true, dec, now
	op := &appendOp{recordCount: 1, epoch: epoch, frame: batch.EncodeCompaction(nil, batch.Header{}, dec)}
	op.reply = func(r appendResult) {
		k.proposing = false
		if r.err != nil {
			d.logger.Debug("compaction marker not appended", "point", dec.Point, "error", r.err)
			return
		}
		k.markerEnd = max(k.markerEnd, r.baseOffset+1)
		d.logger.Debug("compaction decided", "point", dec.Point, "offset", r.baseOffset)
	}
	d.propose(op)
}

// maybeClean submits a cleaner job for the applied decision if this copy
// has not completed it and no job is in flight.
func (d *rangeDriver) maybeClean() {
	k := d.keyc
	dec := k.applied
	if k.running || dec.Point == 0 || dec == k.cleaned {
		return
	}
	limit, err := d.rep.PrepareRewrite(dec.Point)
	if err != nil {
		d.logger.Warn("compaction: prepare the log", "point", dec.Point, "error", err)
		return
	}
	if limit == 0 {
		return // nothing the log lets go of yet
	}
	job := compact.Job{Name: fmt.Sprintf("%s/%d", d.cfg.stream, d.cfg.rangeID), Log: rewriteLog{d.store, &d.rewriteMu}, Decision: dec, Limit: limit,
		Done: func(r compact.Result) {
			select {
			case k.done <- r:
			default: // one job per range at a time: never full
			}
		}}
	if err := k.cfg.cleaner.Submit(job); err == nil {
		k.running = true
	}
}

// compactionFloor is the lowest offset every other region of a stream has
// applied, as this node's replicator tasks (it leads the range) know it;
// ok only if it runs one for every such region.
func (n *Node) compactionFloor(stream string, rng uint32, regions int) (uint64, bool) {
	repl := n.repl.Load()
	if repl == nil {
		return 0, false
	}
	progress := repl.progress(stream, rng, n.cfg.Now())
	if len(progress) < regions-1 {
		return 0, false
	}
	floor := uint64(math.MaxUint64)
	for _, p := range progress {
		floor = min(floor, p.GetAppliedEndOffset())
	}
	return floor, true
}

// compactionConfigFor returns the compaction configuration of range r of
// spec, or nil if the stream does not compact.
func (n *Node) compactionConfigFor(spec streamSpec, r uint32) *compactionConfig {
	if !spec.compacts() {
		return nil
	}
	regions := len(spec.Regions)
	return &compactionConfig{
		policy: compact.Policy{
			MinLag:            millisPolicy(spec.MinCompactionLagMillis),
			DeleteRetention:   millisPolicy(spec.DeleteRetentionMillis),
			ProducerRetention: n.cfg.ProducerStateTTL,
			Interval:          n.cfg.CompactionInterval,
		},
		cleaner:  n.cleaner,
		regions:  regions,
		floor:    func() (uint64, bool) { return n.compactionFloor(spec.Name, r, regions) },
		admit:    n.admit,
		onResult: n.compactionResult,
	}
}

// millisPolicy turns a stored setting into a compact.Policy duration: 0 is
// the default, -1 zero.
func millisPolicy(ms int64) time.Duration {
	if ms < 0 {
		return -1
	}
	return time.Duration(ms) * time.Millisecond
}

// compactionMetrics are the node's compaction instruments.
type compactionMetrics struct {
	jobs      metric.Int64Counter
	reclaimed metric.Int64Counter
	io        metric.Int64Counter
}

func newCompactionMetrics(mp metric.MeterProvider) (*compactionMetrics, error) {
	m := mp.Meter("github.com/geolog/geolog/regionsvc")
	var cm compactionMetrics
	var err error
	if cm.jobs, err = m.Int64Counter("geolog.compaction.jobs",
		metric.WithDescription("compaction by key jobs by result (complete, partial, error)")); err != nil {
		return nil, err
	}
	if cm.reclaimed, err = m.Int64Counter("geolog.compaction.reclaimed_bytes",
		metric.WithDescription("segment bytes compaction by key removed"), metric.WithUnit("By")); err != nil {
		return nil, err
	}
	if cm.io, err = m.Int64Counter("geolog.compaction.io_bytes",
		metric.WithDescription("bytes compaction by key read and wrote"), metric.WithUnit("By")); err != nil {
		return nil, err
	}
	return &cm, nil
}

// compactionResult records a cleaner job's result in the node's metrics.
func (n *Node) compactionResult(res compact.Result) {
	ctx := context.Background()
	result := "complete"
	switch {
	case res.Err != nil:
		result = "error"
	case !res.Complete:
		result = "partial"
	}
	n.compactMetrics.jobs.Add(ctx, 1, metric.WithAttributes(attribute.String("result", result)))
	n.compactMetrics.reclaimed.Add(ctx, res.BytesBefore-res.BytesAfter)
	n.compactMetrics.io.Add(ctx, res.BytesIO)
}

// startCleaner starts the node's cleaner; stopCleaner stops it.
func (n *Node) startCleaner() {
	ctx, cancel := context.WithCancel(context.Background())
	n.cleanerStop = cancel
	n.cleanerDone = make(chan struct{})
	go func() {
		defer close(n.cleanerDone)
		n.cleaner.Run(ctx)
	}()
}

func (n *Node) stopCleaner() {
	if n.cleanerStop != nil {
		n.cleanerStop()
		<-n.cleanerDone
	}
}

// sameCleanup reports whether two specs clean up alike (an unset policy
// is delete).
func (s streamSpec) sameCleanup(o streamSpec) bool {
	c1, p1 := s.cleanupInfo()
	c2, p2 := o.cleanupInfo()
	return c1 == c2 && p1.GetDeleteRetentionMs() == p2.GetDeleteRetentionMs() && p1.GetMinLagMs() == p2.GetMinLagMs()
}

// cleanupString is the cleanup policy and its settings, for an error.
func (s streamSpec) cleanupString() string {
	c, p := s.cleanupInfo()
	if p == nil {
		return c.String()
	}
	return fmt.Sprintf("%v (delete_retention_ms %d, min_lag_ms %d)", c, p.GetDeleteRetentionMs(), p.GetMinLagMs())
}

// compacts reports whether the stream's cleanup policy compacts by key.
func (s streamSpec) compacts() bool {
	return s.Cleanup == geologv1.CleanupPolicy_CLEANUP_POLICY_COMPACT ||
		s.Cleanup == geologv1.CleanupPolicy_CLEANUP_POLICY_COMPACT_DELETE
}

// cleanupFromRequest validates a CreateStream request's cleanup settings
// into spec.
func cleanupFromRequest(req *geologv1.CreateStreamRequest, spec *streamSpec) error {
	c := req.GetCleanup()
	if _, ok := geologv1.CleanupPolicy_name[int32(c)]; !ok {
		return apierr.New(apierr.InvalidArgument, "unknown cleanup policy %d", c)
	}
	if c == geologv1.CleanupPolicy_CLEANUP_POLICY_UNSPECIFIED {
		c = geologv1.CleanupPolicy_CLEANUP_POLICY_DELETE
	}
	spec.Cleanup = c
	cp := req.GetCompaction()
	for name, v := range map[string]int64{"delete_retention_ms": cp.GetDeleteRetentionMs(), "min_lag_ms": cp.GetMinLagMs()} {
		if v < -1 {
			return apierr.New(apierr.InvalidArgument, "compaction %s %d: must be -1 (none), 0 (default) or positive", name, v)
		}
	}
	if cp != nil && !spec.compacts() && (cp.GetDeleteRetentionMs() != 0 || cp.GetMinLagMs() != 0) {
		return apierr.New(apierr.InvalidArgument, "compaction settings on a stream whose cleanup policy is %v", c)
	}
	spec.DeleteRetentionMillis, spec.MinCompactionLagMillis = cp.GetDeleteRetentionMs(), cp.GetMinLagMs()
	return nil
}

// cleanupInfo fills a StreamInfo's (or a CreateStreamRequest's) cleanup
// fields from spec.
func (s streamSpec) cleanupInfo() (geologv1.CleanupPolicy, *geologv1.CompactionPolicy) {
	c := s.Cleanup
	if c == geologv1.CleanupPolicy_CLEANUP_POLICY_UNSPECIFIED {
		c = geologv1.CleanupPolicy_CLEANUP_POLICY_DELETE
	}
	if !s.compacts() {
		return c, nil
	}
	return c, &geologv1.CompactionPolicy{DeleteRetentionMs: s.DeleteRetentionMillis, MinLagMs: s.MinCompactionLagMillis}
}

// checkRecordForCleanup refuses a record the stream's cleanup policy
// cannot take: a tombstone with a value (proto3 cannot tell an absent
// value from an empty one, so a tombstone says so explicitly), and in a
// compacted stream a record without a key.
func checkRecordForCleanup(i int, r *geologv1.Record, compacts bool) error {
	if r.GetTombstone() && len(r.GetValue()) > 0 {
		return apierr.New(apierr.InvalidArgument, "record %d is a tombstone with a value of %d bytes", i, len(r.GetValue()))
	}
	if compacts && len(r.GetKey()) == 0 {
		return apierr.New(apierr.KeyRequired, "record %d has no key: the stream is compacted by key", i)
	}
	return nil
}
