package raftnet

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"

	"github.com/hashicorp/go-hclog"
	"go.etcd.io/raft/v3/raftpb"
)

// MemConfig configures a MemNetwork. Zero values take the documented
// defaults.
type MemConfig struct {
	// Logger defaults to a null logger; the network names it "raftnet-mem".
	Logger hclog.Logger
	// LinkQueueMessagesMax bounds the messages accepted on one link (from,
	// to) and not yet delivered or dropped, default 4096; Send refuses more
	// with ErrQueueFull, as the gRPC transport's per-peer queue does.
	LinkQueueMessagesMax int
	// BatchMessagesMax bounds the messages in one HandleMessages call,
	// default 1024.
	BatchMessagesMax int
	// MessageBytesMax bounds one encoded message, default 32 MiB.
	MessageBytesMax int
	// SnapshotBytesMax bounds one snapshot body, default 4 GiB.
	SnapshotBytesMax int64
	// SnapshotsInflightMax bounds the snapshots one node has in flight,
	// default 4.
	SnapshotsInflightMax int
}

// LinkFaults are the faults of one directed link. The zero value is a
// perfect link: every message arrives at the next Deliver, in order, once.
type LinkFaults struct {
	// DropRate is the probability that a message (or snapshot) is lost.
	// Lost messages vanish silently, as on a real network once a batch is
	// on the wire; a lost snapshot is reported failed with ErrDropped.
	DropRate float64
	// DuplicateRate is the probability that a message arrives twice (each
	// copy with its own delay). Snapshots are never duplicated.
	DuplicateRate float64
	// DelayRoundsMax delays each message by a uniform number of rounds in
	// [0, DelayRoundsMax]: it arrives that many Deliver calls late.
	DelayRoundsMax int
	// Reorder lets delayed messages overtake each other. When false the
	// link stays FIFO: a message is never delivered before one sent
	// earlier on the same link.
	Reorder bool
}

// LinkStats count what happened on one directed link (or, summed, on the
// whole network). They balance: Sent + Duplicated = Delivered + DroppedLoss
// + DroppedCut + DroppedNodeDown + InFlight.
type LinkStats struct {
	// Sent counts messages and snapshots Send and SendSnapshot accepted.
	Sent uint64
	// Refused counts those Send and SendSnapshot refused (link cut, queue
	// full, snapshots busy).
	Refused uint64
	// Duplicated counts extra copies the link made.
	Duplicated uint64
	// Delivered counts messages handed to HandleMessages and snapshots
	// handed to HandleSnapshot.
	Delivered uint64
	// DroppedLoss counts losses drawn from DropRate.
	DroppedLoss uint64
	// DroppedCut counts messages in flight when the link was cut.
	DroppedCut uint64
	// DroppedNodeDown counts messages whose sender or receiver was removed
	// (or removed and added again) while they were in flight.
	DroppedNodeDown uint64
	// InFlight counts messages accepted and not yet delivered or dropped.
	InFlight uint64
}

// Balanced reports whether s satisfies the conservation law above.
func (s LinkStats) Balanced() bool {
	return s.Sent+s.Duplicated == s.Delivered+s.DroppedLoss+s.DroppedCut+s.DroppedNodeDown+s.InFlight
}

func (s *LinkStats) add(o LinkStats) {
	s.Sent += o.Sent
	s.Refused += o.Refused
	s.Duplicated += o.Duplicated
	s.Delivered += o.Delivered
	s.DroppedLoss += o.DroppedLoss
	s.DroppedCut += o.DroppedCut
	s.DroppedNodeDown += o.DroppedNodeDown
	s.InFlight += o.InFlight
}

type linkKey struct{ from, to NodeID }

func (k linkKey) compare(o linkKey) int {
	return cmp.Or(cmp.Compare(k.from, o.from), cmp.Compare(k.to, o.to))
}

type linkState struct {
	faults    LinkFaults
	hasFaults bool // faults set for this link, not the network default
	cut       bool
	stats     LinkStats
	lastDue   uint64 // keeps a FIFO link FIFO under delays
}

