package raftnet

import (
	"errors"
	"sync/atomic"
)

// counters are the live form of Stats: one atomic per field, so the hot
// paths count without a lock.
type counters struct {
	messagesSent, batchesSent, bytesSent                          atomic.Uint64
	droppedQueueFull, droppedUnreachable, droppedStreamBroken     atomic.Uint64
	droppedInvalid, droppedReserveFull, reserveAccepted           atomic.Uint64
	messagesReceived, batchesReceived, bytesReceived              atomic.Uint64
	unknownGroupMessages, streamsRejected                         atomic.Uint64
	streamsOpened, streamsFailed                                  atomic.Uint64
	snapshotsSent, snapshotsSendFailed, snapshotBytesSent         atomic.Uint64
	snapshotsReceived, snapshotsReceiveFailed, snapshotBytesRecvd atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{
		MessagesSent:           c.messagesSent.Load(),
		BatchesSent:            c.batchesSent.Load(),
		BytesSent:              c.bytesSent.Load(),
		DroppedQueueFull:       c.droppedQueueFull.Load(),
		DroppedUnreachable:     c.droppedUnreachable.Load(),
		DroppedStreamBroken:    c.droppedStreamBroken.Load(),
		DroppedInvalid:         c.droppedInvalid.Load(),
		DroppedReserveFull:     c.droppedReserveFull.Load(),
		ReserveAccepted:        c.reserveAccepted.Load(),
		MessagesReceived:       c.messagesReceived.Load(),
		BatchesReceived:        c.batchesReceived.Load(),
		BytesReceived:          c.bytesReceived.Load(),
		UnknownGroupMessages:   c.unknownGroupMessages.Load(),
		StreamsRejected:        c.streamsRejected.Load(),
		StreamsOpened:          c.streamsOpened.Load(),
		StreamsFailed:          c.streamsFailed.Load(),
		SnapshotsSent:          c.snapshotsSent.Load(),
		SnapshotsSendFailed:    c.snapshotsSendFailed.Load(),
		SnapshotBytesSent:      c.snapshotBytesSent.Load(),
		SnapshotsReceived:      c.snapshotsReceived.Load(),
		SnapshotsReceiveFailed: c.snapshotsReceiveFailed.Load(),
		SnapshotBytesReceived:  c.snapshotBytesRecvd.Load(),
	}
}

// countSendRefusal counts a message Send refused with err under its reason.
func (c *counters) countSendRefusal(err error) {
	switch {
	case errors.Is(err, ErrReserveFull):
		c.droppedReserveFull.Add(1)
	case errors.Is(err, ErrQueueFull):
		c.droppedQueueFull.Add(1)
	case errors.Is(err, ErrInvalidMessage), errors.Is(err, ErrMessageTooLarge):
		c.droppedInvalid.Add(1)
	default: // ErrPeerUnreachable, ErrUnknownNode, ErrClosed
		c.droppedUnreachable.Add(1)
	}
}

// uniqueGroups returns the distinct groups of msgs, in first-seen order. It
// allocates only for the result; callers pass at most one queue's worth.
func uniqueGroups[T any](msgs []T, group func(T) GroupID) []GroupID {
	if len(msgs) == 0 {
		return nil
	}
	seen := make(map[GroupID]struct{}, min(len(msgs), 1024))
	out := make([]GroupID, 0, min(len(msgs), 1024))
	for _, m := range msgs {
		g := group(m)
		if _, ok := seen[g]; ok {
			continue
		}
		seen[g] = struct{}{}
		out = append(out, g)
	}
	return out
}
