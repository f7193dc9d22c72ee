package replica

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/segment"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// A snapshot is segment transfer. The log is the state, so a snapshot at
// index S is the leader's retained log up to S: its body streams the frames
// [F, S] from the leader's first retained index F, as they lie in the
// leader's segments, and the follower's log becomes exactly those frames,
// at the same offsets. Raft then continues with MsgApp from S+1. Ahead of
// the frames the body carries the leader's producer base (the idempotence
// state as of its compaction point, see producers.go), from which and the
// frames the follower derives its own as of S, and the leader's orphan log
// (the forks up to S, each fork's file as it lies in the orphan store, see
// orphans.go), which the follower stores where it lacks them, so that
// every replica holds every fork. Where a fork moved a divergent tail out
// of the log, the frames skip its indexes and the fork frame describes the
// gap (segment.Staging checks it). The snapshot's Data describes the body
// (snapshotDesc) so that the follower can check what arrives against it;
// the metadata carries S, its term and the configuration as of S.

var (
	// ErrSnapshotInvalid reports a snapshot whose description or body does
	// not hold together: truncated, corrupt or out-of-sequence frames,
	// indexes or offsets other than described, bytes past the last frame.
	// Nothing was installed.
	ErrSnapshotInvalid = errors.New("replica: invalid snapshot")
	// ErrSnapshotSourceChanged is a snapshot body's read error on its
	// sender: the sender's log replaced the frames the body still had to
	// send (a fork applied after the snapshot was taken moved them to the
	// orphan log, or an installed snapshot replaced the log). The transfer
	// fails (raftnet's sender cancels it, so the receiver's body fails
	// too) and Raft sends another snapshot; nothing was installed. A
	// compaction cannot do it: the body pins its frames.
	ErrSnapshotSourceChanged = errors.New("replica: the log changed under a snapshot being sent")
	// ErrSnapshotStale reports a snapshot at or below the commit index:
	// there is nothing to install. Step the message anyway (StepSnapshot
	// with no staged body), so that Raft answers the leader.
	ErrSnapshotStale = errors.New("replica: snapshot is not newer than the log")
	// ErrSnapshotBusy reports a snapshot arriving while another is being
	// received or installed; the leader retries.
	ErrSnapshotBusy = errors.New("replica: another snapshot is in progress")
)

const (
	// snapshotFormatVersion is the version of snapshotDesc and of the body
	// without orphans; snapshotFormatOrphans adds them (OrphansBytes);
	// snapshotFormatEpoch adds the compacted epoch (CompactedEpoch), with
	// or without orphans.
	snapshotFormatVersion = 1
	snapshotFormatOrphans = 2
	snapshotFormatEpoch   = 3
	snapshotDescMagic     = "GLSN"
	snapshotDescBytes     = len(snapshotDescMagic) + 1 + 7*8 + 4
	snapshotDescBytesV2   = snapshotDescBytes + 8
	snapshotDescBytesV3   = snapshotDescBytesV2 + 8
	// snapshotReadBytes is how much of the log a body reads at a time.
	snapshotReadBytes = 1 << 20
	// snapshotsOutMax bounds the snapshot bodies a leader has open at once;
	// past it Raft hears ErrSnapshotTemporarilyUnavailable and retries.
	snapshotsOutMax = 8
)

// snapshotDesc is a snapshot's Data: what its body holds.
type snapshotDesc struct {
	// FirstIndex is the Raft index of the body's first frame: the snapshot
	// index + 1 when the body is empty.
	FirstIndex uint64
	// FirstOffset is the BaseOffset of the body's first frame (NextOffset
	// when the body is empty): where the follower's log will start.
	FirstOffset uint64
	// NextOffset is the offset after the entry at the snapshot index.
	NextOffset uint64
	// Frames is the number of frames in the body: the snapshot index -
	// FirstIndex + 1, less the indexes of the gaps forks left. Compaction
	// by key may have removed frames (and their indexes) below the
	// leader's compaction point too: then the body holds fewer, and ends
	// after its last.
	Frames uint64
	// AppendUnixNanos is the newest append time up to the snapshot index.
	AppendUnixNanos int64
	// ProducersBytes is the length of the producer base that starts the
	// body, and ProducersIndex the index it is as of: frames after it
	// update it. FirstIndex <= ProducersIndex+1 <= index+1.
	ProducersBytes, ProducersIndex uint64
	// OrphansBytes is the length of the orphan log that follows the
	// producer base (format version 2 or 3; 0, and version 1, without).
	OrphansBytes uint64
	// CompactedEpoch is the sender's HardState.CompactedEpoch: the highest
	// epoch of the data frames below the body (format version 3; 0, and
	// version 1 or 2, unknown). A receiver whose installed body holds no
	// data frame of that epoch (retention deleted the leader's whole log)
	// still knows the epoch its log ends in (notes/sim169.md).
	CompactedEpoch uint64
}

