package regionsvc

import (
	"sync"
	"sync/atomic"
	"time"
)

// Creation pacing: a new stream's groups start ticking a few at a time.
//
// Every awake group (not quiesced, quiesce.go) wakes its driver on each of
// the node's ticks: a select, a Raft tick, the leader's checks. A new
// group is awake from its creation until its leader is elected, has
// heard every follower and quiesces. A stream of thousands of ranges kept
// thousands of groups awake at once (3,500 of the 3,600 opened on each
// node, 6 minutes into creating 5,000 on a loaded machine:
// notes/ranges10k.md): their ticks took more CPU than the node was
// given, elections timed out, leaders could not quiesce, and the awake
// set only grew (creating 10,000 did not end in 15 minutes).
//
// So a new group of a stream the catalogue applies (openStreamAt, paced)
// opens its files and starts its driver at once but stays dormant: it
// steps the messages it receives (votes, appends, the quiesce heartbeat,
// so a peer's campaign can elect it and its leader can quiesce it), but
// it neither ticks nor campaigns until the node's pace admits it. On each
// tick the pace admits dormant groups, oldest first, while fewer than
// openAwakeMax groups of the node are awake: the ticking cost stays
// bounded whatever the stream's size, and the ranges elect and quiesce in
// waves, in the same order on every node (each opens them in range
// order). The pace never waits for ever: if no group quiesced for
// openPaceStall (a peer down, say, so groups cannot elect) it admits one
// more group per stall. Ranges opened at start (a restart) are not
// paced: startup.go's single campaign per group applies to them.
const (
	openAwakeMaxDefault = 256
	openPaceStall       = 2 * time.Second
)

// openPace counts the node's awake range groups (the catalogue's not
// included: its replicationConfig has no pace) and admits dormant new
// groups.
type openPace struct {
	awake atomic.Int64
	// peak is the most groups awake at once (tests, notes).
	peak atomic.Int64
	max  int64

	mu      sync.Mutex
	waiting []chan struct{} // dormant groups, oldest first
	lowest  int64           // awake at the last admission or decrease
	since   time.Time       // when lowest was set
}

func (p *openPace) add(delta int64) {
	v := p.awake.Add(delta)
	for cur := p.peak.Load(); v > cur && !p.peak.CompareAndSwap(cur, v); cur = p.peak.Load() {
	}
}

// enqueue returns the channel closed when the pace admits a new group.
func (p *openPace) enqueue() chan struct{} {
	ch := make(chan struct{})
	p.mu.Lock()
	p.waiting = append(p.waiting, ch)
	p.mu.Unlock()
	return ch
}

// cancel takes a stopping driver's admission channel off the queue, or
// reports that it was admitted (and counted) already.
func (p *openPace) cancel(admit <-chan struct{}) (admitted bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-admit:
		return true
	default:
	}
	for i, w := range p.waiting {
		if (<-chan struct{})(w) == admit {
			p.waiting = append(p.waiting[:i], p.waiting[i+1:]...)
			break
		}
	}
	return false
}

// admit runs on every tick (the node's ticker): it admits the oldest
// dormant groups while fewer than max groups are awake, or one if none
// quiesced for openPaceStall. An admitted group counts as awake from its
// admission (the driver uncounts it as it quiesces or stops).
func (p *openPace) admit() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now, cur := time.Now(), p.awake.Load()
	if len(p.waiting) == 0 || cur < p.lowest {
		p.lowest, p.since = cur, now
	}
	n := 0
	for n < len(p.waiting) && p.awake.Load() < p.max {
		p.add(1)
		close(p.waiting[n])
		n++
	}
	if n == 0 && len(p.waiting) > 0 && now.Sub(p.since) >= openPaceStall {
		p.add(1)
		close(p.waiting[0])
		n = 1
	}
	if n > 0 {
		p.waiting = append(p.waiting[:0], p.waiting[n:]...)
		p.lowest, p.since = p.awake.Load(), now
	}
}

// admission makes the driver dormant if its group is new and its stream
// paced, and returns the channel it waits on (nil: no wait); a driver
// that does not wait counts as awake from now.
func (d *rangeDriver) admission() <-chan struct{} {
	p := d.cfg.repl.pace
	if p == nil {
		return nil
	}
	if d.cfg.repl.paced && d.rep.IsNewGroup() {
		d.dormant = p.enqueue()
		return d.dormant
	}
	p.add(1)
	return nil
}

// startGroup starts the group's election as its driver starts
// (startup.go), or as the pace admits it if it is dormant.
func (d *rangeDriver) startGroup() {
	if d.dormant == nil {
		d.startElection(d.firstCampaigner())
	}
	d.core.CampaignIfSole()
}

// admitted runs as the pace admits a dormant group (it counted it).
func (d *rangeDriver) admitted() {
	d.dormant = nil
	d.startElection(d.firstCampaigner())
}

// uncountAwake runs as the driver stops: an admitted group still awake is
// no longer counted (admit is its admission channel, nil if it had none).
func (d *rangeDriver) uncountAwake(admit <-chan struct{}) {
	p := d.cfg.repl.pace
	if p == nil {
		return
	}
	if admit != nil && !p.cancel(admit) {
		return // never admitted: never counted
	}
	if !d.quiesced.Load() {
		p.add(-1)
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
