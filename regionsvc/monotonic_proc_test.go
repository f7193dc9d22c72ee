package regionsvc_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/client"
	"github.com/geolog/geolog/internal/nodeproc"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

// TestReadsNeverShrinkAcrossKill9 (DESIGN.md invariant 8): a 3-node region
// under a producer; a reader reads one node to its tail, the node is
// killed with SIGKILL and restarted while its two peers are stopped
// (SIGSTOP: it cannot relearn the commit index from a leader), and the
// reader keeps reading it from where it was. The node serves the reader's
// position again on its own; every answer it gives, before and after the
// restart, reports a tail at least as high as any it reported before, and
// none is a final error (while it starts: retriable ones only). Then the
// peers resume. Meanwhile an SDK subscription over all three nodes
// delivers every offset once, in order, with no error. Leaders and
// followers are killed in turn. It logs how long after each restart the
// node served the reader's position. (Before the commit mark, a restarted
// node served only up to the commit index of its last election until a
// leader told it more: here, until the peers resumed.)
func TestReadsNeverShrinkAcrossKill9(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real-process test")
	}
	procs := nodeproc.Region(t, 3, "--tick", "50ms")
	clients := regionClients(t, procs)
	var addrs []string
	for _, p := range procs {
		addrs = append(addrs, p.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, err := client.New(strings.Join(addrs, ","), client.RetryBackoff(10*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor(t, ctx, "stream created", func() bool {
		_, err := c.CreateStream(ctx, client.StreamConfig{Name: "mono", RangeCount: 1})
		return err == nil || client.CodeOf(err) == client.CodeStreamExists
	})
	stopProducing := produceSteadily(t, ctx, c, "mono", 2000)
	sub := subscribeChecked(ctx, c, "mono")

	var restartLags []time.Duration
	const kills = 4
	for k := 0; k < kills; k++ {
		leader := ""
		waitFor(t, ctx, "a leader", func() bool {
			leader = leaderOf(ctx, clients, "", "mono", 0)
			return leader != ""
		})
		victim := procs[0]
		for _, p := range procs {
			if (k%2 == 0) == (p.Addr == leader) { // leaders and followers in turn
				victim = p
				break
			}
		}
		r := &tailReader{t: t, lc: fastReconnect(t, victim.Addr), stream: "mono"}
		waitFor(t, ctx, "the reader at the node's tail", func() bool { return r.read(ctx) && r.next > 0 && r.next == r.maxTail })
		before := r.maxTail
		victim.Kill()
		var paused []*nodeproc.Proc
		for _, p := range procs {
			if p != victim {
				p.Pause()
				paused = append(paused, p)
			}
		}
		victim.Restart()
		restarted := time.Now()
		// Well above a process start on a loaded machine (about 1 s here).
		sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
		waitFor(t, sctx, "the restarted node serving the reader's position while its peers are stopped", func() bool { r.read(ctx); return r.served })
		scancel()
		restartLags = append(restartLags, time.Since(restarted))
		for _, p := range paused {
			p.Resume()
		}
		t.Logf("kill %d (%s, leader %v): read to %d before; served it again %v after the restart (tail %d); answers while starting: %v",
			k+1, victim.Addr, victim.Addr == leader, before, time.Since(restarted).Round(time.Millisecond), r.maxTail, r.retriable)
		waitFor(t, ctx, "the subscription past the kill", func() bool { return sub.delivered() > before+500 })
	}
	stopProducing()
	if err := sub.stop(); err != nil {
		t.Fatal(err)
	}
	sort.Slice(restartLags, func(i, j int) bool { return restartLags[i] < restartLags[j] })
	t.Logf("%d kills; the restarted node served the reader's position after %v (median), %v (max); the subscription delivered %d records in order",
		kills, restartLags[len(restartLags)/2].Round(time.Millisecond), restartLags[len(restartLags)-1].Round(time.Millisecond), sub.delivered())
}

// fastReconnect dials addr with a reconnect backoff of 20-100 ms (gRPC's
// default starts at 1 s), so that a restart is seen when it happens.
func fastReconnect(t *testing.T, addr string) geologv1.LogClient {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: 100 * time.Millisecond},
			MinConnectTimeout: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return geologv1.NewLogClient(conn)
}

// tailReader reads one node with consistency local from next on, checking
// that the node's tail never goes back and that it answers no final error.
type tailReader struct {
	t      *testing.T
	lc     geologv1.LogClient
	stream string
	// next is the reader's position, maxTail the highest tail the node
	// reported; served: the last read answered at next.
	next, maxTail uint64
	served        bool
	retriable     map[string]int // retriable answers, by code
}

// read reads once at next and reports whether it was answered.
func (r *tailReader) read(ctx context.Context) bool {
	r.t.Helper()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := r.lc.Read(cctx, &geologv1.ReadRequest{Stream: r.stream, Range: 0, FromOffset: r.next, MaxRecords: 5000})
	r.served = false
	if err != nil {
		e := rpcerr.FromError(err)
		if !e.Retriable {
			r.t.Fatalf("read at %d (tail seen %d): a final error: %v", r.next, r.maxTail, err)
		}
		if r.retriable == nil {
			r.retriable = map[string]int{}
		}
		r.retriable[e.Code.String()]++
		return false
	}
	if resp.GetTailOffset() < r.maxTail {
		r.t.Fatalf("the node's tail went back from %d to %d (reader at %d)", r.maxTail, resp.GetTailOffset(), r.next)
	}
	for _, rec := range resp.GetRecords() {
		if rec.GetOffset() != r.next {
			r.t.Fatalf("read offset %d, want %d", rec.GetOffset(), r.next)
		}
		r.next++
	}
	r.maxTail, r.served = resp.GetTailOffset(), true
	return true
}

// produceSteadily produces about rate records/s to stream until the
// returned function is called, which flushes and fails the test on any
// failed record.
func produceSteadily(t *testing.T, ctx context.Context, c *client.Client, stream string, rate int) func() {
	p, err := c.NewProducer(stream, client.ProducerRetryBackoff(10*time.Millisecond, 200*time.Millisecond), client.DeliveryTimeout(2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var fails []error
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			p.Produce(ctx, &client.Record{Key: []byte(fmt.Sprint(i % 8)), Value: []byte(fmt.Sprint(i))}, func(_ client.ProduceResult, err error) {
				if err != nil {
					mu.Lock()
					fails = append(fails, err)
					mu.Unlock()
				}
			})
		}
	}()
	return func() {
		close(stop)
		<-done
		if err := p.Flush(ctx); err != nil {
			t.Fatalf("flush: %v", err)
		}
		p.Close()
		mu.Lock()
		defer mu.Unlock()
		if len(fails) > 0 {
			t.Fatalf("%d records failed (first: %v)", len(fails), fails[0])
		}
	}
}

// checkedSub is an SDK subscription from offset 0 whose records must come
// in order, each offset once, with no error.
type checkedSub struct {
	mu     sync.Mutex
	next   uint64
	err    error
	cancel context.CancelFunc
	done   chan struct{}
}

func subscribeChecked(ctx context.Context, c *client.Client, stream string) *checkedSub {
	ctx, cancel := context.WithCancel(ctx)
	s := &checkedSub{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for rec, err := range c.Subscribe(ctx, stream, 0, client.StartAt{}) {
			s.mu.Lock()
			switch {
			case err != nil && ctx.Err() == nil:
				s.err = fmt.Errorf("subscription ended at %d: %w", s.next, err)
			case err == nil && rec.Offset != s.next:
				s.err = fmt.Errorf("subscription delivered offset %d, want %d", rec.Offset, s.next)
			case err == nil:
				s.next++
			}
			stop := s.err != nil || err != nil
			s.mu.Unlock()
			if stop {
				return
			}
		}
	}()
	return s
}

func (s *checkedSub) delivered() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.next
}

// stop ends the subscription and returns what went wrong, if anything.
func (s *checkedSub) stop() error {
	s.cancel()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}
