package replicator

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/portlock"
	"github.com/geolog/geolog/internal/rpcerr"
	geologinternalv1 "github.com/geolog/geolog/proto/geologinternalv1"
	"google.golang.org/grpc"
)

// TestShipInOrder ships a log of many frames, with and without
// compression, while the source keeps committing, and checks that the
// mirror ends equal to the source in every data field, in many batches.
func TestShipInOrder(t *testing.T) {
	for _, comp := range []Compression{CompressionZstd, CompressionNone} {
		t.Run(comp.String(), func(t *testing.T) {
			g := newLogGen(1, 1024)
			src := NewMemSource(0)
			g.fill(t, src, 100, 16)
			node := startMirror(t, NewMemMirrorStore(), nil)
			cfg := taskConfig(t, src, newDialer(t), node.addr)
			cfg.Compression = comp
			cfg.BatchBytesMax = 64 << 10
			cfg.WindowBytes = 256 << 10
			rt := startTask(t, cfg)
			// Keep committing while the task ships.
			g.fill(t, src, 200, 16)
			m := node.store.Range(testStream, testRange)
			waitFor(t, 20*time.Second, "the mirror to catch up", func() bool { return m.AppliedEnd() == src.CommittedEnd() })
			assertMirrored(t, src, m)

			st := rt.task.Stats()
			if st.Batches < 10 {
				t.Errorf("%d batches for %d bytes at 64 KiB: not batched as configured", st.Batches, st.FrameBytes)
			}
			if st.InflightBytesMax > cfg.WindowBytes {
				t.Errorf("in flight reached %d bytes, window %d", st.InflightBytesMax, cfg.WindowBytes)
			}
			switch comp {
			case CompressionZstd:
				if st.WireBytes*2 > st.FrameBytes {
					t.Errorf("zstd sent %d bytes for %d: ratio below 2 on chat records", st.WireBytes, st.FrameBytes)
				}
			case CompressionNone:
				if st.WireBytes != st.FrameBytes {
					t.Errorf("uncompressed batches sent %d wire bytes for %d frame bytes", st.WireBytes, st.FrameBytes)
				}
			}
			ss := node.srv.Stats()
			if ss.Refusals != 0 || ss.Duplicates != 0 || ss.FrameBytes != st.FrameBytes {
				t.Errorf("server stats %+v, task sent %d frame bytes", ss, st.FrameBytes)
			}
		})
	}
}

// TestResumeAfterRestart kills the source task mid-stream and starts a new
// one: it resumes at the mirror's applied end, sending nothing twice and
// skipping nothing.
func TestResumeAfterRestart(t *testing.T) {
	g := newLogGen(2, 512)
	src := NewMemSource(0)
	g.fill(t, src, 300, 8)
	node := startMirror(t, NewMemMirrorStore(), nil)
	m := node.store.Range(testStream, testRange)
	dialer := newDialer(t)

	cfg := taskConfig(t, src, dialer, node.addr)
	cfg.BatchBytesMax = 16 << 10
	cfg.WindowBytes = 32 << 10
	first := startTask(t, cfg)
	waitFor(t, 10*time.Second, "some progress", func() bool { return m.AppliedEnd() > 100 })
	if err := first.stop(t); !errors.Is(err, context.Canceled) {
		t.Fatalf("stopped task returned %v", err)
	}
	// The server may still be applying a batch the task sent before it was
	// killed; the resume point is where the mirror stands once it is done.
	waitFor(t, 10*time.Second, "the killed task's stream to end", func() bool { return openStreams(node.srv) == 0 })
	resumeAt := m.AppliedEnd()
	if resumeAt == src.CommittedEnd() {
		t.Fatal("the first task finished before it was killed: the test proves nothing")
	}
	g.fill(t, src, 50, 8)

	second := startTask(t, taskConfig(t, src, dialer, node.addr))
	waitFor(t, 10*time.Second, "the mirror to catch up", func() bool { return m.AppliedEnd() == src.CommittedEnd() })
	assertMirrored(t, src, m)

	// The second task sent exactly the frames from the resume point on.
	var want uint64
	for _, f := range src.Frames() {
		if frameBase(f) >= resumeAt {
			want += uint64(len(f))
		}
	}
	if got := second.task.Stats().FrameBytes; got != want {
		t.Errorf("second task sent %d frame bytes, the frames from %d hold %d", got, resumeAt, want)
	}
	if d := node.srv.Stats().Duplicates; d != 0 {
		t.Errorf("server saw %d duplicate batches", d)
	}
}

