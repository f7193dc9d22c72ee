package chaos

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/keyspace"
	"github.com/hashicorp/go-hclog"
)

// workload drives the clients of one scenario and records every operation
// and every record read into the history:
//
//   - producers: idempotent client.Producers, each with a client that
//     knows one region's nodes; each writes all keys in turn, paced, with
//     a sequence number per key in the value (EncodeValue);
//   - consumers: in every region, a Subscribe from offset 0 of every range
//     (resubscribing where a subscription gives up);
//   - tail readers: per range, reads at the home with consistency "home"
//     of everything new, recorded as linearizable reads of (tail, hash).
type workload struct {
	w       Workload
	cl      Cluster
	stream  string
	regions []string
	homes   []string
	rec     *recorder
	log     hclog.Logger

	clients map[string]*client.Client // by region
	keys    []string                  // every key; key i is in range keyRange[i]
	keyRng  []uint32

	producers   []*client.Producer
	stopProduce chan struct{}
	produceWG   sync.WaitGroup

	readCancel  context.CancelFunc
	readWG      sync.WaitGroup
	tailCancel  context.CancelFunc
	tailWG      sync.WaitGroup
	posMu       sync.Mutex
	positions   map[regionRange]*consumerPos // consumers' progress; ranges appear as they split
	tailsMu     sync.Mutex
	tailStarted map[uint32]bool // ranges with a tail reader
	outstanding atomic.Int64    // records produced, callback not yet run
}

// newClient returns an SDK client that knows region's nodes.
func newClient(cl Cluster, region string) (*client.Client, error) {
	opts := []client.Opt{client.RetryBackoff(20*time.Millisecond, 500*time.Millisecond), client.RequestTimeout(5 * time.Second)}
	if cfg := cl.ClientTLS(); cfg != nil {
		opts = append(opts, client.TLSConfig(cfg))
	}
	return client.New(clientAddrs(cl, region), opts...)
}

func newWorkload(w Workload, cl Cluster, stream string, regions, homes []string, rec *recorder, log hclog.Logger) (*workload, error) {
	wl := &workload{w: w, cl: cl, stream: stream, regions: regions, homes: homes, rec: rec, log: log,
		clients: map[string]*client.Client{}, stopProduce: make(chan struct{}), positions: map[regionRange]*consumerPos{},
		tailStarted: map[uint32]bool{}}
	for _, r := range regions {
		c, err := newClient(cl, r)
		if err != nil {
			wl.close()
			return nil, err
		}
		wl.clients[r] = c
	}
	// KeysPerRange keys in each range, interleaved so that writing them in
	// turn spreads the load over the ranges.
	perRange := make([][]string, w.Ranges)
	for i, need := 0, int(w.Ranges)*w.KeysPerRange; need > 0; i++ {
		k := fmt.Sprintf("k%d", i)
		r := keyspace.RangeForKey([]byte(k), w.Ranges)
		if len(perRange[r]) < w.KeysPerRange {
			perRange[r] = append(perRange[r], k)
			need--
		}
	}
	for j := range w.KeysPerRange {
		for r := range w.Ranges {
			wl.keys = append(wl.keys, perRange[r][j])
			wl.keyRng = append(wl.keyRng, r)
		}
	}
	return wl, nil
}

func (wl *workload) close() {
	for _, c := range wl.clients {
		c.Close()
	}
}

// classify maps a failed append to its outcome: only errors that refuse a
// record before it is appended are definite; everything else (timeouts,
// closed producers, lost connections, retriable codes) may or may not have
// appended it.
func classify(err error) Outcome {
	switch client.CodeOf(err) {
	case client.CodeInvalidArgument, client.CodeRecordTooLarge, client.CodeBatchTooLarge, client.CodeEmptyBatch,
		client.CodeStreamNotFound, client.CodeRangeNotFound, client.CodeSequenceGap,
		client.CodePermissionDenied, client.CodeUnauthenticated:
		return Fail
	}
	return Info
}

// startProducers starts the producers; stopProducers stops them.
func (wl *workload) startProducers(ctx context.Context) error {
	var regions []string
	for p := range wl.w.Producers {
		regions = append(regions, wl.w.ProducerRegions[p%len(wl.w.ProducerRegions)])
	}
	wl.rec.setProducerRegions(regions)
	for p := range wl.w.Producers {
		region := wl.w.ProducerRegions[p%len(wl.w.ProducerRegions)]
		prod, err := wl.clients[region].NewProducer(wl.stream,
			client.InflightBatchesMax(wl.w.InflightBatchesMax), client.DeliveryTimeout(wl.w.DeliveryTimeout.Std()),
			client.ProducerRetryBackoff(20*time.Millisecond, 500*time.Millisecond))
		if err != nil {
			return err
		}
		wl.producers = append(wl.producers, prod)
		wl.produceWG.Add(1)
		go wl.produce(ctx, p, prod)
	}
	return nil
}