// encode: magic, version, the fields little-endian, CRC-32C of the rest.
// A description without orphans and compacted epoch is written in version
// 1, which receivers from before forks read too; one with orphans only in
// version 2, which receivers from before the compacted epoch read too.
func (d snapshotDesc) encode() []byte {
	fields := []uint64{d.FirstIndex, d.FirstOffset, d.NextOffset, d.Frames, uint64(d.AppendUnixNanos), d.ProducersBytes, d.ProducersIndex}
	version := byte(snapshotFormatVersion)
	switch {
	case d.CompactedEpoch != 0:
		fields, version = append(fields, d.OrphansBytes, d.CompactedEpoch), snapshotFormatEpoch
	case d.OrphansBytes != 0:
		fields, version = append(fields, d.OrphansBytes), snapshotFormatOrphans
	}
	b := make([]byte, 0, snapshotDescBytesV3)
	b = append(b, snapshotDescMagic...)
	b = append(b, version)
	for _, v := range fields {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func decodeSnapshotDesc(b []byte) (snapshotDesc, error) {
	if (len(b) != snapshotDescBytes && len(b) != snapshotDescBytesV2 && len(b) != snapshotDescBytesV3) ||
		string(b[:len(snapshotDescMagic)]) != snapshotDescMagic {
		return snapshotDesc{}, fmt.Errorf("%w: description of %d bytes is not one", ErrSnapshotInvalid, len(b))
	}
	if binary.LittleEndian.Uint32(b[len(b)-4:]) != crc32.Checksum(b[:len(b)-4], castagnoli) {
		return snapshotDesc{}, fmt.Errorf("%w: description fails its checksum", ErrSnapshotInvalid)
	}
	v, want := b[len(snapshotDescMagic)], byte(snapshotFormatVersion)
	switch len(b) {
	case snapshotDescBytesV2:
		want = snapshotFormatOrphans
	case snapshotDescBytesV3:
		want = snapshotFormatEpoch
	}
	if v != want {
		return snapshotDesc{}, fmt.Errorf("%w: format version %d in %d bytes, want %d", ErrSnapshotInvalid, v, len(b), want)
	}
	f := func(i int) uint64 { return binary.LittleEndian.Uint64(b[len(snapshotDescMagic)+1+8*i:]) }
	d := snapshotDesc{FirstIndex: f(0), FirstOffset: f(1), NextOffset: f(2), Frames: f(3), AppendUnixNanos: int64(f(4)),
		ProducersBytes: f(5), ProducersIndex: f(6)}
	switch v {
	case snapshotFormatOrphans:
		if d.OrphansBytes = f(7); d.OrphansBytes == 0 {
			return snapshotDesc{}, fmt.Errorf("%w: version %d without orphans", ErrSnapshotInvalid, v)
		}
	case snapshotFormatEpoch:
		if d.OrphansBytes, d.CompactedEpoch = f(7), f(8); d.CompactedEpoch == 0 {
			return snapshotDesc{}, fmt.Errorf("%w: version %d without a compacted epoch", ErrSnapshotInvalid, v)
		}
	}
	return d, nil
}

// check holds d against the snapshot index.
func (d snapshotDesc) check(index uint64) error {
	switch {
	case d.FirstIndex == 0 || d.FirstIndex > index+1:
		return fmt.Errorf("%w: body starts at index %d, snapshot is at %d", ErrSnapshotInvalid, d.FirstIndex, index)
	case d.Frames > index+1-d.FirstIndex || (d.Frames == 0) != (d.FirstIndex == index+1):
		// Fewer frames than indexes where forks left gaps (the frames
		// themselves must describe them, see ReceiveSnapshot).
		return fmt.Errorf("%w: %d frames from index %d do not end at %d", ErrSnapshotInvalid, d.Frames, d.FirstIndex, index)
	case d.FirstOffset > d.NextOffset:
		return fmt.Errorf("%w: offsets [%d, %d)", ErrSnapshotInvalid, d.FirstOffset, d.NextOffset)
	case d.Frames == 0 && d.FirstOffset != d.NextOffset:
		return fmt.Errorf("%w: an empty body spans offsets [%d, %d)", ErrSnapshotInvalid, d.FirstOffset, d.NextOffset)
	case d.ProducersIndex > index || d.FirstIndex > d.ProducersIndex+1:
		return fmt.Errorf("%w: producer base as of index %d does not join frames [%d, %d]", ErrSnapshotInvalid, d.ProducersIndex, d.FirstIndex, index)
	case d.ProducersBytes > producerBaseBytesMax:
		return fmt.Errorf("%w: producer base of %d bytes", ErrSnapshotInvalid, d.ProducersBytes)
	}
	return nil
}

// snapshot is the leader's raft.Storage.Snapshot: the snapshot at the
// applied index, whose body is the retained log up to it. Raft asks for it
// only for a follower that needs entries below the first index.
func (r *Replica) snapshot() (*raftpb.Snapshot, error) {
	index := r.appliedIndex
	if r.failure.Load() != nil || index == 0 || r.pins.count() >= snapshotsOutMax {
		return nil, raft.ErrSnapshotTemporarilyUnavailable
	}
	term, err := r.storage.Term(index)
	if err != nil {
		r.logger.Warn("no term for the snapshot index", "index", index, "error", err)
		return nil, raft.ErrSnapshotTemporarilyUnavailable
	}
	next := r.appliedEnd
	d := snapshotDesc{FirstIndex: index + 1, FirstOffset: next, NextOffset: next, AppendUnixNanos: r.appliedAppendUnixNanos,
		ProducersBytes: uint64(len(r.state.Producers)), ProducersIndex: r.state.SnapshotIndex, CompactedEpoch: r.state.CompactedEpoch}
	if first := r.cfg.Log.FirstIndex(); first != 0 && first <= index {
		h, err := r.frameHeader(first)
		if err != nil {
			r.logger.Warn("cannot read the log's first frame for a snapshot", "index", first, "error", err)
			return nil, raft.ErrSnapshotTemporarilyUnavailable
		}
		d.FirstIndex, d.FirstOffset, d.Frames = first, h.BaseOffset, index-first+1-r.forkGaps(first, index)
	}
	if o := r.cfg.Orphans; o != nil {
		d.OrphansBytes, _ = o.bytesUpTo(index)
	}
	return &raftpb.Snapshot{Data: d.encode(), Metadata: &raftpb.SnapshotMetadata{
		Index: proto.Uint64(index), Term: proto.Uint64(term), ConfState: proto.Clone(r.state.Conf).(*raftpb.ConfState),
	}}, nil
}

// frameHeader reads the header of the frame at index.
func (r *Replica) frameHeader(index uint64) (batch.Header, error) {
	b, err := r.cfg.Log.ReadFramesByIndex(index, index+1, 1)
	if err != nil {
		return batch.Header{}, err
	}
	h, err := batch.DecodeHeader(b)
	if err == nil && h.Index != index {
		err = fmt.Errorf("replica: log returned index %d for %d", h.Index, index)
	}
	return h, err
}

// snapshotPins are the first indexes of the snapshot bodies being sent:
// compaction keeps the frames they still have to read. The only state of a
// Replica shared with other goroutines (the transport's, reading bodies).
type snapshotPins struct {
	mu     sync.Mutex
	firsts []uint64
}

func (p *snapshotPins) add(first uint64) {
	p.mu.Lock()
	p.firsts = append(p.firsts, first)
	p.mu.Unlock()
}

func (p *snapshotPins) remove(first uint64) {
	p.mu.Lock()
	if i := slices.Index(p.firsts, first); i >= 0 {
		p.firsts = slices.Delete(p.firsts, i, i+1)
	}
	p.mu.Unlock()
}

func (p *snapshotPins) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.firsts)
}

