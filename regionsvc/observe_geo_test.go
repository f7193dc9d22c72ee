package regionsvc

import (
	"context"
	"fmt"
	"testing"
	"time"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/wan"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestShipmentSpansAndLag: two regions of one node, a stream homed in
// us. Appends at home are shipped to eu: the home's task records a
// geolog.replicator.ship span per batch, ended once eu's applied end
// covers it, and eu records a geolog.replicator.apply span per batch
// applied. The replication lag gauges report eu's mirror from both
// sides; with the link cut, eu's time lag grows past the cut's length
// and its record lag counts what it misses.
func TestShipmentSpansAndLag(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	recs1 := map[string]*tracetest.SpanRecorder{}
	readers := map[string]*sdkmetric.ManualReader{}
	w := newWorldWith(t, []string{"us", "eu"}, 1, 5*time.Millisecond, 0, nil, func(region string, _ uint64, cfg *Config) {
		recs1[region] = tracetest.NewSpanRecorder()
		cfg.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recs1[region]))
		readers[region] = sdkmetric.NewManualReader()
		cfg.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(readers[region]))
	})
	homes := createGeoStream(t, ctx, w, "ship", 2)
	if homes[0] != "us" {
		t.Fatalf("range 0 homed in %s, want us", homes[0])
	}
	for i := range 5 {
		if _, err := w.conns["us"][1].Append(ctx, &geologv1.AppendRequest{Stream: "ship", Range: 0, Records: recs(fmt.Sprintf("s%d", i), 2)}); err != nil {
			t.Fatal(err)
		}
	}
	shippedTo := func(region string, name string) (end int64) {
		for _, s := range recs1[region].Ended() {
			if s.Name() != name || want(s, "geolog.stream") != "ship" || want(s, "geolog.range") != "0" || s.SpanKind() == trace.SpanKindServer {
				continue
			}
			var e int64
			fmt.Sscan(want(s, "geolog.end_offset"), &e)
			end = max(end, e)
		}
		return end
	}
	waitUntil(t, ctx, time.Minute, "shipment spans of offsets [0, 10) at home and in eu", func() bool {
		return shippedTo("us", "geolog.replicator.ship") >= 10 && shippedTo("eu", "geolog.replicator.apply") >= 10
	})
	for _, s := range recs1["us"].Ended() {
		if s.Name() == "geolog.replicator.ship" && (want(s, "geolog.region") != "eu" || s.SpanKind() != trace.SpanKindProducer) {
			t.Errorf("ship span: %v %v", s.SpanKind(), s.Attributes())
		}
	}

	// Caught up: both sides report eu's mirror with no record lag.
	waitUntil(t, ctx, time.Minute, "lag gauges of a caught-up mirror", func() bool {
		h, m := replicationLag(t, readers["us"], "eu", "home"), replicationLag(t, readers["eu"], "eu", "mirror")
		return h.ok && m.ok && h.records == 0 && m.records == 0
	})
	// The replicated write path records its rounds and commits.
	if fsyncs, commits := histogramCount(t, readers["us"], "geolog.segment.fsync_duration"), histogramCount(t, readers["us"], "geolog.append.commit_duration"); fsyncs == 0 || commits < 5 {
		t.Errorf("home: %d fsync rounds, %d commits recorded; want some and at least 5", fsyncs, commits)
	}
	l, err := w.net.Link("us->eu.n1")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Cut(wan.CutBlackhole); err != nil {
		t.Fatal(err)
	}
	cutAt := time.Now()
	for i := range 3 {
		if _, err := w.conns["us"][1].Append(ctx, &geologv1.AppendRequest{Stream: "ship", Range: 0, Records: recs(fmt.Sprintf("c%d", i), 1)}); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, ctx, time.Minute, "home's lag of the cut-off mirror: 3 records", func() bool {
		return replicationLag(t, readers["us"], "eu", "home").records == 3
	})
	time.Sleep(time.Second) // the time lag must outgrow this
	m := replicationLag(t, readers["eu"], "eu", "mirror")
	if !m.ok || m.seconds < time.Since(cutAt).Seconds()-0.5 {
		t.Fatalf("eu's own time lag %.3f s (reported %v) after a cut %v ago", m.seconds, m.ok, time.Since(cutAt))
	}
}

type lagPoint struct {
	ok      bool
	seconds float64
	records int64
}

// replicationLag collects r and returns range 0 of stream ship's lag in
// region as side reports it.
func replicationLag(t *testing.T, r *sdkmetric.ManualReader, region, side string) lagPoint {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	ours := func(set attribute.Set) bool {
		return attrIs(set, "stream", "ship") && attrIs(set, "range", "0") && attrIs(set, "region", region) && attrIs(set, "side", side)
	}
	var p lagPoint
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Gauge[float64]:
				for _, dp := range d.DataPoints {
					if m.Name == "geolog.replication.lag.seconds" && ours(dp.Attributes) {
						p.ok, p.seconds = true, dp.Value
					}
				}
			case metricdata.Gauge[int64]:
				for _, dp := range d.DataPoints {
					if m.Name == "geolog.replication.lag.records" && ours(dp.Attributes) {
						p.records = dp.Value
					}
				}
			}
		}
	}
	return p
}

// attrIs reports whether set has key with the value v (as emitted).
func attrIs(set attribute.Set, key, v string) bool {
	got, ok := set.Value(attribute.Key(key))
	return ok && got.Emit() == v
}

// histogramCount collects r and returns the count of histogram name.
func histogramCount(t *testing.T, r *sdkmetric.ManualReader, name string) uint64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == name {
				for _, dp := range h.DataPoints {
					n += dp.Count
				}
			}
		}
	}
	return n
}
