package replicator

import (
	"math/rand/v2"
	"testing"
	"time"
)

var lagT0 = time.Unix(1_800_000_000, 0)

// at is a local time s seconds after lagT0.
func at(s float64) time.Time { return lagT0.Add(time.Duration(s * float64(time.Second))) }

// hbAt is a heartbeat of epoch 1 with tail at home time s seconds.
func hbAt(tail uint64, s float64) Heartbeat {
	return Heartbeat{CommittedEnd: tail, HomeTimeUnixNanos: at(s).UnixNano(), Epoch: 1}
}

func TestLagUnknownCountsFromCreation(t *testing.T) {
	l := NewLag(at(0))
	s := l.Status(at(3))
	if s.Known || s.Synced || s.TimeLag != 3*time.Second || s.HeartbeatAge != 3*time.Second {
		t.Fatalf("before any heartbeat: %+v", s)
	}
	// A heartbeat the mirror is behind: known, not synced, still counting.
	l.Heartbeat(hbAt(10, 4), at(4))
	s = l.Status(at(5))
	if !s.Known || s.Synced || s.OffsetLag != 10 || s.TimeLag != 5*time.Second || s.HeartbeatAge != time.Second {
		t.Fatalf("behind the first heartbeat: %+v", s)
	}
}

func TestLagSyncAndStall(t *testing.T) {
	l := NewLag(at(0))
	l.Applied(5)
	l.Heartbeat(hbAt(5, 1), at(1)) // caught up at home time 1
	if s := l.Status(at(1)); !s.Synced || s.TimeLag != 0 || s.OffsetLag != 0 {
		t.Fatalf("caught up: %+v", s)
	}
	l.Heartbeat(hbAt(10, 2), at(2))
	l.Heartbeat(hbAt(20, 3), at(3))
	if s := l.Status(at(3)); s.OffsetLag != 15 || s.TimeLag != 2*time.Second {
		t.Fatalf("behind by two heartbeats: %+v", s)
	}
	l.Applied(15) // covers the tail of home time 2, not 3
	if s := l.Status(at(3)); s.SyncHomeTime != at(2) || s.TimeLag != time.Second || s.OffsetLag != 5 {
		t.Fatalf("partly caught up: %+v", s)
	}
	l.Applied(20)
	if s := l.Status(at(3.5)); s.SyncHomeTime != at(3) || s.TimeLag != 500*time.Millisecond {
		t.Fatalf("caught up again: %+v", s)
	}
	// The link stalls: no heartbeat for a minute. The lag grows with the
	// local clock, whatever the applied end says.
	for _, now := range []float64{10, 30, 63} {
		if s := l.Status(at(now)); s.TimeLag != at(now).Sub(at(3)) || s.HeartbeatAge != at(now).Sub(at(3)) {
			t.Fatalf("stalled at %vs: %+v", now, s)
		}
	}
}

func TestLagDominatedHeartbeats(t *testing.T) {
	l := NewLag(at(0))
	l.Heartbeat(hbAt(20, 1), at(1))
	// Arrives later (a reconnect), earlier tail, later time: it dominates.
	l.Heartbeat(hbAt(10, 2), at(2))
	l.Applied(10)
	if s := l.Status(at(2)); s.SyncHomeTime != at(2) {
		t.Fatalf("t_sync %v, want the dominating heartbeat's time", s.SyncHomeTime)
	}
	// Out of order the other way: a higher tail with an earlier time is
	// dominated and changes nothing.
	l.Heartbeat(hbAt(30, 3), at(3))
	l.Heartbeat(hbAt(40, 2.5), at(3))
	if len(l.pending) != 1 || l.pending[0].tail != 30 {
		t.Fatalf("pending %+v, want only the tail-30 heartbeat", l.pending)
	}
}

