package regionsvc

import (
	"context"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/segment"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

func TestStagesOf(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	// received 0, queued 1, proposed 3, leader durable 7, committed 12, answered 13.
	got := stagesOf(at(0), at(1), at(3), at(7), at(12), at(13))
	want := appendStages{admission: ms(1), queue: ms(2), leaderWrite: ms(4), quorum: ms(5), ack: ms(1)}
	if got != want {
		t.Fatalf("stages %+v, want %+v", got, want)
	}
	// The followers were faster than the leader's own write (or it is not
	// known): the write stage runs to the commit, the quorum adds nothing.
	for _, durable := range []time.Time{{}, at(15)} {
		got = stagesOf(at(0), at(1), at(3), durable, at(12), at(13))
		if got.leaderWrite != ms(9) || got.quorum != 0 {
			t.Fatalf("durable %v: stages %+v, want leader write 9ms, quorum 0", durable, got)
		}
	}
	// The stages add up to the whole: received to answered.
	got = stagesOf(at(0), at(1), at(3), at(7), at(12), at(13))
	if sum := got.admission + got.queue + got.leaderWrite + got.quorum + got.ack; sum != ms(13) {
		t.Fatalf("stages sum to %v, want 13ms", sum)
	}
}

func TestDurableLog(t *testing.T) {
	t.Parallel()
	var l durableLog
	t0 := time.Unix(1000, 0)
	if !l.durableAt(1).IsZero() {
		t.Fatal("an empty log knows a durable time")
	}
	l.add(10, t0)
	l.add(25, t0.Add(time.Millisecond))
	for _, c := range []struct {
		end  uint64
		want time.Time
	}{{1, t0}, {10, t0}, {11, t0.Add(time.Millisecond)}, {25, t0.Add(time.Millisecond)}, {26, time.Time{}}} {
		if got := l.durableAt(c.end); !got.Equal(c.want) {
			t.Errorf("durableAt(%d) = %v, want %v", c.end, got, c.want)
		}
	}
	// A log cut back forgets what was before.
	l.add(5, t0.Add(2*time.Millisecond))
	if got := l.durableAt(20); !got.IsZero() {
		t.Errorf("after a truncation to 5, durableAt(20) = %v", got)
	}
	// Past durableMarksMax writes the oldest are dropped: an offset below
	// the oldest held is unknown, not that write's.
	for i := range durableMarksMax + 1 {
		l.add(uint64(100+i), t0.Add(time.Duration(i)*time.Second))
	}
	if got := l.durableAt(50); !got.IsZero() {
		t.Errorf("durableAt below the oldest write held = %v, want unknown", got)
	}
	if got, want := l.durableAt(150), t0.Add(50*time.Second); !got.Equal(want) {
		t.Errorf("durableAt(150) = %v, want %v", got, want)
	}
	if got, want := l.durableAt(100+durableMarksMax), t0.Add(durableMarksMax*time.Second); !got.Equal(want) {
		t.Errorf("durableAt of the newest write = %v, want %v", got, want)
	}
	if got := l.durableAt(101 + durableMarksMax); !got.IsZero() {
		t.Errorf("durableAt past the newest write = %v, want zero", got)
	}
}

// TestAppendTiming: an append that asks for its timing gets its stages
// on the leader, no more than the client's round trip in all; one that
// does not gets none; and every stage is a series of
// geolog.append.stage_duration, the fsync rounds split by role.
func TestAppendTiming(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tr := newTestRegionWith(t, 3, 3, func(cfg *Config) {
		cfg.MeterProvider = mp          // shared: the three nodes' series add up
		cfg.Fsync = segment.FsyncAlways // the write stages are real
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr.retry(ctx, "create stream", func(ctx context.Context, c geologv1.LogClient) error {
		_, err := c.CreateStream(ctx, &geologv1.CreateStreamRequest{Name: "tm", RangeCount: 1})
		if rpcerr.CodeOf(err) == apierr.StreamExists {
			return nil
		}
		return err
	})
	var resp *geologv1.AppendResponse
	var rtt time.Duration
	for i := range 20 {
		tr.retry(ctx, "append", func(ctx context.Context, c geologv1.LogClient) error {
			start := time.Now()
			r, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "tm", ProducerId: 5, BaseSequence: uint64(i), Records: recs("t", 1), WantTiming: true})
			resp, rtt = r, time.Since(start)
			return err
		})
		tm := resp.GetTiming()
		if tm == nil {
			t.Fatalf("append %d asked for its timing and got none: %v", i, resp)
		}
		sum := time.Duration(tm.AdmissionNanos + tm.QueueNanos + tm.LeaderWriteNanos + tm.QuorumNanos + tm.AckNanos)
		if tm.LeaderWriteNanos+tm.QuorumNanos == 0 || sum > rtt {
			t.Fatalf("append %d: timing %v (sum %v) against a round trip of %v", i, tm, sum, rtt)
		}
	}
	c := tr.clients[tr.leaderOf(ctx, "tm", 0)]
	r, err := c.Append(ctx, &geologv1.AppendRequest{Stream: "tm", ProducerId: 5, BaseSequence: 20, Records: recs("t", 1)})
	if err != nil || r.GetTiming() != nil {
		t.Fatalf("an append that did not ask: %v, %v", r, err)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	stages, roles := map[string]uint64{}, map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			d, ok := m.Data.(metricdata.Histogram[float64])
			if !ok {
				continue
			}
			for _, p := range d.DataPoints {
				switch m.Name {
				case "geolog.append.stage_duration":
					v, _ := p.Attributes.Value("stage")
					stages[v.AsString()] += p.Count
				case "geolog.segment.fsync_duration":
					v, _ := p.Attributes.Value("role")
					roles[v.AsString()] += p.Count
				}
			}
		}
	}
	for _, s := range []string{"admission", "queue", "leader_write", "quorum", "ack"} {
		if stages[s] < 21 {
			t.Errorf("stage %s: %d appends recorded, want 21 or more (every append): %v", s, stages[s], stages)
		}
	}
	if roles["leader"] == 0 || roles["follower"] == 0 {
		t.Errorf("fsync rounds by role %v: want both", roles)
	}
}
