package replicator

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
)

// noStartSource is a Source that does not say where its log starts (no
// SourceStarter): a task over it cannot skip.
type noStartSource struct{ Source }

// noSkipStore serves mirrors that cannot skip (no Skipper).
type noSkipStore struct{ *MemMirrorStore }

func (s noSkipStore) Open(ctx context.Context, stream string, rng uint32) (MirrorRange, error) {
	mr, err := s.MemMirrorStore.Open(ctx, stream, rng)
	if err != nil {
		return nil, err
	}
	return struct{ MirrorRange }{mr}, nil
}

// TestServerSkip walks the checks of a batch flagged from_source_start:
// refused (ErrSkipRefused, INVALID_ARGUMENT, the stream ends, the mirror
// untouched) when it starts at or below the mirror's applied end (a forged
// or stale flag: a skip never moves a log backwards), when it ends past
// the home's committed tail (offsets the source never had), or when the
// mirror cannot skip; otherwise the mirror skips to its start and applies
// it, and unflagged batches continue from there.
func TestServerSkip(t *testing.T) {
	g := newLogGen(31, 100)
	frames := make([][]byte, 8)
	for i := range frames {
		frames[i] = g.frame(2)
	}
	node := startMirror(t, NewMemMirrorStore(), nil)
	m := node.store.Range(testStream, testRange)
	c := dialRaw(t, node.addr)
	c.mustAnswer(openReq(1))
	if resp := c.mustAnswer(batchReq(1, CompressionNone, frames[0:2]...)); resp.GetError() != nil {
		t.Fatalf("first batch answered %v", resp)
	}
	applied := m.AppliedEnd()

	// flagged is a batch of fs flagged from_source_start, its heartbeat
	// claiming the committed tail tail (0: the batch's end).
	flagged := func(tail uint64, fs ...[]byte) *geologinternalv1.ReplicateRequest {
		r := batchReq(1, CompressionZstd, fs...)
		r.Batch.FromSourceStart = true
		if tail != 0 {
			r.Heartbeat.CommittedEndOffset = tail
		}
		return r
	}
	expectSkipRefused := func(c *rawClient, what string, r *geologinternalv1.ReplicateRequest) {
		t.Helper()
		ref := refusalOf(t, c.mustAnswer(r))
		if ref.API.Code != apierr.InvalidArgument || !strings.Contains(ref.Error(), ErrSkipRefused.Error()) {
			t.Fatalf("%s: refused with %v, want INVALID_ARGUMENT %v", what, ref, ErrSkipRefused)
		}
		expectEnd(t, c)
		if m.AppliedEnd() != applied || m.Skips() != 0 || len(m.Frames()) != 2 {
			t.Fatalf("%s: the mirror changed: applied end %d (was %d), skips %d, %d frames", what, m.AppliedEnd(), applied, m.Skips(), len(m.Frames()))
		}
	}
	// A flagged batch at the applied end, and one below it.
	expectSkipRefused(c, "flagged at the applied end", flagged(0, frames[2:4]...))
	c = dialRaw(t, node.addr)
	c.mustAnswer(openReq(1))
	expectSkipRefused(c, "flagged below the applied end", flagged(0, frames[1:4]...))
	// A flagged batch past the committed tail its heartbeat claims.
	c = dialRaw(t, node.addr)
	c.mustAnswer(openReq(1))
	expectSkipRefused(c, "flagged past the home's tail", flagged(frameBase(frames[6]), frames[5:7]...))
	// A mirror that cannot skip.
	other := startMirror(t, NewMemMirrorStore(), func(cfg *ServerConfig) { cfg.Store = noSkipStore{node.store} })
	c = dialRaw(t, other.addr)
	c.mustAnswer(openReq(1))
	expectSkipRefused(c, "a mirror without Skipper", flagged(0, frames[5:7]...))

	// The home's start at frame 5: the mirror skips, applies, goes on.
	c = dialRaw(t, node.addr)
	c.mustAnswer(openReq(1))
	resp := c.mustAnswer(flagged(0, frames[5:7]...))
	if resp.GetError() != nil || resp.GetAppliedEndOffset() != frameNext(frames[6]) {
		t.Fatalf("flagged batch from the home's start answered %v", resp)
	}
	if resp := c.mustAnswer(batchReq(1, CompressionNone, frames[7])); resp.GetError() != nil || resp.GetAppliedEndOffset() != frameNext(frames[7]) {
		t.Fatalf("the batch after the skip answered %v", resp)
	}
	got := m.Frames()
	if len(m.Orphans()) != 0 {
		t.Fatalf("a mirror of the home's epoch orphaned %d frames before its skip", len(m.Orphans()))
	}
	if m.Skips() != 1 || node.srv.Stats().Skips != 1 || len(got) != 3 || !SameData(got[0], frames[5]) || !SameData(got[2], frames[7]) {
		t.Fatalf("after the skip: %d skips (server %d), %d frames", m.Skips(), node.srv.Stats().Skips, len(got))
	}
	if _, err := m.ReadFrames(frameBase(frames[4]), 1<<20, frameNext(frames[7])); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("a read below the skip returned %v, want ErrOutOfRange", err)
	}
}

