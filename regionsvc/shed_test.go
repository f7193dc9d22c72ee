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

// TestAppendShedder walks the shedder through a standing queue: it admits
// everything until an interval's least sojourn exceeds the target, then
// refuses arrivals only while the oldest pending append is older than the
// target, and admits everything again after an interval whose least
// sojourn is within the target, or one without commits.
func TestAppendShedder(t *testing.T) {
	const target = 100 * time.Millisecond
	s := newAppendShedder(target) // interval 200 ms
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

	if !s.admit(at(0)) {
		t.Fatal("refused on an idle range")
	}
	// A burst: sojourns of 150 ms and 50 ms in the first interval; the
	// least is within the target, so no overload.
	a := s.proposed(at(0))
	b := s.proposed(at(100))
	s.answered(a, at(150), true)
	s.answered(b, at(150), true)
	if !s.admit(at(210)) || s.overloaded {
		t.Fatal("a burst whose least sojourn is within the target counted as overload")
	}
	// A standing queue: every append committed in [200, 400) waited
	// 150 ms or more.
	var old []*shedEntry
	for ms := 200; ms < 400; ms += 20 {
		old = append(old, s.proposed(at(ms)))
	}
	for i, e := range old[:5] {
		s.answered(e, at(350+i*10), true) // sojourns 150 down to 110 ms
	}
	// At 400 the interval ends: overloaded. The oldest pending arrived at
	// 300, 105 ms before 405: refused.
	if s.admit(at(405)) {
		t.Fatal("admitted behind a standing queue")
	}
	if !s.overloaded {
		t.Fatal("not overloaded after an interval of long sojourns")
	}
	// Answered (even by an error, which is no sample) they leave the
	// queue; the oldest pending is then young: admitted.
	for _, e := range old[5:] {
		s.answered(e, at(410), false)
	}
	young, later := s.proposed(at(405)), s.proposed(at(406))
	if !s.admit(at(420)) {
		t.Fatal("refused with only a 15 ms old append pending")
	}
	// The young append commits in 30 ms; the later one is old at 510
	// while the range is still overloaded: refused.
	s.answered(young, at(435), true)
	if s.admit(at(510)) {
		t.Fatal("admitted with a 104 ms old append pending")
	}
	s.answered(later, at(515), false)
	// This interval's least sojourn (30 ms) is within the target, so the
	// next one admits everything.
	stuck := s.proposed(at(520))
	if !s.admit(at(610)) || s.overloaded {
		t.Fatal("still overloaded after an interval of short sojourns")
	}
	// An answer never comes (stuck) and nothing commits: no overload.
	if !s.admit(at(1500)) {
		t.Fatal("refused after intervals without commits")
	}
	s.answered(stuck, at(1600), false)

	// reset forgets everything.
	s.proposed(at(1600))
	s.overloaded = true
	s.reset()
	if !s.admit(at(1700)) || len(s.pending) != 0 {
		t.Fatal("reset kept state")
	}
}

// TestAppendShedderPendingBound: past appendShedPendingMax unanswered
// appends, new ones go untracked.
func TestAppendShedderPendingBound(t *testing.T) {
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