// envelope is one message or snapshot on its way.
type envelope struct {
	order    uint64 // delivery tie-break: the order Deliver routed it in
	link     linkKey
	fromInc  uint64 // incarnations of the two ends when sent
	toInc    uint64
	group    GroupID
	data     []byte // encoded raftpb.Message
	due      uint64 // round it arrives in
	snapshot io.ReadCloser
}

// MemNetwork is the in-memory twin of the gRPC transport for the
// deterministic simulator. It has no goroutines and no timers: Send and
// SendSnapshot only queue, and the simulator moves time by calling Deliver,
// which applies each link's faults with the simulator's seeded generator and
// calls the receiving Handlers. Given the same calls in the same order and
// generators in the same state, it makes the same deliveries. It is safe for
// concurrent use, but determinism needs a deterministic caller.
type MemNetwork struct {
	cfg    MemConfig
	logger hclog.Logger

	mu            sync.Mutex
	round         uint64
	order         uint64
	incarnation   uint64
	nodes         map[NodeID]*MemTransport
	links         map[linkKey]*linkState
	defaultFaults LinkFaults
	outbox        []*envelope // accepted, not yet routed: in Send order
	inflight      []*envelope // routed, waiting for their round
}

// NewMemNetwork returns an empty network at round 0.
func NewMemNetwork(cfg MemConfig) *MemNetwork {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	setInt(&cfg.LinkQueueMessagesMax, 4096)
	setInt(&cfg.BatchMessagesMax, 1024)
	setInt(&cfg.MessageBytesMax, 32<<20)
	if cfg.SnapshotBytesMax <= 0 {
		cfg.SnapshotBytesMax = 4 << 30
	}
	setInt(&cfg.SnapshotsInflightMax, 4)
	return &MemNetwork{
		cfg:    cfg,
		logger: cfg.Logger.Named("raftnet-mem"),
		nodes:  make(map[NodeID]*MemTransport),
		links:  make(map[linkKey]*linkState),
	}
}

// MemTransport is one node's Transport on a MemNetwork. Its Stats count a
// message as sent when Send accepts it (the network has it), and a batch as
// sent when the network hands it to the receiver.
type MemTransport struct {
	n     *MemNetwork
	id    NodeID
	inc   uint64
	h     Handler
	stats counters

	// Guarded by n.mu.
	closed            bool
	snapshotsInflight int
}

var _ Transport = (*MemTransport)(nil)

// AddNode attaches node id with its handler. A node removed earlier may be
// added again (a restart): messages in flight to or from its earlier life
// are dropped, as a restart breaks every stream.
func (n *MemNetwork) AddNode(id NodeID, h Handler) (*MemTransport, error) {
	if id == 0 || h == nil {
		return nil, fmt.Errorf("raftnet: AddNode: node %d, handler %v", id, h)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.nodes[id]; ok {
		return nil, fmt.Errorf("raftnet: AddNode: node %d is already on the network", id)
	}
	n.incarnation++
	t := &MemTransport{n: n, id: id, inc: n.incarnation, h: h}
	n.nodes[id] = t
	return t, nil
}

// RemoveNode detaches node id, as a crash would: its transport is closed,
// and whatever is in flight to or from it is dropped at its round (counted
// DroppedNodeDown; a surviving sender hears ReportUnreachable, or a failed
// ReportSnapshot).
func (n *MemNetwork) RemoveNode(id NodeID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if t := n.nodes[id]; t != nil {
		t.closed = true
		delete(n.nodes, id)
	}
}

// SetDefaultFaults sets the faults of every link that has none of its own.
func (n *MemNetwork) SetDefaultFaults(f LinkFaults) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.defaultFaults = f
}

// SetLinkFaults sets the faults of the link from → to.
func (n *MemNetwork) SetLinkFaults(from, to NodeID, f LinkFaults) {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.link(linkKey{from, to})
	l.faults, l.hasFaults = f, true
}

