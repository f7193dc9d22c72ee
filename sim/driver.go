package sim

import (
	"math/rand/v2"

	"github.com/geolog/geolog/rangecore"
	"github.com/geolog/geolog/replica"
	"go.etcd.io/raft/v3/raftpb"
)

// The range driver's loop body runs here as it runs in regionsvc: each
// replica has a rangecore.Driver, and the simulator hands it the events
// its heap delivers (Raft messages, ticks, liveness changes), then runs
// its Ready cycles once per virtual millisecond (readyAll), where the
// product runs them after each drain of its channels. So the sim runs the
// product's ack ordering (a cycle's acks leave at its end), quiescence
// (an idle leader stops ticking; its followers follow on its quiesce
// heartbeat; a quiesced follower wakes when its leader's node is found
// down) and the campaign of a follower whose leader's node is found down.
//
// The failure detector is each node's transport's (detector.go): a peer
// is down once a dial to it failed after the last stream that worked, up
// again once a stream opens, as raftnet.GRPCTransport.PeerDown, with the
// product's reconnect backoff, handshake and keepalive timeouts (scaled
// to the simulator's tick). So a crashed leader is still believed up for
// a backoff, a cut-off one for a keepalive and a handshake timeout (a
// shorter cut breaks no open stream), and a peer that came back is
// believed down until either side dials it. Each node's view is compared
// on every tick, and a change is an EventLiveness for each of its ranges,
// as regionsvc's watchLiveness closes the channel its drivers select on.

// newDriver returns the driver of range r's replica on n (start).
func (w *world) newDriver(n *node, r int, rep *replica.Replica) *rangecore.Driver {
	return rangecore.NewDriver(rep, rangecore.DriverConfig{
		NodeID:   uint64(n.id),
		PeerDown: func(id uint64) bool { return w.peerDown(n, id) },
		AfterReady: func(err error) {
			if !n.up || n.replicas == nil || n.replicas[r] != rep {
				return // a crash in the cycles' writes: the process is gone
			}
			if err != nil {
				w.failed(n, r, err)
				return
			}
			w.scheduleWrite(n, r)
		},
		Rand:   w.rng.IntN,
		Logger: w.opt.Logger,
		// Leader balance as regionsvc runs it (rangecore/balance.go), in
		// the runs that draw it (balanceDraw): the group id picks the
		// preferred leader (the catalogue names none here).
		LeaderBalanceTicks: w.balanceTicks, GroupID: uint64(r),
		OnBalanceTransfer: func(uint64) { w.res.BalanceTransfers++ },
	})
}

// balanceStream seeds the draw of a run's leader balance apart from the
// run's generator, so that a run without it replays exactly as before
// leader balance came into the simulator.
const balanceStream = 0x62616c616e6365

// drawBalance draws whether this run balances leaders (half the runs)
// and how often: every 1 to 3 virtual seconds led (geologd's default is
// 10 s; shorter here, so that a minute sees several rounds).
func (w *world) drawBalance() {
	if w.opt.mut.noLeaderBalance {
		return
	}
	if b := rand.New(rand.NewPCG(uint64(w.opt.Seed), balanceStream)); b.IntN(2) == 0 {
		w.balanceTicks = (1000 + b.IntN(2001)) / tickMs
	}
	w.res.LeaderBalanceTicks = w.balanceTicks
}

// peerDown is n's failure detector: whether its transport finds its
// region's node id down (detector.go).
func (w *world) peerDown(n *node, id uint64) bool {
	if id == 0 || int(id) > w.perRegion || int(id) == n.id {
		return false
	}
	if w.opt.mut.instantDetector {
		p := w.node(n.region, int(id))
		return !p.up || w.cut(n.region, p.id) || w.cut(n.region, n.id)
	}
	return w.linksOf(n).peers[id-1].down
}

// peerKnown is raftnet.GRPCTransport.PeerKnown for n's transport: whether
// its detector has a verdict on its region's node id (detector.go).
func (w *world) peerKnown(n *node, id uint64) bool {
	if id == 0 || int(id) > w.perRegion || int(id) == n.id || w.opt.mut.instantDetector {
		return true
	}
	return w.linksOf(n).peers[id-1].known
}

// tickDrivers runs a tick on every node: a liveness change first (an
// EventLiveness for each of the node's ranges), then the tick of each
// replica that is not quiesced.
func (w *world) tickDrivers() {
	for _, n := range w.nodes {
		if !n.up {
			continue
		}
		if w.livenessChanged(n) {
			for _, d := range n.drivers {
				d.Handle(rangecore.Event{Kind: rangecore.EventLiveness})
			}
		}
		for r, d := range n.drivers {
			if !n.up {
				break // a campaign's cycle crashed it
			}
			if n.replicas[r].Quiesced() {
				w.res.QuiescedTicks++
				continue
			}
			d.Handle(rangecore.Event{Kind: rangecore.EventTick})
		}
	}
}

// livenessChanged reports whether n's view of its peers changed since it
// last looked, and keeps the new view.
func (w *world) livenessChanged(n *node) bool {
	if len(n.down) != w.perRegion {
		n.down = make([]bool, w.perRegion)
	}
	changed := false
	for i := range n.down {
		if down := w.peerDown(n, uint64(i+1)); down != n.down[i] {
			n.down[i], changed = down, true
		}
	}
	return changed
}

// ack sends a reply after the Ready cycle under way on n's range r, as
// regionsvc's propose holds its acks (rangecore.Driver.Hold).
func (w *world) ack(n *node, r int, gen int, send func()) {
	if n.up && n.gen == gen && n.drivers != nil && n.drivers[r].Holding() {
		n.drivers[r].Hold(send)
		return
	}
	send()
}

// stepRaft hands a Raft message to n's range r.
func (w *world) stepRaft(n *node, r int, m *raftpb.Message) {
	n.drivers[r].Handle(rangecore.Event{Kind: rangecore.EventMessages, Msgs: []*raftpb.Message{m}})
}

// logWritten tells n's range r that its log writer made entries durable.
func (w *world) logWritten(n *node, r int) {
	n.drivers[r].Handle(rangecore.Event{Kind: rangecore.EventLogWritten})
}

// readyOne runs the Ready cycles of n's range r (its driver's AfterReady
// schedules the writes, or fails the run); false if the run failed or
// the node died.
func (w *world) readyOne(n *node, r int) bool {
	n.drivers[r].Cycle() // the held-commit timer: HoldCommits is off in the sim
	return w.err == nil && n.up
}