// TestGapRewind cuts the mirror's tail (as homing does to a divergent
// tail) under a running stream: the next batch is refused as a gap and the
// source rewinds on the same stream and ships the cut part again.
func TestGapRewind(t *testing.T) {
	g := newLogGen(3, 256)
	src := NewMemSource(0)
	g.fill(t, src, 40, 4)
	node := startMirror(t, NewMemMirrorStore(), nil)
	m := node.store.Range(testStream, testRange)
	rt := startTask(t, taskConfig(t, src, newDialer(t), node.addr))
	waitFor(t, 10*time.Second, "catch up", func() bool { return m.AppliedEnd() == src.CommittedEnd() })

	cut := frameBase(src.Frames()[10])
	if err := m.TruncateTo(cut); err != nil {
		t.Fatal(err)
	}
	g.fill(t, src, 5, 4)
	waitFor(t, 10*time.Second, "catch up after the cut", func() bool { return m.AppliedEnd() == src.CommittedEnd() })
	assertMirrored(t, src, m)
	st := rt.task.Stats()
	if st.Refusals == 0 || st.Streams != 1 {
		t.Errorf("stats %+v: want a gap refusal handled on the one stream", st)
	}
}

// TestStaleEpochStops checks fencing: a mirror that has seen a newer epoch
// refuses the open, or a later request once it learns of one, and the task
// stops with ErrFenced.
func TestStaleEpochStops(t *testing.T) {
	t.Run("at open", func(t *testing.T) {
		g := newLogGen(4, 128)
		src := NewMemSource(0)
		g.fill(t, src, 5, 4)
		node := startMirror(t, NewMemMirrorStore(), nil)
		node.store.Range(testStream, testRange).SetHighestEpoch(5)
		cfg := taskConfig(t, src, newDialer(t), node.addr)
		cfg.Epoch = 4
		rt := startTask(t, cfg)
		if err := rt.wait(t, 10*time.Second); !errors.Is(err, ErrFenced) || !errors.Is(err, ErrStaleEpoch) {
			t.Fatalf("Run returned %v, want ErrFenced", err)
		}
		if n := node.store.Range(testStream, testRange).AppliedEnd(); n != 0 {
			t.Fatalf("a fenced source applied up to %d", n)
		}
	})
	t.Run("mid-stream", func(t *testing.T) {
		g := newLogGen(5, 128)
		g.epoch = 2
		src := NewMemSource(0)
		g.fill(t, src, 5, 4)
		node := startMirror(t, NewMemMirrorStore(), nil)
		m := node.store.Range(testStream, testRange)
		cfg := taskConfig(t, src, newDialer(t), node.addr)
		cfg.Epoch = 2
		rt := startTask(t, cfg)
		waitFor(t, 10*time.Second, "catch up", func() bool { return m.AppliedEnd() == src.CommittedEnd() })
		m.SetHighestEpoch(3) // the lease store granted epoch 3 elsewhere
		applied := m.AppliedEnd()
		g.fill(t, src, 5, 4)
		if err := rt.wait(t, 10*time.Second); !errors.Is(err, ErrFenced) {
			t.Fatalf("Run returned %v, want ErrFenced", err)
		}
		if m.AppliedEnd() != applied {
			t.Fatalf("mirror applied past %d after learning epoch 3", applied)
		}
	})
}