// min returns the lowest pinned index, if any.
func (p *snapshotPins) min() (uint64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.firsts) == 0 {
		return 0, false
	}
	return slices.Min(p.firsts), true
}

// snapshotBody streams a snapshot's producer base and then its frames,
// [next, end), from the leader's log, a chunk at a time, on whatever
// goroutine the transport reads it. It pins its first index against
// compaction until closed.
type snapshotBody struct {
	log       FrameLog
	pins      *snapshotPins
	pinned    uint64
	producers []byte // still to send; never written to (the state replaces, not mutates, its copy)
	// orphans, forks: the forks' files still to send; orphan is the one
	// being sent (file open).
	orphans    *OrphanStore
	forks      []ForkRecord
	orphan     io.Reader
	orphanFile io.Closer
	next, end  uint64
	buf        []byte
	closeOnce  sync.Once
	// cuts is the replica's logCuts, cutsAt its value when the body was
	// made: a frame found missing after they differ is
	// ErrSnapshotSourceChanged, not a log that lost frames (nil: not
	// checked).
	cuts   *atomic.Uint64
	cutsAt uint64
}

// readFailed is the error of a body whose log read at index next failed
// with err: ErrSnapshotSourceChanged if the log's frames were replaced
// since the body was made.
func (b *snapshotBody) readFailed(err error) error {
	if b.cuts != nil && b.cuts.Load() != b.cutsAt {
		return fmt.Errorf("%w: frames from index %d are gone (%w)", ErrSnapshotSourceChanged, b.next, err)
	}
	return err
}

