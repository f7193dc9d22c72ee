package regionsvc

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/internal/rpcerr"
	geologv1 "github.com/geolog/geolog/proto/geologv1"
	"github.com/geolog/geolog/segment"
)

// overloadShedder returns a shedder (target 100 ms, interval 200 ms)
// overloaded at 400 ms past t0: every append committed in [200, 400)
// waited 110 ms or more, and five of them are still pending, the oldest
// arrived at 300 ms.
func overloadShedder(t *testing.T, t0 time.Time) (*appendShedder, []*shedEntry) {
	t.Helper()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	s := newAppendShedder(100 * time.Millisecond)
	s.admit(at(0))
	// A burst first: sojourns of 150 and 50 ms; the least is within the
	// target, so no overload.
	a, b := s.proposed(at(0)), s.proposed(at(100))
	s.answered(a, at(150), true)
	s.answered(b, at(150), true)
	if !s.admit(at(210)) || s.overloaded {
		t.Fatal("a burst whose least sojourn is within the target counted as overload")
	}
	var old []*shedEntry
	for ms := 200; ms < 400; ms += 20 {
		old = append(old, s.proposed(at(ms)))
	}
	for i, e := range old[:5] {
		s.answered(e, at(350+i*10), true) // sojourns 150 down to 110 ms
	}
	return s, old[5:]
}

// TestAppendShedderRefusesAtCoDelPace: overloaded with a standing queue,
// the shedder refuses the first arrival, then one an interval/sqrt(n)
// after the one before, admitting the others; arrivals behind a young
// queue are admitted.
func TestAppendShedderRefusesAtCoDelPace(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	s, pending := overloadShedder(t, t0)
	if s.admit(at(405)) || !s.overloaded {
		t.Fatal("admitted the first arrival behind a standing queue")
	}
	if !s.admit(at(410)) {
		t.Fatal("refused again within an interval of the first refusal")
	}
	// The interval [400, 600) commits only long sojourns: still overloaded.
	s.answered(pending[0], at(450), true)
	if s.admit(at(610)) {
		t.Fatal("admitted the arrival an interval after the first refusal")
	}
	// The third comes interval/sqrt(2) (141 ms) after the second.
	if !s.admit(at(700)) || s.admit(at(752)) {
		t.Fatal("third refusal not at interval/sqrt(2)")
	}
	// The queue drains (answers that are no samples): the interval ends
	// the overload, and everything is admitted.
	for _, e := range pending[1:] {
		s.answered(e, at(760), false)
	}
	s.proposed(at(755))
	if !s.admit(at(1000)) {
		t.Fatal("refused behind a 45 ms old queue")
	}
}

// TestAppendShedderPaceCapped: under an overload that never ends (the
// senders do not slow down), refusals come at most one per target once
// the run has four, not ever faster.
func TestAppendShedderPaceCapped(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	s, pending := overloadShedder(t, t0)
	_ = pending // stay pending: the queue stands throughout
	var last time.Time
	refusals := 0
	for ms := 400; ms < 20_400; ms++ {
		now := t0.Add(time.Duration(ms) * time.Millisecond)
		if ms%50 == 0 {
			// A commit that waited 150 ms keeps every interval overloaded.
			s.answered(s.proposed(now.Add(-150*time.Millisecond)), now, true)
		}
		if s.admit(now) {
			continue
		}
		refusals++
		if gap := now.Sub(last); refusals > appendShedRefusalsPerRunMax && gap < s.target {
			t.Fatalf("refusal %d came %v after the one before, under the target", refusals, gap)
		}
		last = now
	}
	if refusals < 150 || refusals > 205 {
		t.Fatalf("%d refusals in 20 s, want about one per 100 ms", refusals)
	}
}

// TestAppendShedderOverloadEnds: an interval whose least sojourn is within
// the target ends the overload; so does an interval without commits, even
// with an append whose answer never comes.
func TestAppendShedderOverloadEnds(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	s, pending := overloadShedder(t, t0)
	for _, e := range pending {
		s.answered(e, at(410), false) // errors are no samples
	}
	young := s.proposed(at(405))
	s.answered(young, at(435), true) // 30 ms
	stuck := s.proposed(at(520))
	if !s.admit(at(610)) || s.overloaded {
		t.Fatal("still overloaded after an interval of short sojourns")
	}

	s, _ = overloadShedder(t, t0)
	if s.admit(at(405)) {
		t.Fatal("admitted behind a standing queue")
	}
	// Nothing commits in [400, 600) nor after.
	if !s.admit(at(1500)) || s.overloaded {
		t.Fatal("still overloaded after intervals without commits")
	}
	s.answered(stuck, at(1600), false)

	// reset forgets everything.
	s, _ = overloadShedder(t, t0)
	s.reset()
	if !s.admit(at(405)) || len(s.pending) != 0 {
		t.Fatal("reset kept state")
	}
}

