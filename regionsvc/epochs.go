package regionsvc

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/homing"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// Epoch histories (the API's RangeInfo.epochs) and fork points (the
// PRODUCER_STATE_LOST error's fork_epoch and fork_offset).
//
// With homing on, the lease store records every epoch it grants (where
// it starts, which region, how: homing.EpochRecord): that is the history.
// A node reads a whole stream's at once (homing.Store.StreamHistory, one
// statement) and keeps it until one of the stream's ranges shows an epoch
// newer than the history holds; epochs change only by grants, so until
// then the cached history is as new as anything the node knows. Without
// homing a range has one epoch, from its creation.

const (
	// epochHistoryTimeout bounds the lease-store read behind a
	// DescribeStream.
	epochHistoryTimeout = 2 * time.Second
	// epochHistoryRetry is how long after a failed read a stream's
	// DescribeStream answers from what the node knows without trying the
	// store again: during a lease-store outage a describe (every new
	// producer's first call) must not wait out a timeout each time.
	epochHistoryRetry = 5 * time.Second
)

// epochHistories is a node's cache of its streams' epoch histories.
type epochHistories struct {
	mu sync.Mutex
	// byStream holds, per stream, every range's epochs, oldest first.
	byStream map[string][][]*geologv1.EpochStart
	// failed holds, per stream, when and why its last read failed.
	failed map[string]epochReadFailure
}

// forget drops what the cache holds of stream (deleted).
func (e *epochHistories) forget(stream string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.byStream, stream)
	delete(e.failed, stream)
}

type epochReadFailure struct {
	at  time.Time
	why string
}

// epochKinds maps the lease store's kinds to the API's.
var epochKinds = map[string]geologv1.EpochKind{
	homing.KindCreate:   geologv1.EpochKind_EPOCH_KIND_CREATE,
	homing.KindTakeover: geologv1.EpochKind_EPOCH_KIND_TAKEOVER,
	homing.KindRehome:   geologv1.EpochKind_EPOCH_KIND_REHOME,
}

// rangeEpochs returns every range's epoch history, and why it is
// incomplete ("" when it is not).
func (n *Node) rangeEpochs(ctx context.Context, st *streamState) ([][]*geologv1.EpochStart, string) {
	if n.cfg.LeaseStore == nil || n.homing == nil {
		out := make([][]*geologv1.EpochStart, len(st.ranges))
		for r, d := range st.ranges {
			role := d.role()
			out[r] = []*geologv1.EpochStart{{Epoch: role.epoch, HomeRegion: role.region, Kind: geologv1.EpochKind_EPOCH_KIND_CREATE}}
		}
		return out, ""
	}
	if cached, ok := n.cachedEpochs(st); ok {
		return cached, ""
	}
	n.epochs.mu.Lock()
	f, failed := n.epochs.failed[st.spec.Name]
	n.epochs.mu.Unlock()
	if failed && n.cfg.Now().Sub(f.at) < epochHistoryRetry {
		return n.knownEpochs(st), f.why
	}
	if why := n.readEpochs(ctx, st); why != "" {
		return n.knownEpochs(st), why
	}
	if cached, ok := n.cachedEpochs(st); ok {
		return cached, ""
	}
	// The store answered without an epoch this node has seen: its grant
	// is committed, so this is a read that raced it. Say what we know.
	return n.knownEpochs(st), "the lease store's epoch history lags this node's view; retry"
}

// readEpochs reads st's history from the lease store into the cache, or
// records and returns why it could not.
func (n *Node) readEpochs(ctx context.Context, st *streamState) string {
	cctx, cancel := context.WithTimeout(ctx, epochHistoryTimeout)
	recs, err := n.homing.store.StreamHistory(cctx, st.spec.Name)
	cancel()
	n.epochs.mu.Lock()
	defer n.epochs.mu.Unlock()
	if err != nil {
		why := "the lease store's epoch history could not be read: " + err.Error()
		if n.epochs.failed == nil {
			n.epochs.failed = map[string]epochReadFailure{}
		}
		n.epochs.failed[st.spec.Name] = epochReadFailure{at: n.cfg.Now(), why: why}
		return why
	}
	hist := make([][]*geologv1.EpochStart, len(st.ranges))
	for _, rec := range recs {
		if int(rec.Key.Range) >= len(hist) {
			continue
		}
		hist[rec.Key.Range] = append(hist[rec.Key.Range], &geologv1.EpochStart{
			Epoch: rec.Epoch, StartOffset: rec.StartOffset, HomeRegion: rec.Region, Kind: epochKinds[rec.Kind]})
	}
	if n.epochs.byStream == nil {
		n.epochs.byStream = map[string][][]*geologv1.EpochStart{}
	}
	n.epochs.byStream[st.spec.Name] = hist
	delete(n.epochs.failed, st.spec.Name)
	return ""
}

// cachedEpochs returns the cached history of st if it holds, for every
// range, the epoch the node knows now.
func (n *Node) cachedEpochs(st *streamState) ([][]*geologv1.EpochStart, bool) {
	n.epochs.mu.Lock()
	hist, ok := n.epochs.byStream[st.spec.Name]
	n.epochs.mu.Unlock()
	if !ok || len(hist) != len(st.ranges) {
		return nil, false
	}
	for r, d := range st.ranges {
		var last uint64
		if h := hist[r]; len(h) > 0 {
			last = h[len(h)-1].GetEpoch()
		}
		if last < d.role().epoch {
			return nil, false
		}
	}
	return hist, true
}