// lossyDialer wraps a Dialer: the first stream loses the answer after
// dropAfter answers and then breaks, as a connection lost with an ack in
// flight does.
type lossyDialer struct {
	Dialer
	dropAfter int
	mu        sync.Mutex
	streams   int
}

func (d *lossyDialer) Open(ctx context.Context, addr string) (ReplicateStream, error) {
	d.mu.Lock()
	d.streams++
	n := d.streams
	d.mu.Unlock()
	s, err := d.Dialer.Open(ctx, addr)
	if err != nil || n > 1 {
		return s, err
	}
	return &lossyStream{ReplicateStream: s, left: d.dropAfter}, nil
}

type lossyStream struct {
	ReplicateStream
	left int
}

func (s *lossyStream) Recv() (*geologinternalv1.ReplicateResponse, error) {
	resp, err := s.ReplicateStream.Recv()
	if err != nil {
		return nil, err
	}
	if s.left == 0 {
		return nil, errors.New("connection reset (test)")
	}
	s.left--
	return resp, nil
}

// TestLostAck loses an acknowledgement with the connection: the mirror had
// applied the batch, the source never heard. After reconnecting nothing is
// applied twice and nothing is missing.
func TestLostAck(t *testing.T) {
	g := newLogGen(6, 256)
	src := NewMemSource(0)
	g.fill(t, src, 60, 4)
	node := startMirror(t, NewMemMirrorStore(), nil)
	m := node.store.Range(testStream, testRange)
	d := &lossyDialer{Dialer: newDialer(t), dropAfter: 4} // the open's answer and 3 more
	cfg := taskConfig(t, src, d, node.addr)
	cfg.BatchBytesMax = 4 << 10
	cfg.WindowRequestsMax = 1 // one batch at a time: the lost ack is the only news
	rt := startTask(t, cfg)
	waitFor(t, 10*time.Second, "catch up", func() bool { return m.AppliedEnd() == src.CommittedEnd() })
	assertMirrored(t, src, m)
	if st := rt.task.Stats(); st.Streams != 2 {
		t.Errorf("%d streams opened, want 2 (one lost)", st.Streams)
	}
}

// TestBackpressure holds the mirror's applies: the task fills its window
// and then stops reading, however much the source has committed; once the
// mirror moves again, everything arrives.
func TestBackpressure(t *testing.T) {
	g := newLogGen(7, 1024)
	src := NewMemSource(0)
	g.fill(t, src, 400, 4) // about 1 MiB
	node := startMirror(t, NewMemMirrorStore(), nil)
	m := node.store.Range(testStream, testRange)
	m.Hold()
	cfg := taskConfig(t, src, newDialer(t), node.addr)
	cfg.BatchBytesMax = 16 << 10
	cfg.WindowBytes = 64 << 10
	rt := startTask(t, cfg)

	waitFor(t, 10*time.Second, "the window to fill", func() bool {
		st := rt.task.Stats()
		return st.InflightBytes > cfg.WindowBytes-cfg.BatchBytesMax
	})
	before := src.Stats()
	// A bounded wait for something that must not happen: several heartbeat
	// intervals of a blocked mirror, each of which could trigger reads.
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		st := rt.task.Stats()
		if st.InflightBytes > cfg.WindowBytes {
			t.Fatalf("in flight %d bytes, window %d", st.InflightBytes, cfg.WindowBytes)
		}
		time.Sleep(10 * time.Millisecond)
	}
	after := src.Stats()
	if after.BytesRead != before.BytesRead {
		t.Fatalf("source read %d more bytes while the mirror was blocked", after.BytesRead-before.BytesRead)
	}
	if after.BytesRead > int64(cfg.WindowBytes) {
		t.Fatalf("source read %d bytes with the mirror blocked, window %d", after.BytesRead, cfg.WindowBytes)
	}

	m.Release()
	waitFor(t, 20*time.Second, "catch up", func() bool { return m.AppliedEnd() == src.CommittedEnd() })
	assertMirrored(t, src, m)
	if st := rt.task.Stats(); st.InflightBytesMax > cfg.WindowBytes {
		t.Errorf("in flight peaked at %d bytes, window %d", st.InflightBytesMax, cfg.WindowBytes)
	}
}