// TestAppendShedderPendingBound: past appendShedPendingMax unanswered
// appends, new ones go untracked.
func TestAppendShedderPendingBound(t *testing.T) {
	t.Parallel()
	s := newAppendShedder(time.Millisecond)
	now := time.Unix(1000, 0)
	for range appendShedPendingMax {
		if s.proposed(now) == nil {
			t.Fatal("untracked below the bound")
		}
	}
	if e := s.proposed(now); e != nil {
		t.Fatal("tracked past the bound")
	}
	s.answered(nil, now, true) // an untracked answer is nothing
}

// TestSlowDiskShedsAppends: on a region whose disks take 200 ms per
// fsync, with a 20 ms queueing-delay target, producers that keep
// appending (each waiting for its answer, at staggered times) get
// retriable OVERLOADED refusals with a retry-after; a refused append was
// never proposed, so its resend is acknowledged as a new append, never
// as a duplicate, and the log holds every acknowledged append once.
func TestSlowDiskShedsAppends(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a region with a slow disk")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := newFaultRegion(t, ctx, "s", func(cfg *Config) {
		cfg.Fsync = segment.FsyncAlways
		cfg.AppendQueueDelayTarget = 20 * time.Millisecond
	})
	f.appendN(ctx, 1) // the range has a leader
	var lead uint64
	for lead == 0 && ctx.Err() == nil {
		lead = f.leaderOf()
		time.Sleep(10 * time.Millisecond)
	}
	for _, fx := range f.faults {
		fx.SetSyncDelay(200 * time.Millisecond)
	}
	const producers, appendsEach = 8, 6
	var (
		mu       sync.Mutex
		refused  int
		acked    int
		problems []string
		wg       sync.WaitGroup
	)
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := 0; seq < appendsEach && ctx.Err() == nil; {
				time.Sleep(time.Duration(rand.IntN(50)) * time.Millisecond) // stagger the arrivals
				req := &geologv1.AppendRequest{Stream: "s", ProducerId: uint64(100 + p), BaseSequence: uint64(seq),
					Records: []*geologv1.Record{{Value: []byte(fmt.Sprintf("p%d-%d", p, seq))}}}
				resp, err := f.clients[lead].Append(ctx, req)
				mu.Lock()
				switch e := rpcerr.FromError(err); {
				case err == nil && resp.GetDuplicate():
					problems = append(problems, fmt.Sprintf("producer %d seq %d acknowledged as a duplicate", p, seq))
					seq++
				case err == nil:
					acked++
					seq++
				case e.Code == apierr.Overloaded && e.RetryAfter > 0:
					refused++
				default:
					problems = append(problems, fmt.Sprintf("producer %d seq %d: %v", p, seq, err))
					seq = appendsEach
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, fx := range f.faults {
		fx.SetSyncDelay(0)
	}
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	if refused == 0 {
		t.Fatal("no append was shed behind a 200 ms fsync with a 20 ms target")
	}
	if acked != producers*appendsEach {
		t.Fatalf("%d appends acknowledged, want %d", acked, producers*appendsEach)
	}
	// The first record (appendN) and every acknowledged append, once:
	// readers see the tail once its commit mark is durable.
	var tail uint64
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		d, err := f.clients[lead].DescribeStream(ctx, &geologv1.DescribeStreamRequest{Name: "s"})
		if err != nil {
			t.Fatal(err)
		}
		if tail = d.Ranges[0].GetTailOffset(); tail >= uint64(1+acked) {
			break
		}
	}
	if tail != uint64(1+acked) {
		t.Fatalf("tail %d after %d acknowledged appends (%d refused), want %d", tail, acked, refused, 1+acked)
	}
	t.Logf("%d appends acknowledged, %d refusals", acked, refused)
}
