package replicator

import (
	"testing"
	"time"
)

// TestResendBelowRetainedStartResets: a mirror holding an older home's
// divergent tail, whose retention deleted its log past the new home's
// epoch change, is resent from that change: the Server cannot compare
// what the batch overlaps, but every frame the mirror holds is of an
// older epoch than the batch, so none is the range's; the mirror forks
// below its log start (a reset: all it holds goes to the orphan log) and
// catches up (sim seed 129, notes/simgaps.md P1). Without it the Server
// refused the batch as UNAVAILABLE and the task resent it for ever.
func TestResendBelowRetainedStartResets(t *testing.T) {
	for _, whole := range []bool{false, true} {
		name := map[bool]string{false: "part of the tail retained", true: "whole log deleted"}[whole]
		t.Run(name, func(t *testing.T) {
			g := newLogGen(43, 200)
			src := NewMemSource(0)
			g.fill(t, src, 20, 4) // the common prefix, epoch 1
			change := src.CommittedEnd()
			old := *g
			old.seqs = map[uint64]uint64{}
			var tail [][]byte
			for range 30 { // the old home's divergent tail, epoch 1
				tail = append(tail, old.frame(1+old.rng.IntN(4)))
			}
			node := startMirror(t, NewMemMirrorStore(), nil)
			m := node.store.Range(testStream, testRange)
			if err := m.Seed(append(src.Frames(), tail...)...); err != nil {
				t.Fatal(err)
			}
			divergentEnd := m.AppliedEnd()
			retainFrom := frameBase(tail[10]) // retention deleted past the change
			if whole {
				retainFrom = divergentEnd
			}
			if err := m.Retain(retainFrom); err != nil {
				t.Fatal(err)
			}
			g.epoch = 2
			g.fill(t, src, 10, 4)
			cfg := taskConfig(t, src, newDialer(t), node.addr)
			cfg.Epoch = 2
			startTask(t, cfg)
			waitFor(t, 20*time.Second, "the mirror to reset and catch up", func() bool {
				return m.AppliedEnd() == src.CommittedEnd()
			})
			want := src.Frames()
			var fromChange [][]byte
			for _, f := range want {
				if frameBase(f) >= change {
					fromChange = append(fromChange, f)
				}
			}
			got := m.Frames()
			if len(got) != len(fromChange) {
				t.Fatalf("mirror holds %d frames, the source %d from the change %d", len(got), len(fromChange), change)
			}
			for i := range got {
				if !SameData(got[i], fromChange[i]) {
					t.Fatalf("frame %d differs", i)
				}
			}
			orphans := m.Orphans()
			if wantN := len(tail) - 10; !whole && len(orphans) != wantN {
				t.Fatalf("%d frames orphaned, want the %d retained of the divergent tail", len(orphans), wantN)
			}
			if whole && len(orphans) != 0 {
				t.Fatalf("%d frames orphaned, the mirror retained none", len(orphans))
			}
			if st := node.srv.Stats(); st.Forks != 1 {
				t.Fatalf("server stats %+v, want one fork", st)
			}
		})
	}
}

// TestResetPoint: a batch the mirror cannot compare is a reset only when
// its first frame is of a newer epoch than the mirror's log, which is
// known, and it starts below the applied end.
func TestResetPoint(t *testing.T) {
	g := newLogGen(7, 20)
	g.next = 40
	g.epoch = 3
	f := g.frame(2)
	cb := CheckedBatch{First: 40, End: 42, FrameCount: 1, Frames: f}
	for _, tc := range []struct {
		applied, logEpoch uint64
		ok                bool
	}{
		{50, 2, true},  // older log: every frame it holds is another home's
		{50, 3, false}, // same epoch: may be the range's own frames
		{50, 4, false}, // newer log epoch (a fork raised it): not shown
		{50, 0, false}, // unknown
		{40, 2, false}, // no overlap: an extension
		{41, 2, true},  // overlaps one offset
	} {
		at, epoch, ok := cb.ResetPoint(tc.applied, tc.logEpoch)
		if ok != tc.ok || (ok && (at != 40 || epoch != 3)) {
			t.Errorf("applied %d log epoch %d: reset at %d epoch %d ok %v, want ok %v", tc.applied, tc.logEpoch, at, epoch, ok, tc.ok)
		}
	}
}

// TestHeartbeatCarriesHomeFloor: a task's heartbeats carry the home's
// compaction floor (TaskConfig.RetainFrom) to the mirror, which keeps its
// log from there (regionsvc: the mirror leader's compaction floor), so
// that a mirror that becomes the home still holds what the others need
// (notes/simgaps.md P3); a home that does not know it sends none.
func TestHeartbeatCarriesHomeFloor(t *testing.T) {
	for _, known := range []bool{true, false} {
		g := newLogGen(5, 50)
		src := NewMemSource(0)
		g.fill(t, src, 5, 2)
		node := startMirror(t, NewMemMirrorStore(), nil)
		m := node.store.Range(testStream, testRange)
		cfg := taskConfig(t, src, newDialer(t), node.addr)
		cfg.RetainFrom = func() (uint64, bool) { return 7, known }
		rt := startTask(t, cfg)
		waitFor(t, 20*time.Second, "heartbeats", func() bool { _, n := m.LastHeartbeat(); return n > 2 })
		hb, _ := m.LastHeartbeat()
		if hb.RetainFromKnown != known || (known && hb.RetainFrom != 7) {
			t.Fatalf("known %v: the mirror heard floor %d (known %v)", known, hb.RetainFrom, hb.RetainFromKnown)
		}
		rt.stop(t)
	}
}
