package regionsvc

import (
	"context"
	"strings"
	"time"

	"github.com/geolog/geolog/apierr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// nodeMetrics are the node's OpenTelemetry instruments. They are recorded by
// drivers and handlers only; the pure parts (dedup table, segment store) stay
// free of telemetry.
type nodeMetrics struct {
	ackedRecords  metric.Int64Counter
	ackedBytes    metric.Int64Counter
	appendResults metric.Int64Counter
	takeovers     metric.Int64Counter
	rehomePhases  metric.Float64Histogram
	fsyncSeconds  metric.Float64Histogram
	// commitSeconds is an append's time from the driver taking it to its
	// commit (Raft: a majority has it on disk; a region of one: fsynced).
	commitSeconds metric.Float64Histogram
	fsyncRecords  metric.Int64Histogram
	// stageSeconds is an append's time per stage on its leader, by stage
	// (stages.go).
	stageSeconds metric.Float64Histogram
	// peerRefused counts messages from peers refused as invalid, by
	// source ("raft", "mirror").
	peerRefused metric.Int64Counter
	// overloads counts requests refused by a budget or quota, by limit
	// (limits.go).
	overloads metric.Int64Counter
}

var (
	peerRaft   = metric.WithAttributes(attribute.String("source", "raft"))
	peerMirror = metric.WithAttributes(attribute.String("source", "mirror"))
)

func newNodeMetrics(n *Node, mp metric.MeterProvider) (*nodeMetrics, error) {
	m := mp.Meter("github.com/geolog/geolog/regionsvc")
	var nm nodeMetrics
	var err error
	if nm.ackedRecords, err = m.Int64Counter("geolog.append.acked_records",
		metric.WithDescription("records acknowledged to producers (durable)"), metric.WithUnit("{record}")); err != nil {
		return nil, err
	}
	if nm.ackedBytes, err = m.Int64Counter("geolog.append.acked_bytes",
		metric.WithDescription("encoded batch bytes acknowledged"), metric.WithUnit("By")); err != nil {
		return nil, err
	}
	if nm.appendResults, err = m.Int64Counter("geolog.append.requests",
		metric.WithDescription("append requests by result (ok, duplicate, or the error code)")); err != nil {
		return nil, err
	}
	if nm.takeovers, err = m.Int64Counter("geolog.homing.takeovers",
		metric.WithDescription("ranges this node's region took over from a failed home region")); err != nil {
		return nil, err
	}
	if nm.rehomePhases, err = m.Float64Histogram("geolog.homing.rehome_duration",
		metric.WithDescription("planned rehomes this node coordinated: the pause (phase \"pause\") and each of its phases"), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5)); err != nil {
		return nil, err
	}
	if nm.fsyncSeconds, err = m.Float64Histogram("geolog.segment.fsync_duration",
		metric.WithDescription("duration of one group-commit fsync round"), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)); err != nil {
		return nil, err
	}
	if nm.commitSeconds, err = m.Float64Histogram("geolog.append.commit_duration",
		metric.WithDescription("an append's time from its proposal to its commit (a majority of the region's replicas has it on disk)"), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)); err != nil {
		return nil, err
	}
	if nm.fsyncRecords, err = m.Int64Histogram("geolog.segment.fsync_records",
		metric.WithDescription("records made durable by one fsync round"), metric.WithUnit("{record}"),
		metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384)); err != nil {
		return nil, err
	}
	if nm.stageSeconds, err = m.Float64Histogram("geolog.append.stage_duration",
		metric.WithDescription("an append's time on its range leader per stage (admission, queue, leader_write, quorum, ack), each from the end of the one before"), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)); err != nil {
		return nil, err
	}
	if err := nm.addRefusalCounters(m); err != nil {
		return nil, err
	}
	if err := registerRangeGauges(n, m); err != nil {
		return nil, err
	}
	if err := registerGroupMetrics(n, m); err != nil { // groupmetrics.go
		return nil, err
	}
	if err := registerOperatorMetrics(n, m); err != nil { // metrics_ops.go
		return nil, err
	}
	if err := registerRaftTransportMetrics(n, m); err != nil { // raftmetrics.go
		return nil, err
	}
	return &nm, nil
}

// addRefusalCounters makes the counters of what peers and clients were
// refused (peer checks, limits.go).
func (nm *nodeMetrics) addRefusalCounters(m metric.Meter) error {
	var err error
	if nm.peerRefused, err = m.Int64Counter("geolog.peer.refused_messages",
		metric.WithDescription("Raft messages and mirror requests from peers refused (the node changed nothing), by source")); err != nil {
		return err
	}
	nm.overloads, err = m.Int64Counter("geolog.limits.refused_requests",
		metric.WithDescription("requests refused with OVERLOADED or RESOURCE_EXHAUSTED by a budget or quota, or shed for queueing delay (limit queue_delay), by limit"))
	return err
}

