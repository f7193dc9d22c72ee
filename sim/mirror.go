package sim

import (
	"errors"
	"fmt"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/replica"
	"github.com/geolog/geolog/replicator"
)

// The mirror side. replicator.Server cannot run here as it is: it serves
// a gRPC stream with a read-ahead goroutine, and MirrorRange.Apply blocks
// until the mirror group commits, which in the simulator takes virtual
// time that only the one goroutine can advance. So a mirror node serves
// its requests as the Server does, step by step, and runs the Server's
// own checks (replicator.CheckBatch, CheckedBatch.Overlap): a range's
// requests are served one at a time, in arrival order (its lock); a batch
// is validated, compared where it overlaps what is applied, and what lies
// past the applied end is proposed verbatim to the mirror group's leader
// (replica.ProposeVerbatim, as regionsvc's mirrorRange.Apply does), the
// answer waiting for every frame's commit.

// mirrorQueue is a mirror node's serving state of one range.
type mirrorQueue struct {
	reqs     []*geoMsg // arrived, not yet served
	applying *geoMsg   // the batch being applied, if any
	seq      uint64    // numbers applies, so that late replies are told apart
	term     uint64    // the leader term the apply was proposed in
	pending  int       // its frames not yet answered
	end      uint64    // the applied end its frames reached
	err      error     // the first failure among them
	forking  bool      // a fork is proposed (fork): requests wait
}

// arrive queues a request at its mirror node; a node that is down, or
// restarted since the open, has no such stream: the source learns it.
func (g *geoWorld) arrive(m *geoMsg) {
	s := m.s
	if s.dead {
		return
	}
	n := s.target
	switch {
	case g.offWAN(n):
		s.blackholed = true // unreachable: the stream stalls
		g.res.Dropped++
		return
	case !n.up && m.kind == gmOpen:
		g.send(s, &geoMsg{kind: gmOpened, err: errConnRefused}, false)
		s.dead = true
		return
	case !n.up || (m.kind != gmOpen && n.gen != s.targetGen):
		g.breakStream(s)
		return
	}
	if m.kind == gmOpen {
		s.targetGen = n.gen
	}
	q := &n.mirror[m.s.l.rng]
	if len(q.reqs) >= mirrorQueueMax {
		g.breakStream(s)
		return
	}
	q.reqs = append(q.reqs, m)
}

// serve answers range r's queued requests at node n, one at a time.
func (g *geoWorld) serve(n *node, r int) {
	q := &n.mirror[r]
	for g.w.err == nil {
		if q.forking {
			if n.replicas[r].LeaderTerm() == q.term {
				return // the fork's reply serves the request again
			}
			q.forking = false
			q.seq++ // its reply belongs to no fork
			continue
		}
		if q.applying != nil {
			rep := n.replicas[r]
			if rep.LeaderTerm() == q.term && (q.pending > 0 || (q.err == nil && rep.Committed() < q.end)) {
				// Waiting for the mirror group to commit, and for the
				// replica to publish it (mirrorRange.apply's
				// waitCommitted): else the next batch, which starts
				// there, would look like a gap.
				return
			}
			g.finishApply(n, r)
			continue
		}
		if len(q.reqs) == 0 {
			return
		}
		m := q.reqs[0]
		q.reqs = q.reqs[1:]
		if !m.s.dead {
			g.handle(n, r, m)
		}
	}
}

// handle serves one request of range r at node n.
func (g *geoWorld) handle(n *node, r int, m *geoMsg) {
	rep := n.replicas[r]
	if !rep.IsLeader() {
		e := apierr.New(apierr.NotLeader, "range %d: %v does not lead the mirror group", r, n)
		if id := rep.LeaderID(); id != 0 {
			e.LeaderHint = fmt.Sprintf("node:%d", id)
		}
		g.answer(m, 0, 0, e, true)
		return
	}
	applied, highest := rep.Committed(), rep.HighestEpoch()
	if top := g.w.homing.homes[r].Epoch; highest > top {
		g.w.err = fmt.Errorf("%v range %d: a mirror has seen epoch %d, the store's is %d", n, r, highest, top)
		return
	}
	switch m.kind {
	case gmOpen:
		g.opened(n, r, m, applied, highest)
	case gmHeartbeat:
		g.answer(m, applied, highest, nil, false)
	case gmBatch:
		g.handleBatch(n, r, m, applied, highest)
	}
}

