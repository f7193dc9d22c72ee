package regionsvc

import (
	"context"

	"github.com/geolog/geolog/cursors"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// groupLagSeriesMax bounds the lag series one node reports per collection
// (groups × ranges); past it the rest are left out.
const groupLagSeriesMax = 10_000

// registerGroupMetrics adds the consumer-group gauges to the node's meter:
// every node that leads a copy of a cursor range (the coordinator at home,
// the mirror leader elsewhere) reports, for each group of that range, each
// range's lag behind its own region's copy of the group's stream, with the
// region as an attribute:
//
//	geolog.group.lag.records  records past the group's position
//	geolog.group.lag.seconds  age of the oldest of them
//	geolog.group.members      members of the group
func registerGroupMetrics(n *Node, m metric.Meter) error {
	lagRecords, err := m.Int64ObservableGauge("geolog.group.lag.records",
		metric.WithDescription("records of a range past a consumer group's committed position, on this region's copy"), metric.WithUnit("{record}"))
	if err != nil {
		return err
	}
	lagSeconds, err := m.Float64ObservableGauge("geolog.group.lag.seconds",
		metric.WithDescription("age of the oldest record of a range a consumer group has not processed (0 when caught up)"), metric.WithUnit("s"))
	if err != nil {
		return err
	}
	members, err := m.Int64ObservableGauge("geolog.group.members", metric.WithDescription("members of a consumer group"))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		series := 0
		for _, g := range n.reportedGroups() {
			ga := attribute.String("group", g.name)
			o.ObserveInt64(members, int64(g.members), metric.WithAttributes(ga, attribute.String("region", n.cfg.Region)))
			for _, rl := range n.groupRangeLags(ctx, g) {
				if series++; series > groupLagSeriesMax {
					return nil
				}
				attrs := metric.WithAttributes(ga, attribute.String("stream", g.stream), attribute.Int("range", int(rl.rng)),
					attribute.String("region", n.cfg.Region))
				o.ObserveInt64(lagRecords, int64(rl.records), attrs)
				o.ObserveFloat64(lagSeconds, float64(rl.millis)/1000, attrs)
			}
		}
		return nil
	}, lagRecords, lagSeconds, members)
	return err
}

// reportedGroup is a group this node reports on.
type reportedGroup struct {
	name, stream string
	rangeCount   uint32
	members      int
	positions    []cursors.Position
}

// reportedGroups are the groups of the cursor ranges whose copy this node
// leads.
func (n *Node) reportedGroups() []reportedGroup {
	if n.cursors == nil {
		return nil
	}
	var out []reportedGroup
	for _, cr := range n.cursors.all() {
		if cr.d.rep != nil && cr.d.rep.LeaderID() != n.cfg.NodeID {
			continue
		}
		cr.read(func(s *cursors.State) {
			for _, name := range s.Groups() {
				g := s.Group(name)
				if g.Stream == "" {
					continue
				}
				out = append(out, reportedGroup{name: name, stream: g.Stream, rangeCount: g.RangeCount, members: len(g.Members),
					positions: s.Positions(name, g.Stream)})
			}
		})
	}
	return out
}

type rangeLagFigure struct {
	rng     uint32
	records uint64
	millis  int64
}

// groupRangeLags is each range's lag of g on this node's copy of its
// stream (none if the stream is not placed here).
func (n *Node) groupRangeLags(ctx context.Context, g reportedGroup) []rangeLagFigure {
	n.mu.RLock()
	st, ok := n.streams[g.stream]
	n.mu.RUnlock()
	if !ok {
		return nil
	}
	now := n.cfg.Now()
	var out []rangeLagFigure
	for r := uint32(0); r < g.rangeCount && int(r) < len(st.ranges); r++ {
		var committed uint64
		for _, p := range g.positions {
			if p.Range == r {
				committed = p.Offset
			}
		}
		_, records, millis := rangeLag(st.ranges[r], committed, now)
		out = append(out, rangeLagFigure{rng: r, records: records, millis: millis})
	}
	return out
}
