package replica

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"github.com/geolog/geolog/segment"
	"github.com/geolog/geolog/vfs"
	"github.com/hashicorp/go-hclog"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// interactionEnv is the world of an interaction script (interaction_test.go),
// in the manner of etcd raft's rafttest.InteractionEnv: real Replicas over
// vfs.Mem disks, with a manual transport. Nothing moves unless the script
// says so: which messages are delivered, dropped or held, when each node
// runs its Ready cycle and its log writer (when its writes become
// durable), ticks, crashes and restarts. Everything it prints is in a
// fixed order and holds no addresses or wall-clock times, so a script's
// output replays exactly.
type interactionEnv struct {
	t    testing.TB
	seed uint64
	// diskSeed, if not 0, overrides the seed the script's create gives.
	diskSeed uint64
	ids      []uint64
	nodes    map[uint64]*envNode
	queue    []envMsg        // messages in flight, in send order
	cut      map[uint64]bool // partitioned nodes
	held     map[uint64]bool // nodes whose log writer is held (writes not durable)
	out      strings.Builder // events since the last command's output
	nowNs    int64           // the virtual clock every node reads
	retain   int64           // segment.Config.RetentionBytes, 0: keep all
	// replies counts the proposals made, to name them p1, p2, ...
	replies int
	// published is the highest committed offset each node published,
	// forks how many forks its orphan log held then (checkPublished).
	published map[uint64]uint64
	forks     map[uint64]int
	// verbose traces deliveries and log writes into out.
	verbose bool
	// logger is every node's (Named per component); its lines go to the
	// test's log, or into out while logOut (the log-level command).
	logger hclog.Logger
	logOut bool
}

// envNode is one node: its disk (replaced by what a crash leaves), and,
// while up, its log and replica.
type envNode struct {
	id uint64
	fs *vfs.Mem
	st *segment.Store
	r  *Replica
	// lead, leading and stopped are as last printed.
	lead    uint64
	leading bool
	stopped bool
}

// envMsg is a message in flight; a MsgSnap carries its body.
type envMsg struct {
	m    *raftpb.Message
	body io.ReadCloser
}

// envDir is each node's range directory on its own vfs.Mem.
const envDir = "/range"

// envEpochStart is the virtual clock's zero (a fixed instant).
var envEpochStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// envTickNs is how far one tick moves the virtual clock.
const envTickNs = int64(10 * time.Millisecond)

func newInteractionEnv(t testing.TB) *interactionEnv {
	e := &interactionEnv{t: t, nodes: map[uint64]*envNode{}, cut: map[uint64]bool{}, held: map[uint64]bool{}}
	e.logger = hclog.New(&hclog.LoggerOptions{Level: hclog.Error, Output: envLogWriter{e}, DisableTime: true})
	return e
}

// setLogLevel sets every node's log level, the lines going into the
// script's output; "off" restores the default (errors, to the test log).
func (e *interactionEnv) setLogLevel(level string) {
	l := hclog.LevelFromString(level)
	if l == hclog.NoLevel {
		e.t.Fatalf("unknown log level %q", level)
	}
	e.logOut = l != hclog.Off
	if !e.logOut {
		l = hclog.Error
	}
	e.logger.SetLevel(l)
}

// create starts nodes 1..n as a new group, each on its own empty disk.
func (e *interactionEnv) create(n int) {
	for i := 1; i <= n; i++ {
		e.ids = append(e.ids, uint64(i))
	}
	for _, id := range e.ids {
		fs := vfs.NewMem(rand.New(rand.NewPCG(e.seed, id)))
		if err := vfs.EnsureDir(fs, envDir); err != nil {
			e.t.Fatal(err)
		}
		nd := &envNode{id: id, fs: fs}
		e.nodes[id] = nd
		e.start(nd)
	}
}