func TestLagClockOffset(t *testing.T) {
	// The home's clock runs 10 s ahead of the mirror's: home-clock lag
	// would be negative, so the local bound holds it up and it still grows
	// while the link is stalled.
	l := NewLag(at(0))
	l.Heartbeat(hbAt(0, 11), at(1))
	if s := l.Status(at(1)); s.TimeLag != 0 {
		t.Fatalf("just synced: %+v", s)
	}
	if s := l.Status(at(6)); s.TimeLag != 5*time.Second {
		t.Fatalf("stalled 5 s with a clock 10 s ahead: %+v", s)
	}
	// The home's clock 10 s behind: lag reads 10 s high (the documented
	// error), never low.
	l2 := NewLag(at(0))
	l2.Heartbeat(hbAt(0, -9), at(1))
	if s := l2.Status(at(1)); s.TimeLag != 10*time.Second {
		t.Fatalf("clock 10 s behind: %+v", s)
	}
}

func TestLagEpochs(t *testing.T) {
	l := NewLag(at(0))
	l.Applied(10)
	l.Heartbeat(Heartbeat{CommittedEnd: 10, HomeTimeUnixNanos: at(50).UnixNano(), Epoch: 2}, at(5))
	if ok := l.Heartbeat(Heartbeat{CommittedEnd: 99, HomeTimeUnixNanos: at(60).UnixNano(), Epoch: 1}, at(6)); ok {
		t.Fatal("a fenced home's heartbeat was taken")
	}
	if s := l.Status(at(6)); s.HomeTail != 10 || s.Epoch != 2 {
		t.Fatalf("after a stale heartbeat: %+v", s)
	}
	// A new home whose clock is behind the old one's: t_sync moves back.
	l.Heartbeat(Heartbeat{CommittedEnd: 10, HomeTimeUnixNanos: at(7).UnixNano(), Epoch: 3}, at(7))
	if s := l.Status(at(8)); s.SyncHomeTime != at(7) || s.TimeLag != time.Second || s.Epoch != 3 {
		t.Fatalf("after a new home: %+v", s)
	}
}

// TestLagModel checks the tracker against a model that keeps every
// heartbeat: with room enough it computes the same t_sync; with a small
// PendingMax its time lag is never below the model's (it errs high).
func TestLagModel(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 3))
		exact, bounded := NewLag(at(0)), NewLag(at(0))
		bounded.PendingMax = 3
		type beat struct {
			tail uint64
			home float64
		}
		var beats []beat
		var applied, tail uint64
		now := 0.0
		for step := 0; step < 200; step++ {
			now += rng.Float64()
			switch rng.IntN(3) {
			case 0, 1:
				tail += uint64(rng.IntN(10))
				// Heartbeats may arrive out of order by a little.
				b := beat{tail: tail - min(tail, uint64(rng.IntN(3))), home: now - rng.Float64()}
				beats = append(beats, b)
				exact.Heartbeat(hbAt(b.tail, b.home), at(now))
				bounded.Heartbeat(hbAt(b.tail, b.home), at(now))
			case 2:
				applied = min(tail, applied+uint64(rng.IntN(15)))
				exact.Applied(applied)
				bounded.Applied(applied)
			}
			synced, tsync, homeTail := false, 0.0, uint64(0)
			for _, b := range beats {
				if b.tail <= applied && (!synced || b.home > tsync) {
					synced, tsync = true, b.home
				}
				homeTail = max(homeTail, b.tail)
			}
			e, bd := exact.Status(at(now)), bounded.Status(at(now))
			if e.Synced != synced || (synced && e.SyncHomeTime.Sub(at(tsync)).Abs() > time.Microsecond) {
				t.Fatalf("seed %d step %d: t_sync %v (synced %v), model %v (synced %v)", seed, step, e.SyncHomeTime, e.Synced, at(tsync), synced)
			}
			if bd.TimeLag < e.TimeLag {
				t.Fatalf("seed %d step %d: bounded lag %s below the exact %s", seed, step, bd.TimeLag, e.TimeLag)
			}
			if len(bounded.pending) > 3 {
				t.Fatalf("seed %d: %d pending beats, bound 3", seed, len(bounded.pending))
			}
			if e.HomeTail != homeTail || e.OffsetLag != homeTail-min(homeTail, applied) {
				t.Fatalf("seed %d step %d: home tail %d offset lag %d, model %d and %d", seed, step, e.HomeTail, e.OffsetLag, homeTail, homeTail-min(homeTail, applied))
			}
		}
	}
}
