package replica

import (
	"math"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
)

// TestRetentionKeepsSplitMarker: retention that would delete a split
// range's whole log keeps the segment holding its split marker, so the
// range still refuses appends after every replica compacted and
// restarted, and a follower rebuilt by snapshot holds the marker too.
func TestRetentionKeepsSplitMarker(t *testing.T) {
	c, base := ageRetentionCluster(t)
	c.elect(1)
	c.cut[3] = true // rebuilt from a snapshot below
	c.proposeN(7, 0, 20, "a")
	dec := batch.Split{MapVersion: 1, Parent: 0, HashStart: 0, HashEnd: math.MaxUint64, At: 1 << 63, Left: 1, Right: 2}
	var res []Result
	c.replicas[1].Propose(&Op{RecordCount: 1, Frame: batch.EncodeSplit(nil, batch.Header{}, dec),
		Reply: func(r Result) { res = append(res, r) }})
	c.settle()
	c.tick(2)
	if len(res) != 1 || res[0].Err != nil {
		t.Fatalf("split marker: %+v", res)
	}
	splitAt := res[0].BaseOffset
	c.tick(25) // node 3 no longer recently active: nothing held back for it
	for _, id := range c.ids {
		c.clock[id] = base.Add(time.Hour)
	}
	for _, id := range []uint64{1, 2} {
		c.compact(id)
		if st := c.logs[id]; st.StartOffset() > splitAt {
			t.Fatalf("node %d: retention deleted the split marker at %d (log starts at %d)", id, splitAt, st.StartOffset())
		}
	}
	delete(c.cut, 3)
	c.tick(5)
	if got := c.replicas[3].Stats().SnapshotsInstalled; got != 1 {
		t.Fatalf("node 3 installed %d snapshots, want 1", got)
	}
	if !c.replicas[3].SplitPending() {
		t.Fatal("node 3 installed a snapshot holding the split marker, and does not know the split")
	}
	for _, id := range c.ids {
		c.stop(id)
	}
	for _, id := range c.ids {
		c.start(id)
		if !c.replicas[id].SplitPending() {
			t.Fatalf("node %d restarted without its split marker", id)
		}
	}
	c.elect(3)
	res = nil
	c.replicas[3].Propose(op(8, 0, 3, "after", &res))
	c.settle()
	if len(res) != 1 || apierr.CodeOf(res[0].Err) != apierr.RangeSplit {
		t.Fatalf("append after the split at a compacted, restarted leader: %+v, want RANGE_SPLIT", res)
	}
}
