package replica

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
)

// TestStaleEpochRefused: once a batch of homing epoch 2 is in the log, a
// proposal at epoch 1 (a leader whose lease view is behind) and a mirrored
// frame of epoch 1 (a fenced home's replicator) are refused with
// STALE_EPOCH, on the leader that wrote it and on the next one after a
// restart of the whole group; control frames carry the epoch on, so the
// fence survives.
func TestStaleEpochRefused(t *testing.T) {
	c := newCluster(t, 3)
	c.elect(1)
	var res, r1, r2, r3 []Result
	at := func(o *Op, e uint64) *Op { o.Epoch = e; return o }
	c.replicas[1].Propose(at(op(7, 0, 2, "e1", &r1), 1))
	c.replicas[1].Propose(at(op(7, 2, 2, "e2", &r2), 2))
	c.replicas[1].Propose(at(op(7, 4, 1, "stale", &r3), 1))
	c.settle()
	if len(r1) != 1 || r1[0].Err != nil || r1[0].Epoch != 1 || len(r2) != 1 || r2[0].Err != nil || r2[0].Epoch != 2 {
		t.Fatalf("replies: %+v %+v", r1, r2)
	}
	if len(r3) != 1 || apierr.CodeOf(r3[0].Err) != apierr.StaleEpoch {
		t.Fatalf("epoch 1 after epoch 2: %+v, want STALE_EPOCH", r3)
	}
	c.tick(2)
	for _, id := range c.ids {
		if e := c.replicas[id].HighestEpoch(); e != 2 {
			t.Fatalf("node %d highest epoch %d, want 2", id, e)
		}
	}
	// A mirrored frame of epoch 1 at the tail.
	mirrored := func(e uint64, base uint64) *Op {
		h := batch.Header{Type: batch.TypeData, BaseOffset: base, Epoch: e, AppendTimeUnixNanos: 1}
		frame := batch.Encode(nil, h, []batch.Record{{Key: []byte("k"), Value: []byte("m")}})
		return &Op{RecordCount: 1, Frame: frame, Reply: func(r Result) { res = append(res, r) }}
	}
	c.replicas[1].ProposeVerbatim(mirrored(1, 4))
	if r := res[len(res)-1]; apierr.CodeOf(r.Err) != apierr.StaleEpoch {
		t.Fatalf("mirrored epoch-1 frame: %+v", r)
	}
	for _, id := range c.ids {
		c.stop(id)
	}
	for _, id := range c.ids {
		c.start(id)
	}
	c.elect(2)
	c.tick(2)
	c.settle()
	if e := c.replicas[2].HighestEpoch(); e != 2 {
		t.Fatalf("after restart, highest epoch %d, want 2", e)
	}
	var r4, r5 []Result
	c.replicas[2].Propose(at(op(8, 0, 1, "stale-again", &r4), 1))
	c.replicas[2].Propose(at(op(8, 0, 1, "e3", &r5), 3))
	c.settle()
	if len(r4) != 1 || apierr.CodeOf(r4[0].Err) != apierr.StaleEpoch || len(r5) != 1 || r5[0].Err != nil || r5[0].Epoch != 3 || r5[0].BaseOffset != 4 {
		t.Fatalf("after restart: %+v %+v", r4, r5)
	}
	if got := c.logValues(2); len(got) != 5 {
		t.Fatalf("log %v, want 5 records (the stale ones refused)", got)
	}
}

// TestEpochSurvivesWholeLogCompaction: retention deletes every frame of a
// log of epoch-3 batches and the group restarts; the replicas still know
// the epoch their log ended in (HardState.CompactedEpoch), which a mirror
// answers a new home's open with (notes/simgaps.md, P2): without it they
// would report none, and a new home would not resend to a divergent tail.
func TestEpochSurvivesWholeLogCompaction(t *testing.T) {
	c, base := ageRetentionCluster(t)
	c.elect(1)
	var res []Result
	for i := uint64(0); i < 20; i++ {
		o := op(7, 2*i, 2, fmt.Sprintf("e3-%d", i), &res)
		o.Epoch = 3
		c.replicas[1].Propose(o)
		c.settle()
	}
	c.tick(2)
	committed := c.agree()
	for _, id := range c.ids {
		c.clock[id] = base.Add(time.Hour)
		if c.compact(id) == 0 || c.logs[id].StartOffset() != committed {
			t.Fatalf("node %d: log starts at %d, want compacted whole to %d", id, c.logs[id].StartOffset(), committed)
		}
	}
	for _, id := range c.ids {
		c.stop(id)
	}
	for _, id := range c.ids {
		c.start(id)
		if e := c.replicas[id].HighestEpoch(); e != 3 {
			t.Fatalf("node %d restarted with no frame left: highest epoch %d, want 3", id, e)
		}
		if h, _, err := c.states[id].Load(); err != nil || h.CompactedEpoch != 3 {
			t.Fatalf("node %d state: compacted epoch %d (%v), want 3", id, h.CompactedEpoch, err)
		}
	}
}

