package regionsvc

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// keysOf returns count keys that a stream of rangeCount ranges routes
// to range r.
func keysOf(r, rangeCount uint32, count int) [][]byte {
	var out [][]byte
	for i := 0; len(out) < count; i++ {
		k := []byte(fmt.Sprintf("key-%d", i))
		if keyspace.RangeForKey(k, rangeCount) == r {
			out = append(out, k)
		}
	}
	return out
}

// splitProducer appends one record per batch, idempotently (producer pid,
// one sequence per batch), to a range through whichever node takes it,
// until the range answers RANGE_SPLIT or stop closes. A batch whose
// outcome is unknown is resent with its sequence until it is answered.
type splitProducer struct {
	tr *testRegion
	// batchesMax bounds the batches run sends (splitProducerBatchesMax
	// if 0).
	batchesMax uint64
	stream     string
	rng        uint32
	pid        uint64
	keys       [][]byte

	mu     sync.Mutex
	acked  []*geologv1.AppendResponse // acked[seq]
	refuse error                      // the RANGE_SPLIT that ended it
}

func (p *splitProducer) value(seq uint64) string { return fmt.Sprintf("v-%d", seq) }

func (p *splitProducer) request(seq uint64) *geologv1.AppendRequest {
	return &geologv1.AppendRequest{Stream: p.stream, Range: p.rng, ProducerId: p.pid, BaseSequence: seq,
		Records: []*geologv1.Record{{Key: p.keys[seq%uint64(len(p.keys))], Value: []byte(p.value(seq))}}}
}

// splitProducerBatchesMax bounds a splitProducer's batches, so that a
// range that never refuses ends the test early.
const splitProducerBatchesMax = 1000

