package regionsvc

import (
	"context"
	"testing"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

func TestMetrics(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	_, c := testNode(t, t.TempDir(), func(cfg *Config) { cfg.MeterProvider = mp })
	createStream(t, c, "m", 2)
	ctx := ctxT(t)
	for i := 0; i < 3; i++ {
		if _, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "m", Range: 1, Records: recs("a", 4), ProducerId: 9, BaseSequence: uint64(4 * i)}); err != nil {
			t.Fatal(err)
		}
	}
	// A duplicate and a rejected request are counted by result.
	c.Append(ctx, &geologv1.AppendRequest{Stream: "m", Range: 1, Records: recs("a", 4), ProducerId: 9, BaseSequence: 0})
	c.Append(ctx, &geologv1.AppendRequest{Stream: "m", Range: 1})

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	sums := map[string]int64{}
	results := map[string]int64{}
	tails := map[int64]int64{}
	fsyncRounds := uint64(0)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					sums[m.Name] += p.Value
					if m.Name == "geolog.append.requests" {
						v, _ := p.Attributes.Value("result")
						results[v.AsString()] += p.Value
					}
				}
			case metricdata.Gauge[int64]:
				if m.Name == "geolog.range.tail_offset" {
					for _, p := range d.DataPoints {
						r, _ := p.Attributes.Value("range")
						tails[r.AsInt64()] = p.Value
					}
				}
			case metricdata.Histogram[float64]:
				if m.Name == "geolog.segment.fsync_duration" {
					for _, p := range d.DataPoints {
						fsyncRounds += p.Count
					}
				}
			}
		}
	}
	if sums["geolog.append.acked_records"] != 12 {
		t.Errorf("acked records %d, want 12", sums["geolog.append.acked_records"])
	}
	if results["ok"] != 3 || results["duplicate"] != 1 || results["empty_batch"] != 1 {
		t.Errorf("results %v", results)
	}
	if tails[1] != 12 || tails[0] != 0 {
		t.Errorf("tails %v", tails)
	}
	if fsyncRounds == 0 {
		t.Error("no fsync round recorded")
	}
}
