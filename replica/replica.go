package replica

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/dedup"
	"github.com/hashicorp/go-hclog"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Config configures a Replica. Zero values take the documented defaults.
type Config struct {
	// NodeID is this replica's Raft id (non-zero). Required.
	NodeID uint64
	// Stream and Range name the range, for logs and errors.
	Stream string
	Range  uint32
	// Peers are the voters of a new group. Ignored when the state store
	// already holds a configuration.
	Peers []uint64
	// Log is the range's segment store. Required.
	Log FrameLog
	// State persists Raft's hard state and configuration. Required.
	State StateStore
	// Orphans is the range's orphan log (OpenOrphans on OrphanDirName in
	// the range's directory), where a fork moves a divergent tail (see
	// ProposeFork). Without it the replica refuses to propose a fork, and
	// stops rather than apply one.
	Orphans *OrphanStore
	// Send hands outgoing Raft messages to the transport. It must not block
	// and must not retain msgs past the call (it may retain the messages).
	// It is called from the driver goroutine and from the one running
	// WriteLog (a follower's acks leave as soon as they are durable), so it
	// must be safe for both. Required.
	Send func(msgs []*raftpb.Message)
	// SendSnapshot hands the transport a MsgSnap and its body, which
	// streams this leader's log frames (see snapshot.go); it must not
	// block. The transport owns body and closes it, also when SendSnapshot
	// fails; once it returned nil, the outcome must come back through
	// ReportSnapshot. Unset, every snapshot is reported failed (and a
	// follower behind the compaction point never catches up).
	SendSnapshot func(m *raftpb.Message, body io.ReadCloser) error
	// CompactionHoldBackBytesMax bounds how much log a leader keeps past
	// its retention policy for followers it can reach that are behind
	// (see Compact), default 64 MiB; negative: never hold back.
	CompactionHoldBackBytesMax int64
	// Epoch is stamped on every batch this replica proposes, default 1.
	Epoch uint64
	// Now is the clock for append times, default time.Now.
	Now func() time.Time
	// Logger defaults to a null logger.
	Logger hclog.Logger
	// ElectionTick and HeartbeatTick are in Tick calls, defaults 10 and 1.
	ElectionTick  int
	HeartbeatTick int
	// ProducersMax bounds the idempotence table, default 100,000.
	ProducersMax int
	// MaxSizePerMsg bounds one append message, default 1 MiB.
	MaxSizePerMsg uint64
	// MaxInflightMsgs bounds append messages in flight per follower,
	// default 256.
	MaxInflightMsgs int
	// MaxInflightBytes bounds the entry bytes of append messages in flight
	// per follower, default 8 MiB (Raft may pass it by one message). The
	// transport's queue to a peer is shared by every range the node
	// replicates to it and bounded (raftnet: 64 MiB, then it drops): without
	// this bound one range catching a follower up (MaxInflightMsgs of
	// MaxSizePerMsg: 256 MiB) fills that queue alone, and the heartbeats
	// and appends of every other range to that peer are dropped with it.
	MaxInflightBytes uint64
	// HoldCommits lets a leader hold the appends that only carry a new
	// commit index to a caught-up follower while appends come
	// continuously, for the next append (which carries it) to replace
	// (commithold.go). A driver that sets it calls SendHeldCommits when
	// HeldCommitsWait says.
	HoldCommits bool
	// MergeAppends merges the appends of a Ready to one follower that
	// continue one another into one message (appendmerge.go).
	MergeAppends bool
	// OnConfChange, if set, is called on the driver goroutine (within
	// ProcessReady) each time the configuration changes here: a committed
	// change applied, or a snapshot's installed; prev and next are the
	// configurations before and after, the callee's to keep. It must not
	// call back into the replica other than its getters, nor block.
	OnConfChange func(prev, next *raftpb.ConfState)
}

// Op is one append on its way through a replica.
type Op struct {
	ProducerID   uint64
	BaseSequence uint64
	RecordCount  uint32
	// Frame is the encoded batch; the replica fills in offset, epoch and
	// append time. The replica owns it after Propose.
	Frame []byte
	// Epoch is the homing epoch the proposer holds the range at (checked
	// against its lease when it decided to propose), stamped on the batch;
	// 0 means Config.Epoch. Propose refuses an epoch below the highest in
	// the log with a final STALE_EPOCH. ProposeVerbatim ignores it (the
	// frame carries its home's epoch, checked the same way).
	Epoch uint64
	// Term, if not 0, is the Raft term of leadership the proposer validated
	// the append in (LeaderTerm when it read the state the append depends
	// on): Propose refuses the append unless this replica still leads in
	// exactly that term, with a retriable NOT_LEADER (ErrTermChanged
	// matches it). A leader deposed and elected again between the proposer's
	// check and Propose would otherwise append, in the newer term, a batch
	// built without the entries of the terms between. 0: any term.
	Term uint64
	// Reply is called exactly once, from the goroutine driving the replica.
	// It must not block.
	Reply func(Result)
}

// Result is the outcome of an Op.
type Result struct {
	BaseOffset          uint64
	RecordCount         uint32
	Epoch               uint64
	AppendTimeUnixNanos int64
	Duplicate           bool
	Err                 error
}

// proposal is an Op proposed to Raft and not yet answered.
type proposal struct {
	op         *Op
	term       uint64
	baseOffset uint64
	endOffset  uint64
	// index is the Raft index of the entry, once it was queued for the log
	// in term (0 before, or if it never was).
	index uint64
	res   Result
}

