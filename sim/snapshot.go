package sim

import (
	"errors"
	"fmt"
	"io"

	"github.com/geolog/geolog/replica"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// compactMs is how often (virtual ms) every live replica of a compacting
// run applies retention as log compaction.
const compactMs = 20

// compact runs log compaction on every live replica, between Ready
// cycles as a range driver does (Compact skips a replica with a Ready
// pending).
func (w *world) compact() {
	for _, n := range w.nodes {
		if !n.up {
			continue
		}
		for r, rep := range n.replicas {
			for i := 0; i < 4 && rep.HasReady(); i++ {
				if err := rep.ProcessReady(); err != nil {
					w.failed(n, r, err)
					return
				}
			}
			w.scheduleWrite(n, r)
			if w.geo != nil {
				// Keep what a mirror has yet to receive (regionsvc's
				// compaction floor; on mirrors too, see floor): set on
				// the leaders only, as regionsvc's drivers do (the home
				// leader from its tasks, a mirror group's leader from
				// the home's heartbeats); followers hold to the floor
				// their leader shares (replica floor.go).
				rep.SetCompactionFloor(w.geo.floor(r, n.region), rep.IsLeader() || w.opt.mut.floorEverywhere)
			}
			var before uint64
			if w.tracing() {
				before = n.stores[r].StartOffset()
			}
			if _, err := rep.Compact(); err != nil {
				w.err = fmt.Errorf("%v range %d: compact: %w", n, r, err)
				return
			}
			if w.tracing() {
				w.traceCompaction(n, r, before)
			}
		}
	}
}

// errSnapshotLost fails a snapshot the network lost or could not carry.
var errSnapshotLost = errors.New("sim: snapshot lost")

// sendSnapshot is a replica's Config.SendSnapshot: the snapshot travels as
// one event, faults permitting; whatever becomes of it, its sender hears.
func (w *world) sendSnapshot(region, group, from, fromGen int, m *raftpb.Message, body io.ReadCloser) error {
	to := int(m.GetTo())
	w.res.SnapshotsSent++
	e := &event{at: w.now + 1 + w.rng.Int64N(8), kind: evSnap, region: region, group: group, to: to, from: from, fromGen: fromGen,
		msg: proto.Clone(m).(*raftpb.Message), body: body}
	if w.rng.Float64() < w.dropP || w.cut(region, from) || w.cut(region, to) {
		body.Close()
		w.snapshotStatus(e, errSnapshotLost)
		return nil
	}
	w.push(e)
	return nil
}

// snapshotStatus tells a snapshot's sender its outcome, a little later.
func (w *world) snapshotStatus(e *event, err error) {
	if err != nil {
		w.res.SnapsFailed++
	}
	w.push(&event{at: w.now + 1 + w.rng.Int64N(3), kind: evSnapStatus, region: e.region, group: e.group, to: e.to,
		from: e.from, fromGen: e.fromGen, snapErr: err})
}

// deliverSnapshot hands a snapshot to its receiver as raftnet's transports
// do: the body is read and staged, then the message stepped; the next
// Ready cycle installs it.
func (w *world) deliverSnapshot(e *event) {
	defer e.body.Close()
	n, src := w.node(e.region, e.to), w.node(e.region, e.from)
	if !src.up || src.gen != e.fromGen {
		return // the sender crashed: its transfer died with it, unreported
	}
	if !n.up || w.cut(e.region, e.to) || w.cut(e.region, e.from) {
		w.snapshotStatus(e, errSnapshotLost)
		return
	}
	rep := n.replicas[e.group]
	st, err := rep.ReceiveSnapshot(e.msg, e.body)
	switch {
	case errors.Is(err, replica.ErrSnapshotStale):
		err = rep.StepSnapshot(e.msg, nil)
	case errors.Is(err, replica.ErrSnapshotSourceChanged):
		// The sender's log replaced the body's frames while it was read
		// (a fork applied after the snapshot was taken; seed 5802123):
		// raftnet's sender fails the transfer, which the sender hears.
		w.res.SnapsSourceChanged++
	case errors.Is(err, replica.ErrSnapshotInvalid):
		// The simulator's network does not corrupt bodies: the leader
		// sent something that does not hold together.
		w.err = fmt.Errorf("%v range %d: snapshot from node %d refused: %w", n, e.group, e.from, err)
		return
	case err == nil:
		err = rep.StepSnapshot(e.msg, st)
	}
	w.snapshotStatus(e, err)
}
