package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/keyspace"
)

// The consumer figures (make bench-groups): cursor commits per second, and
// how long a group takes to consume every range again after a member
// leaves, is killed, or joins.

// CursorBenchResult is what bench cursors measured.
type CursorBenchResult struct {
	Stream      string         `json:"stream"`
	Ranges      uint32         `json:"ranges"`
	Cursors     int            `json:"cursors"`
	Concurrency int            `json:"concurrency"`
	Requests    int64          `json:"requests"`
	Positions   int64          `json:"positions"`
	Applied     int64          `json:"applied"`
	Errors      int64          `json:"errors"`
	Elapsed     float64        `json:"elapsed_seconds"`
	PerSec      float64        `json:"positions_per_sec"`
	RequestMs   LatencySummary `json:"request_latency_ms"`
}

func (e *env) benchCursors(ctx context.Context, args []string) error {
	fs := e.flagSet("bench cursors")
	stream := fs.String("stream", "bench-cursors", "stream the cursors point into (created if missing)")
	ranges := fs.Uint("ranges", 64, "its range count, if created: the positions of one commit (one per range)")
	cursors := fs.Int("cursors", 64, "distinct cursor names, committed round robin")
	concurrency := fs.Int("concurrency", 16, "commits in flight")
	duration := fs.Duration("duration", 10*time.Second, "how long to commit")
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	if *ranges == 0 || *ranges > 4096 || *cursors < 1 || *concurrency < 1 || *duration <= 0 {
		return usagef("bench cursors: --ranges in [1, 4096]; --cursors, --concurrency, --duration positive")
	}
	c, rangeCount, err := e.benchStream(ctx, *stream, uint32(*ranges))
	if err != nil {
		return err
	}
	defer c.Close()
	res := runCursorBench(ctx, c, *stream, rangeCount, *cursors, *concurrency, *duration, e.stderr)
	if *asJSON {
		return json.NewEncoder(e.stdout).Encode(res)
	}
	fmt.Fprintf(e.stdout, "cursor commits: %d cursors x %d ranges, %d in flight, %.1fs\n", res.Cursors, res.Ranges, res.Concurrency, res.Elapsed)
	fmt.Fprintf(e.stdout, "requests    %d (%d errors)\n", res.Requests, res.Errors)
	fmt.Fprintf(e.stdout, "positions   %d committed, %d applied\n", res.Positions, res.Applied)
	fmt.Fprintf(e.stdout, "throughput  %.0f positions/s\n", res.PerSec)
	fmt.Fprintf(e.stdout, "latency ms  p50 %.2f  p99 %.2f  max %.2f (one commit request)\n", res.RequestMs.P50, res.RequestMs.P99, res.RequestMs.Max)
	if res.Errors > 0 {
		return fmt.Errorf("%d commits failed", res.Errors)
	}
	return nil
}

// benchStream dials the cluster and creates the bench's stream if it is
// missing; it returns the stream's range count.
func (e *env) benchStream(ctx context.Context, stream string, ranges uint32) (*client.Client, uint32, error) {
	c, err := e.client(client.RetryBackoff(20*time.Millisecond, time.Second))
	if err != nil {
		return nil, 0, err
	}
	if err := ensureStream(ctx, c, stream, ranges); err != nil {
		c.Close()
		return nil, 0, err
	}
	d, err := c.DescribeStream(ctx, stream)
	if err != nil {
		c.Close()
		return nil, 0, err
	}
	return c, d.Stream.RangeCount, nil
}

