package replica

import (
	"errors"
	"fmt"

	"github.com/geolog/geolog/apierr"
	"github.com/geolog/geolog/batch"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/confchange"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"
)

// Messages from peers (DESIGN.md invariant 9: nothing from the network can
// panic a node or change its state without the authority to do so).
//
// etcd raft takes its peers' word for the shape of their messages: a
// heartbeat whose commit index is past its log, entries whose indexes do
// not follow the message's, or an append that conflicts with a committed
// entry make it panic. And this package stores a leader's frames as they
// are: a frame whose offsets do not continue the log here would break
// invariant 2 (and stopped the node on a panic before). So every message
// is checked before Raft sees it, in two layers:
//
//   - CheckPeerMessage, on the message alone (the transport runs it on
//     receipt and ends the stream of a peer that sends a bad one): only
//     types a peer sends, never a proposal (they are never forwarded:
//     DisableProposalForwarding), bounded numbers, entries that follow the
//     message's index and terms, frames that decode (CRC and structure),
//     data, fork and compaction marker frames whose offsets chain (with
//     holes only before frames compaction by key rewrote), configuration
//     changes that decode.
//   - Step, against this replica's log as Raft will see it: an append
//     that Raft would take must continue the log at the offset the log
//     has where the append starts, and must not overwrite a committed
//     entry; an append acknowledgement must not claim entries past the
//     log; a heartbeat's commit index is bounded by the log.
//
// A refused message is not stepped and changes nothing; Step returns an
// error wrapping ErrInvalidMessage. What a well-formed message from a peer
// may still do (a higher term, entries that continue the log correctly)
// is the business of the peer's identity (authentication), not of these
// checks.

// ErrInvalidMessage reports a Raft message from a peer that the replica
// refused without stepping it: malformed, or inconsistent with this
// replica's log.
var ErrInvalidMessage = errors.New("replica: invalid raft message")

// peerNumberMax bounds the terms and indexes a peer may name: real ones
// never come near it, and Raft adds to them (a term at the top of uint64
// would wrap to 0 in the next election).
const peerNumberMax = 1 << 62

// peerEntriesMax bounds the entries of one append message.
const peerEntriesMax = 1 << 16

// ErrMessageDropped reports a well-formed Raft message from a peer that
// the replica dropped because its state cannot take it now (a leadership
// transfer that reached a node no longer leading, an append right after a
// snapshot not yet taken in): a correct peer may send one in a race; Raft
// recovers from the loss.
var ErrMessageDropped = errors.New("replica: raft message dropped")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidMessage, fmt.Sprintf(format, args...))
}

// CheckPeerMessage validates a Raft message received from a peer on its
// own, frames included (CRC and structure). Errors wrap ErrInvalidMessage.
// MsgSnap passes here (its body is checked where it is received).
func CheckPeerMessage(m *raftpb.Message) error {
	if err := checkShape(m); err != nil {
		return err
	}
	for _, e := range m.GetEntries() {
		if e.GetType() == raftpb.EntryNormal && len(e.GetData()) > 0 {
			if _, err := batch.Validate(e.GetData()); err != nil {
				return invalid("entry %d: %v", e.GetIndex(), err)
			}
		}
	}
	return nil
}