// handleBatch validates a batch and compares it with what is applied, as
// the Server does (its own checks), then applies what extends the log.
func (g *geoWorld) handleBatch(n *node, r int, m *geoMsg, applied, highest uint64) {
	w := g.w
	cb, err := replicator.CheckBatch(m.batch, w.homing.homes[r].Epoch)
	if err != nil {
		w.err = fmt.Errorf("%v range %d: the home shipped a batch the mirror's checks refuse: %w", n, r, err)
		return
	}
	var stored []byte
	if cb.First < applied {
		if w.opt.mut.readOverlapShort {
			// The read before 18de08e: sized for an identical overlap.
			stored, err = n.stores[r].ReadFrames(cb.First, len(cb.Frames), min(applied, cb.End))
		} else {
			stored, err = replicator.ReadOverlap(n.stores[r], cb.First, len(cb.Frames), min(applied, cb.End))
		}
		if w.tracing() {
			w.tracef("%s range %d: batch [%d, %d) from %s, applied %d, highest %d, log from %d:%s; stored:%s (%v)", traceName(n), r, cb.First, cb.End,
				traceName(m.s.l.owner), applied, highest, n.stores[r].StartOffset(), traceFrames(cb.Frames), traceFrames(stored), err)
		}
		if err != nil {
			// Retention deleted what the batch overlaps: the Server resets
			// a mirror whose whole log is of an older epoch than the batch
			// (CheckedBatch.ResetPoint), else refuses it.
			if at, epoch, ok := cb.ResetPoint(applied, logEpoch(n, r, applied, w.opt.mut.noLogEpochFallback)); ok && !m.forked {
				g.fork(n, r, m, at, epoch)
				return
			}
			g.res.Refusals++
			g.answer(m, applied, highest, apierr.Wrap(apierr.Unavailable, err, "read the mirror's frames to compare"), true)
			return
		}
	}
	frames, err := cb.Overlap(applied, stored)
	switch {
	case errors.Is(err, replicator.ErrGap):
		g.res.Gaps++
		g.answer(m, applied, highest, err, false)
		return
	case err != nil:
		var ref *replicator.Refusal
		if errors.As(err, &ref) && !m.forked {
			if at, epoch, ok := ref.ForkPoint(); ok {
				g.noteLargerFrame(n, r, cb, applied, at)
				g.fork(n, r, m, at, epoch)
				return
			}
		}
		w.err = fmt.Errorf("%v range %d: batch [%d, %d) against applied end %d: %w (no fork explains it)", n, r, cb.First, cb.End, applied, err)
		return
	case len(frames) == 0:
		g.res.Duplicates++
		g.answer(m, applied, highest, nil, false)
		return
	}
	g.apply(n, r, m, frames)
}

// noteLargerFrame counts (GeoResult.LargerFrameForks) a fork at at whose
// stored frame there is larger than the batch's frame at at and lies past
// what a read sized for an identical overlap returns (the batch's bytes
// from its first offset): the frame replicator.ReadOverlap reads on for
// (sim seed 3501631), which Options.mut.readOverlapShort does not.
func (g *geoWorld) noteLargerFrame(n *node, r int, cb replicator.CheckedBatch, applied, at uint64) {
	if cb.First >= at {
		return // the first frame of a read always comes whole
	}
	end := min(applied, cb.End)
	short, err := n.stores[r].ReadFrames(cb.First, len(cb.Frames), end)
	if err != nil || frameAt(short, at) != nil {
		return
	}
	stored, err := n.stores[r].ReadFrames(at, 1, end)
	if err != nil {
		return
	}
	if s, f := frameAt(stored, at), frameAt(cb.Frames, at); s != nil && f != nil && len(s) > len(f) {
		g.res.LargerFrameForks++
		g.w.tracef("%s range %d: the fork's frame at %d (%d bytes) is larger than the batch's (%d bytes), past a read of the batch's %d bytes from %d",
			traceName(n), r, at, len(s), len(f), len(cb.Frames), cb.First)
	}
}

// frameAt is the frame of frames whose base offset is at, or nil.
func frameAt(frames []byte, at uint64) []byte {
	for len(frames) > 0 {
		size, err := batch.FrameSize(frames)
		if err != nil || size > len(frames) {
			return nil
		}
		if h, err := batch.DecodeHeader(frames[:size]); err == nil && h.BaseOffset == at {
			return frames[:size]
		}
		frames = frames[size:]
	}
	return nil
}

// fork cuts the mirror's divergent tail off at at, raising it to epoch
// (the Server's Forker: regionsvc's mirrorRange.Fork proposes
// replica.ProposeFork), then serves m again, once.
func (g *geoWorld) fork(n *node, r int, m *geoMsg, at, epoch uint64) {
	q := &n.mirror[r]
	rep := n.replicas[r]
	g.w.tracef("%s range %d: fork at %d to epoch %d (committed %d)", traceName(n), r, at, epoch, rep.Committed())
	q.seq++
	q.forking, q.term = true, rep.LeaderTerm()
	seq, gen := q.seq, n.gen
	rep.ProposeFork(at, epoch, func(fr replica.ForkResult) {
		if n.gen != gen || n.mirror[r].seq != seq {
			return
		}
		q := &n.mirror[r]
		q.forking = false
		q.seq++
		if fr.Err != nil {
			g.res.Refusals++
			g.answer(m, rep.Committed(), rep.HighestEpoch(), fr.Err, true)
			return
		}
		m.forked = true
		q.reqs = append([]*geoMsg{m}, q.reqs...)
	})
}