// runCursorBench commits every range's position of round-robin cursors,
// offsets rising by one per commit of a cursor, concurrency requests at a
// time; a feeder appends a record to every range ahead of the highest
// offset committed, so that no commit names an offset past the tail.
func runCursorBench(ctx context.Context, c *client.Client, stream string, ranges uint32, cursors, concurrency int, dur time.Duration, log io.Writer) *CursorBenchResult {
	res := &CursorBenchResult{Stream: stream, Ranges: ranges, Cursors: cursors, Concurrency: concurrency}
	// Cursor names are new in every run: a commit of a cursor of an
	// earlier run would not raise it, and would cost no write.
	prefix := fmt.Sprintf("bench-%d-", time.Now().UnixNano())
	var next atomic.Int64 // commit count: cursor = n % cursors, offset = n / cursors + 1
	var tail atomic.Int64 // every range holds at least this many records
	var requests, positions, applied, errs atomic.Int64
	hist := hdrhistogram.New(1, benchLatencyMaxMicros, 3)
	var hmu sync.Mutex
	ctx, cancel := context.WithTimeout(ctx, dur)
	defer cancel()
	feedDone := make(chan struct{})
	go func() { defer close(feedDone); feedRanges(ctx, c, stream, ranges, cursors, &next, &tail, log) }()
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				n := next.Add(1) - 1
				offset := n/int64(cursors) + 1
				for offset > tail.Load() && ctx.Err() == nil {
					time.Sleep(time.Millisecond)
				}
				ps := make([]client.CursorPosition, ranges)
				for r := range ps {
					ps[r] = client.CursorPosition{Stream: stream, Range: uint32(r), Offset: uint64(offset)}
				}
				began := time.Now()
				out, err := c.CommitCursors(context.Background(), fmt.Sprintf("%s%d", prefix, n%int64(cursors)), ps...)
				hmu.Lock()
				_ = hist.RecordValue(min(time.Since(began).Microseconds(), benchLatencyMaxMicros))
				hmu.Unlock()
				requests.Add(1)
				if err != nil {
					if errs.Add(1) <= 3 {
						fmt.Fprintf(log, "commit: %v\n", err)
					}
					continue
				}
				positions.Add(int64(len(out)))
				for _, o := range out {
					if o.Applied {
						applied.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	<-feedDone
	res.Elapsed = time.Since(start).Seconds()
	res.Requests, res.Positions, res.Applied, res.Errors = requests.Load(), positions.Load(), applied.Load(), errs.Load()
	res.PerSec = float64(res.Positions) / res.Elapsed
	ms := func(us int64) float64 { return float64(us) / 1000 }
	res.RequestMs = LatencySummary{P50: ms(hist.ValueAtQuantile(50)), P99: ms(hist.ValueAtQuantile(99)), P999: ms(hist.ValueAtQuantile(99.9)),
		Max: ms(hist.Max()), Mean: hist.Mean() / 1000}
	return res
}

// feedRanges keeps every range's tail ahead of the offsets the committers
// are about to use (by 200 commits per cursor).
func feedRanges(ctx context.Context, c *client.Client, stream string, ranges uint32, cursors int, next, tail *atomic.Int64, log io.Writer) {
	p, err := c.NewProducer(stream, client.Linger(5*time.Millisecond))
	if err != nil {
		fmt.Fprintf(log, "feeder: %v\n", err)
		return
	}
	defer p.Close()
	const ahead = 200
	keys := rangeKeys(ranges)
	for ctx.Err() == nil {
		want := next.Load()/int64(cursors) + ahead
		have := tail.Load()
		if have >= want {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		for i := have; i < want; i++ {
			for _, k := range keys {
				p.Produce(ctx, &client.Record{Key: k, Value: []byte("x")}, nil)
			}
		}
		if err := p.Flush(ctx); err != nil {
			if ctx.Err() == nil {
				fmt.Fprintf(log, "feeder: %v\n", err)
			}
			return
		}
		tail.Store(want)
	}
}

// rangeKeys finds one key per range of a stream of n ranges.
func rangeKeys(n uint32) [][]byte {
	keys := make([][]byte, n)
	found := uint32(0)
	for i := 0; found < n; i++ {
		k := []byte(fmt.Sprintf("k%d", i))
		if r := keyspace.RangeForKey(k, n); keys[r] == nil {
			keys[r] = k
			found++
		}
	}
	return keys
}

// RebalanceBenchResult is what bench rebalance measured: for each kind of
// event, how long after it every range was consumed again.
type RebalanceBenchResult struct {
	Stream   string                    `json:"stream"`
	Ranges   uint32                    `json:"ranges"`
	Members  int                       `json:"members"`
	Session  float64                   `json:"session_timeout_seconds"`
	Events   map[string]LatencySummary `json:"rebalance_ms"`
	Samples  map[string][]float64      `json:"samples_ms"`
	Failures []string                  `json:"failures,omitempty"`
}

func (e *env) benchRebalance(ctx context.Context, args []string) error {
	fs := e.flagSet("bench rebalance")
	stream := fs.String("stream", "bench-rebalance", "stream to consume (created if missing)")
	ranges := fs.Uint("ranges", 64, "its range count, if created")
	members := fs.Int("members", 8, "group members")
	rounds := fs.Int("rounds", 5, "rounds of events (a leave, a join, a kill, a join)")
	session := fs.Duration("session", 3*time.Second, "members' session timeout")
	rate := fs.Int("rate", 20, "records per second per range, so that consumption shows")
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	if *ranges == 0 || *members < 2 || *rounds < 1 || *rate < 1 {
		return usagef("bench rebalance: --ranges positive, --members at least 2, --rounds and --rate positive")
	}
	c, rangeCount, err := e.benchStream(ctx, *stream, uint32(*ranges))
	if err != nil {
		return err
	}
	defer c.Close()
	res, err := runRebalanceBench(ctx, c, *stream, rangeCount, *members, *rounds, *session, *rate, e.stderr)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(e.stdout).Encode(res)
	}
	fmt.Fprintf(e.stdout, "rebalance: %d ranges, %d members, session %v, %d rounds\n", res.Ranges, res.Members, *session, *rounds)
	for _, ev := range []string{"leave", "kill", "join"} {
		s := res.Events[ev]
		fmt.Fprintf(e.stdout, "%-6s  p50 %7.0f ms  p99 %7.0f ms  max %7.0f ms  (%d samples)\n", ev, s.P50, s.P99, s.Max, len(res.Samples[ev]))
	}
	if len(res.Failures) > 0 {
		return fmt.Errorf("%d events did not settle: %v", len(res.Failures), res.Failures)
	}
	return nil
}

// deliveries tracks, per range, which member last delivered a record and
// when.
type deliveries struct {
	mu   sync.Mutex
	last map[uint32]delivered
}

type delivered struct {
	member string
	at     time.Time
}

func (d *deliveries) record(member string, rng uint32) {
	d.mu.Lock()
	d.last[rng] = delivered{member, time.Now()}
	d.mu.Unlock()
}

// settled reports whether every range in rngs was delivered after t by a
// member other than gone.
func (d *deliveries) settled(rngs []uint32, t time.Time, gone string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range rngs {
		l, ok := d.last[r]
		if !ok || !l.at.After(t) || l.member == gone {
			return false
		}
	}
	return true
}

// runRebalanceBench runs members in this process against the cluster,
// with a producer feeding every range, and times rounds of events: a
// member closes (graceful leave: its ranges must be consumed by others), a
// member joins (it must consume its share), a member is abandoned (killed:
// its ranges must be consumed by others after its session times out), a
// member joins again.
func runRebalanceBench(ctx context.Context, c *client.Client, stream string, ranges uint32, members, rounds int, session time.Duration, rate int, log io.Writer) (*RebalanceBenchResult, error) {
	res := &RebalanceBenchResult{Stream: stream, Ranges: ranges, Members: members, Session: session.Seconds(),
		Events: map[string]LatencySummary{}, Samples: map[string][]float64{}}
	group := fmt.Sprintf("bench-rebalance-%d", time.Now().UnixNano())
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go produceSteadily(ctx, c, stream, ranges, rate, log)
	rb := &rebalancer{c: c, stream: stream, group: group, session: session, del: &deliveries{last: map[uint32]delivered{}}, ctx: ctx}
	defer rb.closeAll()
	for i := 0; i < members; i++ {
		if err := rb.add(); err != nil {
			return nil, err
		}
	}
	all := make([]uint32, ranges)
	for r := range all {
		all[r] = uint32(r)
	}
	if !rb.waitSettled(all, time.Now(), "", 60*time.Second) {
		return nil, fmt.Errorf("the group never consumed every range")
	}
	for round := 0; round < rounds; round++ {
		for _, ev := range []string{"leave", "join", "kill", "join"} {
			ms, err := rb.event(ev, ranges)
			if err != nil {
				res.Failures = append(res.Failures, fmt.Sprintf("round %d %s: %v", round, ev, err))
				continue
			}
			res.Samples[ev] = append(res.Samples[ev], ms)
			fmt.Fprintf(log, "round %d %-5s %.0f ms\n", round, ev, ms)
		}
	}
	for ev, s := range res.Samples {
		res.Events[ev] = summarize(s)
	}
	return res, nil
}

func summarize(s []float64) LatencySummary {
	sorted := slices.Clone(s)
	slices.Sort(sorted)
	at := func(q float64) float64 { return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))] }
	var sum float64
	for _, v := range sorted {
		sum += v
	}
	return LatencySummary{P50: at(0.5), P99: at(0.99), Max: sorted[len(sorted)-1], Mean: sum / float64(len(sorted))}
}