// start opens node nd's log, orphan log, state and replica from its disk.
func (e *interactionEnv) start(nd *envNode) {
	logger := e.logger
	var headers []batch.Header
	st, err := segment.Open(segment.Config{Dir: envDir, FS: nd.fs, SegmentBytesMax: segment.SegmentBytesMaxMin,
		RetentionBytes: e.retain, Now: e.now, Logger: logger,
		OnRecover: func(h batch.Header) error { headers = append(headers, h); return nil }})
	if err != nil {
		e.t.Fatalf("node %d: open log: %v", nd.id, err)
	}
	o, err := OpenOrphans(nd.fs, filepath.Join(envDir, OrphanDirName), logger)
	if err != nil {
		e.t.Fatalf("node %d: open orphans: %v", nd.id, err)
	}
	r, err := New(Config{
		NodeID: nd.id, Stream: "s", Peers: e.ids, Log: st, State: FileState{FS: nd.fs, Dir: envDir}, Orphans: o,
		Send: e.send,
		SendSnapshot: func(m *raftpb.Message, body io.ReadCloser) error {
			e.queue = append(e.queue, envMsg{m: proto.Clone(m).(*raftpb.Message), body: body})
			return nil
		},
		Now: e.now, Logger: logger,
	}, headers)
	if err != nil {
		e.t.Fatalf("node %d: open replica: %v", nd.id, err)
	}
	nd.st, nd.r = st, r
	nd.lead, nd.leading, nd.stopped = 0, false, false
}

func (e *interactionEnv) now() time.Time { return envEpochStart.Add(time.Duration(e.nowNs)) }

// send is every replica's Config.Send: messages wait in the queue.
func (e *interactionEnv) send(msgs []*raftpb.Message) {
	for _, m := range msgs {
		e.queue = append(e.queue, envMsg{m: proto.Clone(m).(*raftpb.Message)})
	}
}

// up returns node id's replica, or nil while it is down.
func (e *interactionEnv) up(id uint64) *Replica {
	if nd := e.nodes[id]; nd != nil {
		return nd.r
	}
	return nil
}

// crash takes node id down as a power loss would: its disk keeps only
// what was synced (vfs.Mem.Crash, drawn from the script's seed), its
// queued log writes are lost, and its pending appends get the answer a
// closing driver gives.
func (e *interactionEnv) crash(id uint64) {
	nd := e.nodes[id]
	crashed := nd.fs.Crash()
	nd.r.Close()
	nd.st.Close() // on the old disk, which is thrown away
	nd.fs, nd.st, nd.r = crashed, nil, nil
}

// restart opens node id again on what its disk holds.
func (e *interactionEnv) restart(id uint64) { e.start(e.nodes[id]) }

// readyNode runs one Ready cycle on node id; it reports whether it did.
func (e *interactionEnv) readyNode(id uint64) bool {
	r := e.up(id)
	if r == nil || !r.HasReady() {
		return false
	}
	_ = r.ProcessReady() // a failure stops the replica: noteRoles prints it
	e.noteRoles()
	return true
}

// writeNode runs node id's log writer (WriteLog) unless
// it is held; it reports whether anything was written.
func (e *interactionEnv) writeNode(id uint64) bool {
	r := e.up(id)
	if r == nil || e.held[id] {
		return false
	}
	moved := false
	if r.HasLogWrites() {
		err := r.WriteLog()
		if errors.Is(err, segment.ErrNoSpace) {
			// The writes stay queued; a driver retries after a backoff
			// (here: the next command that runs the log writer).
			return false
		}
		if err != nil {
			fmt.Fprintf(&e.out, "node %d: write log: %v\n", id, err)
		} else if e.verbose {
			fmt.Fprintf(&e.out, "node %d: log written, durable through index %d\n", id, e.nodes[id].st.LastIndex())
		}
		moved = true
	}
	return moved
}

