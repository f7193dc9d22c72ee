package sim

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/internal/rpcerr"
	"github.com/geolog/geolog/replica"
	"github.com/geolog/geolog/replicator"
)

// produce starts new batches (while faults run) and resends unanswered ones.
func (w *world) produce() {
	newBatches := w.now < int64(w.opt.Steps)
	for _, p := range w.prods {
		for r := range p.batch {
			b := p.batch[r]
			switch {
			case b == nil && newBatches && w.rng.Float64() < 0.05 && w.splits.accepts(p, r):
				n := 1 + w.rng.IntN(3)
				if f := w.opt.batchRecords; f != nil {
					k := f(w, p, r)
					if k == 0 {
						break // the test starts none now
					}
					if k > 0 {
						n = k
					}
				}
				b = &inflight{seq: p.nextSeq[r], target: 1 + w.rng.IntN(w.opt.Nodes)}
				for i := 0; i < n; i++ {
					b.values = append(b.values, w.splits.name(p, r, b.seq+uint64(i))) // children.go
				}
				p.batch[r] = b
				w.sendRequest(p, r, b)
			case b != nil && w.now-b.sentAt > replyTimeout:
				// No answer: the request, its reply or the node was lost.
				// Resend the same batch, same sequence, anywhere.
				w.res.Retries++
				to := 1 + w.rng.IntN(w.perRegion)
				if w.moves.on && b.hinted {
					// With moves the leader may be on a node that joined:
					// the producer resends where the hint said, once.
					to = b.target
				}
				b.target, b.hinted = to, false
				w.sendRequest(p, r, b)
			}
		}
	}
}

func (w *world) sendRequest(p *producer, r int, b *inflight) {
	b.attempt++
	b.sentAt = w.now
	if w.rng.Float64() < w.dropP {
		w.res.Dropped++
		return
	}
	w.push(&event{at: w.now + 1 + w.rng.Int64N(3), kind: evRequest, producer: p.id, rng: r, to: b.target, attempt: b.attempt})
}

// request delivers a producer's batch to a node's replica.
func (w *world) request(e *event) {
	p := w.prods[e.producer-1]
	b := p.batch[e.rng]
	n := w.node(p.home[e.rng], e.to)
	pid := p.pid(e.rng)
	if b == nil || !n.up || w.cut(0, n.id) {
		return
	}
	recs := make([]batch.Record, len(b.values))
	key := "p" + strconv.Itoa(pid)
	for i, v := range b.values {
		recs[i] = batch.Record{Key: []byte(key), Value: []byte(v)}
	}
	h := batch.Header{Type: batch.TypeData, ProducerID: uint64(pid), BaseSequence: b.seq}
	seq, values := b.seq, b.values
	gen := n.gen
	frame := batch.Encode(nil, h, recs)
	w.proposeGated(n, e.rng, &gateOp{ // gate.go
		refuse: func(err error) {
			w.push(&event{at: w.now + 1 + w.rng.Int64N(3), kind: evReply, producer: p.id, pid: pid, rng: e.rng,
				batchSeq: seq, count: len(values), res: replica.Result{Err: err}})
		},
		propose: func(epoch uint64) {
			n.replicas[e.rng].Propose(&replica.Op{
				ProducerID: uint64(pid), BaseSequence: seq, RecordCount: uint32(len(values)), Epoch: epoch,
				Frame: frame,
				Reply: func(res replica.Result) {
					if res.Err == nil && n.up && n.gen == gen {
						res.Err = w.ackable(n, e.rng, res, epoch)
					}
					if res.Err == nil && !res.Duplicate && n.replicas[e.rng].Committed() < res.BaseOffset+uint64(res.RecordCount) {
						w.res.AckedAhead++
					}
					w.ack(n, e.rng, gen, func() { // at the Ready cycle's end (driver.go)
						if w.rng.Float64() < w.lostReplyP {
							w.res.LostReplies++ // an ambiguous ack: committed, but the producer never hears
							return
						}
						w.push(&event{at: w.now + 1 + w.rng.Int64N(3), kind: evReply, producer: p.id, pid: pid, rng: e.rng,
							batchSeq: seq, count: len(values), values: values, res: res})
					})
				},
			})
		},
	})
}

// admit is the lease check before a home node proposes (homing.go): the
// epoch to propose at (0: the replica's own, without homing).
func (w *world) admit(n *node, r int) (uint64, error) {
	if w.homing == nil || w.mutateNoLease {
		return 0, nil
	}
	return w.homing.admit(n, r)
}