// TestLargeFrameTravelsAlone: a frame larger than the window is shipped
// when nothing else is in flight.
func TestLargeFrameTravelsAlone(t *testing.T) {
	src := NewMemSource(0)
	g := newLogGen(8, 200)
	g.fill(t, src, 10, 2)
	big := newLogGen(9, 8<<10)
	big.next, big.appendTime = g.next, g.appendTime
	bigFrame := big.frame(16) // ~128 KiB
	if err := src.AppendCommitted(bigFrame); err != nil {
		t.Fatal(err)
	}
	g.next, g.appendTime = big.next, big.appendTime
	g.fill(t, src, 10, 2)
	node := startMirror(t, NewMemMirrorStore(), nil)
	m := node.store.Range(testStream, testRange)
	cfg := taskConfig(t, src, newDialer(t), node.addr)
	cfg.BatchBytesMax = 1 << 10
	cfg.WindowBytes = 4 << 10
	rt := startTask(t, cfg)
	waitFor(t, 10*time.Second, "catch up", func() bool { return m.AppliedEnd() == src.CommittedEnd() })
	assertMirrored(t, src, m)
	// The big frame travelled alone: nothing else was in flight with it.
	if peak := rt.task.Stats().InflightBytesMax; peak != len(bigFrame) {
		t.Errorf("in flight peaked at %d bytes; the big frame alone is %d", peak, len(bigFrame))
	}
}

// TestLeaderHints: the task reaches the mirror leader through NOT_LEADER
// hints and the address list, and follows leadership when it moves.
func TestLeaderHints(t *testing.T) {
	g := newLogGen(10, 256)
	src := NewMemSource(0)
	g.fill(t, src, 20, 4)
	a := startMirror(t, NewMemMirrorStore(), nil)
	b := startMirror(t, NewMemMirrorStore(), nil)
	a.store.SetNotLeader(b.addr)

	// A dead address first: the task walks on to a, which points at b.
	dead := portlock.Addr(t) // held, and nothing listens on it
	rt := startTask(t, taskConfig(t, src, newDialer(t), dead, a.addr))
	mb := b.store.Range(testStream, testRange)
	waitFor(t, 10*time.Second, "b to catch up", func() bool { return mb.AppliedEnd() == src.CommittedEnd() })
	assertMirrored(t, src, mb)
	if got := rt.task.Stats().Addr; got != b.addr {
		t.Errorf("task streams to %s, want b %s", got, b.addr)
	}

	// Leadership moves to a (which, in this twin, starts empty).
	b.store.SetNotLeader(a.addr)
	a.store.SetLeader()
	g.fill(t, src, 5, 4)
	ma := a.store.Range(testStream, testRange)
	waitFor(t, 10*time.Second, "a to catch up", func() bool { return ma.AppliedEnd() == src.CommittedEnd() })
	assertMirrored(t, src, ma)
}

