package regionsvc

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/raftnet"
	"github.com/geolog/geolog/replica"
	"github.com/geolog/geolog/vfs"
	"go.etcd.io/raft/v3/raftpb"
)

// replicationConfig makes a range driver a member of the range's Raft group
// over the region's nodes.
type replicationConfig struct {
	nodeID    uint64
	groupID   raftnet.GroupID
	peers     []uint64
	addrOf    func(id uint64) string // Raft id → client address, for leader hints
	transport raftnet.Transport
	tick      func() <-chan struct{} // the node's shared ticker
	// onCommit, if set, is called on the driver goroutine after the
	// committed offset advanced (the catalogue applies new streams).
	onCommit  func(d *rangeDriver, from, to uint64)
	raftInMax int
	// heartbeatTicks and electionTicks configure Raft's timing.
	heartbeatTicks, electionTicks int
}

// raftInMax bounds the message batches queued for one replica; past it,
// messages are dropped (Raft retransmits).
const raftInMaxDefault = 256

func (d *rangeDriver) openReplica(headers []batch.Header) error {
	rc := d.cfg.repl
	if rc.raftInMax == 0 {
		rc.raftInMax = raftInMaxDefault
	}
	d.raftIn = make(chan []*raftpb.Message, rc.raftInMax)
	d.unreachable = make(chan uint64, 64)
	d.execCh = make(chan func(), 16)
	fsys := d.cfg.store.FS
	if fsys == nil {
		fsys = vfs.OS()
	}
	rep, err := replica.New(replica.Config{
		NodeID: rc.nodeID, Stream: d.cfg.stream, Range: d.cfg.rangeID, Peers: rc.peers,
		Log: d.store, State: replica.FileState{FS: fsys, Dir: d.cfg.store.Dir},
		Send:          d.sendRaft,
		Epoch:         d.cfg.epoch,
		Now:           d.cfg.now,
		Logger:        d.cfg.logger,
		HeartbeatTick: rc.heartbeatTicks, ElectionTick: rc.electionTicks,
	}, headers)
	if err != nil {
		return err
	}
	d.rep = rep
	return nil
}

// sendRaft hands Raft's messages to the transport; a refused message is
// reported to Raft as an unreachable peer (after the Ready cycle).
func (d *rangeDriver) sendRaft(msgs []*raftpb.Message) {
	for _, m := range msgs {
		if err := d.cfg.repl.transport.Send(d.cfg.repl.groupID, m); err != nil {
			select {
			case d.unreachable <- m.GetTo():
			default:
			}
		}
	}
}

// deliverRaft queues messages from the transport for the driver; it never
// blocks (a full queue drops: Raft retransmits).
func (d *rangeDriver) deliverRaft(msgs []*raftpb.Message) bool {
	select {
	case d.raftIn <- msgs:
		return true
	default:
		return false
	}
}

// runReplicated is the driver loop of a replicated range: one goroutine owns
// the replica and follows replica's driver contract (doc.go there).
func (d *rangeDriver) runReplicated() {
	defer close(d.doneCh)
	defer func() {
		if err := d.store.Close(); err != nil {
			d.logger.Error("close store", "error", err)
		}
	}()
	if d.rep.IsNewGroup() && len(d.cfg.repl.peers) > 0 && d.cfg.repl.peers[0] == d.cfg.repl.nodeID {
		if err := d.rep.Campaign(); err != nil {
			d.logger.Warn("campaign on creation", "error", err)
		}
		d.ready()
	}
	// Retention does not run on replicated ranges yet: deleting a log prefix
	// is Raft log compaction, which needs snapshot (segment) transfer to
	// followers that fall behind it.
	for {
		tick := d.cfg.repl.tick()
		select {
		case op := <-d.inbox:
			d.propose(op)
		case msgs := <-d.raftIn:
			d.step(msgs)
		case <-tick:
			d.rep.Tick()
		case to := <-d.unreachable:
			d.rep.ReportUnreachable(to)
		case fn := <-d.execCh:
			fn()
		case <-d.stopCh:
			d.stopReplicated()
			return
		}
		// Take everything else already queued before the Ready cycle, so
		// that one cycle (one fsync) covers as many proposals and messages
		// as possible: with one event per cycle, messages would wait behind
		// an fsync each.
		d.drainReplicated()
		d.ready()
	}
}

// drainEventsMax bounds the events taken into one Ready cycle.
const drainEventsMax = 4096

func (d *rangeDriver) drainReplicated() {
	for n := 0; n < drainEventsMax; n++ {
		select {
		case op := <-d.inbox:
			d.propose(op)
		case msgs := <-d.raftIn:
			d.step(msgs)
		case to := <-d.unreachable:
			d.rep.ReportUnreachable(to)
		default:
			return
		}
	}
}