// Cut cuts the link from → to (one way). Send on it fails with
// ErrPeerUnreachable; messages already in flight on it are dropped at their
// round and reported to the sender.
func (n *MemNetwork) Cut(from, to NodeID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.link(linkKey{from, to}).cut = true
}

// Heal restores the link from → to.
func (n *MemNetwork) Heal(from, to NodeID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.link(linkKey{from, to}).cut = false
}

// Partition cuts every link between a node of side and a node not in it
// that is on the network now, both ways.
func (n *MemNetwork) Partition(side ...NodeID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, a := range side {
		for b := range n.nodes {
			if !slices.Contains(side, b) {
				n.link(linkKey{a, b}).cut = true
				n.link(linkKey{b, a}).cut = true
			}
		}
	}
}

// HealAll restores every cut link (faults stay as set).
func (n *MemNetwork) HealAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, l := range n.links {
		l.cut = false
	}
}

// Round is the number of Deliver calls so far.
func (n *MemNetwork) Round() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.round
}

// InFlight is the number of messages and snapshots accepted and not yet
// delivered or dropped.
func (n *MemNetwork) InFlight() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.outbox) + len(n.inflight)
}

// LinkStats returns the counters of the link from → to.
func (n *MemNetwork) LinkStats(from, to NodeID) LinkStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	if l := n.links[linkKey{from, to}]; l != nil {
		return l.stats
	}
	return LinkStats{}
}

// Stats returns the counters of all links summed.
func (n *MemNetwork) Stats() LinkStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	var s LinkStats
	for _, l := range n.links {
		s.add(l.stats)
	}
	return s
}

func (n *MemNetwork) link(k linkKey) *linkState {
	l := n.links[k]
	if l == nil {
		l = new(linkState)
		n.links[k] = l
	}
	return l
}

func (n *MemNetwork) faults(l *linkState) LinkFaults {
	if l.hasFaults {
		return l.faults
	}
	return n.defaultFaults
}

// Send implements Transport.
func (t *MemTransport) Send(group GroupID, msg *raftpb.Message) error {
	err := t.send(group, msg)
	if err != nil {
		t.stats.countSendRefusal(err)
	}
	return err
}

func (t *MemTransport) send(group GroupID, msg *raftpb.Message) error {
	n := t.n
	data, err := encodeMessage(t.id, group, msg, false, n.cfg.MessageBytesMax)
	if err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	e, err := n.accept(t, NodeID(msg.GetTo()))
	if err != nil {
		return err
	}
	e.group, e.data = group, data
	t.stats.messagesSent.Add(1)
	t.stats.bytesSent.Add(uint64(len(data)))
	return nil
}

// accept admits one message of t for node to, or says why not; n.mu held.
func (n *MemNetwork) accept(t *MemTransport, to NodeID) (*envelope, error) {
	if t.closed {
		return nil, ErrClosed
	}
	dst := n.nodes[to]
	if dst == nil {
		return nil, fmt.Errorf("%w: node %d is not on the network", ErrUnknownNode, to)
	}
	k := linkKey{t.id, to}
	l := n.link(k)
	switch {
	case l.cut:
		l.stats.Refused++
		return nil, fmt.Errorf("%w: link %d→%d is cut", ErrPeerUnreachable, t.id, to)
	case l.stats.InFlight >= uint64(n.cfg.LinkQueueMessagesMax):
		l.stats.Refused++
		return nil, fmt.Errorf("%w: link %d→%d", ErrQueueFull, t.id, to)
	}
	l.stats.Sent++
	l.stats.InFlight++
	e := &envelope{link: k, fromInc: t.inc, toInc: dst.inc}
	n.outbox = append(n.outbox, e)
	return e, nil
}

