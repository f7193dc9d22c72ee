package sim

// Second takeovers (Regions > 1). A range already taken over can be taken
// over again: the failover agents are offered every range homed outside
// their region (the home directory, as regionsvc's agent is), and one run
// in two of those that cut region 0 off also cuts off, shortly after its
// first grant, the region that took the range over, while region 0 is
// still away: the third region takes the range from the first taker, at
// its own tail, at epoch 3. The same checks hold across both: epochs
// never go back (per node, along the log, grant over grant), the acked
// records past each fork point are counted as orphaned and never appear
// in the range's log, every copy that diverged under either epoch forks
// at one of the range's epoch starts (isStart) and then holds the new
// home's log, readers' records are the log's or explained by a fork.
// Draws come from the homing layer's own generator (h.rng).

// secondPlan arms a second failover in one run in two of those that cut
// region 0 off, which then cut it off earlier (at 200-500 ms) so that
// both takeovers fit the run's faults.
func (h *homeWorld) secondPlan() {
	h.secondAt = -1
	if h.failAt < 0 || h.rng.IntN(2) != 0 {
		return
	}
	h.failAt = 200 + h.rng.Int64N(300)
	h.secondAt = 0 // armed: set at the first grant
}

// secondFailover, at a range's first grant, schedules the cut of the
// taker's region when a second failover is armed.
func (h *homeWorld) secondFailover() {
	if h.secondAt != 0 {
		return
	}
	h.secondAt = h.w.now + 50 + h.rng.Int64N(200)
	h.secondFor = leaseTTLMs + maxOffsetMs + 200 + h.rng.Int64N(800)
}

// cutSecond cuts the region that took range 0 (or the first range taken)
// off the WAN when the second failover is due.
func (h *homeWorld) cutSecond() {
	if h.secondAt <= 0 || h.w.now != h.secondAt {
		return
	}
	for r := range h.homes {
		if g := h.homeIdx[r]; g != 0 {
			h.w.geo.cutTill[g] = max(h.w.geo.cutTill[g], h.w.now+h.secondFor)
			h.res.Failovers++
			return
		}
	}
}

// isStart reports whether epoch starts at offset at in range r's log (a
// grant said so): the only place a fork may cut a copy.
func (h *homeWorld) isStart(r int, epoch, at uint64) bool {
	for _, g := range h.history[r] {
		if g.home.Epoch == epoch && g.home.StartOffset == at {
			return true
		}
	}
	return false
}