// ackable is the lease check before a node acks res (homing.go), then
// the check of the ack against the store's truth (which fails the run).
func (w *world) ackable(n *node, r int, res replica.Result, epoch uint64) error {
	if err := w.moves.ackable(n, r, res); err != nil && w.err == nil {
		w.err = err
	}
	if w.homing == nil {
		return nil
	}
	if w.mutateNoLease {
		// A home that acks without its lease (a test's mutation).
	} else if err := w.homing.ackable(n, r, epoch, res.Duplicate); err != nil {
		return err
	}
	if err := w.homing.checkAck(n, r, res.Epoch, res.Duplicate); err != nil && w.err == nil {
		w.err = err
	}
	return nil
}

// reply delivers a node's answer to the producer.
func (w *world) reply(e *event) {
	p := w.prods[e.producer-1]
	seq := e.batchSeq
	if e.res.Err != nil {
		if b := p.batch[e.rng]; b != nil && b.seq == seq && e.pid == p.pid(e.rng) && w.splits.refused(p, e.rng, e.res.Err) {
			return // split.go: the batch is given up
		}
		if !rpcerr.IsRetriable(e.res.Err) {
			w.err = fmt.Errorf("producer %d range %d seq %d: final error %v", p.id, e.rng, seq, e.res.Err)
			return
		}
		b := p.batch[e.rng]
		if b == nil || b.seq != seq || e.pid != p.pid(e.rng) {
			return
		}
		if w.homing != nil && w.rng.IntN(2) == 0 {
			p.home[e.rng] = w.homeRegion(e.rng) // it describes the stream again
		}
		if hint := apierr.As(e.res.Err).LeaderHint; strings.HasPrefix(hint, "node:") {
			if id, err := strconv.Atoi(strings.TrimPrefix(hint, "node:")); err == nil && id >= 1 && id <= w.perRegion {
				b.target, b.hinted = id, true
			}
		}
		b.sentAt = w.now - replyTimeout + 5 + w.rng.Int64N(20) // retry soon
		return
	}
	if e.res.Duplicate {
		w.res.Duplicates++
	}
	// Record the ack: every record of the batch at its offset.
	for i := 0; i < e.count; i++ {
		v := recordName(e.pid, e.rng, seq+uint64(i))
		if w.splits.child(e.rng) {
			v = e.values[i] // a split child's records are named in the parent (children.go)
		}
		off := e.res.BaseOffset + uint64(i)
		if e.pid != p.pid(e.rng) && off >= w.homing.epochStart(e.rng, e.res.Epoch) {
			w.homing.orphan(e.rng, off, v, e.res.Epoch) // acked before a takeover, heard after it
			continue
		}
		if prev, ok := w.acked[e.rng][off]; ok && prev != v {
			w.err = fmt.Errorf("range %d offset %d acked as %q and as %q", e.rng, off, prev, v)
			return
		}
		w.noteAcked(e.rng, off, v)
		if err := w.splits.ack(e.rng, off, v); err != nil {
			w.err = err
			return
		}
		if int(off) < len(w.canonical[e.rng]) && w.canonical[e.rng][off] != v {
			w.err = fmt.Errorf("range %d offset %d acked as %q but committed as %q", e.rng, off, v, w.canonical[e.rng][off])
			return
		}
	}
	if b := p.batch[e.rng]; b != nil && b.seq == seq && e.pid == p.pid(e.rng) {
		w.res.Acked += len(b.values)
		p.nextSeq[e.rng] = seq + uint64(len(b.values))
		p.batch[e.rng] = nil
	}
}

func (w *world) busy() bool {
	if w.homing != nil && w.homing.busy() {
		return true // a replica replacement under way (replace.go)
	}
	if w.moves.busy() {
		return true // moves under way (moves.go)
	}
	if w.splits.busy() {
		return true // batches refused by a split, waiting for its children (children.go)
	}
	for _, p := range w.prods {
		for _, b := range p.batch {
			if b != nil {
				return true
			}
		}
	}
	return false
}

