package cli

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/geolog/geolog/client"
)

// BenchConfig configures RunBench. Zero fields take the defaults named.
type BenchConfig struct {
	// Stream is produced to; created with Ranges ranges if missing.
	// Default "bench".
	Stream string
	// Ranges is the range count of a stream the bench creates; default 8.
	Ranges uint32
	// Producers is the number of concurrent Producers; default 1.
	Producers int
	// RecordBytes is each record's value size; default 1024.
	RecordBytes int
	// Values is the number of distinct random values the records cycle
	// through; default 1 (every record holds the same bytes). More makes
	// the records as incompressible as random data is, for figures of
	// what crosses the network (the replicator compresses each batch).
	Values int
	// InflightBatchesMax is each producer's window per range; default 1
	// (the producer's default).
	InflightBatchesMax int
	// Linger is each producer's linger; default 0.
	Linger time.Duration
	// BatchBytesMax is each producer's batch bound; default the producer's
	// (1 MiB).
	BatchBytesMax int
	// BufferedBytesMax is each producer's buffer bound; default the
	// producer's (64 MiB). Produce blocks while it is full, so it bounds
	// the queueing part of the measured latency.
	BufferedBytesMax int64
	// QueueDelayTarget is each producer's queueing-delay target; 0 means
	// the producer's default (100 ms), negative turns it off.
	QueueDelayTarget time.Duration
	// Count is the total number of records; 0 means run for Duration.
	Count int64
	// Duration bounds producing when Count is 0; default 10s.
	Duration time.Duration
	// Keys is the number of distinct keys, used round robin; 0 produces
	// keyless records.
	Keys int
	// Sync makes each producer wait for a record's ack before producing
	// the next.
	Sync bool
	// Rate caps the total records per second across producers (each
	// producer paces at Rate/Producers); 0 means as fast as possible. With
	// a rate, latency is measured from each record's scheduled send time,
	// so a stall cannot hide queued records (no coordinated omission).
	Rate float64
	// ProgressInterval is how often a progress line is written; default
	// 1s.
	ProgressInterval time.Duration
	// Breakdown asks the range leaders for every append's stages
	// (client.WithTiming) and reports, per record, where its time went
	// (BenchResult.Breakdown).
	Breakdown bool
}

func (cfg *BenchConfig) setDefaults() {
	if cfg.Stream == "" {
		cfg.Stream = "bench"
	}
	if cfg.Ranges == 0 {
		cfg.Ranges = 8
	}
	if cfg.Producers == 0 {
		cfg.Producers = 1
	}
	if cfg.RecordBytes == 0 {
		cfg.RecordBytes = 1024
	}
	if cfg.InflightBatchesMax == 0 {
		cfg.InflightBatchesMax = 1
	}
	if cfg.Duration == 0 && cfg.Count == 0 {
		cfg.Duration = 10 * time.Second
	}
	if cfg.ProgressInterval == 0 {
		cfg.ProgressInterval = time.Second
	}
}

// BenchResult is what a bench run measured. Latencies are per record, from
// the Produce call to its ack callback.
type BenchResult struct {
	Stream             string  `json:"stream"`
	Producers          int     `json:"producers"`
	RecordBytes        int     `json:"record_bytes"`
	InflightBatchesMax int     `json:"inflight_batches_max"`
	LingerMs           float64 `json:"linger_ms"`
	BatchBytesMax      int     `json:"batch_bytes_max"`
	BufferedBytesMax   int64   `json:"buffered_bytes_max"`
	QueueDelayTargetMs float64 `json:"queue_delay_target_ms"` // 0: off
	Keys               int     `json:"keys"`
	Sync               bool    `json:"sync"`
	Rate               float64 `json:"rate,omitempty"`

	// Records were acknowledged; Errors failed.
	Records      int64    `json:"records"`
	Errors       int64    `json:"errors"`
	ErrorSamples []string `json:"error_samples,omitempty"`
	// Duplicates were acknowledged as already appended (after a retry).
	Duplicates int64 `json:"duplicates"`
	// OrderViolations counts acks whose offset did not exceed the previous
	// ack's of the same producer and range: always 0 unless the system
	// breaks "per producer, sequence order = offset order".
	OrderViolations int64 `json:"order_violations"`

	ElapsedSeconds float64        `json:"elapsed_seconds"`
	RecordsPerSec  float64        `json:"records_per_sec"`
	MBPerSec       float64        `json:"mb_per_sec"` // key and value bytes, 10^6 bytes
	LatencyMs      LatencySummary `json:"latency_ms"`
	// Breakdown is where the records' time went, stage by stage (with
	// BenchConfig.Breakdown; benchbreakdown.go).
	Breakdown []StageSummary `json:"breakdown,omitempty"`
	// BreakdownUntimed counts acknowledged records without the leader's
	// timing (duplicates, answered from the leader's table).
	BreakdownUntimed int64 `json:"breakdown_untimed,omitempty"`
	// MachineCPU is how the machine's CPUs spent the run (Linux;
	// benchcpu.go): a p99 is read beside its steal.
	MachineCPU *MachineCPU `json:"machine_cpu,omitempty"`
}

