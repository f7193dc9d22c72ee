package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/geolog/geolog/client"
)

// lagMaxMicros bounds the replication lag the probe records (longer ones
// are clamped and counted).
const lagMaxMicros = int64(10 * time.Minute / time.Microsecond)

// lagReport is what `geolog lag` prints with --json.
type lagReport struct {
	Stream   string  `json:"stream"`
	Seconds  float64 `json:"seconds"`
	Records  int64   `json:"records"`
	P50Ms    float64 `json:"p50_ms"`
	P99Ms    float64 `json:"p99_ms"`
	P999Ms   float64 `json:"p999_ms"`
	MaxMs    float64 `json:"max_ms"`
	MeanMs   float64 `json:"mean_ms"`
	Clamped  int64   `json:"clamped"`
	Ranges   int     `json:"ranges"`
	Negative int64   `json:"negative"`
}

// lag follows every range of a stream from its current tail on the nodes of
// --addr (a region's own copy) and measures, for each record delivered,
// receipt time minus the record's append time at its home: the replication
// lag a reader in this region sees, end to end (home commit, the WAN hop,
// the mirror's commit, delivery). The two times come from two clocks; on
// one machine (a local cluster) they are the same clock. Records appended
// in the reader's own region measure the local commit-to-read path.
func (e *env) lag(ctx context.Context, args []string) error {
	fs := e.flagSet("lag")
	duration := fs.Duration("duration", 30*time.Second, "how long to follow the stream")
	jsonOut := fs.Bool("json", false, "print the summary as JSON")
	homeFilter := fs.String("home", "", "only ranges homed in this region (default all)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("usage: lag <stream> [--duration 30s] [--home REGION] [--json]")
	}
	if *duration <= 0 {
		return usagef("--duration must be positive")
	}
	stream := pos[0]
	c, err := e.client()
	if err != nil {
		return err
	}
	defer c.Close()
	desc, err := c.DescribeStream(ctx, stream)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()
	var (
		mu       sync.Mutex
		hist     = hdrhistogram.New(1, lagMaxMicros, 3)
		clamped  int64
		negative int64
		wg       sync.WaitGroup
		errs     []error
		ranges   int
	)
	start := time.Now()
	for _, r := range desc.Ranges {
		if *homeFilter != "" && r.HomeRegion != *homeFilter {
			continue
		}
		ranges++
		wg.Add(1)
		go func(rng uint32, from uint64) {
			defer wg.Done()
			for rec, err := range c.Subscribe(ctx, stream, rng, client.StartAt{Offset: from}) {
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
						mu.Lock()
						errs = append(errs, fmt.Errorf("range %d: %w", rng, err))
						mu.Unlock()
					}
					return
				}
				lag := time.Since(rec.AppendTime)
				mu.Lock()
				switch us := lag.Microseconds(); {
				case us < 0:
					negative++
					_ = hist.RecordValue(1)
				case us > lagMaxMicros:
					clamped++
					_ = hist.RecordValue(lagMaxMicros)
				default:
					_ = hist.RecordValue(max(us, 1))
				}
				mu.Unlock()
			}
		}(r.Range, r.TailOffset)
	}
	wg.Wait()
	if len(errs) > 0 {
		return errs[0]
	}
	ms := func(us int64) float64 { return float64(us) / 1000 }
	rep := lagReport{Stream: stream, Seconds: time.Since(start).Seconds(), Records: hist.TotalCount(),
		P50Ms: ms(hist.ValueAtQuantile(50)), P99Ms: ms(hist.ValueAtQuantile(99)), P999Ms: ms(hist.ValueAtQuantile(99.9)),
		MaxMs: ms(hist.Max()), MeanMs: hist.Mean() / 1000, Clamped: clamped, Ranges: ranges, Negative: negative}
	if *jsonOut {
		return json.NewEncoder(e.stdout).Encode(rep)
	}
	fmt.Fprintf(e.stdout, "stream %s, %d ranges, %d records in %.1fs\n", rep.Stream, rep.Ranges, rep.Records, rep.Seconds)
	fmt.Fprintf(e.stdout, "replication lag ms  p50 %.1f  p99 %.1f  p99.9 %.1f  max %.1f  mean %.1f\n",
		rep.P50Ms, rep.P99Ms, rep.P999Ms, rep.MaxMs, rep.MeanMs)
	if negative > 0 {
		fmt.Fprintf(e.stdout, "%d records appended \"in the future\" (clock offset between regions)\n", negative)
	}
	return nil
}