func (b *snapshotBody) Read(p []byte) (int, error) {
	if len(b.producers) > 0 {
		n := copy(p, b.producers)
		b.producers = b.producers[n:]
		return n, nil
	}
	for b.orphan != nil || len(b.forks) > 0 {
		if b.orphan == nil {
			f, rec, err := b.orphans.openFork(b.forks[0].Index)
			if err != nil {
				return 0, fmt.Errorf("replica: snapshot orphans: %w", err)
			}
			b.orphan, b.orphanFile = io.NewSectionReader(f, 0, int64(forkRecordBytes)+int64(rec.Bytes)), f
			b.forks = b.forks[1:]
		}
		n, err := b.orphan.Read(p)
		if n > 0 {
			return n, nil
		}
		if err == io.EOF {
			b.orphanFile.Close()
			b.orphan, b.orphanFile = nil, nil
			continue
		}
		return 0, fmt.Errorf("replica: snapshot orphans: %w", err)
	}
	for len(b.buf) == 0 {
		if b.next >= b.end {
			return 0, io.EOF
		}
		frames, err := b.log.ReadFramesByIndex(b.next, b.end, snapshotReadBytes)
		if err != nil {
			return 0, b.readFailed(fmt.Errorf("replica: read snapshot frames at index %d: %w", b.next, err))
		}
		var last []byte
		for rest := frames; len(rest) > 0; {
			size, err := batch.FrameSize(rest)
			if err != nil || size > len(rest) {
				return 0, b.readFailed(fmt.Errorf("replica: log returned a bad frame after index %d: %w", b.next, err))
			}
			last, rest = rest[:size], rest[size:]
		}
		h, err := batch.DecodeHeader(last)
		if err != nil || h.Index < b.next {
			return 0, b.readFailed(fmt.Errorf("replica: log returned no frame at index %d: %w", b.next, err))
		}
		b.next = h.Index + 1 // past a fork's gap too
		b.buf = frames
	}
	n := copy(p, b.buf)
	b.buf = b.buf[n:]
	return n, nil
}

// Close releases the pin; the transport calls it once the body is sent or
// abandoned. Safe to call more than once.
func (b *snapshotBody) Close() error {
	b.closeOnce.Do(func() {
		b.pins.remove(b.pinned)
		if b.orphanFile != nil {
			b.orphanFile.Close()
		}
	})
	return nil
}

// snapReport is a snapshot outcome to hand Raft after the Ready cycle.
type snapReport struct {
	to     uint64
	status raft.SnapshotStatus
}

// send hands msgs to Config.Send, except MsgSnap: each goes with its body
// to Config.SendSnapshot.
func (r *Replica) send(msgs []*raftpb.Message) {
	snaps := 0
	for _, m := range msgs {
		if m.GetType() == raftpb.MsgSnap {
			snaps++
		}
	}
	if snaps == 0 {
		r.cfg.Send(msgs)
		return
	}
	rest := make([]*raftpb.Message, 0, len(msgs)-snaps)
	for _, m := range msgs {
		if m.GetType() != raftpb.MsgSnap {
			rest = append(rest, m)
			continue
		}
		r.sendSnapshot(m)
	}
	if len(rest) > 0 {
		r.cfg.Send(rest)
	}
}

// sendSnapshot gives one MsgSnap its body and hands both to the transport.
// A snapshot that cannot leave is reported failed to Raft after the Ready
// cycle (Raft then probes the follower again and may retry).
func (r *Replica) sendSnapshot(m *raftpb.Message) {
	to := m.GetTo()
	fail := func(err error) {
		r.logger.Warn("snapshot not sent", "to", to, "index", m.GetSnapshot().GetMetadata().GetIndex(), "error", err)
		r.snapReports = append(r.snapReports, snapReport{to: to, status: raft.SnapshotFailure})
	}
	if r.cfg.SendSnapshot == nil {
		fail(errors.New("no snapshot transport configured"))
		return
	}
	d, err := decodeSnapshotDesc(m.GetSnapshot().GetData())
	if err != nil {
		fail(err)
		return
	}
	if d.ProducersBytes != uint64(len(r.state.Producers)) || d.ProducersIndex != r.state.SnapshotIndex {
		// Compaction moved the producer base since Raft took the snapshot.
		fail(errors.New("the compaction point moved since the snapshot was taken"))
		return
	}
	index := m.GetSnapshot().GetMetadata().GetIndex()
	var forks []ForkRecord
	if o := r.cfg.Orphans; o != nil {
		var n uint64
		if n, forks = o.bytesUpTo(index); n != d.OrphansBytes {
			fail(errors.New("the orphan log changed since the snapshot was taken"))
			return
		}
	}
	body := &snapshotBody{log: r.cfg.Log, pins: &r.pins, pinned: d.FirstIndex, producers: r.state.Producers,
		orphans: r.cfg.Orphans, forks: forks, next: d.FirstIndex, end: d.FirstIndex, cuts: &r.logCuts, cutsAt: r.logCuts.Load()}
	if d.Frames > 0 {
		body.end = index + 1
	}
	r.pins.add(d.FirstIndex)
	r.logger.Info("sending snapshot", "to", to, "index", m.GetSnapshot().GetMetadata().GetIndex(),
		"first_index", d.FirstIndex, "frames", d.Frames, "start_offset", d.FirstOffset, "next_offset", d.NextOffset)
	if err := r.cfg.SendSnapshot(m, body); err != nil {
		body.Close() // the transport closes it too; the pin goes once
		fail(err)
		return
	}
	r.snapshotsSent.Add(1)
}

