package regionsvc

import (
	"time"
)

// maintenanceStepMax is the sweep's step: every step it pokes the next
// share of the ranges, so that a MaintenanceInterval's maintenance is
// spread evenly over it.
const maintenanceStepMax = time.Second

// maintenanceSweep runs every range's maintenance (retention as Raft log
// compaction and compaction by key: rangeDriver.compact) from one
// goroutine, in place of a ticker per range: each MaintenanceInterval it
// asks every range of the region for one maintenance round, a share of
// them every step, so that 10,000 ranges are neither ticking 10,000
// timers nor woken at once. A range added during a sweep joins the next;
// a driver still busy with the last request keeps just one pending.
func (n *Node) maintenanceSweep() {
	interval := n.cfg.MaintenanceInterval
	step := min(maintenanceStepMax, interval)
	steps := max(1, int(interval/step))
	t := time.NewTicker(step)
	defer t.Stop()
	var pending []*rangeDriver
	share := 0
	for {
		select {
		case <-t.C:
		case <-n.region.stopCh:
			return
		}
		if len(pending) == 0 {
			pending = n.maintainedDrivers()
			share = (len(pending) + steps - 1) / steps
		}
		k := min(share, len(pending))
		for _, d := range pending[:k] {
			d.requestMaintenance()
		}
		clear(pending[:k]) // let a closed driver go
		pending = pending[k:]
	}
}

// maintainedDrivers returns the drivers of the region's groups that run
// (a range that failed to open has no replica).
func (n *Node) maintainedDrivers() []*rangeDriver {
	n.mu.RLock()
	defer n.mu.RUnlock()
	ds := make([]*rangeDriver, 0, len(n.region.groups))
	for _, d := range n.region.groups {
		if d.maintainCh != nil {
			ds = append(ds, d)
		}
	}
	return ds
}

// requestMaintenance asks the driver for a maintenance round, without
// waiting: one request at most is pending.
func (d *rangeDriver) requestMaintenance() {
	select {
	case d.maintainCh <- struct{}{}:
	default:
	}
}
