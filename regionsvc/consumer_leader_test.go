package regionsvc

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/cursors"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/keyspace"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

// TestCursorsAcrossLeaderChanges stops the leader of a cursor range (the
// coordinator) three times, restarting it, while a plain cursor is
// committed in a loop and a group member consumes and commits. Every read
// with CONSISTENCY_HOME sees at least the highest commit acknowledged
// before it started (a committed cursor never moves back across a
// coordinator change), the member keeps consuming, and the range's log
// passes cursors.CheckLog.
func TestCursorsAcrossLeaderChanges(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("leader changes of a 3-node region")
	}
	// No compaction of _cursors: checkCursorRange needs the whole log.
	tr := newTestRegionWith(t, 3, 3, func(cfg *Config) { cfg.CursorCompactionLag = time.Hour })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var addrs []string
	for id := uint64(1); id <= 3; id++ {
		addrs = append(addrs, tr.peers[id])
	}
	c, err := client.New(strings.Join(addrs, ","), client.RetryBackoff(10*time.Millisecond, 200*time.Millisecond), client.RetriesMax(50))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitUntil(t, ctx, time.Minute, "stream created", func() bool {
		_, err := c.CreateStream(ctx, client.StreamConfig{Name: "s", RangeCount: 2})
		return err == nil || client.CodeOf(err) == client.CodeStreamExists
	})
	p, err := c.NewProducer("s")
	if err != nil {
		t.Fatal(err)
	}
	// Range 0 gets the commitLoopOffsetsMax records commitLoop commits
	// offsets of (a commit past a range's tail is refused), so that the
	// loop outlasts the leader changes even when commits are fast.
	var keys0 [][]byte
	for i := 0; len(keys0) < 64; i++ {
		if k := []byte{byte(i), byte(i >> 8)}; keyspace.RangeForKey(k, 2) == 0 {
			keys0 = append(keys0, k)
		}
	}
	for i := 0; i < commitLoopOffsetsMax+2000; i++ {
		k := []byte{byte(i)}
		if i >= 2000 {
			k = keys0[i%len(keys0)]
		}
		p.Produce(ctx, &client.Record{Key: k, Value: []byte("v")}, nil)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	p.Close()

	// The group: one member, committing every 20 ms.
	g, err := c.NewGroupConsumer("s", "g", client.AutoCommitInterval(20*time.Millisecond), client.SessionTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var consumed atomic.Int64
	gctx, gcancel := context.WithCancel(ctx)
	defer gcancel()
	go func() {
		for _, err := range g.Records(gctx) {
			if err != nil {
				return
			}
			consumed.Add(1)
			time.Sleep(time.Millisecond) // spread the work over the leader changes
		}
	}()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var acked atomic.Uint64
	var regressions atomic.Int64
	wg.Add(2)
	go commitLoop(ctx, c, stop, &wg, &acked)
	go readLoop(t, ctx, c, stop, &wg, &acked, &regressions)

	cr := keyspace.RangeForKey([]byte("dev"), cursorRangesDefault)
	for i := 0; i < 3; i++ {
		time.Sleep(time.Second)
		leader := tr.leaderOf(ctx, cursorStreamName, cr)
		before := acked.Load()
		tr.stop(leader)
		waitUntil(t, ctx, time.Minute, "commits under a new coordinator", func() bool { return acked.Load() > before+20 })
		tr.start(leader)
		t.Logf("stopped node %d (coordinator of cursor range %d) at commit %d; continued to %d", leader, cr, before, acked.Load())
	}
	close(stop)
	wg.Wait()
	if n := regressions.Load(); n > 0 {
		t.Fatalf("%d reads saw a cursor below a commit acknowledged before them", n)
	}
	if consumed.Load() == 0 {
		t.Fatal("the group member consumed nothing")
	}
	gcancel()
	for _, r := range []uint32{cr, keyspace.RangeForKey([]byte("g"), cursorRangesDefault)} {
		checkCursorRange(t, ctx, tr, r)
	}
}

// commitLoopOffsetsMax is the highest offset commitLoop commits.
const commitLoopOffsetsMax = 20000

// commitLoop commits the cursor "dev" at rising offsets until stop,
// recording the highest acknowledged.
func commitLoop(ctx context.Context, c *client.Client, stop <-chan struct{}, wg *sync.WaitGroup, acked *atomic.Uint64) {
	defer wg.Done()
	for off := uint64(1); off <= commitLoopOffsetsMax; off++ {
		select {
		case <-stop:
			return
		default:
		}
		_, err := c.CommitCursors(ctx, "dev", client.CursorPosition{Stream: "s", Range: 0, Offset: off})
		if err != nil {
			off-- // not acknowledged: commit it again
			time.Sleep(10 * time.Millisecond)
			continue
		}
		acked.Store(off)
		// At most a commit a millisecond: the loop lasts at least
		// commitLoopOffsetsMax ms, longer than the leader changes.
		time.Sleep(time.Millisecond)
	}
}

// readLoop reads "dev" with CONSISTENCY_HOME until stop and counts reads
// below what was acknowledged before they began.
func readLoop(t *testing.T, ctx context.Context, c *client.Client, stop <-chan struct{}, wg *sync.WaitGroup, acked *atomic.Uint64, regressions *atomic.Int64) {
	defer wg.Done()
	for {
		select {
		case <-stop:
			return
		case <-time.After(5 * time.Millisecond):
		}
		floor := acked.Load()
		ps, err := c.GetCursors(ctx, "dev", "s", client.ConsistencyHome)
		if err != nil || floor == 0 {
			continue
		}
		if len(ps) == 0 || ps[0].Offset < floor {
			regressions.Add(1)
			t.Errorf("read %v after commit %d was acknowledged", ps, floor)
		}
	}
}

// leaderOf returns the node id leading a range, as the live nodes report.
func (tr *testRegion) leaderOf(ctx context.Context, stream string, r uint32) uint64 {
	for {
		for _, c := range tr.clients {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			d, err := c.DescribeStream(cctx, &geologv1.DescribeStreamRequest{Name: stream})
			cancel()
			if err != nil || int(r) >= len(d.Ranges) {
				continue
			}
			for id, addr := range tr.peers {
				if addr == d.Ranges[r].Leader {
					if _, live := tr.nodes[id]; live {
						return id
					}
				}
			}
		}
		if ctx.Err() != nil {
			tr.t.Fatal("no leader")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkCursorRange runs cursors.CheckLog on a cursor range's log.
func checkCursorRange(t *testing.T, ctx context.Context, tr *testRegion, r uint32) {
	var recs []cursors.Record
	tr.retry(ctx, "read the cursor range", func(ctx context.Context, lc geologv1.LogClient) error {
		recs = nil
		for from := uint64(0); ; {
			resp, err := lc.Read(ctx, &geologv1.ReadRequest{Stream: cursorStreamName, Range: r, FromOffset: from,
				Consistency: geologv1.Consistency_CONSISTENCY_HOME})
			if err != nil {
				if rpcerr.CodeOf(err) == apierr.OffsetOutOfRange && from == 0 {
					return nil
				}
				return err
			}
			for _, rec := range resp.Records {
				recs = append(recs, cursors.Record{Key: rec.Key, Value: rec.Value, Tombstone: rec.Tombstone})
			}
			if resp.NextOffset >= resp.TailOffset {
				return nil
			}
			from = resp.NextOffset
		}
	})
	for _, v := range cursors.CheckLog(recs) {
		t.Errorf("cursor range %d: %v", r, v)
	}
	t.Logf("cursor range %d: %d records checked", r, len(recs))
}

// TestCursorReadAfterRebuild: a read that must see offset end runs on a
// state that has applied it, even when the applier rebuilt the state from
// the log's start (a fork) after the reader's wait: it waits again rather
// than read the state half-built.
func TestCursorReadAfterRebuild(t *testing.T) {
	t.Parallel()
	cr := &cursorRange{state: cursors.NewState(cursors.Limits{}), appliedCh: make(chan struct{}), stop: make(chan struct{})}
	apply := func(offset uint64, applied uint64) {
		st := cursors.NewState(cursors.Limits{})
		if err := st.Apply(cursors.EncodePosition("dev", cursors.Position{Stream: "chat", Offset: offset})); err != nil {
			t.Fatal(err)
		}
		cr.mu.Lock()
		cr.state, cr.applied = st, applied
		cr.mu.Unlock()
		cr.notifyApplied()
	}
	apply(7, 10)
	// The rebuild: empty, nothing applied.
	cr.mu.Lock()
	cr.state, cr.applied = cursors.NewState(cursors.Limits{}), 0
	cr.mu.Unlock()
	got := make(chan []cursors.Position, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() {
		var ps []cursors.Position
		if err := cr.readAfter(ctx, 10, func(s *cursors.State) { ps = s.Positions("dev", "") }); err != nil {
			t.Error(err)
		}
		got <- ps
	}()
	select {
	case ps := <-got:
		t.Fatalf("read the rebuilding state: %v", ps)
	case <-time.After(50 * time.Millisecond):
	}
	apply(8, 10)
	if ps := <-got; len(ps) != 1 || ps[0].Offset != 8 {
		t.Fatalf("read %v after the rebuild applied offset 10", ps)
	}
}