func (d *rangeDriver) step(msgs []*raftpb.Message) {
	for _, m := range msgs {
		d.rep.Step(m)
	}
}

// ready runs Ready cycles until Raft has nothing more, then publishes the
// committed offset to readers.
func (d *rangeDriver) ready() {
	for i := 0; i < 16 && d.rep.HasReady(); i++ {
		if err := d.rep.ProcessReady(); err != nil {
			d.logger.Error("replica failed", "error", err)
			break
		}
	}
	if f := d.rep.Failure(); f != nil && d.failure.Load() == nil {
		d.failure.Store(f)
		d.notify()
	}
	if c := d.rep.Committed(); c > d.committed.Load() {
		from := d.committed.Load()
		d.committed.Store(c)
		d.notify()
		if d.cfg.repl.onCommit != nil {
			d.cfg.repl.onCommit(d, from, c)
		}
	}
}

// propose hands an append to the replica, translating its answer.
func (d *rangeDriver) propose(op *appendOp) {
	frameBytes := len(op.frame)
	d.rep.Propose(&replica.Op{
		ProducerID: op.producerID, BaseSequence: op.baseSequence, RecordCount: op.recordCount,
		Frame: op.frame,
		Reply: func(r replica.Result) {
			if r.Err != nil {
				op.reply(appendResult{err: d.hintAddress(r.Err)})
				return
			}
			if !r.Duplicate {
				d.cfg.metrics.ackedRecords.Add(context.Background(), int64(r.RecordCount))
				d.cfg.metrics.ackedBytes.Add(context.Background(), int64(frameBytes))
			}
			op.reply(appendResult{baseOffset: r.BaseOffset, recordCount: r.RecordCount, epoch: r.Epoch,
				appendTimeUnixNanos: r.AppendTimeUnixNanos, duplicate: r.Duplicate})
		},
	})
}

// exec runs fn on the driver goroutine (which owns the replica) and waits.
func (d *rangeDriver) exec(ctx context.Context, fn func()) error {
	done := make(chan struct{})
	select {
	case d.execCh <- func() { fn(); close(done) }:
	case <-d.doneCh:
		return apierr.New(apierr.ShuttingDown, "range is closing")
	case <-ctx.Done():
		return apierr.New(apierr.Timeout, "range busy: %v", ctx.Err())
	}
	select {
	case <-done:
		return nil
	case <-d.doneCh:
		return apierr.New(apierr.ShuttingDown, "range is closing")
	case <-ctx.Done():
		return apierr.New(apierr.Timeout, "range busy: %v", ctx.Err())
	}
}

// hintAddress turns a replica's "node:<id>" leader hint into the leader's
// client address.
func (d *rangeDriver) hintAddress(err error) error {
	e := apierr.As(err)
	if e.Code == apierr.NotLeader && strings.HasPrefix(e.LeaderHint, "node:") {
		id, _ := strconv.ParseUint(strings.TrimPrefix(e.LeaderHint, "node:"), 10, 64)
		hinted := *e
		hinted.LeaderHint = d.cfg.repl.addrOf(id)
		return &hinted
	}
	return err
}

// stopReplicated hands leadership away if it can (so the group does not
// wait an election timeout), answers what is pending and refuses the rest.
func (d *rangeDriver) stopReplicated() {
	if d.rep.IsLeader() {
		if to := d.transferee(); to != 0 {
			d.rep.TransferLeadership(to)
			d.ready()
		}
	}
	d.rep.Close()
	d.refuseQueued()
}

// transferee picks the most caught-up follower.
func (d *rangeDriver) transferee() uint64 {
	st := d.rep.Status()
	var best, bestMatch uint64
	for id, pr := range st.Progress {
		if id == d.cfg.repl.nodeID || pr.IsLearner {
			continue
		}
		if pr.Match >= bestMatch {
			best, bestMatch = id, pr.Match
		}
	}
	return best
}

// metaGroupID is the catalogue's Raft group; ranges get groups derived from
// the catalogue offset of their stream's creation (see groupFor).
const metaGroupID raftnet.GroupID = 1

// groupFor is the Raft group of range r of the stream created at catalogue
// offset metaOffset: unique and the same on every node.
func groupFor(metaOffset uint64, r uint32) raftnet.GroupID {
	return raftnet.GroupID((metaOffset+1)<<16 | uint64(r))
}

func metaDir(dataDir string) string { return filepath.Join(dataDir, "meta") }

func fmtPeers(peers map[uint64]string) string {
	var b strings.Builder
	for id, a := range peers {
		fmt.Fprintf(&b, "%d=%s ", id, a)
	}
	return b.String()
}
