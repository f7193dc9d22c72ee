package regionsvc

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/replica"
	"github.com/geolog/geolog/segment"
)

// Background re-encryption (encryption at rest, after a data key
// rotation): a node with a keyring runs one resealer, which
//
//  0. on each pass, starts a new data key if the active one is older than
//     Config.DataKeyRotationPeriod (as the node does at startup);
//  1. at start and every Config.ResealInterval, has every range's segment
//     store roll an active segment that starts under an older key
//     (segment.Store.RollStale: an idle range would keep it for good),
//     asks it for its sealed segments holding frames not under the active
//     data key (segment.Store.ResealPending: one unit header per sealed
//     segment; the active segment is never among them) and its orphan
//     log for forks in the same case, and publishes how many files that
//     makes (the gauge geolog.atrest.segments_pending_reseal);
//  2. rewrites them one at a time, oldest first, with
//     segment.Store.ResealContext: the same frames, each sealed under the
//     active key, written to a new file, fsynced, renamed over the old one
//     and the directory fsynced (RewriteSegment), at most
//     Config.ResealBytesPerSecond of reads and writes together for the
//     whole node;
//  3. holds the range's rewrite lock for each segment, which the node's
//     compaction cleaner holds too (rewriteLog): one rewrite of a store at
//     a time. Retention, truncation and snapshot installs need no lock:
//     a segment they delete or replace meanwhile abandons the rewrite
//     (segment.ErrRewriteAbandoned), and readers of the old file finish on
//     it (the store counts references), so no reader sees a missing file.
//
// Each range's orphan log is re-encrypted the same way, fork by fork
// (replica.OrphanStore.ResealPending and Reseal, under the orphan store's
// own writer lock).

// Defaults of Config.ResealInterval and Config.ResealBytesPerSecond.
const (
	defaultResealInterval       = 10 * time.Minute
	defaultResealBytesPerSecond = 16 << 20
)

// resealer is the node's background re-encryption (above).
type resealer struct {
	n        *Node
	interval time.Duration
	limit    *byteRate
	pending  atomic.Int64
	stop     context.CancelFunc
	done     chan struct{}
	// resealed counts segments rewritten (tests, logs).
	resealed atomic.Int64
}

// startResealer starts the resealer of a node with a keyring; a node
// without one, or with a negative ResealBytesPerSecond, runs none.
func (n *Node) startResealer() {
	if n.keyring == nil || n.cfg.ResealBytesPerSecond < 0 {
		return
	}
	rate := n.cfg.ResealBytesPerSecond
	if rate == 0 {
		rate = defaultResealBytesPerSecond
	}
	interval := n.cfg.ResealInterval
	if interval <= 0 {
		interval = defaultResealInterval
	}
	ctx, cancel := context.WithCancel(context.Background())
	rs := &resealer{n: n, interval: interval, limit: newByteRate(rate, ctx), stop: cancel, done: make(chan struct{})}
	n.resealer.Store(rs)
	go func() {
		defer close(rs.done)
		rs.run(ctx)
	}()
}

// stopResealer stops the resealer and waits for it; a rewrite in progress
// is dropped at its next frame.
func (n *Node) stopResealer() {
	if rs := n.resealer.Load(); rs != nil {
		rs.stop()
		<-rs.done
	}
}

