package regionsvc

import (
	"context"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/cursors"
)

// The coordinator of a cursor-stream range: one goroutine per range
// (runWriter) that, while this node leads the range in its home region,
// serves the range's cursors and groups by the driver contract in package
// cursors' doc.go:
//
//  1. Once per term of leadership (and after any failed proposal) it reads
//     the home's confirmed tail (a Raft ReadIndex; with homing, under the
//     lease) and waits until its State has applied it: every entry
//     committed before its own next proposal is then in the State, since
//     only it proposes in its term. It starts its sessions afresh.
//  2. It takes the queued requests, runs them through one Batch in arrival
//     order (and the session expiry), and proposes the Batch's records as
//     one append, stamped with the homing epoch admit gives. One proposal
//     at a time: the next Batch is built only once this one is applied.
//  3. It answers the requests once the append committed and the State
//     applied it (a grant or a commit is durable before anyone hears of
//     it). A request that failed in the Batch changed nothing and is
//     answered at once; if the append fails, every request of the Batch
//     gets the error (retriable: nothing, or everything, of it committed,
//     and a retry of a commit or a heartbeat is harmless).
//  4. While it does not lead the range at home, it answers every request
//     with NOT_LEADER or NOT_HOME, with a hint.

// cursorOp is one request for the coordinator.
type cursorOp struct {
	ctx context.Context
	// run validates the request and stages its changes in the batch; its
	// value is the reply, sent once the batch is durable.
	run  func(b *cursors.Batch, c *cursors.Coordinator) (any, error)
	done chan cursorOpResult // capacity 1

	val any
	err error
}

type cursorOpResult struct {
	val any
	err error
}

// Bounds of the coordinator.
const (
	// cursorInboxOpsMax bounds the queued requests of one cursor range.
	cursorInboxOpsMax = 4096
	// cursorBatchRecordsMax bounds the records of one proposal (a record
	// is at most ~1.7 KiB: 14 MiB, under the node's batch bound).
	cursorBatchRecordsMax = 8192
	// cursorTickInterval is how often sessions are checked.
	cursorTickInterval = 100 * time.Millisecond
	// cursorBarrierTimeout bounds the read barrier of a new term.
	cursorBarrierTimeout = 10 * time.Second
)

// coordinatorLoop is the state of runWriter.
type coordinatorLoop struct {
	cr *cursorRange
	c  *cursors.Coordinator
	// syncedTerm is the term in which the State was brought up to date
	// (0: not synced).
	syncedTerm uint64
}

// runWriter is the coordinator goroutine of a cursor range.
func (cr *cursorRange) runWriter() {
	defer cr.done.Done()
	w := &coordinatorLoop{cr: cr, c: cursors.NewCoordinator()}
	tick := time.NewTicker(cursorTickInterval)
	defer tick.Stop()
	var pending []*cursorOp
	for {
		if len(pending) == 0 {
			select {
			case op := <-cr.inbox:
				pending = append(pending, op)
			case <-tick.C:
			case <-cr.stop:
				w.refuseQueued()
				return
			}
		}
		pending = w.drain(pending)
		pending = w.round(pending)
		select {
		case <-cr.stop:
			w.answerAll(pending, apierr.New(apierr.ShuttingDown, "node is shutting down"))
			w.refuseQueued()
			return
		default:
		}
	}
}

// drain takes what else is queued, up to the inbox's size.
func (w *coordinatorLoop) drain(ops []*cursorOp) []*cursorOp {
	for len(ops) < cursorInboxOpsMax {
		select {
		case op := <-w.cr.inbox:
			ops = append(ops, op)
		default:
			return ops
		}
	}
	return ops
}

func (w *coordinatorLoop) refuseQueued() {
	e := apierr.New(apierr.ShuttingDown, "node is shutting down")
	for {
		select {
		case op := <-w.cr.inbox:
			op.done <- cursorOpResult{err: e}
		default:
			return
		}
	}
}

func (w *coordinatorLoop) answerAll(ops []*cursorOp, err error) {
	for _, op := range ops {
		op.done <- cursorOpResult{err: err}
	}
}

// leaderTerm is the term in which this node leads the range in its home
// region, 0 if it does not.
func (w *coordinatorLoop) leaderTerm() uint64 {
	d := w.cr.d
	if !d.isHome() || d.store == nil {
		return 0
	}
	if d.rep == nil {
		return 1 // a region of one: its own leader for ever
	}
	return d.rep.LeaderTerm()
}

// notCoordinator is the error for a request that reached a node not
// coordinating the range: NOT_HOME toward the home region, or NOT_LEADER
// toward the leader.
func (w *coordinatorLoop) notCoordinator() error {
	d := w.cr.d
	if f := d.failure.Load(); f != nil {
		return f
	}
	if !d.isHome() {
		return w.cr.cs.n.notHome(d)
	}
	return d.hintAddress(d.rep.NotLeaderError())
}