// checkShape is CheckPeerMessage without the frames' CRC and record walk:
// what Step checks itself (the transport verified the rest, and the log
// writer validates every frame it stores).
func checkShape(m *raftpb.Message) error {
	if m == nil {
		return invalid("nil message")
	}
	t := m.GetType()
	switch {
	case t == raftpb.MsgProp:
		return invalid("a proposal from node %d: proposals are never forwarded", m.GetFrom())
	case raft.IsLocalMsg(t):
		return invalid("local message type %s from node %d", t, m.GetFrom())
	case m.GetTerm() == 0 && t != raftpb.MsgReadIndex:
		// Raft steps a message of term 0 as a local one, whatever its
		// type; a peer sets the term on all but a forwarded read index.
		return invalid("%s from node %d without a term", t, m.GetFrom())
	case m.GetTerm() != 0 && t == raftpb.MsgReadIndex:
		// A follower forwards a read index to its leader as it came,
		// and Raft panics sending one with a term.
		return invalid("%s from node %d with a term", t, m.GetFrom())
	case m.GetFrom() == 0 || m.GetFrom() == m.GetTo():
		return invalid("%s from node %d to node %d", t, m.GetFrom(), m.GetTo())
	case len(m.GetResponses()) > 0:
		return invalid("%s carries local responses", t)
	}
	for _, v := range []uint64{m.GetTerm(), m.GetLogTerm(), m.GetIndex(), m.GetCommit(), m.GetRejectHint()} {
		if v >= peerNumberMax {
			return invalid("%s names %d, past the bound %d", t, v, uint64(peerNumberMax))
		}
	}
	if t == raftpb.MsgReadIndex || t == raftpb.MsgReadIndexResp {
		// A read index forwarded by a follower (a restarted replica
		// relearning its commit index: relearn.go), and its answer,
		// carry the request's context as their one entry.
		if ents := m.GetEntries(); len(ents) != 1 || len(ents[0].GetData()) > readContextBytesMax ||
			ents[0].GetIndex() != 0 || ents[0].GetTerm() != 0 || ents[0].GetType() != raftpb.EntryNormal {
			return invalid("%s from node %d without one small context entry", t, m.GetFrom())
		}
		return nil
	}
	if len(m.GetEntries()) > 0 && t != raftpb.MsgApp {
		return invalid("%s carries entries", t)
	}
	if t == raftpb.MsgApp {
		return checkEntries(m)
	}
	return nil
}

// readContextBytesMax bounds a read index request's context (this
// replica's own are 8 bytes, or relearnContext's).
const readContextBytesMax = 64

// checkEntries checks an append's entries against the message: indexes
// follow m.Index, terms do not decrease from m.LogTerm nor pass m.Term,
// every entry is of a kind a leader proposes, and the offsets of its data,
// fork and marker frames chain.
func checkEntries(m *raftpb.Message) error {
	ents := m.GetEntries()
	if len(ents) > peerEntriesMax {
		return invalid("append of %d entries, bound %d", len(ents), peerEntriesMax)
	}
	term := m.GetLogTerm()
	var next uint64
	var appendTime int64
	chained := false
	for i, e := range ents {
		if e.GetIndex() != m.GetIndex()+1+uint64(i) {
			return invalid("entry %d of an append after index %d has index %d", i, m.GetIndex(), e.GetIndex())
		}
		if e.GetTerm() < term || e.GetTerm() > m.GetTerm() {
			return invalid("entry %d has term %d, after term %d in a message of term %d", e.GetIndex(), e.GetTerm(), term, m.GetTerm())
		}
		term = e.GetTerm()
		h, framed, err := entryHeader(e)
		if err != nil {
			return err
		}
		if !framed {
			continue
		}
		if chained && !continues(h, next) {
			return invalid("entry %d starts at offset %d, the entry before it ends at %d", e.GetIndex(), h.BaseOffset, next)
		}
		if chained && h.AppendTimeUnixNanos < appendTime {
			return invalid("entry %d has append time %d, the entry before it %d", e.GetIndex(), h.AppendTimeUnixNanos, appendTime)
		}
		next, appendTime, chained = h.NextOffset(), h.AppendTimeUnixNanos, true
	}
	return nil
}

// entryHeader checks one entry's kind and returns its frame's header when
// it carries a frame with offsets (a data, fork or compaction marker
// frame; framed false for
// a leader's empty entry and configuration changes, which take their
// offset from the log they land in).
func entryHeader(e *raftpb.Entry) (batch.Header, bool, error) {
	switch e.GetType() {
	case raftpb.EntryNormal:
		if len(e.GetData()) == 0 {
			return batch.Header{}, false, nil
		}
		h, err := batch.PeekHeader(e.GetData())
		size, _ := batch.FrameSize(e.GetData())
		switch {
		case err != nil:
			return h, false, invalid("entry %d: %v", e.GetIndex(), err)
		case size != len(e.GetData()):
			return h, false, invalid("entry %d: %d bytes after its frame", e.GetIndex(), len(e.GetData())-size)
		case h.Type == batch.TypeData && h.RecordCount == 0 && !h.Compacted():
			return h, false, invalid("entry %d: a data frame without records", e.GetIndex())
		case h.Type == batch.TypeFork:
			// As proposed: a fork frame follows its predecessor (the
			// frame that ends a gap is rewritten where the fork applies,
			// and Raft never sends it).
			payload := e.GetData()[batch.HeaderSize:size]
			if isSkipPayload(payload) {
				if _, err := decodeSkipDesc(payload); err != nil {
					return h, false, invalid("entry %d: skip frame: %v", e.GetIndex(), err)
				}
			} else if d, err := decodeForkDesc(payload); err != nil || d.PrevIndex != 0 {
				return h, false, invalid("entry %d: fork frame %+v: %v", e.GetIndex(), d, err)
			}
		case h.Type != batch.TypeData && h.Type != batch.TypeCompact && h.Type != batch.TypeSplit:
			return h, false, invalid("entry %d: a %s frame is not proposed", e.GetIndex(), h.Type)
		}
		return h, true, nil
	case raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
		if err := checkConfChangeData(e); err != nil {
			return batch.Header{}, false, invalid("entry %d: %v", e.GetIndex(), err)
		}
		return batch.Header{}, false, nil
	default:
		return batch.Header{}, false, invalid("entry %d has type %v", e.GetIndex(), e.GetType())
	}
}