// run is the resealer's loop: a pass at once, then one per interval.
func (rs *resealer) run(ctx context.Context) {
	t := time.NewTicker(rs.interval)
	defer t.Stop()
	for {
		rs.pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pass rotates the data key if it is due, counts the files pending on
// every range, then reseals them.
func (rs *resealer) pass(ctx context.Context) {
	if rotated, err := rotateIfDue(ctx, rs.n.cfg, rs.n.keyring); err != nil {
		rs.n.logger.Error("data key rotation failed", "error", err)
	} else if rotated {
		rs.n.logger.Info("rotated the data key: the rotation period passed", "active", rs.n.keyring.Active())
	}
	type job struct {
		d     *rangeDriver
		segs  []segment.SegmentInfo
		forks []uint64
	}
	var jobs []job
	total := 0
	for _, d := range rs.n.allRanges() {
		if d.store == nil || d.failure.Load() != nil {
			continue
		}
		if _, err := d.store.RollStale(); err != nil {
			d.logger.Warn("re-encryption: roll the active segment", "error", err)
			continue
		}
		segs, err := d.store.ResealPending()
		if err != nil {
			d.logger.Warn("re-encryption: list segments", "error", err)
			continue
		}
		var forks []uint64
		if d.orphans != nil {
			forks = d.orphans.ResealPending()
		}
		if len(segs)+len(forks) > 0 {
			jobs = append(jobs, job{d, segs, forks})
			total += len(segs) + len(forks)
		}
	}
	rs.pending.Store(int64(total))
	if total == 0 {
		return
	}
	rs.n.logger.Info("re-encrypting segments and orphan logs under the active data key", "files", total, "key", rs.n.keyring.Active())
	for _, j := range jobs {
		for _, g := range j.segs {
			if ctx.Err() != nil {
				return
			}
			if err := rs.reseal(ctx, j.d, g); err != nil {
				j.d.logger.Warn("re-encryption of a segment failed", "base", g.BaseOffset, "error", err)
			}
			rs.pending.Add(-1)
		}
		for _, index := range j.forks {
			if ctx.Err() != nil || j.d.failure.Load() != nil {
				return
			}
			err := j.d.orphans.Reseal(ctx, index, rs.limit.wait)
			switch {
			case err == nil:
				rs.resealed.Add(1)
			case errors.Is(err, replica.ErrForkNotFound), ctx.Err() != nil:
			default:
				j.d.logger.Warn("re-encryption of an orphan log failed", "fork", index, "error", err)
			}
			rs.pending.Add(-1)
		}
	}
}

// reseal rewrites one segment under the range's rewrite lock. A segment
// gone or changed meanwhile is not an error.
func (rs *resealer) reseal(ctx context.Context, d *rangeDriver, g segment.SegmentInfo) error {
	if d.failure.Load() != nil {
		return nil
	}
	d.rewriteMu.Lock()
	defer d.rewriteMu.Unlock()
	st, err := d.store.ResealContext(ctx, g.BaseOffset, rs.limit.wait)
	switch {
	case errors.Is(err, segment.ErrRewriteAbandoned), errors.Is(err, segment.ErrClosed), ctx.Err() != nil:
		return nil
	case err != nil:
		return err
	}
	rs.resealed.Add(1)
	d.logger.Debug("re-encrypted segment", "base", g.BaseOffset, "bytes", st.BytesAfter)
	return nil
}

// allRanges returns every range driver of the node, the catalogue's
// included.
func (n *Node) allRanges() []*rangeDriver {
	n.mu.RLock()
	defer n.mu.RUnlock()
	var all []*rangeDriver
	for _, st := range n.streams {
		for _, d := range st.ranges {
			if d != nil {
				all = append(all, d)
			}
		}
	}
	if n.replicated() && n.region.meta != nil {
		all = append(all, n.region.meta)
	}
	return all
}

// registerResealMetrics adds the gauge of segments pending re-encryption.
func (n *Node) registerResealMetrics(mp metric.MeterProvider) error {
	m := mp.Meter("github.com/geolog/geolog/regionsvc")
	g, err := m.Int64ObservableGauge("geolog.atrest.segments_pending_reseal",
		metric.WithDescription("sealed segments and orphan log forks holding frames not under the active data key, as of the resealer's last pass, less those it rewrote since"),
		metric.WithUnit("{segment}"))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		if rs := n.resealer.Load(); rs != nil {
			o.ObserveInt64(g, rs.pending.Load())
		}
		return nil
	}, g)
	return err
}

// rewriteLog is a range's segment store as the compaction cleaner sees
// it: its rewrites take the range's rewrite lock, which the resealer
// takes too, so that the two never rewrite one store at once. It is a
// comparable value: the cleaner keys its queue by it.
type rewriteLog struct {
	*segment.Store
	mu *sync.Mutex
}

// RewriteSegment implements compact.Log under the rewrite lock.
func (l rewriteLog) RewriteSegment(base uint64, throttle func(int), rewrite segment.RewriteFunc) (segment.RewriteStats, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.Store.RewriteSegment(base, throttle, rewrite)
}

var _ interface {
	RewriteSegment(uint64, func(int), segment.RewriteFunc) (segment.RewriteStats, error)
	WalkSegment(uint64, func(int), func([]byte, batch.Header, bool) error) error
} = rewriteLog{}

// byteRate bounds a stream of I/O to bytesPerSecond, counted in
// one-second windows (as the compaction cleaner's throttle); a wait ends
// early when ctx does.
type byteRate struct {
	bytesPerSecond int64
	ctx            context.Context
	mu             sync.Mutex
	start          time.Time
	bytes          int64
}

func newByteRate(bytesPerSecond int64, ctx context.Context) *byteRate {
	return &byteRate{bytesPerSecond: bytesPerSecond, ctx: ctx}
}

// wait counts n bytes and sleeps out the window once it is full.
func (r *byteRate) wait(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if now.Sub(r.start) >= time.Second {
		r.start, r.bytes = now, 0
	}
	r.bytes += int64(n)
	if r.bytes < r.bytesPerSecond {
		return
	}
	t := time.NewTimer(time.Second - now.Sub(r.start))
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.ctx.Done():
	}
	r.start, r.bytes = time.Now(), 0
}