// LatencySummary holds latency percentiles in milliseconds.
type LatencySummary struct {
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

// OK reports whether the run saw no errors and no order violations.
func (r *BenchResult) OK() bool { return r.Errors == 0 && r.OrderViolations == 0 && r.Records > 0 }

// benchLatencyMaxMicros bounds recorded latencies (longer ones are clamped):
// ten minutes, far past any delivery timeout.
const benchLatencyMaxMicros = int64(10 * time.Minute / time.Microsecond)

// benchState is shared by a run's producers and callbacks.
type benchState struct {
	mu        sync.Mutex // guards hist and samples
	hist      *hdrhistogram.Histogram
	samples   map[string]bool
	acked     atomic.Int64
	ackBytes  atomic.Int64
	errors    atomic.Int64
	dups      atomic.Int64
	violation atomic.Int64
	stages    *benchStages // nil unless BenchConfig.Breakdown
}

func (s *benchState) recordLatency(d time.Duration) {
	us := min(max(d.Microseconds(), 1), benchLatencyMaxMicros)
	s.mu.Lock()
	_ = s.hist.RecordValue(us)
	s.mu.Unlock()
}

func (s *benchState) recordError(err error) {
	s.errors.Add(1)
	s.mu.Lock()
	if len(s.samples) < 5 {
		s.samples[err.Error()] = true
	}
	s.mu.Unlock()
}

// RunBench produces to cfg.Stream through c and measures throughput and ack
// latency. It writes a progress line to progress (if not nil) every
// ProgressInterval. Ending ctx stops producing early; what was produced is
// still awaited.
func RunBench(ctx context.Context, c *client.Client, cfg BenchConfig, progress io.Writer) (*BenchResult, error) {
	cfg.setDefaults()
	switch {
	case cfg.Producers < 0 || cfg.RecordBytes < 0 || cfg.Keys < 0 || cfg.Count < 0 || cfg.Duration < 0 || cfg.Rate < 0:
		return nil, usagef("bench settings must not be negative")
	case cfg.InflightBatchesMax > client.InflightBatchesMaxLimit:
		return nil, usagef("--inflight must be at most %d", client.InflightBatchesMaxLimit)
	}
	if err := ensureStream(ctx, c, cfg.Stream, cfg.Ranges); err != nil {
		return nil, err
	}
	popts := []client.ProducerOpt{client.InflightBatchesMax(cfg.InflightBatchesMax), client.Linger(cfg.Linger)}
	if cfg.BatchBytesMax > 0 {
		popts = append(popts, client.BatchBytesMax(cfg.BatchBytesMax))
	}
	if cfg.BufferedBytesMax > 0 {
		popts = append(popts, client.BufferedBytesMax(cfg.BufferedBytesMax))
	}
	if cfg.Breakdown {
		popts = append(popts, client.WithTiming())
	}
	queueDelayTarget := client.QueueDelayTargetDefault
	if cfg.QueueDelayTarget != 0 {
		queueDelayTarget = max(cfg.QueueDelayTarget, 0)
		popts = append(popts, client.QueueDelayTarget(queueDelayTarget))
	}
	producers := make([]*client.Producer, cfg.Producers)
	for i := range producers {
		p, err := c.NewProducer(cfg.Stream, popts...)
		if err != nil {
			for _, q := range producers[:i] {
				q.Close()
			}
			return nil, err
		}
		producers[i] = p
	}
	defer func() {
		for _, p := range producers {
			p.Close()
		}
	}()
	// Learn the range count before the clock starts, so that the first
	// records' latency does not include it.
	for _, p := range producers {
		if _, err := p.RangeCount(ctx); err != nil {
			return nil, err
		}
	}

	keys := make([][]byte, cfg.Keys)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "key-%06d", i)
	}
	values := make([][]byte, max(1, cfg.Values))
	for i := range values {
		values[i] = make([]byte, cfg.RecordBytes)
		_, _ = rand.Read(values[i])
	}

	st := &benchState{hist: hdrhistogram.New(1, benchLatencyMaxMicros, 3), samples: make(map[string]bool)}
	if cfg.Breakdown {
		st.stages = newBenchStages()
	}
	var stop atomic.Bool
	cpuStart, cpuStartOK := readCPUTicks()
	start := time.Now()
	if cfg.Count == 0 {
		t := time.AfterFunc(cfg.Duration, func() { stop.Store(true) })
		defer t.Stop()
	}
	stopCtx := context.AfterFunc(ctx, func() { stop.Store(true) })
	defer stopCtx()

	progressDone := make(chan struct{})
	var progressWG sync.WaitGroup
	if progress != nil && cfg.ProgressInterval > 0 {
		progressWG.Add(1)
		go func() {
			defer progressWG.Done()
			benchProgress(st, start, cfg.ProgressInterval, progress, progressDone)
		}()
	}

	var wg sync.WaitGroup
	for w, p := range producers {
		count := int64(-1)
		if cfg.Count > 0 {
			count = cfg.Count / int64(cfg.Producers)
			if int64(w) < cfg.Count%int64(cfg.Producers) {
				count++
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			benchProducer(p, w, count, cfg, keys, values, &stop, st)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpuEnd, cpuEndOK := readCPUTicks()
	close(progressDone)
	progressWG.Wait()

	res := &BenchResult{
		Stream: cfg.Stream, Producers: cfg.Producers, RecordBytes: cfg.RecordBytes,
		InflightBatchesMax: cfg.InflightBatchesMax, LingerMs: float64(cfg.Linger) / float64(time.Millisecond),
		BatchBytesMax: cfg.BatchBytesMax, BufferedBytesMax: cfg.BufferedBytesMax, Keys: cfg.Keys, Sync: cfg.Sync, Rate: cfg.Rate,
		QueueDelayTargetMs: float64(queueDelayTarget) / float64(time.Millisecond), Records: st.acked.Load(),
		Errors: st.errors.Load(), Duplicates: st.dups.Load(),
		OrderViolations: st.violation.Load(), ElapsedSeconds: elapsed.Seconds(),
	}
	if res.BatchBytesMax == 0 {
		res.BatchBytesMax = 1 << 20
	}
	if res.BufferedBytesMax == 0 {
		res.BufferedBytesMax = 64 << 20
	}
	for s := range st.samples {
		res.ErrorSamples = append(res.ErrorSamples, s)
	}
	if secs := elapsed.Seconds(); secs > 0 {
		res.RecordsPerSec = float64(res.Records) / secs
		res.MBPerSec = float64(st.ackBytes.Load()) / secs / 1e6
	}
	res.Breakdown, res.BreakdownUntimed = st.stages.summaries()
	if cpuStartOK && cpuEndOK {
		res.MachineCPU = machineCPU(cpuStart, cpuEnd)
	}
	ms := func(us int64) float64 { return float64(us) / 1000 }
	res.LatencyMs = LatencySummary{
		P50:  ms(st.hist.ValueAtQuantile(50)),
		P99:  ms(st.hist.ValueAtQuantile(99)),
		P999: ms(st.hist.ValueAtQuantile(99.9)),
		Max:  ms(st.hist.Max()),
		Mean: st.hist.Mean() / 1000,
	}
	return res, nil
}

// benchProducer produces count records (or until stop when count < 0) and
// waits for their acks.
func benchProducer(p *client.Producer, w int, count int64, cfg BenchConfig, keys [][]byte, values [][]byte, stop *atomic.Bool, st *benchState) {
	ctx := context.Background()
	// Per producer and range, acks must come in increasing offset order.
	var orderMu sync.Mutex
	lastOffset := make(map[uint32]uint64)
	observe := func(startT time.Time, res client.ProduceResult, err error) {
		if err != nil {
			st.recordError(err)
			return
		}
		took := time.Since(startT)
		st.recordLatency(took)
		st.stages.record(took, res.Timing)
		st.acked.Add(1)
		st.ackBytes.Add(int64(len(res.Record.Key) + len(res.Record.Value)))
		if res.Duplicate {
			st.dups.Add(1)
		}
		orderMu.Lock()
		if last, ok := lastOffset[res.Range]; ok && res.Offset <= last {
			st.violation.Add(1)
		}
		lastOffset[res.Range] = res.Offset
		orderMu.Unlock()
	}
	var interval time.Duration
	if cfg.Rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(cfg.Producers) / cfg.Rate)
	}
	scheduled := time.Now()
	for i := int64(0); count < 0 || i < count; i++ {
		if stop.Load() {
			break
		}
		rec := &client.Record{Value: values[(int64(w)*7919+i)%int64(len(values))]}
		if len(keys) > 0 {
			rec.Key = keys[(int64(w)+i)%int64(len(keys))]
		}
		startT := time.Now()
		if interval > 0 {
			// Pace to the schedule; when behind, send at once and count the
			// latency from when the record should have gone.
			if d := time.Until(scheduled); d > 0 {
				time.Sleep(d)
			}
			startT = scheduled
			scheduled = scheduled.Add(interval)
		}
		if cfg.Sync {
			res, err := p.ProduceSync(ctx, rec)
			observe(startT, res[0], err)
			continue
		}
		p.Produce(ctx, rec, func(res client.ProduceResult, err error) { observe(startT, res, err) })
	}
	// Every record is bounded by the delivery timeout, so Flush returns.
	_ = p.Flush(ctx)
}