// ReportSnapshot tells Raft what became of a snapshot sent to node to (err
// nil: the follower accepted it). Call it for every SendSnapshot that
// returned nil, from the driver goroutine.
func (r *Replica) ReportSnapshot(to uint64, err error) {
	status := raft.SnapshotFinish
	if err != nil {
		status = raft.SnapshotFailure
		r.logger.Warn("snapshot failed", "to", to, "error", err)
	}
	r.rn.ReportSnapshot(to, status)
}

// StagedSnapshot is a snapshot whose body was received, validated and
// written beside the log (see ReceiveSnapshot), not yet installed.
type StagedSnapshot struct {
	meta    SnapshotMeta
	base    *producerBase // as of meta.Index; meta.Producers encodes it
	staging *segment.Staging
	// decision is the newest compaction marker in the body.
	decision batch.Compaction
	// split is the split marker in the body (Index 0: none): below the
	// snapshot index, so committed, and the range's fence (split.go).
	split batch.Header
}

// Discard drops a staged snapshot that will not be installed. A nil
// StagedSnapshot, or one already installed or discarded, is fine.
func (s *StagedSnapshot) Discard() {
	if s != nil && s.staging != nil {
		s.staging.Abort()
	}
}

// ReceiveSnapshot reads the body of the MsgSnap m and writes it beside the
// log, validating every frame (CRC and structure, dense offsets from the
// described first offset, contiguous indexes from the described first index
// to the snapshot index but where a fork frame describes a gap, the
// snapshot index's term must be the snapshot's, the described next offset,
// nothing after the last frame) and the orphan log it carries (each fork's
// record and frames). Nothing replaces the log here: hand the result to
// StepSnapshot. The forks this replica lacks join its orphan store once
// the whole body checked out (they are committed facts, whether or not
// the snapshot is installed). A body that fails any check gives
// ErrSnapshotInvalid (or the body's own error) and leaves nothing behind;
// a snapshot at or below the commit index gives ErrSnapshotStale.
//
// It may run on any goroutine (the transport's), concurrently with the
// driver: it reads only the replica's published commit index and writes
// only the staging files and the orphan store (which takes writers from
// any goroutine).
func (r *Replica) ReceiveSnapshot(m *raftpb.Message, body io.Reader) (*StagedSnapshot, error) {
	meta := m.GetSnapshot().GetMetadata()
	index, term := meta.GetIndex(), meta.GetTerm()
	d, err := checkSnapshotMessage(m)
	if err != nil {
		return nil, err
	}
	if f := r.failure.Load(); f != nil {
		return nil, f
	}
	if c := r.raftCommit.Load(); index <= c {
		return nil, fmt.Errorf("%w: snapshot at %d, committed %d", ErrSnapshotStale, index, c)
	}
	st, err := r.cfg.Log.BeginStaging(d.FirstOffset, d.FirstIndex)
	if errors.Is(err, segment.ErrStagingBusy) {
		return nil, fmt.Errorf("%w: %w", ErrSnapshotBusy, err)
	}
	if err != nil {
		return nil, fmt.Errorf("replica: stage snapshot: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			st.Abort()
		}
	}()
	blob := make([]byte, d.ProducersBytes)
	if _, err := io.ReadFull(body, blob); err != nil {
		return nil, fmt.Errorf("%w: producer base: %w", ErrSnapshotInvalid, err)
	}
	base, err := decodeProducerBase(blob)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSnapshotInvalid, err)
	}
	// The forks the snapshot brings are committed facts (the leader applied
	// them), but join the orphan store only with a body that checks out.
	forks, err := r.receiveOrphans(body, d.OrphansBytes)
	if err != nil {
		return nil, err
	}
	defer func() {
		if !ok {
			r.cfg.Orphans.discard(forks)
		}
	}()
	staged, err := r.stageFrames(st, body, d, base)
	if err != nil {
		return nil, err
	}
	appendTime := d.AppendUnixNanos
	if d.Frames > 0 {
		if st.LastIndex() != index || st.LastTerm() != term {
			return nil, fmt.Errorf("%w: body ends at index %d term %d, snapshot is at index %d term %d",
				ErrSnapshotInvalid, st.LastIndex(), st.LastTerm(), index, term)
		}
		appendTime = st.LastAppendTimeUnixNanos()
	}
	if st.NextOffset() != d.NextOffset {
		return nil, fmt.Errorf("%w: body ends at offset %d, described %d", ErrSnapshotInvalid, st.NextOffset(), d.NextOffset)
	}
	if err := st.Finish(); err != nil {
		return nil, fmt.Errorf("replica: stage snapshot: %w", err)
	}
	if len(forks) > 0 {
		if err := r.cfg.Orphans.commit(forks); err != nil {
			return nil, fmt.Errorf("replica: store the snapshot's orphans: %w", err)
		}
	}
	ok = true
	// Every frame of the body lies at or below the snapshot index, which
	// becomes the compaction point: compaction deletes them later without
	// reading them (moveCompactionPoint reads only past it), so their epoch
	// is recorded as compacted now, or a log that retention deleted whole
	// would forget it on a restart (notes/simfork.md).
	return &StagedSnapshot{staging: st, base: base, decision: staged.decision, split: staged.split, meta: SnapshotMeta{Index: index, Term: term, NextOffset: d.NextOffset,
		AppendUnixNanos: appendTime, Conf: proto.Clone(meta.GetConfState()).(*raftpb.ConfState), Producers: base.encode(),
		CompactedEpoch: max(d.CompactedEpoch, staged.epoch)}}, nil
}