func (wl *workload) produce(ctx context.Context, p int, prod *client.Producer) {
	defer wl.produceWG.Done()
	seq := make([]uint64, len(wl.keys))
	tick := time.NewTicker(time.Duration(float64(time.Second) / wl.w.RatePerProducer))
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-wl.stopProduce:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		k := (i + p) % len(wl.keys) // producers start on different keys
		key, rng := wl.keys[k], wl.keyRng[k]
		value := EncodeValue(p, key, seq[k], wl.w.ValueBytes)
		seq[k]++
		call := wl.rec.now()
		wl.outstanding.Add(1)
		prod.Produce(ctx, &client.Record{Key: []byte(key), Value: []byte(value)}, func(res client.ProduceResult, err error) {
			defer wl.outstanding.Add(-1)
			op := Op{Kind: OpAppend, Process: p, Range: rng, Call: call, Return: wl.rec.now(), Key: key, Value: value, Outcome: OK}
			if err != nil {
				op.Outcome, op.Err = classify(err), err.Error()
			} else {
				op.Offset, op.Epoch, op.Duplicate = res.Offset, res.Epoch, res.Duplicate
				if res.Range != rng {
					// The SDK hashed the key elsewhere: record where it
					// says, and the checker will find the mismatch.
					op.Range = res.Range
				}
			}
			wl.rec.addOp(op)
		})
	}
}

// stopProducers stops producing, flushes for up to flushTimeout and closes
// the producers: records still unacknowledged then fail with ErrClosed
// (ambiguous).
func (wl *workload) stopProducers(flushTimeout time.Duration) {
	close(wl.stopProduce)
	wl.produceWG.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, p := range wl.producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.Flush(ctx); err != nil {
				wl.log.Warn("flush did not complete", "error", err, "outstanding", wl.outstanding.Load())
			}
			p.Close()
		}()
	}
	wg.Wait()
}

// startReaders starts the consumers of every region and the tail readers.
func (wl *workload) startReaders(ctx context.Context) {
	rctx, cancel := context.WithCancel(ctx)
	wl.readCancel = cancel
	for _, region := range wl.regions {
		for r := range wl.w.Ranges {
			wl.readWG.Add(1)
			go wl.consume(rctx, region, r)
		}
	}
	tctx, tcancel := context.WithCancel(ctx)
	wl.tailCancel = tcancel
	for r := range wl.w.Ranges {
		wl.startTail(tctx, r, wl.homes[r])
	}
}

// regionRange names one consumer: a region's reader of a range.
type regionRange struct {
	region string
	rng    uint32
}

// consumerPos is a consumer's progress in a range: the next offset to
// deliver and the epoch of the record before it (checked on resuming).
type consumerPos struct {
	next, epoch atomic.Uint64
}

// position returns the progress of region's consumer of range r, created
// at 0 the first time (a split's child).
func (wl *workload) position(region string, r uint32) *consumerPos {
	wl.posMu.Lock()
	defer wl.posMu.Unlock()
	p := wl.positions[regionRange{region, r}]
	if p == nil {
		p = &consumerPos{}
		wl.positions[regionRange{region, r}] = p
	}
	return p
}

// startTail starts the tail reader of range r, homed in home, once.
func (wl *workload) startTail(ctx context.Context, r uint32, home string) {
	wl.tailsMu.Lock()
	defer wl.tailsMu.Unlock()
	if wl.tailStarted[r] {
		return
	}
	wl.tailStarted[r] = true
	wl.tailWG.Add(1)
	go wl.readTail(ctx, r, home)
}

