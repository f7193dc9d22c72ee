package replica

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/segment"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// deliverSnapshot hands a snapshot to its receiver as a transport would
// (receive the body, step the message) and reports the outcome to the
// sender.
func (c *cluster) deliverSnapshot(s snapMsg) {
	to, from := s.m.GetTo(), s.m.GetFrom()
	err := c.receiveSnapshot(to, from, s.m, s.body)
	s.body.Close()
	if l := c.replicas[from]; l != nil {
		l.ReportSnapshot(to, err)
	}
}

func (c *cluster) receiveSnapshot(to, from uint64, m *raftpb.Message, body io.Reader) error {
	r := c.replicas[to]
	if c.cut[to] || c.cut[from] || r == nil {
		return errors.New("unreachable")
	}
	st, err := r.ReceiveSnapshot(m, body)
	if errors.Is(err, ErrSnapshotStale) {
		return r.StepSnapshot(m, nil)
	}
	if err != nil {
		c.t.Logf("node %d refused a snapshot: %v", to, err)
		return err
	}
	return r.StepSnapshot(m, st)
}

// withCompaction gives every node tiny segments and a retention of
// retentionBytes.
func withCompaction(retentionBytes int64) func(c *cluster) {
	return func(c *cluster) {
		c.storeCfg = func(_ uint64, cfg *segment.Config) {
			cfg.SegmentBytesMax = segment.SegmentBytesMaxMin
			cfg.RetentionBytes = retentionBytes
		}
	}
}

// ageRetentionCluster is a cluster of three with tiny segments, a
// retention of a minute and every node's clock at base (move the clocks
// past it to make retention delete).
func ageRetentionCluster(t *testing.T) (*cluster, time.Time) {
	base := time.Unix(1_800_000_000, 0)
	c := newClusterOpts(t, 3, 3, func(c *cluster) {
		c.storeCfg = func(_ uint64, cfg *segment.Config) {
			cfg.SegmentBytesMax = segment.SegmentBytesMaxMin
			cfg.RetentionAge = time.Minute
		}
	})
	for _, id := range c.ids {
		c.clock[id] = base
	}
	return c, base
}

// proposeN proposes n batches of 3 records from producer at the leader,
// tagged tag-i, and settles; it returns the replies.
func (c *cluster) proposeN(producer, seq uint64, n int, tag string) []Result {
	c.t.Helper()
	var res []Result
	for i := 0; i < n; i++ {
		c.replicas[c.leader()].Propose(op(producer, seq+uint64(3*i), 3, fmt.Sprintf("%s%03d", tag, i), &res))
	}
	c.settle()
	for i, r := range res {
		if r.Err != nil {
			c.t.Fatalf("proposal %d: %v", i, r.Err)
		}
	}
	if len(res) != n {
		c.t.Fatalf("%d replies to %d proposals", len(res), n)
	}
	return res
}

// retained returns the committed records node id retains, offset → value.
func (c *cluster) retained(id uint64) map[uint64]string {
	c.t.Helper()
	st, r := c.logs[id], c.replicas[id]
	out := map[uint64]string{}
	for off := st.StartOffset(); off < r.Committed(); {
		frames, err := st.ReadFrames(off, 1<<20, r.Committed())
		if err != nil {
			c.t.Fatalf("node %d: read at %d: %v", id, off, err)
		}
		for len(frames) > 0 {
			n, _ := batch.FrameSize(frames)
			h, recs, err := batch.Decode(frames[:n])
			if err != nil {
				c.t.Fatal(err)
			}
			for i, rec := range recs {
				out[h.Offset(&recs[i])] = string(rec.Value)
			}
			off = h.NextOffset()
			frames = frames[n:]
		}
	}
	return out
}