// checkSnapshotMessage checks the snapshot message m's envelope (type,
// index and term, voters) and returns its checked description.
func checkSnapshotMessage(m *raftpb.Message) (snapshotDesc, error) {
	snap := m.GetSnapshot()
	meta := snap.GetMetadata()
	index, term := meta.GetIndex(), meta.GetTerm()
	switch {
	case m.GetType() != raftpb.MsgSnap || snap == nil:
		return snapshotDesc{}, fmt.Errorf("%w: %v message", ErrSnapshotInvalid, m.GetType())
	case index == 0 || term == 0:
		return snapshotDesc{}, fmt.Errorf("%w: index %d term %d", ErrSnapshotInvalid, index, term)
	case len(meta.GetConfState().GetVoters()) == 0:
		return snapshotDesc{}, fmt.Errorf("%w: configuration without voters", ErrSnapshotInvalid)
	}
	d, err := decodeSnapshotDesc(snap.GetData())
	if err != nil {
		return snapshotDesc{}, err
	}
	if err := d.check(index); err != nil {
		return snapshotDesc{}, err
	}
	return d, nil
}

// stagedBody is what stageFrames found in a snapshot body.
type stagedBody struct {
	// decision is the newest compaction decision among the frames.
	decision batch.Compaction
	// split is the split marker's header (Index 0: none).
	split batch.Header
	// epoch is the highest epoch of a data frame (0: none).
	epoch uint64
}

// stageFrames reads the snapshot body's frames (as many as d describes, or
// fewer where compaction by key removed some) into the staging st, records
// those past the producer base's index in base, raises the epoch floor to
// the data frames' and returns what it found (stagedBody).
func (r *Replica) stageFrames(st *segment.Staging, body io.Reader, d snapshotDesc, base *producerBase) (stagedBody, error) {
	fr := frameReader{r: body}
	var out stagedBody
	for i := uint64(0); i < d.Frames; i++ {
		frame, err := fr.next()
		if err == io.EOF && i > 0 {
			// Fewer frames than described: compaction by key removed
			// some (and their indexes) from the leader's log. The checks
			// after the loop hold the body to its end.
			break
		}
		if err != nil {
			return out, fmt.Errorf("%w: frame %d of %d: %w", ErrSnapshotInvalid, i+1, d.Frames, err)
		}
		h, err := st.Append(frame)
		if err != nil {
			return out, fmt.Errorf("%w: frame %d of %d: %w", ErrSnapshotInvalid, i+1, d.Frames, err)
		}
		if h.Index > d.ProducersIndex {
			base.record(h)
		}
		if h.Type == batch.TypeData {
			r.raiseEpoch(h.Epoch, h.BaseOffset)
			out.epoch = max(out.epoch, h.Epoch)
		}
		if h.Type == batch.TypeSplit {
			out.split = h
		}
		if h.Type == batch.TypeCompact {
			if _, c, err := batch.DecodeCompaction(frame); err == nil && c.Point > out.decision.Point {
				out.decision = c
			}
		}
	}
	if err := fr.end(); err != nil {
		return out, fmt.Errorf("%w: after %d frames: %w", ErrSnapshotInvalid, d.Frames, err)
	}
	return out, nil
}