// consume follows range r in region from the consumer's position,
// resubscribing where a subscription gives up. The SDK follows a split:
// after the parent's last record it yields the children's (Range tells
// them apart), each recorded under its own range. Once the parent was
// read to its end (a subscription yielded a child's record), a new
// subscription would read the children from 0 again: this consumer hands
// over to one consumer per child, each from its own position.
func (wl *workload) consume(ctx context.Context, region string, r uint32) {
	defer wl.readWG.Done()
	c := wl.clients[region]
	source := "consume/" + region
	pos := wl.position(region, r)
	ended := false // a child's record came: r was read to its end
	for ctx.Err() == nil {
		if ended {
			if end, ok := wl.rangeEnd(ctx, c, r, pos.next.Load()); ok {
				for _, child := range end.Children {
					wl.readWG.Add(1)
					go wl.consume(ctx, region, child)
				}
				return
			}
		}
		for rec, err := range c.Subscribe(ctx, wl.stream, r, client.StartAt{Offset: pos.next.Load(), Epoch: pos.epoch.Load()}) {
			var fe *client.ForkError
			if errors.As(err, &fe) {
				// It delivered a divergent tail (the RPO): read the log
				// again from where it forked, as an application would.
				wl.log.Info("consumer read a divergent tail; reading again from the fork", "region", region, "range", fe.Range,
					"fork_offset", fe.Offset, "delivered_end", fe.DeliveredEnd)
				fp := wl.position(region, fe.Range)
				fp.next.Store(fe.Offset)
				fp.epoch.Store(0) // the fork point is checked by the log's own order
				break
			}
			if err != nil {
				if ctx.Err() == nil {
					wl.log.Debug("subscription ended; resubscribing", "region", region, "range", r, "error", err)
				}
				break
			}
			wl.rec.addReads(Observation{Source: source, Region: region, Range: rec.Range, Offset: rec.Offset, Epoch: rec.Epoch,
				Key: string(rec.Key), Value: string(rec.Value), At: wl.rec.now(), AppendUnixNanos: rec.AppendTime.UnixNano()})
			p := pos
			if rec.Range != r {
				ended, p = true, wl.position(region, rec.Range)
			}
			p.next.Store(rec.Offset + 1)
			p.epoch.Store(rec.Epoch)
		}
		sleepUntil(ctx, time.Now().Add(300*time.Millisecond))
	}
}

// rangeEnd reports whether range r split with its log ending at or before
// offset, and where its keys continue (a read there answers RANGE_SPLIT).
func (wl *workload) rangeEnd(ctx context.Context, c *client.Client, r uint32, offset uint64) (client.RangeEnd, bool) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := c.Read(rctx, wl.stream, r, offset, client.ReadOptions{MaxRecords: 1})
	end, ok := client.RangeEnded(err)
	return end, ok && offset >= end.SplitOffset
}

// readTail reads range r at its home with consistency "home" every
// TailReadInterval, extending its copy of the log; each read that reaches
// the tail the server confirmed is one linearizable read operation.
//
// Each read starts one record early, at the last record the reader holds:
// if that record changed (a returning home forked its divergent tail off
// under the reader) or is gone, the reader's copy is of a timeline that is
// not the log's any more, and it starts over from offset 0 as a new
// source ("tail#1", ...), whose reads the checkers take in order again.
func (wl *workload) readTail(ctx context.Context, r uint32, home string) {
	defer wl.tailWG.Done()
	c := wl.clients[home]
	source := "tail"
	hashes := []uint64{0} // hashes[n]: ChainHash of records [0, n)
	var last client.StoredRecord
	broken := false // the reader saw a gap; its hashes mean nothing
	restarts := 0
	restart := func(why string) {
		restarts++
		source, hashes, last = fmt.Sprintf("tail#%d", restarts), []uint64{0}, client.StoredRecord{}
		wl.log.Info("tail reader starts over", "range", r, "why", why, "source", source)
	}
	tick := time.NewTicker(wl.w.TailReadInterval.Std())
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for ctx.Err() == nil {
			from := uint64(len(hashes) - 1)
			readFrom := from
			if from > 0 {
				readFrom = from - 1
			}
			call := wl.rec.now()
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			res, err := c.Read(rctx, wl.stream, r, readFrom, client.ReadOptions{Consistency: client.ConsistencyHome, MaxRecords: 2000})
			cancel()
			ret := wl.rec.now()
			if end, ok := client.RangeEnded(err); ok && readFrom >= end.SplitOffset {
				// Read to its end (a split): the children have their own
				// readers, homed where the parent is.
				for _, child := range end.Children {
					wl.startTail(ctx, child, home)
				}
				return
			}
			if err != nil {
				if from > 0 && client.CodeOf(err) == client.CodeOffsetOutOfRange {
					restart(err.Error())
				}
				break // no outcome: a read has no effect to account for
			}
			recs := res.Records
			if from > 0 {
				if len(recs) == 0 || recs[0].Offset != from-1 || recs[0].Epoch != last.Epoch || string(recs[0].Value) != string(last.Value) {
					if len(recs) == 0 && res.TailOffset >= from {
						break // nothing returned below the tail: try again later
					}
					restart(fmt.Sprintf("the record at %d changed or is gone (tail %d)", from-1, res.TailOffset))
					continue
				}
				recs = recs[1:]
			}
			if len(recs) == 0 {
				// Nothing new: the range may have ended at a split
				// (reading from before its end does not say so).
				if end, ok := wl.rangeEnd(ctx, c, r, from); ok {
					for _, child := range end.Children {
						wl.startTail(ctx, child, home)
					}
					return
				}
			}
			var obs []Observation
			for _, rec := range recs {
				obs = append(obs, Observation{Source: source, Region: home, Range: r, Offset: rec.Offset, Epoch: rec.Epoch,
					Key: string(rec.Key), Value: string(rec.Value), At: ret, AppendUnixNanos: rec.AppendTime.UnixNano()})
				if rec.Offset != uint64(len(hashes)-1) {
					broken = true
				}
				if !broken {
					hashes = append(hashes, ChainHash(hashes[len(hashes)-1], rec.Offset, rec.Epoch, string(rec.Value)))
					last = rec
				}
			}
			wl.rec.addReads(obs...)
			if broken {
				return // the queue checker reports the gap
			}
			if res.NextOffset < res.TailOffset {
				continue // more below the tail: read on, then record
			}
			if res.TailOffset < uint64(len(hashes)) {
				wl.rec.addOp(Op{Kind: OpRead, Process: 1000 + int(r), Range: r, Call: call, Return: ret, Outcome: OK,
					Tail: res.TailOffset, Hash: hashes[res.TailOffset]})
			}
			break
		}
	}
}