// apply proposes each frame verbatim to the mirror group; finishApply
// answers once every one is answered.
func (g *geoWorld) apply(n *node, r int, m *geoMsg, frames []byte) {
	fs, err := replicator.SplitFrames(frames)
	if err != nil {
		g.w.err = fmt.Errorf("%v range %d: checked frames do not split: %w", n, r, err)
		return
	}
	q := &n.mirror[r]
	rep := n.replicas[r]
	q.seq++
	q.applying, q.term, q.pending, q.end, q.err = m, rep.LeaderTerm(), len(fs), 0, nil
	seq, gen := q.seq, n.gen
	for _, f := range fs {
		h, _ := batch.DecodeHeader(f)
		g.res.Frames++
		if w := g.w; w.mirroredStale(n, r, h.Epoch) {
			// The start gate's floor (gate.go): this node held appends of a
			// newer epoch as home.
			q.pending--
			if q.err == nil {
				q.err = apierr.New(apierr.StaleEpoch, "%v range %d: a mirrored frame of epoch %d, home here at epoch %d", n, r, h.Epoch, n.gates[r].Floor())
			}
			continue
		}
		rep.ProposeVerbatim(&replica.Op{
			RecordCount: h.Span(), Frame: append([]byte(nil), f...),
			Reply: func(res replica.Result) {
				if n.gen != gen || n.mirror[r].seq != seq {
					return // an apply given up on
				}
				q := &n.mirror[r]
				q.pending--
				if res.Err != nil && q.err == nil {
					q.err = res.Err
				}
				if res.Err == nil {
					q.end = max(q.end, res.BaseOffset+uint64(res.RecordCount))
				}
			},
		})
	}
}

// finishApply answers the batch being applied: its applied end, or the
// first failure (which ends the stream, as the Server's does). An apply
// whose leader term ended before every frame was answered is given up on
// with NOT_LEADER.
func (g *geoWorld) finishApply(n *node, r int) {
	q := &n.mirror[r]
	m := q.applying
	q.applying = nil
	q.seq++ // late replies belong to no apply
	err := q.err
	if q.pending > 0 && err == nil {
		err = apierr.New(apierr.NotLeader, "range %d: %v lost the mirror group's leadership while applying", r, n)
	}
	if err != nil {
		g.res.Refusals++
		g.answer(m, n.replicas[r].Committed(), n.replicas[r].HighestEpoch(), err, true)
		return
	}
	g.res.Batches++
	g.answer(m, q.end, n.replicas[r].HighestEpoch(), nil, false)
}

// opened answers an open with the applied end, the highest epoch and the
// epoch the log ends in (the Server's open response, LogEpoch): that of
// the frame at the applied end or, when retention deleted it, the
// replica's log epoch (regionsvc's mirrorRange.LogEpoch).
func (g *geoWorld) opened(n *node, r int, m *geoMsg, applied, highest uint64) {
	g.send(m.s, &geoMsg{kind: gmOpened, applied: applied, highest: highest, logEpoch: logEpoch(n, r, applied, g.w.opt.mut.noLogEpochFallback)}, false)
}

// logEpoch is the epoch n's log of range r ends in at applied (0:
// unknown), as the Server's open answers it: that of the frame at the
// applied end or, when retention deleted it, the replica's (unless
// noFallback, a test's mutation).
func logEpoch(n *node, r int, applied uint64, noFallback bool) uint64 {
	if applied == 0 {
		return 0
	}
	e := n.replicas[r].HighestEpoch()
	if noFallback {
		e = 0
	}
	if f, err := n.stores[r].ReadFrames(applied-1, 1, applied); err == nil {
		if h, err := batch.DecodeHeader(f); err == nil {
			e = h.Epoch
		}
	}
	return e
}

// answer sends the answer to m back to its source; final ends the stream
// after it.
func (g *geoWorld) answer(m *geoMsg, applied, highest uint64, err error, final bool) {
	kind := gmAnswer
	if m.kind == gmOpen {
		kind = gmOpened
	}
	if err != nil && kind == gmAnswer && !errors.Is(err, replicator.ErrGap) && m.kind != gmOpen {
		final = true
	}
	g.send(m.s, &geoMsg{kind: kind, applied: applied, highest: highest, err: err}, false)
	if final {
		m.s.dead = true
	}
}