// run produces until the range splits, stop closes, ctx ends or it sent
// batchesMax batches (splitProducerBatchesMax if 0).
func (p *splitProducer) run(ctx context.Context, stop <-chan struct{}) {
	batchesMax := p.batchesMax
	if batchesMax == 0 {
		batchesMax = splitProducerBatchesMax
	}
	for seq := uint64(0); seq < batchesMax; seq++ {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if ctx.Err() != nil {
				return
			}
			resp, err := p.send(ctx, p.request(seq))
			if err == nil {
				p.mu.Lock()
				p.acked = append(p.acked, resp)
				p.mu.Unlock()
				break
			}
			if rpcerr.CodeOf(err) == apierr.RangeSplit {
				p.mu.Lock()
				p.refuse = err
				p.mu.Unlock()
				return
			}
			if !rpcerr.IsRetriable(err) {
				p.tr.t.Errorf("append seq %d: %v", seq, err)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// send tries each live node once; it returns the first answer that is
// not NOT_LEADER (or the last error).
func (p *splitProducer) send(ctx context.Context, req *geologv1.AppendRequest) (*geologv1.AppendResponse, error) {
	var last error
	for id := uint64(1); id <= uint64(len(p.tr.peers)); id++ {
		c, ok := p.tr.clients[id]
		if !ok {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := c.Append(cctx, req)
		cancel()
		if err == nil || rpcerr.CodeOf(err) != apierr.NotLeader {
			return resp, err
		}
		last = err
	}
	return nil, last
}

// catalogueLeader returns the node leading the region's catalogue.
func (tr *testRegion) catalogueLeader(ctx context.Context) uint64 {
	tr.t.Helper()
	var lead uint64
	pollUntil(tr.t, ctx, "a catalogue leader", func() bool {
		for _, n := range tr.nodes {
			if id := n.region.meta.rep.LeaderID(); id != 0 && tr.nodes[id] != nil {
				lead = id
				return true
			}
		}
		return false
	})
	return lead
}

// split splits range r of stream, asking each node in turn (the one that
// does not lead the catalogue forwards the split to it, and the catalogue
// leader asks the range's leader for the marker), retrying while leaders
// move.
func (tr *testRegion) split(ctx context.Context, stream string, r uint32, at uint64) (splitResult, error) {
	for attempt := 0; ; attempt++ {
		id := uint64(attempt%len(tr.peers)) + 1
		if tr.nodes[id] == nil {
			continue
		}
		res, err := tr.nodes[id].splitRange(ctx, stream, r, at)
		if err == nil || !rpcerr.IsRetriable(err) || rpcerr.CodeOf(err) == apierr.RangeSplit || ctx.Err() != nil {
			return res, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readAll reads range r of stream from node id, from offset 0, once the
// node holds minOffset, until minOffset or the range's end (a split
// range's RANGE_SPLIT).
func (tr *testRegion) readAll(ctx context.Context, id uint64, stream string, r uint32, minOffset uint64) []*geologv1.StoredRecord {
	tr.t.Helper()
	var out []*geologv1.StoredRecord
	for from := uint64(0); ; {
		var rr *geologv1.ReadResponse
		c := tr.clients[id]
		ended := false
		tr.retry(ctx, fmt.Sprintf("read node %d from %d", id, from), func(ctx context.Context, _ geologv1.LogClient) error {
			var err error
			rr, err = c.Read(ctx, &geologv1.ReadRequest{Stream: stream, Range: r, FromOffset: from, MaxRecords: 1000,
				Consistency: geologv1.Consistency_CONSISTENCY_MIN_OFFSET, MinOffset: minOffset})
			if e := rpcerr.FromError(err); e != nil && e.Code == apierr.RangeSplit && from >= e.SplitOffset {
				ended = true
				return nil
			}
			return err
		})
		if ended {
			return out
		}
		out = append(out, rr.Records...)
		if rr.NextOffset <= from || rr.NextOffset >= minOffset {
			return out
		}
		from = rr.NextOffset
	}
}

// TestSplitMarkerEndsRange: a range splits under a concurrent idempotent
// producer. The split marker takes one offset, the split offset; every
// record acknowledged is below it, in order, with no loss and no
// duplicate, on every replica; readers never see the marker; from then on
// the range answers every new append RANGE_SPLIT (retriable), on its
// leader and on a new leader after the old one stops, while a retry of a
// batch already in the log still gets its original offset; a second
// split is refused.
func TestSplitMarkerEndsRange(t *testing.T) {
	t.Parallel()
	tr := newTestRegion(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	tr.createStream(ctx, "sp", 2)
	p := &splitProducer{tr: tr, stream: "sp", rng: 1, pid: 91, keys: keysOf(1, 2, 5)}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); p.run(ctx, stop) }()
	pollUntil(t, ctx, "30 acks", func() bool { p.mu.Lock(); defer p.mu.Unlock(); return len(p.acked) >= 30 })

	res, err := tr.split(ctx, "sp", 1, 0)
	if err != nil {
		close(stop)
		wg.Wait()
		t.Fatalf("split: %v", err)
	}
	m := keyspace.NewRangeMap(2)
	if res.decision.Parent != 1 || res.decision.Left != 2 || res.decision.Right != 3 || res.decision.MapVersion != 1 ||
		res.decision.HashStart != m.Ranges[1].HashStart || res.decision.HashEnd != m.Ranges[1].HashEnd {
		t.Fatalf("decision %+v", res.decision)
	}
	wg.Wait() // the producer ends at its first RANGE_SPLIT
	if p.refuse == nil || !rpcerr.IsRetriable(p.refuse) {
		t.Fatalf("producer ended without a retriable RANGE_SPLIT: %v", p.refuse)
	}
	checkSplitLog(t, ctx, tr, p, res.offset)
	checkSplitRefusals(t, ctx, tr, p, res.offset)

	// A new leader finds the marker in its log and refuses alike.
	old := tr.leaderOf(ctx, "sp", 1)
	tr.stop(old)
	var last error
	pollUntil(t, ctx, "a new leader refusing RANGE_SPLIT", func() bool {
		// A sequence past a gap: a pipelined batch behind a refused one
		// is refused for the split too, not as a SEQUENCE_GAP.
		_, last = p.send(ctx, p.request(uint64(len(p.acked))+5))
		if rpcerr.CodeOf(last) != apierr.RangeSplit {
			t.Logf("after the leader stopped: %v", last)
		}
		return rpcerr.CodeOf(last) == apierr.RangeSplit
	})
}

// checkSplitLog checks every replica's copy of the parent: the acked
// records, in order, at offsets 0..split-1, then nothing but the marker.
func checkSplitLog(t *testing.T, ctx context.Context, tr *testRegion, p *splitProducer, split uint64) {
	t.Helper()
	if uint64(len(p.acked)) != split {
		t.Fatalf("%d batches acked, split offset %d: the log holds records that were not acked, or lost some", len(p.acked), split)
	}
	for seq, a := range p.acked {
		if a.BaseOffset != uint64(seq) || a.Duplicate {
			t.Fatalf("seq %d acked at offset %d (duplicate %v)", seq, a.BaseOffset, a.Duplicate)
		}
	}
	for id := range tr.nodes {
		recs := tr.readAll(ctx, id, "sp", 1, split+1)
		if uint64(len(recs)) != split {
			t.Fatalf("node %d: %d records below the split offset %d", id, len(recs), split)
		}
		for i, r := range recs {
			if r.Offset != uint64(i) || string(r.Value) != p.value(uint64(i)) {
				t.Fatalf("node %d offset %d: %q at %d", id, i, r.Value, r.Offset)
			}
		}
		d := tr.rangeDriverOf(id, "sp", 1)
		var got uint64
		var ok bool
		pollUntil(t, ctx, fmt.Sprintf("node %d applies the split", id), func() bool {
			if err := d.exec(ctx, func() { _, got, ok, _ = d.rep.SplitApplied() }); err != nil {
				t.Fatal(err)
			}
			return ok
		})
		if got != split || d.committed.Load() != split+1 {
			t.Fatalf("node %d: split applied at %d, committed to %d; want %d, %d", id, got, d.committed.Load(), split, split+1)
		}
	}
}

// checkSplitRefusals: new appends get RANGE_SPLIT, a retry of an acked
// batch its original offset, a second split RANGE_SPLIT.
func checkSplitRefusals(t *testing.T, ctx context.Context, tr *testRegion, p *splitProducer, split uint64) {
	t.Helper()
	_, err := p.send(ctx, p.request(uint64(len(p.acked))))
	if e := rpcerr.FromError(err); e == nil || e.Code != apierr.RangeSplit || !e.Retriable {
		t.Fatalf("append after the split: %v, want a retriable RANGE_SPLIT", err)
	}
	last := uint64(len(p.acked)) - 1
	resp, err := p.send(ctx, p.request(last))
	if err != nil || !resp.Duplicate || resp.BaseOffset != last {
		t.Fatalf("retry of acked seq %d: %v %v, want its offset", last, resp, err)
	}
	if _, err := tr.split(ctx, "sp", 1, 0); rpcerr.CodeOf(err) != apierr.RangeSplit {
		t.Fatalf("second split: %v, want RANGE_SPLIT", err)
	}
	// The other range is untouched.
	if _, err := tr.leaderAppend(ctx, &geologv1.AppendRequest{Stream: "sp", Range: 0,
		Records: []*geologv1.Record{{Key: keysOf(0, 2, 1)[0], Value: []byte("x")}}}); err != nil {
		t.Fatalf("append to range 0: %v", err)
	}
	_ = split
}