// check reads what every live replica newly committed and holds it against
// the canonical log: one record per offset everywhere (invariant 2), acked
// records where they were acked (1), per producer sequence order = offset
// order (3), each (producer, sequence) at most once (4); and no node
// publishes less than it published before, across crashes too (8: the
// region has no forks). A mirror region's replicas hold the home's frames
// at the home's offsets (checkMirror).
func (w *world) check() error {
	if w.orphanLogs != nil {
		w.noteEpochs()
	}
	for _, n := range w.nodes {
		if !n.up {
			continue
		}
		for r, rep := range n.replicas {
			committed, highest := rep.Committed(), rep.HighestEpoch()
			// A fork raises the replica's highest epoch to the fork's:
			// none was applied since noteForks last looked if it is not
			// above the last fork's, nor if its orphan store holds none
			// of a higher epoch (noteForks looks at those only).
			if w.homing != nil && highest > n.forkEpoch[r] && n.orphans[r].MaxEpoch() > n.forkEpoch[r] {
				before, served := n.forkEpoch[r], n.served[r]
				if err := w.homing.noteForks(n, r); err != nil {
					return err
				}
				if n.forkEpoch[r] > before {
					if err := w.checkForks(n, r, before, served); err != nil {
						return err
					}
				}
			}
			if w.homing != nil && w.homing.cutting(n, r, committed) {
				continue // a fork recorded, its cut not published yet
			}
			n.logStart[r] = max(n.logStart[r], n.stores[r].StartOffset())
			// A replica relearning its commit index after the machine's
			// crash serves no reader (replica's relearn.go): held to what
			// it published before once it has relearned.
			if !rep.Relearning() {
				if committed < n.served[r] {
					return fmt.Errorf("%v range %d: publishes a committed end of %d, below the %d it published before (invariant 8)", n, r, committed, n.served[r])
				}
				n.served[r] = committed
			}
			if e := highest; e < n.epochs[r] {
				return fmt.Errorf("%v range %d: holds homing epoch %d, below the %d it held before (epochs never go back)", n, r, e, n.epochs[r])
			} else {
				n.epochs[r] = e
			}
			// What compaction or a snapshot took from this replica was
			// checked elsewhere (or here) when it committed: agreement is
			// on what the replicas retain.
			n.verified[r] = max(n.verified[r], n.stores[r].StartOffset())
			var err error
			// A divergent tail, not forked off yet: below the fork point it
			// was checked. A mirror's, or a home replica's that has not
			// applied the fork its region's Raft log already holds (seed
			// 300223 of the three-region minute runs: a follower of the
			// region that took over at epoch 7 still held epoch 5's tail
			// past epoch 6's fork point, the fork entry not yet applied).
			// The fork holds back the home's appends until applied, so
			// no newer epoch's frame may sit on that tail (checkStaleTail).
			if w.geo != nil && w.stale(n, r) {
				if err := w.checkStaleTail(n, r, committed); err != nil {
					return err
				}
				continue
			}
			if n.region == w.homeRegion(r) {
				w.homeCommitted[r] = max(w.homeCommitted[r], committed)
				err = w.checkHome(n, r, committed)
			} else {
				err = w.checkMirror(n, r, committed)
			}
			if err != nil {
				return err
			}
		}
	}
	if w.orphanLogs != nil {
		w.keepCanon()
	}
	return nil
}

// checkHome canonizes what a home replica committed past what was
// verified, and keeps its frames as the ones every mirror must hold.
func (w *world) checkHome(n *node, r int, committed uint64) error {
	if w.geo == nil && n.verified[r] > uint64(len(w.canonical[r])) {
		// Its log starts past the log the checks know: retention deleted
		// records it applied before it published them committed (a
		// leader applies what its followers committed before its own
		// write; seed 358 of one region: the leader's log started at 203
		// while its committed end was 202). The other replicas tell
		// them; this one is read once the log reaches its start. (With
		// regions not done: a broken variant's test expects the error
		// this gives, TestDivergentTakerIsChecked.)
		return nil
	}
	for n.verified[r] < committed {
		from := n.verified[r]
		frames, err := n.stores[r].ReadFrames(from, 1<<20, committed)
		if err != nil {
			return fmt.Errorf("%v range %d: read committed [%d, %d): %w", n, r, from, committed, err)
		}
		if len(frames) == 0 {
			return fmt.Errorf("%v range %d: committed %d but nothing readable at %d", n, r, committed, from)
		}
		for len(frames) > 0 {
			size, err := batch.FrameSize(frames)
			if err != nil {
				return err
			}
			frame := frames[:size]
			h, recs, err := batch.Decode(frame)
			frames = frames[size:]
			if err != nil {
				return err
			}
			if marker, err := w.splits.frame(n, r, h); err != nil {
				return err
			} else if marker {
				n.verified[r] = max(n.verified[r], h.BaseOffset+1)
			}
			if h.Type != batch.TypeData {
				continue
			}
			if err := w.canonFrame(n, r, h.BaseOffset, frame); err != nil {
				return err
			}
			for i, rec := range recs {
				off := h.Offset(&recs[i])
				if off < n.verified[r] || off >= committed {
					continue
				}
				var v string
				if canon := w.canonical[r]; off < uint64(len(canon)) && canon[off] == string(rec.Value) {
					v = canon[off] // the same value, without a copy: most records are checked again
				} else {
					v = string(rec.Value)
				}
				if err := w.canonize(r, off, v); err != nil {
					return fmt.Errorf("%v: %w", n, err)
				}
				n.verified[r] = off + 1
			}
		}
	}
	return nil
}