// rebalancer runs a bench group's members.
type rebalancer struct {
	c       *client.Client
	stream  string
	group   string
	session time.Duration
	del     *deliveries
	ctx     context.Context

	mu      sync.Mutex
	members []*benchMember
	seq     int
}

type benchMember struct {
	g    *client.GroupConsumer
	stop context.CancelFunc
	done chan struct{}
}

// add starts a member consuming in its own goroutine.
func (rb *rebalancer) add() error {
	rb.mu.Lock()
	rb.seq++
	id := fmt.Sprintf("m%d", rb.seq)
	rb.mu.Unlock()
	g, err := rb.c.NewGroupConsumer(rb.stream, rb.group, client.GroupMemberID(id), client.SessionTimeout(rb.session),
		client.StartFrom(client.StartLatest))
	if err != nil {
		return err
	}
	ctx, stop := context.WithCancel(rb.ctx)
	m := &benchMember{g: g, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		for rec, err := range g.Records(ctx) {
			if err != nil {
				return
			}
			rb.del.record(id, rec.Range)
		}
	}()
	rb.mu.Lock()
	rb.members = append(rb.members, m)
	rb.mu.Unlock()
	return nil
}

// remove takes the oldest member out (Close, or Abandon for a kill) and
// returns its id and the ranges it owned.
func (rb *rebalancer) remove(kill bool) (string, []uint32) {
	rb.mu.Lock()
	m := rb.members[0]
	rb.members = rb.members[1:]
	rb.mu.Unlock()
	owned := m.g.Assigned()
	m.stop()
	<-m.done
	if kill {
		m.g.Abandon()
	} else {
		m.g.Close()
	}
	return m.g.MemberID(), owned
}

