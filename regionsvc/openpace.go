package regionsvc

import (
	"sync/atomic"
	"time"
)

// Creation pacing: a node opens a new stream's ranges only while few of
// its groups are awake.
//
// Every awake group (not quiesced, quiesce.go) wakes its driver on each of
// the node's ticks: a select, a Raft tick, the leader's checks. A new
// group is awake from its creation until its leader is elected, has
// heard every follower and quiesces. A stream of thousands of ranges
// opened as fast as its files can be made kept thousands of groups awake
// at once (3,500 of 3,600 opened on each node, 15 minutes into creating
// 5,000 on a loaded machine: notes/ranges10k.md): their ticks alone took
// more CPU than the node was given, so elections timed out, leaders could
// not quiesce, and the awake set only grew (creating 10,000 did not end).
//
// So, as the catalogue applies a new stream, each of its ranges is opened
// only once fewer than openAwakeMax groups of the node are awake: the
// ticking cost stays bounded whatever the stream's size, and the ranges
// elect and quiesce in waves. The other nodes open the same ranges in the
// same order, and a group awaiting a peer that has not opened it yet is
// awake here: a node ahead of the others waits for them. If no group
// quiesces for openPaceStall (a peer down, say, so groups cannot elect),
// the node opens one more range and waits again: creation slows down, it
// never stops. Ranges opened at start (a restart) are not paced: their
// peers cannot answer before this node listens, which is after they open.
const (
	openAwakeMaxDefault = 256
	openPaceStall       = 5 * time.Second
	openPacePoll        = 20 * time.Millisecond
)

// openPace counts the node's awake range groups (the catalogue's not
// included) and bounds them while a new stream opens.
type openPace struct {
	awake atomic.Int64
	// peak is the most groups awake at once (tests).
	peak atomic.Int64
	max  int64
}

func (p *openPace) add(delta int64) {
	v := p.awake.Add(delta)
	for cur := p.peak.Load(); v > cur && !p.peak.CompareAndSwap(cur, v); cur = p.peak.Load() {
	}
}

// countAwake counts the driver as awake as it starts; the returned
// function, run as it exits, uncounts it (driver goroutine).
func (d *rangeDriver) countAwake() func() {
	p := d.cfg.repl.pace
	if p == nil {
		return func() {}
	}
	p.add(1)
	return func() {
		if !d.quiesced.Load() {
			p.add(-1)
		}
	}
}

// noteQuiesced publishes the replica's quiescence (tickIfAwake) and counts
// the change.
func (d *rangeDriver) noteQuiesced(q bool) {
	if d.quiesced.Swap(q) == q || d.cfg.repl.pace == nil {
		return
	}
	if q {
		d.cfg.repl.pace.add(-1)
	} else {
		d.cfg.repl.pace.add(1)
	}
}

// waitToOpen returns once fewer than openAwakeMax groups of the node are
// awake, once none has quiesced for openPaceStall, or once the region
// stops.
func (n *Node) waitToOpen() {
	p := &n.region.pace
	lowest, since := p.awake.Load(), time.Now()
	for {
		cur := p.awake.Load()
		if cur < p.max {
			return
		}
		if cur < lowest {
			lowest, since = cur, time.Now()
		}
		if time.Since(since) >= openPaceStall {
			return
		}
		select {
		case <-n.region.stopCh:
			return
		case <-time.After(openPacePoll):
		}
	}
}