// knownEpochs is the history as far as the node knows it without the
// lease store: the cached history, with each range's current epoch added
// when the cache lacks it.
func (n *Node) knownEpochs(st *streamState) [][]*geologv1.EpochStart {
	n.epochs.mu.Lock()
	cached := n.epochs.byStream[st.spec.Name]
	n.epochs.mu.Unlock()
	out := make([][]*geologv1.EpochStart, len(st.ranges))
	for r, d := range st.ranges {
		if r < len(cached) {
			out[r] = append(out[r], cached[r]...)
		}
		epoch, start, region, ok := n.currentEpoch(d)
		if !ok {
			continue
		}
		if k := len(out[r]); k == 0 || out[r][k-1].GetEpoch() < epoch {
			out[r] = append(out[r], &geologv1.EpochStart{Epoch: epoch, StartOffset: start, HomeRegion: region})
		}
	}
	return out
}

// currentEpoch is the range's homing epoch as this node knows it now, the
// offset it started at and its home region; ok is false when the node
// does not know the range's home.
func (n *Node) currentEpoch(d *rangeDriver) (epoch, start uint64, region string, ok bool) {
	role := d.role()
	if n.homing == nil {
		return role.epoch, 0, role.region, role.epoch != 0
	}
	key := homing.RangeKey{Stream: d.cfg.stream, Range: d.cfg.rangeID}
	if h, found := n.homing.homes.View().Home(key); found {
		return h.Epoch, h.StartOffset, h.Region, true
	}
	n.homing.dirMu.Lock()
	h, found := n.homing.dir[key]
	n.homing.dirMu.Unlock()
	if found {
		return h.Epoch, h.StartOffset, h.Region, true
	}
	return 0, 0, "", false
}

// withForkPoint completes a PRODUCER_STATE_LOST error with its fork
// offset: the dedup table that gives it names the first epoch after the
// producer's newest batch in the log (ForkEpoch), and the lowest start of
// that epoch or any later one is where the log lost what the producer had
// acknowledged after that batch. It runs on the range driver's goroutine,
// so it reads only what the node holds in memory: the cached history, or,
// when ForkEpoch is the current epoch, the home record's start. When
// neither tells, ForkEpoch is cleared (unknown). Any other error is
// returned as is.
func (n *Node) withForkPoint(d *rangeDriver, err error) error {
	var e *apierr.Error
	if err == nil || !errors.As(err, &e) || e.Code != apierr.ProducerStateLost || e.ForkEpoch == 0 {
		return err
	}
	out := *e
	out.ForkEpoch, out.ForkOffset = 0, 0
	epoch, start, _, ok := n.currentEpoch(d)
	if hist := n.cachedRangeEpochs(d, epoch); hist != nil {
		if off, found := forkPoint(e.ForkEpoch, hist); found {
			out.ForkEpoch, out.ForkOffset = e.ForkEpoch, off
		}
	} else if ok && e.ForkEpoch == epoch {
		out.ForkEpoch, out.ForkOffset = epoch, start
	}
	return &out
}

// forkPoint is the lowest start offset of forkEpoch and every later epoch
// of hist (a takeover may continue below where an earlier epoch began);
// found is false when hist does not list forkEpoch.
func forkPoint(forkEpoch uint64, hist []*geologv1.EpochStart) (offset uint64, found bool) {
	for _, es := range hist {
		if es.GetEpoch() < forkEpoch {
			continue
		}
		if !found || es.GetStartOffset() < offset {
			offset = es.GetStartOffset()
		}
		found = found || es.GetEpoch() == forkEpoch
	}
	return offset, found
}

// cachedRangeEpochs returns the cached history of d's range if it reaches
// epoch (the range's current one), else nil.
func (n *Node) cachedRangeEpochs(d *rangeDriver, epoch uint64) []*geologv1.EpochStart {
	n.epochs.mu.Lock()
	defer n.epochs.mu.Unlock()
	hist := n.epochs.byStream[d.cfg.stream]
	if int(d.cfg.rangeID) >= len(hist) {
		return nil
	}
	h := hist[d.cfg.rangeID]
	if len(h) == 0 || h[len(h)-1].GetEpoch() < epoch {
		return nil
	}
	return h
}

// epochWarmStreamsMax bounds the streams whose history one round of
// warmEpochHistories reads.
const epochWarmStreamsMax = 8

// warmEpochHistories reads the history of the streams with a range homed
// here whose cached history lacks its current epoch (after a takeover or a
// rehome): a producer that lost its state there gets an exact fork point
// from memory. The lease store sees one statement per such stream, once
// per change of epoch. Runs on the homing loop.
func (n *Node) warmEpochHistories(ctx context.Context) {
	stale := map[string]*streamState{}
	for _, h := range n.homing.homes.View().Homes() {
		if len(stale) >= epochWarmStreamsMax {
			break
		}
		n.mu.RLock()
		st := n.streams[h.Key.Stream]
		n.mu.RUnlock()
		if st == nil || h.Epoch <= 1 || int(h.Key.Range) >= len(st.ranges) || n.cachedRangeEpochs(st.ranges[h.Key.Range], h.Epoch) != nil {
			continue
		}
		stale[h.Key.Stream] = st
	}
	for _, st := range stale {
		n.rangeEpochs(ctx, st)
	}
}