var (
	resultOK        = metric.WithAttributes(attribute.String("result", "ok"))
	resultDuplicate = metric.WithAttributes(attribute.String("result", "duplicate"))
)

func (m *nodeMetrics) appendResult(ctx context.Context, r appendResult) {
	switch {
	case r.err != nil:
		m.appendResults.Add(ctx, 1, metric.WithAttributes(attribute.String("result", errorCodeName(r.err))))
	case r.duplicate:
		m.appendResults.Add(ctx, 1, resultDuplicate)
	default:
		m.appendResults.Add(ctx, 1, resultOK)
	}
}

// errorCodeName is the short, lowercase name of err's API code, e.g.
// "sequence_gap".
func errorCodeName(err error) string {
	return strings.ToLower(strings.TrimPrefix(apierr.As(err).Code.String(), "ERROR_CODE_"))
}

// commitDone records an append committed now that was proposed at
// proposedAt.
func (m *nodeMetrics) commitDone(proposedAt time.Time) {
	m.commitSeconds.Record(context.Background(), time.Since(proposedAt).Seconds())
}

// fsyncRound records one log write and its fdatasync, by the writer's
// role in its range when it wrote (leader, or follower writing what its
// leader sent).
func (m *nodeMetrics) fsyncRound(ctx context.Context, took time.Duration, records uint64, leader bool) {
	role := roleFollower
	if leader {
		role = roleLeader
	}
	m.fsyncSeconds.Record(ctx, took.Seconds(), role)
	m.fsyncRecords.Record(ctx, int64(records), role)
}

// recordRehome records a coordinated rehome's pause and its phases.
func (m *nodeMetrics) recordRehome(p *geologv1.RehomePhases, pause time.Duration) {
	if m == nil {
		return
	}
	ctx := context.Background()
	for _, ph := range []struct {
		name   string
		micros int64
	}{{"pause", pause.Microseconds()}, {"prepare", p.GetPrepareMicros()}, {"stop_old", p.GetStopOldMicros()},
		{"catch_up", p.GetCatchUpMicros()}, {"complete", p.GetCompleteMicros()}, {"start_new", p.GetStartNewMicros()}} {
		m.rehomePhases.Record(ctx, float64(ph.micros)/1e6, metric.WithAttributes(attribute.String("phase", ph.name)))
	}
}

// registerRangeGauges registers the per-range gauges (tail, start, size,
// serving, orphaned records and forks), observed from the node's ranges.
func registerRangeGauges(n *Node, m metric.Meter) error {
	tail, err := m.Int64ObservableGauge("geolog.range.tail_offset",
		metric.WithDescription("committed end of the range: the offset the next record gets"))
	if err != nil {
		return err
	}
	start, err := m.Int64ObservableGauge("geolog.range.start_offset",
		metric.WithDescription("first retained offset of the range"))
	if err != nil {
		return err
	}
	size, err := m.Int64ObservableGauge("geolog.range.size_bytes",
		metric.WithDescription("bytes of the range's segments"), metric.WithUnit("By"))
	if err != nil {
		return err
	}
	up, err := m.Int64ObservableGauge("geolog.range.serving",
		metric.WithDescription("1 while the range is served, 0 once it stopped (corruption, I/O error)"))
	if err != nil {
		return err
	}
	orphaned, err := m.Int64ObservableGauge("geolog.range.orphaned_records",
		metric.WithDescription("records moved to the range's orphan log by forks after failovers (the RPO suffered): list and republish them with geolog orphans"),
		metric.WithUnit("{record}"))
	if err != nil {
		return err
	}
	forks, err := m.Int64ObservableGauge("geolog.range.forks",
		metric.WithDescription("forks of the range's log kept in its orphan log"))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		n.mu.RLock()
		defer n.mu.RUnlock()
		for _, st := range n.streams {
			for r, rd := range st.ranges {
				attrs := metric.WithAttributes(attribute.String("stream", st.spec.Name), attribute.Int("range", r))
				serving := int64(1)
				if rd.failure.Load() != nil {
					serving = 0
				}
				o.ObserveInt64(up, serving, attrs)
				if rd.store == nil {
					continue
				}
				o.ObserveInt64(tail, int64(rd.committed.Load()), attrs)
				o.ObserveInt64(start, int64(rd.store.StartOffset()), attrs)
				o.ObserveInt64(size, rd.store.Size(), attrs)
				if rd.rep != nil {
					var recs int64
					fs := rd.rep.Orphans()
					for _, f := range fs {
						recs += int64(f.Records)
					}
					o.ObserveInt64(orphaned, recs, attrs)
					o.ObserveInt64(forks, int64(len(fs)), attrs)
				}
			}
		}
		return nil
	}, tail, start, size, up, orphaned, forks)
	return err
}
