package replica

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sync/atomic"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Forks: a range's log after a failover.
//
// When another region took the range's home at a higher epoch, it
// continued at its own tail F; the records this log holds at offsets >= F
// (an old home's, or a mirror's that was further ahead) are a divergent
// tail that the new home never had. ProposeFork moves them out: the leader
// proposes a fork entry ("fork at F, epoch E"), and every replica, when it
// applies the entry, deterministically
//
//  1. copies every data frame at offsets >= F (all below the fork entry,
//     hence committed) into its orphan log (orphans.go), fsynced;
//  2. saves its state with HardState.Forking: the fork's record, the
//     producer base as of F, and the frames from the fork entry on,
//     rewritten to continue at F (the fork frame first; the others are
//     control frames, see below);
//  3. truncates its log after the last entry before F (PrevIndex) and
//     appends those frames: the fork frame, at the fork entry's index,
//     follows a gap in Raft indexes that its payload describes (see
//     batch.TypeFork and package segment), so the log says itself where
//     entries went;
//  4. saves its state with the fork entry as the compaction point (Raft
//     sees the log start after it: a follower that needs the missing
//     entries gets a snapshot, which carries the retained prefix, the gap,
//     and the orphan log), the producer base as of F, and Forking cleared.
//
// A crash before step 2 leaves the pre-fork state: Raft applies the entry
// again, and step 1 finds the fork in the orphan log and writes nothing
// (a fork is never orphaned twice). A crash after step 2 is completed by
// New from the state before Raft starts (the log is then a prefix of the
// pre-fork log, or holds a prefix of the rewritten frames). After the
// fork the log's next offset is F, the committed offset falls back to F
// (readers of offsets >= F see the new home's records from then on), the
// idempotence table is as of F, and HighestEpoch is at least E.
//
// The frames after the fork entry that step 2 rewrites can only be
// control frames: a leader takes no appends while a fork is proposed or in
// its log unapplied (their offsets would depend on it), and a follower
// holds back a data entry that follows a fork entry it has not applied
// (holdBackAfterFork): the leader sends it again once it has.

// ErrForkInvalid reports a fork entry whose payload does not decode.
var ErrForkInvalid = errors.New("replica: malformed fork entry")

const (
	forkDescMagic   = "GLFK"
	forkDescVersion = 1
	forkDescBytes   = batch.ForkPrevIndexBytes + len(forkDescMagic) + 1 + 5*8
	// forkTailBytesMax bounds the frames between a fork entry and its apply
	// that the state records while the fork truncates the log (control
	// frames of leader changes, a few dozen bytes each).
	forkTailBytesMax = 1 << 20
)

// forkDesc is a fork frame's payload: PrevIndex (u64, see
// batch.ForkPrevIndex), magic "GLFK", version (u8), then At, KeepIndex,
// Proposer, ProposalTerm and ProposalSeq (u64 each), little-endian.
type forkDesc struct {
	// PrevIndex is 0 as proposed (the frame follows its predecessor) and
	// KeepIndex once the fork is applied and the frame ends the gap.
	PrevIndex uint64
	// At is the fork offset; KeepIndex the last entry to keep: the entry
	// holding offset At-1, or the compaction point if At is where it
	// ends (the proposer decides, so every replica cuts at the same entry
	// whatever it compacted).
	At, KeepIndex uint64
	// Proposer, ProposalTerm and ProposalSeq name the proposal, so that
	// its proposer recognises it when it applies.
	Proposer, ProposalTerm, ProposalSeq uint64
}