// canonFrame records the home's frame at base, or holds it against the
// one recorded: the home's replicas hold the same frames (but for the
// Raft fields).
func (w *world) canonFrame(n *node, r int, base uint64, frame []byte) error {
	if w.geo == nil {
		return nil
	}
	prev, ok := w.canonFrames[r][base]
	if !ok {
		w.canonFrames[r][base] = append([]byte(nil), frame...)
		return w.epochOrder(n, r, base, frame)
	}
	if !replicator.SameData(prev, frame) {
		return fmt.Errorf("%v range %d: frame at %d differs from the one another home replica committed", n, r, base)
	}
	return nil
}

// epochOrder: along the home's log, homing epochs never go back.
func (w *world) epochOrder(n *node, r int, base uint64, frame []byte) error {
	h, err := batch.DecodeHeader(frame)
	if err != nil {
		return err
	}
	if w.homing != nil {
		if home := w.homing.homes[r]; base >= home.StartOffset && h.Epoch < home.Epoch && w.homing.taken(r) && w.homing.startConfirmed(r, home.Epoch) {
			return fmt.Errorf("%v range %d: the home's frame at %d has epoch %d, past the start %d of epoch %d", n, r, base, h.Epoch, home.StartOffset, home.Epoch)
		}
	}
	last := &w.lastEpoch[r]
	if base < last.base {
		return nil
	}
	if h.Epoch < last.epoch {
		return fmt.Errorf("%v range %d: the home's frame at %d has epoch %d, after epoch %d at %d (epochs never go back)", n, r, base, h.Epoch, last.epoch, last.base)
	}
	*last = baseEpoch{base: base, epoch: h.Epoch}
	return nil
}

func (w *world) canonize(r int, off uint64, v string) error {
	if w.splits.child(r) {
		return w.splits.canonizeChild(r, off, v) // children.go
	}
	canon := w.canonical[r]
	if err := w.splits.canonize(r, off, v); err != nil {
		return err
	}
	if off < uint64(len(canon)) {
		if canon[off] != v {
			return fmt.Errorf("range %d offset %d: committed %q here, %q elsewhere", r, off, v, canon[off])
		}
		return nil
	}
	if off != uint64(len(canon)) {
		return fmt.Errorf("range %d: committed offset %d after %d: a gap", r, off, len(canon))
	}
	if prev, ok := w.seen[r][v]; ok {
		return fmt.Errorf("range %d: %q committed twice, at %d and %d", r, v, prev, off)
	}
	var pid int
	var seq int64
	var rr int
	if err := scanRecord(v, &pid, &rr, &seq); err != nil || rr != r {
		return fmt.Errorf("range %d offset %d: foreign record %q", r, off, v)
	}
	if last, ok := w.lastSeq[r][pid]; ok && seq != last+1 {
		return fmt.Errorf("range %d offset %d: producer %d sequence %d after %d", r, off, pid, seq, last)
	}
	if a, ok := w.acked[r][off]; ok && a != v {
		return fmt.Errorf("range %d offset %d: acked %q, committed %q", r, off, a, v)
	}
	w.lastSeq[r][pid] = seq
	w.seen[r][v] = off
	w.canonical[r] = append(canon, v)
	return nil
}

