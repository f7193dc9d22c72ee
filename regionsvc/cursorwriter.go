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
//  1. Once per term of leadership (and after a failed proposal, once
//     nothing is in flight) it reads the home's confirmed tail (a Raft
//     ReadIndex; with homing, under the lease) and waits until its State
//     has applied it: every entry committed before its own next proposal
//     is then in the State, since only it proposes in its term. It starts
//     its sessions afresh.
//  2. It runs the queued requests, in arrival order (and the session
//     expiry), through one Batch that it keeps while proposals are in
//     flight, so that each request sees the changes of every proposal
//     before it; it proposes the records staged since the last proposal as
//     one append, stamped with the homing epoch admit gives, up to
//     cursorPipelineMax appends in flight. It drops the Batch once none is
//     in flight (the State has them all).
//  3. It answers a request once the append of its round, and every append
//     before it, committed and the State applied them (a grant or a commit
//     is durable before anyone hears of it; a request that changed nothing
//     waits for the appends whose changes its answer may show). A request
//     that failed in the Batch changed nothing and is answered at once.
//     When an append fails, its requests and those of every append after
//     it get the error (retriable: a retry of a commit or a heartbeat is
//     harmless), and the next round starts with step 1.
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
	// cursorPipelineMax bounds the appends in flight per cursor range.
	cursorPipelineMax = 4
	// cursorPipelineOpsMin is how many requests must be queued for a
	// round to run while appends are in flight: with nothing in flight a
	// request is proposed at once, else it waits for company (group
	// commit), up to the oldest append's answer. Under load every append
	// then carries many requests (one fsync and one Raft entry per node
	// for all of them) instead of one request each, the pipeline filling
	// only when requests come faster than appends complete.
	cursorPipelineOpsMin = 16
	// cursorTickInterval is how often sessions are checked.
	cursorTickInterval = 100 * time.Millisecond
	// cursorBarrierTimeout bounds the read barrier of a new term, and the
	// wait for the State to apply an append.
	cursorBarrierTimeout = 10 * time.Second
)

// proposal is one append in flight and the requests it answers.
type proposal struct {
	ops  []*cursorOp
	done chan appendResult // capacity 1
}

// coordinatorLoop is the state of runWriter.
type coordinatorLoop struct {
	cr *cursorRange
	c  *cursors.Coordinator
	// syncedTerm is the term in which the State was brought up to date
	// (0: not synced).
	syncedTerm uint64
	// batch is the view of every proposal in flight (nil when none);
	// state the State it was begun on.
	batch    *cursors.Batch
	state    *cursors.State
	inflight []*proposal
	// failed is the error of a failed append, for the ones after it.
	failed error
	// drainFirst holds rounds back until nothing is in flight (the term
	// changed under appends in flight).
	drainFirst bool
	// scratch is memory reused from round to round (see cutScratch).
	scratch cutScratch
}

// cutScratch is what a round reuses of the one before: the dropped batch
// (its maps), and the slices a proposal's records are cut and listed into
// before they are encoded into its frame (which is new each time: it is
// handed to the range's driver).
type cutScratch struct {
	spare *cursors.Batch
	recs  []cursors.Record
	buf   []byte
	brecs []batch.Record
}

// cutScratchBytesMax bounds the encoding buffer kept from round to round.
const cutScratchBytesMax = 1 << 20

// cut cuts the batch's records into the scratch slices; they are valid
// until the next cut.
func (s *cutScratch) cut(b *cursors.Batch) []cursors.Record {
	recs, buf := b.CutAppend(s.recs[:0], s.buf[:0])
	need := 0
	for _, r := range recs {
		need += len(r.Key) + len(r.Value)
	}
	s.recs, s.buf = recs, buf
	if need > cap(buf) && need <= cutScratchBytesMax {
		s.buf = make([]byte, 0, need+need/4) // the next cut fits in one buffer
	}
	return recs
}

// runWriter is the coordinator goroutine of a cursor range.
func (cr *cursorRange) runWriter() {
	defer cr.done.Done()
	w := &coordinatorLoop{cr: cr, c: cr.cs.n.newCoordinator()}
	tick := time.NewTicker(cursorTickInterval)
	defer tick.Stop()
	var pending []*cursorOp
	for {
		var oldest <-chan appendResult
		if len(w.inflight) > 0 {
			oldest = w.inflight[0].done
		}
		ready := len(pending) > 0 && w.canPropose(len(pending))
		if !ready {
			inbox := cr.inbox
			if len(pending) >= cursorInboxOpsMax {
				inbox = nil
			}
			select {
			case op := <-inbox:
				pending = append(pending, op)
			case r := <-oldest:
				w.complete(r)
				continue
			case <-tick.C:
			case <-cr.stop:
				w.stop(pending)
				return
			}
		}
		pending = w.drain(pending)
		if w.canPropose(len(pending)) { // with nothing queued, the session expiry
			pending = w.round(pending)
		}
	}
}

// canPropose reports whether a round of queued requests may run now:
// at once when nothing is in flight, else with room in the pipeline, no
// failed append still in flight, and enough requests for one more append
// (cursorPipelineOpsMin).
func (w *coordinatorLoop) canPropose(queued int) bool {
	if len(w.inflight) == 0 {
		return true
	}
	return len(w.inflight) < cursorPipelineMax && w.failed == nil && !w.drainFirst && queued >= cursorPipelineOpsMin
}