// TestLag checks the lag both ends report, on fake clocks: heartbeats keep
// an idle, caught-up mirror's lag near zero; a stalled link makes the lag
// grow with the clock and never read zero.
func TestLag(t *testing.T) {
	home, local := newFakeClock(), newFakeClock()
	g := newLogGen(11, 256)
	src := NewMemSource(0)
	g.fill(t, src, 10, 4)
	node := startMirror(t, NewMemMirrorStore(), func(c *ServerConfig) { c.Now = local.Now })
	m := node.store.Range(testStream, testRange)
	cfg := taskConfig(t, src, newDialer(t), node.addr)
	cfg.Now = home.Now
	rt := startTask(t, cfg)
	waitFor(t, 10*time.Second, "catch up", func() bool { return m.AppliedEnd() == src.CommittedEnd() })

	// Idle: both clocks move by a minute; the next heartbeats resync.
	home.Advance(time.Minute)
	local.Advance(time.Minute)
	_, beats := m.LastHeartbeat()
	waitFor(t, 10*time.Second, "two more heartbeats", func() bool {
		_, n := m.LastHeartbeat()
		return n >= beats+2
	})
	lag, ok := node.srv.Lag(testStream, testRange)
	if !ok || !lag.Synced || lag.OffsetLag != 0 || lag.TimeLag != 0 {
		t.Fatalf("idle caught-up mirror: lag %+v", lag)
	}

	// Commits the mirror cannot apply: the offset lag shows them at once.
	m.Hold()
	g.fill(t, src, 3, 4)
	waitFor(t, 10*time.Second, "offset lag from a heartbeat past the applied end", func() bool {
		l, _ := node.srv.Lag(testStream, testRange)
		return l.OffsetLag > 0 && l.HomeTail > m.AppliedEnd()
	})
	m.Release()
	// Caught up as the task knows it too: the mirror's answer may still be
	// on its way when the mirror has applied.
	waitFor(t, 10*time.Second, "catch up", func() bool {
		return m.AppliedEnd() == src.CommittedEnd() && rt.task.Lag(home.Now()).AppliedEnd == src.CommittedEnd()
	})

	// Stall: the link goes down (the task stops); time goes on.
	rt.stop(t)
	synced, _ := node.srv.Lag(testStream, testRange)
	local.Advance(10 * time.Second)
	home.Advance(10 * time.Second)
	stalled, _ := node.srv.Lag(testStream, testRange)
	if stalled.TimeLag < 10*time.Second || stalled.HeartbeatAge < 10*time.Second {
		t.Fatalf("stalled link: lag %+v (before the stall %+v)", stalled, synced)
	}
	local.Advance(5 * time.Second)
	if later, _ := node.srv.Lag(testStream, testRange); later.TimeLag < stalled.TimeLag+5*time.Second {
		t.Fatalf("lag did not grow with the clock: %s then %s", stalled.TimeLag, later.TimeLag)
	}

	// The home's own view, on its clock alone.
	hl := rt.task.Lag(home.Now())
	if !hl.Synced || hl.OffsetLag != 0 || hl.TimeLag < 10*time.Second {
		t.Fatalf("home's view after the stall: %+v", hl)
	}
}

// TestNotLeaderWithoutHint: a follower that knows no leader makes the
// task back off and retry, and it gets through once the node leads.
func TestNotLeaderWithoutHint(t *testing.T) {
	g := newLogGen(12, 128)
	src := NewMemSource(0)
	g.fill(t, src, 5, 4)
	node := startMirror(t, NewMemMirrorStore(), nil)
	node.store.SetNotLeader("")
	rt := startTask(t, taskConfig(t, src, newDialer(t), node.addr))
	waitFor(t, 10*time.Second, "refusals", func() bool { return rt.task.Stats().Refusals >= 2 })
	node.store.SetLeader()
	m := node.store.Range(testStream, testRange)
	waitFor(t, 10*time.Second, "catch up", func() bool { return m.AppliedEnd() == src.CommittedEnd() })
	assertMirrored(t, src, m)
}

// TestSourceReadFailure: a failed read drops the stream and retries.
func TestSourceReadFailure(t *testing.T) {
	g := newLogGen(13, 128)
	src := NewMemSource(0)
	g.fill(t, src, 5, 4)
	src.FailNextRead(apierr.New(apierr.Corruption, "test"))
	node := startMirror(t, NewMemMirrorStore(), nil)
	m := node.store.Range(testStream, testRange)
	rt := startTask(t, taskConfig(t, src, newDialer(t), node.addr))
	waitFor(t, 10*time.Second, "catch up", func() bool { return m.AppliedEnd() == src.CommittedEnd() })
	assertMirrored(t, src, m)
	if st := rt.task.Stats(); st.Streams < 2 {
		t.Errorf("stats %+v: a read failure should have cost a stream", st)
	}
}