// noteRoles prints what changed in who leads, as each node sees it, and
// which replicas stopped.
func (e *interactionEnv) noteRoles() {
	for _, id := range e.ids {
		nd := e.nodes[id]
		if nd.r == nil {
			continue
		}
		if f := nd.r.Failure(); f != nil && !nd.stopped {
			nd.stopped = true
			fmt.Fprintf(&e.out, "node %d: stopped: %s\n", id, f.Code)
		}
		leading, lead := nd.r.IsLeader(), nd.r.LeaderID()
		if leading != nd.leading && leading {
			fmt.Fprintf(&e.out, "node %d: became leader at term %d\n", id, nd.r.LeaderTerm())
		} else if leading != nd.leading {
			fmt.Fprintf(&e.out, "node %d: no longer leads (leader %d)\n", id, lead)
		}
		nd.leading, nd.lead = leading, lead
	}
}

// msgFilter selects messages in flight.
type msgFilter struct {
	from, to uint64 // 0: any
	typ      string // a raftpb.MessageType name, "": any
}

func (f msgFilter) match(m *raftpb.Message) bool {
	return (f.from == 0 || m.GetFrom() == f.from) && (f.to == 0 || m.GetTo() == f.to) &&
		(f.typ == "" || m.GetType().String() == f.typ)
}

// takeMsgs removes from the queue the first max (all if < 0) messages f
// selects, in send order.
func (e *interactionEnv) takeMsgs(f msgFilter, max int) []envMsg {
	var took []envMsg
	kept := e.queue[:0]
	for _, em := range e.queue {
		if f.match(em.m) && (max < 0 || len(took) < max) {
			took = append(took, em)
			continue
		}
		kept = append(kept, em)
	}
	clear(e.queue[len(kept):])
	e.queue = kept
	return took
}

// errUnreachable is what a sender hears for a snapshot it could not
// deliver.
var errUnreachable = errors.New("unreachable")

// deliver hands em to its destination, or drops it (a partition, a node
// that is down, or drop); trace, if set, gets one line for it.
func (e *interactionEnv) deliver(em envMsg, drop bool, trace *strings.Builder) {
	m := em.m
	to, from := m.GetTo(), m.GetFrom()
	r := e.up(to)
	if r == nil || e.cut[to] || e.cut[from] {
		drop = true
	}
	if trace != nil {
		verb := "deliver"
		if drop {
			verb = "drop"
		}
		fmt.Fprintf(trace, "%s %s\n", verb, describeMsg(m))
	}
	if em.body == nil {
		if !drop {
			if err := r.Step(m); err != nil && trace != nil {
				fmt.Fprintf(trace, "  step: %v\n", err)
			}
			// As the range driver does: an ack that completes a quorum
			// answers its appends at once, with no Ready cycle between.
			r.AnswerCommitted()
		}
		return
	}
	var err error = errUnreachable
	if !drop {
		err = e.receiveSnapshot(r, m, em.body)
	}
	em.body.Close()
	if s := e.up(from); s != nil {
		s.ReportSnapshot(to, err)
	}
}

func (e *interactionEnv) receiveSnapshot(r *Replica, m *raftpb.Message, body io.Reader) error {
	st, err := r.ReceiveSnapshot(m, body)
	if errors.Is(err, ErrSnapshotStale) {
		return r.StepSnapshot(m, nil)
	}
	if err != nil {
		fmt.Fprintf(&e.out, "node %d: refused a snapshot: %v\n", m.GetTo(), err)
		return err
	}
	return r.StepSnapshot(m, st)
}

// stabilize runs Ready cycles, log writers (but held ones) and delivers
// every message until nothing moves; with verbose, the events show what
// was delivered, dropped and written.
func (e *interactionEnv) stabilize() {
	var trace *strings.Builder
	if e.verbose {
		trace = &e.out
	}
	for round := 0; round < 1000; round++ {
		moved := false
		for _, id := range e.ids {
			moved = e.readyNode(id) || moved
		}
		for _, id := range e.ids {
			moved = e.writeNode(id) || moved
		}
		for _, em := range e.takeMsgs(msgFilter{}, -1) {
			e.deliver(em, false, trace)
			moved = true
		}
		if !moved {
			return
		}
	}
	e.t.Fatal("the group did not stabilize in 1000 rounds")
}

// tick ticks the given nodes (up ones) n times, the clock with them.
func (e *interactionEnv) tick(ids []uint64, n int) {
	for i := 0; i < n; i++ {
		e.nowNs += envTickNs
		for _, id := range ids {
			if r := e.up(id); r != nil {
				r.Tick()
			}
		}
	}
}

