package regionsvc

import (
	"context"
	"testing"
	"time"

	"github.com/geolog/geolog/rangecore"
	"go.etcd.io/raft/v3"
)

// streamRanges returns the drivers of stream's ranges on n.
func (n *Node) streamRanges(stream string) []*rangeDriver {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.streams[stream].ranges
}

// driverStatus returns d's Raft status, taken on its goroutine.
func driverStatus(ctx context.Context, t *testing.T, d *rangeDriver) raft.Status {
	t.Helper()
	var st raft.Status
	if err := d.exec(ctx, func() { st = d.rep.Status() }); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestRestartElectsPreferredLeaders: after the whole region is killed and
// restarts, every range is first led by its preferred leader: the other
// voters held their clock (startup.go) instead of timing out together.
// Leader balance is off, so no transfer hides a random election. Without
// the hold about one range in three would elect another voter first.
func TestRestartElectsPreferredLeaders(t *testing.T) {
	t.Parallel()
	const ranges = 24
	tr := newTestRegionWith(t, 3, 3, func(cfg *Config) {
		cfg.LeaderBalanceInterval = -1
		cfg.TickInterval = 100 * time.Millisecond // the default: the hold is in ticks, the transport's backoff is not
	})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	tr.createStream(ctx, "s", ranges)
	for r := range uint32(ranges) {
		tr.appendAndReadFrom(ctx, 1+uint64(r)%3, "s", r)
	}
	termsBefore := make([]uint64, ranges)
	for _, n := range tr.nodes {
		for r, d := range n.streamRanges("s") {
			termsBefore[r] = max(termsBefore[r], driverStatus(ctx, t, d).GetTerm())
		}
	}
	// Every log is complete (the groups quiesce only then), and the nodes
	// go as killed ones do, without handing leadership on (which would
	// leave the first one stopped behind, rightly unelectable).
	tr.waitQuiesced(ctx)
	for id := uint64(1); id <= 3; id++ {
		tr.crash(id)
	}
	for id := uint64(1); id <= 3; id++ {
		tr.stop(id)
	}
	for id := uint64(1); id <= 3; id++ {
		tr.start(id)
	}
	for r := range ranges {
		for {
			leader, term, preferred := uint64(0), uint64(0), uint64(0)
			for _, n := range tr.nodes {
				d := n.streamRanges("s")[r]
				st := driverStatus(ctx, t, d)
				if st.RaftState == raft.StateLeader {
					leader, term = st.Lead, st.GetTerm()
					preferred = rangecore.PreferredLeader(uint64(d.cfg.repl.groupID), st.Config.Voters[0].Slice())
				}
			}
			if leader != 0 {
				if leader != preferred {
					t.Fatalf("range %d: led by %d in term %d after the restart (term %d before), want its preferred leader %d",
						r, leader, term, termsBefore[r], preferred)
				}
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("range %d: no leader after the restart", r)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