func benchProgress(st *benchState, start time.Time, every time.Duration, w io.Writer, done <-chan struct{}) {
	t := time.NewTicker(every)
	defer t.Stop()
	var lastRecords, lastBytes int64
	last := start
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			recs, bytes := st.acked.Load(), st.ackBytes.Load()
			secs := now.Sub(last).Seconds()
			st.mu.Lock()
			p99 := float64(st.hist.ValueAtQuantile(99)) / 1000
			st.mu.Unlock()
			fmt.Fprintf(w, "%6.1fs  %10.0f records/s  %8.2f MB/s  p99 %8.2f ms  acked %d  errors %d\n",
				now.Sub(start).Seconds(), float64(recs-lastRecords)/secs, float64(bytes-lastBytes)/secs/1e6,
				p99, recs, st.errors.Load())
			lastRecords, lastBytes, last = recs, bytes, now
		}
	}
}

// ensureStream creates stream with ranges ranges unless it exists.
func ensureStream(ctx context.Context, c *client.Client, stream string, ranges uint32) error {
	_, err := c.DescribeStream(ctx, stream)
	if client.CodeOf(err) != client.CodeStreamNotFound {
		return err
	}
	_, err = c.CreateStream(ctx, client.StreamConfig{Name: stream, RangeCount: ranges})
	if client.CodeOf(err) == client.CodeStreamExists {
		return nil // created concurrently
	}
	return err
}

