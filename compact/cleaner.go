package compact

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/segment"
)

// Log is what the cleaner needs of a range's segment store
// (*segment.Store).
type Log interface {
	Sealed() []segment.SegmentInfo
	WalkSegment(base uint64, throttle func(int), fn func(frame []byte, h batch.Header, last bool) error) error
	RewriteSegment(base uint64, throttle func(int), rewrite segment.RewriteFunc) (segment.RewriteStats, error)
}

// Job is one compaction of one copy: every sealed segment holding an
// offset below the decision's point is observed, and those that end at or
// below Limit (the part of the log the range lets the cleaner rewrite: on
// a Raft replica, what lies below its compaction point) and would change
// are rewritten.
type Job struct {
	// Name names the range in logs.
	Name     string
	Log      Log
	Decision batch.Compaction
	Limit    uint64
	// Done, if set, is called once with the result, on the cleaner's
	// goroutine; it must not block.
	Done func(Result)
}

// Result is what a job did.
type Result struct {
	Decision batch.Compaction
	// Complete: every segment below the point was within the limit, so the
	// copy now holds, below the point, exactly what the decision keeps.
	Complete bool
	// SegmentsRewritten and the bytes before and after them.
	SegmentsRewritten       int
	BytesBefore, BytesAfter int64
	// BytesIO counts the job's reads and writes.
	BytesIO  int64
	Keys     int
	Duration time.Duration
	Err      error
}

// CleanerConfig configures a Cleaner. Zero values take the defaults.
type CleanerConfig struct {
	// BytesPerSecond bounds the cleaner's reads and writes together, for
	// the whole node. Default 64 MiB/s; negative: unbounded.
	BytesPerSecond int64
	// MemoryBytesMax bounds each plan's keys (see NewPlan). Default
	// DefaultMemoryBytesMax.
	MemoryBytesMax int64
	// QueueMax bounds the jobs waiting; Submit refuses past it. Default
	// 1024.
	QueueMax int
	// Logger defaults to a null logger.
	Logger hclog.Logger
	// Sleep waits for the throttle; default time.Sleep (tests count).
	Sleep func(time.Duration)
	// Now is the clock of the throttle and of durations; default time.Now.
	Now func() time.Time
}

// ErrQueueFull reports a job refused because QueueMax jobs wait, or
// because a job of the same Log is already waiting or running.
var ErrQueueFull = errors.New("compact: cleaner queue is full or the range is queued")

// Cleaner runs compaction jobs one at a time on one goroutine (Run), so a
// node's compactions share one bounded stream of I/O. It is the driver of
// Plan: it walks and rewrites segments, the plan decides.
type Cleaner struct {
	cfg    CleanerConfig
	log    hclog.Logger
	mu     sync.Mutex
	queue  []Job
	queued map[Log]bool // waiting or running
	wake   chan struct{}

	// throttle state, owned by the Run goroutine
	budgetStart time.Time
	budgetBytes int64
}

// NewCleaner returns a cleaner; start it with Run.
func NewCleaner(cfg CleanerConfig) *Cleaner {
	if cfg.BytesPerSecond == 0 {
		cfg.BytesPerSecond = 64 << 20
	}
	if cfg.QueueMax <= 0 {
		cfg.QueueMax = 1024
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Sleep == nil {
		cfg.Sleep = time.Sleep
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Cleaner{cfg: cfg, log: cfg.Logger.Named("compact"), queued: map[Log]bool{}, wake: make(chan struct{}, 1)}
}

// Submit queues j. It never blocks: it returns ErrQueueFull when the
// queue is full or j's Log already has a job waiting or running (the range
// submits again on a later tick).
func (c *Cleaner) Submit(j Job) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) >= c.cfg.QueueMax || c.queued[j.Log] {
		return ErrQueueFull
	}
	c.queue = append(c.queue, j)
	c.queued[j.Log] = true
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return nil
}