// TestTaskSkipsToSourceStart: a mirror that stopped at frame 3 while the
// home's retention deleted frames up to 6 gets, from the task, a batch
// from the home's start flagged from_source_start, skips to it and then
// holds exactly what the home holds.
func TestTaskSkipsToSourceStart(t *testing.T) {
	g := newLogGen(33, 64)
	src := NewMemSource(0)
	g.fill(t, src, 12, 4)
	all := src.Frames()
	node := startMirror(t, NewMemMirrorStore(), nil)
	m := node.store.Range(testStream, testRange)
	if err := m.Seed(all[:3]...); err != nil {
		t.Fatal(err)
	}
	if err := src.Retain(frameBase(all[6])); err != nil {
		t.Fatal(err)
	}
	rt := startTask(t, taskConfig(t, src, newDialer(t), node.addr))
	waitFor(t, 10*time.Second, "the mirror catches up past the home's start", func() bool {
		return m.AppliedEnd() == src.CommittedEnd()
	})
	assertMirrored(t, src, m)
	// The task counts its skip when the mirror's answer reaches it, which
	// may come after the mirror applied (a loaded machine shows it).
	waitFor(t, 10*time.Second, "the task counts the skip", func() bool { return rt.task.Stats().Skips >= 1 })
	if st := rt.task.Stats(); st.Skips != 1 || m.Skips() != 1 {
		t.Fatalf("task skips %d, mirror skips %d, want 1 each", st.Skips, m.Skips())
	}
	waitFor(t, 10*time.Second, "the task no longer reports the mirror behind the start", func() bool {
		return !rt.task.Stats().BehindSourceStart
	})
}

// TestTaskSkipsToEmptySource: a mirror that stopped at frame 3 while the
// home's retention deleted its whole log (an idle stream under age
// retention) gets a skip marker, a batch of no frames flagged
// from_source_start at the home's start and tail, and skips there without
// waiting for a record; the next records then follow. The server refuses
// a marker that covers offsets or carries bytes.
func TestTaskSkipsToEmptySource(t *testing.T) {
	g := newLogGen(37, 64)
	src := NewMemSource(0)
	g.fill(t, src, 6, 4)
	all := src.Frames()
	node := startMirror(t, NewMemMirrorStore(), nil)
	m := node.store.Range(testStream, testRange)
	if err := m.Seed(all[:3]...); err != nil {
		t.Fatal(err)
	}
	end := src.CommittedEnd()
	if err := src.Retain(end); err != nil {
		t.Fatal(err)
	}
	rt := startTask(t, taskConfig(t, src, newDialer(t), node.addr))
	waitFor(t, 10*time.Second, "the mirror skips to the empty home's start", func() bool {
		return m.AppliedEnd() == end
	})
	waitFor(t, 10*time.Second, "the task counts the skip", func() bool { return rt.task.Stats().Skips >= 1 })
	if st := rt.task.Stats(); st.Skips != 1 || m.Skips() != 1 || m.StartOffset() != end {
		t.Fatalf("task skips %d, mirror skips %d, mirror start %d; want 1, 1, %d", st.Skips, m.Skips(), m.StartOffset(), end)
	}
	g.fill(t, src, 2, 4)
	waitFor(t, 10*time.Second, "the next records follow", func() bool {
		return m.AppliedEnd() == src.CommittedEnd()
	})
	assertMirrored(t, src, m)

	c := dialRaw(t, startMirror(t, NewMemMirrorStore(), nil).addr)
	c.mustAnswer(openReq(1))
	marker := &geologinternalv1.ReplicateRequest{Heartbeat: heartbeatPB(1, 6),
		Batch: &geologinternalv1.MirrorBatch{FirstOffset: 4, EndOffset: 6, FromSourceStart: true}}
	if r := refusalOf(t, c.mustAnswer(marker)); !errors.Is(r, ErrMalformed) {
		t.Fatalf("a marker covering [4, 6): %v, want ErrMalformed", r)
	}
}

// TestServerSkipOrphansOlderEpoch: a mirror whose log ends in an older
// epoch than the home's start may hold an old home's divergent tail that
// the home's deleted frames would have shown: before skipping, what it
// retains goes to its orphan log (a fork at its start), not away. A mirror
// of the home's epoch skips without (TestServerSkip checks none there).
func TestServerSkipOrphansOlderEpoch(t *testing.T) {
	g := newLogGen(35, 100)
	old := [][]byte{g.frame(2), g.frame(2), g.frame(2)}
	g.epoch = 2
	g.next += 20 // the home's retention deleted what lies between
	start := g.next
	home := [][]byte{g.frame(2), g.frame(2)}
	node := startMirror(t, NewMemMirrorStore(), nil)
	m := node.store.Range(testStream, testRange)
	if err := m.Seed(old...); err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, node.addr)
	c.mustAnswer(openReq(2))
	r := batchReq(2, CompressionZstd, home...)
	r.Batch.FromSourceStart = true
	if resp := c.mustAnswer(r); resp.GetError() != nil || resp.GetAppliedEndOffset() != frameNext(home[1]) {
		t.Fatalf("flagged batch answered %v", resp)
	}
	orphans, got := m.Orphans(), m.Frames()
	if len(orphans) != len(old) || !SameData(orphans[0], old[0]) || !SameData(orphans[2], old[2]) {
		t.Fatalf("%d frames orphaned, want the mirror's %d", len(orphans), len(old))
	}
	if m.Skips() != 1 || m.StartOffset() != start || len(got) != 2 || !SameData(got[0], home[0]) || node.srv.Stats().Forks != 1 {
		t.Fatalf("after the skip: %d skips, start %d (want %d), %d frames, %d forks", m.Skips(), m.StartOffset(), start, len(got), node.srv.Stats().Forks)
	}
}