// frameReader reads whole frames from a snapshot body.
type frameReader struct {
	r   io.Reader
	buf []byte
}

// next returns the next frame, valid until the next call; io.EOF if the
// body ends cleanly before it.
func (f *frameReader) next() ([]byte, error) {
	var lb [4]byte
	if _, err := io.ReadFull(f.r, lb[:]); err != nil {
		return nil, err // io.EOF only when no byte of a frame came
	}
	n, err := batch.FrameSize(lb[:])
	if err != nil {
		return nil, err
	}
	if cap(f.buf) < n {
		f.buf = make([]byte, n)
	}
	f.buf = f.buf[:n]
	copy(f.buf, lb[:])
	if _, err := io.ReadFull(f.r, f.buf[4:]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return f.buf, nil
}

// end checks that the body ends here, intact.
func (f *frameReader) end() error {
	var one [1]byte
	for range 16 {
		n, err := f.r.Read(one[:])
		switch {
		case n > 0:
			return errors.New("bytes after the last frame")
		case err == io.EOF:
			return nil
		case err != nil:
			return err
		}
	}
	return io.ErrNoProgress
}

// StepSnapshot hands Raft a MsgSnap whose body ReceiveSnapshot staged.
// Raft installs it in the next ProcessReady (which swaps the staged log in)
// or declines it (a snapshot no newer than the log, a message from an old
// term), and then ProcessReady discards the staging. With st nil (the
// snapshot was stale when received) m is stepped only if it is still at or
// below the commit index, so that Raft answers the leader with its
// progress; otherwise it returns ErrSnapshotInvalid. For the driver
// goroutine.
func (r *Replica) StepSnapshot(m *raftpb.Message, st *StagedSnapshot) error {
	meta := m.GetSnapshot().GetMetadata()
	index := meta.GetIndex()
	commit := r.rn.BasicStatus().GetCommit()
	if st == nil {
		if index > commit {
			return fmt.Errorf("%w: snapshot at %d is past the commit index %d and has no body", ErrSnapshotInvalid, index, commit)
		}
		return r.step(m)
	}
	switch {
	case st.meta.Index != index || st.meta.Term != meta.GetTerm():
		st.Discard()
		return fmt.Errorf("%w: staged body is for index %d term %d, message for %d term %d",
			ErrSnapshotInvalid, st.meta.Index, st.meta.Term, index, meta.GetTerm())
	case r.failure.Load() != nil:
		st.Discard()
		return r.failure.Load()
	case index <= commit:
		st.Discard()
		return r.step(m) // it became stale meanwhile: Raft declines it
	case r.staged != nil:
		st.Discard()
		return ErrSnapshotBusy
	}
	r.staged = st
	r.snapStepped = true
	return r.step(m)
}

// installSnapshot makes the snapshot Raft restored durable: the staged log
// replaces the log, and the state records the new compaction point and
// configuration. Crash safety, step by step:
//
//  1. Save the state with Installing set (the old log is still the log).
//  2. Swap the log in (segment.Store.Install: atomic across crashes).
//  3. Save the state with the snapshot as the compaction point, its
//     configuration, Installing cleared.
//
// A replica opened after a crash between 1 and 3 finds Installing and
// tells from its log whether step 2 happened (the log ends at the snapshot
// index with its term, or, for an empty body, is empty at its next offset):
// if so it completes step 3, else it drops the record. Then the in-memory
// state follows the new log: idempotence table, append times, applied
// index, committed offset.
func (r *Replica) installSnapshot(snap *raftpb.Snapshot) error {
	meta := snap.GetMetadata()
	st := r.staged
	r.staged = nil
	if st == nil || st.meta.Index != meta.GetIndex() || st.meta.Term != meta.GetTerm() {
		st.Discard()
		return fmt.Errorf("replica: raft installs a snapshot at index %d term %d without its body", meta.GetIndex(), meta.GetTerm())
	}
	m := st.meta
	m.Conf = proto.Clone(meta.GetConfState()).(*raftpb.ConfState)
	r.state.Installing = &m
	if err := r.cfg.State.Save(r.state); err != nil {
		r.state.Installing = nil
		st.Discard()
		return fmt.Errorf("replica: save state before installing a snapshot: %w", err)
	}
	r.logCuts.Add(1) // before the log changes: snapshot bodies being read
	if err := r.cfg.Log.Install(st.staging); err != nil {
		st.Discard() // a no-op once the install committed
		return fmt.Errorf("replica: install snapshot at index %d: %w", m.Index, err)
	}
	prevConf := r.state.Conf
	r.adoptSnapshot(m)
	if err := r.cfg.State.Save(r.state); err != nil {
		return fmt.Errorf("replica: save state after installing a snapshot: %w", err)
	}
	defer r.confChanged(prevConf) // once the install is done: the callee may read the replica
	r.base = st.base
	if st.decision.Point > r.keyDecision.Point {
		r.keyDecision, r.keyMarkerEnd = st.decision, 0
	}
	if err := r.rebuildDedup(); err != nil {
		return err
	}
	if st.split.Index != 0 {
		r.noteSplitFrame(st.split) // at or below the snapshot index: rebuildDedup skips it
	}
	r.lastAppendUnixNanos = max(r.lastAppendUnixNanos, m.AppendUnixNanos)
	r.logAppendUnixNanos = max(r.logAppendUnixNanos, m.AppendUnixNanos)
	r.appliedIndex, r.appliedAppendUnixNanos = m.Index, m.AppendUnixNanos
	// The state saved with the install covers it: publish it now (lower
	// than before only when a fork in the snapshot moved a tail out).
	r.appliedEnd = m.NextOffset
	r.publishNow(m.Index, m.NextOffset)
	r.settleAfterInstall(m)
	r.snapshotsInstalled.Add(1)
	r.logger.Info("installed snapshot", "index", m.Index, "term", m.Term, "start_offset", r.cfg.Log.StartOffset(),
		"next_offset", m.NextOffset, "first_index", r.cfg.Log.FirstIndex(), "voters", m.Conf.GetVoters())
	return nil
}

// adoptSnapshot makes m the compaction point and configuration of the
// state (in memory; the caller saves it).
func (r *Replica) adoptSnapshot(m SnapshotMeta) {
	r.state.SnapshotIndex, r.state.SnapshotTerm = m.Index, m.Term
	r.state.SnapshotNextOffset, r.state.SnapshotAppendUnixNanos = m.NextOffset, m.AppendUnixNanos
	r.state.Conf, r.state.ConfIndex = proto.Clone(m.Conf).(*raftpb.ConfState), m.Index
	r.state.Producers = m.Producers
	// The leader's log below the body is this log's compacted part now:
	// its epoch stays known (HighestEpoch) with no frame of it left.
	r.state.CompactedEpoch = max(r.state.CompactedEpoch, m.CompactedEpoch)
	r.raiseEpoch(m.CompactedEpoch, m.NextOffset) // its frames were below the snapshot's end
	if r.state.Raft.GetCommit() < m.Index {
		hs := proto.Clone(r.state.Raft).(*raftpb.HardState)
		hs.Commit = proto.Uint64(m.Index)
		r.state.Raft = hs
	}
	r.state.Installing = nil
}

// settleAfterInstall answers what the snapshot decided. A replica that
// installs a snapshot is a follower, but it may hold proposals from when it
// led: one whose offsets the snapshot covers succeeded if the frame there
// is the one it proposed (same offset and term), else it was superseded.
// Later proposals stay: entries committing at their offsets answer them.
func (r *Replica) settleAfterInstall(m SnapshotMeta) {
	kept := r.proposals[:0]
	for _, p := range r.proposals {
		if p.endOffset > m.NextOffset {
			kept = append(kept, p)
			continue
		}
		frames, err := r.cfg.Log.ReadFrames(p.baseOffset, 1, p.baseOffset+1)
		h, herr := batch.DecodeHeader(frames)
		switch {
		case err != nil || herr != nil:
			p.op.Reply(Result{Err: apierr.New(apierr.Unavailable,
				"stream %s range %d: the outcome of the append at offset %d is unknown after a snapshot (retry with the same sequence)",
				r.cfg.Stream, r.cfg.Range, p.baseOffset)})
		case h.BaseOffset == p.baseOffset && h.Term == p.term:
			p.op.Reply(p.res)
		default:
			e := r.notLeader()
			e.Message += ": the proposal was superseded by a new leader"
			p.op.Reply(Result{Err: e})
		}
	}
	clear(r.proposals[len(kept):])
	r.proposals = kept
	r.settleForkAfterInstall()
	r.recheckDuplicates()
	r.answerDuplicates(r.appliedEnd)
	if p := r.pendingConf; p != nil {
		p.reply(nil, apierr.New(apierr.Unavailable, "stream %s range %d: the outcome of the membership change is unknown after a snapshot",
			r.cfg.Stream, r.cfg.Range))
		r.pendingConf = nil
	}
}