// Run runs jobs until ctx ends; the job in progress when it does stops at
// its next frame (a rewrite not yet swapped in is dropped).
func (c *Cleaner) Run(ctx context.Context) {
	for {
		c.mu.Lock()
		var j Job
		ok := len(c.queue) > 0
		if ok {
			j = c.queue[0]
			c.queue = c.queue[1:]
		}
		c.mu.Unlock()
		if !ok {
			select {
			case <-c.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		res := c.RunJob(ctx, j)
		c.mu.Lock()
		delete(c.queued, j.Log)
		c.mu.Unlock()
		if j.Done != nil {
			j.Done(res)
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// RunJob runs one job now, on the calling goroutine, throttled like the
// queued ones. Run calls it; tests and tools may call it directly.
func (c *Cleaner) RunJob(ctx context.Context, j Job) Result {
	began := c.cfg.Now()
	res := Result{Decision: j.Decision}
	res.Err = c.runJob(ctx, j, &res)
	res.Duration = c.cfg.Now().Sub(began)
	switch {
	case res.Err != nil:
		c.log.Warn("compaction failed", "range", j.Name, "point", j.Decision.Point, "error", res.Err)
	case res.SegmentsRewritten > 0:
		c.log.Info("compacted", "range", j.Name, "point", j.Decision.Point, "segments", res.SegmentsRewritten,
			"bytes_before", res.BytesBefore, "bytes_after", res.BytesAfter, "keys", res.Keys,
			"complete", res.Complete, "duration", res.Duration)
	}
	return res
}

func (c *Cleaner) runJob(ctx context.Context, j Job, res *Result) error {
	var segs []segment.SegmentInfo
	for _, g := range j.Log.Sealed() {
		if g.BaseOffset < j.Decision.Point {
			segs = append(segs, g)
		}
	}
	if len(segs) == 0 {
		res.Complete = true
		return nil
	}
	throttle := func(n int) {
		res.BytesIO += int64(n)
		c.throttle(n)
	}
	plan := NewPlan(j.Decision, c.cfg.MemoryBytesMax)
	for _, g := range segs {
		if err := c.observe(ctx, j.Log, g, plan, throttle); err != nil {
			return err
		}
	}
	res.Keys = plan.Keys()
	res.Complete = true
	for _, g := range segs {
		if g.NextOffset > j.Limit {
			res.Complete = false
			break
		}
		if err := c.rewrite(ctx, j.Log, g, plan, res, throttle); err != nil {
			return err
		}
	}
	return nil
}

// observe hands every frame of segment g to the plan.
func (c *Cleaner) observe(ctx context.Context, log Log, g segment.SegmentInfo, plan *Plan, throttle func(int)) error {
	err := log.WalkSegment(g.BaseOffset, throttle, func(frame []byte, h batch.Header, last bool) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return plan.Observe(frame, h, last)
	})
	if err != nil {
		return fmt.Errorf("compact: read segment at %d: %w", g.BaseOffset, err)
	}
	return nil
}

// errChanged stops the walk of a segment that the plan changes.
var errChanged = errors.New("compact: segment changes")

// rewrite rewrites segment g if the plan changes any of its frames.
func (c *Cleaner) rewrite(ctx context.Context, log Log, g segment.SegmentInfo, plan *Plan, res *Result, throttle func(int)) error {
	err := log.WalkSegment(g.BaseOffset, throttle, func(frame []byte, h batch.Header, last bool) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		ch, err := plan.Changes(frame, h, last)
		if err == nil && ch {
			err = errChanged
		}
		return err
	})
	switch {
	case err == nil:
		return nil // nothing changes
	case !errors.Is(err, errChanged):
		return fmt.Errorf("compact: read segment at %d: %w", g.BaseOffset, err)
	}
	st, err := log.RewriteSegment(g.BaseOffset, throttle, func(dst, frame []byte, h batch.Header, last bool) ([]byte, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return plan.Rewrite(dst, frame, h, last)
	})
	if errors.Is(err, segment.ErrRewriteAbandoned) {
		res.Complete = false
		return nil
	}
	if err != nil {
		return fmt.Errorf("compact: rewrite segment at %d: %w", g.BaseOffset, err)
	}
	res.SegmentsRewritten++
	res.BytesBefore += st.BytesBefore
	res.BytesAfter += st.BytesAfter
	return nil
}

// throttle sleeps as needed to keep the cleaner at BytesPerSecond: it
// counts bytes in one-second windows and waits out a window it filled.
func (c *Cleaner) throttle(n int) {
	if c.cfg.BytesPerSecond < 0 {
		return
	}
	now := c.cfg.Now()
	if now.Sub(c.budgetStart) >= time.Second {
		c.budgetStart, c.budgetBytes = now, 0
	}
	c.budgetBytes += int64(n)
	if c.budgetBytes >= c.cfg.BytesPerSecond {
		c.cfg.Sleep(time.Second - now.Sub(c.budgetStart))
		c.budgetStart, c.budgetBytes = c.cfg.Now(), 0
	}
}
