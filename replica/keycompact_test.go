package replica

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/compact"
	"github.com/geolog/geolog/segment"
)

// keyOp is an idempotent append of one record of key k.
func keyOp(producer, seq uint64, k, v string, results *[]Result) *Op {
	h := batch.Header{Type: batch.TypeData, ProducerID: producer, BaseSequence: seq}
	frame := batch.Encode(nil, h, []batch.Record{{Key: []byte(k), Value: []byte(v)}})
	return &Op{ProducerID: producer, BaseSequence: seq, RecordCount: 1, Frame: frame,
		Reply: func(r Result) { *results = append(*results, r) }}
}

// markerOp proposes compaction decision d.
func markerOp(d batch.Compaction, results *[]Result) *Op {
	return &Op{RecordCount: 1, Frame: batch.EncodeCompaction(nil, batch.Header{}, d),
		Reply: func(r Result) { *results = append(*results, r) }}
}

// keyRecords reads node id's log: "offset:key=value" per record.
func (c *cluster) keyRecords(id uint64) []string {
	st := c.logs[id]
	var out []string
	for off := st.StartOffset(); off < st.NextOffset(); {
		frames, err := st.ReadFrames(off, 1<<20, st.NextOffset())
		if err != nil {
			c.t.Fatal(err)
		}
		for len(frames) > 0 {
			n, _ := batch.FrameSize(frames)
			h, recs, err := batch.Decode(frames[:n])
			if err != nil {
				c.t.Fatal(err)
			}
			for i := range recs {
				if h.Type == batch.TypeData && h.Offset(&recs[i]) >= off {
					out = append(out, fmt.Sprintf("%d:%s=%s", h.Offset(&recs[i]), recs[i].Key, recs[i].Value))
				}
			}
			off = h.NextOffset()
			frames = frames[n:]
		}
	}
	return out
}

// compactNode runs what a range driver runs at node id's decision: move
// the compaction point over the sealed segments below the point, then a
// cleaner job over them.
func (c *cluster) compactNode(id uint64) compact.Result {
	c.t.Helper()
	r := c.replicas[id]
	d := r.KeyCompaction()
	limit, err := r.PrepareRewrite(d.Point)
	if err != nil {
		c.t.Fatalf("node %d: prepare: %v", id, err)
	}
	cl := compact.NewCleaner(compact.CleanerConfig{BytesPerSecond: -1})
	res := cl.RunJob(context.Background(), compact.Job{Log: c.logs[id], Decision: d, Limit: limit})
	if res.Err != nil {
		c.t.Fatalf("node %d: compact: %v", id, res.Err)
	}
	return res
}

// TestKeyCompactionAcrossReplicas: a compaction marker proposed by the
// leader reaches every replica through the log; replicas whose segments
// end in different places compact to the same records; a follower cut off
// meanwhile catches up by a snapshot of the compacted log (fewer frames
// than indexes); a restarted replica finds its decision in the log; and a
// retry of a batch whose records compaction removed is still answered as
// a duplicate with its original offsets.
func TestKeyCompactionAcrossReplicas(t *testing.T) {
	c := newClusterOpts(t, 3, 3, func(c *cluster) {
		c.storeCfg = func(id uint64, cfg *segment.Config) {
			cfg.SegmentBytesMax = []int64{1024, 1500, 3000}[id-1]
		}
	})
	c.elect(1)
	c.cut[3] = true
	var res []Result
	for i := range 150 {
		c.replicas[1].Propose(keyOp(7, uint64(i), fmt.Sprintf("k%d", i%5), fmt.Sprint(i), &res))
		c.settle()
	}
	c.tick(30) // node 3 is no longer recently active: nothing is held back for it
	point := c.replicas[1].Committed()
	d := batch.Compaction{Point: point, TombstoneCutoffUnixNanos: math.MinInt64, ProducerCutoffUnixNanos: math.MinInt64}
	c.replicas[1].Propose(markerOp(d, &res))
	c.settle()
	c.tick(2)
	for _, r := range res {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	before := c.keyRecords(1)
	for _, id := range []uint64{1, 2} {
		if got := c.replicas[id].KeyCompaction(); got != d {
			t.Fatalf("node %d applied decision %+v, want %+v", id, got, d)
		}
		if r := c.compactNode(id); r.SegmentsRewritten == 0 || !r.Complete {
			t.Fatalf("node %d: %+v", id, r)
		}
	}
	want := c.keyRecords(1)
	if len(want) != 5 || len(before) != 150 {
		t.Fatalf("%d records before, %d after: %v", len(before), len(want), want)
	}
	if got := c.keyRecords(2); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("node 2 holds %v, node 1 %v", got, want)
	}
	// Node 3 returns behind the leader's compaction point: a snapshot.
	c.cut[3] = false
	c.tick(5)
	c.settle()
	if c.replicas[3].Stats().SnapshotsInstalled == 0 {
		t.Fatal("node 3 installed no snapshot")
	}
	if got := c.replicas[3].KeyCompaction(); got != d {
		t.Fatalf("node 3's decision after the snapshot: %+v", got)
	}
	c.compactNode(3)
	if got := c.keyRecords(3); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("node 3 holds %v, node 1 %v", got, want)
	}
	// A restarted replica knows its decision from the log: on opening if
	// the marker is at or below the index it restarts applying after,
	// else once Raft applies it again (commit marks in the log move the
	// segment boundaries, and with them the compaction point).
	c.stop(2)
	c.start(2)
	c.settle()
	if got := c.replicas[2].KeyCompaction(); got != d {
		t.Fatalf("node 2 after a restart: %+v", got)
	}
	// The producer's last batch (its records gone but one) is a duplicate.
	res = nil
	c.replicas[1].Propose(keyOp(7, 140, "k0", "140", &res))
	c.settle()
	if len(res) != 1 || res[0].Err != nil || !res[0].Duplicate || res[0].BaseOffset != 140 {
		t.Fatalf("retry of sequence 140 after compaction: %+v", res)
	}
	// Appends continue on every replica after the compacted log.
	c.replicas[1].Propose(keyOp(7, 150, "k9", "x", &res))
	c.settle()
	c.tick(2)
	for _, id := range c.ids {
		if got := c.replicas[id].Committed(); got != point+2 {
			t.Fatalf("node %d committed %d, want %d", id, got, point+2)
		}
	}
}
