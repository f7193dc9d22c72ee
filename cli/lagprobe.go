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
	// Home: with --home-addr, the time each record reached this region
	// after a reader in the home region received it: the replication hop
	// alone, without the home's own commit.
	Home *homeLagReport `json:"from_home,omitempty"`
}

// homeLagReport is the lag from home receipt to receipt here.
type homeLagReport struct {
	Records  int64   `json:"records"`
	P50Ms    float64 `json:"p50_ms"`
	P99Ms    float64 `json:"p99_ms"`
	P999Ms   float64 `json:"p999_ms"`
	MaxMs    float64 `json:"max_ms"`
	Negative int64   `json:"negative"`
}

// lagKey names one record of a stream.
type lagKey struct {
	rng    uint32
	offset uint64
}

// lagPairs matches the receipts of the same record by two readers (home,
// here); a receipt waits in its map until the other comes.
type lagPairs struct {
	home, here map[lagKey]time.Time
	hist       *hdrhistogram.Histogram
	negative   int64
}

// saw records a receipt by the home reader (home) or the local one; mu
// held.
func (p *lagPairs) saw(k lagKey, at time.Time, home bool) {
	mine, other := p.here, p.home
	if home {
		mine, other = p.home, p.here
	}
	t, ok := other[k]
	if !ok {
		mine[k] = at
		return
	}
	delete(other, k)
	d := at.Sub(t) // here minus home
	if home {
		d = t.Sub(at)
	}
	if d < 0 {
		p.negative++
		d = 0
	}
	_ = p.hist.RecordValue(min(max(d.Microseconds(), 1), lagMaxMicros))
}

// lag follows every range of a stream from its current tail on the nodes of
// --addr (a region's own copy) and measures, for each record delivered,
// receipt time minus the record's append time at its home: the replication
// lag a reader in this region sees, end to end (home commit, the WAN hop,
// the mirror's commit, delivery). The two times come from two clocks; on
// one machine (a local cluster) they are the same clock. Records appended
// in the reader's own region measure the local commit-to-read path. With
// --home-addr it also follows the stream in the home region and reports
// how long after a reader there each record arrived here: the replication
// hop alone (the WAN, the mirror's commit, delivery), without the home's
// commit.
func (e *env) lag(ctx context.Context, args []string) error {
	fs := e.flagSet("lag")
	duration := fs.Duration("duration", 30*time.Second, "how long to follow the stream")
	jsonOut := fs.Bool("json", false, "print the summary as JSON")
	homeFilter := fs.String("home", "", "only ranges homed in this region (default all)")
	homeAddr := fs.String("home-addr", "", "also follow the stream on these nodes of its home region, and report how long after a reader there each record reached this one (the replication hop alone)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("usage: lag <stream> [--duration 30s] [--home REGION] [--home-addr ADDRS] [--json]")
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
	var pairs *lagPairs
	var hc *client.Client
	if *homeAddr != "" {
		if hc, err = e.clientFor(*homeAddr); err != nil {
			return err
		}
		defer hc.Close()
		pairs = &lagPairs{home: map[lagKey]time.Time{}, here: map[lagKey]time.Time{}, hist: hdrhistogram.New(1, lagMaxMicros, 3)}
	}
	// follow subscribes to one range on c from offset from and calls
	// onRecord, with mu held, at each record's receipt.
	follow := func(c *client.Client, where string, rng uint32, from uint64, onRecord func(rec client.StoredRecord, now time.Time)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rec, err := range c.Subscribe(ctx, stream, rng, client.StartAt{Offset: from}) {
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
						mu.Lock()
						errs = append(errs, fmt.Errorf("range %d%s: %w", rng, where, err))
						mu.Unlock()
					}
					return
				}
				now := time.Now()
				mu.Lock()
				onRecord(rec, now)
				mu.Unlock()
			}
		}()
	}
	// Say so on stderr: the records counted from here on are those
	// appended after this point (the tails just read).
	fmt.Fprintf(e.stderr, "following %s from its tails for %v\n", stream, *duration)
	start := time.Now()
	for _, r := range desc.Ranges {
		if *homeFilter != "" && r.HomeRegion != *homeFilter {
			continue
		}
		ranges++
		rng := r.Range
		if pairs != nil {
			follow(hc, " at home", rng, r.TailOffset, func(rec client.StoredRecord, now time.Time) {
				pairs.saw(lagKey{rng, rec.Offset}, now, true)
			})
		}
		follow(c, "", rng, r.TailOffset, func(rec client.StoredRecord, now time.Time) {
			if pairs != nil {
				pairs.saw(lagKey{rng, rec.Offset}, now, false)
			}
			switch us := now.Sub(rec.AppendTime).Microseconds(); {
			case us < 0:
				negative++
				_ = hist.RecordValue(1)
			case us > lagMaxMicros:
				clamped++
				_ = hist.RecordValue(lagMaxMicros)
			default:
				_ = hist.RecordValue(max(us, 1))
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return errs[0]
	}
	ms := func(us int64) float64 { return float64(us) / 1000 }
	rep := lagReport{Stream: stream, Seconds: time.Since(start).Seconds(), Records: hist.TotalCount(),
		P50Ms: ms(hist.ValueAtQuantile(50)), P99Ms: ms(hist.ValueAtQuantile(99)), P999Ms: ms(hist.ValueAtQuantile(99.9)),
		MaxMs: ms(hist.Max()), MeanMs: hist.Mean() / 1000, Clamped: clamped, Ranges: ranges, Negative: negative}
	if pairs != nil {
		h := pairs.hist
		rep.Home = &homeLagReport{Records: h.TotalCount(), P50Ms: ms(h.ValueAtQuantile(50)), P99Ms: ms(h.ValueAtQuantile(99)),
			P999Ms: ms(h.ValueAtQuantile(99.9)), MaxMs: ms(h.Max()), Negative: pairs.negative}
	}
	if *jsonOut {
		return json.NewEncoder(e.stdout).Encode(rep)
	}
	fmt.Fprintf(e.stdout, "stream %s, %d ranges, %d records in %.1fs\n", rep.Stream, rep.Ranges, rep.Records, rep.Seconds)
	fmt.Fprintf(e.stdout, "replication lag ms  p50 %.1f  p99 %.1f  p99.9 %.1f  max %.1f  mean %.1f\n",
		rep.P50Ms, rep.P99Ms, rep.P999Ms, rep.MaxMs, rep.MeanMs)
	if h := rep.Home; h != nil {
		fmt.Fprintf(e.stdout, "after the home's readers (%d records): ms  p50 %.1f  p99 %.1f  p99.9 %.1f  max %.1f\n",
			h.Records, h.P50Ms, h.P99Ms, h.P999Ms, h.MaxMs)
	}
	if negative > 0 {
		fmt.Fprintf(e.stdout, "%d records appended \"in the future\" (clock offset between regions)\n", negative)
	}
	return nil
}