func (rb *rebalancer) closeAll() {
	rb.mu.Lock()
	ms := rb.members
	rb.members = nil
	rb.mu.Unlock()
	for _, m := range ms {
		m.stop()
		<-m.done
		m.g.Close()
	}
}

// event makes one event happen and returns how long until it settled, in
// milliseconds.
func (rb *rebalancer) event(ev string, ranges uint32) (float64, error) {
	t0 := time.Now()
	switch ev {
	case "leave", "kill":
		gone, owned := rb.remove(ev == "kill")
		limit := 30*time.Second + rb.session
		if !rb.waitSettled(owned, t0, gone, limit) {
			return 0, fmt.Errorf("ranges %v not consumed again within %v", owned, limit)
		}
	case "join":
		if err := rb.add(); err != nil {
			return 0, err
		}
		rb.mu.Lock()
		m := rb.members[len(rb.members)-1]
		share := int(ranges) / len(rb.members)
		rb.mu.Unlock()
		if !rb.waitJoined(m, share, t0, 30*time.Second) {
			return 0, fmt.Errorf("the new member did not consume its share of %d ranges", share)
		}
	}
	return float64(time.Since(t0).Microseconds()) / 1000, nil
}

func (rb *rebalancer) waitSettled(rngs []uint32, t0 time.Time, gone string, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if rb.del.settled(rngs, t0, gone) {
			return true
		}
		time.Sleep(2 * time.Millisecond)
	}
	return false
}

// waitJoined waits until the new member delivered records of share
// distinct ranges after t0.
func (rb *rebalancer) waitJoined(m *benchMember, share int, t0 time.Time, limit time.Duration) bool {
	id := m.g.MemberID()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		rb.del.mu.Lock()
		n := 0
		for _, l := range rb.del.last {
			if l.member == id && l.at.After(t0) {
				n++
			}
		}
		rb.del.mu.Unlock()
		if n >= share {
			return true
		}
		time.Sleep(2 * time.Millisecond)
	}
	return false
}

// produceSteadily appends rate records per second to every range until
// ctx ends.
func produceSteadily(ctx context.Context, c *client.Client, stream string, ranges uint32, rate int, log io.Writer) {
	p, err := c.NewProducer(stream)
	if err != nil {
		fmt.Fprintf(log, "producer: %v\n", err)
		return
	}
	defer p.Close()
	keys := rangeKeys(ranges)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			for _, k := range keys {
				p.Produce(ctx, &client.Record{Key: k, Value: []byte("r")}, nil)
			}
		}
	}
}
