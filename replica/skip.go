package replica

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
)

// Skips: a mirror's log jumping to its home's log start.
//
// A mirror range whose applied end E lies below its home's log start S
// (the home's retention deleted what the mirror never received: the
// mirror hold was released, regionsvc/mirrorhold.go) cannot catch up by
// copying; it skips what expired, as retention would have deleted it
// there too. ProposeSkip has the leader propose a skip entry ("skip to
// S"), and every replica, when it applies the entry, deterministically
// moves the log's start and end to S: the log becomes the skip frame
// alone, at offset S, then the control entries after it (as a reset fork
// leaves it, fork.go, but orphaning nothing and raising no epoch: the
// records below S are a prefix of the range's log, deleted, not a
// divergent tail). In order:
//
//  1. saves its state with HardState.Forking (ForkMeta.Skip set): the
//     skip's record, an empty producer base and the frames from the skip
//     entry on, rewritten to continue at S;
//  2. replaces its log with those frames (every segment deleted);
//  3. saves its state with the skip entry as the compaction point
//     (SnapshotNextOffset S), the empty producer base, and Forking
//     cleared.
//
// A crash before step 1 leaves the state before the skip: Raft applies
// the entry again. A crash after it is completed by New from the state
// before Raft starts (completeFork: the log is the old one, or the new
// one). After the skip the log's start, next and committed offsets are S
// (readers below S get OFFSET_OUT_OF_RANGE with start S, as below any
// log's start), and the idempotence table is empty: every batch it knew
// was below S. A snapshot taken after it is the skip entry's (start S),
// so a replica that missed the skip installs the same log.
//
// A skip frame is a fork frame (batch.TypeFork) whose payload carries its
// own magic (skipDescMagic): the log, the segment store and Raft's
// checks (peercheck.go) treat it as one, so that the rules that keep a
// fork's offsets sound hold for it too: a leader takes no appends while a
// skip is proposed or unapplied in its log, and a follower holds back a
// data entry that follows one (holdBackAfterFork).

// ErrSkipInvalid reports a skip entry whose payload does not decode.
var ErrSkipInvalid = errors.New("replica: malformed skip entry")

const (
	skipDescMagic   = "GLSK"
	skipDescVersion = 1
	skipDescBytes   = batch.ForkPrevIndexBytes + len(skipDescMagic) + 1 + 4*8
)

// skipDesc is a skip frame's payload: PrevIndex (u64, always 0: the skip
// frame either follows its predecessor, as proposed, or starts the log),
// magic "GLSK", version (u8), then At, Proposer, ProposalTerm and
// ProposalSeq (u64 each), little-endian.
type skipDesc struct {
	// At is the offset the log skips to.
	At uint64
	// Proposer, ProposalTerm and ProposalSeq name the proposal, so that
	// its proposer recognises it when it applies.
	Proposer, ProposalTerm, ProposalSeq uint64
}