func (e *env) bench(ctx context.Context, args []string) error {
	if len(args) > 0 {
		switch args[0] {
		case "cursors":
			return e.benchCursors(ctx, args[1:]) // benchgroups.go
		case "rebalance":
			return e.benchRebalance(ctx, args[1:])
		case "e2e":
			return e.benchE2E(ctx, args[1:]) // benche2e.go
		case "floor":
			return e.benchFloor(ctx, args[1:]) // benchfloor.go
		}
	}
	fs := e.flagSet("bench")
	var cfg BenchConfig
	fs.StringVar(&cfg.Stream, "stream", "bench", "stream to produce to (created if missing)")
	ranges := fs.Uint("ranges", 8, "range count of a stream the bench creates")
	fs.IntVar(&cfg.Producers, "producers", 1, "concurrent producers")
	fs.IntVar(&cfg.RecordBytes, "record-bytes", 1024, "value bytes per record")
	fs.IntVar(&cfg.Values, "values", 1, "distinct random values the records cycle through (1: every record the same; 4096 makes batches incompressible)")
	fs.IntVar(&cfg.InflightBatchesMax, "inflight", 1, "in-flight batches per range and producer (max 16)")
	fs.DurationVar(&cfg.Linger, "linger", 0, "producer linger")
	fs.IntVar(&cfg.BatchBytesMax, "batch-bytes", 1<<20, "batch bytes max")
	fs.Int64Var(&cfg.BufferedBytesMax, "buffer-bytes", 64<<20, "bytes each producer may buffer before Produce blocks")
	fs.DurationVar(&cfg.QueueDelayTarget, "queue-delay-target", client.QueueDelayTargetDefault,
		"each producer's queueing-delay target: its unsent records are held to what the stream acknowledged over this much time plus the network's round trip, all it holds to twice that (0: off, bytes only)")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "how long to produce (unless --count)")
	fs.Int64Var(&cfg.Count, "count", 0, "total records to produce (overrides --duration)")
	fs.IntVar(&cfg.Keys, "keys", 0, "distinct keys, round robin (0: keyless records)")
	fs.BoolVar(&cfg.Sync, "sync", false, "one at a time: wait for each ack before the next record")
	fs.Float64Var(&cfg.Rate, "rate", 0, "total records/s across producers (0: as fast as possible); latency then counts from each record's scheduled time")
	fs.BoolVar(&cfg.Breakdown, "breakdown", false, "ask the range leaders where each append's time went and print it stage by stage (producer wait, network, the leader's admission, queue, write, quorum and ack)")
	asJSON := fs.Bool("json", false, "print the result as one JSON object")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("bench takes no arguments")
	}
	switch {
	case *ranges == 0 || *ranges > 1<<16:
		return usagef("--ranges must be in [1, 65536]")
	case cfg.Producers < 1:
		return usagef("--producers must be at least 1")
	case cfg.RecordBytes < 1:
		return usagef("--record-bytes must be positive")
	case cfg.Values < 1 || int64(cfg.Values)*int64(cfg.RecordBytes) > 256<<20:
		return usagef("--values must be at least 1, and --values times --record-bytes at most 256 MiB")
	case cfg.Keys < 0 || cfg.Count < 0:
		return usagef("--keys and --count must not be negative")
	case cfg.InflightBatchesMax < 1 || cfg.InflightBatchesMax > client.InflightBatchesMaxLimit:
		return usagef("--inflight must be in [1, %d]", client.InflightBatchesMaxLimit)
	case cfg.Count == 0 && cfg.Duration <= 0:
		return usagef("--duration must be positive")
	case cfg.BatchBytesMax < 1:
		return usagef("--batch-bytes must be positive")
	case cfg.BufferedBytesMax < int64(cfg.BatchBytesMax):
		return usagef("--buffer-bytes must be at least --batch-bytes")
	}
	cfg.Ranges = uint32(*ranges)
	if cfg.QueueDelayTarget == 0 {
		cfg.QueueDelayTarget = -1 // the flag's 0 is off; the config's, the default
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	defer c.Close()
	res, err := RunBench(ctx, c, cfg, e.stderr)
	if err != nil {
		return err
	}
	if *asJSON {
		if err := json.NewEncoder(e.stdout).Encode(res); err != nil {
			return err
		}
	} else {
		printBench(e.stdout, res)
	}
	if !res.OK() {
		if res.Records == 0 && res.Errors == 0 {
			return errors.New("no record was acknowledged")
		}
		return fmt.Errorf("%d errors, %d order violations", res.Errors, res.OrderViolations)
	}
	return nil
}

