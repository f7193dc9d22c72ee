package chaos

import (
	"fmt"

	"github.com/geolog/geolog/keyspace"
)

// checkSpans checks every acknowledged and finally read record against the
// stream's range map at the end (History.Spans, set when a range split):
// a key's record belongs to a range whose hash slice holds the key's hash,
// and a range that split holds records only below its split offset (the
// marker ends its log; later records of its keys are in a child). Loss
// and duplicates across a parent and its children need nothing more: the
// final reads cover every range id, and a value seen at two positions is
// a duplicate whichever ranges hold them. Orphaned acks are judged
// against the orphan logs instead.
func checkSpans(h *History, orphanedAck map[string]bool, add func(Anomaly)) {
	if len(h.Spans) == 0 {
		return
	}
	check := func(what string, rng uint32, offset uint64, key, value string) {
		sp := h.span(rng)
		if sp == nil {
			add(Anomaly{Kind: Inconsistent, Range: rng, Offset: offset, Value: value,
				Detail: what + ": the stream's range map has no such range"})
			return
		}
		if hash := keyspace.Hash([]byte(key)); key != "" && (hash < sp.HashStart || hash > sp.HashEnd) {
			add(Anomaly{Kind: Inconsistent, Range: rng, Offset: offset, Value: value,
				Detail: fmt.Sprintf("%s: key %s (hash %#x) outside the range's slice [%#x, %#x]", what, key, hash, sp.HashStart, sp.HashEnd)})
		}
		if len(sp.Children) > 0 && offset >= sp.SplitOffset {
			add(Anomaly{Kind: Inconsistent, Range: rng, Offset: offset, Value: value,
				Detail: fmt.Sprintf("%s at or past the range's split offset %d (children %v)", what, sp.SplitOffset, sp.Children)})
		}
	}
	for _, op := range h.Ops {
		if op.Kind == OpAppend && op.Outcome == OK && !orphanedAck[op.Value] {
			check("acknowledged", op.Range, op.Offset, op.Key, op.Value)
		}
	}
	for _, o := range h.Reads {
		if o.Final {
			check("final/"+o.Region+" read", o.Range, o.Offset, o.Key, o.Value)
		}
	}
}

// checkReplicas: a range a kill past the dead-node time left on the dead
// node (FaultEvent.NotReplaced) is an anomaly; with
// History.ReplicationFactor set, every range ends with
// exactly that many voters and no learner in every region (a move that
// never finished, or two moves of one range, leave more; a lost replica
// never rebuilt, fewer). A range whose replicas could not be described
// leaves the history unverified only through its final reads; here it is
// an anomaly too, since the scenario's point is the placement.
func checkReplicas(h *History, add func(Anomaly)) {
	for _, ev := range h.Faults {
		for _, r := range ev.NotReplaced {
			add(Anomaly{Kind: Replicas, Range: r, Detail: fmt.Sprintf("%s: the range still named the dead node as a replica when it returned", ev.What)})
		}
	}
	if h.ReplicationFactor == 0 {
		return
	}
	for _, rs := range h.Replicas {
		switch {
		case rs.Err != "":
			add(Anomaly{Kind: Replicas, Range: rs.Range, Detail: fmt.Sprintf("%s: replicas not described: %s", rs.Region, rs.Err)})
		case len(rs.Voters) != h.ReplicationFactor || len(rs.Learners) > 0:
			add(Anomaly{Kind: Replicas, Range: rs.Range, Detail: fmt.Sprintf("%s: voters %v, learners %v; want %d voters",
				rs.Region, rs.Voters, rs.Learners, h.ReplicationFactor)})
		}
	}
}
