package homing

import (
	"errors"
	"testing"
	"time"
)

// TestCoreInstall: a snapshot handed to the core directly (a planned
// rehome's prepare) takes effect at once and is reported as seen by the
// next heartbeat; a heartbeat answer read before it (in flight meanwhile)
// does not bring the older homes back; older snapshots are refused, also
// after a lost liveness epoch.
func TestCoreInstall(t *testing.T) {
	c, err := NewCore(CoreConfig{NodeID: 1, Region: "us", HeartbeatIntervalNanos: int64(time.Second),
		RetryIntervalNanos: int64(250 * time.Millisecond), LivenessTTLNanos: int64(5 * time.Second), MaxOffsetNanos: int64(500 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	key := RangeKey{Stream: "s", Range: 0}
	home := Home{Key: key, Region: "us", Epoch: 1}
	moving := home
	moving.MovingTo, moving.DrainVersion = "eu", 3
	now := int64(time.Hour)

	req, _ := c.Next(now)
	c.Done(req, HeartbeatResult{Liveness: Liveness{NodeID: 1, Region: "us", Epoch: 1}}, nil) // registered
	req, _ = c.Next(now)
	c.Done(req, HeartbeatResult{Liveness: Liveness{NodeID: 1, Region: "us", Epoch: 1}, Extended: true,
		HomesVersion: 1, HomesChanged: true, Homes: []Home{home}}, nil)
	if e, err := c.View().Check(key, now); err != nil || e != 1 {
		t.Fatalf("check before the move: %d %v", e, err)
	}

	// A heartbeat goes out; the prepare commits (version 2 is another
	// change, 3 the mark) and its snapshot is installed before the answer,
	// which read version 2.
	now += int64(time.Second)
	inflight, _ := c.Next(now)
	if changed, taken := c.Install(3, []Home{moving}); !changed || !taken {
		t.Fatalf("install: changed %v taken %v", changed, taken)
	}
	if _, err := c.View().Check(key, now); !errors.Is(err, ErrNotHome) {
		t.Fatalf("check after the install: %v", err)
	}
	ev := c.Done(inflight, HeartbeatResult{Liveness: Liveness{NodeID: 1, Region: "us", Epoch: 1}, Extended: true,
		HomesVersion: 2, HomesChanged: true, Homes: []Home{home}}, nil)
	if !ev.Extended || ev.HomesChanged {
		t.Fatalf("stale answer: %+v", ev)
	}
	if v := c.View(); v.HomesVersion != 3 {
		t.Fatalf("homes version %d after a stale answer, want 3", v.HomesVersion)
	}
	if _, err := c.View().Check(key, now); !errors.Is(err, ErrNotHome) {
		t.Fatalf("check after a stale answer: %v", err)
	}
	now += int64(time.Second)
	next, _ := c.Next(now)
	if next.HomesSeen != 3 || next.HomesKnown != 3 {
		t.Fatalf("next heartbeat reports %d seen, %d known; want 3", next.HomesSeen, next.HomesKnown)
	}
	c.Done(next, HeartbeatResult{Liveness: Liveness{NodeID: 1, Region: "us", Epoch: 1}, Extended: true, HomesVersion: 3}, nil)

	// Same or older versions are refused.
	for _, v := range []uint64{3, 2} {
		if _, taken := c.Install(v, []Home{home}); taken {
			t.Fatalf("install of version %d over 3 taken", v)
		}
	}
	// A takeover fences the node: its homes are void, and an install of
	// what it had before does not bring them back.
	now += int64(time.Second)
	req, _ = c.Next(now)
	c.Done(req, HeartbeatResult{Liveness: Liveness{NodeID: 1, Region: "us", Epoch: 2}}, nil)
	if _, taken := c.Install(3, []Home{home}); taken {
		t.Fatal("install of the pre-fencing version taken")
	}
	if _, taken := c.Install(5, []Home{home}); !taken {
		t.Fatal("install of a newer version refused")
	}
	if _, err := c.View().Check(key, now); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("a fenced node serves before its lease is extended again: %v", err)
	}
}