// Replica is one member of a range's Raft group: the Raft state machine
// (raft.RawNode), the range's log as the Raft log, and the idempotence table.
// It has no goroutines and reads no clock but Config.Now: a driver calls
// Tick, Step, Propose and ProcessReady from one goroutine (see doc.go), and
// the simulator does the same with virtual time.
type Replica struct {
	cfg     Config
	logger  hclog.Logger
	rn      *raft.RawNode
	storage *logStorage
	state   HardState // as last saved (Commit may be ahead in memory)
	dedup   *dedup.Table
	// writer is what the driver shares with the goroutine running WriteLog
	// (logwriter.go).
	writer logWriter
	// tailIndex and tailOffset are the last index of the log as Raft sees
	// it (every entry queued for writing, written or not; the compaction
	// point if none) and the offset after it.
	tailIndex, tailOffset uint64

	isLeader            bool
	term                uint64
	proposeNext         uint64
	lastAppendUnixNanos int64 // newest append time proposed or in the log
	// proposedEpoch is the highest homing epoch this leader proposed (the
	// log's own, with the forks', is fork.epoch): see HighestEpoch.
	proposedEpoch      atomic.Uint64
	logAppendUnixNanos int64 // newest append time in the log (queued or written)
	proposals          []*proposal
	// reads are linearizable reads in progress (readindex.go).
	reads   []*readRequest
	readSeq uint64
	// floorOffset, when floorSet, bounds compaction (SetCompactionFloor).
	floorOffset uint64
	floorSet    bool
	floorShare  floorShare  // the floor shared with followers (floor.go)
	duplicates  []*proposal // answered once committed reaches endOffset
	pendingConf *confProposal
	fresh       bool // the group was created by this New
	confSeq     uint64
	// appliedIndex is the last entry applied (or installed by a snapshot),
	// appliedAppendUnixNanos the newest append time up to it: a leader's
	// snapshot is taken there.
	appliedIndex           uint64
	appliedAppendUnixNanos int64
	staged                 *StagedSnapshot // stepped, awaiting Raft's Ready
	base                   *producerBase   // decodes state.Producers
	snapReports            []snapReport    // handed to Raft after Advance
	// held are the commit-only appends a leader holds (commithold.go).
	held heldCommits
	pins snapshotPins
	// logCuts counts the forks and installed snapshots that replaced the
	// log's frames, raised before each does (snapshotBody.readFailed).
	logCuts atomic.Uint64
	// keyDecision is the newest compaction marker applied (compact.go),
	// keyMarkerEnd the offset after it.
	keyDecision  batch.Compaction
	keyMarkerEnd uint64
	fork         forkState  // fork.go
	split        splitState // split.go
	// stepped are the entries Step let Raft append since the last Ready,
	// and snapStepped says a snapshot was stepped since (peerstep.go).
	stepped     []steppedEntry
	snapStepped bool

	// raftCommit is Raft's commit index as of the last Ready, for
	// ReceiveSnapshot on the transport's goroutine.
	raftCommit                        atomic.Uint64
	snapshotsSent, snapshotsInstalled atomic.Uint64
	segmentsCompacted                 atomic.Uint64

	// committed is published to readers: offsets below it are committed,
	// applied here, and covered by the durable commit mark. appliedEnd,
	// for the driver goroutine, is where the applied entries end (ahead of
	// committed until the mark covers them); pubs wait for the mark
	// (commitmark.go).
	committed  atomic.Uint64
	appliedEnd uint64
	pubs       []pubPoint
	leaderID   atomic.Uint64
	notifyMu   sync.Mutex
	notifyCh   chan struct{}
	failure    atomic.Pointer[apierr.Error]
	// diskFull is set while the log refuses writes for space (logwriter.go).
	diskFull atomic.Pointer[apierr.Error]

	// leaderTerm is the term this replica leads in, 0 while it does not.
	leaderTerm atomic.Uint64

	// quorum, and the stopped* fields once the replica stopped: liveness.go.
	quorum            quorumWatch
	succession        successionWatch // succession.go
	stoppedOthers     atomic.Bool
	stoppedLeader     atomic.Uint64
	stoppedLeaderTerm atomic.Uint64

	// quiesce is the group's quiescence (quiesce.go).
	quiesce quiesceState
	// relearn is the relearning after a machine's crash (relearn.go);
	// relearning mirrors relearn.on for readers.
	relearn    relearnState
	relearning atomic.Bool
	// markTrusted and markSynced are Load's HardState.MarkTrusted and
	// MarkSynced, for startRelearning.
	markTrusted, markSynced bool
}

// New opens a replica over an already opened log. rebuild is called with
// every frame header of the log, in order, to rebuild the idempotence table
// (segment.Config.OnRecover gives exactly that); pass the headers seen.
func New(cfg Config, headers []batch.Header) (*Replica, error) {
	if cfg.NodeID == 0 || cfg.Log == nil || cfg.State == nil || cfg.Send == nil {
		return nil, errors.New("replica: NodeID, Log, State and Send are required")
	}
	cfg = withDefaults(cfg)
	r := &Replica{
		cfg:      cfg,
		logger:   cfg.Logger.Named("replica").With("stream", cfg.Stream, "range", cfg.Range, "node", cfg.NodeID),
		dedup:    dedup.NewTable(cfg.ProducersMax),
		writer:   newLogWriter(),
		notifyCh: make(chan struct{}),
	}
	if err := r.loadState(); err != nil {
		return nil, err
	}
	if err := r.recoverFork(headers); err != nil {
		return nil, err
	}
	if err := r.reconcileState(); err != nil {
		return nil, err
	}
	if err := r.replayLog(headers); err != nil {
		return nil, err
	}
	if err := r.initApplied(); err != nil {
		return nil, err
	}
	if err := r.startRelearning(r.markTrusted, r.markSynced); err != nil {
		return nil, err
	}
	if err := r.recoverKeyCompaction(headers); err != nil {
		return nil, err
	}
	if err := r.openForks(); err != nil {
		return nil, err
	}
	if err := r.startRaft(); err != nil {
		return nil, err
	}
	return r, nil
}