// describeMsg formats m on one line, entries by index/term and kind.
func describeMsg(m *raftpb.Message) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d->%d %s term=%d", m.GetFrom(), m.GetTo(), m.GetType(), m.GetTerm())
	switch m.GetType() {
	case raftpb.MsgApp:
		fmt.Fprintf(&b, " log=%d/%d commit=%d", m.GetLogTerm(), m.GetIndex(), m.GetCommit())
		if len(m.Entries) > 0 {
			fmt.Fprintf(&b, " entries=[%s]", describeEntries(m.Entries))
		}
	case raftpb.MsgAppResp:
		fmt.Fprintf(&b, " index=%d", m.GetIndex())
		if m.GetReject() {
			fmt.Fprintf(&b, " reject hint=%d", m.GetRejectHint())
		}
	case raftpb.MsgVote, raftpb.MsgPreVote:
		fmt.Fprintf(&b, " log=%d/%d", m.GetLogTerm(), m.GetIndex())
	case raftpb.MsgVoteResp, raftpb.MsgPreVoteResp:
		if m.GetReject() {
			b.WriteString(" reject")
		}
	case raftpb.MsgHeartbeat:
		fmt.Fprintf(&b, " commit=%d", m.GetCommit())
	case raftpb.MsgSnap:
		md := m.GetSnapshot().GetMetadata()
		fmt.Fprintf(&b, " snapshot=%d/%d", md.GetTerm(), md.GetIndex())
	}
	return b.String()
}

// describeEntries formats entries as index/term and what each carries.
func describeEntries(ents []*raftpb.Entry) string {
	parts := make([]string, 0, len(ents))
	for _, ent := range ents {
		parts = append(parts, fmt.Sprintf("%d/%d %s", ent.GetIndex(), ent.GetTerm(), describeEntry(ent)))
	}
	return strings.Join(parts, ", ")
}

func describeEntry(ent *raftpb.Entry) string {
	if ent.GetType() != raftpb.EntryNormal {
		return "conf"
	}
	if len(ent.Data) == 0 {
		return "empty"
	}
	h, err := batch.DecodeHeader(ent.Data)
	if err != nil {
		return "undecodable"
	}
	if h.Type != batch.TypeData {
		return h.Type.String()
	}
	return fmt.Sprintf("data[%d,%d)", h.BaseOffset, h.NextOffset())
}

// describeResult formats an append's answer.
func describeResult(r Result) string {
	if r.Err != nil {
		return describeErr(r.Err)
	}
	dup := ""
	if r.Duplicate {
		dup = " duplicate"
	}
	return fmt.Sprintf("ok offsets=[%d,%d) epoch=%d%s", r.BaseOffset, r.BaseOffset+uint64(r.RecordCount), r.Epoch, dup)
}

// describeErr formats an error by its API code, retriability and hint;
// other errors by their text.
func describeErr(err error) string {
	ae := apierr.As(err)
	if ae == nil {
		return "error: " + err.Error()
	}
	s := "error " + strings.TrimPrefix(ae.Code.String(), "ERROR_CODE_")
	if ae.Retriable {
		s += " retriable"
	}
	if ae.LeaderHint != "" {
		s += " hint=" + ae.LeaderHint
	}
	return s + ": " + ae.Message
}

