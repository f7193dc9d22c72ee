package replica

import "testing"

// TestSilentLeaderSucceededAfterOneTimeout: when a leader falls silent (cut
// off from its followers), the first of the others by id campaigns one tick
// after an election timeout (and again two ticks later if the vote split),
// so a leader is elected within ElectionTick+4 ticks every time; Raft's
// randomised timer alone elects anywhere between one and two timeouts (with
// ElectionTick 20, within 24 ticks in fewer than one case of two). A leader its followers hear
// is never challenged, however long it leads.
func TestSilentLeaderSucceededAfterOneTimeout(t *testing.T) {
	const electionTick = 20
	c := newClusterOpts(t, 3, 3, func(c *cluster) {
		c.repCfg = func(_ uint64, cfg *Config) { cfg.ElectionTick = electionTick }
	})
	c.elect(1)
	var warm []Result
	c.replicas[1].Propose(op(5, 0, 1, "warm", &warm))
	c.settle()
	checkAcks(t, warm, 1)

	leader := uint64(1)
	for trial := 0; trial < 8; trial++ {
		term := c.replicas[leader].rn.BasicStatus().GetTerm()
		c.tick(5 * electionTick)
		if got := c.replicas[leader].rn.BasicStatus().GetTerm(); got != term || !c.replicas[leader].IsLeader() {
			t.Fatalf("trial %d: a leader its followers hear was challenged (term %d, then %d)", trial, term, got)
		}

		c.cut[leader] = true
		var others []uint64
		for _, id := range c.ids {
			if id != leader {
				others = append(others, id)
			}
		}
		ticks := 0
		for ; ticks < 4*electionTick && c.leaderAmong(others...) == 0; ticks++ {
			c.tick(1)
		}
		next := c.leaderAmong(others...)
		if next == 0 {
			t.Fatalf("trial %d: the others elected no leader", trial)
		}
		if ticks > electionTick+4 {
			t.Fatalf("trial %d: node %d elected after %d ticks, want within %d", trial, next, ticks, electionTick+4)
		}
		delete(c.cut, leader)
		c.tick(3)
		if c.leader() != next {
			t.Fatalf("trial %d: leader %d after the heal, want %d", trial, c.leader(), next)
		}
		leader = next
	}
}