func (d forkDesc) encode() []byte {
	b := make([]byte, 0, forkDescBytes)
	b = binary.LittleEndian.AppendUint64(b, d.PrevIndex)
	b = append(b, forkDescMagic...)
	b = append(b, forkDescVersion)
	for _, v := range []uint64{d.At, d.KeepIndex, d.Proposer, d.ProposalTerm, d.ProposalSeq} {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return b
}

// decodeForkDesc decodes a fork frame's payload; errors wrap
// ErrForkInvalid.
func decodeForkDesc(b []byte) (forkDesc, error) {
	const magicAt = batch.ForkPrevIndexBytes
	if len(b) != forkDescBytes || string(b[magicAt:magicAt+len(forkDescMagic)]) != forkDescMagic {
		return forkDesc{}, fmt.Errorf("%w: payload of %d bytes", ErrForkInvalid, len(b))
	}
	if v := b[magicAt+len(forkDescMagic)]; v != forkDescVersion {
		return forkDesc{}, fmt.Errorf("%w: version %d, want %d", ErrForkInvalid, v, forkDescVersion)
	}
	u := func(i int) uint64 { return binary.LittleEndian.Uint64(b[magicAt+len(forkDescMagic)+1+8*i:]) }
	d := forkDesc{PrevIndex: binary.LittleEndian.Uint64(b), At: u(0), KeepIndex: u(1), Proposer: u(2), ProposalTerm: u(3), ProposalSeq: u(4)}
	if d.PrevIndex != 0 && d.PrevIndex != d.KeepIndex {
		return forkDesc{}, fmt.Errorf("%w: follows index %d but keeps %d", ErrForkInvalid, d.PrevIndex, d.KeepIndex)
	}
	return d, nil
}

// ForkMeta is a fork whose truncation of the log is under way
// (HardState.Forking): what the log and the state become.
type ForkMeta struct {
	// Record is the fork, as the orphan log holds it.
	Record ForkRecord
	// Reset is set when this replica retains no entry up to
	// Record.PrevIndex (retention deleted them): the log is replaced by
	// Tail, at Record.At, instead of truncated.
	Reset bool
	// Producers is the producer base as of Record.At, encoded.
	Producers []byte
	// Tail is the frames from the fork entry on, rewritten to continue at
	// Record.At: the fork frame, then the control frames after it.
	Tail [][]byte
	// Skip says the entry is a skip (skip.go), not a fork: Record is not
	// in the orphan log, and Reset is set.
	Skip bool
}

// ForkResult is the outcome of ProposeFork: the fork as recorded (see
// ForkRecord: where, at which epoch, what was orphaned), or Err.
type ForkResult struct {
	ForkRecord
	Err error
}

// forkProposal is a fork proposed by this replica and not yet applied.
type forkProposal struct {
	term, seq uint64
	reply     func(ForkResult)
}

// forkState is a replica's fork bookkeeping (driver goroutine but epoch).
type forkState struct {
	proposal *forkProposal
	// skip is a skip proposed here and not applied (skip.go); seq numbers
	// both kinds of proposal.
	skip *skipProposal
	seq  uint64
	// unapplied holds the indexes of fork entries in the log (as Raft sees
	// it) that are not applied here.
	unapplied []uint64
	// epoch is the highest epoch of a data frame seen in the log; starts
	// is where the epochs seen start at the latest (epochstarts.go).
	epoch  atomic.Uint64
	starts epochStarts
	// recovered says New completed a fork's truncation.
	recovered bool
}

// ProposeFork proposes, on the leader, to fork the range's log at offset
// at and raise its epoch to epoch (see the top of this file): every
// replica moves the records at offsets >= at into its orphan log, and the
// log continues at at. reply gets the fork's record once the fork is
// applied here, or an error, and is called on the driver goroutine (from
// a later ProcessReady, or at once). A fork at the committed tail orphans
// nothing and only raises the epoch; one repeating the last fork (same at
// and epoch, nothing appended since) is answered at once with its record.
//
// A fork below what the log retains here (at at or below its start
// offset, and below the compaction point) resets the log: every replica
// orphans what it holds at offsets >= at and drops the rest (what it
// retains below at, which retention deleted on the proposer already), and
// the log continues, empty, at at. A fork below the compaction point but
// past the log's start (a log installed from a snapshot retains frames
// below its compaction point) keeps what lies below at, as any other. The caller
// asserts that nothing the log holds from at on is the range's: a mirror
// whose every frame is of an older epoch than a new home's batch from at
// (replicator.Forker, notes/simgaps.md P1).
//
// Errors: NOT_LEADER (retriable) on a follower; UNAVAILABLE (retriable)
// while appends are in flight or another fork is in progress; OFFSET_OUT_OF_RANGE
// for at past the committed tail and INVALID_ARGUMENT for an at
// inside a batch, both with the log's bounds; STALE_EPOCH for an epoch
// below HighestEpoch (or equal to it, with records to orphan); INTERNAL
// without Config.Orphans. Nothing changes on an error. While the fork is
// pending, Propose and ProposeVerbatim fail with a retriable UNAVAILABLE.
func (r *Replica) ProposeFork(at, epoch uint64, reply func(ForkResult)) {
	fail := func(e *apierr.Error) { reply(ForkResult{Err: e}) }
	name := func() string { return fmt.Sprintf("stream %s range %d", r.cfg.Stream, r.cfg.Range) }
	if f := r.failure.Load(); f != nil {
		fail(f)
		return
	}
	if !r.isLeader {
		fail(r.notLeader())
		return
	}
	o := r.cfg.Orphans
	switch {
	case o == nil:
		fail(apierr.New(apierr.Internal, "%s: no orphan store configured", name()))
		return
	case epoch == 0:
		fail(apierr.New(apierr.InvalidArgument, "%s: fork to epoch 0", name()))
		return
	case r.forkPending():
		fail(apierr.New(apierr.Unavailable, "%s: another fork is in progress", name()))
		return
	}
	tail := r.appliedEnd
	if r.proposeNext != tail || len(r.proposals) > 0 {
		fail(apierr.New(apierr.Unavailable, "%s: appends are in flight (log continues at %d, committed %d)", name(), r.proposeNext, tail))
		return
	}
	floor := r.state.SnapshotNextOffset
	bounds := func(e *apierr.Error) *apierr.Error {
		e.StartOffset, e.TailOffset = floor, tail
		return e
	}
	if at > tail {
		fail(bounds(apierr.New(apierr.OffsetOutOfRange, "%s: fork at offset %d past the committed tail, the log holds [%d, %d)", name(), at, floor, tail)))
		return
	}
	highest := r.HighestEpoch()
	if forks := o.Forks(); len(forks) > 0 && at == tail {
		if last := forks[len(forks)-1]; last.At == at && last.Epoch == epoch && epoch == highest {
			reply(ForkResult{ForkRecord: last})
			return
		}
	}
	if epoch < highest || (epoch == highest && at < tail) {
		fail(apierr.New(apierr.StaleEpoch, "%s: fork to epoch %d, the log holds epoch %d", name(), epoch, highest))
		return
	}
	keep, e := r.forkKeepIndex(at, floor, tail)
	if e != nil {
		fail(bounds(e))
		return
	}
	r.fork.seq++
	d := forkDesc{At: at, KeepIndex: keep, Proposer: r.cfg.NodeID, ProposalTerm: r.term, ProposalSeq: r.fork.seq}
	// Appended after the log's newest frame, the fork entry carries its
	// time (not this node's clock: at the tail it stays as written, and the
	// new home's records that follow were appended on its own clock). The
	// fork rewrites it to the last kept record's time (forkLog).
	frame := batch.EncodeControl(nil, batch.Header{Type: batch.TypeFork, BaseOffset: tail, Epoch: epoch, AppendTimeUnixNanos: r.logAppendUnixNanos}, d.encode())
	if err := r.rn.Propose(frame); err != nil {
		e := r.notLeader()
		e.Message += ": " + err.Error()
		fail(e)
		return
	}
	r.fork.proposal = &forkProposal{term: r.term, seq: d.ProposalSeq, reply: reply}
	r.logger.Info("proposed fork", "at", at, "epoch", epoch, "tail", tail, "keep_index", keep)
}

// forkKeepIndex returns the Raft index of the last entry a fork at
// offset at keeps (0 at the tail: the fork entry itself follows; 0 below
// the floor where the log retains no frame ending at at: a reset, see
// resetFork), given the compaction point's offset (floor) and the tail;
// at must end a batch.
//
// Below the compaction point the log may still retain frames: a replica
// that installed a snapshot holds the leader's retained log up to the
// snapshot index, and its compaction point is that index, at its log's
// end. A fork there cuts after the retained frame ending at at, as on a
// follower whose compaction point passed the kept index: a reset would
// drop what retention kept for a lagging mirror (the compaction floor),
// and that mirror could then never catch up (seed 311323 of the
// three-region simulator: a mirror group forked at 1226 just after a
// snapshot to 1242 whose body started at 1212, while another region's
// mirror still needed 1223 on).
func (r *Replica) forkKeepIndex(at, floor, tail uint64) (uint64, *apierr.Error) {
	name := fmt.Sprintf("stream %s range %d", r.cfg.Stream, r.cfg.Range)
	log := r.cfg.Log
	switch {
	case at == tail:
		return 0, nil
	case at == floor:
		return r.state.SnapshotIndex, nil
	case at < floor && (log.FirstIndex() == 0 || at <= log.StartOffset()):
		return 0, nil
	}
	frames, err := log.ReadFrames(at-1, 1, at)
	h, herr := batch.DecodeHeader(frames)
	if err != nil || herr != nil {
		return 0, apierr.New(apierr.Unavailable, "%s: read the log at offset %d: %v", name, at-1, errors.Join(err, herr))
	}
	if h.NextOffset() != at {
		return 0, apierr.New(apierr.InvalidArgument, "%s: offset %d is inside the batch [%d, %d)", name, at, h.BaseOffset, h.NextOffset())
	}
	return h.Index, nil
}

// HighestEpoch is the highest epoch of any data frame this replica has
// seen in its log (since it opened: those it held then, and every one
// since) and of any fork it applied: the fencing floor for appends. Safe
// from any goroutine. (Retention that deletes every data frame of the log
// leaves, after a restart, the forks' epochs and HardState.CompactedEpoch,
// the highest epoch of the frames compaction deleted.) It never goes down, not
// even when an uncommitted suffix is replaced: epochs come from the lease
// store, so an epoch once proposed anywhere was granted. It also covers
// what this replica, as leader, proposed.
func (r *Replica) HighestEpoch() uint64 {
	e := max(r.fork.epoch.Load(), r.proposedEpoch.Load())
	if o := r.cfg.Orphans; o != nil {
		e = max(e, o.maxEpoch())
	}
	return e
}

// raiseEpoch notes a data frame's epoch and its offset at (or any offset
// past a frame of that epoch: where the epoch starts at the latest, for
// staleMirrored).
func (r *Replica) raiseEpoch(epoch, at uint64) {
	r.fork.starts.note(epoch, at)
	for {
		cur := r.fork.epoch.Load()
		if epoch <= cur || r.fork.epoch.CompareAndSwap(cur, epoch) {
			return
		}
	}
}

// Orphans returns the forks this replica's orphan log holds, oldest first
// (nil without Config.Orphans): for listing, and the orphaned-records
// metric. Safe from any goroutine.
func (r *Replica) Orphans() []ForkRecord {
	if r.cfg.Orphans == nil {
		return nil
	}
	return r.cfg.Orphans.Forks()
}

// ReadOrphans returns orphaned frames of the fork at Raft index forkIndex
// from the one holding offset from, about maxBytes in all (at least one
// frame): see OrphanStore.ReadFrames. Safe from any goroutine.
func (r *Replica) ReadOrphans(forkIndex, from uint64, maxBytes int) ([]byte, error) {
	if r.cfg.Orphans == nil {
		return nil, fmt.Errorf("%w: no orphan store configured", ErrForkNotFound)
	}
	return r.cfg.Orphans.ReadFrames(forkIndex, from, maxBytes)
}

// forkPending reports whether a fork or a skip (skip.go) is proposed
// here or in the log and not applied here.
func (r *Replica) forkPending() bool {
	return r.fork.proposal != nil || r.fork.skip != nil || len(r.fork.unapplied) > 0
}

// forkBlocksAppends is the error for an append while a fork is pending:
// its offsets would depend on the fork.
func (r *Replica) forkBlocksAppends() error {
	if !r.forkPending() {
		return nil
	}
	return apierr.New(apierr.Unavailable, "stream %s range %d: a fork or skip is being applied; appends continue at its offset once it is",
		r.cfg.Stream, r.cfg.Range)
}

// noteFrame follows a frame that enters the log (queued, written, or read
// back on opening or after a truncation): its epoch, and fork entries not
// applied yet.
func (r *Replica) noteFrame(h batch.Header) {
	switch h.Type {
	case batch.TypeData:
		r.raiseEpoch(h.Epoch, h.BaseOffset)
	case batch.TypeFork:
		if h.Index > r.appliedIndex && !slices.Contains(r.fork.unapplied, h.Index) {
			r.fork.unapplied = append(r.fork.unapplied, h.Index)
		}
	case batch.TypeSplit:
		r.noteSplitFrame(h)
	}
}

// dropUnapplied forgets the fork entries up to index: applied, or gone.
func (f *forkState) dropUnapplied(index uint64) {
	f.unapplied = slices.DeleteFunc(f.unapplied, func(i uint64) bool { return i <= index })
}

// holdBackAfterFork cuts the entries of a MsgApp before the first data
// entry that follows a fork entry not applied here (one in the log before
// the message's entries, or among them). Such a data entry was proposed at
// an offset after the fork, which this log reaches only once it applies
// the fork; control entries (a new leader's, which may be what commits the
// fork) pass. Raft acknowledges what it kept; the leader sends the rest
// again, and once the fork is applied it passes. The message is modified
// (Step takes it over).
func (r *Replica) holdBackAfterFork(m *raftpb.Message) {
	var fork uint64
	for _, i := range r.fork.unapplied {
		if i <= m.GetIndex() {
			fork = max(fork, i)
		}
	}
	for i, e := range m.GetEntries() {
		if e.GetIndex() <= r.appliedIndex || e.GetType() != raftpb.EntryNormal {
			continue
		}
		switch {
		case batch.IsFork(e.Data):
			fork = e.GetIndex()
		case fork != 0 && batch.IsData(e.Data):
			r.logger.Debug("holding back entries after an unapplied fork", "fork_index", fork, "from_index", e.GetIndex())
			m.Entries = m.Entries[:i]
			return
		}
	}
}

// supersedeFork fails this replica's fork proposal if a leader of a later
// term committed its first entry without it.
func (r *Replica) supersedeFork(term uint64) {
	if p := r.fork.proposal; p != nil && p.term < term {
		r.fork.proposal = nil
		e := r.notLeader()
		e.Message += ": the fork was superseded by a new leader"
		p.reply(ForkResult{Err: e})
	}
	if p := r.fork.skip; p != nil && p.term < term {
		r.fork.skip = nil
		e := r.notLeader()
		e.Message += ": the skip was superseded by a new leader"
		p.reply(SkipResult{Err: e})
	}
}

// failFork answers this replica's fork proposal with err.
func (r *Replica) failFork(err error) {
	if p := r.fork.proposal; p != nil {
		r.fork.proposal = nil
		p.reply(ForkResult{Err: err})
	}
}

// applyFork applies the committed fork entry e.
func (r *Replica) applyFork(e *raftpb.Entry) error {
	index := e.GetIndex()
	h, payload, err := batch.DecodeControl(e.Data)
	if err != nil {
		return fmt.Errorf("replica: committed fork entry %d: %w", index, err)
	}
	if isSkipPayload(payload) {
		return r.applySkip(index, e.GetTerm(), h, payload)
	}
	d, err := decodeForkDesc(payload)
	if err != nil {
		return fmt.Errorf("replica: committed fork entry %d: %w", index, err)
	}
	r.fork.dropUnapplied(index)
	res, err := r.forkLog(index, e.GetTerm(), h, d)
	if err != nil {
		return err
	}
	if p := r.fork.proposal; p != nil && d.Proposer == r.cfg.NodeID && d.ProposalTerm == p.term && d.ProposalSeq == p.seq {
		r.fork.proposal = nil
		p.reply(res)
	}
	return nil
}

// forkLog carries out the fork entry at index (header h, payload d): see
// the top of this file. An invalid fork is refused alike on every replica
// (the log before the entry is the same everywhere) and changes nothing.
func (r *Replica) forkLog(index, term uint64, h batch.Header, d forkDesc) (ForkResult, error) {
	tail := h.BaseOffset // the log's next offset before the fork entry
	if d.At > tail {
		e := apierr.New(apierr.OffsetOutOfRange, "stream %s range %d: fork at offset %d past the tail %d", r.cfg.Stream, r.cfg.Range, d.At, tail)
		return ForkResult{Err: e}, nil
	}
	o := r.cfg.Orphans
	if o == nil {
		return ForkResult{}, fmt.Errorf("replica: fork entry %d orphans offsets [%d, %d): no orphan store configured", index, d.At, tail)
	}
	rec := ForkRecord{Index: index, Term: term, At: d.At, Epoch: h.Epoch, TimeUnixNanos: h.AppendTimeUnixNanos,
		FirstOffset: tail, NextOffset: tail}
	if d.At == tail {
		// Nothing to orphan, no entry to drop: the fork frame already
		// continues at At. The record raises the epoch floor durably.
		rec, _, err := o.writeFork(rec, nil, nil)
		if err != nil {
			return ForkResult{}, err
		}
		r.logger.Info("applied fork", "index", index, "at", d.At, "epoch", h.Epoch, "records", 0)
		return ForkResult{ForkRecord: rec}, nil
	}
	rec.PrevIndex = d.KeepIndex
	log := r.cfg.Log
	rec.TimeUnixNanos = r.keptAppendUnixNanos(d.KeepIndex)
	h.AppendTimeUnixNanos = rec.TimeUnixNanos
	// The log changes under the writer's feet: drain it and hold it off,
	// as for a truncation (appendSync).
	r.writer.wmu.Lock()
	defer r.writer.wmu.Unlock()
	if err := r.writeQueued(); err != nil {
		return ForkResult{}, err
	}
	if start := log.StartOffset(); start > d.At {
		// Retention deleted part of the divergent tail here already.
		rec.FirstOffset = min(start, tail)
		r.logger.Warn("retention deleted part of the divergent tail before the fork", "at", d.At, "start_offset", start, "records", rec.FirstOffset-d.At)
	} else {
		rec.FirstOffset = d.At
	}
	first := rec.FirstOffset
	rec, _, err := o.writeFork(rec, func(emit func([]byte) error) error {
		return r.emitDivergentTail(first, tail, index, d.KeepIndex, emit)
	}, nil)
	if err != nil {
		return ForkResult{}, err
	}
	m := &ForkMeta{Record: rec}
	logFirst := log.FirstIndex()
	m.Reset = logFirst == 0 || logFirst > d.KeepIndex+1 || resetFork(d)
	base, err := r.forkBase(d)
	if err != nil {
		return ForkResult{}, err
	}
	m.Producers = base.encode()
	if m.Tail, err = r.forkTail(index, term, h, d); err != nil {
		return ForkResult{}, err
	}
	if err := r.cutAtFork(m, base, index, d.At); err != nil {
		return ForkResult{}, err
	}
	r.logger.Info("applied fork", "index", index, "at", d.At, "epoch", h.Epoch, "records", rec.Records,
		"first_offset", rec.FirstOffset, "next_offset", rec.NextOffset, "kept_index", d.KeepIndex, "reset", m.Reset)
	return ForkResult{ForkRecord: rec}, nil
}

// cutAtFork makes the fork described by m (the fork entry at index, the
// log cut at offset at) durable in the state, completes it in the log and
// takes base as the producer base: the last step of forkLog, once the
// orphaned tail is in the orphan store.
func (r *Replica) cutAtFork(m *ForkMeta, base *producerBase, index, at uint64) error {
	r.logCuts.Add(1) // before the log changes: snapshot bodies being read
	prev := r.state
	r.state.Forking = m
	if err := r.cfg.State.Save(r.state); err != nil {
		r.state = prev
		return fmt.Errorf("replica: save state before a fork: %w", err)
	}
	if err := r.completeFork(m); err != nil {
		return err
	}
	r.base = base
	if err := r.rebuildDedup(); err != nil {
		return err
	}
	r.recheckDuplicates()
	log := r.cfg.Log
	r.tailIndex, r.tailOffset = max(log.LastIndex(), r.state.SnapshotIndex), log.NextOffset()
	if r.isLeader {
		r.proposeNext = r.tailOffset
	}
	r.appliedAppendUnixNanos = m.Record.TimeUnixNanos // the last kept record's: the orphaned ones' are gone
	// The state saved with the fork covers it: publish the cut log now.
	r.appliedEnd = at
	r.publishNow(index, at)
	return nil
}

// keptAppendUnixNanos returns the append time of the last record a fork
// keeps (at keepIndex). Past the fork the log continues from that record:
// its time, not the orphaned tail's (from the old home's clock, possibly
// later than the new home's records that follow), is the fork frame's and
// the log's newest. Every replica that retains the frame reads the same
// one here; a log installed from a snapshot retains frames below its
// compaction point, so the frame is read wherever it is not that point.
func (r *Replica) keptAppendUnixNanos(keepIndex uint64) int64 {
	t := r.state.SnapshotAppendUnixNanos
	if keepIndex != r.state.SnapshotIndex {
		if f, err := r.cfg.Log.ReadFramesByIndex(keepIndex, keepIndex+1, 1); err == nil && len(f) > 0 {
			if kh, err := batch.DecodeHeader(f); err == nil && kh.Index == keepIndex {
				t = kh.AppendTimeUnixNanos
			}
		}
	}
	return t
}

// emitDivergentTail passes emit the log's frames at offsets [first, tail),
// each checked to lie strictly between the fork's kept index and the fork
// entry's index: the tail a fork orphans.
func (r *Replica) emitDivergentTail(first, tail, index, keepIndex uint64, emit func([]byte) error) error {
	log := r.cfg.Log
	for off := first; off < tail; {
		frames, err := log.ReadFrames(off, snapshotReadBytes, tail)
		if err != nil {
			return fmt.Errorf("replica: read the divergent tail at offset %d: %w", off, err)
		}
		if len(frames) == 0 {
			return fmt.Errorf("replica: the log ends at offset %d, before the fork's tail %d", off, tail)
		}
		for len(frames) > 0 {
			n, err := batch.FrameSize(frames)
			if err != nil || n > len(frames) {
				return fmt.Errorf("replica: log returned a bad frame at offset %d: %w", off, err)
			}
			fh, err := batch.DecodeHeader(frames[:n])
			if err != nil {
				return fmt.Errorf("replica: log returned a bad frame at offset %d: %w", off, err)
			}
			if fh.Index <= keepIndex || fh.Index >= index {
				return fmt.Errorf("replica: the record at offset %d is at index %d, outside the fork's (%d, %d)", fh.BaseOffset, fh.Index, keepIndex, index)
			}
			if err := emit(frames[:n]); err != nil {
				return err
			}
			off, frames = fh.NextOffset(), frames[n:]
		}
	}
	return nil
}

// resetFork reports whether fork d keeps no entry though offsets lie
// below its point: proposed below the proposer's compaction point
// (ProposeFork), it resets every replica's log to an empty one at d.At. (A
// fork keeping no entry otherwise is at offset 0, or at the tail.)
func resetFork(d forkDesc) bool { return d.KeepIndex == 0 && d.At > 0 }

// forkBase returns the producer base as of the fork's kept index.
func (r *Replica) forkBase(d forkDesc) (*producerBase, error) {
	if resetFork(d) {
		return r.resetBase(d.At)
	}
	if r.state.SnapshotIndex <= d.KeepIndex {
		return r.advanceBase(d.KeepIndex)
	}
	// Compacted past the fork point here: the base as of the compaction
	// point without the batches at or after At. (Batches the orphaned ones
	// pushed out of a producer's window are gone; a retry of one is refused
	// as out of window, never duplicated.)
	base := r.base.clone()
	base.dropFrom(d.At)
	return base, nil
}

// resetBase is the producer base for a reset fork at at: the base as of
// the compaction point without the batches at or after at, and the
// batches this replica retains below at.
func (r *Replica) resetBase(at uint64) (*producerBase, error) {
	base := r.base.clone()
	base.dropFrom(at)
	log := r.cfg.Log
	lo, last := max(log.FirstIndex(), r.state.SnapshotIndex+1), log.LastIndex()
	if log.FirstIndex() == 0 || lo > last {
		return base, nil
	}
	err := log.HeadersByIndex(lo, last+1, func(h batch.Header) {
		if h.Type == batch.TypeData && h.NextOffset() <= at {
			base.record(h)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("replica: read the headers below a reset fork at offset %d: %w", at, err)
	}
	return base, nil
}

// forkTail returns the frames from the fork entry at index on, as the
// fork leaves them: the fork frame at offset At ending the gap after
// KeepIndex, then the entries after it (control entries only, see
// holdBackAfterFork) moved to At. Every replica builds the same bytes.
func (r *Replica) forkTail(index, term uint64, h batch.Header, d forkDesc) ([][]byte, error) {
	d.PrevIndex = d.KeepIndex
	fh := h
	fh.BaseOffset, fh.Term, fh.Index = d.At, term, index
	return r.entriesAfter(index, batch.EncodeControl(nil, fh, d.encode()), d.At, fh.AppendTimeUnixNanos)
}

// entriesAfter returns first (the fork or skip frame at index, as it is
// applied) and the entries after it in the log, which must be control
// entries, moved to offset at with append time appendUnixNanos.
func (r *Replica) entriesAfter(index uint64, first []byte, at uint64, appendUnixNanos int64) ([][]byte, error) {
	out := [][]byte{first}
	size := len(out[0])
	last := r.cfg.Log.LastIndex()
	for lo := index + 1; lo <= last; {
		frames, err := r.cfg.Log.ReadFramesByIndex(lo, last+1, snapshotReadBytes)
		if err != nil {
			return nil, fmt.Errorf("replica: read the entries after fork entry %d: %w", index, err)
		}
		for len(frames) > 0 {
			n, err := batch.FrameSize(frames)
			if err != nil || n > len(frames) {
				return nil, fmt.Errorf("replica: log returned a bad frame at index %d: %w", lo, err)
			}
			th, err := batch.DecodeHeader(frames[:n])
			switch {
			case err != nil:
				return nil, fmt.Errorf("replica: log returned a bad frame at index %d: %w", lo, err)
			case !th.IsControl():
				return nil, fmt.Errorf("replica: data entry %d follows fork entry %d, which was not applied", th.Index, index)
			}
			f := slices.Clone(frames[:n])
			// Control entries after the fork take its time: theirs may
			// come from the orphaned tail's.
			batch.Patch(f, at, th.Epoch, appendUnixNanos)
			out = append(out, f)
			if size += n; size > forkTailBytesMax {
				return nil, fmt.Errorf("replica: %d bytes of entries follow fork entry %d", size, index)
			}
			lo, frames = th.Index+1, frames[n:]
		}
	}
	return out, nil
}

// completeFork brings the log and the state to what m says (steps 3 and 4
// at the top of this file) from wherever a crash left them: the pre-fork
// log or a prefix of it, or the fork frame and a prefix of the rest. The
// caller holds the writer off (or runs before Raft starts).
func (r *Replica) completeFork(m *ForkMeta) error {
	log, rec := r.cfg.Log, m.Record
	moved := false
	if first, last := log.FirstIndex(), log.LastIndex(); first != 0 && first <= rec.Index && rec.Index <= last {
		h, err := r.frameHeader(rec.Index)
		moved = err == nil && h.Type == batch.TypeFork && h.BaseOffset == rec.At
	}
	switch {
	case moved:
	case m.Reset:
		// Nothing up to PrevIndex is retained here: the log becomes the
		// tail alone, at At. The staging starts at no particular index, so
		// that the fork frame may name PrevIndex.
		st, err := log.BeginStaging(rec.At, 0)
		if err != nil {
			return fmt.Errorf("replica: stage the log after fork %d: %w", rec.Index, err)
		}
		for _, f := range m.Tail {
			if _, err := st.Append(f); err != nil {
				st.Abort()
				return fmt.Errorf("replica: stage the log after fork %d: %w", rec.Index, err)
			}
		}
		if err := st.Finish(); err != nil {
			st.Abort()
			return fmt.Errorf("replica: stage the log after fork %d: %w", rec.Index, err)
		}
		if err := log.Install(st); err != nil {
			st.Abort()
			return fmt.Errorf("replica: install the log after fork %d: %w", rec.Index, err)
		}
	default:
		if err := log.TruncateSuffixAtIndex(rec.PrevIndex + 1); err != nil {
			return fmt.Errorf("replica: truncate the divergent tail after index %d: %w", rec.PrevIndex, err)
		}
		if next, last := log.NextOffset(), log.LastIndex(); next != rec.At || last > rec.PrevIndex {
			return fmt.Errorf("replica: truncated after index %d, the log ends at index %d offset %d, want offset %d",
				rec.PrevIndex, last, next, rec.At)
		}
	}
	appended := 0
	for _, f := range m.Tail {
		h, err := batch.DecodeHeader(f)
		if err != nil {
			return fmt.Errorf("replica: fork %d: recorded frame: %w", rec.Index, err)
		}
		if last := log.LastIndex(); last != 0 && h.Index <= last {
			continue // written before a crash
		}
		if err := log.Append(f); err != nil {
			return fmt.Errorf("replica: append after fork %d: %w", rec.Index, err)
		}
		appended++
	}
	if appended > 0 {
		if err := log.Sync(); err != nil {
			return fmt.Errorf("replica: sync after fork %d: %w", rec.Index, err)
		}
	}
	r.state.SnapshotIndex, r.state.SnapshotTerm = rec.Index, rec.Term
	r.state.SnapshotNextOffset = rec.At
	r.state.SnapshotAppendUnixNanos = rec.TimeUnixNanos // the log's newest append time now
	r.state.Producers = m.Producers
	if r.state.Raft.GetCommit() < rec.Index {
		hs := proto.Clone(r.state.Raft).(*raftpb.HardState)
		hs.Commit = proto.Uint64(rec.Index)
		r.state.Raft = hs
	}
	r.state.Forking = nil
	if err := r.cfg.State.Save(r.state); err != nil {
		return fmt.Errorf("replica: save state after fork %d: %w", rec.Index, err)
	}
	return nil
}

// recoverFork runs when a replica opens, before its state is reconciled
// with its log: it notes the epochs of the log's data frames and completes
// a fork that a crash interrupted after recording it (HardState.Forking).
func (r *Replica) recoverFork(headers []batch.Header) error {
	for _, h := range headers {
		if h.Type == batch.TypeData {
			r.raiseEpoch(h.Epoch, h.BaseOffset)
		}
	}
	m := r.state.Forking
	if m == nil {
		return nil
	}
	switch {
	case m.Skip: // a skip orphans nothing (skip.go)
	case r.cfg.Orphans == nil:
		return fmt.Errorf("replica: a fork at index %d was being applied, and no orphan store is configured", m.Record.Index)
	default:
		if _, ok := r.cfg.Orphans.Fork(m.Record.Index); !ok {
			return fmt.Errorf("%w: the fork at index %d being applied is missing", ErrOrphansCorrupt, m.Record.Index)
		}
	}
	if err := r.completeFork(m); err != nil {
		return err
	}
	r.fork.recovered = true
	r.logger.Warn("completed an interrupted fork or skip", "index", m.Record.Index, "at", m.Record.At, "skip", m.Skip)
	return nil
}

// openForks runs at the end of New, once the applied index is known: fork
// entries up to it are applied; after a fork New completed, the
// idempotence table and append times come from the log as it now is.
func (r *Replica) openForks() error {
	r.fork.dropUnapplied(r.appliedIndex)
	if r.fork.recovered {
		return r.rebuildDedup()
	}
	return nil
}

// settleForkAfterInstall answers a fork proposal whose outcome a snapshot
// hid: the fork is either in the snapshot or lost, and a retry tells
// (ProposeFork repeating the last fork is answered with its record).
func (r *Replica) settleForkAfterInstall() {
	r.failFork(apierr.New(apierr.Unavailable, "stream %s range %d: the outcome of the fork is unknown after a snapshot (retry it)",
		r.cfg.Stream, r.cfg.Range))
	r.failSkip(apierr.New(apierr.Unavailable, "stream %s range %d: the outcome of the skip is unknown after a snapshot (retry it)",
		r.cfg.Stream, r.cfg.Range))
}

// dropFrom removes the batches at or past offset: the base as of offset,
// but for batches that later ones pushed out of a producer's window.
func (p *producerBase) dropFrom(offset uint64) {
	for id, recent := range p.producers {
		k := len(recent)
		for k > 0 && recent[k-1].BaseOffset >= offset {
			k--
		}
		if k == 0 {
			delete(p.producers, id)
		} else {
			p.producers[id] = recent[:k]
		}
	}
}

// forkGaps counts the indexes in [first, index] that forks moved out of
// this replica's log: the gaps before fork frames that follow a retained
// entry (a snapshot body has that many frames fewer than indexes).
//
// A fork may cut below an earlier one (a newer home that started lower,
// on a log that retains frames below the earlier fork's point): its gap
// then swallows the earlier fork's frame and gap, which count no more.
// Gaps nest or are apart (a fork keeps an entry of the log, never one in
// a gap), so a fork is swallowed when a later one kept an entry below
// its index.
func (r *Replica) forkGaps(first, index uint64) uint64 {
	if r.cfg.Orphans == nil {
		return 0
	}
	var n uint64
	low := uint64(math.MaxUint64) // the lowest entry a later fork kept
	forks := r.cfg.Orphans.Forks()
	for i := len(forks) - 1; i >= 0; i-- {
		f := forks[i]
		if f.PrevIndex == 0 || f.Index > index {
			continue
		}
		if f.PrevIndex >= first && f.Index <= low {
			n += f.Index - f.PrevIndex - 1
		}
		low = min(low, f.PrevIndex)
	}
	return n
}

// receiveOrphans reads the orphan log a snapshot body carries (size bytes)
// and stages the forks this replica lacks; see ReceiveSnapshot, which
// commits them once the whole body checked out, or discards them. For the
// transport's goroutine: the store takes writers from any.
func (r *Replica) receiveOrphans(body io.Reader, size uint64) ([]*pendingFork, error) {
	if size == 0 {
		return nil, nil
	}
	o := r.cfg.Orphans
	if o == nil {
		return nil, fmt.Errorf("%w: it carries an orphan log and no orphan store is configured", ErrSnapshotInvalid)
	}
	lr := io.LimitReader(body, int64(min(size, 1<<62)))
	var staged []*pendingFork
	for read := uint64(0); read < size; {
		p, n, err := o.receiveFork(lr)
		if err != nil {
			o.discard(staged)
			return nil, fmt.Errorf("%w: orphan log after %d of %d bytes: %w", ErrSnapshotInvalid, read, size, err)
		}
		if p != nil {
			staged = append(staged, p)
		}
		read += n
	}
	return staged, nil
}