func printBench(w io.Writer, r *BenchResult) {
	rate := "max"
	if r.Rate > 0 {
		rate = fmt.Sprintf("%.0f/s", r.Rate)
	}
	fmt.Fprintf(w, "stream %s: %d producers, %d-byte records, inflight %d, linger %gms, batch %d bytes, queue delay target %gms, keys %d, sync %v, rate %s\n",
		r.Stream, r.Producers, r.RecordBytes, r.InflightBatchesMax, r.LingerMs, r.BatchBytesMax, r.QueueDelayTargetMs, r.Keys, r.Sync, rate)
	fmt.Fprintf(w, "records     %d acked, %d errors, %d duplicates, %d order violations\n",
		r.Records, r.Errors, r.Duplicates, r.OrderViolations)
	for _, s := range r.ErrorSamples {
		fmt.Fprintf(w, "error       %s\n", s)
	}
	fmt.Fprintf(w, "elapsed     %.2fs\n", r.ElapsedSeconds)
	fmt.Fprintf(w, "throughput  %.0f records/s, %.2f MB/s\n", r.RecordsPerSec, r.MBPerSec)
	fmt.Fprintf(w, "latency ms  p50 %.3f  p99 %.3f  p99.9 %.3f  max %.3f  mean %.3f\n",
		r.LatencyMs.P50, r.LatencyMs.P99, r.LatencyMs.P999, r.LatencyMs.Max, r.LatencyMs.Mean)
	if m := r.MachineCPU; m != nil {
		fmt.Fprintf(w, "machine cpu busy %.1f%%  iowait %.1f%%  steal %.1f%% (taken by the host: a VM's CPU cap, each period a stall)\n", m.BusyPct, m.IowaitPct, m.StealPct)
	}
	printBreakdown(w, r.Breakdown, r.BreakdownUntimed)
}