// SendSnapshot implements Transport. The body is read at delivery, by the
// receiving Handler, on the simulator's goroutine.
func (t *MemTransport) SendSnapshot(group GroupID, msg *raftpb.Message, body io.ReadCloser) error {
	err := t.sendSnapshot(group, msg, body)
	if err != nil {
		t.stats.snapshotsSendFailed.Add(1)
		_ = body.Close() // the body is ours to close; its error tells nothing more
	}
	return err
}

func (t *MemTransport) sendSnapshot(group GroupID, msg *raftpb.Message, body io.ReadCloser) error {
	n := t.n
	data, err := encodeMessage(t.id, group, msg, true, n.cfg.MessageBytesMax)
	if err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if !t.closed && t.snapshotsInflight >= n.cfg.SnapshotsInflightMax {
		n.link(linkKey{t.id, NodeID(msg.GetTo())}).stats.Refused++
		return fmt.Errorf("%w: %d in flight", ErrSnapshotsBusy, t.snapshotsInflight)
	}
	e, err := n.accept(t, NodeID(msg.GetTo()))
	if err != nil {
		return err
	}
	e.group, e.data, e.snapshot = group, data, body
	t.snapshotsInflight++
	return nil
}

// Stats implements Transport.
func (t *MemTransport) Stats() Stats { return t.stats.snapshot() }

// Close implements Transport: it removes the node from the network.
func (t *MemTransport) Close() error {
	t.n.mu.Lock()
	defer t.n.mu.Unlock()
	if !t.closed {
		t.closed = true
		if t.n.nodes[t.id] == t {
			delete(t.n.nodes, t.id)
		}
	}
	return nil
}

// deliveryKind is what one step of a round does.
type deliveryKind int

const (
	deliverBatch deliveryKind = iota
	deliverSnapshot
	failSnapshot
	reportUnreachable
)

// delivery is one Handler call planned under the lock and made after it.
type delivery struct {
	kind     deliveryKind
	src, dst *MemTransport // src nil: sender gone, nothing to report
	to       NodeID        // reportUnreachable: the unreachable node
	envs     []*envelope
	groups   []GroupID
	err      error
}

// Deliver runs one round, driven by the simulator. First it routes every
// message sent since the last round, in send order, drawing its fate from
// rng: lost, delayed, duplicated. Then it delivers, in (round due, routing
// order), everything due by this round whose link is up and whose ends are
// the same incarnations as at send time, as one HandleMessages call per run
// of consecutive messages on a link; snapshots go to HandleSnapshot. Last it
// reports, per link, the groups whose messages a cut or a removed receiver
// dropped. Handlers run on the caller's goroutine, after the network's lock
// is released: they may Send (those messages are routed in the next round)
// but must not call Deliver. It returns the number of messages and snapshots
// delivered.
func (n *MemNetwork) Deliver(rng *rand.Rand) int {
	plan := n.plan(rng)
	delivered := 0
	for _, d := range plan {
		delivered += n.execute(d)
	}
	return delivered
}