// agree checks that every live node has committed the same end offset and
// holds the same records where what they retain overlaps, and returns the
// committed offset.
func (c *cluster) agree() uint64 {
	c.t.Helper()
	var want uint64
	var wantFrom uint64
	var ref map[uint64]string
	for _, id := range c.ids {
		if c.replicas[id] == nil {
			continue
		}
		got := c.retained(id)
		if ref == nil {
			ref, want, wantFrom = got, c.replicas[id].Committed(), id
			continue
		}
		if c.replicas[id].Committed() != want {
			c.t.Fatalf("node %d committed %d, node %d %d", id, c.replicas[id].Committed(), wantFrom, want)
		}
		for off, v := range got {
			if w, ok := ref[off]; ok && w != v {
				c.t.Fatalf("offset %d: node %d holds %q, node %d %q", off, id, v, wantFrom, w)
			}
		}
	}
	return want
}

// compact runs node id's Compact, then delivers what it sent: a leader's
// floor or no-floor message, without which a follower that has heard
// neither compacts nothing (floor.go).
func (c *cluster) compact(id uint64) int {
	c.t.Helper()
	n, err := c.replicas[id].Compact()
	if err != nil {
		c.t.Fatalf("node %d: compact: %v", id, err)
	}
	c.settle()
	return n
}

func stagedFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "_snap.") {
			out = append(out, e.Name())
		}
	}
	return out
}

// behindCluster is a 3-node group whose node 3 was cut off while the leader
// (node 1) and node 2 wrote 60 batches and compacted past node 3's log.
func behindCluster(t *testing.T) *cluster {
	c := newClusterOpts(t, 3, 3, withCompaction(3000))
	c.elect(1)
	c.proposeN(7, 0, 5, "a")
	c.tick(2)
	c.cut[3] = true
	c.proposeN(7, 15, 60, "b")
	// Past an election timeout the leader no longer counts node 3 as
	// recently active, so it does not hold compaction back for it.
	c.tick(25)
	if c.compact(1) == 0 || c.compact(2) == 0 {
		t.Fatal("retention deleted nothing")
	}
	if first, last := c.logs[1].FirstIndex(), c.logs[3].LastIndex(); first <= last+1 {
		t.Fatalf("leader's log starts at %d, node 3's ends at %d: not behind", first, last)
	}
	return c
}

// TestSnapshotCatchUp: a follower far behind a compacted leader catches up
// by segment transfer, then by appends; all replicas agree.
func TestSnapshotCatchUp(t *testing.T) {
	c := behindCluster(t)
	delete(c.cut, 3)
	c.tick(5)
	if got := c.replicas[3].Stats().SnapshotsInstalled; got != 1 {
		t.Fatalf("node 3 installed %d snapshots, want 1", got)
	}
	if got := c.replicas[1].Stats().SnapshotsSent; got == 0 {
		t.Fatal("the leader sent no snapshot")
	}
	if a, b := c.logs[3].StartOffset(), c.logs[1].StartOffset(); a != b {
		t.Fatalf("node 3 starts at offset %d, the leader at %d", a, b)
	}
	committed := c.agree()
	if committed != 5*3+60*3 {
		t.Fatalf("committed %d", committed)
	}
	// Then plain appends: no second snapshot.
	c.proposeN(7, 195, 10, "c")
	c.tick(2)
	if c.agree() != committed+30 || c.replicas[3].Stats().SnapshotsInstalled != 1 {
		t.Fatalf("after more appends: committed %d, snapshots %d", c.replicas[3].Committed(), c.replicas[3].Stats().SnapshotsInstalled)
	}
	if a, b := c.logs[3].LastIndex(), c.logs[1].LastIndex(); a != b {
		t.Fatalf("node 3 ends at index %d, the leader at %d", a, b)
	}
	// Node 3's idempotence table was rebuilt from the installed log: as
	// leader it answers a retry of the last batch with its offsets.
	c.transfer(3)
	var res []Result
	c.replicas[3].Propose(op(7, 195+27, 3, "c009", &res))
	c.settle()
	if len(res) != 1 || !res[0].Duplicate || res[0].BaseOffset != committed+27 {
		t.Fatalf("retry at the new leader: %+v", res)
	}
	if n := stagedFiles(t, c.dirs[3]); len(n) != 0 {
		t.Fatalf("staged files left: %v", n)
	}
}