// status formats node id's state on one line.
func (e *interactionEnv) status(id uint64) string {
	nd := e.nodes[id]
	if nd.r == nil {
		return fmt.Sprintf("%d: down", id)
	}
	r := nd.r
	st := r.Status()
	role := strings.TrimPrefix(st.RaftState.String(), "State")
	if f := r.Failure(); f != nil {
		role = "stopped"
	}
	mark := r.markedIndex()
	s := fmt.Sprintf("%d: %s term=%d lead=%d commit=%d applied=%d durable=%d committed=%d mark=%d pending=%d",
		id, role, st.GetTerm(), st.Lead, st.GetCommit(), st.Applied, nd.st.LastIndex(), r.Committed(), mark, r.Pending())
	if r.Relearning() {
		s += " relearning"
	}
	if e.cut[id] {
		s += " partitioned"
	}
	if e.held[id] {
		s += " writes-held"
	}
	if stt := r.Stats(); stt.SnapshotsInstalled+stt.SnapshotsSent+stt.SegmentsCompacted > 0 {
		s += fmt.Sprintf(" snapshots-sent=%d snapshots-installed=%d segments-compacted=%d",
			stt.SnapshotsSent, stt.SnapshotsInstalled, stt.SegmentsCompacted)
	}
	return s
}

// logLines formats node id's log: each frame by index/term, offsets,
// epoch, producer and values; marks are not shown (readers skip them).
func (e *interactionEnv) logLines(id uint64) string {
	st := e.nodes[id].st
	var b strings.Builder
	fmt.Fprintf(&b, "node %d: first index %d, offsets [%d,%d)\n", id, st.FirstIndex(), st.StartOffset(), st.NextOffset())
	for lo, last := st.FirstIndex(), st.LastIndex(); lo != 0 && lo <= last; {
		frames, err := st.ReadFramesByIndex(lo, last+1, 1<<20)
		if err != nil {
			e.t.Fatalf("node %d: read log at index %d: %v", id, lo, err)
		}
		next := describeFrames(&b, frames, lo)
		if next <= lo {
			break
		}
		lo = next
	}
	return b.String()
}

// describeFrames writes one line per frame and returns the index after
// the last (next if none has one).
func describeFrames(b *strings.Builder, frames []byte, next uint64) uint64 {
	for _, f := range walkFrames(b, frames) {
		fmt.Fprintf(b, "  %s\n", describeFrame(f.frame))
		if f.h.Index >= next {
			next = f.h.Index + 1
		}
	}
	return next
}

// walkedFrame is one frame of a read and its header.
type walkedFrame struct {
	frame []byte
	h     batch.Header
}

// walkFrames splits a read into its frames, up to the first that does
// not decode, which it reports in b (if not nil).
func walkFrames(b *strings.Builder, frames []byte) []walkedFrame {
	var out []walkedFrame
	for len(frames) > 0 {
		n, err := batch.FrameSize(frames)
		var h batch.Header
		if err == nil {
			h, err = batch.DecodeHeader(frames[:n])
		}
		if err != nil {
			if b != nil {
				fmt.Fprintf(b, "  bad frame: %v\n", err)
			}
			return out
		}
		out = append(out, walkedFrame{frame: frames[:n], h: h})
		frames = frames[n:]
	}
	return out
}

// describeFrame formats one frame: index/term, type, offsets, epoch,
// producer and sequence, record values.
func describeFrame(frame []byte) string {
	h, err := batch.DecodeHeader(frame)
	if err != nil {
		return "undecodable: " + err.Error()
	}
	if _, payload, err := batch.DecodeControl(frame); err == nil && h.Type == batch.TypeFork && isSkipPayload(payload) {
		return fmt.Sprintf("%d/%d skip at %d epoch=%d", h.Index, h.Term, h.BaseOffset, h.Epoch)
	}
	if h.Type != batch.TypeData {
		return fmt.Sprintf("%d/%d %s at %d epoch=%d", h.Index, h.Term, h.Type, h.BaseOffset, h.Epoch)
	}
	_, recs, err := batch.Decode(frame)
	if err != nil {
		return "undecodable: " + err.Error()
	}
	vals := make([]string, len(recs))
	for i := range recs {
		vals[i] = string(recs[i].Value)
	}
	return fmt.Sprintf("%d/%d data [%d,%d) epoch=%d producer=%d seq=%d: %s", h.Index, h.Term, h.BaseOffset,
		h.NextOffset(), h.Epoch, h.ProducerID, h.BaseSequence, strings.Join(vals, " "))
}