func (d skipDesc) encode() []byte {
	b := make([]byte, 0, skipDescBytes)
	b = binary.LittleEndian.AppendUint64(b, 0)
	b = append(b, skipDescMagic...)
	b = append(b, skipDescVersion)
	for _, v := range []uint64{d.At, d.Proposer, d.ProposalTerm, d.ProposalSeq} {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return b
}

// isSkipPayload reports whether a fork frame's payload carries the skip
// magic (decodeSkipDesc checks the rest).
func isSkipPayload(b []byte) bool {
	const magicAt = batch.ForkPrevIndexBytes
	return len(b) >= magicAt+len(skipDescMagic) && string(b[magicAt:magicAt+len(skipDescMagic)]) == skipDescMagic
}

// decodeSkipDesc decodes a skip frame's payload; errors wrap
// ErrSkipInvalid.
func decodeSkipDesc(b []byte) (skipDesc, error) {
	const magicAt = batch.ForkPrevIndexBytes
	if len(b) != skipDescBytes || !isSkipPayload(b) {
		return skipDesc{}, fmt.Errorf("%w: payload of %d bytes", ErrSkipInvalid, len(b))
	}
	if v := b[magicAt+len(skipDescMagic)]; v != skipDescVersion {
		return skipDesc{}, fmt.Errorf("%w: version %d, want %d", ErrSkipInvalid, v, skipDescVersion)
	}
	if prev := binary.LittleEndian.Uint64(b); prev != 0 {
		return skipDesc{}, fmt.Errorf("%w: names index %d before it", ErrSkipInvalid, prev)
	}
	u := func(i int) uint64 { return binary.LittleEndian.Uint64(b[magicAt+len(skipDescMagic)+1+8*i:]) }
	return skipDesc{At: u(0), Proposer: u(1), ProposalTerm: u(2), ProposalSeq: u(3)}, nil
}

// SkipResult is the outcome of ProposeSkip: the skip entry's Raft index
// and the offset the log now starts and continues at, or Err.
type SkipResult struct {
	Index, At uint64
	Err       error
}

// skipProposal is a skip proposed by this replica and not yet applied.
type skipProposal struct {
	term, seq uint64
	reply     func(SkipResult)
}

// ProposeSkip proposes, on the leader, to move the range's log start and
// end to offset at (see the top of this file): every replica deletes its
// log and continues, empty, at at. For a mirror whose home's log start
// passed its end; the caller (the replicator's server, through regionsvc)
// has checked that the home's start is at, and above the mirror's end.
// reply is called on the driver goroutine, from a later ProcessReady or
// at once; a skip to the committed tail (a repeat of one applied) is
// answered at once with Index 0.
//
// Errors: NOT_LEADER (retriable) on a follower; UNAVAILABLE (retriable)
// while appends are in flight or a fork or skip is in progress;
// INVALID_ARGUMENT, with the log's bounds, for an offset below the
// committed tail (a skip never moves a log backwards). Nothing changes on
// an error. While the skip is pending, Propose and ProposeVerbatim fail
// with a retriable UNAVAILABLE.
func (r *Replica) ProposeSkip(at uint64, reply func(SkipResult)) {
	fail := func(e *apierr.Error) { reply(SkipResult{Err: e}) }
	name := func() string { return fmt.Sprintf("stream %s range %d", r.cfg.Stream, r.cfg.Range) }
	if f := r.failure.Load(); f != nil {
		fail(f)
		return
	}
	if !r.isLeader {
		fail(r.notLeader())
		return
	}
	if r.forkPending() {
		fail(apierr.New(apierr.Unavailable, "%s: a fork or skip is in progress", name()))
		return
	}
	tail := r.appliedEnd
	if r.proposeNext != tail || len(r.proposals) > 0 {
		fail(apierr.New(apierr.Unavailable, "%s: appends are in flight (log continues at %d, committed %d)", name(), r.proposeNext, tail))
		return
	}
	switch {
	case at == tail:
		reply(SkipResult{At: at})
		return
	case at < tail:
		e := apierr.New(apierr.InvalidArgument, "%s: skip to offset %d below the committed tail %d", name(), at, tail)
		e.StartOffset, e.TailOffset = r.cfg.Log.StartOffset(), tail
		fail(e)
		return
	}
	r.fork.seq++
	d := skipDesc{At: at, Proposer: r.cfg.NodeID, ProposalTerm: r.term, ProposalSeq: r.fork.seq}
	frame := batch.EncodeControl(nil, batch.Header{Type: batch.TypeFork, BaseOffset: tail, Epoch: r.HighestEpoch(),
		AppendTimeUnixNanos: r.logAppendUnixNanos}, d.encode())
	if err := r.rn.Propose(frame); err != nil {
		e := r.notLeader()
		e.Message += ": " + err.Error()
		fail(e)
		return
	}
	r.fork.skip = &skipProposal{term: r.term, seq: d.ProposalSeq, reply: reply}
	r.logger.Info("proposed skip", "at", at, "tail", tail)
}

// applySkip applies the committed skip entry at index (header h, payload
// d): see the top of this file. A skip that does not move the log forward
// is refused alike on every replica (the log before the entry is the same
// everywhere) and changes nothing.
func (r *Replica) applySkip(index, term uint64, h batch.Header, payload []byte) error {
	d, err := decodeSkipDesc(payload)
	if err != nil {
		return fmt.Errorf("replica: committed skip entry %d: %w", index, err)
	}
	r.fork.dropUnapplied(index)
	res, err := r.skipLog(index, term, h, d)
	if err != nil {
		return err
	}
	if p := r.fork.skip; p != nil && d.Proposer == r.cfg.NodeID && d.ProposalTerm == p.term && d.ProposalSeq == p.seq {
		r.fork.skip = nil
		p.reply(res)
	}
	return nil
}

// skipLog carries out the skip entry at index: steps 1 to 3 at the top of
// this file.
func (r *Replica) skipLog(index, term uint64, h batch.Header, d skipDesc) (SkipResult, error) {
	tail := h.BaseOffset // the log's next offset before the skip entry
	if d.At <= tail {
		e := apierr.New(apierr.InvalidArgument, "stream %s range %d: skip to offset %d, not past the tail %d", r.cfg.Stream, r.cfg.Range, d.At, tail)
		r.logger.Warn("refused a skip entry", "index", index, "at", d.At, "tail", tail)
		return SkipResult{Err: e}, nil
	}
	// The log changes under the writer's feet: drain it and hold it off,
	// as for a fork.
	r.writer.wmu.Lock()
	defer r.writer.wmu.Unlock()
	if err := r.writeQueued(); err != nil {
		return SkipResult{}, err
	}
	fh := h
	fh.BaseOffset, fh.Term, fh.Index = d.At, term, index
	tailFrames, err := r.entriesAfter(index, batch.EncodeControl(nil, fh, d.encode()), d.At, fh.AppendTimeUnixNanos)
	if err != nil {
		return SkipResult{}, err
	}
	base := newProducerBase() // every batch it knew lies below the skip
	m := &ForkMeta{Skip: true, Reset: true, Producers: base.encode(), Tail: tailFrames,
		Record: ForkRecord{Index: index, Term: term, At: d.At, Epoch: h.Epoch, TimeUnixNanos: h.AppendTimeUnixNanos,
			FirstOffset: tail, NextOffset: d.At}}
	// The frames deleted carried epochs that fence appends: they count
	// as compacted ones (a restart then still knows them).
	r.state.CompactedEpoch = max(r.state.CompactedEpoch, r.fork.epoch.Load())
	if err := r.cutAtFork(m, base, index, d.At); err != nil {
		return SkipResult{}, err
	}
	r.logger.Info("applied skip", "index", index, "at", d.At, "from", tail)
	return SkipResult{Index: index, At: d.At}, nil
}

// failSkip answers this replica's skip proposal with err.
func (r *Replica) failSkip(err error) {
	if p := r.fork.skip; p != nil {
		r.fork.skip = nil
		p.reply(SkipResult{Err: err})
	}
}