// TestRestartAfterInstall: a follower restarted after installing a snapshot
// serves the same log and keeps up.
func TestRestartAfterInstall(t *testing.T) {
	c := behindCluster(t)
	delete(c.cut, 3)
	c.tick(5)
	committed := c.agree()
	start := c.logs[3].StartOffset()
	c.stop(3)
	c.start(3)
	if got := c.replicas[3].Committed(); got != committed {
		t.Fatalf("restarted node 3 has committed %d, want %d", got, committed)
	}
	if c.logs[3].StartOffset() != start {
		t.Fatalf("restarted node 3 starts at %d, want %d", c.logs[3].StartOffset(), start)
	}
	c.proposeN(7, 195, 5, "c")
	c.tick(2)
	if c.agree() != committed+15 || c.replicas[3].Stats().SnapshotsInstalled != 0 {
		t.Fatalf("after restart: committed %d, snapshots since %d", c.replicas[3].Committed(), c.replicas[3].Stats().SnapshotsInstalled)
	}
}

// TestRestartAfterCompaction: every replica compacts its whole log away (by
// age) and restarts; the group goes on at the same offsets.
func TestRestartAfterCompaction(t *testing.T) {
	c, base := ageRetentionCluster(t)
	c.elect(1)
	c.proposeN(7, 0, 20, "a")
	c.tick(2)
	committed := c.agree()
	for _, id := range c.ids {
		c.clock[id] = base.Add(time.Hour)
	}
	for _, id := range c.ids {
		if c.compact(id) == 0 {
			t.Fatalf("node %d compacted nothing", id)
		}
		if st := c.logs[id]; st.StartOffset() != committed || st.FirstIndex() != 0 {
			t.Fatalf("node %d: log starts at %d (first index %d), want empty at %d", id, st.StartOffset(), st.FirstIndex(), committed)
		}
	}
	for _, id := range c.ids {
		c.stop(id)
	}
	for _, id := range c.ids {
		c.start(id)
		if got := c.replicas[id].Committed(); got != committed {
			t.Fatalf("node %d restarted with committed %d, want %d", id, got, committed)
		}
	}
	c.elect(2)
	// Producer 7's batches went with the log; a new producer appends at
	// the offsets that follow.
	res := c.proposeN(8, 0, 3, "b")
	if res[0].BaseOffset != committed {
		t.Fatalf("first append after restart at %d, want %d", res[0].BaseOffset, committed)
	}
	c.tick(2)
	if c.agree() != committed+9 {
		t.Fatal("replicas disagree after restart")
	}
}

// TestLeaderHoldsBackCompaction: a leader keeps the entries a reachable,
// lagging follower still needs, within CompactionHoldBackBytesMax.
func TestLeaderHoldsBackCompaction(t *testing.T) {
	for _, tc := range []struct {
		name     string
		boundMax int64
		holds    bool
	}{{"within bound", 1 << 20, true}, {"past bound", 100, false}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClusterOpts(t, 3, 3, func(c *cluster) {
				withCompaction(3000)(c)
				c.repCfg = func(_ uint64, cfg *Config) { cfg.CompactionHoldBackBytesMax = tc.boundMax }
			})
			c.elect(1)
			c.proposeN(7, 0, 5, "a")
			c.tick(2)
			// Node 3 hears heartbeats (and so stays recently active) but no
			// entries.
			c.drop = func(m *raftpb.Message) bool {
				return m.GetTo() == 3 && m.GetType() == raftpb.MsgApp && len(m.GetEntries()) > 0
			}
			c.proposeN(7, 15, 40, "b")
			c.tick(3)
			match := c.replicas[1].Status().Progress[3].Match
			c.compact(1)
			c.compact(2)
			first1, first2 := c.logs[1].FirstIndex(), c.logs[2].FirstIndex()
			if first2 <= match+1 {
				t.Fatalf("node 2 kept index %d: retention should have deleted past node 3's match %d", first2, match)
			}
			if held := first1 <= match+1; held != tc.holds {
				t.Fatalf("leader's log starts at %d, node 3 matched %d: held back %v, want %v", first1, match, held, tc.holds)
			}
			c.drop = nil
			c.tick(3)
			c.agree()
			wantSnap := uint64(0)
			if !tc.holds {
				wantSnap = 1
			}
			if got := c.replicas[3].Stats().SnapshotsInstalled; got != wantSnap {
				t.Fatalf("node 3 installed %d snapshots, want %d", got, wantSnap)
			}
		})
	}
}