// TestStateWithoutCompactedEpochLoads: a state file written before
// compacted_epoch existed loads, with the epoch unknown (0), and the field
// round-trips.
func TestStateWithoutCompactedEpochLoads(t *testing.T) {
	body := []byte(`{"term":2,"vote":1,"commit":9,"voters":[1,2,3],"conf_index":1,"snapshot_index":9,"snapshot_term":2,"snapshot_next_offset":40}`)
	old := append(binary.LittleEndian.AppendUint32(nil, crc32.Checksum(body, castagnoli)), body...)
	h, err := decodeState(old)
	if err != nil || h.CompactedEpoch != 0 || h.SnapshotNextOffset != 40 {
		t.Fatalf("older state: %+v, %v", h, err)
	}
	h.CompactedEpoch = 5
	b, err := encodeState(h)
	if err != nil {
		t.Fatal(err)
	}
	if h2, err := decodeState(b); err != nil || h2.CompactedEpoch != 5 {
		t.Fatalf("round trip: compacted epoch %d, %v", h2.CompactedEpoch, err)
	}
	h.Installing = &SnapshotMeta{Index: 12, Term: 2, NextOffset: 50, CompactedEpoch: 4}
	b, err = encodeState(h)
	if err != nil {
		t.Fatal(err)
	}
	if h2, err := decodeState(b); err != nil || h2.Installing == nil || h2.Installing.CompactedEpoch != 4 {
		t.Fatalf("round trip of an install: %+v, %v", h2.Installing, err)
	}
	h.Installing = nil
	h.SharedFloor = 31
	if b, err = encodeState(h); err != nil {
		t.Fatal(err)
	}
	if h2, err := decodeState(b); err != nil || h2.SharedFloor != 31 {
		t.Fatalf("round trip: shared floor %d, %v", h2.SharedFloor, err)
	}
	h.SharedFloor = 0
	h.CompactedEpoch = 0
	if b, _ := encodeState(h); bytes.Contains(b, []byte("compacted_epoch")) {
		t.Fatalf("a zero compacted epoch is written: %s", b[4:])
	}
}

// TestSnapshotCarriesCompactedEpoch: retention deletes the leader's whole
// log of epoch-3 batches while a follower is cut off; the follower catches
// up by a snapshot whose body holds no frame. It knows the epoch its log
// ends in all the same (snapshotDesc.CompactedEpoch, into its hard state),
// after a restart too, as a mirror must to answer a new home's open with
// it (notes/simgaps.md P2): without it, highest epoch 0.
func TestSnapshotCarriesCompactedEpoch(t *testing.T) {
	c, base := ageRetentionCluster(t)
	c.elect(1)
	c.cut[3] = true
	var res []Result
	for i := uint64(0); i < 20; i++ {
		o := op(7, 2*i, 2, fmt.Sprintf("e3-%d", i), &res)
		o.Epoch = 3
		c.replicas[1].Propose(o)
		c.settle()
	}
	c.tick(20) // node 3 no longer counts as active: nothing held back for it
	committed := c.replicas[1].Committed()
	for _, id := range []uint64{1, 2} {
		c.clock[id] = base.Add(time.Hour)
		if c.compact(id) == 0 || c.logs[id].StartOffset() != committed {
			t.Fatalf("node %d: log starts at %d, want compacted whole to %d", id, c.logs[id].StartOffset(), committed)
		}
	}
	if e := c.replicas[3].HighestEpoch(); e != 0 {
		t.Fatalf("node 3 saw epoch %d while cut off", e)
	}
	delete(c.cut, 3)
	c.tick(5)
	if got := c.replicas[3].Stats().SnapshotsInstalled; got != 1 || c.logs[3].StartOffset() != committed || c.replicas[3].Committed() != committed {
		t.Fatalf("node 3: %d snapshots installed, log starts at %d, committed %d; want 1, empty at %d",
			got, c.logs[3].StartOffset(), c.replicas[3].Committed(), committed)
	}
	if e := c.replicas[3].HighestEpoch(); e != 3 {
		t.Fatalf("node 3 installed an empty snapshot of an epoch-3 log: highest epoch %d, want 3", e)
	}
	c.stop(3)
	c.start(3)
	if e := c.replicas[3].HighestEpoch(); e != 3 {
		t.Fatalf("node 3 restarted: highest epoch %d, want 3", e)
	}
}

