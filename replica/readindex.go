package replica

import (
	"encoding/binary"

	"github.com/geolog/geolog/apierr"
	"go.etcd.io/raft/v3"
)

// readRequest is a linearizable read waiting for Raft to confirm this
// replica's leadership (ReadIndex) and then for the confirmed index to be
// applied here.
type readRequest struct {
	key       uint64
	confirmed bool   // Raft confirmed the read at index
	index     uint64 // the read index (0 is one: a new group of one voter has committed nothing)
	term      uint64
	reply     func(committedEnd uint64, err error)
}

// readsPendingMax bounds the reads waiting at once; more are refused with a
// retriable OVERLOADED.
const readsPendingMax = 4096

// ReadIndex asks for the committed end offset as of now, confirmed by a
// quorum (Raft's ReadIndex: the leader checks it still leads before it
// answers). reply gets, once everything committed at the time of the call
// is applied here, the committed end offset, which covers every record
// acknowledged before the call; or a retriable NOT_LEADER. It is called on
// the driver goroutine, from a later ProcessReady (or at once on error).
func (r *Replica) ReadIndex(reply func(committedEnd uint64, err error)) {
	if f := r.failure.Load(); f != nil {
		reply(0, f)
		return
	}
	if !r.isLeader {
		r.wakeForClient()
		reply(0, r.notLeader())
		return
	}
	if len(r.reads) >= readsPendingMax {
		reply(0, apierr.New(apierr.Overloaded, "stream %s range %d: %d linearizable reads waiting", r.cfg.Stream, r.cfg.Range, len(r.reads)))
		return
	}
	r.readSeq++
	var ctx [8]byte
	binary.LittleEndian.PutUint64(ctx[:], r.readSeq)
	r.rn.ReadIndex(ctx[:])
	r.reads = append(r.reads, &readRequest{key: r.readSeq, term: r.term, reply: reply})
}

// processReads matches Raft's confirmed read states to pending reads and
// answers those whose index is applied; a replica that lost leadership
// fails the rest (Raft drops their requests silently). Called at the end
// of each Ready cycle.
func (r *Replica) processReads(states []raft.ReadState) {
	if len(r.reads) == 0 {
		return
	}
	for _, rs := range states {
		if len(rs.RequestCtx) != 8 {
			continue
		}
		key := binary.LittleEndian.Uint64(rs.RequestCtx)
		for _, rq := range r.reads {
			// Raft confirms in order; a state also confirms every earlier
			// request of the same term.
			if rq.key <= key && !rq.confirmed {
				rq.confirmed, rq.index = true, rs.Index
			}
		}
	}
	kept := r.reads[:0]
	for _, rq := range r.reads {
		switch {
		case !r.isLeader || rq.term != r.term:
			e := r.notLeader()
			e.Message += ": leadership changed before the read was confirmed"
			rq.reply(0, e)
		case rq.confirmed && r.appliedIndex >= rq.index:
			rq.reply(r.appliedEnd, nil)
		default:
			kept = append(kept, rq)
		}
	}
	clear(r.reads[len(kept):])
	r.reads = kept
}