// plan routes the outbox and lays out this round's Handler calls; n.mu held
// inside.
func (n *MemNetwork) plan(rng *rand.Rand) []delivery {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.round++
	var plan []delivery
	for _, e := range n.outbox {
		if d := n.route(e, rng); d != nil {
			plan = append(plan, *d)
		}
	}
	clear(n.outbox)
	n.outbox = n.outbox[:0]

	slices.SortFunc(n.inflight, func(a, b *envelope) int {
		return cmp.Or(cmp.Compare(a.due, b.due), cmp.Compare(a.order, b.order))
	})
	due := 0
	for due < len(n.inflight) && n.inflight[due].due <= n.round {
		due++
	}
	type lostOnLink struct {
		src  *MemTransport
		envs []*envelope
	}
	lost := make(map[linkKey]*lostOnLink)
	for _, e := range n.inflight[:due] {
		l := n.links[e.link]
		src, dst := n.alive(e.link.from, e.fromInc), n.alive(e.link.to, e.toInc)
		l.stats.InFlight--
		var dropErr error
		switch {
		case src == nil || dst == nil:
			l.stats.DroppedNodeDown++
			dropErr = fmt.Errorf("%w: node %d is down", ErrPeerUnreachable, e.link.to)
		case l.cut:
			l.stats.DroppedCut++
			dropErr = fmt.Errorf("%w: link %d→%d is cut", ErrPeerUnreachable, e.link.from, e.link.to)
		default:
			l.stats.Delivered++
		}
		switch {
		case dropErr != nil && e.snapshot != nil:
			plan = append(plan, delivery{kind: failSnapshot, src: src, envs: []*envelope{e}, err: dropErr})
		case dropErr != nil:
			if src != nil {
				if lost[e.link] == nil {
					lost[e.link] = &lostOnLink{src: src}
				}
				lost[e.link].envs = append(lost[e.link].envs, e)
			}
		case e.snapshot != nil:
			plan = append(plan, delivery{kind: deliverSnapshot, src: src, dst: dst, envs: []*envelope{e}})
		default:
			if last := len(plan) - 1; last >= 0 && plan[last].kind == deliverBatch &&
				plan[last].envs[0].link == e.link && len(plan[last].envs) < n.cfg.BatchMessagesMax {
				plan[last].envs = append(plan[last].envs, e)
			} else {
				plan = append(plan, delivery{kind: deliverBatch, src: src, dst: dst, envs: []*envelope{e}})
			}
		}
	}
	rest := copy(n.inflight, n.inflight[due:])
	clear(n.inflight[rest:])
	n.inflight = n.inflight[:rest]

	keys := make([]linkKey, 0, len(lost))
	for k := range lost {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, linkKey.compare) // map order is random; reports are not
	for _, k := range keys {
		l := lost[k]
		groups := uniqueGroups(l.envs, func(e *envelope) GroupID { return e.group })
		l.src.stats.droppedStreamBroken.Add(uint64(len(l.envs)))
		plan = append(plan, delivery{kind: reportUnreachable, src: l.src, to: k.to, groups: groups})
	}
	return plan
}

// route decides the fate of one freshly sent envelope; n.mu held. A lost
// snapshot, unlike a lost batch, fails visibly (a gRPC call would), so route
// returns the report of its failure.
func (n *MemNetwork) route(e *envelope, rng *rand.Rand) *delivery {
	l := n.links[e.link]
	f := n.faults(l)
	if f.DropRate > 0 && rng.Float64() < f.DropRate {
		l.stats.InFlight--
		l.stats.DroppedLoss++
		if e.snapshot != nil {
			return &delivery{kind: failSnapshot, src: n.alive(e.link.from, e.fromInc), envs: []*envelope{e},
				err: fmt.Errorf("%w: snapshot %d→%d", ErrDropped, e.link.from, e.link.to)}
		}
		return nil
	}
	n.schedule(e, l, f, rng)
	if e.snapshot == nil && f.DuplicateRate > 0 && rng.Float64() < f.DuplicateRate {
		dup := *e
		l.stats.Duplicated++
		l.stats.InFlight++
		n.schedule(&dup, l, f, rng)
	}
	return nil
}

// schedule gives e its round and its place in the delivery order; n.mu held.
func (n *MemNetwork) schedule(e *envelope, l *linkState, f LinkFaults, rng *rand.Rand) {
	e.order = n.nextOrder()
	e.due = n.round
	if f.DelayRoundsMax > 0 {
		e.due += uint64(rng.IntN(f.DelayRoundsMax + 1))
	}
	if !f.Reorder {
		e.due = max(e.due, l.lastDue)
		l.lastDue = e.due
	}
	n.inflight = append(n.inflight, e)
}

func (n *MemNetwork) nextOrder() uint64 {
	n.order++
	return n.order
}

// alive returns node id's transport if it is still the incarnation inc.
func (n *MemNetwork) alive(id NodeID, inc uint64) *MemTransport {
	if t := n.nodes[id]; t != nil && t.inc == inc {
		return t
	}
	return nil
}

