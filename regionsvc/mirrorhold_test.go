package regionsvc

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/segment"
	"github.com/geolog/geolog/wan"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// TestMirrorHoldDefaults: the hold bound defaults to twice the retention
// of its kind, none without one; -1 is none; an explicit bound stands.
func TestMirrorHoldDefaults(t *testing.T) {
	t.Parallel()
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

// TestHoldState: on a home log of many segments, a mirror inside the
// active segment is neither released nor behind; one whose segments
// behind pass the bytes bound, or whose lag passes the age bound, is
// released; one below the log's start is behind it (and released) once
// its position is known; one whose position is unknown counts from 0:
// released only when the whole log passes the bound.
func TestHoldState(t *testing.T) {
	t.Parallel()
	s, err := segment.Open(segment.Config{Dir: t.TempDir(), Fsync: segment.FsyncNever, SegmentBytesMax: segment.SegmentBytesMaxMin})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	value := []batch.Record{{Value: make([]byte, 200)}}
	for off := uint64(0); off < 100; off++ {
		if err := s.Append(batch.Encode(nil, batch.Header{BaseOffset: off, Epoch: 1, AppendTimeUnixNanos: int64(off + 1)}, value)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeletePrefix(20); err != nil {
		t.Fatal(err)
	}
	start, end, whole := s.StartOffset(), s.NextOffset(), s.Size()
	if start == 0 || start > 20 {
		t.Fatalf("start %d after deleting below 20", start)
	}
	d := &rangeDriver{store: s}
	bound := mirrorHold{bytes: whole / 2, age: time.Minute}
	for _, c := range []struct {
		name             string
		hold             mirrorHold
		applied          uint64
		known            bool
		lag              time.Duration
		released, behind bool
	}{
		{"at the end", bound, end, true, 0, false, false},
		{"one record behind", bound, end - 1, true, 0, false, false},
		{"at the start", bound, start, true, 0, true, false},
		{"at the start, no bytes bound", mirrorHold{age: time.Minute}, start, true, 0, false, false},
		{"lag past the age bound", bound, end, true, 2 * time.Minute, true, false},
		{"below the start", mirrorHold{}, start - 1, true, 0, true, true},
		{"unknown, the log within the bound", mirrorHold{bytes: whole}, 0, false, 0, false, false},
		{"unknown, the log past the bound", bound, 0, false, 0, true, false},
	} {
		released, behind := holdState(d, c.hold, c.applied, c.known, c.lag)
		if released != c.released || behind != c.behind {
			t.Errorf("%s (applied %d of [%d, %d)): released %v behind %v, want %v %v", c.name, c.applied, start, end, released, behind, c.released, c.behind)
		}
	}
}

// TestMirrorHoldBound: with the ap region cut off, the us home of three
// streams keeps writing; eu stays in touch. Of the streams whose hold bound
// the backlog passes, by bytes ("released") or by age ("aged"), retention
// runs on: the home's log start and eu's mirror's start pass ap's applied
// end (the home's heartbeats no longer tell eu to hold for ap), and the
// home says so (hold_released, behind_log_start, the gauges). The stream
// whose bound the backlog stays within ("held") keeps its log from ap's
// applied end on the home and on eu, though its retention would delete it.
// The bounds leave eu, which lags by up to a few dozen records while the
// test writes, far within them.
func TestMirrorHoldBound(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-region cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	reader := sdkmetric.NewManualReader()
	w := newWorldWith(t, []string{"us", "eu", "ap"}, 1, 2*time.Millisecond, 0, nil, func(region string, _ uint64, cfg *Config) {
		cfg.SegmentBytesMax = 8 << 10
		cfg.MaintenanceInterval = 50 * time.Millisecond
		if region == "us" {
			cfg.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		}
	})
	us, eu, ap := w.conns["us"][1], w.conns["eu"][1], w.conns["ap"][1]
	retention := map[string]*geologv1.RetentionPolicy{
		"released": {MaxBytes: 16 << 10, MirrorHoldMaxBytes: 256 << 10},
		"aged":     {MaxAgeMs: 200, MirrorHoldMaxBytes: -1, MirrorHoldMaxMs: 5000},
		"held":     {MaxBytes: 16 << 10, MirrorHoldMaxBytes: 16 << 20},
	}
	for name, ret := range retention {
		createMirrorHoldStream(t, ctx, us, name, ret)
	}
	for name := range retention {
		appendValues(t, ctx, us, name, 5)
		waitUntil(t, ctx, time.Minute, name+" mirrored in ap", func() bool { return rangeInfo(ctx, ap, name).GetTailOffset() == 5 })
	}
	if _, err := w.net.CutRegion("ap", wan.CutBlackhole); err != nil {
		t.Fatal(err)
	}
	for name := range retention {
		appendValues(t, ctx, us, name, 600) // about 600 KiB: past 256 KiB, within 16 MiB
	}
	apEnd := map[string]uint64{}
	for name := range retention {
		apEnd[name] = rangeInfo(ctx, ap, name).GetTailOffset()
	}
	for _, name := range []string{"released", "aged"} {
		waitUntil(t, ctx, time.Minute, name+": the home's and eu's starts past ap's end", func() bool {
			return rangeInfo(ctx, us, name).GetStartOffset() > apEnd[name] && rangeInfo(ctx, eu, name).GetStartOffset() > apEnd[name]
		})
		p := homeProgress(t, ctx, us, name, "ap")
		if !p.GetHoldReleased() || !p.GetBehindLogStart() || !strings.Contains(p.GetState(), "behind the home's log start") {
			t.Fatalf("%s: the home reports ap as %+v", name, p)
		}
		if p := homeProgress(t, ctx, us, name, "eu"); p.GetHoldReleased() || p.GetBehindLogStart() {
			t.Fatalf("%s: the home reports eu as %+v", name, p)
		}
	}
	// Retention ran its rounds on the held stream meanwhile (same interval,
	// same writes): the home and eu still keep what ap lacks.
	for region, c := range map[string]geologv1.LogClient{"us": us, "eu": eu} {
		if start := rangeInfo(ctx, c, "held").GetStartOffset(); start > apEnd["held"] {
			t.Fatalf("held stream: %s's start %d passed ap's applied end %d within the hold bound", region, start, apEnd["held"])
		}
	}
	if p := homeProgress(t, ctx, us, "held", "ap"); p.GetHoldReleased() || p.GetBehindLogStart() {
		t.Fatalf("held stream: the home reports ap as %+v", p)
	}
	if got := holdGauges(t, reader, "ap"); got != [2]int64{2, 2} {
		t.Fatalf("gauges released, behind_start for ap = %v, want [2 2]", got)
	}
	if got := holdGauges(t, reader, "eu"); got != [2]int64{0, 0} {
		t.Fatalf("gauges released, behind_start for eu = %v, want [0 0]", got)
	}

	// ap returns: behind the home's log start, it skips to it (a batch
	// from the start, flagged from_source_start; replica.ProposeSkip) and
	// then holds what the home holds, from the same start. Nothing is
	// written meanwhile, so the home's start stays where it is.
	if _, err := w.net.HealRegion("ap"); err != nil {
		t.Fatal(err)
	}
	// The home is read afresh on every poll: its retention rounds may
	// still be moving its start (to the last segment boundary its bound
	// allows) when ap comes back, and ap skips to wherever it then is.
	var home *geologv1.RangeInfo
	waitUntil(t, ctx, time.Minute, "released: ap skipped to the home's start and caught up", func() bool {
		home = rangeInfo(ctx, us, "released")
		got := rangeInfo(ctx, ap, "released")
		return got.GetStartOffset() == home.GetStartOffset() && got.GetTailOffset() == home.GetTailOffset()
	})
	_, err := ap.Read(ctx, &geologv1.ReadRequest{Stream: "released", FromOffset: apEnd["released"], MaxRecords: 1})
	if e := rpcerr.FromError(err); e.Code != apierr.OffsetOutOfRange || e.StartOffset != home.GetStartOffset() {
		t.Fatalf("a read in ap at %d, below the skip to %d: %v (start %d)", apEnd["released"], home.GetStartOffset(), err, e.StartOffset)
	}
	resp, err := ap.Read(ctx, &geologv1.ReadRequest{Stream: "released", FromOffset: home.GetStartOffset(), MaxRecords: 1})
	if err != nil || len(resp.GetRecords()) != 1 || resp.GetRecords()[0].GetOffset() != home.GetStartOffset() {
		t.Fatalf("a read in ap at the skip's %d: %v, %v", home.GetStartOffset(), resp, err)
	}
	// The aged stream's home deleted its whole log (start = tail), no
	// record to carry the flag: the home sends a skip marker (a flagged
	// batch of no frames) and ap skips to its tail with nothing written.
	waitUntil(t, ctx, time.Minute, "aged: ap skipped to the idle home's empty log", func() bool {
		h, got := rangeInfo(ctx, us, "aged"), rangeInfo(ctx, ap, "aged")
		return h.GetStartOffset() == h.GetTailOffset() && got.GetStartOffset() == h.GetStartOffset() && got.GetTailOffset() == h.GetTailOffset()
	})
	_, err = ap.Read(ctx, &geologv1.ReadRequest{Stream: "aged", FromOffset: apEnd["aged"], MaxRecords: 1})
	if e := rpcerr.FromError(err); e.Code != apierr.OffsetOutOfRange || e.StartOffset <= apEnd["aged"] {
		t.Fatalf("aged: a read in ap at %d, below the skip: %v (start %d)", apEnd["aged"], err, e.StartOffset)
	}
	appendValues(t, ctx, us, "aged", 1)
	waitUntil(t, ctx, time.Minute, "aged: ap follows after the skip", func() bool {
		return rangeInfo(ctx, ap, "aged").GetTailOffset() == rangeInfo(ctx, us, "aged").GetTailOffset()
	})
	for _, name := range []string{"released", "aged"} {
		waitUntil(t, ctx, time.Minute, name+": the home no longer reports ap behind its start", func() bool {
			p := homeProgress(t, ctx, us, name, "ap")
			return !p.GetBehindLogStart() && !p.GetHoldReleased()
		})
	}
	// And it keeps following.
	appendValues(t, ctx, us, "released", 3)
	waitUntil(t, ctx, time.Minute, "released: ap follows after the skip", func() bool {
		return rangeInfo(ctx, ap, "released").GetTailOffset() == rangeInfo(ctx, us, "released").GetTailOffset()
	})
}

func createMirrorHoldStream(t *testing.T, ctx context.Context, c geologv1.LogClient, name string, ret *geologv1.RetentionPolicy) {
	t.Helper()
	waitUntil(t, ctx, time.Minute, "stream "+name+" created", func() bool {
		_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: name, RangeCount: 1, Regions: []string{"us", "eu", "ap"},
			RangeHomes: []string{"us"}, Retention: ret})
		return err == nil || rpcerr.CodeOf(err) == apierr.StreamExists
	})
}

// appendValues appends n records of about 1 KiB to range 0 of stream.
func appendValues(t *testing.T, ctx context.Context, c geologv1.LogClient, stream string, n int) {
	t.Helper()
	value := strings.Repeat("v", 1000)
	for i := 0; i < n; i++ {
		waitUntil(t, ctx, time.Minute, "append to "+stream, func() bool {
			_, err := c.Append(ctx, &geologv1.AppendRequest{Stream: stream, Range: 0,
				Records: []*geologv1.Record{{Value: []byte(fmt.Sprintf("%d%s", i, value))}}})
			return err == nil
		})
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

// homeProgress is the home's report of region's mirror of stream's range 0.
func homeProgress(t *testing.T, ctx context.Context, c geologv1.LogClient, stream, region string) *geologv1.RegionProgress {
	t.Helper()
	for _, p := range rangeInfo(ctx, c, stream).GetReplication() {
		if p.GetRegion() == region {
			return p
		}
	}
	t.Fatalf("stream %s: the home reports no progress of %s", stream, region)
	return nil
}

// holdGauges reads geolog.replication.mirrors_released and
// mirrors_behind_start for region.
func holdGauges(t *testing.T, reader *sdkmetric.ManualReader, region string) [2]int64 {
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
				if r, _ := p.Attributes.Value("region"); r.AsString() != region {
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