// blockingStore is a MirrorStore whose Open waits until released, as a
// node stuck before it can answer.
type blockingStore struct {
	*MemMirrorStore
	release chan struct{}
}

func (s *blockingStore) Open(ctx context.Context, stream string, rng uint32) (MirrorRange, error) {
	select {
	case <-s.release:
		return s.MemMirrorStore.Open(ctx, stream, rng)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestHandshakeTimeout: a mirror that does not answer the open costs the
// task a handshake timeout and a retry, not a hang.
func TestHandshakeTimeout(t *testing.T) {
	g := newLogGen(14, 128)
	src := NewMemSource(0)
	g.fill(t, src, 5, 4)
	store := &blockingStore{MemMirrorStore: NewMemMirrorStore(), release: make(chan struct{})}
	srv, err := NewServer(ServerConfig{Region: dstRegion, Store: store, Logger: testLogger(t, "mirror")})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(append(srv.ServerOptions(), grpc.ChainStreamInterceptor(rpcerr.StreamServerInterceptor(nil)))...)
	srv.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)

	cfg := taskConfig(t, src, newDialer(t), lis.Addr().String())
	cfg.HandshakeTimeout = 50 * time.Millisecond
	rt := startTask(t, cfg)
	waitFor(t, 10*time.Second, "a handshake timeout", func() bool {
		return strings.Contains(rt.task.Stats().LastError, "no answer to the open")
	})
	close(store.release)
	m := store.Range(testStream, testRange)
	waitFor(t, 10*time.Second, "catch up", func() bool { return m.AppliedEnd() == src.CommittedEnd() })
	assertMirrored(t, src, m)
}

// TestServerClose: a closed server refuses streams with SHUTTING_DOWN,
// which the task retries.
func TestServerClose(t *testing.T) {
	node := startMirror(t, NewMemMirrorStore(), nil)
	node.srv.Close()
	c := dialRaw(t, node.addr)
	resp := c.mustAnswer(openReq(1))
	if r := fromDetail(resp.GetError()); r.API.Code != apierr.ShuttingDown || !r.API.Retriable {
		t.Fatalf("closed server answered %v", resp)
	}
}

// TestFailbackForksLongerMirror: the mirror holds an old home's log that
// runs past where the new home (epoch 2) took over, longer than the new
// home's log itself. The new home's task resends from where its log left
// epoch 1; the mirror forks its divergent tail off into the orphan log and
// ends equal to the new home's log, not extended past it.
func TestFailbackForksLongerMirror(t *testing.T) {
	g := newLogGen(41, 200)
	src := NewMemSource(0)
	g.fill(t, src, 20, 4) // the common prefix, epoch 1
	old := *g
	old.seqs = map[uint64]uint64{}
	var tail [][]byte
	for range 30 { // the old home's unreplicated tail, epoch 1
		tail = append(tail, old.frame(1+old.rng.IntN(4)))
	}
	node := startMirror(t, NewMemMirrorStore(), nil)
	m := node.store.Range(testStream, testRange)
	if err := m.Seed(append(src.Frames(), tail...)...); err != nil {
		t.Fatal(err)
	}
	g.epoch = 2
	g.fill(t, src, 10, 4) // the new home's frames: shorter than the old tail
	if src.CommittedEnd() >= m.AppliedEnd() {
		t.Fatalf("setup: the source (%d) should end below the mirror (%d)", src.CommittedEnd(), m.AppliedEnd())
	}
	cfg := taskConfig(t, src, newDialer(t), node.addr)
	cfg.Epoch = 2
	startTask(t, cfg)
	waitFor(t, 20*time.Second, "the mirror to fork and catch up", func() bool {
		return len(m.Orphans()) > 0 && m.AppliedEnd() == src.CommittedEnd()
	})
	assertMirrored(t, src, m)
	if got := m.Orphans(); len(got) != len(tail) || !SameData(got[0], tail[0]) {
		t.Fatalf("orphans: %d frames, want the old home's %d", len(got), len(tail))
	}
}

// TestResendWhileMirrorTailCommits: a new home (epoch 2) that has written
// nothing yet connects to a mirror whose log ends, at the home's own end,
// in epoch 1; then the mirror's log grows by an old home's frame [20, 22)
// (its leader's uncommitted tail committing after the open's answer), and
// its answers to heartbeats say 22. The new home's frames [20, 22) and
// [22, 24) begin where the old frame begins and end where it ends: had
// those answers moved the task past what it sent, it would ship from 22,
// where nothing overlaps to compare, and the mirror would keep the old
// home's records as if they were the new home's. The task stays in resend
// mode until the mirror answers a batch of its own (sim seed 1700391), so
// it ships from 20 and the mirror forks the old frame off.
func TestResendWhileMirrorTailCommits(t *testing.T) {
	g := newLogGen(43, 100)
	src := NewMemSource(0)
	appendFrames := func(n int) {
		t.Helper()
		for range n {
			if err := src.AppendCommitted(g.frame(2)); err != nil {
				t.Fatal(err)
			}
		}
	}
	appendFrames(10) // [0, 20), epoch 1, both homes
	old := *g
	old.seqs = map[uint64]uint64{}
	stale := old.frame(2) // [20, 22), epoch 1, only the old home
	node := startMirror(t, NewMemMirrorStore(), nil)
	m := node.store.Range(testStream, testRange)
	if err := m.Seed(src.Frames()...); err != nil {
		t.Fatal(err)
	}
	cfg := taskConfig(t, src, newDialer(t), node.addr)
	cfg.Epoch = 2
	rt := startTask(t, cfg)
	waitFor(t, 10*time.Second, "the stream open", func() bool { return rt.task.Stats().Streams == 1 })
	if err := m.Seed(stale); err != nil {
		t.Fatal(err)
	}
	beats := rt.task.Stats().Heartbeats
	waitFor(t, 10*time.Second, "heartbeats answered with the grown end", func() bool { return rt.task.Stats().Heartbeats >= beats+5 })
	g.epoch = 2
	appendFrames(2) // [20, 22) [22, 24), epoch 2
	waitFor(t, 10*time.Second, "the mirror to hold the new home's frames", func() bool {
		got := m.Frames()
		return len(got) == 12 && frameEpoch(got[10]) == 2
	})
	assertMirrored(t, src, m)
	if got := m.Orphans(); len(got) != 1 || !SameData(got[0], stale) {
		t.Fatalf("orphans: %d frames, want the old home's one", len(got))
	}
}

// TestBehindSourceStart: a mirror whose applied end is below the source's
// log start (retention deleted what it lacks) cannot be shipped to; the
// task says so in its stats rather than only retrying.
func TestBehindSourceStart(t *testing.T) {
	g := newLogGen(17, 64)
	g.next = 40 // the home's log starts at 40; the mirror is empty
	src := NewMemSource(40)
	g.fill(t, src, 5, 4)
	node := startMirror(t, NewMemMirrorStore(), nil)
	// A source that does not say where it starts: the task cannot skip
	// (TestTaskSkipsToSourceStart is the one that does).
	rt := startTask(t, taskConfig(t, noStartSource{src}, newDialer(t), node.addr))
	waitFor(t, 10*time.Second, "the task reports the mirror behind the source's start", func() bool {
		return rt.task.Stats().BehindSourceStart
	})
	if m := node.store.Range(testStream, testRange); m.AppliedEnd() != 0 {
		t.Fatalf("the mirror applied up to %d from a source starting at 40", m.AppliedEnd())
	}
}