// TestInstalledBodyEpochSurvivesCompaction: a follower catches up by a
// snapshot whose body holds epoch-3 frames while the leader's compacted
// part is of epoch 1 (the sender's compacted epoch); retention then
// deletes the whole installed body there, and the follower restarts. It
// must still know its log ends in epoch 3: the body's frames lie at or
// below the snapshot index, so compaction deletes them without reading
// their epochs (moveCompactionPoint) and only the install can record it.
// Without that the restarted replica reports epoch 1, and as a mirror it
// tells a new home its log ends in epoch 1: the home resends from its own
// log start and the mirror forks there, past where epoch 3 began, moving
// the range's own records into its orphan log (seeds 321154 and 322084 of
// the three-region simulator, notes/simfork.md).
func TestInstalledBodyEpochSurvivesCompaction(t *testing.T) {
	c, base := ageRetentionCluster(t)
	c.elect(1)
	c.cut[3] = true
	var res []Result
	propose := func(epoch uint64, tag string, from uint64) {
		for i := uint64(0); i < 10; i++ {
			o := op(7, from+2*i, 2, fmt.Sprintf("%s-%d", tag, i), &res)
			o.Epoch = epoch
			c.replicas[1].Propose(o)
			c.settle()
		}
	}
	propose(1, "e1", 0)
	for _, id := range c.ids {
		c.clock[id] = base.Add(time.Hour)
	}
	propose(3, "e3", 20)
	c.tick(20) // node 3 no longer counts as active: nothing held back for it
	for _, r := range res {
		if r.Err != nil {
			t.Fatalf("append: %v", r.Err)
		}
	}
	// Retention deletes the epoch-1 frames on nodes 1 and 2, not the
	// epoch-3 ones: node 3 needs a snapshot whose body holds them.
	for _, id := range []uint64{1, 2} {
		if c.compact(id) == 0 || c.logs[id].StartOffset() == 0 {
			t.Fatalf("node %d: nothing compacted", id)
		}
		if h, _, err := c.states[id].Load(); err != nil || h.CompactedEpoch != 1 {
			t.Fatalf("node %d state: compacted epoch %d (%v), want 1", id, h.CompactedEpoch, err)
		}
	}
	delete(c.cut, 3)
	c.tick(5)
	committed := c.replicas[1].Committed()
	if got := c.replicas[3].Stats().SnapshotsInstalled; got != 1 || c.replicas[3].Committed() != committed {
		t.Fatalf("node 3: %d snapshots installed, committed %d; want 1, %d", got, c.replicas[3].Committed(), committed)
	}
	// A floor node 3 learns from its leader (one that has heard of none
	// keeps its whole log), past every offset it holds.
	c.replicas[1].SetCompactionFloor(committed, true)
	c.compact(1)
	c.clock[3] = base.Add(3 * time.Hour)
	if c.compact(3) == 0 || c.logs[3].StartOffset() != committed {
		t.Fatalf("node 3: log starts at %d, want compacted whole to %d", c.logs[3].StartOffset(), committed)
	}
	c.stop(3)
	c.start(3)
	if e := c.replicas[3].HighestEpoch(); e != 3 {
		t.Fatalf("node 3 restarted with its installed epoch-3 body compacted away: highest epoch %d, want 3", e)
	}
}