// round runs one batch over ops; it returns the ops left for the next
// round (those that did not fit).
func (w *coordinatorLoop) round(ops []*cursorOp) []*cursorOp {
	term := w.leaderTerm()
	if term == 0 {
		w.syncedTerm = 0
		w.answerAll(ops, w.notCoordinator())
		return nil
	}
	if term != w.syncedTerm {
		if err := w.sync(); err != nil {
			w.answerAll(ops, err)
			return nil
		}
		w.c = cursors.NewCoordinator() // sessions start afresh (step 1)
		w.syncedTerm = term
	}
	n := w.cr.cs.n
	epoch, err := n.admit(w.cr.d)
	if err != nil {
		w.answerAll(ops, err)
		return nil
	}
	homingEpoch := epoch
	if homingEpoch == 0 {
		homingEpoch = n.cfg.Epoch
	}
	b, ran, rest := w.build(ops, homingEpoch)
	if b.Empty() {
		w.answer(ran)
		return rest
	}
	if err := w.commit(b.Records(), epoch); err != nil {
		w.syncedTerm = 0 // what committed is unknown: read it again first
		for _, op := range ran {
			if op.err == nil {
				op.err = err
			}
		}
	}
	w.answer(ran)
	return rest
}

// build runs the expiry and as many requests as fit into one batch.
func (w *coordinatorLoop) build(ops []*cursorOp, homingEpoch uint64) (*cursors.Batch, []*cursorOp, []*cursorOp) {
	cr := w.cr
	cr.mu.RLock()
	defer cr.mu.RUnlock()
	b := cr.state.Begin(cr.cs.n.cfg.Now(), homingEpoch)
	for _, e := range w.c.Expire(b) {
		cr.logger.Info("group member removed", "group", e.Group, "member", e.MemberID, "reason", e.Reason)
	}
	for i, op := range ops {
		if b.Len() >= cursorBatchRecordsMax {
			return b, ops[:i], ops[i:]
		}
		if err := op.ctx.Err(); err != nil {
			op.err = apierr.New(apierr.Timeout, "%v", err) // the caller is gone: do not act for it
			continue
		}
		op.val, op.err = op.run(b, w.c)
	}
	return b, ops, nil
}

func (w *coordinatorLoop) answer(ops []*cursorOp) {
	for _, op := range ops {
		op.done <- cursorOpResult{val: op.val, err: op.err}
	}
}

// sync brings the State up to everything committed before this term's
// proposals: the home's confirmed tail, applied.
func (w *coordinatorLoop) sync() error {
	ctx, cancel := context.WithTimeout(context.Background(), cursorBarrierTimeout)
	defer cancel()
	go func() {
		select {
		case <-w.cr.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	tail, err := w.cr.cs.n.homeTail(ctx, w.cr.d, false)
	if err != nil {
		return err
	}
	return w.cr.waitApplied(ctx, tail)
}

// commit proposes records as one append and waits until the State has
// applied it.
func (w *coordinatorLoop) commit(recs []cursors.Record, epoch uint64) error {
	brecs := make([]batch.Record, len(recs))
	size := batch.HeaderSize
	for i, r := range recs {
		brecs[i] = batch.Record{Key: r.Key, Value: r.Value}
		size += batch.EncodedRecordSize(brecs[i])
	}
	frame := batch.Encode(make([]byte, 0, size), batch.Header{Type: batch.TypeData}, brecs)
	done := make(chan appendResult, 1)
	w.cr.d.submit(context.Background(), &appendOp{recordCount: uint32(len(recs)), frame: frame, epoch: epoch,
		reply: func(r appendResult) { done <- r }})
	var res appendResult
	select {
	case res = <-done:
	case <-w.cr.stop:
		return apierr.New(apierr.ShuttingDown, "node is shutting down")
	}
	if res.err != nil {
		e := *apierr.As(res.err)
		e.Retriable = true // nothing or all of the batch committed; a retry is harmless
		return &e
	}
	ctx, cancel := context.WithTimeout(context.Background(), cursorBarrierTimeout)
	defer cancel()
	return w.cr.waitApplied(ctx, res.baseOffset+uint64(res.recordCount))
}

// submit hands a request to the coordinator goroutine and waits for its
// answer.
func (cr *cursorRange) submit(ctx context.Context, run func(b *cursors.Batch, c *cursors.Coordinator) (any, error)) (any, error) {
	op := &cursorOp{ctx: ctx, run: run, done: make(chan cursorOpResult, 1)}
	select {
	case cr.inbox <- op:
	case <-ctx.Done():
		return nil, apierr.New(apierr.Overloaded, "cursor range %d: the coordinator's queue is full: %v", cr.idx, ctx.Err())
	case <-cr.stop:
		return nil, apierr.New(apierr.ShuttingDown, "node is shutting down")
	}
	select {
	case r := <-op.done:
		return r.val, r.err
	case <-ctx.Done():
		return nil, apierr.New(apierr.Timeout, "cursor range %d: no answer from the coordinator: %v", cr.idx, ctx.Err())
	case <-cr.stop:
		return nil, apierr.New(apierr.ShuttingDown, "node is shutting down")
	}
}

// coordinatesHere reports whether this node coordinates the range now (it
// may lose it before a request runs; the coordinator goroutine checks
// again).
func (cr *cursorRange) coordinatesHere() bool {
	return (&coordinatorLoop{cr: cr}).leaderTerm() != 0
}