// orphanLines formats node id's orphan log: each fork and the frames it
// holds.
func (e *interactionEnv) orphanLines(id uint64) string {
	r := e.nodes[id].r
	var b strings.Builder
	forks := r.Orphans()
	if len(forks) == 0 {
		fmt.Fprintf(&b, "node %d: no forks\n", id)
	}
	for _, f := range forks {
		fmt.Fprintf(&b, "node %d: fork %d/%d at=%d epoch=%d prev=%d orphaned records=%d frames=%d offsets [%d,%d)\n",
			id, f.Index, f.Term, f.At, f.Epoch, f.PrevIndex, f.Records, f.Frames, f.FirstOffset, f.NextOffset)
		for from := f.FirstOffset; from < f.NextOffset; {
			frames, err := r.ReadOrphans(f.Index, from, 1<<20)
			if err != nil || len(frames) == 0 {
				fmt.Fprintf(&b, "  read at %d: %v\n", from, err)
				break
			}
			next := describeOrphans(&b, frames, f.NextOffset)
			if next <= from {
				break
			}
			from = next
		}
	}
	return b.String()
}

// describeOrphans writes the orphaned frames and returns the offset after
// the last (end if there is none).
func describeOrphans(b *strings.Builder, frames []byte, end uint64) uint64 {
	next := end
	for _, f := range walkFrames(b, frames) {
		fmt.Fprintf(b, "  %s\n", describeFrame(f.frame))
		next = f.h.NextOffset()
	}
	return next
}

// envLogWriter routes the replicas' log lines into the script's output
// (logOut) or the test's log.
type envLogWriter struct{ e *interactionEnv }

func (w envLogWriter) Write(p []byte) (int, error) {
	if w.e.logOut {
		w.e.out.Write(p)
	} else {
		w.e.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

// failOp makes node id's disk fail its k-th mutating operation from now
// (EIO), once, printing which one it failed.
func (e *interactionEnv) failOp(id uint64, k int) {
	n := 0
	e.nodes[id].fs.SetHook(func(op vfs.Op, name string) error {
		if !mutating(op) {
			return nil
		}
		if n++; n != k {
			return nil
		}
		fmt.Fprintf(&e.out, "node %d: injected EIO on %s %s\n", id, op, filepath.Base(name))
		return syscall.EIO
	})
}

// checkLogs compares the committed frames of every node that is up and
// not stopped, over the offsets all of them hold, and reports (and fails
// the test on) the first difference.
func (e *interactionEnv) checkLogs() string {
	var live []uint64
	lo, hi := uint64(0), ^uint64(0)
	for _, id := range e.ids {
		nd := e.nodes[id]
		if nd.r == nil || nd.r.Failure() != nil {
			continue
		}
		live = append(live, id)
		lo, hi = max(lo, nd.st.StartOffset()), min(hi, nd.r.Committed())
	}
	if len(live) < 2 || lo >= hi {
		return "nothing to compare\n"
	}
	first := e.committedFrames(live[0], lo, hi)
	for _, id := range live[1:] {
		if got := e.committedFrames(id, lo, hi); string(got) != string(first) {
			e.t.Errorf("node %d's log differs from node %d's in offsets [%d,%d)", id, live[0], lo, hi)
			return fmt.Sprintf("node %d's log DIFFERS from node %d's in offsets [%d,%d)\n", id, live[0], lo, hi)
		}
	}
	return fmt.Sprintf("nodes %v agree on offsets [%d,%d)\n", live, lo, hi)
}

// committedFrames returns node id's data frames covering [lo, hi).
func (e *interactionEnv) committedFrames(id uint64, lo, hi uint64) []byte {
	st := e.nodes[id].st
	var out []byte
	for off := lo; off < hi; {
		frames, err := st.ReadFrames(off, 1<<20, hi)
		if err != nil || len(frames) == 0 {
			e.t.Errorf("node %d: read at offset %d: %v", id, off, err)
			return out
		}
		out = append(out, frames...)
		next := off
		for _, f := range walkFrames(nil, frames) {
			next = max(next, f.h.NextOffset())
		}
		if next <= off {
			return out
		}
		off = next
	}
	return out
}