// stopTailReaders stops the tail readers.
func (wl *workload) stopTailReaders() {
	if wl.tailCancel != nil {
		wl.tailCancel()
	}
	wl.tailWG.Wait()
}

// waitConsumers waits until every consumer delivered up to tails[range]
// or timeout passes, then stops them; it returns the lagging consumers.
func (wl *workload) waitConsumers(tails []uint64, timeout time.Duration) []string {
	deadline := time.Now().Add(timeout)
	var behind []string
	for {
		behind = behind[:0]
		for _, region := range wl.regions {
			for r, t := range tails {
				if got := wl.position(region, uint32(r)).next.Load(); got < t {
					behind = append(behind, fmt.Sprintf("%s/%d at %d of %d", region, r, got, t))
				}
			}
		}
		if len(behind) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if wl.readCancel != nil {
		wl.readCancel()
	}
	wl.readWG.Wait()
	return behind
}

// readCopy reads region's whole copy of range r, at least minTail records
// (waiting for them), for the final reads; home makes the reads
// consistency "home" (the home's copy: every acked record is below the
// tail it confirms). The caller records what it keeps.
func (wl *workload) readCopy(ctx context.Context, region string, r uint32, minTail uint64, home bool) ([]Observation, error) {
	c := wl.clients[region]
	opts := client.ReadOptions{MaxRecords: 5000, MaxBytes: 8 << 20, Consistency: client.ConsistencyMinOffset, MinOffset: minTail}
	if home {
		opts = client.ReadOptions{MaxRecords: 5000, MaxBytes: 8 << 20, Consistency: client.ConsistencyHome}
	}
	var obs []Observation
	var next uint64
	for {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		res, err := c.Read(rctx, wl.stream, r, next, opts)
		cancel()
		if end, ok := client.RangeEnded(err); ok && next >= end.SplitOffset && next >= minTail {
			return obs, nil // the range split: its log ends there
		}
		if err != nil {
			return nil, fmt.Errorf("final read of %s/%d at %d: %w", region, r, next, err)
		}
		at := wl.rec.now()
		for _, rec := range res.Records {
			obs = append(obs, Observation{Source: "final/" + region, Region: region, Final: true, Range: r, Offset: rec.Offset,
				Epoch: rec.Epoch, Key: string(rec.Key), Value: string(rec.Value), At: at, AppendUnixNanos: rec.AppendTime.UnixNano()})
		}
		if len(res.Records) == 0 && res.NextOffset < res.TailOffset {
			return nil, errors.New("final read: an empty reply below the tail")
		}
		next = res.NextOffset
		if next >= res.TailOffset && next >= minTail {
			return obs, nil
		}
	}
}