// withDefaults fills in the Config fields left zero.
func withDefaults(cfg Config) Config {
	if cfg.Epoch == 0 {
		cfg.Epoch = 1
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.ElectionTick == 0 {
		cfg.ElectionTick = 10
	}
	if cfg.HeartbeatTick == 0 {
		cfg.HeartbeatTick = 1
	}
	if cfg.ProducersMax == 0 {
		cfg.ProducersMax = 100_000
	}
	if cfg.MaxSizePerMsg == 0 {
		cfg.MaxSizePerMsg = 1 << 20
	}
	if cfg.MaxInflightMsgs == 0 {
		cfg.MaxInflightMsgs = 256
	}
	if cfg.MaxInflightBytes == 0 {
		cfg.MaxInflightBytes = max(maxInflightBytesDefault, cfg.MaxSizePerMsg)
	}
	if cfg.CompactionHoldBackBytesMax == 0 {
		cfg.CompactionHoldBackBytesMax = 64 << 20
	}
	return cfg
}

// maxInflightBytesDefault is Config.MaxInflightBytes's default.
const maxInflightBytesDefault = 8 << 20

// loadState loads the hard state (a new group's first, saved), its commit
// index raised to the newest commit mark the log holds (commitmark.go;
// reconcileState clamps it to the log), and sets up the Raft storage.
func (r *Replica) loadState() error {
	cfg := r.cfg
	st, ok, err := cfg.State.Load()
	if err != nil {
		return fmt.Errorf("replica: load state: %w", err)
	}
	if !ok {
		if len(cfg.Peers) == 0 {
			return errors.New("replica: a new group needs Peers")
		}
		st = HardState{Raft: &raftpb.HardState{}, Conf: &raftpb.ConfState{Voters: append([]uint64(nil), cfg.Peers...)}}
		if err := cfg.State.Save(st); err != nil {
			return fmt.Errorf("replica: save initial state: %w", err)
		}
	}
	if st.Raft == nil {
		st.Raft = &raftpb.HardState{}
	}
	if st.Conf == nil {
		st.Conf = &raftpb.ConfState{}
	}
	r.markTrusted, r.markSynced = st.MarkTrusted, st.MarkSynced
	r.state = withCommit(st, cfg.Log.OpenMark())
	r.fresh = !ok
	r.storage = &logStorage{log: cfg.Log, state: &r.state, snapshot: r.snapshot}
	return nil
}

// replayLog rebuilds the idempotence table, the epoch floor, the append
// times and the log's tail from the producer base and the log's headers.
func (r *Replica) replayLog(headers []batch.Header) error {
	var err error
	if r.base, err = decodeProducerBase(r.state.Producers); err != nil {
		return fmt.Errorf("replica: %w: %w", ErrStateCorrupt, err)
	}
	r.dedup = r.base.table(r.cfg.ProducersMax)
	r.raiseEpoch(r.state.CompactedEpoch, r.cfg.Log.StartOffset()) // the epoch of what retention deleted, below the log
	if f := r.state.SharedFloor; f != 0 {
		r.floorShare.learned, r.floorShare.learnedSet = f-1, true // floor.go
	}
	for _, h := range headers {
		if h.Type == batch.TypeData {
			r.raiseEpoch(h.Epoch, h.BaseOffset) // every frame held, compacted-over ones too
		}
		if h.Index > r.state.SnapshotIndex || r.state.SnapshotIndex == 0 {
			r.recordHeader(h) // the base covers the frames up to the compaction point
		} else if h.Type == batch.TypeSplit {
			r.noteSplitFrame(h) // committed below the compaction point: still the fence
		}
	}
	r.lastAppendUnixNanos = max(r.lastAppendUnixNanos, r.state.SnapshotAppendUnixNanos)
	r.logAppendUnixNanos = max(r.logAppendUnixNanos, r.state.SnapshotAppendUnixNanos)
	r.tailIndex, r.tailOffset = max(r.cfg.Log.LastIndex(), r.state.SnapshotIndex), r.cfg.Log.NextOffset()
	return nil
}

// startRaft creates the Raft node over the recovered storage.
func (r *Replica) startRaft() error {
	cfg := r.cfg
	rn, err := raft.NewRawNode(&raft.Config{
		ID:                        cfg.NodeID,
		ElectionTick:              cfg.ElectionTick,
		HeartbeatTick:             cfg.HeartbeatTick,
		Storage:                   r.storage,
		Applied:                   r.appliedIndex,
		MaxSizePerMsg:             cfg.MaxSizePerMsg,
		MaxInflightMsgs:           cfg.MaxInflightMsgs,
		MaxInflightBytes:          cfg.MaxInflightBytes,
		MaxUncommittedEntriesSize: 1 << 30,
		CheckQuorum:               true,
		PreVote:                   true,
		StepDownOnRemoval:         true,
		// A proposal carries the offsets its proposer assigned from its
		// own log's tail: a replica that still believes it leads (its
		// isLeader is as of the last Ready) must not have Raft forward
		// it to the new leader, whose tail may be elsewhere. Propose
		// fails instead, with a retriable NOT_LEADER.
		DisableProposalForwarding: true,
		// Log writes run beside the Ready loop (logwriter.go).
		AsyncStorageWrites: true,
		Logger:             raftLogger{r.logger.Named("raft")},
	})
	if err != nil {
		return fmt.Errorf("replica: %w", err)
	}
	r.rn = rn
	return nil
}

// recordHeader feeds one log frame's header to the idempotence table.
func (r *Replica) recordHeader(h batch.Header) {
	r.noteFrame(h)
	r.dedup.RecordFrame(h)
	if h.AppendTimeUnixNanos > r.lastAppendUnixNanos {
		r.lastAppendUnixNanos = h.AppendTimeUnixNanos
	}
	if h.AppendTimeUnixNanos > r.logAppendUnixNanos {
		r.logAppendUnixNanos = h.AppendTimeUnixNanos
	}
}

// staleEpoch checks a proposal's epoch against the log's: batches of an
// older homing epoch than one already in the log are refused (DESIGN.md
// "Fencing": the check happens where data is written).
func (r *Replica) staleEpoch(e uint64) *apierr.Error {
	if top := r.HighestEpoch(); e < top {
		return apierr.New(apierr.StaleEpoch, "stream %s range %d: a batch of homing epoch %d, the log is at epoch %d", r.cfg.Stream, r.cfg.Range, e, top)
	}
	return nil
}

// IsNewGroup reports whether New created the group (no saved state): the
// driver of the first voter campaigns at once instead of waiting an election
// timeout, so a new stream is writable in milliseconds.
func (r *Replica) IsNewGroup() bool { return r.fresh }

// Tick advances Raft's logical clock by one tick, and checks that a
// leader still hears from a quorum (liveness.go). A stopped replica does
// not tick.
func (r *Replica) Tick() {
	if r.failure.Load() != nil {
		return
	}
	r.rn.Tick()
	r.askRelearn(true)
	r.watchQuorum()
	r.watchLeader() // succession.go
}

// Step hands Raft a message from a peer. Messages for another replica or
// from a removed one are dropped by Raft; errors are only informational.
// A MsgSnap is refused: it needs its body (ReceiveSnapshot, StepSnapshot).
//
// Every message is checked first (peercheck.go): one that is malformed or
// inconsistent with this replica's log is refused with an error wrapping
// ErrInvalidMessage and changes nothing. Step may change m (an append's
// entries held back after a fork, a heartbeat's commit index bounded).
func (r *Replica) Step(m *raftpb.Message) error {
	if m.GetType() == raftpb.MsgSnap {
		return fmt.Errorf("%w: a snapshot message without its body", ErrSnapshotInvalid)
	}
	if err := checkShape(m); err != nil {
		return err
	}
	if r.failure.Load() != nil {
		r.stepStopped(m) // liveness.go
		return nil
	}
	if offset, none, ok := floorMessage(m); ok {
		r.learnFloor(m, offset, none) // never Raft's (floor.go)
		return nil
	}
	r.noteHeard(m)
	r.noteLeaderContact(m) // succession.go
	if m.GetType() == raftpb.MsgApp {
		r.holdBackAfterFork(m)
	}
	commit, quiesce := m.GetCommit(), takeQuiesceMarker(m) // quiesce.go; checkStep may bound the commit
	if err := r.checkStep(m); err != nil {
		return err
	}
	err := r.step(m)
	r.noteQuiesce(m, commit, quiesce)
	return err
}

func (r *Replica) step(m *raftpb.Message) error {
	err := r.rn.Step(m)
	if errors.Is(err, raft.ErrStepPeerNotFound) || errors.Is(err, raft.ErrStepLocalMsg) {
		return nil
	}
	return err
}

// ReportUnreachable tells Raft a peer could not be reached.
func (r *Replica) ReportUnreachable(id uint64) { r.rn.ReportUnreachable(id) }

// Campaign makes this replica start an election (tests, bootstrap).
func (r *Replica) Campaign() error { return r.rn.Campaign() }

// TransferLeadership asks the leader to hand leadership to to.
func (r *Replica) TransferLeadership(to uint64) { r.rn.TransferLeader(to) }

// confChanged tells Config.OnConfChange that the configuration changed
// from prev.
func (r *Replica) confChanged(prev *raftpb.ConfState) {
	if r.cfg.OnConfChange != nil {
		r.cfg.OnConfChange(proto.Clone(prev).(*raftpb.ConfState), proto.Clone(r.state.Conf).(*raftpb.ConfState))
	}
}

// Conf returns the configuration as last applied here.
func (r *Replica) Conf() *raftpb.ConfState { return proto.Clone(r.state.Conf).(*raftpb.ConfState) }

// ConfIndex is the Raft index of the configuration change Conf reflects
// (or of the snapshot it came with): Conf changes only with it.
func (r *Replica) ConfIndex() uint64 { return r.state.ConfIndex }

// Status returns Raft's status.
func (r *Replica) Status() raft.Status { return r.rn.Status() }

// AppliedIndex is Status().Applied without Status's copies of the
// configuration and of every peer's progress.
func (r *Replica) AppliedIndex() uint64 { return r.rn.BasicStatus().Applied }

// IsLeader reports whether this replica leads as of the last ProcessReady.
func (r *Replica) IsLeader() bool { return r.isLeader }

// LeaderID is the Raft id of the leader as last known, 0 if none; safe from
// any goroutine.
func (r *Replica) LeaderID() uint64 { return r.leaderID.Load() }

// LeaderTerm returns the Raft term this replica leads in, or 0 while it
// does not lead. Safe from any goroutine. A state machine that validates
// proposals against what it applied (regionsvc's cursor coordinator) reads
// everything committed before its term once per term, and notices a new
// term here.
func (r *Replica) LeaderTerm() uint64 { return r.leaderTerm.Load() }

// Pending is the number of appends proposed by this replica and not yet
// answered (driver goroutine only): a home that stopped admitting has a
// final tail once it is zero.
func (r *Replica) Pending() int { return len(r.proposals) + len(r.duplicates) }

// Committed is the committed end offset published to readers; safe from
// any goroutine. Readers may read offsets below it. It covers only entries
// applied here and recorded by the durable commit mark, so a restarted
// replica publishes at once at least what it published before
// (commitmark.go); it moves back only when a fork cuts the log.
func (r *Replica) Committed() uint64 { return r.committed.Load() }

// Failure is the error that stopped the replica, or nil.
func (r *Replica) Failure() *apierr.Error { return r.failure.Load() }

// Changed returns a channel closed when Committed or Failure next changes.
func (r *Replica) Changed() <-chan struct{} {
	r.notifyMu.Lock()
	defer r.notifyMu.Unlock()
	return r.notifyCh
}

func (r *Replica) notify() {
	r.notifyMu.Lock()
	close(r.notifyCh)
	r.notifyCh = make(chan struct{})
	r.notifyMu.Unlock()
}

// NotLeaderError is the retriable NOT_LEADER error this replica gives, with
// the leader as a "node:<id>" hint when known.
func (r *Replica) NotLeaderError() error { return r.notLeader() }

// ErrTermChanged is what Propose refuses an Op with whose Term is not the
// term this replica leads in; the error also matches a retriable
// *apierr.Error NOT_LEADER (apierr.As), so callers that know nothing of
// terms retry it like any change of leader.
var ErrTermChanged = errors.New("replica: proposal validated in an older term of leadership")

// termChanged is the error for an Op validated in term want while this
// replica leads in a later one: the proposer is to check its state again
// in the current term (this node may still lead: the hint names the
// leader as for any NOT_LEADER).
func (r *Replica) termChanged(want uint64) error {
	e := r.notLeader()
	e.Message = fmt.Sprintf("stream %s range %d: proposed for term %d, node %d leads in term %d", r.cfg.Stream, r.cfg.Range, want, r.cfg.NodeID, r.term)
	return fmt.Errorf("%w: %w", ErrTermChanged, e)
}

// notLeader is the retriable error for an append sent to a follower.
func (r *Replica) notLeader() *apierr.Error {
	e := apierr.New(apierr.NotLeader, "stream %s range %d: node %d is not the leader", r.cfg.Stream, r.cfg.Range, r.cfg.NodeID)
	if id := r.leaderID.Load(); id != 0 {
		e.LeaderHint = fmt.Sprintf("node:%d", id) // the driver maps ids to addresses
	}
	return e
}

// proposalDropped is the answer to an append Raft refused with err. While
// leadership moves (a transfer: preferred leaders, a drain, a stopped
// leader), Raft drops every proposal: the hint then names the node taking
// over, not this one, so that the producer does not come straight back
// here until the transfer ends.
func (r *Replica) proposalDropped(err error) *apierr.Error {
	e := r.notLeader()
	if t := r.rn.BasicStatus().LeadTransferee; t != 0 && t != r.cfg.NodeID {
		e = apierr.New(apierr.NotLeader, "stream %s range %d: node %d is handing leadership to node %d", r.cfg.Stream, r.cfg.Range, r.cfg.NodeID, t)
		e.LeaderHint = fmt.Sprintf("node:%d", t)
	}
	e.Message += ": " + err.Error()
	return e
}

// Propose appends op if this replica leads. Offsets are assigned here, from
// the tail of the leader's log including its own unacknowledged proposals, so
// they are dense in log order; the reply comes once the entry commits.
func (r *Replica) Propose(op *Op) { r.propose(op, false) }

// propose is Propose; leaderConfirmed says a quorum confirmed this
// replica's leadership since op arrived (see confirmRejection).
func (r *Replica) propose(op *Op, leaderConfirmed bool) {
	if r.failure.Load() != nil {
		op.Reply(Result{Err: r.StoppedAppendError()})
		return
	}
	if !r.isLeader {
		r.wakeForClient()
		op.Reply(Result{Err: r.notLeader()})
		return
	}
	if r.quorum.lost {
		// Quiesce refuses while quorum.lost, so this leader ticks already;
		// kept as defence: the ticks are what clear the watch once a
		// quorum answers, and a quiesced leader would never clear it.
		r.wakeForClient()
		op.Reply(Result{Err: r.noQuorumError()})
		return
	}
	if op.Term != 0 && op.Term != r.term {
		op.Reply(Result{Err: r.termChanged(op.Term)})
		return
	}
	if e := r.diskFull.Load(); e != nil {
		op.Reply(Result{Err: e})
		return
	}
	if err := r.forkBlocksAppends(); err != nil {
		op.Reply(Result{Err: err})
		return
	}
	epoch := op.Epoch
	if epoch == 0 {
		epoch = r.cfg.Epoch
	}
	if op.ProducerID != 0 && r.answeredByProducer(op, epoch, leaderConfirmed) {
		return
	}
	if err := r.splitBlocksAppends(); err != nil {
		op.Reply(Result{Err: err}) // after the duplicate check: split.go
		return
	}
	if err := r.staleEpoch(epoch); err != nil {
		op.Reply(Result{Err: err})
		return
	}
	now := r.cfg.Now().UnixNano()
	if now < r.lastAppendUnixNanos {
		now = r.lastAppendUnixNanos // append time never goes back within a range
	}
	base := r.proposeNext
	batch.Patch(op.Frame, base, epoch, now)
	splitting := r.proposingSplit(op.Frame)
	if !r.proposeFrame(op, Result{BaseOffset: base, RecordCount: op.RecordCount, Epoch: epoch, AppendTimeUnixNanos: now}) {
		r.split.pending = r.split.pending && !splitting
		return
	}
	if op.ProducerID != 0 {
		r.dedup.Record(op.ProducerID, dedup.Batch{
			BaseSequence: op.BaseSequence, RecordCount: op.RecordCount, BaseOffset: base,
			Epoch: epoch, AppendTimeUnixNanos: now,
		})
	}
}

// forgetDroppedProposals runs as this replica stops leading, before its
// pending proposals are answered. The idempotence table takes a batch
// when it is proposed (a retry in the same cycle is a duplicate), but
// Raft hands the entry to the log writer only at the next Ready: a leader
// deposed in between may have it overwritten in Raft's memory by the new
// leader's append, never written. A proposal of this leader whose entry
// no Ready handed over (no index noted) may be such a one, and the table
// would answer the producer's retry, were this replica to lead again, as
// a duplicate at offsets that hold another batch: it is rebuilt from the
// log, after the writes queued, as Raft handed them. An entry Raft still
// holds is recorded again when a later Ready hands it over.
func (r *Replica) forgetDroppedProposals() error {
	dropped := false
	for _, p := range r.proposals {
		if p.index == 0 && p.op.ProducerID != 0 {
			dropped = true
			break
		}
	}
	if !dropped {
		return nil
	}
	r.writer.wmu.Lock()
	defer r.writer.wmu.Unlock()
	if err := r.writeQueued(); err != nil {
		return err
	}
	return r.rebuildDedup()
}

// answeredByProducer checks op against its producer's batches in the
// idempotence table and answers it if it is a duplicate (its original
// offsets) or rejected; it reports whether op was answered.
func (r *Replica) answeredByProducer(op *Op, epoch uint64, leaderConfirmed bool) bool {
	verdict, orig, err := r.dedup.Check(op.ProducerID, op.BaseSequence, op.RecordCount, epoch)
	switch verdict {
	case dedup.Reject:
		if serr := r.splitBlocksAppends(); serr != nil && splitMovesRejected(err) {
			// A pipelined batch after one refused for the split follows a
			// gap here: it too goes to a child (split.go).
			op.Reply(Result{Err: serr})
			return true
		}
		if !leaderConfirmed {
			r.confirmRejection(op)
			return true
		}
		op.Reply(Result{Err: err})
		return true
	case dedup.Duplicate:
		p := &proposal{op: op, endOffset: orig.BaseOffset + uint64(orig.RecordCount), res: Result{
			BaseOffset: orig.BaseOffset, RecordCount: orig.RecordCount, Epoch: orig.Epoch,
			AppendTimeUnixNanos: orig.AppendTimeUnixNanos, Duplicate: true,
		}}
		if p.endOffset <= r.appliedEnd {
			op.Reply(p.res)
		} else {
			r.duplicates = append(r.duplicates, p)
		}
		return true
	}
	return false
}

// proposeFrame hands op's frame, stamped with the offsets and times of res,
// to Raft, moves the proposal tail past it, and tracks it until its entry
// commits (answered with res) or is superseded. It answers op and returns
// false when Raft refuses the proposal.
func (r *Replica) proposeFrame(op *Op, res Result) bool {
	if err := r.rn.Propose(op.Frame); err != nil {
		op.Reply(Result{Err: r.proposalDropped(err)})
		return false
	}
	end := res.BaseOffset + uint64(res.RecordCount)
	r.proposeNext = end
	if res.Epoch > r.proposedEpoch.Load() {
		r.proposedEpoch.Store(res.Epoch)
	}
	r.lastAppendUnixNanos = max(r.lastAppendUnixNanos, res.AppendTimeUnixNanos)
	r.proposals = append(r.proposals, &proposal{op: op, term: r.term, baseOffset: res.BaseOffset, endOffset: end, res: res})
	op.Frame = nil
	return true
}

// confirmRejection answers a batch the idempotence table rejects (a
// sequence gap, a batch older than the window, an overlap: final errors
// for the producer) only once a quorum has confirmed that this replica
// still leads (Raft's ReadIndex). A leader deposed without knowing it yet
// has a table that lacks what its successor appended, and would fail a
// producer that did nothing wrong; its ReadIndex fails instead, and the
// producer hears a retriable NOT_LEADER. Once leadership is confirmed the
// table holds every batch of the log (a leader's log holds everything
// committed, and only it appends in its term), so the check is repeated
// and its answer stands. Rejections are rare: the round trip costs
// nothing on the common path.
func (r *Replica) confirmRejection(op *Op) {
	r.ReadIndex(func(_ uint64, err error) {
		if err != nil {
			op.Reply(Result{Err: err})
			return
		}
		r.propose(op, true)
	})
}

// confProposal is a membership change proposed and not yet applied.
type confProposal struct {
	context []byte
	term    uint64
	at      time.Time
	reply   func(*raftpb.ConfState, error)
}

// confProposalTimeout is how long a membership change may stay unapplied
// before a new one may replace it (Raft drops a change proposed while an
// earlier one is unapplied, and says nothing).
const confProposalTimeout = 10 * time.Second

// ProposeConfChange proposes a membership change if this replica leads; reply
// gets the new configuration once the change is applied here. One change at
// a time.
func (r *Replica) ProposeConfChange(cc *raftpb.ConfChangeV2, reply func(*raftpb.ConfState, error)) {
	if f := r.failure.Load(); f != nil {
		reply(nil, f)
		return
	}
	if !r.isLeader {
		reply(nil, r.notLeader())
		return
	}
	if p := r.pendingConf; p != nil {
		if r.cfg.Now().Sub(p.at) < confProposalTimeout {
			reply(nil, apierr.New(apierr.Unavailable, "stream %s range %d: a membership change is in progress", r.cfg.Stream, r.cfg.Range))
			return
		}
		p.reply(nil, apierr.New(apierr.Timeout, "membership change not applied in %v", confProposalTimeout))
		r.pendingConf = nil
	}
	r.confSeq++
	cc = proto.Clone(cc).(*raftpb.ConfChangeV2)
	cc.Context = []byte(fmt.Sprintf("%d/%d/%d", r.cfg.NodeID, r.term, r.confSeq))
	if err := r.rn.ProposeConfChange(cc); err != nil {
		e := r.notLeader()
		e.Message += ": " + err.Error()
		reply(nil, e)
		return
	}
	r.pendingConf = &confProposal{context: cc.Context, term: r.term, at: r.cfg.Now(), reply: reply}
}

// HasReady reports whether ProcessReady has work: a Raft Ready, or
// messages and failures WriteLog left for it.
func (r *Replica) HasReady() bool {
	if r.failure.Load() != nil {
		return false
	}
	return r.writer.pending.Load() || r.rn.HasReady()
}

// ProcessReady runs one Raft Ready cycle in the order doc.go gives: step
// what WriteLog delivered, save the hard state if term or vote changed,
// send, queue the log writes (or write a truncation or snapshot here),
// apply committed entries (publish the committed offset, answer
// proposals), answer proposals the commit index covers. An error stops
// the replica: it answers everything pending and refuses further work.
func (r *Replica) ProcessReady() error {
	if r.failure.Load() != nil {
		return nil
	}
	if err := r.stepLogWritten(); err != nil {
		r.fail(err)
		return err
	}
	if !r.rn.HasReady() {
		r.stepped, r.snapStepped = r.stepped[:0], false
		return nil
	}
	rd := r.rn.Ready()
	// The Ready hands over every entry Raft took since the last one: the
	// log's tail (tailIndex) covers them once handleAppend ran.
	r.stepped, r.snapStepped = r.stepped[:0], false
	// Term and vote are durable before anything that depends on them
	// leaves or is queued (a vote, a candidate's requests, an append of
	// the new term).
	if err := r.persistHardState(&rd); err != nil {
		r.fail(err)
		return err
	}
	msgs, appendMsg, applyMsg := splitLocal(rd.Messages)
	// What Raft lets go now goes now: a leader's appends and heartbeats,
	// so that its followers write in parallel with it (Raft thesis
	// 10.2.1). Acks of appends and votes wait in appendMsg's responses
	// until what they promise is durable.
	if r.cfg.MergeAppends {
		msgs = mergeAppends(msgs, r.cfg.MaxSizePerMsg)
	}
	if msgs = r.holdCommits(msgs); len(msgs) > 0 {
		r.send(msgs)
	}
	if r.staged != nil && raft.IsEmptySnap(rd.Snapshot) {
		// Raft declined the snapshot stepped with it (not newer than the
		// log, or from an old term).
		r.staged.Discard()
		r.staged = nil
	}
	if appendMsg != nil {
		if err := r.handleAppend(appendMsg); err != nil {
			r.fail(err)
			return err
		}
	}
	st := r.noteRole(rd.SoftState)
	if applyMsg != nil {
		if err := r.applyCommitted(applyMsg); err != nil {
			r.fail(err)
			return err
		}
	}
	r.answerCommittedIndex(st.GetCommit(), st.GetTerm())
	r.raftCommit.Store(r.state.Raft.GetCommit())
	r.takeRelearnAnswers(rd.ReadStates)
	r.processReads(rd.ReadStates)
	if err := r.finishRelearning(); err != nil {
		r.fail(err)
		return err
	}
	r.askRelearn(false)
	for _, rep := range r.snapReports {
		r.rn.ReportSnapshot(rep.to, rep.status)
	}
	clear(r.snapReports)
	r.snapReports = r.snapReports[:0]
	return nil
}

// splitLocal splits a Ready's messages into those for peers and the ones
// for the local append and apply threads, which Raft puts last.
func splitLocal(msgs []*raftpb.Message) (peers []*raftpb.Message, appendMsg, applyMsg *raftpb.Message) {
	for len(msgs) > 0 {
		m := msgs[len(msgs)-1]
		if to := m.GetTo(); to == raft.LocalAppendThread {
			appendMsg = m
		} else if to == raft.LocalApplyThread {
			applyMsg = m
		} else {
			break
		}
		msgs = msgs[:len(msgs)-1]
	}
	return msgs, appendMsg, applyMsg
}

// noteRole takes a Ready's soft state (nil: unchanged): the leader, and
// whether this replica leads; it returns Raft's basic status.
func (r *Replica) noteRole(ss *raft.SoftState) raft.BasicStatus {
	if ss != nil {
		r.leaderID.Store(ss.Lead)
		wasLeader := r.isLeader
		r.isLeader = ss.RaftState == raft.StateLeader
		if r.isLeader && !wasLeader {
			// Every entry of this leader's log is queued by now (this
			// Ready's included), written or not; its own proposals
			// continue from the log's tail.
			r.proposeNext = r.tailOffset
			r.proposedEpoch.Store(0) // a new leader's floor is its log's
			r.logger.Info("became leader", "term", r.rn.BasicStatus().GetTerm(), "next_offset", r.proposeNext)
		}
		if wasLeader && !r.isLeader {
			if err := r.forgetDroppedProposals(); err != nil {
				r.fail(err)
			}
		}
		r.leadershipChanged(wasLeader)
		if wasLeader && !r.isLeader {
			r.stepDownFloor() // floor.go
		}
		if !r.isLeader {
			r.held = heldCommits{} // a follower learns the commit from its new leader
		}
	}
	st := r.rn.BasicStatus()
	r.term = st.GetTerm()
	if r.isLeader {
		r.leaderTerm.Store(r.term)
	} else {
		r.leaderTerm.Store(0)
	}
	return st
}

// applyCommitted applies the committed entries Raft handed over (only once
// they are in this replica's log, durably: readers may read them), steps
// the responses that wait for them, and asks for a commit mark covering
// them (commitmark.go).
func (r *Replica) applyCommitted(applyMsg *raftpb.Message) error {
	for _, e := range applyMsg.GetEntries() {
		if err := r.apply(e); err != nil {
			return err
		}
		r.appliedIndex = e.GetIndex()
	}
	for _, m := range applyMsg.GetResponses() {
		_ = r.step(m)
	}
	r.storage.cache.trim(r.appliedIndex)
	r.markApplied()
	r.publish()
	return nil
}

// persistHardState saves Raft's hard state when its term or vote changed.
// Term and vote must be durable before any message goes out; the commit
// index need not be (a restarted replica relearns it), so it rides along
// only when the file is written anyway.
func (r *Replica) persistHardState(rd *raft.Ready) error {
	if raft.IsEmptyHardState(rd.HardState) {
		return nil
	}
	old := r.state.Raft
	r.state.Raft = proto.Clone(rd.HardState).(*raftpb.HardState)
	if old.GetTerm() != rd.HardState.GetTerm() || old.GetVote() != rd.HardState.GetVote() {
		if tv, ok := r.cfg.State.(termVoteSaver); ok {
			// In place: an election needs no new disk space.
			if err := tv.SaveTermVote(rd.HardState.GetTerm(), rd.HardState.GetVote()); err != nil {
				return fmt.Errorf("replica: save term and vote: %w", err)
			}
			return nil
		}
		if err := r.cfg.State.Save(r.state); err != nil {
			return fmt.Errorf("replica: save hard state: %w", err)
		}
	}
	return nil
}

// termVoteSaver is a StateStore that can record a change of term and vote
// alone, in place (FileState, MemState). Load must merge it.
type termVoteSaver interface {
	SaveTermVote(term, vote uint64) error
}

// rebuildDedup recomputes the idempotence table from the producer base and
// the log after the compaction point, after a truncation removed entries
// it had recorded or an install replaced the log.
func (r *Replica) rebuildDedup() error {
	r.dedup = r.base.table(r.cfg.ProducersMax)
	r.fork.unapplied = r.fork.unapplied[:0] // noted again as the log is replayed
	r.forgetUnappliedSplit()
	// Append times too are recomputed from what is left, so that a control
	// frame written next carries the same time on every replica (the time of
	// the identical log prefix before it).
	r.lastAppendUnixNanos, r.logAppendUnixNanos = r.state.SnapshotAppendUnixNanos, r.state.SnapshotAppendUnixNanos
	first, last := max(r.cfg.Log.FirstIndex(), r.state.SnapshotIndex+1), r.cfg.Log.LastIndex()
	if last < first {
		first = 0
	}
	for lo := first; first != 0 && lo <= last; {
		frames, err := r.cfg.Log.ReadFramesByIndex(lo, last+1, 4<<20)
		if err != nil {
			return fmt.Errorf("replica: rebuild idempotence state: %w", err)
		}
		for len(frames) > 0 {
			n, err := batch.FrameSize(frames)
			if err != nil {
				return err
			}
			h, err := batch.DecodeHeader(frames[:n])
			if err != nil {
				return err
			}
			r.recordHeader(h)
			lo = h.Index + 1
			frames = frames[n:]
		}
	}
	return nil
}

// apply applies one committed entry.
func (r *Replica) apply(e *raftpb.Entry) error {
	switch e.GetType() {
	case raftpb.EntryNormal:
		if len(e.Data) == 0 {
			// A new leader's first entry commits every entry of earlier
			// terms that survived; proposals of earlier terms not among them
			// are lost.
			r.failProposals(func(p *proposal) bool { return p.term < e.GetTerm() }, "superseded by a new leader")
			r.supersedeFork(e.GetTerm())
			if p := r.pendingConf; p != nil && p.term < e.GetTerm() {
				e := r.notLeader()
				e.Message += ": the membership change was superseded by a new leader"
				p.reply(nil, e)
				r.pendingConf = nil
			}
			return nil
		}
		if batch.IsFork(e.Data) {
			return r.applyFork(e)
		}
		h, err := batch.DecodeHeader(e.Data)
		if err != nil {
			return fmt.Errorf("replica: committed entry %d: %w", e.GetIndex(), err)
		}
		if h.Type == batch.TypeCompact {
			if err := r.noteCompaction(e.Data); err != nil {
				return fmt.Errorf("replica: committed compaction marker %d: %w", e.GetIndex(), err)
			}
		}
		r.appliedAppendUnixNanos = max(r.appliedAppendUnixNanos, h.AppendTimeUnixNanos)
		r.advance(h, e.GetTerm())
	case raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
		cc, err := decodeConfChange(e)
		if err != nil {
			return fmt.Errorf("replica: conf change at %d: %w", e.GetIndex(), err)
		}
		if err := checkConfChange(r.state.Conf, cc); err != nil {
			// Raft panics on a change its configuration cannot take.
			// Every replica holds the same configuration here, so every
			// one skips the entry alike.
			r.refuseConfChange(cc, e.GetIndex(), err)
			return nil
		}
		prev := r.state.Conf
		r.state.Conf = r.rn.ApplyConfChange(cc)
		r.state.ConfIndex = e.GetIndex()
		if err := r.cfg.State.Save(r.state); err != nil {
			return fmt.Errorf("replica: save configuration: %w", err)
		}
		if p := r.pendingConf; p != nil {
			if c2, ok := cc.(*raftpb.ConfChangeV2); ok && string(c2.Context) == string(p.context) {
				p.reply(proto.Clone(r.state.Conf).(*raftpb.ConfState), nil)
			} else {
				p.reply(nil, apierr.New(apierr.Unavailable, "another membership change was applied first"))
			}
			r.pendingConf = nil
		}
		r.logger.Info("configuration changed", "index", e.GetIndex(), "voters", r.state.Conf.GetVoters(), "learners", r.state.Conf.GetLearners())
		r.confChanged(prev)
	}
	return nil
}

// advance applies a committed data entry (published once the commit mark
// covers it: commitmark.go) and answers what it settles.
func (r *Replica) advance(h batch.Header, term uint64) {
	r.appliedEnd = max(r.appliedEnd, h.NextOffset())
	r.answerProposals(h, term)
}

// answerCommittedIndex answers, from the oldest, the proposals that Raft's
// commit index covers: a quorum has them durably, whether or not this
// replica's own write has finished (it need not wait for that fsync, nor
// for the apply that follows it). Only proposals of the current term
// qualify: this replica led that term, so the entry at the proposal's index
// is the one it appended, and nothing can have overwritten it since (only
// a leader of a later term could). The rest are answered when their offset
// is applied (answerProposals).
func (r *Replica) answerCommittedIndex(commit, term uint64) {
	for len(r.proposals) > 0 {
		p := r.proposals[0]
		if p.index == 0 || p.index > commit || p.term != term {
			return
		}
		r.proposals[0] = nil
		r.proposals = r.proposals[1:]
		p.op.Reply(p.res)
	}
}

// AnswerCommitted answers at once the proposals of the current term that
// Raft's commit index covers, without waiting for the next Ready cycle:
// the driver calls it after Step, so that the follower's ack that
// completes a quorum is answered as soon as it is stepped (no Ready cycle,
// no encoding of the entries proposed meanwhile, no apply before it). The
// commit index counts a replica's copy only once it is durable (a
// follower's MsgAppResp leaves after its fdatasync; a leader counts itself
// after its own, through WriteLog), so an answer here, as in ProcessReady,
// means a quorum has the batch durably. A group of one commits only in
// ProcessReady (its own write), which answers after applying and
// publishing. For the driver goroutine.
func (r *Replica) AnswerCommitted() {
	if len(r.proposals) == 0 || r.proposals[0].index == 0 || r.failure.Load() != nil {
		return
	}
	st := r.rn.BasicStatus()
	r.answerCommittedIndex(st.GetCommit(), st.GetTerm())
}

// answerProposals answers the proposals and duplicates that the committed
// entry with header h (of term) settles.
func (r *Replica) answerProposals(h batch.Header, term uint64) {
	end := h.NextOffset()
	for len(r.proposals) > 0 && r.proposals[0].baseOffset < end {
		p := r.proposals[0]
		r.proposals[0] = nil
		r.proposals = r.proposals[1:]
		if p.baseOffset == h.BaseOffset && p.term == term {
			p.op.Reply(p.res)
			continue
		}
		// Another entry committed at this offset: ours was overwritten
		// after a leader change. Its outcome is known: not appended.
		e := r.notLeader()
		e.Message += ": the proposal was superseded by a new leader"
		p.op.Reply(Result{Err: e})
	}
	r.answerDuplicates(end)
}

// recheckDuplicates fails the duplicates waiting for an original the log
// no longer holds. A retry is answered as a duplicate of a batch in this
// replica's log, committed or not; a truncation or an install may then
// replace that batch with another leader's at the same offsets, and the
// duplicate must not be answered with them. The idempotence table is
// rebuilt from the log first, so a duplicate stands exactly if the table
// still maps it to the same batch.
func (r *Replica) recheckDuplicates() {
	kept := r.duplicates[:0]
	for _, p := range r.duplicates {
		v, orig, _ := r.dedup.Check(p.op.ProducerID, p.op.BaseSequence, p.op.RecordCount, 0) // only a duplicate matters here
		if v == dedup.Duplicate && orig.BaseOffset == p.res.BaseOffset && orig.Epoch == p.res.Epoch &&
			orig.AppendTimeUnixNanos == p.res.AppendTimeUnixNanos {
			kept = append(kept, p)
			continue
		}
		e := r.notLeader()
		e.Message += ": the batch it repeats was superseded by a new leader"
		p.op.Reply(Result{Err: e})
	}
	clear(r.duplicates[len(kept):])
	r.duplicates = kept
}

// answerDuplicates answers the duplicates whose originals end by end.
func (r *Replica) answerDuplicates(end uint64) {
	kept := r.duplicates[:0]
	for _, p := range r.duplicates {
		if p.endOffset <= end {
			p.op.Reply(p.res)
		} else {
			kept = append(kept, p)
		}
	}
	clear(r.duplicates[len(kept):])
	r.duplicates = kept
}

func (r *Replica) failProposals(match func(*proposal) bool, why string) {
	kept := r.proposals[:0]
	for _, p := range r.proposals {
		if match(p) {
			e := r.notLeader()
			e.Message += ": " + why
			p.op.Reply(Result{Err: e})
			continue
		}
		kept = append(kept, p)
	}
	clear(r.proposals[len(kept):])
	r.proposals = kept
}

// fail stops the replica and answers everything pending.
func (r *Replica) fail(err error) {
	e := apierr.New(apierr.Unavailable, "stream %s range %d: replica stopped: %v", r.cfg.Stream, r.cfg.Range, err)
	if r.failure.CompareAndSwap(nil, e) {
		r.logger.Error("replica stopped", "error", err)
		r.leaveOnFailure(e) // liveness.go
		r.notify()
	}
	f := r.failure.Load()
	for _, p := range append(r.proposals, r.duplicates...) {
		p.op.Reply(Result{Err: f})
	}
	r.proposals, r.duplicates = nil, nil
	r.failFork(f)
	r.failSkip(f)
	if p := r.pendingConf; p != nil {
		p.reply(nil, f)
		r.pendingConf = nil
	}
	for _, rq := range r.reads {
		rq.reply(0, f)
	}
	r.reads = nil
}

// Close answers everything pending with a retriable SHUTTING_DOWN,
// discards a snapshot staged and not yet installed, and drops log writes
// not yet taken by WriteLog (as a crash would; a driver that shuts down
// gracefully calls WriteLog once more first). For the driver goroutine.
func (r *Replica) Close() {
	e := apierr.New(apierr.ShuttingDown, "replica is closing")
	r.failure.CompareAndSwap(nil, e)
	r.fail(errors.New("closing"))
	r.staged.Discard()
	r.staged = nil
	r.writer.mu.Lock()
	r.writer.closed = true
	r.writer.queue, r.writer.queuedBytes, r.writer.local = nil, 0, nil
	r.writer.mu.Unlock()
	r.closeRecorder()
}

// raftLogger routes etcd raft's logging to hclog. A message is formatted
// only if its level is on: raft logs at Info on every election and role
// change, and formatting it for a logger that drops it cost the simulator
// 3% of its CPU (notes/simfast.md).
type raftLogger struct{ l hclog.Logger }

func (l raftLogger) Debug(v ...any) {
	if l.l.IsDebug() {
		l.l.Debug(fmt.Sprint(v...))
	}
}
func (l raftLogger) Debugf(format string, v ...any) {
	if l.l.IsDebug() {
		l.l.Debug(fmt.Sprintf(format, v...))
	}
}
func (l raftLogger) Error(v ...any) {
	if l.l.IsError() {
		l.l.Error(fmt.Sprint(v...))
	}
}
func (l raftLogger) Errorf(format string, v ...any) {
	if l.l.IsError() {
		l.l.Error(fmt.Sprintf(format, v...))
	}
}
func (l raftLogger) Info(v ...any)                 { l.Debug(v...) }
func (l raftLogger) Infof(format string, v ...any) { l.Debugf(format, v...) }
func (l raftLogger) Warning(v ...any) {
	if l.l.IsWarn() {
		l.l.Warn(fmt.Sprint(v...))
	}
}
func (l raftLogger) Warningf(format string, v ...any) {
	if l.l.IsWarn() {
		l.l.Warn(fmt.Sprintf(format, v...))
	}
}
func (l raftLogger) Fatal(v ...any)                 { panic(fmt.Sprint(v...)) }
func (l raftLogger) Fatalf(format string, v ...any) { panic(fmt.Sprintf(format, v...)) }
func (l raftLogger) Panic(v ...any)                 { panic(fmt.Sprint(v...)) }
func (l raftLogger) Panicf(format string, v ...any) { panic(fmt.Sprintf(format, v...)) }