// finalCheck runs the healed region a little longer, then requires every
// replica to have committed the same log, holding every acked record, and
// every mirror to have caught up with it (given up to mirrorSettleMsMax
// more: a cursor may be in a backoff of up to 5 s).
func (w *world) finalCheck() error {
	for i := 0; i < 2000 && w.err == nil; i++ {
		w.step()
		w.now++
	}
	for i := 0; w.geo != nil && i < mirrorSettleMsMax && w.err == nil && !w.mirrorsCaughtUp(); i++ {
		w.step()
		w.now++
	}
	if w.err != nil {
		return w.err
	}
	for r := range w.canonical {
		lost, first := 0, uint64(0)
		for off, v := range w.acked[r] {
			if off >= uint64(len(w.canonical[r])) || w.canonical[r][off] != v {
				if lost++; lost == 1 || off < first {
					first = off
				}
			}
		}
		if lost > 0 {
			return fmt.Errorf("range %d: acked %q at %d is lost (%d acked records lost; the log has %d)", r, w.acked[r][first], first, lost, len(w.canonical[r]))
		}
		for _, n := range w.regionNodes(w.homeRegion(r)) {
			if !w.moves.member(r, uint64(n.id)) {
				continue // removed: it keeps what it had (moves.go)
			}
			if c := n.replicas[r].Committed(); c != w.splits.end(r) {
				return fmt.Errorf("range %d: node %d committed %d, the log has %d", r, n.id, c, w.splits.end(r))
			}
		}
	}
	if w.moves.on {
		if err := w.moves.final(); err != nil {
			return err
		}
	}
	if err := w.splits.final(); err != nil {
		return err
	}
	if w.geo != nil {
		if err := w.homing.finalTaken(); err != nil {
			return err
		}
		if err := w.finalOrphans(); err != nil {
			return err
		}
		return w.finalMirrors()
	}
	return nil
}

// noteAcked records that v was acked at offset off of range r.
func (w *world) noteAcked(r int, off uint64, v string) {
	w.acked[r][off] = v
	if w.ackedEnds[r] >= 0 {
		w.ackedEnds[r] = max(w.ackedEnds[r], int64(off)+1)
	}
}

// unack forgets the record acked at off of range r (it is counted in an
// orphan log instead).
func (w *world) unack(r int, off uint64) {
	delete(w.acked[r], off)
	w.ackedEnds[r] = -1
}

// ackedEnd is the end of what is acked in range r: one past the highest
// offset acked, 0 if none.
func (w *world) ackedEnd(r int) uint64 {
	if w.ackedEnds[r] < 0 {
		end := uint64(0)
		for off := range w.acked[r] {
			end = max(end, off+1)
		}
		w.ackedEnds[r] = int64(end)
	}
	return uint64(w.ackedEnds[r])
}

// recordName names the record of producer pid's sequence seq in range r
// ("p<pid>/r<r>/s<seq>", as fmt's %d writes them).
func recordName(pid, r int, seq uint64) string {
	b := make([]byte, 0, 24)
	b = append(b, 'p')
	b = strconv.AppendInt(b, int64(pid), 10)
	b = append(b, '/', 'r')
	b = strconv.AppendInt(b, int64(r), 10)
	b = append(b, '/', 's')
	b = strconv.AppendUint(b, seq, 10)
	return string(b)
}

// scanRecord is fmt.Sscanf(v, "p%d/r%d/s%d", pid, r, seq) (seq an *int64
// or *uint64), without fmt's scanner for the names recordName writes:
// nothing but "p", "/r" and "/s" each before up to 18 decimal digits
// that do not start with a zero unless alone. Anything else (a record a
// test tampered with) goes to Sscanf, so the answer is fmt's.
func scanRecord(v string, pid, r *int, seq any) error {
	if p, rr, s, ok := parseRecordName(v); ok {
		switch q := seq.(type) {
		case *int64:
			*pid, *r, *q = int(p), int(rr), int64(s)
			return nil
		case *uint64:
			*pid, *r, *q = int(p), int(rr), s
			return nil
		}
	}
	_, err := fmt.Sscanf(v, "p%d/r%d/s%d", pid, r, seq)
	return err
}

// parseRecordName reads v as recordName wrote it (see scanRecord).
func parseRecordName(v string) (pid, r, seq uint64, ok bool) {
	var nums [3]uint64
	for i, tag := range [3]string{"p", "/r", "/s"} {
		rest, found := strings.CutPrefix(v, tag)
		if !found {
			return 0, 0, 0, false
		}
		d := 0
		for d < len(rest) && rest[d] >= '0' && rest[d] <= '9' {
			d++
		}
		if d == 0 || d > 18 || (d > 1 && rest[0] == '0') {
			return 0, 0, 0, false
		}
		n, err := strconv.ParseUint(rest[:d], 10, 64)
		if err != nil {
			return 0, 0, 0, false
		}
		nums[i], v = n, rest[d:]
	}
	if v != "" {
		return 0, 0, 0, false
	}
	return nums[0], nums[1], nums[2], true
}
