package regionsvc

import (
	"context"
	"sync"
	"testing"
	"time"

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

// TestMetricsReplicatedRegion: in a 3-node region, an acked append is
// counted once, by the node that acked it (the range's leader), not again
// by the followers that persisted it; a retried copy counts as a
// duplicate, not as acked records.
func TestMetricsReplicatedRegion(t *testing.T) {
	var mu sync.Mutex
	readers := map[uint64]*sdkmetric.ManualReader{}
	tr := newTestRegionWith(t, 3, 3, func(cfg *Config) {
		r := sdkmetric.NewManualReader()
		mu.Lock()
		readers[cfg.NodeID] = r
		mu.Unlock()
		cfg.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tr.retry(ctx, "create", func(ctx context.Context, c geologv1.LogClient) error {
		_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "m", RangeCount: 1})
		return err
	})
	for i := range 3 {
		tr.retry(ctx, "append", func(ctx context.Context, c geologv1.LogClient) error {
			_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "m", Range: 0, Records: recs("a", 4), ProducerId: 9, BaseSequence: uint64(4 * i)})
			return err
		})
	}
	tr.retry(ctx, "append again", func(ctx context.Context, c geologv1.LogClient) error {
		resp, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "m", Range: 0, Records: recs("a", 4), ProducerId: 9, BaseSequence: 4})
		if err == nil && !resp.GetDuplicate() {
			t.Errorf("a retried batch was not answered as a duplicate: %v", resp)
		}
		return err
	})
	acked, duplicates, nodes := int64(0), int64(0), 0
	for id, r := range readers {
		var rm metricdata.ResourceMetrics
		if err := r.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		mine := int64(0)
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				d, ok := m.Data.(metricdata.Sum[int64])
				if !ok {
					continue
				}
				for _, p := range d.DataPoints {
					switch m.Name {
					case "geolog.append.acked_records":
						mine += p.Value
					case "geolog.append.requests":
						if v, _ := p.Attributes.Value("result"); v.AsString() == "duplicate" {
							duplicates += p.Value
						}
					}
				}
			}
		}
		t.Logf("node %d: %d acked records", id, mine)
		acked += mine
		if mine > 0 {
			nodes++
		}
	}
	// A retried attempt (one that timed out on a starved machine) is
	// answered as a duplicate too: at least the one sent on purpose.
	if acked != 12 || duplicates < 1 {
		t.Errorf("acked records %d over %d nodes and %d duplicates, want 12 and at least 1", acked, nodes, duplicates)
	}
}
