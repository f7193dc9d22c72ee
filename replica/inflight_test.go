package replica

import (
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// TestInflightBytesBoundPerFollower: a leader keeps at most about
// MaxInflightBytes of entries unacknowledged to a follower that does not
// answer, however much it is given to replicate (the range's share of the
// transport's queue to that peer, which every range sending to it shares),
// while the other follower and the leader commit everything.
func TestInflightBytesBoundPerFollower(t *testing.T) {
	const (
		sizePerMsg = 4 << 10
		bound      = 16 << 10
	)
	var toSilent, toSilentMax int
	silent := false
	c := newClusterOpts(t, 3, 3, func(c *cluster) {
		c.repCfg = func(_ uint64, cfg *Config) {
			cfg.MaxSizePerMsg = sizePerMsg
			cfg.MaxInflightBytes = bound
		}
		// Once silent, node 3 takes every append and answers none: its
		// answers are lost (a follower behind a stuck link). What the
		// leader sends it stays in flight.
		c.drop = func(m *raftpb.Message) bool {
			if !silent {
				return false
			}
			if m.GetTo() == 3 && m.GetType() == raftpb.MsgApp {
				for _, e := range m.GetEntries() {
					toSilent += len(e.GetData())
				}
				toSilentMax = max(toSilentMax, len(m.GetEntries()))
			}
			return m.GetFrom() == 3
		}
	})
	c.elect(1)
	var results []Result
	// A first append: node 3 answers, so the leader replicates to it
	// (Raft's replicate state, appends pipelined) when it falls silent.
	c.replicas[1].Propose(op(1, 0, 1, "first", &results))
	c.settle()
	results, silent = nil, true
	const appends = 40
	for i := range appends {
		c.replicas[1].Propose(op(1, uint64(1+i*100), 100, "inflight", &results)) // about 2 KiB a frame
		c.settle()
	}
	if len(results) != appends {
		t.Fatalf("%d of %d appends answered", len(results), appends)
	}
	for i, r := range results {
		if r.Err != nil {
			t.Fatalf("append %d: %v", i, r.Err)
		}
	}
	// Raft may pass the bound by one message.
	if toSilent > bound+sizePerMsg {
		t.Fatalf("the leader sent %d entry bytes to a follower that answered none, bound %d (+ one message of %d)", toSilent, bound, sizePerMsg)
	}
	if toSilent < bound/2 {
		t.Fatalf("the leader sent only %d entry bytes to the silent follower", toSilent)
	}
	t.Logf("%d entry bytes in flight to the silent follower (bound %d)", toSilent, bound)
}

// TestInflightBytesDefault: a replica bounds its appends in flight per
// follower unless told otherwise.
func TestInflightBytesDefault(t *testing.T) {
	if got := withDefaults(Config{}).MaxInflightBytes; got != maxInflightBytesDefault {
		t.Fatalf("MaxInflightBytes default %d, want %d", got, maxInflightBytesDefault)
	}
	if got := withDefaults(Config{MaxSizePerMsg: 32 << 20}).MaxInflightBytes; got != 32<<20 {
		t.Fatalf("MaxInflightBytes with 32 MiB messages: %d", got)
	}
}
