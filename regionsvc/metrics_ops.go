package regionsvc

import (
	"context"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"golang.org/x/sys/unix"
)

// The gauges an operator alerts on (docs/operations.md lists them with
// their units and labels, and deploy/prometheus/alerts.yml the rules over
// them):
//
//	geolog.node.ready                    1 while Node.Ready holds
//	geolog.node.unready_ranges           ranges Ready finds unserved
//	geolog.disk.free_bytes, .total_bytes the data directory's file system
//	geolog.replication.lag.seconds       a mirror's time lag behind its home
//	geolog.replication.lag.records       its offset lag
//	geolog.replication.mirrors_released  home ranges led here whose mirror in a region is past the hold bound
//	geolog.replication.mirrors_behind_start  ... whose mirror is behind the home's log start
//	geolog.range.leader                  1 where this node leads the range's group
//	geolog.range.home                    1 where the range is homed in this region
//	geolog.range.epoch                   the range's homing epoch as known here
//	geolog.range.lease_held              the home leader's lease check (homing on)
//	geolog.homing.lease_remaining        seconds this node may still ack (homing on)
//
// Every series is observed at collection from published state (atomics,
// the replicator's trackers); nothing is counted on the append path.

// opsGauges are the instruments registerOperatorMetrics observes.
type opsGauges struct {
	ready, unready             metric.Int64ObservableGauge
	diskFree, diskTotal        metric.Int64ObservableGauge
	lagSeconds                 metric.Float64ObservableGauge
	lagRecords                 metric.Int64ObservableGauge
	leader, home, epoch, lease metric.Int64ObservableGauge
	leaseRemaining             metric.Float64ObservableGauge
	// released and behindStart count home ranges led here by mirror
	// region (mirrorhold.go).
	released, behindStart metric.Int64ObservableGauge
}

func (g *opsGauges) instruments() []metric.Observable {
	return []metric.Observable{g.ready, g.unready, g.diskFree, g.diskTotal, g.lagSeconds, g.lagRecords,
		g.leader, g.home, g.epoch, g.lease, g.leaseRemaining, g.released, g.behindStart}
}

func newOpsGauges(m metric.Meter) (*opsGauges, error) {
	var g opsGauges
	ints := []struct {
		dst              *metric.Int64ObservableGauge
		name, desc, unit string
	}{
		{&g.ready, "geolog.node.ready", "1 while the node serves every range it should and its catalogue caught up (/readyz), else 0", ""},
		{&g.unready, "geolog.node.unready_ranges", "ranges of this node that are not served, or have no leader or home yet (the catalogue counts as one)", "{range}"},
		{&g.diskFree, "geolog.disk.free_bytes", "bytes free for the node on the file system of its data directory", "By"},
		{&g.diskTotal, "geolog.disk.total_bytes", "size of the file system of the node's data directory", "By"},
		{&g.lagRecords, "geolog.replication.lag.records", "records a region's mirror of a range lacks of its home's committed tail, by stream, range, the mirror's region and the side reporting (home: the home leader's replicator; mirror: the mirror leader)", "{record}"},
		{&g.leader, "geolog.range.leader", "1 where this node leads the range's Raft group in its region, else 0", ""},
		{&g.home, "geolog.range.home", "1 where the range is homed in this node's region, else 0", ""},
		{&g.epoch, "geolog.range.epoch", "the range's homing epoch as this node knows it", ""},
		{&g.released, "geolog.replication.mirrors_released", "home ranges led by this node whose mirror in the region (label region) is further behind than the stream's mirror hold bound: the home's retention no longer waits for it", "{range}"},
		{&g.behindStart, "geolog.replication.mirrors_behind_start", "home ranges led by this node whose mirror in the region (label region) has its applied end below the home's log start: retention deleted records it never received", "{range}"},
		{&g.lease, "geolog.range.lease_held", "on the home leader of a range, with homing: 1 while its lease lets it acknowledge, else 0", ""},
	}
	var err error
	for _, d := range ints {
		opts := []metric.Int64ObservableGaugeOption{metric.WithDescription(d.desc)}
		if d.unit != "" {
			opts = append(opts, metric.WithUnit(d.unit))
		}
		if *d.dst, err = m.Int64ObservableGauge(d.name, opts...); err != nil {
			return nil, err
		}
	}
	if g.lagSeconds, err = m.Float64ObservableGauge("geolog.replication.lag.seconds",
		metric.WithDescription("how far a region's mirror of a range trails its home in time: now less the home time of the newest tail it holds (grows while nothing arrives)"),
		metric.WithUnit("s")); err != nil {
		return nil, err
	}
	if g.leaseRemaining, err = m.Float64ObservableGauge("geolog.homing.lease_remaining",
		metric.WithDescription("with homing: seconds this node may still acknowledge under its region's liveness lease by its own clock (0 or less: it may not)"),
		metric.WithUnit("s")); err != nil {
		return nil, err
	}
	return &g, nil
}