// execute makes one planned Handler call, outside the lock, and returns how
// many messages or snapshots it delivered.
func (n *MemNetwork) execute(d delivery) int {
	switch d.kind {
	case deliverBatch:
		msgs := make([]GroupMessage, len(d.envs))
		size := 0
		for i, e := range d.envs {
			// Decoding runs the receiver's checks; the sender ran the same
			// ones before encoding, so a failure here is a bug.
			m, err := decodeMessage(e.data, e.group, d.src.id, d.dst.id, false, n.cfg.MessageBytesMax)
			if err != nil {
				panic(fmt.Sprintf("raftnet: mem network cannot decode what it encoded: %v", err))
			}
			msgs[i] = GroupMessage{Group: e.group, Message: m}
			size += len(e.data)
		}
		d.src.stats.batchesSent.Add(1)
		d.dst.stats.messagesReceived.Add(uint64(len(msgs)))
		d.dst.stats.batchesReceived.Add(1)
		d.dst.stats.bytesReceived.Add(uint64(size))
		if unknown := d.dst.h.HandleMessages(d.src.id, msgs); unknown > 0 {
			d.dst.stats.unknownGroupMessages.Add(uint64(unknown))
		}
		return len(msgs)
	case deliverSnapshot:
		e := d.envs[0]
		err := n.handleSnapshot(d.src, d.dst, e)
		n.finishSnapshot(d.src, e, err)
		return 1
	case failSnapshot:
		n.finishSnapshot(d.src, d.envs[0], d.err)
		return 0
	case reportUnreachable:
		d.src.h.ReportUnreachable(d.to, d.groups)
		return 0
	}
	panic(fmt.Sprintf("raftnet: unknown delivery kind %d", d.kind))
}

// handleSnapshot hands one snapshot to its receiver, with the body bounded
// as the gRPC receiver bounds it, and drains what the handler left unread.
func (n *MemNetwork) handleSnapshot(src, dst *MemTransport, e *envelope) error {
	m, err := decodeMessage(e.data, e.group, src.id, dst.id, true, n.cfg.MessageBytesMax)
	if err != nil {
		panic(fmt.Sprintf("raftnet: mem network cannot decode what it encoded: %v", err))
	}
	body := &boundedReader{r: e.snapshot, left: n.cfg.SnapshotBytesMax}
	err = dst.h.HandleSnapshot(src.id, e.group, m, body)
	if err == nil {
		_, err = io.Copy(io.Discard, body)
	}
	if err != nil {
		dst.stats.snapshotsReceiveFailed.Add(1)
		if errors.Is(err, ErrUnknownGroup) {
			dst.stats.unknownGroupMessages.Add(1)
		}
		return err
	}
	dst.stats.snapshotsReceived.Add(1)
	dst.stats.snapshotBytesRecvd.Add(uint64(n.cfg.SnapshotBytesMax - body.left))
	src.stats.snapshotBytesSent.Add(uint64(n.cfg.SnapshotBytesMax - body.left))
	return nil
}

// finishSnapshot closes a snapshot's body, frees its sender's slot and
// reports the outcome to the sender, if it is still there.
func (n *MemNetwork) finishSnapshot(src *MemTransport, e *envelope, err error) {
	_ = e.snapshot.Close() // the body is the transport's to close; nothing to add
	if src == nil {
		return
	}
	n.mu.Lock()
	src.snapshotsInflight--
	n.mu.Unlock()
	if err != nil {
		src.stats.snapshotsSendFailed.Add(1)
	} else {
		src.stats.snapshotsSent.Add(1)
	}
	src.h.ReportSnapshot(e.link.to, e.group, err)
}

// boundedReader fails with ErrSnapshotTooLarge past left bytes.
type boundedReader struct {
	r    io.Reader
	left int64
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// At the bound: the body must end here.
		var one [1]byte
		n, err := b.r.Read(one[:])
		if n > 0 {
			return 0, ErrSnapshotTooLarge
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}
