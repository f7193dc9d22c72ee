package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/geolog/geolog/client"
)

// bench e2e (issue 16's end-to-end figure): producers on --addr (one
// region), a group consumer on --consume-addr (another region); the
// latency of each record is its receipt by the consumer minus its
// producer timestamp (set by Produce), so both sides must share a clock
// (one machine, or hosts synchronised well below the figures).

// E2EBenchResult is what bench e2e measured.
type E2EBenchResult struct {
	Stream   string       `json:"stream"`
	Group    string       `json:"group"`
	Rate     float64      `json:"rate"`
	Produced *BenchResult `json:"produced"`
	// Received counts the records the consumer received, of Expected
	// acknowledged; the latencies are of those produced after the warm-up.
	Received  int64          `json:"received"`
	Expected  int64          `json:"expected"`
	Measured  int64          `json:"measured"`
	LatencyMs LatencySummary `json:"e2e_latency_ms"`
}

func (e *env) benchE2E(ctx context.Context, args []string) error {
	fs := e.flagSet("bench e2e")
	consumeAddr := fs.String("consume-addr", "", "nodes of the consumer's region (required)")
	var cfg BenchConfig
	fs.StringVar(&cfg.Stream, "stream", "bench-e2e", "the stream (created with --ranges if missing; create it yourself to choose its regions and home)")
	ranges := fs.Uint("ranges", 8, "its range count, if created")
	fs.IntVar(&cfg.Producers, "producers", 8, "concurrent producers")
	fs.IntVar(&cfg.RecordBytes, "record-bytes", 1024, "value bytes per record")
	fs.Float64Var(&cfg.Rate, "rate", 1000, "total records/s (half the region's throughput for the issue's figure)")
	fs.DurationVar(&cfg.Duration, "duration", 20*time.Second, "how long to produce")
	warmup := fs.Duration("warmup", 2*time.Second, "records produced in the first part of the run are not counted")
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	if *consumeAddr == "" || *ranges == 0 || cfg.Rate <= 0 || cfg.Duration <= *warmup || cfg.Producers < 1 {
		return usagef("bench e2e: --consume-addr, --ranges, a positive --rate and --duration past --warmup are needed")
	}
	cfg.Ranges, cfg.InflightBatchesMax = uint32(*ranges), 4
	pc, rangeCount, err := e.benchStream(ctx, cfg.Stream, cfg.Ranges)
	if err != nil {
		return err
	}
	defer pc.Close()
	cc, err := e.clientFor(*consumeAddr, client.RetryBackoff(20*time.Millisecond, time.Second))
	if err != nil {
		return err
	}
	defer cc.Close()
	res, err := runE2EBench(ctx, pc, cc, cfg, rangeCount, *warmup, e.stderr)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(e.stdout).Encode(res)
	}
	l := res.LatencyMs
	fmt.Fprintf(e.stdout, "e2e: stream %s, group %s, %.0f records/s from --addr, consumed through --consume-addr\n", res.Stream, res.Group, res.Rate)
	fmt.Fprintf(e.stdout, "produced    %d acked at %.0f/s, ack latency ms p50 %.2f p99 %.2f\n", res.Produced.Records,
		res.Produced.RecordsPerSec, res.Produced.LatencyMs.P50, res.Produced.LatencyMs.P99)
	fmt.Fprintf(e.stdout, "received    %d of %d acked; %d measured after the warm-up\n", res.Received, res.Expected, res.Measured)
	fmt.Fprintf(e.stdout, "e2e ms      p50 %.2f  p99 %.2f  p99.9 %.2f  max %.2f  mean %.2f\n", l.P50, l.P99, l.P999, l.Max, l.Mean)
	if res.Received < res.Expected {
		return fmt.Errorf("the consumer received %d of %d records", res.Received, res.Expected)
	}
	return nil
}

// runE2EBench joins a fresh group through cc (starting at the tails),
// waits until it owns every range, produces through pc, and measures each
// record's delivery to the group.
func runE2EBench(ctx context.Context, pc, cc *client.Client, cfg BenchConfig, rangeCount uint32, warmup time.Duration, progress io.Writer) (*E2EBenchResult, error) {
	group := fmt.Sprintf("bench-e2e-%d", time.Now().UnixNano())
	g, err := cc.NewGroupConsumer(cfg.Stream, group, client.StartFrom(client.StartLatest), client.SessionTimeout(10*time.Second))
	if err != nil {
		return nil, err
	}
	defer g.Close()
	if err := waitAssigned(ctx, g, int(rangeCount)); err != nil {
		return nil, err
	}
	// Starting at the tail, a range begins fetching a moment after its
	// assignment: give the fetchers a second before producing.
	time.Sleep(time.Second)
	start := time.Now()
	rec := &e2eRecorder{hist: hdrhistogram.New(1, benchLatencyMaxMicros, 3), start: start, after: start.Add(warmup)}
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for r, err := range g.Records(cctx) {
			if err != nil {
				return
			}
			rec.add(r)
		}
	}()
	produced, err := RunBench(ctx, pc, cfg, progress)
	if err != nil {
		cancel()
		wg.Wait()
		return nil, err
	}
	expected := produced.Records
	deadline := time.Now().Add(30 * time.Second)
	for rec.received() < expected && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	res := &E2EBenchResult{Stream: cfg.Stream, Group: group, Rate: cfg.Rate, Produced: produced, Expected: expected}
	res.Received, res.Measured, res.LatencyMs = rec.summary()
	return res, nil
}

// waitAssigned waits until g owns n ranges (a minute at most).
func waitAssigned(ctx context.Context, g *client.GroupConsumer, n int) error {
	deadline := time.Now().Add(time.Minute)
	for len(g.Assigned()) < n {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.New("bench e2e: the consumer was not assigned every range within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// e2eRecorder records each record's delivery latency once the warm-up
// is over (by its producer timestamp).
type e2eRecorder struct {
	mu       sync.Mutex
	hist     *hdrhistogram.Histogram
	start    time.Time // records produced before are a backlog the copy had not reached yet: not counted
	after    time.Time
	n        int64 // received, produced from start on
	measured int64 // received and produced after the warm-up
}

func (r *e2eRecorder) add(rec client.StoredRecord) {
	us := min(max(time.Since(rec.ProducerTime).Microseconds(), 1), benchLatencyMaxMicros)
	if rec.ProducerTime.Before(r.start) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	if !rec.ProducerTime.Before(r.after) {
		_ = r.hist.RecordValue(us)
		r.measured++
	}
}

func (r *e2eRecorder) received() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

func (r *e2eRecorder) summary() (int64, int64, LatencySummary) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ms := func(us int64) float64 { return float64(us) / 1000 }
	return r.n, r.measured, LatencySummary{P50: ms(r.hist.ValueAtQuantile(50)), P99: ms(r.hist.ValueAtQuantile(99)),
		P999: ms(r.hist.ValueAtQuantile(99.9)), Max: ms(r.hist.Max()), Mean: r.hist.Mean() / 1000}
}
