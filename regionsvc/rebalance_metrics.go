package regionsvc

import (
	"context"
	"time"

	"github.com/geolog/geolog/placement"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The rebalancer's metrics (docs/operations.md):
//
//	geolog.rebalance.moves           counter, moves ended, by reason and
//	                                 outcome (done, failed)
//	geolog.rebalance.moves_in_flight gauge, moves under way (catalogue leader)
//	geolog.rebalance.move.duration   histogram, seconds per move, by outcome
//	geolog.rebalance.dead_nodes      gauge, nodes taken as dead by this node
type rebalanceMetrics struct {
	moves    metric.Int64Counter
	duration metric.Float64Histogram
}

func (rb *rebalancer) registerMetrics(mp metric.MeterProvider) error {
	m := mp.Meter("github.com/geolog/geolog/regionsvc")
	var rm rebalanceMetrics
	var err error
	if rm.moves, err = m.Int64Counter("geolog.rebalance.moves",
		metric.WithDescription("replica moves the rebalancer ended, by reason (repair, drain, spread, balance, excess) and outcome (done, failed)"),
		metric.WithUnit("{move}")); err != nil {
		return err
	}
	if rm.duration, err = m.Float64Histogram("geolog.rebalance.move.duration",
		metric.WithDescription("time from a move's start to its end (learner, catch-up, promote, remove), by outcome"),
		metric.WithUnit("s")); err != nil {
		return err
	}
	inFlight, err := m.Int64ObservableGauge("geolog.rebalance.moves_in_flight",
		metric.WithDescription("replica moves under way (only the catalogue leader has any)"), metric.WithUnit("{move}"))
	if err != nil {
		return err
	}
	dead, err := m.Int64ObservableGauge("geolog.rebalance.dead_nodes",
		metric.WithDescription("nodes this node takes as dead (unreachable past the dead-node time)"), metric.WithUnit("{node}"))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := rb.snapshotStatus()
		o.ObserveInt64(inFlight, int64(len(st.moves)))
		o.ObserveInt64(dead, int64(len(st.dead)))
		return nil
	}, inFlight, dead)
	rb.metrics = &rm
	return err
}

// ended counts a move's end.
func (rm *rebalanceMetrics) ended(why placement.Reason, err error, took time.Duration) {
	outcome := "done"
	if err != nil {
		outcome = "failed"
	}
	ctx := context.Background()
	rm.moves.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", why.String()), attribute.String("outcome", outcome)))
	rm.duration.Record(ctx, took.Seconds(), metric.WithAttributes(attribute.String("outcome", outcome)))
}