// stop answers everything with SHUTTING_DOWN (appends in flight end with
// the range's driver).
func (w *coordinatorLoop) stop(pending []*cursorOp) {
	e := apierr.New(apierr.ShuttingDown, "node is shutting down")
	for _, p := range w.inflight {
		w.answerAll(p.ops, e)
	}
	w.answerAll(pending, e)
	w.refuseQueued()
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

// round runs the queued requests through the batch and proposes what they
// staged; it returns the requests left for a later round.
func (w *coordinatorLoop) round(ops []*cursorOp) []*cursorOp {
	term := w.leaderTerm()
	if term == 0 {
		w.syncedTerm = 0
		w.answerAll(ops, w.notCoordinator())
		return nil
	}
	if term != w.syncedTerm {
		if len(w.inflight) > 0 {
			w.drainFirst = true // the term changed under appends in flight: let them end first
			return ops
		}
		if err := w.sync(); err != nil {
			w.answerAll(ops, err)
			return nil
		}
		w.c = w.cr.cs.n.newCoordinator() // sessions start afresh (step 1)
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
	recs, ran, rest := w.build(ops, homingEpoch)
	switch {
	case len(recs) > 0:
		w.propose(recs, epoch, term, ran)
	case len(w.inflight) > 0:
		// Nothing to write, but the answers may show the changes of the
		// appends in flight: they wait for the last of them.
		last := w.inflight[len(w.inflight)-1]
		last.ops = append(last.ops, ran...)
	default:
		w.answer(ran)
	}
	return rest
}

// build runs the expiry and as many requests as fit into one proposal,
// and cuts its records.
func (w *coordinatorLoop) build(ops []*cursorOp, homingEpoch uint64) ([]cursors.Record, []*cursorOp, []*cursorOp) {
	cr := w.cr
	cr.mu.RLock()
	defer cr.mu.RUnlock()
	if w.batch == nil || w.state != cr.state {
		old := w.scratch.spare
		if w.batch != nil {
			old = w.batch // begun on a State since replaced: dropped
		}
		w.batch, w.state = cr.state.BeginReusing(old, cr.cs.n.cfg.Now(), homingEpoch), cr.state
		w.scratch.spare = nil
	} else {
		w.batch.SetNow(cr.cs.n.cfg.Now())
	}
	for _, e := range w.c.Expire(w.batch) {
		cr.logger.Info("group member removed", "group", e.Group, "member", e.MemberID, "reason", e.Reason)
	}
	ran, rest := ops, []*cursorOp(nil)
	for i, op := range ops {
		if w.batch.Len() >= cursorBatchRecordsMax {
			ran, rest = ops[:i], ops[i:]
			break
		}
		if err := op.ctx.Err(); err != nil {
			op.err = apierr.New(apierr.Timeout, "%v", err) // the caller is gone: do not act for it
			continue
		}
		op.val, op.err = op.run(w.batch, w.c)
	}
	return w.scratch.cut(w.batch), ran, rest
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

// propose hands records to the range as one append, in flight until
// complete; recs are the round's scratch (cutScratch), encoded here into
// the append's own frame. The append carries the term its batch was
// validated in: the replica refuses it (retriable; complete then reads the state again) if
// this node lost and regained leadership since, so no record validated
// against a state missing another leader's entries reaches the log.
func (w *coordinatorLoop) propose(recs []cursors.Record, epoch, term uint64, ops []*cursorOp) {
	brecs := w.scratch.brecs[:0]
	size := batch.HeaderSize
	for _, r := range recs {
		brecs = append(brecs, batch.Record{Key: r.Key, Value: r.Value, Tombstone: r.Tombstone})
		size += batch.EncodedRecordSize(brecs[len(brecs)-1])
	}
	frame := batch.Encode(make([]byte, 0, size), batch.Header{Type: batch.TypeData}, brecs)
	clear(brecs) // the scratch keeps no views of records it is done with
	clear(recs)
	w.scratch.brecs = brecs[:0]
	p := &proposal{ops: ops, done: make(chan appendResult, 1)}
	w.inflight = append(w.inflight, p)
	w.cr.d.submit(context.Background(), &appendOp{recordCount: uint32(len(recs)), frame: frame, epoch: epoch, term: term,
		reply: func(r appendResult) { p.done <- r }})
}

// complete takes the answer of the oldest append in flight (answers come
// in log order): its requests are answered once the State applied it, or
// with the error of the first append that failed.
func (w *coordinatorLoop) complete(r appendResult) {
	p := w.inflight[0]
	w.inflight = w.inflight[1:]
	err := w.failed
	if err == nil && r.err != nil {
		e := *apierr.As(r.err)
		e.Retriable = true // nothing or all of the append committed; a retry is harmless
		err = &e
	}
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), cursorBarrierTimeout)
		err = w.cr.waitApplied(ctx, r.baseOffset+uint64(r.recordCount))
		cancel()
	}
	if err != nil {
		w.failed = err
		for _, op := range p.ops {
			if op.err == nil {
				op.err = err
			}
		}
	}
	w.answer(p.ops)
	if len(w.inflight) == 0 {
		w.scratch.spare = w.batch // its memory serves the next batch
		w.batch, w.state, w.drainFirst = nil, nil, false
		if w.failed != nil {
			w.failed, w.syncedTerm = nil, 0 // what committed is unknown: read it again first
		}
	}
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
