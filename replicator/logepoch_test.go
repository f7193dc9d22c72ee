package replicator

import (
	"testing"
	"time"
)

// retainedMirror is a MemMirror whose log retention deleted entirely: its
// applied end stands, no frame below it is readable, and its log's epoch
// is kept apart from the frames (a LogEpocher), as regionsvc's mirror
// range keeps it in its replica.
type retainedMirror struct {
	*MemMirror
	logEpoch uint64
}

func (m retainedMirror) ReadFrames(from uint64, maxBytes int, endOffset uint64) ([]byte, error) {
	return nil, nil // deleted by retention up to the applied end
}

func (m retainedMirror) LogEpoch() uint64 { return m.logEpoch }

// noEpochMirror is retainedMirror without the LogEpocher (the interface
// field hides MemMirror's own).
type noEpochMirror struct{ MirrorRange }

func (m noEpochMirror) ReadFrames(from uint64, maxBytes int, endOffset uint64) ([]byte, error) {
	return nil, nil
}

// TestOpenAnswerLogEpochAfterRetention: a mirror whose whole log was
// deleted by retention still answers an open with the epoch its log ends
// in, so that a newer home resends from its epoch change and the mirror
// forks a divergent tail (sim seed 129: without it the answer had no
// LogEpoch, the new home shipped from the applied end, and its frames went
// on top of an older home's tail).
func TestOpenAnswerLogEpochAfterRetention(t *testing.T) {
	g := newLogGen(3, 100)
	mem := NewMemMirrorStore().Range(testStream, testRange)
	for range 5 {
		if err := mem.Seed(g.frame(2)); err != nil {
			t.Fatal(err)
		}
	}
	applied := mem.AppliedEnd()

	// The frame is readable: its epoch.
	if got := openAnswer(mem, applied, 2); got.LogEpoch == nil || got.GetLogEpoch() != 1 {
		t.Fatalf("readable log: LogEpoch %v, want 1 (the last frame's)", got.LogEpoch)
	}
	a := openAnswer(retainedMirror{MemMirror: mem, logEpoch: 1}, applied, 2)
	if a.LogEpoch == nil || a.GetLogEpoch() != 1 {
		t.Fatalf("log deleted by retention: LogEpoch %v, want 1 (kept apart from the frames)", a.LogEpoch)
	}
	if a.GetAppliedEndOffset() != applied || a.GetHighestEpoch() != 2 {
		t.Fatalf("answer %v, want applied end %d and highest epoch 2", a, applied)
	}
	if a := openAnswer(retainedMirror{MemMirror: mem}, applied, 2); a.LogEpoch != nil {
		t.Fatalf("unknown log epoch (0) answered as %d, want absent", a.GetLogEpoch())
	}
	if a := openAnswer(noEpochMirror{mem}, applied, 2); a.LogEpoch != nil {
		t.Fatalf("no frame and no LogEpocher: LogEpoch %d, want absent", a.GetLogEpoch())
	}
}

// TestResendLagIsTheForkPoint: a mirror whose log ends in an older epoch
// needs the new home's log from the home's epoch change on (the resend),
// not from its divergent applied end. The task's lag, which regionsvc
// takes as the compaction floor (mirrorFloor), says so from the open on:
// with the applied end instead, retention could delete what the resend
// must compare, and the mirror would fork too late, above a divergent
// part it keeps.
func TestResendLagIsTheForkPoint(t *testing.T) {
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
	g.epoch = 2
	g.fill(t, src, 10, 4)
	m.Hold() // the resend's apply waits: the lag is the open's
	cfg := taskConfig(t, src, newDialer(t), node.addr)
	cfg.Epoch = 2
	rt := startTask(t, cfg)
	waitFor(t, 20*time.Second, "the resend to reach the mirror", func() bool { return m.Held() > 0 })
	if got := rt.task.Lag(time.Now()).AppliedEnd; got != change {
		t.Fatalf("lag's applied end %d while resending, want the epoch change %d (the mirror's divergent end is %d)", got, change, divergentEnd)
	}
	m.Release()
	waitFor(t, 20*time.Second, "the mirror to fork and catch up", func() bool {
		return len(m.Orphans()) > 0 && m.AppliedEnd() == src.CommittedEnd()
	})
	assertMirrored(t, src, m)
}