// capturedSnapshot brings node 3 of a behindCluster back and captures the
// snapshot the leader sends it, body read out.
func capturedSnapshot(t *testing.T, c *cluster) (*raftpb.Message, []byte) {
	c.holdSnaps = true
	delete(c.cut, 3)
	for i := 0; i < 10 && len(c.snaps) == 0; i++ {
		c.tick(1)
	}
	if len(c.snaps) == 0 {
		t.Fatal("the leader sent no snapshot")
	}
	s := c.snaps[0]
	c.snaps = c.snaps[1:]
	body, err := io.ReadAll(s.body)
	if err != nil {
		t.Fatal(err)
	}
	s.body.Close()
	// The transport reports every snapshot; this one never arrived.
	c.replicas[1].ReportSnapshot(3, errors.New("captured by the test"))
	return s.m, body
}

// TestBadSnapshotRefused: truncated, corrupt or mislabelled snapshots give
// ErrSnapshotInvalid and leave the follower's log untouched; the intact one
// then installs.
func TestBadSnapshotRefused(t *testing.T) {
	c := behindCluster(t)
	m, body := capturedSnapshot(t, c)
	r3, log3 := c.replicas[3], c.logs[3]
	last, next := log3.LastIndex(), log3.NextOffset()

	desc, err := decodeSnapshotDesc(m.GetSnapshot().GetData())
	if err != nil {
		t.Fatal(err)
	}
	// The body: the producer base, then the frames.
	pb := int(desc.ProducersBytes)
	if pb == 0 {
		t.Fatal("the snapshot carries no producer base")
	}
	var frameEnds []int
	for p := pb; p < len(body); {
		n, err := batch.FrameSize(body[p:])
		if err != nil {
			t.Fatal(err)
		}
		p += n
		frameEnds = append(frameEnds, p)
	}
	badBase := bytes.Clone(body)
	badBase[pb/2] ^= 1
	withDesc := func(f func(d *snapshotDesc)) *raftpb.Message {
		d := desc
		f(&d)
		m2 := proto.Clone(m).(*raftpb.Message)
		m2.Snapshot.Data = d.encode()
		return m2
	}
	withMeta := func(f func(md *raftpb.SnapshotMetadata)) *raftpb.Message {
		m2 := proto.Clone(m).(*raftpb.Message)
		f(m2.Snapshot.Metadata)
		return m2
	}
	flip := bytes.Clone(body)
	flip[len(flip)/2] ^= 0x40
	badData := proto.Clone(m).(*raftpb.Message)
	badData.Snapshot.Data[10] ^= 1
	cases := []struct {
		name string
		m    *raftpb.Message
		body []byte
	}{
		{"truncated mid-frame", m, body[:len(body)-10]},
		{"last frame missing", m, body[:frameEnds[len(frameEnds)-2]]},
		{"first frame missing", m, append(bytes.Clone(body[:pb]), body[frameEnds[0]:]...)},
		{"producer base corrupt", m, badBase},
		{"producer base truncated", m, body[:pb-1]},
		{"empty body", m, nil},
		{"corrupt byte", m, flip},
		{"trailing bytes", m, append(bytes.Clone(body), 0)},
		{"description checksum", badData, body},
		{"more frames described", withDesc(func(d *snapshotDesc) { d.Frames++; d.FirstIndex-- }), body},
		{"wrong next offset", withDesc(func(d *snapshotDesc) { d.NextOffset++ }), body},
		{"wrong first offset", withDesc(func(d *snapshotDesc) { d.FirstOffset-- }), body},
		{"wrong term", withMeta(func(md *raftpb.SnapshotMetadata) { md.Term = proto.Uint64(md.GetTerm() + 1) }), body},
		{"no voters", withMeta(func(md *raftpb.SnapshotMetadata) { md.ConfState = &raftpb.ConfState{} }), body},
	}
	for _, tc := range cases {
		_, err := r3.ReceiveSnapshot(tc.m, bytes.NewReader(tc.body))
		if !errors.Is(err, ErrSnapshotInvalid) {
			t.Fatalf("%s: %v, want ErrSnapshotInvalid", tc.name, err)
		}
		if log3.LastIndex() != last || log3.NextOffset() != next {
			t.Fatalf("%s: node 3's log changed", tc.name)
		}
		if n := stagedFiles(t, c.dirs[3]); len(n) != 0 {
			t.Fatalf("%s: staged files left: %v", tc.name, n)
		}
	}
	// A message with no staged body past the commit index is not stepped.
	if err := r3.StepSnapshot(m, nil); !errors.Is(err, ErrSnapshotInvalid) {
		t.Fatalf("step without a body: %v", err)
	}
	// The intact snapshot installs.
	if err := c.receiveSnapshot(3, 1, m, bytes.NewReader(body)); err != nil {
		t.Fatal(err)
	}
	c.holdSnaps = false
	c.tick(3)
	if r3.Stats().SnapshotsInstalled != 1 {
		t.Fatal("the intact snapshot was not installed")
	}
	c.agree()
}

