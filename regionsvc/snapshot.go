package regionsvc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/raftnet"
	"github.com/geolog/geolog/replica"
	"go.etcd.io/raft/v3/raftpb"
)

// Log compaction and snapshots of replicated ranges (replica/snapshot.go
// has the design):
//
//  1. Every replica applies its stream's retention policy on the
//     maintenance ticker, as Raft log compaction (replica.Compact): only
//     segments whose entries it has applied go, after the compaction point
//     is saved.
//  2. A leader whose follower needs entries it compacted away sends a
//     snapshot: the driver hands Raft's MsgSnap and a body streaming the
//     leader's segments to the transport (SendSnapshot), which reports the
//     outcome through the Handler's ReportSnapshot; the driver goroutine
//     passes it to Raft. Raft pauses the follower until it hears it, so a
//     report is never dropped.
//  3. On the follower, the transport's goroutine reads and validates the
//     body into staging files beside the log (replica.ReceiveSnapshot), then
//     hands message and staging to the driver goroutine, which steps the
//     message and runs the Ready cycle that swaps the log in. The handler
//     returns (acknowledging the snapshot to the leader) only once that is
//     done, or with the error that stopped it.

// snapshotStepTimeout bounds how long a received snapshot waits for its
// range's driver to install it.
const snapshotStepTimeout = 30 * time.Second

// sendSnapshot is the replica's Config.SendSnapshot.
func (d *rangeDriver) sendSnapshot(m *raftpb.Message, body io.ReadCloser) error {
	if wrap := d.cfg.repl.snapshotBody; wrap != nil {
		body = wrap(body)
	}
	return d.cfg.repl.transport.SendSnapshot(d.cfg.repl.groupID, m, body)
}

// compact runs the range's retention as Raft log compaction.
func (d *rangeDriver) compact() {
	if d.failure.Load() != nil {
		return
	}
	if d.cfg.compactionFloor != nil {
		floor, ok := d.cfg.compactionFloor()
		var tf uint64 // the tasks' floor for their heartbeats, plus one
		if ok {
			tf = floor + 1
		}
		d.taskFloor.Store(tf)
		if h := d.homeFloor.Load(); !ok && h != 0 && !d.isHome() && d.rep.IsLeader() {
			// The mirror group's leader, which hears the home's
			// heartbeats, keeps its log from the floor they last carried:
			// should this region become the home, it still holds what
			// every other mirror needs to fork and catch up
			// (notes/simgaps.md P3). Followers hold nothing back, as on
			// the home.
			floor, ok = h-1, true
		}
		d.rep.SetCompactionFloor(floor, ok)
	}
	n, err := d.rep.Compact()
	if err != nil {
		d.logger.Warn("log compaction failed", "error", err)
		return
	}
	if n > 0 {
		d.logger.Debug("compacted log", "segments", n, "start_offset", d.store.StartOffset(), "first_index", d.store.FirstIndex())
	}
	d.compactByKey()
}

// replicatedDriver returns the driver of group, or nil.
func (n *Node) replicatedDriver(group raftnet.GroupID) *rangeDriver {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if d, ok := n.region.groups[group]; ok && d.rep != nil {
		return d
	}
	return nil
}

// handleSnapshot is the transport Handler's HandleSnapshot (see step 3
// above). It runs on a transport goroutine.
func (n *Node) handleSnapshot(from raftnet.NodeID, group raftnet.GroupID, msg *raftpb.Message, body io.Reader) error {
	d := n.replicatedDriver(group)
	if d == nil {
		return fmt.Errorf("%w: group %d", raftnet.ErrUnknownGroup, group)
	}
	st, err := d.rep.ReceiveSnapshot(msg, body)
	if err != nil && !errors.Is(err, replica.ErrSnapshotStale) {
		d.logger.Warn("snapshot refused", "from", uint64(from), "index", msg.GetSnapshot().GetMetadata().GetIndex(), "error", err)
		return err
	}
	// A stale snapshot is stepped without a body: Raft answers the leader
	// with this replica's progress.
	ctx, cancel := context.WithTimeout(context.Background(), snapshotStepTimeout)
	defer cancel()
	var stepErr error
	done := make(chan struct{})
	install := func() {
		defer close(done)
		if d.condemned { // a stray being removed (strays.go) acks nothing more
			st.Discard()
			stepErr = apierr.New(apierr.ShuttingDown, "range is closing")
			return
		}
		if stepErr = d.rep.StepSnapshot(msg, st); stepErr != nil {
			return
		}
		d.ready()
		if f := d.rep.Failure(); f != nil {
			stepErr = f
		}
	}
	// Until install is queued the staging is ours to discard; from then on
	// the driver owns it (it may run install after we gave up waiting).
	select {
	case d.execCh <- install:
	case <-d.doneCh:
		st.Discard()
		return apierr.New(apierr.ShuttingDown, "range is closing")
	case <-ctx.Done():
		st.Discard()
		return apierr.Wrap(apierr.Timeout, ctx.Err(), "range busy")
	}
	select {
	case <-done:
		return stepErr
	case <-d.doneCh:
		return apierr.New(apierr.ShuttingDown, "range is closing")
	case <-ctx.Done():
		return apierr.New(apierr.Timeout, "snapshot not installed in %v", snapshotStepTimeout)
	}
}

// reportSnapshot is the transport Handler's ReportSnapshot: it hands the
// outcome to the group's Raft on its driver goroutine.
func (n *Node) reportSnapshot(to raftnet.NodeID, group raftnet.GroupID, err error) {
	d := n.replicatedDriver(group)
	if d == nil {
		return
	}
	report := func() { d.rep.ReportSnapshot(uint64(to), err) }
	// Never dropped (see step 2); one goroutine per snapshot in flight,
	// which the transport bounds, ending with the driver at the latest.
	go func() {
		select {
		case d.execCh <- report:
		case <-d.doneCh:
		}
	}()
}