// continues reports whether a frame of header h may follow a log that
// goes on at offset next: at next, or past it for a frame compaction by
// key rewrote (a mirror proposes those as the home shipped them; the
// offsets between were compacted away).
func continues(h batch.Header, next uint64) bool {
	return h.BaseOffset == next || (h.Compacted() && h.BaseOffset > next)
}

// checkConfChangeData checks that a configuration change entry decodes to
// changes of known kinds naming real nodes.
func checkConfChangeData(e *raftpb.Entry) error {
	cc, err := decodeConfChange(e)
	if err != nil {
		return err
	}
	v2 := cc.AsV2()
	if _, ok := raftpb.ConfChangeTransition_name[int32(v2.GetTransition())]; !ok {
		return fmt.Errorf("conf change transition %d", v2.GetTransition())
	}
	for _, c := range v2.GetChanges() {
		if _, ok := raftpb.ConfChangeType_name[int32(c.GetType())]; !ok || c.GetNodeId() == 0 || c.GetNodeId() >= peerNumberMax {
			return fmt.Errorf("conf change %s of node %d", c.GetType(), c.GetNodeId())
		}
	}
	return nil
}

// decodeConfChange decodes a configuration change entry.
func decodeConfChange(e *raftpb.Entry) (raftpb.ConfChangeI, error) {
	if e.GetType() == raftpb.EntryConfChange {
		var c1 raftpb.ConfChange
		if err := proto.Unmarshal(e.GetData(), &c1); err != nil {
			return nil, err
		}
		return &c1, nil
	}
	var c2 raftpb.ConfChangeV2
	if err := proto.Unmarshal(e.GetData(), &c2); err != nil {
		return nil, err
	}
	return &c2, nil
}

// checkConfChange reports whether Raft, at configuration conf, can take
// the change cc: the check Raft's ApplyConfChange makes (and panics on),
// run on a copy.
func checkConfChange(conf *raftpb.ConfState, cc raftpb.ConfChangeI) error {
	chg := confchange.Changer{Tracker: tracker.MakeProgressTracker(1, 0), LastIndex: 1}
	cfg, prs, err := confchange.Restore(chg, conf)
	if err != nil {
		return fmt.Errorf("restore the configuration: %w", err)
	}
	chg.Tracker.Config, chg.Tracker.Progress = cfg, prs
	v2 := cc.AsV2()
	if v2.LeaveJoint() {
		_, _, err = chg.LeaveJoint()
	} else if autoLeave, ok := v2.EnterJoint(); ok {
		_, _, err = chg.EnterJoint(autoLeave, v2.GetChanges()...)
	} else {
		_, _, err = chg.Simple(v2.GetChanges()...)
	}
	return err
}

// refuseConfChange skips a committed configuration change that the
// configuration cannot take, and answers its proposer.
func (r *Replica) refuseConfChange(cc raftpb.ConfChangeI, index uint64, err error) {
	r.logger.Error("configuration change refused", "index", index, "change", confchange.Describe(cc.AsV2().GetChanges()...), "error", err)
	if p := r.pendingConf; p != nil {
		if c2, ok := cc.(*raftpb.ConfChangeV2); ok && string(c2.GetContext()) == string(p.context) {
			p.reply(nil, apierr.Wrap(apierr.InvalidArgument, err, "configuration change refused"))
			r.pendingConf = nil
		}
	}
}