// TestStaleSnapshotIgnored: a snapshot no newer than the follower's log is
// not installed, whether the follower sees that on receipt or Raft does
// (the follower already holds the snapshot's entry).
func TestStaleSnapshotIgnored(t *testing.T) {
	c := behindCluster(t)
	m, body := capturedSnapshot(t, c)
	r3 := c.replicas[3]
	// A second snapshot while one is staged is refused.
	st, err := r3.ReceiveSnapshot(m, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r3.ReceiveSnapshot(m, bytes.NewReader(body)); !errors.Is(err, ErrSnapshotBusy) {
		t.Fatalf("second snapshot: %v", err)
	}
	if err := r3.StepSnapshot(m, st); err != nil {
		t.Fatal(err)
	}
	c.holdSnaps = false
	c.tick(3)
	installed, last := r3.Stats().SnapshotsInstalled, c.logs[3].LastIndex()
	if installed != 1 {
		t.Fatalf("installed %d", installed)
	}
	// The same snapshot again: stale on receipt.
	if _, err := r3.ReceiveSnapshot(m, bytes.NewReader(body)); !errors.Is(err, ErrSnapshotStale) {
		t.Fatalf("old snapshot: %v", err)
	}
	if err := r3.StepSnapshot(m, nil); err != nil {
		t.Fatal(err)
	}
	c.settle()
	if r3.Stats().SnapshotsInstalled != installed || c.logs[3].LastIndex() != last {
		t.Fatal("a stale snapshot changed the log")
	}
	c.agree()
}

// TestSnapshotDeclinedByRaft: the follower holds the snapshot's entry but
// not its commit; Raft fast-forwards the commit index instead of installing,
// and the staged body is discarded.
func TestSnapshotDeclinedByRaft(t *testing.T) {
	c := newClusterOpts(t, 3, 3, withCompaction(3000))
	c.elect(1)
	c.proposeN(7, 0, 5, "a")
	c.tick(2)
	// Node 3 gets entries, never a commit index that covers them.
	c.drop = func(m *raftpb.Message) bool {
		return m.GetTo() == 3 && (m.GetType() == raftpb.MsgHeartbeat || (m.GetType() == raftpb.MsgApp && len(m.GetEntries()) == 0))
	}
	c.proposeN(7, 15, 10, "b")
	r1, r3 := c.replicas[1], c.replicas[3]
	if r3.Status().GetCommit() >= r1.appliedIndex || c.logs[3].LastIndex() != c.logs[1].LastIndex() {
		t.Fatalf("setup: node 3 commit %d last %d, leader applied %d", r3.Status().GetCommit(), c.logs[3].LastIndex(), r1.appliedIndex)
	}
	snap, err := r1.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	d, _ := decodeSnapshotDesc(snap.GetData())
	body := &snapshotBody{log: r1.cfg.Log, pins: &r1.pins, next: d.FirstIndex, end: d.FirstIndex + d.Frames}
	m := &raftpb.Message{Type: raftpb.MsgSnap.Enum(), From: proto.Uint64(1), To: proto.Uint64(3),
		Term: proto.Uint64(r1.Status().GetTerm()), Snapshot: snap}
	st, err := r3.ReceiveSnapshot(m, body)
	if err != nil {
		t.Fatal(err)
	}
	if err := r3.StepSnapshot(m, st); err != nil {
		t.Fatal(err)
	}
	if err := r3.ProcessReady(); err != nil {
		t.Fatal(err)
	}
	if r3.Stats().SnapshotsInstalled != 0 || r3.Status().GetCommit() != snap.GetMetadata().GetIndex() {
		t.Fatalf("installed %d, commit %d", r3.Stats().SnapshotsInstalled, r3.Status().GetCommit())
	}
	if n := stagedFiles(t, c.dirs[3]); len(n) != 0 {
		t.Fatalf("staged files left: %v", n)
	}
	c.drop = nil
	c.tick(2)
	c.agree()
}

// flakyState fails one Save: the first (failInstalling) or the last
// (failAfter) of a snapshot install.
type flakyState struct {
	inner           *MemState
	failInstalling  bool
	failAfter       bool
	sawInstalling   bool
	failed          bool
	installingSaves int
}

func (f *flakyState) Load() (HardState, bool, error) { return f.inner.Load() }

func (f *flakyState) SaveCommit(index uint64, clean bool) error {
	return f.inner.SaveCommit(index, clean)
}
func (f *flakyState) OpenCommitWriter() (CommitWriter, error) { return f.inner.OpenCommitWriter() }

func (f *flakyState) Save(h HardState) error {
	switch {
	case f.failed:
	case h.Installing != nil && f.failInstalling:
		f.failed = true
		return errors.New("injected: state save fails")
	case h.Installing != nil:
		f.sawInstalling = true
	case f.sawInstalling && f.failAfter:
		f.failed = true
		return errors.New("injected: state save fails")
	}
	return f.inner.Save(h)
}

// TestInstallInterrupted: a failure between the steps of an install stops
// the replica; reopened, it has the old log and state (failure before the
// swap) or completes the install (failure after it), and catches up.
func TestInstallInterrupted(t *testing.T) {
	for _, tc := range []struct {
		name            string
		before, swapped bool
	}{{"before the swap", true, false}, {"after the swap", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			c := behindCluster(t)
			m, body := capturedSnapshot(t, c)
			fs := &flakyState{inner: c.states[3], failInstalling: tc.before, failAfter: !tc.before}
			c.stop(3)
			c.repCfg = func(id uint64, cfg *Config) {
				if id == 3 {
					cfg.State = fs
				}
			}
			c.start(3)
			c.repCfg = nil
			r3 := c.replicas[3]
			oldLast := c.logs[3].LastIndex()
			st, err := r3.ReceiveSnapshot(m, bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			if err := r3.StepSnapshot(m, st); err != nil {
				t.Fatal(err)
			}
			if err := r3.ProcessReady(); err == nil || !fs.failed {
				t.Fatalf("ProcessReady: %v (injected failure used: %v)", err, fs.failed)
			}
			if r3.Failure() == nil {
				t.Fatal("the replica did not stop")
			}
			c.stop(3)
			c.start(3)
			hs, _, _ := c.states[3].Load()
			if hs.Installing != nil {
				t.Fatal("the reopened replica left the install record")
			}
			index := m.GetSnapshot().GetMetadata().GetIndex()
			if got := hs.SnapshotIndex == index; got != tc.swapped {
				t.Fatalf("state's compaction point %d, snapshot %d: adopted %v, want %v", hs.SnapshotIndex, index, got, tc.swapped)
			}
			if tc.swapped && c.logs[3].LastIndex() != index {
				t.Fatalf("log ends at %d, want %d", c.logs[3].LastIndex(), index)
			}
			if !tc.swapped && c.logs[3].LastIndex() != oldLast {
				t.Fatalf("log ends at %d, want the old %d", c.logs[3].LastIndex(), oldLast)
			}
			c.holdSnaps = false
			c.tick(5)
			c.agree()
		})
	}
}

// TestIdempotenceSurvivesCompaction: a producer whose batches all lie below
// the compaction point is still known, after a restart (the producer base
// in the state) and on a replica that installed a snapshot (the base in the
// snapshot): its retries get their original offsets, including its first
// batch at sequence 0, and it continues where it was.
func TestIdempotenceSurvivesCompaction(t *testing.T) {
	c := newClusterOpts(t, 3, 3, withCompaction(3000))
	c.elect(1)
	first := c.proposeN(5, 0, 3, "early") // producer 5: sequences 0-8
	c.tick(2)
	c.cut[3] = true
	c.proposeN(7, 0, 60, "bulk")
	c.tick(25)
	for _, id := range []uint64{1, 2} {
		c.compact(id)
		if c.logs[id].StartOffset() <= first[2].BaseOffset {
			t.Fatalf("node %d still holds producer 5's batches", id)
		}
	}
	// Node 3 catches up by snapshot; node 1 restarts with its log compacted.
	delete(c.cut, 3)
	c.tick(5)
	if c.replicas[3].Stats().SnapshotsInstalled != 1 {
		t.Fatal("node 3 installed no snapshot")
	}
	c.stop(1)
	c.start(1)
	c.tick(20)
	// The restart may cost an election; wait for its outcome (bounded).
	for i := 0; i < 200 && c.leader() == 0; i++ {
		c.tick(1)
	}
	if c.leader() == 0 {
		t.Fatal("no leader after node 1 restarted")
	}
	for _, id := range []uint64{1, 3} {
		if c.leader() != id {
			c.transfer(id)
		}
		var res []Result
		c.replicas[id].Propose(op(5, 0, 3, "early000", &res)) // the very first batch
		c.replicas[id].Propose(op(5, 6, 3, "early002", &res)) // the last one
		c.settle()
		if len(res) != 2 || !res[0].Duplicate || res[0].BaseOffset != first[0].BaseOffset ||
			!res[1].Duplicate || res[1].BaseOffset != first[2].BaseOffset {
			t.Fatalf("leader %d answered retries of compacted batches with %+v", id, res)
		}
	}
	var res []Result
	c.replicas[c.leader()].Propose(op(5, 9, 1, "late", &res))
	c.settle()
	if len(res) != 1 || res[0].Err != nil || res[0].Duplicate {
		t.Fatalf("producer 5's next batch: %+v", res)
	}
	c.tick(2)
	c.agree()
}

// TestCompactionFloor: a floor set by the node (the lowest offset its
// mirrors in other regions have yet to apply) keeps every segment holding
// an offset at or past it, whatever retention and the followers allow, on
// top of the followers' hold-back (a floor below a held-back point used to
// cut the candidate list short and panic).
func TestCompactionFloor(t *testing.T) {
	c := newClusterOpts(t, 3, 3, func(c *cluster) {
		withCompaction(3000)(c)
		c.repCfg = func(_ uint64, cfg *Config) { cfg.CompactionHoldBackBytesMax = 1 << 20 }
	})
	c.elect(1)
	// Node 3 has most of the log (the followers' hold-back point is high)
	// and misses only the newest entries.
	c.proposeN(7, 0, 40, "a")
	c.tick(2)
	c.drop = func(m *raftpb.Message) bool {
		return m.GetTo() == 3 && m.GetType() == raftpb.MsgApp && len(m.GetEntries()) > 0
	}
	c.proposeN(7, 120, 5, "b")
	c.tick(3)
	const floor = 0
	c.replicas[1].SetCompactionFloor(floor, true)
	c.compact(1)
	if start := c.logs[1].StartOffset(); start > floor {
		t.Fatalf("the leader's log starts at offset %d past the floor %d", start, floor)
	}
	// Lifting the floor lets retention and the hold-back decide again.
	c.drop = nil
	c.tick(3)
	c.replicas[1].SetCompactionFloor(0, false)
	c.compact(1)
	if start := c.logs[1].StartOffset(); start <= floor {
		t.Fatalf("without a floor the leader kept its log from offset %d", start)
	}
	c.agree()
}