// registerOperatorMetrics adds the gauges above to the node's meter.
func registerOperatorMetrics(n *Node, m metric.Meter) error {
	g, err := newOpsGauges(m)
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		n.observeOps(o, g)
		return nil
	}, g.instruments()...)
	return err
}

// observedRange is a range as a collection sees it.
type observedRange struct {
	spec streamSpec
	r    uint32
	d    *rangeDriver
}

func (n *Node) observeOps(o metric.Observer, g *opsGauges) {
	ready, _ := n.Ready()
	o.ObserveInt64(g.ready, boolGauge(ready))
	if free, total, err := diskSpace(n.cfg.DataDir); err == nil {
		o.ObserveInt64(g.diskFree, free)
		o.ObserveInt64(g.diskTotal, total)
	}
	// The rest reads what Start sets up (the region, homing, the
	// replicator): a collection while the node opens (geologd serves
	// /metrics from the start) reports only the above.
	if !n.serving.Load() {
		return
	}
	unready := int64(0)
	if !ready {
		unready = int64(n.unreadyRanges())
	}
	o.ObserveInt64(g.unready, unready)
	if n.homing != nil {
		left := 0.0
		if until := n.homing.homes.MayServeUntil(); !until.IsZero() {
			left = until.Sub(n.cfg.Now()).Seconds()
		}
		o.ObserveFloat64(g.leaseRemaining, left)
	}
	// The ranges are taken under the read lock and observed outside it:
	// the replicator's progress takes its own lock.
	var all []observedRange
	n.mu.RLock()
	for _, st := range n.streams {
		for r, d := range st.ranges {
			all = append(all, observedRange{st.spec, uint32(r), d})
		}
	}
	n.mu.RUnlock()
	holds := map[string]*[2]int64{} // by mirror region: released, behind the start
	for _, region := range n.knownRegions() {
		holds[region] = &[2]int64{}
	}
	for _, or := range all {
		n.observeRange(o, g, or, holds)
	}
	for region, c := range holds {
		a := metric.WithAttributes(attribute.String("region", region))
		o.ObserveInt64(g.released, c[0], a)
		o.ObserveInt64(g.behindStart, c[1], a)
	}
}

func (n *Node) observeRange(o metric.Observer, g *opsGauges, or observedRange, holds map[string]*[2]int64) {
	d := or.d
	attrs := metric.WithAttributes(attribute.String("stream", or.spec.Name), attribute.Int("range", int(or.r)))
	role := d.role()
	o.ObserveInt64(g.home, boolGauge(role.home), attrs)
	o.ObserveInt64(g.epoch, int64(role.epoch), attrs)
	leads := d.rep == nil || d.rep.LeaderID() == n.cfg.NodeID
	o.ObserveInt64(g.leader, boolGauge(leads && d.failure.Load() == nil), attrs)
	if n.homing != nil && role.home && leads && d.rep != nil {
		_, err := n.homing.homes.Check(or.spec.Name, or.r)
		o.ObserveInt64(g.lease, boolGauge(err == nil), attrs)
	}
	if n.repl.Load() == nil || d.rep == nil || d.failure.Load() != nil {
		return
	}
	side := "mirror"
	if role.home {
		side = "home"
	}
	for _, p := range n.rangeReplication(or.spec, or.r, d) {
		la := metric.WithAttributes(attribute.String("stream", or.spec.Name), attribute.Int("range", int(or.r)),
			attribute.String("region", p.GetRegion()), attribute.String("side", side))
		o.ObserveFloat64(g.lagSeconds, float64(p.GetTimeLagMillis())/1000, la)
		o.ObserveInt64(g.lagRecords, int64(p.GetOffsetLag()), la)
		if role.home {
			c := holds[p.GetRegion()]
			if c == nil {
				c = &[2]int64{}
				holds[p.GetRegion()] = c
			}
			c[0] += boolGauge(p.GetHoldReleased())
			c[1] += boolGauge(p.GetBehindLogStart())
		}
	}
}

// unreadyRanges counts the ranges (the catalogue included) Ready finds
// wanting.
func (n *Node) unreadyRanges() int {
	count := 0
	if n.replicated() {
		meta := n.region.meta
		if meta.failure.Load() != nil || meta.rep.LeaderID() == 0 || n.region.metaApplied.Load() < meta.committed.Load() {
			count++
		}
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	for _, st := range n.streams {
		for _, d := range st.ranges {
			if n.rangeUnready(d) != "" {
				count++
			}
		}
	}
	return count
}

func boolGauge(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// diskSpace returns the bytes free to an unprivileged writer and the size
// of the file system holding dir.
func diskSpace(dir string) (free, total int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), int64(st.Blocks) * int64(st.Bsize), nil
}
