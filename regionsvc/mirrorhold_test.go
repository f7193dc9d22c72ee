package regionsvc

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/wan"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// TestMirrorHoldDefaults: the hold bound defaults to twice the retention
// of its kind, none without one; -1 is none; an explicit bound stands.
func TestMirrorHoldDefaults(t *testing.T) {
	for _, c := range []struct {
		spec streamSpec
		want mirrorHold
	}{
		{streamSpec{}, mirrorHold{}},
		{streamSpec{RetentionBytes: 100, RetentionAgeMillis: 1000}, mirrorHold{bytes: 200, age: 2 * time.Second}},
		{streamSpec{RetentionBytes: 100, MirrorHoldBytes: -1, MirrorHoldAgeMillis: 5}, mirrorHold{age: 5 * time.Millisecond}},
		{streamSpec{MirrorHoldBytes: 7}, mirrorHold{bytes: 7}},
	} {
		if got := c.spec.mirrorHold(); got != c.want {
			t.Errorf("%+v: hold %+v, want %+v", c.spec, got, c.want)
		}
	}
	h := mirrorHold{bytes: 10, age: time.Second}
	if h.exceeded(10, time.Second) || !h.exceeded(11, 0) || !h.exceeded(0, 2*time.Second) || (mirrorHold{}).exceeded(1<<40, time.Hour) {
		t.Error("exceeded is not strictly past either bound")
	}
	for _, bad := range [][2]int64{{-2, 0}, {0, -2}, {retentionBytesMax + 1, 0}} {
		if checkMirrorHold(bad[0], bad[1]) == nil {
			t.Errorf("mirror hold %v accepted", bad)
		}
	}
}

// TestMirrorHoldBound: with the eu region cut off, the us home of two
// streams keeps writing. The stream whose hold bound the backlog passes
// ("released") lets retention run on: the home's log start passes eu's
// applied end, and the home says so (hold_released, behind_log_start, the
// gauges). The stream whose bound the backlog stays within ("held") keeps
// its log from eu's applied end, though its retention would delete it.
func TestMirrorHoldBound(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	reader := sdkmetric.NewManualReader()
	w := newWorldWith(t, []string{"us", "eu"}, 1, 2*time.Millisecond, 0, nil, func(region string, _ uint64, cfg *Config) {
		cfg.SegmentBytesMax = 8 << 10
		cfg.MaintenanceInterval = 50 * time.Millisecond
		if region == "us" {
			cfg.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		}
	})
	us, eu := w.conns["us"][1], w.conns["eu"][1]
	holds := map[string]int64{"released": 64 << 10, "held": 16 << 20}
	for name, hold := range holds {
		waitUntil(t, ctx, time.Minute, "stream "+name+" created", func() bool {
			_, err := us.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: name, RangeCount: 1, Regions: []string{"us", "eu"},
				RangeHomes: []string{"us"}, Retention: &geologv1.RetentionPolicy{MaxBytes: 16 << 10, MirrorHoldMaxBytes: hold}})
			return err == nil || strings.Contains(err.Error(), "STREAM_EXISTS") || strings.Contains(err.Error(), "already exists")
		})
	}
	value := strings.Repeat("v", 1000)
	appendN := func(name string, n int) {
		for i := 0; i < n; i++ {
			waitUntil(t, ctx, time.Minute, "append to "+name, func() bool {
				_, err := us.Append(ctx, &geologv1.AppendRequest{Stream: name, Range: 0,
					Records: []*geologv1.Record{{Value: []byte(fmt.Sprintf("%d%s", i, value))}}})
				return err == nil
			})
		}
	}
	for name := range holds {
		appendN(name, 5)
		waitUntil(t, ctx, time.Minute, name+" mirrored in eu", func() bool { return rangeInfo(ctx, eu, name).GetTailOffset() == 5 })
	}
	if _, err := w.net.CutRegion("eu", wan.CutBlackhole); err != nil {
		t.Fatal(err)
	}
	for name := range holds {
		appendN(name, 200) // about 200 KiB: past 64 KiB, within 16 MiB
	}
	euEnd := map[string]uint64{}
	for name := range holds {
		euEnd[name] = rangeInfo(ctx, eu, name).GetTailOffset()
	}
	waitUntil(t, ctx, time.Minute, "the released stream's home start past eu's end", func() bool {
		return rangeInfo(ctx, us, "released").GetStartOffset() > euEnd["released"]
	})
	p := homeProgress(t, ctx, us, "released")
	if !p.GetHoldReleased() || !p.GetBehindLogStart() || !strings.Contains(p.GetState(), "behind the home's log start") {
		t.Fatalf("released stream: the home reports eu as %+v", p)
	}
	// Retention ran its rounds on the held stream meanwhile (same interval,
	// same writes): it still keeps what eu lacks.
	if start := rangeInfo(ctx, us, "held").GetStartOffset(); start > euEnd["held"] {
		t.Fatalf("held stream: the home's start %d passed eu's applied end %d within the hold bound", start, euEnd["held"])
	}
	if p := homeProgress(t, ctx, us, "held"); p.GetHoldReleased() || p.GetBehindLogStart() {
		t.Fatalf("held stream: the home reports eu as %+v", p)
	}
	if got := holdGauges(t, reader); got != [2]int64{1, 1} {
		t.Fatalf("gauges released, behind_start for eu = %v, want [1 1]", got)
	}
}

func rangeInfo(ctx context.Context, c geologv1.LogClient, stream string) *geologv1.RangeInfo {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	d, err := c.DescribeStream(cctx, &geologv1.DescribeStreamRequest{Name: stream})
	if err != nil || len(d.GetRanges()) == 0 {
		return nil
	}
	return d.GetRanges()[0]
}

// homeProgress is the home's report of eu's mirror of stream's range 0.
func homeProgress(t *testing.T, ctx context.Context, c geologv1.LogClient, stream string) *geologv1.RegionProgress {
	t.Helper()
	for _, p := range rangeInfo(ctx, c, stream).GetReplication() {
		if p.GetRegion() == "eu" {
			return p
		}
	}
	t.Fatalf("stream %s: the home reports no progress of eu", stream)
	return nil
}

// holdGauges reads geolog.replication.mirrors_released and
// mirrors_behind_start for region eu.
func holdGauges(t *testing.T, reader *sdkmetric.ManualReader) [2]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var out [2]int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			g, ok := m.Data.(metricdata.Gauge[int64])
			if !ok {
				continue
			}
			for _, p := range g.DataPoints {
				if r, _ := p.Attributes.Value("region"); r.AsString() != "eu" {
					continue
				}
				switch m.Name {
				case "geolog.replication.mirrors_released":
					out[0] += p.Value
				case "geolog.replication.mirrors_behind_start":
					out[1] += p.Value
				}
			}
		}
	}
	return out
}
